//! Helpers: the small test model as a configuration, lowering, running, comparing.

use parsim::config::{Config, Layer, Resolved};
use parsim::lower::{lower, LowerOptions};
use parsim_executor::runner::{run_cpu, RunOptions};
use parsim_plan::plan::{AdamConfig, Plan};
use parsim_plan::RunReport;
use serde_json::{json, Value};

/// One point of the parallel grid.
#[derive(Debug, Clone)]
pub struct Mix {
    pub tp: u32,
    pub sp: bool,
    pub cp: u32,
    /// p2p | zigzag | allgather | a2a
    pub cp_comm: &'static str,
    pub pp: u32,
    pub vpp: u32,
    pub schedule: &'static str,
    pub dp: u32,
    pub zero: u8,
    pub recompute: &'static str,
}

impl Mix {
    /// TP 2 with sequence parallelism.
    pub fn tp2_sp() -> Mix {
        Mix {
            tp: 2,
            sp: true,
            ..Mix::single()
        }
    }

    /// PP 2 under `schedule` with `vpp` chunks per rank.
    pub fn pp2(schedule: &'static str, vpp: u32) -> Mix {
        Mix {
            pp: 2,
            vpp,
            schedule,
            ..Mix::single()
        }
    }

    /// DP 2 with ZeRO stage `zero`.
    pub fn dp2(zero: u8) -> Mix {
        Mix {
            dp: 2,
            zero,
            ..Mix::single()
        }
    }

    /// CP 2 with the exchange `cp_comm`.
    pub fn cp2(cp_comm: &'static str) -> Mix {
        Mix {
            cp: 2,
            cp_comm,
            ..Mix::single()
        }
    }

    pub fn single() -> Mix {
        Mix {
            tp: 1,
            sp: false,
            cp: 1,
            cp_comm: "p2p",
            pp: 1,
            vpp: 1,
            schedule: "1f1b",
            dp: 1,
            zero: 0,
            recompute: "none",
        }
    }
}

/// The small model of the acceptance test: 8 layers (so that pp 4 x vpp 2 has a layer per
/// chunk), hidden 64, 8 heads and 4 KV heads (GQA; Megatron splits K/V heads over TP, so TP 4
/// needs at least 4 of them), seq 32, vocab 128; fp32 on the CPU profile.
pub fn config(mix: &Mix, gbs: u64, flash: bool, norm: &str, act: &str) -> Value {
    json!({
        "model": {
            "num_layers": 8, "hidden_size": 64, "num_attention_heads": 8, "num_query_groups": 4,
            "ffn_hidden_size": 128, "vocab_size": 128, "make_vocab_size_divisible_by": 1,
            "activation": act, "normalization": norm, "tied_embeddings": false,
            "hidden_dropout": 0.0, "attention_dropout": 0.0, "add_bias_linear": false,
            "add_qkv_bias": false, "position_embedding": "rope", "max_position_embeddings": 32,
            "num_experts": 0
        },
        "cluster": {"gpu": "cpu", "num_gpus": mix.tp * mix.cp * mix.pp * mix.dp, "gpus_per_node": 64},
        "parallel": {
            "tp": mix.tp, "sp": mix.sp, "pp": mix.pp, "vpp": mix.vpp, "schedule": mix.schedule,
            "dp": mix.dp, "zero": mix.zero, "cp": mix.cp, "cp_comm": mix.cp_comm, "ep": 1
        },
        "training": {
            "seq_length": 32, "micro_batch_size": 1, "global_batch_size": gbs,
            "precision": "fp32", "grad_dtype": "fp32", "recompute": mix.recompute,
            "flash_attention": flash
        }
    })
}

pub fn resolve(v: Value) -> Resolved {
    let cfg = Config::from_layers(&[Layer::overrides(v)]).expect("config loads");
    Resolved::new(cfg).unwrap_or_else(|e| panic!("config validates: {e}"))
}

pub fn options() -> LowerOptions {
    LowerOptions {
        seed: 7,
        adam: AdamConfig {
            lr: 1e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-6,
            weight_decay: 0.01,
        },
        init_std: 0.05,
        ..LowerOptions::default()
    }
}

pub fn plan(v: Value) -> Plan {
    lower(&resolve(v), &options()).unwrap_or_else(|e| panic!("lowers: {e}"))
}

pub fn run(plan: &Plan, steps: u32) -> RunReport {
    run_cpu(
        plan,
        &RunOptions {
            steps,
            warmup: 0,
            export_params: true,
            ..RunOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("runs: {e}"))
}

/// Largest |a - b| / max|b| over one tensor; both must hold the same elements.
pub fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b
        .iter()
        .map(|x| x.abs() as f64)
        .fold(0.0, f64::max)
        .max(1e-30);
    a.iter()
        .zip(b)
        .map(|(x, y)| (*x as f64 - *y as f64).abs())
        .fold(0.0, f64::max)
        / scale
}
