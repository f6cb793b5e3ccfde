//! Megatron-FSDP and torch FSDP2 (`parallel.fsdp`) as ZeRO stages with their documented
//! buffers (src/config/fsdp.rs cites them): the sharded states by hand per strategy, the
//! double buffers in backward as the exact difference from the generic ZeRO model, the
//! per-unit gradient reduction, the Megatron flags read and written, and bad values refused
//! by field.

use super::common::{est, resolve};
use parsim::config::megatron::{import, to_megatron_args};
use parsim::config::{Config, ConfigError, Fsdp, Layer, Resolved};
use parsim::estimate::Estimate;
use parsim::model::CommKind;
use serde_json::{json, Value};

/// A 2-layer Llama-style model (hidden 64, 4 heads of 16, SwiGLU FFN 256, vocabulary 64,
/// untied) on 4 GPUs of pure data parallelism, bf16 weights, fp32 gradients, Adam. The small
/// vocabulary keeps the logits below a layer's backward buffers, so the worst moment is a
/// backward's in every variant.
fn small(zero: u8, fsdp: Option<&str>) -> Value {
    let mut v = json!({
        "model": {"name": "small", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "num_query_groups": 4, "ffn_hidden_size": 256, "vocab_size": 64,
            "max_position_embeddings": 1024},
        "cluster": {"num_gpus": 4, "gpus_per_node": 4},
        "parallel": {"tp": 1, "sp": false, "zero": zero},
        "training": {"seq_length": 128, "global_batch_size": 8, "micro_batch_size": 1}
    });
    if let Some(f) = fsdp {
        v["parallel"]["fsdp"] = json!(f);
    }
    v
}

// By hand, the small model's parameters: a layer's two norms 2 x 64, q, k, v and o 4 x 64 x 64
// and the MLP 3 x 64 x 256 = 65,664; the embedding 64 x 64 = 4,096; the output layer 4,096
// and the final norm 64. Total 2 x 65,664 + 4,096 + 4,160 = 139,584; a quarter 34,896.
const LAYER: u64 = 65_664;
const EMBEDDING: u64 = 4_096;
const TOTAL: u64 = 139_584;
const SHARD: u64 = TOTAL / 4;

/// (weights, gradients, optimizer) bytes of the one pipeline rank.
fn states(e: &Estimate) -> (u64, u64, u64) {
    let s = &e.memory.stages[0];
    (s.weights, s.gradients, s.optimizer)
}

#[test]
fn each_megatron_strategy_shards_its_states_by_hand() {
    // Megatron-FSDP's ShardingStrategy (fully_shard.py): no_shard replicates everything (DDP);
    // optim shards the optimizer (12 bytes: fp32 master and two moments); optim_grads the
    // fp32 gradients too (4 bytes); optim_grads_params the bf16 weights too (2 bytes).
    let full = (TOTAL * 2, TOTAL * 4, TOTAL * 12);
    let expect = [
        (0, full),
        (1, (TOTAL * 2, TOTAL * 4, SHARD * 12)),
        (2, (TOTAL * 2, SHARD * 4, SHARD * 12)),
        (3, (SHARD * 2, SHARD * 4, SHARD * 12)),
    ];
    assert_eq!(est(small(0, None)).params.total, TOTAL);
    for (zero, by_hand) in expect {
        let e = est(small(zero, Some("megatron")));
        assert_eq!(states(&e), by_hand, "{}", Fsdp::megatron_strategy(zero));
        // The persistent states are the generic ZeRO stage's.
        assert_eq!(states(&e), states(&est(small(zero, None))), "zero {zero}");
    }
}

#[test]
fn the_double_buffers_are_the_exact_difference_from_generic_zero() {
    // The generic ZeRO model holds in backward one gathered unit and one gradient bucket.
    // Megatron-FSDP's runtime schedule adds, under optim_grads_params, the prefetched unit's
    // gathered bf16 weights (the largest unit, a layer: 65,664 x 2 = 131,328) and the
    // previous unit's fp32 gradients still reduce-scattering (65,664 x 4 = 262,656): 393,984;
    // under optim_grads only the gradient buffer, 262,656; under optim and no_shard nothing
    // (the gradients are whole and reduced once). Torch FSDP2 adds what Megatron-FSDP does at
    // ZeRO-3 and keeps the root module's embedding gathered from forward to backward
    // (64 x 64 x 2 = 8,192): 402,176.
    let by_hand = [
        (Some("megatron"), 0, 0),
        (Some("megatron"), 1, 0),
        (Some("megatron"), 2, LAYER * 4),
        (Some("megatron"), 3, LAYER * 2 + LAYER * 4),
        (Some("torch"), 3, LAYER * 2 + LAYER * 4 + EMBEDDING * 2),
    ];
    assert_eq!(LAYER * 2 + LAYER * 4, 393_984);
    assert_eq!(LAYER * 6 + EMBEDDING * 2, 402_176);
    for (fsdp, zero, extra) in by_hand {
        let generic = est(small(zero, None));
        let e = est(small(zero, fsdp));
        let (g, s) = (&generic.memory.stages[0], &e.memory.stages[0]);
        assert_eq!(
            s.buffers - g.buffers,
            extra,
            "{fsdp:?} zero {zero}: buffers"
        );
        // The worst moment is a backward's, so the total grows by as much.
        assert_eq!(s.total - g.total, extra, "{fsdp:?} zero {zero}: total");
        assert_eq!(s.activations, g.activations, "{fsdp:?} zero {zero}");
    }
}

#[test]
fn fsdp_reduces_gradients_one_unit_at_a_time() {
    // Megatron-FSDP and FSDP2 reduce-scatter each unit's gradients as one collective (the
    // calls themselves are derived in tests/engine/zero_calls.rs), where Megatron-Core's own
    // bucket is max(40M, 1M x dp) parameters (the whole model here, one call): the step
    // differs from the generic model's.
    for zero in [2, 3] {
        let fsdp = est(small(zero, Some("megatron")));
        let generic = est(small(zero, None));
        assert!(fsdp.time.step_s != generic.time.step_s, "zero {zero}");
    }
}

fn violations(v: Value) -> Vec<parsim::config::Violation> {
    let cfg = Config::from_layers(&[Layer::overrides(v)]).expect("loads");
    match Resolved::new(cfg) {
        Err(ConfigError::Invalid(v)) => v,
        other => panic!("expected violations, got {other:?}"),
    }
}

#[test]
fn bad_fsdp_settings_are_refused_by_field() {
    // torch FSDP2 below ZeRO-3.
    let errs = violations(small(1, Some("torch")));
    assert_eq!(errs[0].field, "parallel.zero");
    assert!(errs[0].rule.contains("zero must be 3"), "{}", errs[0].rule);
    // FSDP under DeepSpeed.
    let mut v = small(3, Some("megatron"));
    v["training"]["framework"] = json!("deepspeed");
    assert_eq!(violations(v)[0].field, "parallel.fsdp");
    // An unknown implementation: the loader names the field and the known values.
    let err = Config::from_layers(&[Layer::overrides(small(3, Some("jax")))])
        .expect_err("unknown fsdp")
        .to_string();
    assert!(err.contains("parallel.fsdp"), "{err}");
    assert!(err.contains("megatron") && err.contains("torch"), "{err}");
    // Every valid pair resolves.
    for zero in 0..=3 {
        resolve(small(zero, Some("megatron")));
    }
    resolve(small(3, Some("torch")));
    // The executor runs the generic stages: the lowering refuses FSDP by name.
    let err = parsim::lower::lower(
        &resolve(small(3, Some("megatron"))),
        &parsim::lower::LowerOptions::default(),
    )
    .expect_err("refused")
    .to_string();
    assert!(err.starts_with("parallel.fsdp"), "{err}");
}

const BASE: &str = "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512";

#[test]
fn megatron_fsdp_flags_are_read_and_written() {
    for (strategy, zero) in [
        ("no_shard", 0),
        ("optim", 1),
        ("optim_grads", 2),
        ("optim_grads_params", 3),
    ] {
        let args = format!(
            "{BASE} --use-megatron-fsdp --data-parallel-sharding-strategy {strategy} --use-distributed-optimizer"
        );
        let imp = import(&args, "args").expect("imports");
        assert_eq!(
            imp.layer["parallel"]["fsdp"],
            json!("megatron"),
            "{strategy}"
        );
        assert_eq!(imp.layer["parallel"]["zero"], json!(zero), "{strategy}");
        for flag in ["--use-megatron-fsdp", "--data-parallel-sharding-strategy"] {
            assert!(!imp.ignored.iter().any(|f| f == flag), "{flag} read");
        }
        // Written back as the same flags, and read again as the same setting.
        let cfg = Config::from_layers(&[Layer::overrides(imp.layer)]).expect("merges");
        let text = to_megatron_args(&cfg);
        assert!(text.contains("--use-megatron-fsdp"), "{text}");
        assert!(
            text.contains(&format!("--data-parallel-sharding-strategy {strategy}")),
            "{text}"
        );
        let again = import(&text, "printed").expect("re-imports");
        assert_eq!(again.layer["parallel"]["zero"], json!(zero), "{strategy}");
        assert_eq!(again.layer["parallel"]["fsdp"], json!("megatron"));
    }
    // Megatron-FSDP's default strategy is optim_grads_params; its examples/megatron_fsdp
    // launch's buffer flags are read, not ignored.
    let imp = import(
        &format!(
            "{BASE} --use-megatron-fsdp --fsdp-double-buffer --outer-dp-sharding-strategy no_shard"
        ),
        "args",
    )
    .expect("imports");
    assert_eq!(imp.layer["parallel"]["zero"], json!(3));
    for flag in ["--fsdp-double-buffer", "--outer-dp-sharding-strategy"] {
        assert!(!imp.ignored.iter().any(|f| f == flag), "{flag} read");
    }
    // torch FSDP2: fully sharded.
    let imp = import(&format!("{BASE} --use-torch-fsdp2"), "args").expect("imports");
    assert_eq!(
        (
            &imp.layer["parallel"]["fsdp"],
            &imp.layer["parallel"]["zero"]
        ),
        (&json!("torch"), &json!(3))
    );
    for (extra, needle) in [
        ("--use-megatron-fsdp --use-torch-fsdp2", "not both"),
        (
            "--use-megatron-fsdp --data-parallel-sharding-strategy full_shard",
            "--data-parallel-sharding-strategy: unknown 'full_shard'",
        ),
        (
            "--data-parallel-sharding-strategy zero3",
            "--data-parallel-sharding-strategy: unknown 'zero3'",
        ),
        (
            "--use-megatron-fsdp --outer-dp-sharding-strategy optim",
            "--outer-dp-sharding-strategy optim: hybrid sharding",
        ),
    ] {
        let err = import(&format!("{BASE} {extra}"), "args")
            .expect_err(extra)
            .to_string();
        assert!(err.contains(needle), "{extra}: {err}");
    }
}

/// The small model on two pipeline stages of four data-parallel ranks (8 GPUs), 4
/// microbatches, torch FSDP2 (ZeRO-3) under `framework`: "fsdp" is torch.distributed.pipelining
/// (torchtitan), "megatron-core" Megatron-LM's `--use-torch-fsdp2`.
fn pipelined(framework: &str) -> Value {
    let mut v = small(3, Some("torch"));
    v["cluster"] = json!({"num_gpus": 8, "gpus_per_node": 8});
    v["parallel"]["pp"] = json!(2);
    v["training"]["global_batch_size"] = json!(16);
    v["training"]["framework"] = json!(framework);
    v
}

#[test]
fn torch_fsdp2_under_pipelining_gathers_and_reduces_once_a_step() {
    use parsim::layout::{GroupKind, Layout};
    use parsim::model::CollectiveKind;
    use parsim::network::Network;
    // torch.distributed.pipelining's stage runs every microbatch's backward with
    // set_requires_gradient_sync(False) and set_reshard_after_backward(False), then calls the
    // post-backward hooks (the reduce-scatters) after the last; torchtitan leaves
    // reshard_after_forward False under PP. So, by hand, stage 0 (the embedding and layer 0,
    // 69,760 parameters; stage 1 holds layer 1, the final norm and the output, 69,824):
    // its bf16 weights whole (2 bytes each), its gradients unsharded in bf16 plus the fp32
    // shard they are reduce-scattered into (2 + 4 / 4 bytes), the optimizer sharded (12 / 4).
    let stage0 = LAYER + EMBEDDING;
    let stage1 = LAYER + 64 + 4_096;
    assert!(parsim::config::syncs_once_per_step(
        &resolve(pipelined("fsdp")).config
    ));
    assert!(!parsim::config::syncs_once_per_step(
        &resolve(pipelined("megatron-core")).config
    ));
    let e = est(pipelined("fsdp"));
    for (s, n) in [(&e.memory.stages[0], stage0), (&e.memory.stages[1], stage1)] {
        assert_eq!(s.weights, n * 2);
        assert_eq!(s.gradients, n * 2 + n.div_ceil(4) * 4);
        assert_eq!(s.optimizer, n.div_ceil(4) * 12);
    }
    // Megatron-LM's torch FSDP2 keeps per-microbatch ZeRO-3: the shards alone.
    let m = est(pipelined("megatron-core"));
    let s = &m.memory.stages[0];
    assert_eq!(
        (s.weights, s.gradients),
        (stage0.div_ceil(4) * 2, stage0.div_ceil(4) * 4)
    );

    // Traffic per step on the data-parallel group of the most loaded rank: one all-gather of
    // the bf16 weights and one reduce-scatter of the fp32 gradients, each (n-1)/n of its
    // buffer on the wire, against ZeRO-3's 2m gathers and m reduce-scatters (m = 4).
    let wire =
        |n: u64, gathers: u64, reduces: u64| (3 * (gathers * n * 2 + reduces * n * 4)).div_ceil(4);
    let dp_bytes = |e: &Estimate| e.communication.per_step_bytes_per_gpu[CommKind::Dp];
    let once = dp_bytes(&e);
    assert!(
        [wire(stage0, 1, 1), wire(stage1, 1, 1)].contains(&once),
        "{once}"
    );
    let every = dp_bytes(&m);
    assert!(
        [wire(stage0, 8, 4), wire(stage1, 8, 4)].contains(&every),
        "{every}"
    );

    // The tail: the critical rank's reduce-scatters, one per FSDP unit, none overlapped (no
    // compute of that rank is left): on stage 0 the layer's and the root module's (the
    // embedding), on stage 1 the layer's and the root's (final norm and output layer).
    let r = resolve(pipelined("fsdp"));
    let net = Network::new(&Layout::of(&r), &r.gpu);
    let rs =
        |params: u64| net.collective_s(GroupKind::Dp, CollectiveKind::ReduceScatter, params * 4, 4);
    let tails = [rs(LAYER) + rs(EMBEDDING), rs(LAYER) + rs(64 + 4_096)];
    let tail = e.time.dp_tail_s;
    assert!(
        tails.iter().any(|t| (t - tail).abs() <= 1e-12 * t),
        "{tail} against {tails:?}"
    );
    // Under Megatron-LM the reductions run in each backward, overlapped: a smaller tail.
    assert!(m.time.dp_tail_s < tail, "{} {tail}", m.time.dp_tail_s);
}
