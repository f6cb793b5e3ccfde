//! Issue 31's layer kinds on the CPU executor against the single-rank run and the engine's
//! memory prediction, on three small models after today's:
//! - GPT-OSS: sliding-window attention (8 of 32 positions) on every other layer, learned
//!   attention sinks, linear biases on the router and the experts;
//! - Llama 4: chunked attention (chunks of 8) except on every fourth layer, MoE on every
//!   other layer (`moe_layer_pattern`) with a shared expert;
//! - Qwen3: QK norm (RMSNorm over each query and key head).
//!
//! Every mix (TP 2 + SP, CP 2 under each exchange, DP 2 with ZeRO, PP 2, EP 2, selective
//! recomputation) gives the single-rank run's loss after one step and its parameters after
//! three (fp32, 1e-5 relative, as the other twin tests); each kind changes the loss and adds
//! the parameters it should; the measured peaks are within 2% of the engine's.

use super::common::*;
use super::memory::{compare_config, worst_percent};
use super::moe::{compare, moe_config, Moe, BASE};
use serde_json::{json, Value};

/// The GPT-OSS kinds on the small MoE model (4 layers, 8 experts, top 2).
fn gpt_oss(c: &Moe) -> Value {
    let mut v = moe_config(c);
    let m = &mut v["model"];
    m["window_size"] = 8.into();
    m["window_attn_skip_freq"] = 2.into();
    m["attention_sinks"] = true.into();
    m["moe_router_linear_bias"] = true.into();
    m["add_bias_linear"] = true.into();
    v
}

/// The Llama 4 kinds on the small MoE model: MoE layers 1 and 3, chunks of 8 positions
/// except on layer 4 (1-based), a shared expert.
fn llama4(c: &Moe) -> Value {
    let mut v = moe_config(c);
    let m = &mut v["model"];
    m["attention_chunk_size"] = 8.into();
    m["window_attn_skip_freq"] = 4.into();
    m["moe_layer_pattern"] = json!([0, 1, 0, 1]);
    m["moe_shared_expert_intermediate_size"] = 64.into();
    v
}

/// [`llama4`] without flash attention: the chunk's mask on the kept softmax.
fn llama4_unfused(c: &Moe) -> Value {
    let mut v = llama4(c);
    v["training"]["flash_attention"] = false.into();
    v
}

/// [`gpt_oss`] with attention dropout (its mask drawn from each score's global coordinates,
/// so the window's visible scores keep their draws under any layout).
fn gpt_oss_dropout(c: &Moe) -> Value {
    let mut v = gpt_oss(c);
    v["model"]["attention_dropout"] = 0.1.into();
    v
}

/// QK norm on the small dense model (4 layers).
fn qwen3(mix: &Mix) -> Value {
    let mut v = config(mix, 16, true, "rmsnorm", "swiglu");
    v["model"]["num_layers"] = 4.into();
    v["model"]["qk_layernorm"] = true.into();
    v
}

/// Runs `model` on every mix against its single-rank run.
fn twins(label: &str, model: fn(&Moe) -> Value, mixes: &[Moe]) {
    let reference = run(&plan(model(&BASE)), 3);
    for c in mixes {
        let got = run(&plan(model(c)), 3);
        compare(&format!("{label} {c:?}"), &got, &reference);
    }
}

#[test]
fn gpt_oss_windows_sinks_and_biases_match_the_single_rank_run() {
    let mixes = [
        Moe {
            tp: 2,
            sp: true,
            ..BASE
        },
        Moe {
            tp: 2,
            sp: true,
            recompute: "selective",
            ..BASE
        },
        Moe {
            cp: 2,
            cp_comm: "p2p",
            recompute: "selective",
            ..BASE
        },
        Moe {
            cp: 2,
            cp_comm: "zigzag",
            ..BASE
        },
        Moe {
            ep: 2,
            dp: 2,
            zero: 1,
            ..BASE
        },
        Moe { pp: 2, ..BASE },
        Moe {
            cp: 4,
            cp_comm: "p2p",
            ..BASE
        },
    ];
    twins("gpt-oss", gpt_oss, &mixes);
}

/// A window on every layer under the contiguous ring of CP 4 (8 positions a rank, window 8):
/// each rank needs its own block and its predecessor's only, so the ring stops after two
/// steps forward and backward (the last visitor's dK/dV sent straight home), as the engine's
/// windowed exchange counts it; the run still equals the single-rank one, with selective
/// recomputation too (the forward ring rerun for the log-sum-exp).
#[test]
fn a_window_under_the_ring_visits_only_the_blocks_within_reach() {
    fn all_windowed(c: &Moe) -> Value {
        let mut v = gpt_oss(c);
        v["model"]["window_attn_skip_freq"] = 0.into();
        v
    }
    let mixes = [
        Moe {
            cp: 4,
            cp_comm: "p2p",
            ..BASE
        },
        Moe {
            cp: 4,
            cp_comm: "p2p",
            recompute: "selective",
            ..BASE
        },
    ];
    twins("gpt-oss all windowed", all_windowed, &mixes);
    let rep = run(&plan(all_windowed(&mixes[0])), 1);
    for r in &rep.ranks {
        let cp = r.cp.as_ref().expect("cp stats");
        assert_eq!(
            (cp.forward.len(), cp.backward.len()),
            (2, 2),
            "rank {}",
            r.rank
        );
    }
    // Zigzag keeps the whole ring (each rank's late chunk needs its neighbours' early ones).
    let zigzag = Moe {
        cp: 4,
        cp_comm: "zigzag",
        ..BASE
    };
    let rep = run(&plan(all_windowed(&zigzag)), 1);
    assert_eq!(rep.ranks[0].cp.as_ref().expect("cp stats").forward.len(), 4);
}

#[test]
fn llama4_chunks_and_interleaved_moe_match_the_single_rank_run() {
    let mixes = [
        Moe {
            tp: 2,
            sp: true,
            ..BASE
        },
        Moe {
            cp: 2,
            cp_comm: "allgather",
            ..BASE
        },
        Moe {
            cp: 2,
            cp_comm: "a2a",
            ..BASE
        },
        Moe {
            ep: 2,
            dp: 2,
            zero: 2,
            ..BASE
        },
        Moe {
            pp: 2,
            vpp: 2,
            schedule: "interleaved-1f1b",
            ..BASE
        },
    ];
    twins("llama4", llama4, &mixes);
    twins("llama4 unfused", llama4_unfused, &mixes[..1]);
}

#[test]
fn windows_and_sinks_with_attention_dropout_match_the_single_rank_run() {
    let mixes = [
        Moe {
            tp: 2,
            sp: true,
            ..BASE
        },
        Moe {
            cp: 2,
            cp_comm: "zigzag",
            ..BASE
        },
    ];
    twins("gpt-oss dropout", gpt_oss_dropout, &mixes);
}

#[test]
fn qwen3_qk_norm_matches_the_single_rank_run() {
    let reference = run(&plan(qwen3(&Mix::single())), 3);
    let mixes = [
        Mix::tp2_sp(),
        Mix {
            tp: 2,
            ..Mix::single()
        },
        Mix::cp2("a2a"),
        Mix::cp2("zigzag"),
        Mix::dp2(3),
        Mix::pp2("1f1b", 1),
        Mix {
            recompute: "full",
            ..Mix::tp2_sp()
        },
    ];
    for mix in mixes {
        let got = run(&plan(qwen3(&mix)), 3);
        super::equivalence::compare(&format!("qwen3 {mix:?}"), &got, &reference);
    }
}

/// Each kind is on: it changes the first loss against the same model without it, and its
/// parameters are there with the engine's shapes (QK norm: two gains of head_dim; sinks: one
/// per head; the router's bias: one per expert, only on the MoE layers of the pattern).
#[test]
fn each_kind_changes_the_model_and_holds_its_parameters() {
    let without = |v: &Value, field: &str, off: Value| {
        let mut w = v.clone();
        w["model"][field] = off;
        run(&plan(w), 1).loss[0]
    };
    let cases: [(Value, &str, Value); 6] = [
        (gpt_oss(&BASE), "window_size", Value::Null),
        (gpt_oss(&BASE), "attention_sinks", false.into()),
        (gpt_oss(&BASE), "moe_router_linear_bias", false.into()),
        (llama4(&BASE), "attention_chunk_size", Value::Null),
        (llama4(&BASE), "moe_layer_pattern", json!([1, 1, 1, 1])),
        (qwen3(&Mix::single()), "qk_layernorm", false.into()),
    ];
    for (v, field, off) in cases {
        let mut v = v;
        if field == "window_size" || field == "attention_chunk_size" {
            v["model"]["window_attn_skip_freq"] = 0.into();
        }
        let with = run(&plan(v.clone()), 1).loss[0];
        let other = without(&v, field, off);
        assert!((with - other).abs() > 1e-6, "{field}: {with} vs {other}");
    }
    let p = run(&plan(gpt_oss(&BASE)), 1).params.expect("params");
    assert_eq!(p["layers.0.sinks"].len(), 8);
    assert_eq!(p["layers.2.router_linear_bias"].len(), 8);
    assert_eq!(p["layers.1.experts.3.fc1_bias"].len(), 2 * 64);
    let p = run(&plan(llama4(&BASE)), 1).params.expect("params");
    assert!(p.contains_key("layers.1.router") && p.contains_key("layers.3.router"));
    assert!(!p.contains_key("layers.0.router") && !p.contains_key("layers.2.router"));
    assert!(p.contains_key("layers.2.w_gate") && !p.contains_key("layers.1.w_gate"));
    let p = run(&plan(qwen3(&Mix::single())), 1).params.expect("params");
    assert_eq!(p["layers.3.q_norm.weight"].len(), 8);
    assert_eq!(p["layers.3.k_norm.weight"].len(), 8);
}

/// Per-rank peaks within 2% of the engine's prediction, and the weights equal to its count
/// (the MoE models under Megatron's forced load balancing, the engine's balanced router).
#[test]
fn modern_layer_memory_is_within_2_percent_of_the_prediction() {
    let balanced = |c: Moe| Moe {
        force_balance: true,
        ..c
    };
    let tp2 = Moe {
        tp: 2,
        sp: true,
        ..BASE
    };
    let configs = [
        ("gpt-oss single", gpt_oss(&balanced(BASE))),
        ("gpt-oss tp2 sp", gpt_oss(&balanced(tp2))),
        ("llama4 single", llama4(&balanced(BASE))),
        ("llama4 tp2 sp", llama4(&balanced(tp2))),
        ("llama4 unfused single", llama4_unfused(&balanced(BASE))),
        ("qwen3 tp2 sp", qwen3(&Mix::tp2_sp())),
        ("qwen3 cp2", qwen3(&Mix::cp2("p2p"))),
        (
            "gpt-oss cp2 zigzag",
            gpt_oss(&balanced(Moe {
                cp: 2,
                cp_comm: "zigzag",
                ..BASE
            })),
        ),
        (
            "gpt-oss cp4 p2p",
            gpt_oss(&balanced(Moe {
                cp: 4,
                cp_comm: "p2p",
                ..BASE
            })),
        ),
        (
            "llama4 cp2 a2a",
            llama4(&balanced(Moe {
                cp: 2,
                cp_comm: "a2a",
                ..BASE
            })),
        ),
    ];
    for (label, v) in configs {
        let res = compare_config(v);
        let worst = worst_percent(&res);
        eprintln!("{worst:+.2}% {label}");
        for (rank, _, _, mb, pb) in &res {
            let head = |s: &str| s.split(" a ").next().unwrap_or("").to_string();
            assert_eq!(
                head(mb),
                head(pb),
                "{label} rank {rank}: weights/grads/optimizer"
            );
        }
        assert!(worst.abs() <= 2.0, "{label}: {worst:+.2}% {res:#?}");
    }
}

/// What the executor cannot run is refused by name when lowering: sinks outside the flash
/// attention (their logit joins the softmax through its log-sum-exp).
#[test]
fn sinks_without_flash_attention_are_refused_by_name() {
    let mut v = gpt_oss(&BASE);
    v["training"]["flash_attention"] = false.into();
    let e = parsim::lower::lower(&resolve(v), &options()).expect_err("refused");
    assert!(e.to_string().starts_with("training.flash_attention"), "{e}");
}

/// A hand-made plan with a window or chunk of no key, sinks outside flash attention or a MoE
/// pattern of another length than the layers is refused by the executor's own checks, naming
/// the field.
#[test]
fn bad_layer_kinds_in_a_plan_are_refused_by_name() {
    let good = plan(llama4(&BASE));
    good.validate().expect("valid");
    type Spoil = fn(&mut parsim_plan::plan::Plan);
    let cases: [(&str, Spoil); 4] = [
        ("model.attention.window", |p| {
            p.model.attention.window = Some(0)
        }),
        ("model.attention.chunk", |p| {
            p.model.attention.chunk = Some(0)
        }),
        ("model.attention.sinks", |p| {
            p.model.attention.sinks = true;
            p.model.flash = false;
        }),
        ("model.moe.layer_pattern", |p| {
            if let Some(m) = p.model.moe.as_mut() {
                m.layer_pattern = vec![0, 1, 1];
            }
        }),
    ];
    for (field, bad) in cases {
        let mut p = good.clone();
        bad(&mut p);
        let e = p.validate().expect_err("refused").to_string();
        assert!(e.starts_with(field), "{field}: {e}");
    }
}
