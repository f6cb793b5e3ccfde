//! The step breakdown (issue #17, part 4) on the case: Llama-3-70B, TP 8 x PP 8 on 64
//! H100s. The warm-up/cool-down bubble is the schedule's fill and drain, (p-1)(F+B) for 1F1B
//! (Narayanan et al. 2021, §2.2.1): it does not grow with the batch, while the stage imbalance
//! (the last stage also holds the output layer and the loss) grows with the microbatches.

use parsim::config::{Config, Layer, Resolved};
use parsim::estimate::{breakdown, estimate, Estimate};

fn llama3_70b(gbs: u64, parallel: serde_json::Value) -> Estimate {
    let mut p = serde_json::json!({"tp": 8, "pp": 8});
    p.as_object_mut()
        .unwrap()
        .extend(parallel.as_object().unwrap().clone());
    let c = Config::from_layers(&[Layer::overrides(serde_json::json!({
        "model": {"preset": "llama3-70b"},
        "cluster": {"num_gpus": 64, "gpu": "h100-sxm"},
        "parallel": p,
        "training": {"seq_length": 8192, "global_batch_size": gbs, "micro_batch_size": 1}}))])
    .unwrap();
    estimate(&Resolved::new(c).unwrap()).unwrap()
}

#[test]
fn warmup_cooldown_is_flat_in_the_batch_and_imbalance_names_the_last_stage() {
    let small = llama3_70b(128, serde_json::json!({}));
    let large = llama3_70b(2048, serde_json::json!({}));
    for e in [&small, &large] {
        let t = &e.time;
        eprintln!(
            "gbs {}: step {:.3} s, bubble {:.3} = warm-up/cool-down {:.3} + imbalance {:.3} + pp waits {:.3}; {:?}\n  {}",
            e.config.training.global_batch_size, t.step_s, t.bubble_s, t.warmup_cooldown_s,
            t.imbalance_s, t.pp_wait_s, t.imbalance, e.verdict
        );
        // The three parts add up to the simulated idle time.
        let sum = t.warmup_cooldown_s + t.imbalance_s + t.pp_wait_s;
        assert!(
            (sum - t.bubble_s).abs() <= 1e-9 * t.step_s,
            "{sum} vs {}",
            t.bubble_s
        );
        // And every term adds up to the step.
        let all: f64 = breakdown::terms(t).iter().map(|x| x.seconds).sum();
        assert!(
            (all - t.step_s).abs() <= 1e-9 * t.step_s,
            "{all} vs {}",
            t.step_s
        );
        // The slowest stage is the last one (rank 7), because of the output layer and loss.
        let i = t.imbalance.expect("pp 8 has an imbalance record");
        assert_eq!(i.stage, 7);
        assert!(i.holds_output && i.excess_fraction > 0.0);
        assert!(i.reason().contains("output layer"));
    }
    // 16x the microbatches: the fill and drain stay put (within 1%), the imbalance grows.
    let (w0, w1) = (small.time.warmup_cooldown_s, large.time.warmup_cooldown_s);
    assert!(w0 > 0.0 && (w1 - w0).abs() <= 0.01 * w0, "{w0} -> {w1}");
    assert!(large.time.imbalance_s > 10.0 * small.time.imbalance_s);
    // The closed form with the mean stage: (p-1)(F+B) with F+B the mean busy per microbatch.
    let i = large.time.imbalance.unwrap();
    let closed = 7.0 * i.mean_stage_s;
    assert!(
        (w1 - closed).abs() <= 0.02 * closed,
        "{w1} vs (p-1)(F+B) = {closed}"
    );
    // With the bubble at 0.3% of the batch the verdict no longer advises more microbatches
    // when the imbalance dominates the overhead.
    assert!(
        !large.verdict.contains("more microbatches (a larger"),
        "{}",
        large.verdict
    );
}

fn llama3_8b(layout: Option<&str>) -> Estimate {
    let mut c = Config::from_layers(&[Layer::overrides(serde_json::json!({
        "model": {"preset": "llama3-8b"},
        "cluster": {"num_gpus": 8, "gpu": "h100-sxm"},
        "parallel": {"tp": 2, "pp": 4},
        "training": {"seq_length": 8192, "global_batch_size": 256, "micro_batch_size": 1}}))])
    .unwrap();
    c.parallel.pipeline_layout = layout.map(str::to_string);
    estimate(&Resolved::new(c).unwrap()).unwrap()
}

/// Llama-3-8B's output layer (4096 x 128256) has about 2.4 layers' worth of parameters, so on
/// pp 4 the last stage is the slowest; the verdict says so and proposes an uneven split, and
/// the uneven layout that moves three layers off the last stage shrinks the imbalance and
/// the step.
#[test]
fn uneven_layout_relieves_the_last_stage() {
    let even = llama3_8b(None);
    let i = even.time.imbalance.unwrap();
    assert_eq!(i.stage, 3);
    assert!(i.holds_output);
    assert!(
        even.time.imbalance_s > even.time.warmup_cooldown_s,
        "{:?}",
        even.time
    );
    assert!(even.verdict.contains("pipeline rank 3"), "{}", even.verdict);
    assert!(even.verdict.contains("pipeline_layout"), "{}", even.verdict);
    let uneven = llama3_8b(Some("Et*9|t*9|t*9|t*5L"));
    eprintln!(
        "even: step {:.3} s, imbalance {:.3} s; layout: step {:.3} s, imbalance {:.3} s",
        even.time.step_s, even.time.imbalance_s, uneven.time.step_s, uneven.time.imbalance_s
    );
    assert!(uneven.time.imbalance_s < even.time.imbalance_s);
    assert!(uneven.time.step_s < even.time.step_s);
}
