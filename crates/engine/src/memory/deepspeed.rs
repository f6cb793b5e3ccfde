//! DeepSpeed's own buffers beside the model's tensors (`training.framework = "deepspeed"`), read
//! from its code (microsoft/DeepSpeed, commit 38327e07):
//! - the gradient reduce bucket: ZeRO-1/2's contiguous `ipg_buffer` of `reduce_bucket_size`
//!   elements in the parameters' dtype (`DeepSpeedZeroOptimizer.reduce_gradients` and
//!   `.backward`, deepspeed/runtime/zero/stage_1_and_2.py; two of them under `overlap_comm` at
//!   ZeRO-2), and without ZeRO the engine's flattened all-reduce bucket
//!   (`DeepSpeedEngine.allreduce_bucket`, deepspeed/runtime/engine.py: `self.flatten(bucket)` of
//!   at most `reduce_bucket_size` gradient elements);
//! - the optimizer step's flat gradient copies: without ZeRO, `FP16_Optimizer.step`
//!   (deepspeed/runtime/fp16/fused_optimizer.py) casts every gradient to fp32 (`p.grad.to(fp32)`)
//!   and flattens the list into one fp32 buffer, both live at once; with ZeRO-1/2, `step`
//!   flattens the partition's gradients (`self.flatten(self.averaged_gradients[i])`, a copy in
//!   the gradients' dtype) and casts that to fp32 (`.to(single_partition_of_fp32_groups.dtype)`,
//!   no copy when they are fp32 already);
//! - the pipeline engine's stage outputs, kept from forward to backward for
//!   `torch.autograd.backward(outputs, grad)` (`PipelineEngine._exec_forward_pass` stores
//!   `pipe_buffers['outputs'][buffer_id]`, `_exec_backward_pass` frees it; deepspeed/runtime/
//!   pipe/engine.py): the whole output under tp = 1, its 1/tp partition otherwise
//!   (`pipe_partitioned`, on by default, clears the full output's data); under tp = 1 a stage
//!   after the first also keeps the received input beside the clone its first layer runs on.
//!
//! ZeRO-3 (deepspeed/runtime/zero/stage3.py) gathers, prefetches and buckets through the
//! generic ZeRO-3 model (src/estimate/dp_calls.rs); none of these lines apply to it.

use crate::config::{Framework, Resolved};
use crate::model::ParamSums;

/// DeepSpeed's buffers of one rank, in bytes (zero under another framework).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeepspeedBuffers {
    /// The gradient reduce bucket(s).
    pub reduce_bucket: u64,
    /// Whether the bucket lives during the backward (ZeRO-1/2 without a pipeline: its backward
    /// hooks fill it) rather than after it (the pipeline engine reduces once the last
    /// microbatch's backward is done; without ZeRO the engine reduces after the backward).
    pub bucket_in_backward: bool,
    /// The optimizer step's flat gradient copies, live only during the step.
    pub step_grads: u64,
    /// The largest single allocation of the step (one flat buffer), for the allocator: a
    /// request larger than every cached block takes a new segment.
    pub step_largest: u64,
    /// Bytes each in-flight microbatch keeps beside its layers' saved set on a stage that is
    /// not the last (its output) or not the first (its received input, under tp = 1).
    pub kept_output: u64,
    /// The same for a stage's received input (not the first stage, tp = 1 only).
    pub kept_input: u64,
}

/// DeepSpeed's buffers of a rank with parameters `p` under `r` (all zero unless
/// `training.framework = "deepspeed"` at ZeRO 0-2).
pub fn buffers(r: &Resolved, p: &ParamSums, residual_bytes: u64) -> DeepspeedBuffers {
    let cfg = &r.config;
    let par = &cfg.parallel;
    if cfg.training.framework != Framework::Deepspeed || par.zero >= 3 {
        return DeepspeedBuffers::default();
    }
    let w = cfg.training.weight_bytes();
    let g = cfg.training.grad_dtype.bytes();
    let trainable = p.rank_dense_trainable + p.rank_expert_trainable;
    let bucket_elements = par
        .ddp_bucket_size
        .unwrap_or(crate::config::DEEPSPEED_REDUCE_BUCKET);
    let replicated = r.dense_replicas() > 1 || r.expert_dp() > 1;
    let engine_bucket = if replicated {
        bucket_elements.min(trainable) * g
    } else {
        0
    };
    // bf16 weights with fp32 gradients at ZeRO 0-1 run BF16_Optimizer
    // (`DeepSpeedEngine._do_optimizer_sanity_check`, deepspeed/runtime/engine.py): it
    // accumulates into its flat fp32 gradients (`fp32_groups_gradients_flat`,
    // deepspeed/runtime/bf16_optimizer.py), the gradients line, and steps on them in place.
    let bf16_optimizer =
        cfg.training.precision == crate::config::Precision::Bf16 && g == 4 && par.zero <= 1;
    let (reduce_bucket, step_grads, step_largest) = if bf16_optimizer {
        (engine_bucket, 0, 0)
    } else if par.zero == 0 {
        // FP16_Optimizer.step: each gradient cast to fp32 (none when already fp32), then their
        // flat fp32 copy; the engine's all-reduce flattens up to a bucket of gradients.
        let cast = if g == 4 { 0 } else { trainable * 4 };
        (engine_bucket, cast + trainable * 4, trainable * 4)
    } else {
        // The partition's flat copy in the gradients' dtype, then its fp32 cast (none when the
        // gradients are fp32 already: `.to` returns the copy itself).
        let partition = p.rank_dense_trainable.div_ceil(r.dense_replicas() as u64)
            + p.rank_expert_trainable.div_ceil(r.expert_dp() as u64);
        let cast = if g == 4 { 0 } else { 4 };
        let buffers = if par.zero == 2 && par.overlap_grad_reduce {
            2
        } else {
            1
        };
        (
            buffers * bucket_elements * w,
            partition * (g + cast),
            partition * g.max(cast),
        )
    };
    let pipelined = par.pp > 1;
    let (kept_output, kept_input) = if pipelined {
        if par.tp > 1 {
            (residual_bytes.div_ceil(par.tp as u64), 0)
        } else {
            (residual_bytes, residual_bytes)
        }
    } else {
        (0, 0)
    };
    DeepspeedBuffers {
        reduce_bucket,
        bucket_in_backward: par.zero >= 1 && !pipelined,
        step_grads,
        step_largest,
        kept_output,
        kept_input,
    }
}
