//! Hidden dropout executed (rate 0.1, masks from Philox 4x32-10 keyed by global coordinates) on
//! a model with learned absolute positions: every parallel mix draws the single-rank run's
//! masks and looks up its own rows' positions (CP zigzag included), so its loss after one step and its
//! parameters after three match that run within 1e-5 relative (TP 2 + SP, PP 2 with 1F1B and
//! interleaved, DP 2 with ZeRO 1 and 3, CP 2 zigzag with TP 2 + SP, full recompute under PP 2).

use super::common::*;
use super::equivalence::{compare, GBS};
use serde_json::Value;

/// The small model GPT-3-style (GeLU, LayerNorm, learned absolute positions) with hidden
/// dropout `p`.
fn dropped(mix: &Mix, p: f64) -> Value {
    let mut v = config(mix, GBS, true, "layernorm", "gelu");
    v["model"]["hidden_dropout"] = p.into();
    v["model"]["position_embedding"] = "learned".into();
    v
}

fn mixes() -> Vec<(&'static str, Mix)> {
    let s = Mix::single;
    vec![
        (
            "tp2+sp",
            Mix {
                tp: 2,
                sp: true,
                ..s()
            },
        ),
        ("pp2 1f1b", Mix { pp: 2, ..s() }),
        (
            "pp2 interleaved",
            Mix {
                pp: 2,
                vpp: 2,
                schedule: "interleaved-1f1b",
                ..s()
            },
        ),
        (
            "dp2 zero1",
            Mix {
                dp: 2,
                zero: 1,
                ..s()
            },
        ),
        (
            "dp2 zero3",
            Mix {
                dp: 2,
                zero: 3,
                ..s()
            },
        ),
        (
            "cp2 zigzag + tp2 sp",
            Mix {
                cp: 2,
                cp_comm: "zigzag",
                tp: 2,
                sp: true,
                ..s()
            },
        ),
        (
            "pp2 full recompute",
            Mix {
                pp: 2,
                recompute: "full",
                ..s()
            },
        ),
    ]
}

#[test]
fn dropout_runs_match_the_single_rank_run_under_every_mix() {
    let reference = run(&plan(dropped(&Mix::single(), 0.1)), 3);
    // The masks act: without dropout the parameters after three steps differ far beyond the
    // tolerance (the loss itself barely moves at this initialisation: ln 128 dominates it).
    let undropped = run(&plan(dropped(&Mix::single(), 0.0)), 3);
    let (rp, up) = (reference.params.as_ref(), undropped.params.as_ref());
    let moved = rp
        .expect("params")
        .iter()
        .map(|(name, want)| rel_diff(&up.expect("params")[name], want))
        .fold(0.0, f64::max);
    assert!(moved > 1e-3, "dropout did not change the run ({moved:e})");
    for (name, mix) in mixes() {
        let got = run(&plan(dropped(&mix, 0.1)), 3);
        compare(name, &got, &reference);
    }
}

/// The engine counts Megatron's 1-byte mask per hidden dropout (n_sp x h), and the executor keeps
/// exactly that mask from forward to backward (a `U8` activation).
#[test]
fn dropout_memory_is_within_two_percent_per_rank() {
    for (name, mix) in mixes() {
        let res = super::memory::compare_config(dropped(&mix, 0.1));
        for (rank, m, p, mb, pb) in &res {
            let pct = (*m as f64 - *p as f64) / *p as f64 * 100.0;
            println!("{name} rank {rank}: measured {m} predicted {p} ({pct:+.2}%)");
            assert!(
                pct.abs() <= 2.0,
                "{name} rank {rank}: {pct:+.2}%\n  measured  {mb}\n  predicted {pb}"
            );
        }
    }
}

#[test]
fn dropout_in_moe_layers_matches_the_single_rank_run_under_ep_2() {
    // The MoE block's output is dropped like the dense MLP's (Megatron's bias-dropout-add).
    let moe = |mix: &Mix| {
        let mut v = dropped(mix, 0.1);
        let m = &mut v["model"];
        m["num_layers"] = 4.into();
        m["num_experts"] = 4.into();
        m["moe_router_topk"] = 2.into();
        m["moe_ffn_hidden_size"] = 64.into();
        m["moe_first_k_dense"] = 1.into();
        m["moe_aux_loss_coeff"] = 0.01.into();
        v["parallel"]["ep"] = if mix.dp > 1 { 2 } else { 1 }.into();
        v
    };
    let reference = run(&plan(moe(&Mix::single())), 3);
    let ep2 = Mix {
        dp: 2,
        zero: 1,
        ..Mix::single()
    };
    compare("moe ep2", &run(&plan(moe(&ep2)), 3), &reference);
}

#[test]
fn a_position_table_shorter_than_the_sequence_is_refused() {
    let mut v = dropped(&Mix::single(), 0.0);
    v["model"]["max_position_embeddings"] = 16.into();
    let cfg =
        parsim::config::Config::from_layers(&[parsim::config::Layer::overrides(v)]).expect("loads");
    let err = match parsim::config::Resolved::new(cfg) {
        Err(e) => e.to_string(),
        Ok(res) => {
            let plan = parsim::lower::lower(&res, &options()).expect("lowers");
            parsim_executor::runner::run_cpu(&plan, &Default::default())
                .expect_err("refused")
                .to_string()
        }
    };
    println!("{err}");
    assert!(err.contains("position"), "{err}");
}
