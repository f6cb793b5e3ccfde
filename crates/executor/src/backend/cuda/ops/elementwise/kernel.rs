//! Launches of backend/cuda/ops/elementwise/elementwise.cu: casts, add, axpy (the single-GPU
//! collectives' sum) and fill.

use crate::backend::cuda::ops::launch::*;
use parsim_plan::DType;

/// f32 `x` -> bf16 `y` (round to nearest even), `n` elements.
///
/// # Safety
/// `x` and `y` must be device buffers of at least `n` elements of their types, alive and not
/// written by other work until the stream reaches this launch's end.
pub unsafe fn cast_f32_to_bf16(
    s: &CudaStream,
    k: &Kernels,
    x: CUdeviceptr,
    y: CUdeviceptr,
    n: usize,
) -> Result<(), CudaError> {
    // SAFETY: forwarded from this function's own contract.
    unsafe { cast("cast_f32_to_bf16", s, k, x, y, n) }
}

/// bf16 `x` -> f32 `y`, `n` elements.
///
/// # Safety
/// As [`cast_f32_to_bf16`].
pub unsafe fn cast_bf16_to_f32(
    s: &CudaStream,
    k: &Kernels,
    x: CUdeviceptr,
    y: CUdeviceptr,
    n: usize,
) -> Result<(), CudaError> {
    // SAFETY: forwarded from this function's own contract.
    unsafe { cast("cast_bf16_to_f32", s, k, x, y, n) }
}

unsafe fn cast(
    kn: &str,
    s: &CudaStream,
    k: &Kernels,
    x: CUdeviceptr,
    y: CUdeviceptr,
    n: usize,
) -> Result<(), CudaError> {
    let n = u(n);
    launch!(kn, s, k, maybe grid_stride(n); x, y, n)
}

/// out = a + b, `n` elements of `dtype` (out may alias a or b).
///
/// # Safety
/// `a`, `b`, `out` must be device buffers of at least `n` elements of `dtype`.
pub unsafe fn add(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    a: CUdeviceptr,
    b_: CUdeviceptr,
    out: CUdeviceptr,
    n: usize,
) -> Result<(), CudaError> {
    let kn = name("add", dtype);
    let n = u(n);
    launch!(&kn, s, k, maybe grid_stride(n); a, b_, out, n)
}

/// y += alpha x, `n` elements of `dtype`.
///
/// # Safety
/// `x` and `y` must be device buffers of at least `n` elements of `dtype`.
pub unsafe fn axpy(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    alpha: f32,
    x: CUdeviceptr,
    y: CUdeviceptr,
    n: usize,
) -> Result<(), CudaError> {
    let kn = name("axpy", dtype);
    let n = u(n);
    launch!(&kn, s, k, maybe grid_stride(n); alpha, x, y, n)
}

/// x[..n] = value.
///
/// # Safety
/// `x` must be a device buffer of at least `n` elements of `dtype`.
pub unsafe fn fill(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    x: CUdeviceptr,
    value: f32,
    n: usize,
) -> Result<(), CudaError> {
    let kn = name("fill", dtype);
    let n = u(n);
    launch!(&kn, s, k, maybe grid_stride(n); x, value, n)
}
