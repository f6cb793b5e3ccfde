//! Search: the step-time bound never changes the answer, the 70B case finds a mix that
//! fits, and the ranking is stable under small changes of the efficiency parameters.

use parsim::config::{Config, GpuProfile, Layer, Resolved};
use parsim::estimate::estimate;
use parsim::search::{search, Constraint, SearchSpec};
use std::sync::atomic::AtomicBool;

/// Selects one efficiency parameter of a profile.
type Field = fn(&mut GpuProfile) -> &mut f64;

fn base(v: serde_json::Value) -> Config {
    Config::from_layers(&[Layer::overrides(v)]).unwrap()
}

fn run(spec: &SearchSpec) -> parsim::search::SearchResult {
    search(spec, &|_, _| {}, &AtomicBool::new(false)).unwrap()
}

#[test]
fn bound_gives_the_same_answer_as_exhaustive() {
    let b = base(
        serde_json::json!({"model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": 16},
                                    "training": {"seq_length": 4096, "global_batch_size": 64}}),
    );
    let mut spec = SearchSpec {
        base: b,
        mbs_max: 2,
        top: 12,
        constraints: vec![],
        exhaustive: false,
    };
    let fast = run(&spec);
    spec.exhaustive = true;
    let full = run(&spec);
    assert_eq!(fast.candidates, full.candidates);
    assert!(
        fast.evaluated < full.evaluated,
        "the bound skips simulations"
    );
    let key = |r: &parsim::search::Ranked| (r.mix.to_string(), r.estimate.time.step_s.to_bits());
    assert_eq!(
        fast.top.iter().map(key).collect::<Vec<_>>(),
        full.top.iter().map(key).collect::<Vec<_>>()
    );
    assert_eq!(
        fast.best_per_schedule.iter().map(key).collect::<Vec<_>>(),
        full.best_per_schedule.iter().map(key).collect::<Vec<_>>()
    );
    assert_eq!(
        fast.best_per_zero.iter().map(key).collect::<Vec<_>>(),
        full.best_per_zero.iter().map(key).collect::<Vec<_>>()
    );
    // Every candidate is accounted for.
    assert_eq!(
        fast.pruned.constraint
            + fast.pruned.invalid
            + fast.pruned.memory_bound
            + fast.pruned.time_bound
            + fast.evaluated,
        fast.candidates
    );
    // As the GUI's summary line counts them: the mixes that do not fit after their estimate are
    // among the evaluated, not the pruned.
    assert_eq!(fast.pruned.unevaluated() + fast.evaluated, fast.candidates);
    assert!(fast.pruned.memory <= fast.evaluated);
}

#[test]
fn constraints_filter_the_candidates() {
    let b = base(
        serde_json::json!({"model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": 16},
                                    "training": {"seq_length": 4096, "global_batch_size": 64}}),
    );
    let constraints = vec![
        Constraint::parse("tp<=2").unwrap(),
        Constraint::parse("pp=2").unwrap(),
    ];
    let r = run(&SearchSpec {
        base: b,
        mbs_max: 2,
        top: 50,
        constraints,
        exhaustive: false,
    });
    assert!(r.pruned.constraint > 0);
    assert!(!r.top.is_empty());
    for m in r.top.iter().map(|r| r.mix) {
        assert!(m.tp <= 2 && m.pp == 2, "{m}");
    }
}

#[test]
fn llama3_70b_on_64_h100_fits_and_ranks_stably() {
    // The case: llama3-70b on 64 x H100 at seq 8192, global batch 512.
    let b = base(
        serde_json::json!({"model": {"preset": "llama3-70b"}, "cluster": {"num_gpus": 64, "gpu": "h100-sxm"},
                                    "training": {"seq_length": 8192, "global_batch_size": 512}}),
    );
    let r = run(&SearchSpec {
        base: b.clone(),
        mbs_max: 2,
        top: 10,
        constraints: vec![],
        exhaustive: false,
    });
    assert!(!r.top.is_empty());
    let best = &r.top[0].estimate;
    assert!(best.memory.fits && best.memory.per_gpu_max_bytes <= best.memory.capacity_bytes);

    // Re-estimate the ranked mixes with each efficiency parameter moved by +-1%: any two mixes
    // more than 5% apart keep their order.
    let mut mixes: Vec<_> = r.top.iter().map(|x| x.mix).collect();
    mixes.extend(r.best_per_schedule.iter().map(|x| x.mix));
    mixes.extend(r.best_per_zero.iter().map(|x| x.mix));
    mixes.dedup();
    let gpu = GpuProfile::load("h100-sxm").unwrap();
    let steps = |g: &GpuProfile| -> Vec<f64> {
        mixes
            .iter()
            .map(|m| {
                estimate(&Resolved::with_gpu(m.apply(&b), g.clone()).unwrap())
                    .unwrap()
                    .time
                    .step_s
            })
            .collect()
    };
    let base_steps = steps(&gpu);
    let knobs: [(&str, Field); 6] = [
        ("efficiency.matmul", |g| &mut g.efficiency.matmul),
        ("efficiency.attention", |g| &mut g.efficiency.attention),
        ("efficiency.memory_bound", |g| {
            &mut g.efficiency.memory_bound
        }),
        ("efficiency.kernel_overhead_s", |g| {
            &mut g.efficiency.kernel_overhead_s
        }),
        ("links.intra_node.efficiency", |g| {
            &mut g.links.intra_node.efficiency
        }),
        ("links.inter_node.efficiency", |g| {
            &mut g.links.inter_node.efficiency
        }),
    ];
    for (name, field) in knobs {
        for factor in [0.99, 1.01] {
            let mut g = gpu.clone();
            *field(&mut g) *= factor;
            let moved = steps(&g);
            for i in 0..mixes.len() {
                for j in 0..mixes.len() {
                    if base_steps[i] * 1.05 < base_steps[j] {
                        assert!(
                            moved[i] < moved[j],
                            "{name} x{factor}: {} vs {}",
                            mixes[i],
                            mixes[j]
                        );
                    }
                }
            }
        }
    }
}

/// Issue 30's step-time bounds (the pipeline's fill and drain for GPipe, 1F1B, ZB-H1 and
/// interleaved 1F1B; the memory bound before any timing) never change the answer: a pipelined
/// Blackwell case (Llama-3-8B on 32 GB200s, trays of 4 in NVLink domains of 16, MXFP8) ranks
/// the same mixes, with the same step times to the bit, as simulating every candidate.
#[test]
fn drain_bound_gives_the_same_answer_as_exhaustive_on_a_pipelined_rack() {
    let b = base(serde_json::json!({
        "model": {"preset": "llama3-8b"},
        "cluster": {"gpu": "gb200", "num_gpus": 32, "gpus_per_node": 4, "nvlink_domain_size": 16},
        "training": {"seq_length": 4096, "global_batch_size": 64, "precision": "mxfp8"}
    }));
    let mut spec = SearchSpec {
        base: b,
        mbs_max: 2,
        top: 10,
        constraints: vec![Constraint::parse("pp>=2").unwrap()],
        exhaustive: false,
    };
    let fast = run(&spec);
    spec.exhaustive = true;
    let full = run(&spec);
    assert_eq!(fast.candidates, full.candidates);
    assert!(
        fast.evaluated < full.evaluated,
        "the bounds skip simulations: {} vs {}",
        fast.evaluated,
        full.evaluated
    );
    assert_eq!(fast.top.len(), 10);
    let key = |r: &parsim::search::Ranked| (r.mix.to_string(), r.estimate.time.step_s.to_bits());
    for (a, b) in [
        (&fast.top, &full.top),
        (&fast.best_per_schedule, &full.best_per_schedule),
        (&fast.best_per_zero, &full.best_per_zero),
    ] {
        assert_eq!(
            a.iter().map(key).collect::<Vec<_>>(),
            b.iter().map(key).collect::<Vec<_>>()
        );
    }
    // Every schedule the bound applies to is among the leaders' lists.
    let schedules: Vec<String> = full
        .best_per_schedule
        .iter()
        .map(|r| r.mix.schedule.to_string())
        .collect();
    for s in ["1f1b", "zb-h1", "interleaved-1f1b", "gpipe"] {
        assert!(schedules.iter().any(|x| x == s), "{s} in {schedules:?}");
    }
}

/// The runs' shared timed ledgers (one per key across pipeline depths), their bounds and the
/// per-mix skip before screening never change the answer: on a small MoE whose ep folds over
/// cp x dp (with MTP and tied embeddings, so ZB-V's last stage on the first rank changes the
/// ledger) and on a dense model with cp, pp and vpp, the pruned search ranks the same mixes,
/// with the same step times to the bit, as simulating every candidate.
#[test]
fn shared_ledgers_give_the_same_answer_as_exhaustive_on_moe_and_cp() {
    let cases = [
        serde_json::json!({
            "model": {"preset": "mixtral-8x7b", "num_layers": 8, "mtp_num_layers": 1,
                      "tied_embeddings": true},
            "cluster": {"num_gpus": 16, "gpus_per_node": 8, "gpu": "h100-sxm"},
            "training": {"seq_length": 4096, "global_batch_size": 32}
        }),
        serde_json::json!({
            "model": {"preset": "llama2-7b", "num_layers": 8},
            "cluster": {"num_gpus": 16, "gpus_per_node": 4, "gpu": "h100-sxm"},
            "training": {"seq_length": 8192, "global_batch_size": 16}
        }),
    ];
    for case in cases {
        let mut spec = SearchSpec {
            base: base(case.clone()),
            mbs_max: 2,
            top: 10,
            constraints: vec![],
            exhaustive: false,
        };
        let fast = run(&spec);
        spec.exhaustive = true;
        let full = run(&spec);
        assert!(fast.evaluated < full.evaluated, "{case}: the bounds skip");
        let key =
            |r: &parsim::search::Ranked| (r.mix.to_string(), r.estimate.time.step_s.to_bits());
        for (a, b) in [
            (&fast.top, &full.top),
            (&fast.best_per_schedule, &full.best_per_schedule),
            (&fast.best_per_zero, &full.best_per_zero),
        ] {
            assert!(!b.is_empty(), "{case}");
            assert_eq!(
                a.iter().map(key).collect::<Vec<_>>(),
                b.iter().map(key).collect::<Vec<_>>(),
                "{case}"
            );
        }
    }
}
