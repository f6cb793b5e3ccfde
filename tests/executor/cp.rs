//! Context parallelism executed: every comm kind (ring, zigzag, all-gather, Ulysses) at cp 2
//! and 4, alone and with TP + SP, PP 2 and DP 2, against the single-rank run (loss after one
//! step, parameters after two, within 1e-5 relative); the causal work per rank of the
//! contiguous ring and of zigzag against their closed forms.

use super::common::*;
use super::equivalence::{compare, STEPS};
use parsim_executor::runner::{run_cpu, RunOptions};

/// Global batch of the CP runs: eight sequences (four microbatches per rank under DP 2), enough
/// to accumulate gradients over microbatches and to fill PP 2's pipeline; half the grid's
/// sixteen, since what differs here is the exchange inside one microbatch.
const GBS: u64 = 8;

const KINDS: [&str; 4] = ["p2p", "zigzag", "allgather", "a2a"];

fn with_cp(cp: u32, kind: &'static str, base: Mix) -> Mix {
    Mix {
        cp,
        cp_comm: kind,
        ..base
    }
}

/// The companions of CP the issue names: none, TP 2 + SP, PP 2 (1F1B), DP 2 (ZeRO 1).
fn companions() -> Vec<(&'static str, Mix)> {
    vec![
        ("alone", Mix::single()),
        (
            "tp2+sp",
            Mix {
                tp: 2,
                sp: true,
                ..Mix::single()
            },
        ),
        (
            "pp2",
            Mix {
                pp: 2,
                ..Mix::single()
            },
        ),
        (
            "dp2",
            Mix {
                dp: 2,
                zero: 1,
                ..Mix::single()
            },
        ),
    ]
}

#[test]
fn every_comm_kind_matches_the_single_rank_run() {
    let reference = run(
        &plan(config(&Mix::single(), GBS, true, "rmsnorm", "swiglu")),
        STEPS,
    );
    let mut ran = 0;
    for cp in [2, 4] {
        for kind in KINDS {
            for (name, base) in companions() {
                let mix = with_cp(cp, kind, base);
                let cfg = config(&mix, GBS, true, "rmsnorm", "swiglu");
                // Ulysses at cp 4 with tp 2 leaves 2 KV heads per TP rank for 4 CP ranks.
                if kind == "a2a" && cp == 4 && mix.tp == 2 {
                    let cfg =
                        parsim::config::Config::from_layers(&[parsim::config::Layer::overrides(
                            cfg,
                        )])
                        .expect("loads");
                    let err = parsim::config::Resolved::new(cfg)
                        .expect_err("invalid")
                        .to_string();
                    assert!(err.contains("cp_comm") || err.contains("Ulysses"), "{err}");
                    // With 8 KV heads (MHA) it divides: against that model's single rank.
                    let mha = |m: &Mix| {
                        let mut v = config(m, GBS, true, "rmsnorm", "swiglu");
                        v["model"]["num_query_groups"] = 8.into();
                        v
                    };
                    let reference = run(&plan(mha(&Mix::single())), STEPS);
                    let got = run(&plan(mha(&mix)), STEPS);
                    compare(&format!("cp {cp} {kind} {name} (MHA)"), &got, &reference);
                    ran += 1;
                    continue;
                }
                let got = run(&plan(cfg), STEPS);
                compare(&format!("cp {cp} {kind} {name}"), &got, &reference);
                ran += 1;
            }
        }
    }
    assert_eq!(ran, 32);
}

#[test]
fn recomputation_under_cp_matches_the_single_rank_run() {
    // Selective recomputation reruns the ring (or the gather, or the head group's attention)
    // for the log-sum-exp; full recomputation reruns the whole layer with its exchanges.
    for recompute in ["selective", "full"] {
        let reference = run(
            &plan(config(
                &Mix {
                    recompute,
                    ..Mix::single()
                },
                GBS,
                true,
                "layernorm",
                "gelu",
            )),
            STEPS,
        );
        for kind in KINDS {
            let mix = with_cp(
                2,
                kind,
                Mix {
                    recompute,
                    ..Mix::single()
                },
            );
            let got = run(&plan(config(&mix, GBS, true, "layernorm", "gelu")), STEPS);
            compare(&format!("cp 2 {kind} {recompute}"), &got, &reference);
        }
    }
}

/// Unmasked score elements per rank for one forward of one layer, one sequence, one head.
fn work_per_head(kind: &'static str, cp: u32) -> Vec<u64> {
    let p = plan(config(
        &with_cp(cp, kind, Mix::single()),
        GBS,
        true,
        "rmsnorm",
        "swiglu",
    ));
    let rep = run_cpu(
        &p,
        &RunOptions {
            steps: 1,
            warmup: 0,
            ..RunOptions::default()
        },
    )
    .expect("runs");
    let m = &p.model;
    let calls = (m.num_layers as usize * p.microbatches as usize * m.micro_batch * m.heads) as u64;
    rep.ranks
        .iter()
        .map(|r| {
            let w = r.cp.as_ref().expect("cp stats").score_elements;
            assert_eq!(w % calls, 0);
            w / calls
        })
        .collect()
}

#[test]
fn zigzag_balances_the_causal_work_and_the_contiguous_ring_does_not() {
    let s = 32u64;
    for cp in [2u64, 4] {
        // Zigzag: chunk c = s / 2cp; rank r holds chunks r and 2cp - 1 - r, whose queries see
        // r + (2cp - 1 - r) whole chunks and two diagonals: (2cp - 1) c^2 + c (c + 1).
        let c = s / (2 * cp);
        let zig = work_per_head("zigzag", cp as u32);
        for w in &zig {
            assert_eq!(*w, (2 * cp - 1) * c * c + c * (c + 1));
        }
        // Contiguous ring: c = s / cp; rank r sees r whole blocks and its diagonal.
        let c = s / cp;
        let ring = work_per_head("p2p", cp as u32);
        for (r, w) in ring.iter().enumerate() {
            assert_eq!(*w, r as u64 * c * c + c * (c + 1) / 2, "rank {r}");
        }
        // Both do the whole causal triangle s (s + 1) / 2 between them.
        assert_eq!(zig.iter().sum::<u64>(), s * (s + 1) / 2);
        assert_eq!(ring.iter().sum::<u64>(), s * (s + 1) / 2);
    }
}

#[test]
fn ring_steps_report_compute_and_communication() {
    let p = plan(config(
        &with_cp(4, "zigzag", Mix::single()),
        GBS,
        true,
        "rmsnorm",
        "swiglu",
    ));
    let rep = run_cpu(&p, &RunOptions::default()).expect("runs");
    for r in &rep.ranks {
        let st = r.cp.as_ref().expect("cp stats");
        // One entry per ring step, forward and backward, every one measured.
        assert_eq!(st.forward.len(), 4);
        assert_eq!(st.backward.len(), 4);
        assert!(st.forward.iter().all(|t| t.compute_s > 0.0));
        assert!(st.backward.iter().all(|t| t.compute_s > 0.0));
        // The last forward step sends nothing (the ring has closed).
        assert!(st.forward[..3].iter().all(|t| t.comm_s > 0.0));
    }
}

/// A long-sequence model whose attention dominates the memory: 2 layers, hidden 64, 8 heads
/// and 8 K/V heads, ffn 64, vocab 64, seq 512.
fn long_config(mix: &Mix) -> serde_json::Value {
    let mut v = config(mix, 2 * mix.dp as u64, true, "rmsnorm", "swiglu");
    for (k, x) in [
        ("num_layers", 2),
        ("num_query_groups", 8),
        ("ffn_hidden_size", 64),
        ("vocab_size", 64),
        ("max_position_embeddings", 512),
    ] {
        v["model"][k] = x.into();
    }
    v["training"]["seq_length"] = 512.into();
    v
}

/// Per rank (measured peak, predicted total, measured breakdown) of a long-sequence run.
fn long_memory(mix: &Mix) -> Vec<(u64, u64, String)> {
    let res = resolve(long_config(mix));
    let est = parsim::estimate::estimate(&res).expect("estimate");
    let p = parsim::lower::lower(&res, &options()).expect("lowers");
    let rep = run_cpu(
        &p,
        &RunOptions {
            steps: 1,
            warmup: 0,
            ..RunOptions::default()
        },
    )
    .expect("runs");
    rep.ranks
        .iter()
        .map(|r| {
            let s = &est.memory.stages[r.coords.pp as usize];
            let b = r.peak;
            (
                b.total(),
                s.total,
                format!(
                    "meas a {} b {} | pred a {} b {} | peak at {:?}",
                    b.activations, b.buffers, s.activations, s.buffers, r.peak_site
                ),
            )
        })
        .collect()
}

fn percent(m: u64, p: u64) -> f64 {
    (m as f64 - p as f64) / p as f64 * 100.0
}

#[test]
fn measured_peak_memory_matches_the_prediction_for_every_comm_kind() {
    // Long sequences, so the exchange buffers (ring blocks and accumulators, gathered K/V and
    // dK/dV, all-to-all send and receive buffers) and the score tiles are a visible share.
    for kind in KINDS {
        for cp in [2u32, 4] {
            for (name, base) in companions() {
                let mix = with_cp(cp, kind, base);
                for (rank, (m, p, what)) in long_memory(&mix).iter().enumerate() {
                    let e = percent(*m, *p);
                    eprintln!("{e:+.2}% {kind} cp {cp} {name} rank {rank}: {what}");
                    assert!(
                        e.abs() <= 2.0,
                        "{kind} cp {cp} {name} rank {rank}: {e:+.2}% {what}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_exchange_buffers_are_visible_in_the_comparison() {
    // All-gather holds cp x K/V twice in backward, the ring four K/V blocks: a prediction
    // that confused the two would miss the measurement by more than the 2% bound.
    let ring = long_memory(&with_cp(4, "p2p", Mix::single()));
    let gather = long_memory(&with_cp(4, "allgather", Mix::single()));
    for (r, g) in ring.iter().zip(&gather) {
        assert!(percent(g.0, r.1).abs() > 2.0, "{g:?} vs {r:?}");
        assert!(percent(r.0, g.1).abs() > 2.0, "{r:?} vs {g:?}");
    }
}

#[test]
fn doubling_cp_halves_the_activations() {
    for kind in KINDS {
        let act = |cp: u32| -> (u64, u64) {
            let mix = with_cp(cp, kind, Mix::single());
            let res = resolve(long_config(&mix));
            let est = parsim::estimate::estimate(&res).expect("estimate");
            let p = parsim::lower::lower(&res, &options()).expect("lowers");
            let rep = run_cpu(
                &p,
                &RunOptions {
                    steps: 1,
                    warmup: 0,
                    ..RunOptions::default()
                },
            )
            .expect("runs");
            let measured = rep
                .ranks
                .iter()
                .map(|r| r.category_max.activations)
                .max()
                .unwrap_or(0);
            (measured, est.memory.stages[0].activations)
        };
        let mut prev = act(1);
        for cp in [2u32, 4] {
            let cur = act(cp);
            for (name, a, b) in [("measured", prev.0, cur.0), ("predicted", prev.1, cur.1)] {
                let ratio = b as f64 / a as f64;
                assert!(
                    (ratio - 0.5).abs() <= 0.025,
                    "{kind}: {name} activations {a} at cp {} -> {b} at cp {cp} (x{ratio:.3})",
                    cp / 2
                );
            }
            prev = cur;
        }
    }
}
