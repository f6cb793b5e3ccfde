//! Launches of backend/cuda/ops/embedding/embedding.cu: gather and scatter-add over a vocabulary
//! shard starting at token `lo` (CPU twin: cpu/ops/embedding.rs embedding_gather /
//! embedding_scatter_add).

use crate::backend::cuda::ops::launch::*;
use parsim_plan::DType;

/// out[r] = table[tokens[r] - lo] for tokens in the shard's `table_rows` rows.
///
/// # Safety
/// `table`: table_rows*h of `dtype`; `tokens`: n u32; `out`: n*h of `dtype`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn embedding_gather(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    table: CUdeviceptr,
    table_rows: usize,
    tokens: CUdeviceptr,
    n: usize,
    lo: usize,
    h: usize,
    out: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = name("embedding_gather", dtype);
    let (tr, n, lo, h) = (u(table_rows), u(n), u(lo), u(h));
    launch!(&kn, s, k, maybe grid_stride(n * h); table, tr, tokens, n, lo, h, out)
}

/// grad[tokens[r] - lo] += dy[r] (grad f32 [grad_rows, h]; dy of `dtype`).
///
/// # Safety
/// `dy`: n*h of `dtype`; `tokens`: n u32; `grad`: grad_rows*h f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn embedding_scatter_add(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    dy: CUdeviceptr,
    tokens: CUdeviceptr,
    n: usize,
    lo: usize,
    h: usize,
    grad: CUdeviceptr,
    grad_rows: usize,
) -> Result<(), CudaError> {
    let kn = name("embedding_scatter_add", dtype);
    let (n, lo, h, gr) = (u(n), u(lo), u(h), u(grad_rows));
    launch!(&kn, s, k, maybe grid_stride(n * h); dy, tokens, n, lo, h, grad, gr)
}
