//! Launches of backend/cuda/ops/cross_entropy/cross_entropy.cu: vocab-parallel cross-entropy in
//! pieces (CPU twin: cpu/ops/cross_entropy.rs); logits [n, v] (f32, or bf16 read in place: `dt`) of
//! the shard starting at column `lo`; probabilities and row statistics f32.

use crate::backend::cuda::ops::launch::*;
use parsim_plan::DType;

/// max[r] = max of row r.
///
/// # Safety
/// `logits`: n*v f32; `max`: n f32.
pub unsafe fn ce_row_max(
    s: &CudaStream,
    k: &Kernels,
    dt: DType,
    logits: CUdeviceptr,
    n: usize,
    v: usize,
    max: CUdeviceptr,
) -> Result<(), CudaError> {
    let name = if dt == DType::Bf16 {
        "ce_row_max_bf16"
    } else {
        "ce_row_max_f32"
    };
    launch!(name, s, k, maybe per_row(name, u(n))?; logits, u(v), max)
}

/// probs = exp(logits - max), sum[r] = row sums.
///
/// # Safety
/// `logits`, `probs`: n*v f32; `max`, `sum`: n f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn ce_exp_rows(
    s: &CudaStream,
    k: &Kernels,
    dt: DType,
    logits: CUdeviceptr,
    n: usize,
    v: usize,
    max: CUdeviceptr,
    probs: CUdeviceptr,
    sum: CUdeviceptr,
) -> Result<(), CudaError> {
    let name = if dt == DType::Bf16 {
        "ce_exp_rows_bf16"
    } else {
        "ce_exp_rows_f32"
    };
    launch!(name, s, k, maybe per_row(name, u(n))?; logits, u(v), max, probs, sum)
}

/// out[r] = logits[r, targets[r] - lo] for targets in the shard, else 0.
///
/// # Safety
/// `logits`: n*v f32; `targets`: n u32; `out`: n f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn ce_target_logit(
    s: &CudaStream,
    k: &Kernels,
    dt: DType,
    logits: CUdeviceptr,
    n: usize,
    v: usize,
    targets: CUdeviceptr,
    lo: usize,
    out: CUdeviceptr,
) -> Result<(), CudaError> {
    let Some(cfg) = grid_stride(u(n)) else {
        return Ok(());
    };
    let name = if dt == DType::Bf16 {
        "ce_target_logit_bf16"
    } else {
        "ce_target_logit_f32"
    };
    launch!(name, s, k, cfg; logits, u(n), u(v), targets, u(lo), out)
}

/// probs /= sum (global row sums); row_loss[r] = log(sum) + max - target logit (the CPU's
/// `loss` returns the sum of row_loss).
///
/// # Safety
/// `probs`: n*v f32; `sum`, `max`, `target_logit`, `row_loss`: n f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn ce_loss(
    s: &CudaStream,
    k: &Kernels,
    probs: CUdeviceptr,
    n: usize,
    v: usize,
    sum: CUdeviceptr,
    max: CUdeviceptr,
    target_logit: CUdeviceptr,
    row_loss: CUdeviceptr,
) -> Result<(), CudaError> {
    launch!(
        "ce_loss_f32", s, k, maybe per_row("ce_loss_f32", u(n))?;
        probs, u(v), sum, max, target_logit, row_loss
    )
}

/// In place: probs = scale * (probs - onehot(target)).
///
/// # Safety
/// `probs`: n*v f32; `targets`: n u32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn ce_grad(
    s: &CudaStream,
    k: &Kernels,
    probs: CUdeviceptr,
    n: usize,
    v: usize,
    targets: CUdeviceptr,
    lo: usize,
    scale: f32,
) -> Result<(), CudaError> {
    launch!(
        "ce_grad_f32", s, k, maybe per_row("ce_grad_f32", u(n))?;
        probs, u(v), targets, u(lo), scale
    )
}
