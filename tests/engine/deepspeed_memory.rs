//! DeepSpeed's own memory lines (`training.framework = "deepspeed"`): the optimizer step's flat
//! gradient copies, the reduce bucket and the pipeline engine's kept outputs, each worked out by
//! hand from DeepSpeed's code (microsoft/DeepSpeed: deepspeed/runtime/fp16/fused_optimizer.py,
//! zero/stage_1_and_2.py, pipe/engine.py) and checked against the same configuration under
//! Megatron-Core, which has none of them.

use super::common::est;
use parsim::estimate::Estimate;
use serde_json::{json, Value};

/// A 2-layer dense model (hidden 256, 8 heads, GeLU 1024, vocabulary 512) in fp16, sequence 8:
/// its parameters (about 1.7M) outweigh its activations, so the optimizer step is the peak.
fn model(framework: &str, parallel: Value, training: Value) -> Value {
    let mut c = json!({
        "model": {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
                  "num_query_groups": 8, "ffn_hidden_size": 1024, "vocab_size": 512,
                  "make_vocab_size_divisible_by": 1, "activation": "gelu",
                  "max_position_embeddings": 8},
        "cluster": {"gpu": "h100-sxm", "num_gpus": 1},
        "parallel": {"tp": 1, "sp": false, "pp": 1, "zero": 0},
        "training": {"framework": framework, "precision": "fp16", "grad_dtype": "fp16",
                     "seq_length": 8, "micro_batch_size": 1, "global_batch_size": 4}
    });
    for (k, v) in parallel.as_object().unwrap() {
        c["parallel"][k] = v.clone();
    }
    for (k, v) in training.as_object().unwrap() {
        c["training"][k] = v.clone();
    }
    if let Some(n) = parallel.get("num_gpus") {
        c["cluster"]["num_gpus"] = n.clone();
        c["parallel"].as_object_mut().unwrap().remove("num_gpus");
    }
    c
}

/// The H100 profile's runtime reserve (calibration/h100-sxm.toml), part of every total.
const RUNTIME_BYTES: u64 = 1 << 30;

fn both(parallel: Value, training: Value) -> (Estimate, Estimate) {
    (
        est(model("deepspeed", parallel.clone(), training.clone())),
        est(model("megatron-core", parallel, training)),
    )
}

#[test]
fn without_zero_the_step_holds_fp32_casts_and_their_flat_copy() {
    let (ds, mc) = both(json!({}), json!({}));
    let p = ds.params.trainable;
    let (d, m) = (&ds.memory.stages[0], &mc.memory.stages[0]);
    // FP16_Optimizer.step: every fp16 gradient cast to fp32 (4 bytes each) and the list
    // flattened into one fp32 buffer (4 more), both live at once.
    assert_eq!(d.step_grads, 8 * p);
    // One replica: no all-reduce bucket.
    assert_eq!(d.reduce_bucket, 0);
    // The model's own tensors are the framework's too.
    assert_eq!(
        (d.weights, d.gradients, d.optimizer, d.activations),
        (m.weights, m.gradients, m.optimizer, m.activations)
    );
    // fp16 weights and gradients (2 + 2 bytes), fp32 master and Adam's two moments (12).
    assert_eq!(d.weights + d.gradients + d.optimizer, 16 * p);
    // The peak is the step: the resident tensors and the runtime reserve plus the copies,
    // above Megatron-Core's worst moment of the walk.
    let resident = d.weights + d.gradients + d.optimizer + RUNTIME_BYTES;
    assert!(resident + 8 * p > m.total, "the step is the peak here");
    assert_eq!(d.total, resident + 8 * p);
    // fp32 gradients need no cast: only the flat copy.
    let (fp32, _) = both(json!({}), json!({"grad_dtype": "fp32"}));
    assert_eq!(fp32.memory.stages[0].step_grads, 4 * p);
}

#[test]
fn zero_one_reduces_through_a_bucket_and_casts_only_its_partition() {
    let (ds, mc) = both(json!({"zero": 1, "num_gpus": 2}), json!({}));
    let p = ds.params.trainable;
    let (d, m) = (&ds.memory.stages[0], &mc.memory.stages[0]);
    // stage_1_and_2.py: the partition's gradients flattened (2 bytes) and cast to fp32 (4),
    // the partition being half the parameters (rounded up) over two replicas.
    assert_eq!(d.step_grads, p.div_ceil(2) * 6);
    // The contiguous `ipg_buffer`: reduce_bucket_size, 5e8 elements by default
    // (www.deepspeed.ai/docs/config-json/), in the parameters' 2 bytes.
    assert_eq!(d.reduce_bucket, 1_000_000_000);
    // Without a pipeline the backward hooks fill it, so it is live with a backward moment of
    // the walk (Megatron-Core's bucket is a view of its grad buffer): the peak holds the
    // resident tensors and the bucket, and at most Megatron-Core's worst moment plus the bucket.
    let resident = d.weights + d.gradients + d.optimizer + RUNTIME_BYTES;
    assert!(d.total >= resident + d.reduce_bucket);
    assert!(d.total <= m.total + d.reduce_bucket && d.total > m.total);
    // The bucket follows `parallel.ddp_bucket_size` (DeepSpeed's `reduce_bucket_size`).
    let (small, _) = both(
        json!({"zero": 1, "num_gpus": 2, "ddp_bucket_size": 1000}),
        json!({}),
    );
    assert_eq!(small.memory.stages[0].reduce_bucket, 2000);
}

#[test]
fn the_pipeline_engine_keeps_each_in_flight_output_until_its_backward() {
    // Two stages of one layer, tp 1, eight microbatches: 1F1B holds two microbatches on the
    // first stage and one on the last (Narayanan et al. 2021).
    let par = json!({"pp": 2, "num_gpus": 2});
    let tr = json!({"global_batch_size": 8});
    let (ds, mc) = both(par, tr);
    // A stage output is the residual stream: sequence 8 x batch 1 x hidden 256 x 2 bytes.
    let residual = 8 * 256 * 2;
    // PipelineEngine._exec_forward_pass keeps `outputs` until _exec_backward_pass; under tp 1 a
    // later stage also keeps its received input beside the clone its first layer runs on.
    assert_eq!(
        ds.memory.stages[0].activations - mc.memory.stages[0].activations,
        2 * residual
    );
    assert_eq!(
        ds.memory.stages[1].activations - mc.memory.stages[1].activations,
        residual
    );
}
