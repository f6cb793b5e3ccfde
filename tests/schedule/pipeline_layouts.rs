//! Pipeline layouts (issue #17, part 5): Megatron-Core's explicit layout and embedding/loss
//! slots resolve to the layer placement they describe, and `search` tries every valid vpp and
//! the slot-balanced splits.

use parsim::config::{Config, Layer, Resolved};
use parsim::estimate::estimate;
use parsim::search::{search, Constraint, SearchSpec};
use std::sync::atomic::AtomicBool;

fn config(v: serde_json::Value) -> Config {
    Config::from_layers(&[Layer::overrides(v)]).unwrap()
}

fn run(base: Config, constraints: &[&str]) -> parsim::search::SearchResult {
    let spec = SearchSpec {
        base,
        mbs_max: 1,
        top: 5,
        constraints: constraints
            .iter()
            .map(|c| Constraint::parse(c).unwrap())
            .collect(),
        exhaustive: false,
    };
    search(&spec, &|_, _| {}, &AtomicBool::new(false)).unwrap()
}

/// Llama-2-70B, tp 4, pp 4, vpp 20 (one layer per chunk), mbs 1 on 64 H100s: `estimate` fits
/// it, so `search` restricted to that mix must find it (it capped vpp at 8 before).
#[test]
fn search_finds_llama2_70b_with_vpp_20() {
    let base = config(serde_json::json!({
        "model": {"preset": "llama2-70b"},
        "cluster": {"num_gpus": 64, "gpu": "h100-sxm"},
        "training": {"seq_length": 4096, "global_batch_size": 512}}));
    let mut direct = base.clone();
    direct.parallel.tp = 4;
    direct.parallel.pp = 4;
    direct.parallel.vpp = 20;
    direct.parallel.schedule = parsim::config::ScheduleKind::Interleaved1F1B;
    direct.training.micro_batch_size = 1;
    let e = estimate(&Resolved::new(direct).unwrap()).unwrap();
    assert!(e.memory.fits, "estimate fits the mix");
    let r = run(base, &["tp=4", "pp=4", "vpp=20", "mbs=1"]);
    assert!(
        r.top.iter().any(|x| x.mix.vpp == 20),
        "search found no vpp 20 mix: {:?}",
        r.top.iter().map(|x| x.mix.to_string()).collect::<Vec<_>>()
    );
}

fn llama_405b(parallel: serde_json::Value) -> Config {
    config(serde_json::json!({
        "model": {"preset": "llama3-405b"},
        "cluster": {"num_gpus": 16384, "gpu": "h100-sxm"},
        "parallel": parallel,
        "training": {"seq_length": 8192, "global_batch_size": 2048}}))
}

/// Llama-3-405B's 126 layers on pp 16 with interleaving: with the embedding and loss counted
/// as slots, 128 slots make 4 per chunk at vpp 2 (3 layers on the first and the last chunk);
/// the same placement written as an explicit Megatron-Core layout resolves identically.
#[test]
fn llama_405b_interleaved_with_embedding_and_loss_slots() {
    let slots = llama_405b(serde_json::json!({"tp": 8, "pp": 16, "vpp": 2,
        "schedule": "interleaved-1f1b",
        "account_for_embedding_in_pipeline_split": true,
        "account_for_loss_in_pipeline_split": true}));
    let r = Resolved::new(slots).unwrap();
    let counts: Vec<u32> = r
        .placement
        .stage_layers
        .iter()
        .map(|l| l.end - l.start)
        .collect();
    let mut expected = vec![4; 32];
    expected[0] = 3;
    expected[31] = 3;
    assert_eq!(counts, expected);
    let layout = llama_405b(serde_json::json!({"tp": 8, "pp": 16, "vpp": 2,
        "schedule": "interleaved-1f1b", "pipeline_layout": "Et*3|(tttt|)*30,tttL"}));
    let r2 = Resolved::new(layout).unwrap();
    assert_eq!(r2.placement, r.placement);
    let e = estimate(&r).unwrap();
    assert!(e.time.step_s.is_finite() && e.time.step_s > 0.0);
    // Without the slots, no vpp > 1 splits 126 layers over 16 ranks.
    let plain = llama_405b(serde_json::json!({"tp": 8, "pp": 16, "vpp": 2,
        "schedule": "interleaved-1f1b"}));
    let err = Resolved::new(plain).unwrap_err().to_string();
    assert!(err.contains("model.num_layers"), "{err}");
}

/// `search` finds interleaved mixes for Llama-3-405B on pp 16 (through the slots).
#[test]
fn search_finds_interleaved_405b_on_pp16() {
    let base = llama_405b(serde_json::json!({}));
    let r = run(
        base.clone(),
        &[
            "pp=16",
            "tp=8",
            "schedule=interleaved-1f1b",
            "zero=1",
            "recompute=selective",
        ],
    );
    assert!(!r.top.is_empty(), "no interleaved pp 16 mix");
    for x in &r.top {
        assert!(
            x.mix.vpp >= 2 && x.mix.slots.embedding && x.mix.slots.loss,
            "{}",
            x.mix
        );
        // What search reports is the full estimate, the bubble split included.
        let e = estimate(&Resolved::new(x.mix.apply(&base)).unwrap()).unwrap();
        assert_eq!(e.time, x.estimate.time, "{}", x.mix);
        assert!(e.time.warmup_cooldown_s > 0.0);
    }
}

/// Bad layouts are refused with the field and the rule.
#[test]
fn bad_layouts_are_refused_naming_the_field() {
    for (layout, rule) in [
        ("Et*40|t*40L", "not a multiple of pp"),
        ("Et*40|t*38|t|L", "holds 79 transformer layers"),
        ("Et*20|t*20|t*20|t*20", "loss 'L'"),
        ("Et*20|t*20||t*40L", "stage 2 is empty"),
        ("Et*20|t*20|t*2x0|t*20L", "unknown letter 'x'"),
    ] {
        let c = config(serde_json::json!({"model": {"preset": "llama2-70b"},
            "cluster": {"num_gpus": 64}, "parallel": {"tp": 4, "pp": 4, "pipeline_layout": layout}}));
        let err = Resolved::new(c).unwrap_err().to_string();
        assert!(
            err.contains("parallel.pipeline_layout") && err.contains(rule),
            "{layout}: {err}"
        );
    }
}

/// Llama-3-70B, TP 8 x PP 8 on 64 H100s, 1F1B, gbs 2048 (the imbalance case of
/// tests/engine/step_breakdown.rs): the last stage also runs the output layer and loss (about 1.3
/// layers of FLOPs: h V against 12 h^2 + attention per layer), so the search also tries the
/// FLOP-balanced split. It must rank above the even split, with less stage imbalance, and the
/// same mix estimated directly from its explicit layout must give the same step.
#[test]
fn search_tries_the_cost_balanced_uneven_split() {
    let base = config(serde_json::json!({
        "model": {"preset": "llama3-70b"},
        "cluster": {"num_gpus": 64, "gpu": "h100-sxm"},
        "training": {"seq_length": 8192, "global_batch_size": 2048}}));
    let r = run(
        base.clone(),
        &[
            "tp=8",
            "pp=8",
            "mbs=1",
            "schedule=1f1b",
            "zero=1",
            "recompute=selective",
        ],
    );
    let names: Vec<String> = r.top.iter().map(|x| x.mix.to_string()).collect();
    let even = r
        .top
        .iter()
        .find(|x| x.mix.first_stage_layers.is_none() && x.mix.slots == Default::default())
        .unwrap_or_else(|| panic!("no even split among {names:?}"));
    let balanced = r
        .top
        .iter()
        .find(|x| x.mix.first_stage_layers.is_some())
        .unwrap_or_else(|| panic!("no uneven first/last split among {names:?}"));
    eprintln!(
        "even {} step {:.3} s imbalance {:.3} s; balanced {} step {:.3} s imbalance {:.3} s, layout {:?}",
        even.mix,
        even.estimate.time.step_s,
        even.estimate.time.imbalance_s,
        balanced.mix,
        balanced.estimate.time.step_s,
        balanced.estimate.time.imbalance_s,
        balanced.estimate.config.parallel.pipeline_layout
    );
    let (f, l) = (
        balanced.mix.first_stage_layers.unwrap(),
        balanced.mix.last_stage_layers.unwrap(),
    );
    assert!(l < 10, "the last stage gives up layers: {f}..{l}");
    assert!(balanced.estimate.time.step_s < even.estimate.time.step_s);
    assert!(balanced.estimate.time.imbalance_s < even.estimate.time.imbalance_s);
    // The applied configuration is a valid one that `estimate` gives the same step for.
    let direct = estimate(&Resolved::new(balanced.mix.apply(&base)).unwrap()).unwrap();
    assert!(
        (direct.time.step_s - balanced.estimate.time.step_s).abs() <= 1e-9 * direct.time.step_s
    );
}
