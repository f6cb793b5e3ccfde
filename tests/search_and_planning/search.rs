//! Search: the step-time bound never changes the answer, the 70B case finds a mix that
//! fits, and its mixes' steps move with each efficiency parameter no more than that parameter's
//! own share.

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

/// The 70B case finds a mix that fits, and its ranking moves with the parameters no
/// more than the model's structure allows. Every term of a step is work at a rate (compute at
/// an efficiency of the peak, a transfer at an efficiency of a link) or a fixed cost per kernel,
/// and the step is built from such terms by sums and maxima (overlap, the pipeline's critical
/// path, NCCL's fastest algorithm). So moving one efficiency by a factor f < 1 slows every mix
/// by a factor between 1 and 1/f, raising it by 1/f speeds it by at most f, and scaling the
/// per-kernel cost by 1.1 slows it by at most 1.1; in consequence two mixes more than 1/f
/// apart keep their order. Each parameter moves by 10%, the size of the held-out median error
/// (docs/accuracy.md), so the test shows which neighbours of the ranking calibration cannot
/// tell apart (printed) and fails on any term that is not monotone in its parameter, or that
/// moves a step by more than its own share.
#[test]
fn llama3_70b_on_64_h100_fits_and_its_steps_move_no_more_than_their_parameters() {
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

    let mut mixes: Vec<_> = r.top.iter().map(|x| x.mix).collect();
    mixes.extend(r.best_per_schedule.iter().map(|x| x.mix));
    mixes.extend(r.best_per_zero.iter().map(|x| x.mix));
    mixes.sort_by_key(|m| m.to_string());
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
    // (name, field, whether a larger value is faster).
    let knobs: [(&str, Field, bool); 6] = [
        ("efficiency.matmul", |g| &mut g.efficiency.matmul, true),
        (
            "efficiency.attention",
            |g| &mut g.efficiency.attention,
            true,
        ),
        (
            "efficiency.memory_bound",
            |g| &mut g.efficiency.memory_bound,
            true,
        ),
        (
            "efficiency.kernel_overhead_s",
            |g| &mut g.efficiency.kernel_overhead_s,
            false,
        ),
        (
            "links.intra_node.efficiency",
            |g| &mut g.links.intra_node.efficiency,
            true,
        ),
        (
            "links.inter_node.efficiency",
            |g| &mut g.links.inter_node.efficiency,
            true,
        ),
    ];
    let tol = 1e-9;
    for (name, field, faster_when_larger) in knobs {
        for factor in [0.9, 1.0 / 0.9] {
            let mut g = gpu.clone();
            *field(&mut g) *= factor;
            let moved = steps(&g);
            // The step's factor lies between 1 and the parameter's own.
            let own = if faster_when_larger {
                1.0 / factor
            } else {
                factor
            };
            let (lo, hi) = if own >= 1.0 { (1.0, own) } else { (own, 1.0) };
            for (i, m) in mixes.iter().enumerate() {
                let ratio = moved[i] / base_steps[i];
                assert!(
                    ratio >= lo * (1.0 - tol) && ratio <= hi * (1.0 + tol),
                    "{name} x{factor:.3}: {m} moves by {ratio:.4}, outside [{lo:.4}, {hi:.4}]"
                );
            }
            let mut swapped = Vec::new();
            for i in 0..mixes.len() {
                for j in 0..mixes.len() {
                    if base_steps[i] < base_steps[j] && moved[i] > moved[j] {
                        swapped.push(format!(
                            "{} / {} ({:.1}% apart)",
                            mixes[i],
                            mixes[j],
                            100.0 * (base_steps[j] / base_steps[i] - 1.0)
                        ));
                        // The consequence: only mixes within the parameter's own factor swap.
                        assert!(base_steps[j] <= base_steps[i] * own.max(1.0 / own) * (1.0 + tol));
                    }
                }
            }
            if !swapped.is_empty() {
                println!("{name} x{factor:.3} swaps {}", swapped.join(", "));
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
