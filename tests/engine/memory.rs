//! Weights + gradients + optimizer per parameter (Rajbhandari et al. 2020, "ZeRO", Sec. 3:
//! mixed-precision Adam keeps 2 + 2 + 12 bytes; Megatron keeps fp32 main gradients, so 2 + 4
//! + 12 = 18 bytes without ZeRO, and its distributed optimizer (ZeRO-1) 6 + 12/d).

use super::common::est;
use serde_json::json;

fn model_states(e: &parsim::estimate::Estimate) -> u64 {
    let s = &e.memory.stages[0];
    s.weights + s.gradients + s.optimizer
}

#[test]
fn eighteen_bytes_per_parameter_without_zero() {
    for (tp, pp) in [(1u32, 1u32), (2, 1), (1, 4), (4, 2)] {
        let e = est(
            json!({"model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": tp * pp},
                           "parallel": {"tp": tp, "pp": pp, "zero": 0, "sp": tp > 1},
                           "training": {"seq_length": 4096, "global_batch_size": 8}}),
        );
        let p = {
            let r = super::common::resolve(
                json!({"model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": tp * pp},
                               "parallel": {"tp": tp, "pp": pp, "zero": 0, "sp": tp > 1},
                               "training": {"seq_length": 4096, "global_batch_size": 8}}),
            );
            let l = parsim::model::Ledger::build(&r);
            let s = parsim::model::LedgerSummary::of(&l, r.config.training.recompute);
            parsim::model::rank_params(&parsim::model::chunks_per_rank(&r)[0], &s).rank()
        };
        assert_eq!(model_states(&e), 18 * p, "tp {tp} pp {pp}");
    }
}

#[test]
fn zero1_is_six_plus_twelve_over_d() {
    // Llama-2-7B (6,738,415,616 parameters, divisible by 8) on one TP/PP rank.
    let p: u64 = 6_738_415_616;
    for (dp, cp) in [(8u32, 1u32), (4, 2), (2, 1)] {
        let e = est(
            json!({"model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": dp * cp},
                           "parallel": {"tp": 1, "cp": cp, "zero": 1, "sp": false},
                           "training": {"seq_length": 4096, "global_batch_size": 8 * dp as u64}}),
        );
        let d = (dp * cp) as u64;
        // The distributed optimizer shards over DP x CP (Megatron's data-parallel group with
        // context parallelism; its theoretical-memory report divides by DP alone).
        assert_eq!(model_states(&e), 6 * p + 12 * p / d, "dp {dp} cp {cp}");
    }
}

#[test]
fn zero2_and_zero3_shard_gradients_then_weights() {
    // ZeRO paper, Fig. 1: P_os+g = 2 + 14/d (with fp32 grads: 2 + 16/d), P_os+g+p = 18/d here.
    let p: u64 = 6_738_415_616;
    let run = |zero: u8| {
        let e = est(
            json!({"model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": 8},
                           "parallel": {"tp": 1, "zero": zero, "sp": false},
                           "training": {"seq_length": 4096, "global_batch_size": 8}}),
        );
        model_states(&e)
    };
    assert_eq!(run(2), 2 * p + 16 * p / 8);
    assert_eq!(run(3), 18 * p / 8);
}

#[test]
fn lora_freezes_the_base() {
    // Frozen base weights carry no gradients or optimizer state (Hu et al. 2021): only the
    // adapters, r(in + out) per targeted projection, do.
    let e = est(
        json!({"model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": 1},
                       "parallel": {"tp": 1, "zero": 0, "sp": false},
                       "training": {"seq_length": 4096, "global_batch_size": 1, "mode": "lora",
                                    "lora": {"rank": 8, "targets": ["qkv", "proj"]}}}),
    );
    // qkv: 4096 -> 3 x 4096; proj: 4096 -> 4096.
    let adapters: u64 = 32 * 8 * ((4096 + 3 * 4096) + (4096 + 4096));
    let s = &e.memory.stages[0];
    assert_eq!(e.params.trainable, adapters);
    assert_eq!(s.gradients, adapters * 4);
    assert_eq!(s.optimizer, adapters * 12);
    assert_eq!(s.weights, (6_738_415_616 + adapters) * 2);
}

/// Ranks that hold the same blocks share all of their memory but the activation walk
/// (`stage_memories`): rank by rank it must equal `stage_memory` worked out for that rank
/// alone, on pipelines with repeated middle ranks, with an uneven split, a V (two chunks per
/// rank and a hand-off at its bottom), interleaving, ZeRO-3 with experts, and ranks that only
/// know their peak count of live sets.
#[test]
fn shared_rank_memory_equals_each_rank_alone() {
    use parsim::memory::{stage_memories, stage_memory, Pipeline};
    use parsim::model::{chunks_per_rank, Ledger, LedgerSummary};
    let l70b = |parallel: serde_json::Value| {
        json!({"model": {"preset": "llama3-70b"}, "cluster": {"num_gpus": 64},
               "parallel": parallel,
               "training": {"seq_length": 4096, "global_batch_size": 128}})
    };
    let overlays = [
        l70b(json!({"tp": 2, "pp": 8})),
        l70b(json!({"tp": 8, "pp": 4, "first_stage_layers": 18, "last_stage_layers": 18})),
        l70b(json!({"tp": 8, "pp": 4, "vpp": 2, "schedule": "zb-v"})),
        l70b(json!({"tp": 8, "pp": 4, "vpp": 5, "schedule": "interleaved-1f1b"})),
        json!({"model": {"preset": "mixtral-8x7b"}, "cluster": {"num_gpus": 32},
               "parallel": {"tp": 1, "pp": 2, "ep": 8, "zero": 3},
               "training": {"seq_length": 4096, "global_batch_size": 256}}),
    ];
    for overlay in overlays {
        let r = super::common::resolve(overlay.clone());
        let par = &r.config.parallel;
        let l = Ledger::build(&r);
        let s = LedgerSummary::of(&l, r.config.training.recompute);
        let chunks = chunks_per_rank(&r);
        let program =
            parsim::schedule::generate(par.schedule, par.pp, par.vpp, r.microbatches).unwrap();
        let shared = stage_memories(&r, &s, &l, &chunks, |rank| {
            Pipeline::Actions(&program.ranks[rank])
        });
        let counted = |rank: usize| Pipeline::Inflight {
            sets: 1 + rank as u32,
            split: false,
        };
        let shared_counted = stage_memories(&r, &s, &l, &chunks, counted);
        assert_eq!(shared.len(), chunks.len());
        for (rank, ch) in chunks.iter().enumerate() {
            let walked = Pipeline::Actions(&program.ranks[rank]);
            let alone = stage_memory(&r, &s, &l, rank as u32, ch, walked);
            assert_eq!(shared[rank], alone, "{overlay} rank {rank}");
            let alone = stage_memory(&r, &s, &l, rank as u32, ch, counted(rank));
            assert_eq!(
                shared_counted[rank], alone,
                "{overlay} rank {rank} (counted)"
            );
        }
    }
}

/// Llama-2-7B's parameters (divisible by 8 and by bitsandbytes' 2048-element blocks).
const LLAMA2_7B: u64 = 6_738_415_616;

/// Weights + gradients + optimizer of Llama-2-7B on 8 data-parallel GPUs under `training`.
fn llama2_7b_on_8(zero: u8, training: serde_json::Value) -> u64 {
    let mut t = json!({"seq_length": 4096, "global_batch_size": 8});
    t.as_object_mut()
        .unwrap()
        .extend(training.as_object().unwrap().clone());
    model_states(&est(
        json!({"model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": 8},
               "parallel": {"tp": 1, "zero": zero, "sp": false}, "training": t}),
    ))
}

#[test]
fn pure_bf16_training_shards_its_eight_or_ten_bytes_by_zero_stage() {
    // Without a master copy (bf16 weight 2, bf16 gradient 2, moments): FSDP's torch AdamW
    // keeps bf16 moments 2 + 2; DeepSpeed's bf16_master_weights_and_grads also a bf16 copy of
    // its partition (2). ZeRO-1 shards the optimizer term over d = 8, ZeRO-2 the gradients
    // too, ZeRO-3 the weights too (Rajbhandari et al. 2020, Fig. 1).
    let p = LLAMA2_7B;
    let pure = |framework: &str| json!({"framework": framework, "master_weights": false, "grad_dtype": "bf16"});
    for (framework, optimizer) in [("fsdp", 4), ("deepspeed", 6)] {
        let run = |zero| llama2_7b_on_8(zero, pure(framework));
        assert_eq!(run(1), 4 * p + optimizer * p / 8, "{framework} zero 1");
        assert_eq!(
            run(2),
            2 * p + (2 + optimizer) * p / 8,
            "{framework} zero 2"
        );
        assert_eq!(run(3), (4 + optimizer) * p / 8, "{framework} zero 3");
    }
}

#[test]
fn megatrons_precision_aware_optimizer_keeps_the_master_as_remainders() {
    // --use-precision-aware-optimizer with the distributed optimizer: bf16 weights 2 and fp32
    // main gradients 4 whole, and per d the master's 16 remainder bits (TE FusedAdam's
    // store_param_remainders: an int16 `master_param`) 2 plus the moments: bf16 2 + 2, fp8
    // 1 + 1. Today's 6 + 12/d becomes 6 + 6/d and 6 + 4/d.
    let p = LLAMA2_7B;
    let with = |dtype: &str| llama2_7b_on_8(1, json!({"optimizer_state_dtype": dtype}));
    assert_eq!(with("bf16"), 6 * p + 6 * p / 8);
    assert_eq!(with("fp8"), 6 * p + 4 * p / 8);
    assert_eq!(with("fp32"), 6 * p + 12 * p / 8);
}

#[test]
fn bitsandbytes_int8_moments_add_one_absmax_per_2048_elements() {
    // DDP (ZeRO 0) with bitsandbytes' 8-bit AdamW: bf16 weights 2, fp32 gradients 4, fp32
    // master 4, and per moment one byte per element plus a 4-byte absmax per block of 2048
    // (bitsandbytes/optim/optimizer.py, Optimizer2State.init_state).
    let p = LLAMA2_7B;
    let got = llama2_7b_on_8(
        0,
        json!({"framework": "fsdp", "optimizer_state_dtype": "int8"}),
    );
    assert_eq!(got, 10 * p + 2 * (p + 4 * (p / 2048)));
}
