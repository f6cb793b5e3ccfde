//! Launch of backend/cuda/ops/rotary/rotary.cu: positions-aware rotary embedding in place (CPU
//! twin: cpu/ops/rotary.rs); `inverse` is the backward.

use crate::backend::cuda::ops::launch::*;
use parsim_plan::DType;

/// Rotates x [rows, heads, d] in place; row r at position positions[r % npos].
///
/// # Safety
/// `x`: rows*heads*d elements of `dtype`; `positions`: npos u32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn rotary(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    x: CUdeviceptr,
    rows: usize,
    heads: usize,
    d: usize,
    positions: CUdeviceptr,
    npos: usize,
    theta: f32,
    inverse: bool,
) -> Result<(), CudaError> {
    let kn = name("rotary", dtype);
    if d % 2 != 0 {
        return Err(shape_error(&kn, format!("head dim d = {d} must be even")));
    }
    if npos == 0 && rows > 0 {
        return Err(shape_error(&kn, "positions must not be empty"));
    }
    let Some(cfg) = grid_stride(u(rows) * u(heads) * u(d / 2)) else {
        return Ok(());
    };
    let (rows, heads, d, npos, inv) = (
        u(rows),
        u32_arg(&kn, "heads", heads)?,
        u32_arg(&kn, "d", d)?,
        u(npos),
        i32::from(inverse),
    );
    launch!(&kn, s, k, cfg; x, rows, heads, d, positions, npos, theta, inv)
}
