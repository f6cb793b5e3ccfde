//! Step-time and memory intervals on estimates and in the search: the interval fields follow
//! from the residual models' lookups (the step's regime, the memory's framework), the fits
//! verdict is the p90 peak's, and ranking by the upper step time (`--rank-by p90`) or the
//! pessimistic peak (`--rank-by memory-p90`) gives the order a brute-force sort of every
//! fitting mix gives.

use parsim::config::{Config, GpuProfile, Layer, Resolved};
use parsim::estimate::estimate;
use parsim::interval::{self, Dimension, IntervalModel, Regime, Residual, ResidualFile};
use parsim::search::{search, search_by_memory_p90, search_by_p90, SearchSpec};
use std::sync::atomic::AtomicBool;

fn config(v: serde_json::Value) -> Config {
    Config::from_layers(&[Layer::overrides(v)]).unwrap()
}

/// The interval fields are the predicted figures at the lower and upper factor of the shipped
/// model's lookup of the regime `Regime::of` gives, and throughput's p10 is the slow end.
#[test]
fn estimate_fields_follow_the_lookup_of_its_regime() {
    let c = config(serde_json::json!({}));
    let r = Resolved::new(c.clone()).unwrap();
    let e = estimate(&r).unwrap();
    let regime = Regime::of(&c, &r.gpu, e.time.exposed_comm_s / e.time.step_s);
    let want = interval::shipped().unwrap().lookup(&regime);
    assert_eq!(e.step_interval, want);
    let (s, t) = (&e.time, &e.throughput);
    let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-12;
    assert!(close(s.step_s_p10, s.step_s * want.lower_factor));
    assert!(close(s.step_s_p90, s.step_s * want.upper_factor));
    assert!(s.step_s_p10 < s.step_s_p90);
    let tokens_per_step = (c.training.global_batch_size * c.training.seq_length) as f64;
    assert!(close(t.tokens_per_s_p10 * s.step_s_p90, tokens_per_step));
    assert!(close(t.tokens_per_s_p90 * s.step_s_p10, tokens_per_step));
    assert!(close(t.mfu_p10 * s.step_s_p90, t.mfu * s.step_s));
    assert!(close(t.mfu_p90 * s.step_s_p10, t.mfu * s.step_s));
    assert_eq!(want.regime.value(Dimension::GpuFamily), "hopper");
    assert_eq!(want.regime.value(Dimension::Calibrated), "no");
    assert!(want.residuals as usize >= interval::shipped().unwrap().min_residuals);
}

/// The CPU backend's shipped profile was calibrated on its machine: its estimates take the
/// calibrated residuals (the held-out runs of its own sweep), not the published rows'.
#[test]
fn a_calibrated_profile_takes_calibrated_residuals() {
    let c = config(serde_json::json!({
        "cluster": {"gpu": "cpu", "num_gpus": 2, "gpus_per_node": 2},
        "model": {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
                  "num_query_groups": 4, "ffn_hidden_size": 1024, "vocab_size": 1024},
        "training": {"seq_length": 256, "global_batch_size": 4, "micro_batch_size": 1}
    }));
    let e = estimate(&Resolved::new(c).unwrap()).unwrap();
    assert_eq!(e.step_interval.regime.value(Dimension::Calibrated), "yes");
    assert_eq!(e.step_interval.regime.value(Dimension::GpuFamily), "cpu");
    assert!(!e.step_interval.pooled_over.contains(&Dimension::Calibrated));
}

/// A model whose upper factor depends strongly on the communication share (9 residuals per
/// share band, the highest 0.5, 0 and 0.3 in log), so ranking by p90 reorders the mixes.
fn share_dependent_model(regime: Regime) -> IntervalModel {
    let highs = [0.5, 0.0, 0.3];
    let residuals = (0..3u8)
        .flat_map(|b| {
            (0..9).map(move |i| Residual {
                source: "test".into(),
                row: format!("{b}/{i}"),
                regime: regime.with(Dimension::CommShare, b),
                log_ratio: highs[usize::from(b)] - 0.01 * f64::from(i),
            })
        })
        .collect();
    let file = ResidualFile {
        about: "test".into(),
        command: "none".into(),
        lower_percentile: 0.1,
        upper_percentile: 0.9,
        backoff: interval::BACKOFF.to_vec(),
        residuals,
    };
    IntervalModel::new(&file).unwrap()
}

/// `search_by_p90` against brute force: every fitting mix estimated (a pool larger than the
/// candidates), its interval from the same model, sorted by upper step time.
/// Every fitting mix of `spec`, found exhaustively (the oracle the ranked searches are sorted
/// against).
fn every_fitting_mix(spec: &SearchSpec, cancel: &AtomicBool) -> Vec<parsim::search::Ranked> {
    search(
        &SearchSpec {
            top: 100_000,
            exhaustive: true,
            ..spec.clone()
        },
        &|_, _| {},
        cancel,
    )
    .unwrap()
    .top
}

#[test]
fn rank_by_p90_matches_a_sort_of_every_fitting_mix() {
    let base = config(serde_json::json!({
        "model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": 16},
        "training": {"seq_length": 4096, "global_batch_size": 64}
    }));
    let gpu = GpuProfile::load(&base.cluster.gpu).unwrap();
    let e = estimate(&Resolved::new(base.clone()).unwrap()).unwrap();
    let model = share_dependent_model(Regime::of(
        &base,
        &gpu,
        e.time.exposed_comm_s / e.time.step_s,
    ));
    let spec = SearchSpec {
        base,
        mbs_max: 2,
        top: 8,
        constraints: vec![],
        exhaustive: false,
    };
    let cancel = AtomicBool::new(false);
    let ranked = search_by_p90(&spec, &model, &|_, _| {}, &cancel).unwrap();
    let mut all = every_fitting_mix(&spec, &cancel);
    for r in &mut all {
        r.estimate.use_interval_model(&model);
    }
    all.sort_by(|a, b| {
        a.estimate
            .time
            .step_s_p90
            .total_cmp(&b.estimate.time.step_s_p90)
            .then_with(|| a.mix.to_string().cmp(&b.mix.to_string()))
    });
    let want: Vec<String> = all.iter().take(8).map(|r| r.mix.to_string()).collect();
    let got: Vec<String> = ranked.top.iter().map(|r| r.mix.to_string()).collect();
    assert_eq!(got, want);
    // The model does reorder: the fastest mix by step time is not first by p90 here, or the
    // share bands differ among the leaders.
    let by_step: Vec<String> = {
        let mut s = all.clone();
        s.sort_by(|a, b| a.estimate.time.step_s.total_cmp(&b.estimate.time.step_s));
        s.iter().take(8).map(|r| r.mix.to_string()).collect()
    };
    assert_ne!(by_step, want, "the test model should reorder the leaders");
}

/// The memory fields follow the shipped memory model's lookup of the framework: p10 <= peak <=
/// p90, "fits_at_p90" is the p90 peak against the usable bytes, the margin is their
/// difference; and a configuration whose predicted peak fits but whose p90 does not fits at
/// the prediction (the verdict) and not at p90 (reported beside it).
#[test]
fn memory_fields_follow_the_framework_lookup_and_give_the_p90_verdict() {
    let mut c = config(serde_json::json!({
        "model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": 8},
        "training": {"seq_length": 4096, "global_batch_size": 64}
    }));
    let e = estimate(&Resolved::new(c.clone()).unwrap()).unwrap();
    let m = &e.memory;
    let want = interval::memory::shipped()
        .unwrap()
        .lookup(c.training.framework);
    assert_eq!(m.interval, want);
    assert!(m.per_gpu_max_bytes_p10 <= m.per_gpu_max_bytes);
    assert!(m.per_gpu_max_bytes <= m.per_gpu_max_bytes_p90);
    let p90 = (m.per_gpu_max_bytes as f64 * want.upper_factor).ceil() as u64;
    assert_eq!(m.per_gpu_max_bytes_p90, p90);
    assert_eq!(m.fits_at_p90, p90 <= m.usable_bytes);
    assert_eq!(m.fits, m.per_gpu_max_bytes <= m.usable_bytes);
    assert_eq!(m.margin_bytes_p90, m.usable_bytes as i64 - p90 as i64);
    // Shrink the margin kept free until the predicted peak fits but its p90 does not.
    assert!(want.upper_factor > 1.0, "the shipped model states a width");
    let peak = m.per_gpu_max_bytes as f64;
    let usable = peak * (1.0 + want.upper_factor) / 2.0;
    c.cluster.memory_margin_fraction = Some(1.0 - usable / m.capacity_bytes as f64);
    let e = estimate(&Resolved::new(c).unwrap()).unwrap();
    assert!(e.memory.fits && !e.memory.fits_at_p90, "{:?}", e.memory);
    assert!(e.memory.margin_bytes_p90 < 0);
}

/// `search_by_memory_p90` against brute force: every fitting mix (a pool larger than the
/// candidates) sorted by its p90 peak, then step time, then name; and every mix it returns
/// fits at p90.
#[test]
fn rank_by_memory_p90_matches_a_sort_of_every_fitting_mix() {
    let base = config(serde_json::json!({
        "model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": 16},
        "training": {"seq_length": 4096, "global_batch_size": 64}
    }));
    let spec = SearchSpec {
        base,
        mbs_max: 2,
        top: 8,
        constraints: vec![],
        exhaustive: false,
    };
    let cancel = AtomicBool::new(false);
    let ranked = search_by_memory_p90(&spec, &|_, _| {}, &cancel).unwrap();
    let mut all = every_fitting_mix(&spec, &cancel);
    assert!(all.len() > 8, "enough fitting mixes to rank");
    assert!(all.iter().all(|r| r.estimate.memory.fits));
    all.sort_by(|a, b| {
        let (x, y) = (&a.estimate, &b.estimate);
        x.memory
            .per_gpu_max_bytes_p90
            .cmp(&y.memory.per_gpu_max_bytes_p90)
            .then_with(|| x.time.step_s.total_cmp(&y.time.step_s))
            .then_with(|| a.mix.to_string().cmp(&b.mix.to_string()))
    });
    let want: Vec<String> = all.iter().take(8).map(|r| r.mix.to_string()).collect();
    let got: Vec<String> = ranked.top.iter().map(|r| r.mix.to_string()).collect();
    assert_eq!(got, want);
    let p90: Vec<u64> = ranked
        .top
        .iter()
        .map(|r| r.estimate.memory.per_gpu_max_bytes_p90)
        .collect();
    assert!(p90.windows(2).all(|w| w[0] <= w[1]), "{p90:?}");
}
