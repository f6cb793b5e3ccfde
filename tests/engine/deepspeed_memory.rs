//! DeepSpeed's own memory lines (`training.framework = "deepspeed"`): the optimizer step's flat
//! gradient copies and its checks' copies, ZeRO-1's release of the other partitions' gradients,
//! the vocabulary table's weight-gradient transient, the reduce bucket and the pipeline engine's
//! kept outputs, each worked out by hand from DeepSpeed's code (microsoft/DeepSpeed:
//! deepspeed/runtime/fp16/fused_optimizer.py, zero/stage_1_and_2.py, pipe/engine.py) and checked
//! against the same configuration under Megatron-Core, which has none of them.

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

/// The H100 profile's runtime lines (calibration/h100-sxm.toml, `[runtime_memory]`): the 400 MiB
/// context, Transformer Engine's 32 MiB cuBLAS workspace and the data-parallel group's NCCL
/// buffers (none on one GPU); part of every total.
fn runtime_bytes(m: &parsim::memory::StageMemory) -> u64 {
    assert_eq!((m.cuda_context, m.blas_workspace), (400 << 20, 32 << 20));
    m.cuda_context + m.blas_workspace + m.nccl_buffers.total()
}

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
    let resident = d.weights + d.gradients + d.optimizer + runtime_bytes(d);
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
    // Its backward also holds the vocabulary table's fresh gradient (512 x 256 in 2 bytes).
    let resident = d.weights + d.gradients + d.optimizer + runtime_bytes(d);
    assert!(d.total >= resident + d.reduce_bucket);
    assert!(d.total <= m.total + d.reduce_bucket + 2 * 512 * 256 && d.total > m.total);
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

#[test]
fn zero_one_steps_on_its_partition_once_the_other_gradients_are_released() {
    // Two replicas and a bucket of 1000 elements, so that the step is the rank's worst moment.
    let (ds, _) = both(
        json!({"zero": 1, "num_gpus": 2, "ddp_bucket_size": 1000}),
        json!({}),
    );
    let p = ds.params.trainable;
    let part = p.div_ceil(2);
    let d = &ds.memory.stages[0];
    // The largest gradient piece: the vocabulary table (512 x 256), within the partition. The
    // overflow check copies it to fp32, the norm to fp64, one after the other: 8 bytes each.
    assert!(512 * 256 < part);
    assert_eq!(d.grad_check_copies, 8 * 512 * 256);
    // `independent_gradient_partition_epilogue` keeps the partition's pieces and `zero_grad`
    // drops the rest (2 bytes each); the step then holds the partition's flat fp16 copy and its
    // fp32 cast (6 bytes an element), more than the checks' copies.
    let resident = d.weights + d.gradients + d.optimizer + runtime_bytes(d);
    assert_eq!(d.total, resident - 2 * (p - part) + 6 * part);
}

#[test]
fn the_vocabulary_tables_gradient_exists_twice_while_its_block_runs_backward() {
    // A 50,000-entry vocabulary: the table (50,000 x 256) is the largest tensor. AccumulateGrad
    // adds each microbatch's fresh gradient of it into `.grad`, in the gradients' dtype, while
    // the output layer runs backward: its phase becomes the worst, above Megatron-Core's (whose
    // gradient buffer takes it in place), and grows by 2 bytes an element from fp16 to fp32
    // gradients (nothing else in the buffers depends on the gradients' dtype here).
    let cfg = |framework: &str, grad: &str| {
        let mut c = model(framework, json!({}), json!({"grad_dtype": grad}));
        c["model"]["vocab_size"] = json!(50_000);
        c
    };
    let buffers = |framework: &str, grad: &str| est(cfg(framework, grad)).memory.stages[0].buffers;
    let (fp16, fp32) = (buffers("deepspeed", "fp16"), buffers("deepspeed", "fp32"));
    assert!(fp16 > buffers("megatron-core", "fp16"));
    assert_eq!(fp32 - fp16, 2 * 50_000 * 256);
}

/// BLOOM tr11's first sweep row (github.com/bigscience-workshop/bigscience,
/// train/tr11-176B-ml/chronicles-prequel.md, "48 node contenders"): a 181B GPT (hidden 14336,
/// 72 layers, 64 heads, vocabulary 250880) on 384 A100s, TP 8, PP 12, DP 4, micro batch 1,
/// ZeRO-1 in fp16 with fp16 gradients.
fn bloom_row(framework: &str) -> Value {
    json!({
        "model": {"num_layers": 72, "hidden_size": 14336, "num_attention_heads": 64,
                  "num_query_groups": 64, "ffn_hidden_size": 57344, "vocab_size": 250880,
                  "make_vocab_size_divisible_by": 128, "activation": "gelu",
                  "max_position_embeddings": 2048, "tied_embeddings": true},
        "cluster": {"gpu": "a100-80g", "num_gpus": 384, "gpus_per_node": 8},
        "parallel": {"tp": 8, "pp": 12, "dp": 4, "sp": false, "zero": 1, "schedule": "1f1b"},
        "training": {"framework": framework, "precision": "fp16", "grad_dtype": "fp16",
                     "recompute": "full", "flash_attention": false, "seq_length": 2048,
                     "micro_batch_size": 1, "global_batch_size": 2048}
    })
}

#[test]
fn a_bloom_row_holds_each_buffer_its_code_allocates() {
    let ds = est(bloom_row("deepspeed"));
    let first = &ds.memory.stages[0];
    // fp16 gradients beside fp16 weights: 2 bytes each.
    assert_eq!(first.gradients, first.weights);
    let part = (first.weights / 2).div_ceil(4);
    // The partition's flat fp16 copy and its fp32 cast.
    assert_eq!(first.step_grads, 6 * part);
    // The first stage's largest gradient: the vocabulary table's TP share, 250880 / 8 = 31360
    // rows of 14336, less than the partition; its fp64 norm copy, 8 bytes an element.
    let table = 31_360 * 14_336;
    assert!(table < part);
    assert_eq!(first.grad_check_copies, 8 * table);
    // A middle stage's largest: the first MLP projection's TP share, 4 x 14336 / 8 x 14336.
    assert_eq!(ds.memory.stages[5].grad_check_copies, 8 * 7_168 * 14_336);
    // The reduce bucket: 5e8 elements in 2 bytes (reduce_bucket_size's default).
    assert_eq!(first.reduce_bucket, 1_000_000_000);
    // The table's fresh gradient (2 bytes an element) in the first stage's backward phase,
    // beyond Megatron-Core's buffers.
    let mc = est(bloom_row("megatron-core"));
    assert_eq!(first.buffers - mc.memory.stages[0].buffers, 2 * table);
    // The reserve: at least the allocated peak, never beyond the device.
    assert!(first.reserved() >= first.total && first.reserved() <= ds.memory.capacity_bytes);
}
