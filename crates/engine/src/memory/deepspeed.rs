//! DeepSpeed's own buffers beside the model's tensors (`training.framework = "deepspeed"`), read
//! from its code (microsoft/DeepSpeed, commit 38327e07; the ZeRO-1/2 step as of 8eef742f,
//! February 2022, which BigScience's BLOOM sweeps ran):
//! - the gradient reduce bucket: ZeRO-1/2's contiguous `ipg_buffer` of `reduce_bucket_size`
//!   elements in the parameters' dtype (`DeepSpeedZeroOptimizer.reduce_gradients` and
//!   `.backward`, deepspeed/runtime/zero/stage_1_and_2.py; two of them under `overlap_comm` at
//!   ZeRO-2; where `contiguous_gradients` is off, `allreduce_bucket`'s `self.flatten(bucket)` of
//!   at most as many elements), and without ZeRO the engine's flattened all-reduce bucket
//!   (`DeepSpeedEngine.allreduce_bucket`, deepspeed/runtime/engine.py: `self.flatten(bucket)` of
//!   at most `reduce_bucket_size` gradient elements);
//! - the optimizer step's flat gradient copies: without ZeRO, `FP16_Optimizer.step`
//!   (deepspeed/runtime/fp16/fused_optimizer.py) casts every gradient to fp32 (`p.grad.to(fp32)`)
//!   and flattens the list into one fp32 buffer, both live at once; with ZeRO-1/2, `step`
//!   flattens the partition's gradients (`self.flatten(self.averaged_gradients[i])`, a copy in
//!   the gradients' dtype) and casts that to fp32 (`.to(single_partition_of_fp32_groups.dtype)`,
//!   no copy when they are fp32 already);
//! - ZeRO-1's release of the other partitions' gradients before the step:
//!   `independent_gradient_partition_epilogue` keeps the partition's pieces as views
//!   (`averaged_gradients`, `get_flat_partition(..., return_tensor_list=True)`) and then
//!   `zero_grad()` drops every `.grad`, so the step holds the partition's gradients only;
//! - the step's checks of each gradient piece of the partition, one piece at a time, before its
//!   flat copies: the overflow check's fp32 copy (`_has_inf_or_nan`: `x.float().sum()`) and the
//!   norm's fp64 copy (`get_grad_norm_direct`: `g.data.double().norm(2)`), the largest being the
//!   rank's largest gradient tensor cut to its partition;
//! - the word embedding's (and the output layer's) fresh weight gradient in backward: PyTorch's
//!   `AccumulateGrad` adds each microbatch's newly allocated gradient into `.grad` (the engine
//!   has no fused gradient buffer), so the vocabulary table's gradient, the largest tensor,
//!   exists twice while its block runs backward;
//! - the pipeline engine's stage outputs, kept from forward to backward for
//!   `torch.autograd.backward(outputs, grad)` (`PipelineEngine._exec_forward_pass` stores
//!   `pipe_buffers['outputs'][buffer_id]`, `_exec_backward_pass` frees it; deepspeed/runtime/
//!   pipe/engine.py): the whole output under tp = 1, its 1/tp partition otherwise
//!   (`pipe_partitioned`, on by default, clears the full output's data); under tp = 1 a stage
//!   after the first also keeps the received input beside the clone its first layer runs on.
//!
//! ZeRO-3 (deepspeed/runtime/zero/stage3.py) gathers, prefetches and buckets through the
//! generic ZeRO-3 model (src/estimate/dp_calls.rs); none of these lines apply to it.

use super::allocator::StepAlloc;
use crate::config::{Framework, Resolved};
use crate::model::{fc1_width, ChunkContents, Dims, ParamSums};

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
    /// The step's fp32 overflow-check and fp64 norm copies of its largest gradient piece (the
    /// larger of the two: they come one after the other), live only during the step.
    pub grad_check_copies: u64,
    /// Gradient bytes released before the step (ZeRO-1: every piece outside the partition).
    pub step_freed: u64,
    /// The most bytes live after the backward beyond the rank's resident tensors: the reduce
    /// bucket after the backward, or the step's copies less what it released.
    pub after_backward: u64,
    /// What the reduce and the step allocate, in order, for the allocator.
    pub step_allocs: [StepAlloc; 5],
    /// The vocabulary table's fresh weight gradient while the embedding or the output layer
    /// runs backward (`AccumulateGrad`), on a rank that holds them.
    pub table_wgrad: u64,
    /// Bytes each in-flight microbatch keeps beside its layers' saved set on a stage that is
    /// not the last (its output) or not the first (its received input, under tp = 1).
    pub kept_output: u64,
    /// The same for a stage's received input (not the first stage, tp = 1 only).
    pub kept_input: u64,
}

/// What [`buffers`] reads of a rank beyond its configuration and parameters.
#[derive(Debug, Clone, Copy, Default)]
pub struct RankTensors {
    /// The residual stream's bytes (a stage output).
    pub residual_bytes: u64,
    /// Elements of the rank's largest weight: the vocabulary table's rank share where it holds
    /// the embedding or the output layer, else a layer's first MLP projection.
    pub largest_weight: u64,
    /// Whether the rank holds the embedding or the output layer (the vocabulary table).
    pub holds_table: bool,
}

impl RankTensors {
    /// The tensors of a rank holding `chunks` under `r`, with the ledger's dimensions `d`.
    pub fn of(r: &Resolved, d: &Dims, chunks: &[ChunkContents]) -> RankTensors {
        let holds_table = chunks.iter().any(|c| c.embedding || c.output);
        let m = &r.config.model;
        RankTensors {
            residual_bytes: d.residual_bytes(),
            largest_weight: if holds_table {
                d.vocab_rank() * d.h
            } else {
                fc1_width(m.activation, m.ffn_hidden_size) * d.h / d.t
            },
            holds_table,
        }
    }
}

/// DeepSpeed's buffers of a rank with parameters `p` under `r` (all zero unless
/// `training.framework = "deepspeed"` at ZeRO 0-2).
pub fn buffers(r: &Resolved, p: &ParamSums, t: RankTensors) -> DeepspeedBuffers {
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
    let kept = |bytes: u64| StepAlloc { bytes, kept: true };
    let passing = |bytes: u64| StepAlloc { bytes, kept: false };
    // bf16 weights with fp32 gradients at ZeRO 0-1 run BF16_Optimizer
    // (`DeepSpeedEngine._do_optimizer_sanity_check`, deepspeed/runtime/engine.py): it
    // accumulates into its flat fp32 gradients (`fp32_groups_gradients_flat`,
    // deepspeed/runtime/bf16_optimizer.py), the gradients line, and steps on them in place.
    let bf16_optimizer =
        cfg.training.precision == crate::config::Precision::Bf16 && g == 4 && par.zero <= 1;
    let mut b = DeepspeedBuffers::default();
    if bf16_optimizer {
        b.reduce_bucket = engine_bucket;
        b.step_allocs[0] = passing(engine_bucket);
    } else if par.zero == 0 {
        // FP16_Optimizer.step: each gradient cast to fp32 (none when already fp32), then their
        // flat fp32 copy; the engine's all-reduce flattens up to a bucket of gradients.
        let cast = if g == 4 { 0 } else { trainable * 4 };
        b.reduce_bucket = engine_bucket;
        b.step_grads = cast + trainable * 4;
        b.step_allocs = [
            passing(engine_bucket),
            kept(cast),
            kept(trainable * 4),
            StepAlloc::default(),
            StepAlloc::default(),
        ];
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
        // A gradient piece is at most the largest tensor, and at most the partition.
        let piece = t.largest_weight.min(partition);
        b.reduce_bucket = buffers * bucket_elements * w;
        b.step_grads = partition * (g + cast);
        b.grad_check_copies = piece * 8;
        b.step_freed = if par.zero == 1 {
            (trainable - partition.min(trainable)) * g
        } else {
            0
        };
        b.step_allocs = [
            passing(b.reduce_bucket),
            passing(piece * 4),
            passing(piece * 8),
            kept(partition * g),
            kept(partition * cast),
        ];
    }
    let pipelined = par.pp > 1;
    b.bucket_in_backward = par.zero >= 1 && !pipelined;
    if b.bucket_in_backward {
        // Allocated in the backward, where the walk counts it: not one of the step's.
        b.step_allocs[0] = StepAlloc::default();
    }
    let bucket_after = if b.bucket_in_backward {
        0
    } else {
        b.reduce_bucket
    };
    b.after_backward = bucket_after.max(
        b.step_grads
            .max(b.grad_check_copies)
            .saturating_sub(b.step_freed),
    );
    if t.holds_table {
        b.table_wgrad = t.largest_weight * g;
    }
    (b.kept_output, b.kept_input) = if pipelined {
        if par.tp > 1 {
            (t.residual_bytes.div_ceil(par.tp as u64), 0)
        } else {
            (t.residual_bytes, t.residual_bytes)
        }
    } else {
        (0, 0)
    };
    b
}
