//! Launches of backend/cuda/ops/norm/norm.cu: RMSNorm / LayerNorm forward, input and parameter
//! gradients (CPU twin: cpu/ops/norm.rs). `layer_norm` picks LayerNorm (params = gamma ++ beta,
//! f32).

use crate::backend::cuda::ops::launch::*;
use parsim_plan::DType;

/// Rows per block of the parameter-gradient kernel (NORM_WGRAD_ROWS in norm.cu).
pub const WGRAD_ROWS: usize = 32;

/// Geometry of the parameter-gradient kernel: one block per 32 rows.
pub fn wgrad_geometry(rows: usize) -> Result<Option<LaunchConfig>, CudaError> {
    per_row("norm_wgrad", u(rows.div_ceil(WGRAD_ROWS)))
}

/// y = norm(x) * gamma (+ beta), x and y [rows, h] of `dtype`.
///
/// # Safety
/// `x`, `y`: rows*h elements of `dtype`; `params`: h (RMSNorm) or 2h (LayerNorm) f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn norm_fwd(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    layer_norm: bool,
    x: CUdeviceptr,
    params: CUdeviceptr,
    y: CUdeviceptr,
    rows: usize,
    h: usize,
    eps: f32,
) -> Result<(), CudaError> {
    let kn = name("norm_fwd", dtype);
    let Some(cfg) = per_row(&kn, u(rows))? else {
        return Ok(());
    };
    let (h, layer) = (u32_arg(&kn, "h", h)?, i32::from(layer_norm));
    launch!(&kn, s, k, cfg; x, params, y, h, eps, layer)
}

/// dx = (or += with `accumulate`) the input gradient of the norm from dy.
///
/// # Safety
/// `x`, `dy`, `dx`: rows*h elements of `dtype`; `params` as [`norm_fwd`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn norm_dgrad(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    layer_norm: bool,
    x: CUdeviceptr,
    params: CUdeviceptr,
    dy: CUdeviceptr,
    dx: CUdeviceptr,
    rows: usize,
    h: usize,
    eps: f32,
    accumulate: bool,
) -> Result<(), CudaError> {
    let kn = name("norm_dgrad", dtype);
    let Some(cfg) = per_row(&kn, u(rows))? else {
        return Ok(());
    };
    let (h, layer, acc) = (
        u32_arg(&kn, "h", h)?,
        i32::from(layer_norm),
        i32::from(accumulate),
    );
    launch!(&kn, s, k, cfg; x, params, dy, dx, h, eps, layer, acc)
}

/// dparams += the parameter gradient (f32, h or 2h) over the rows.
///
/// # Safety
/// `x`, `dy`: rows*h elements of `dtype`; `dparams`: h or 2h f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn norm_wgrad(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    layer_norm: bool,
    x: CUdeviceptr,
    dy: CUdeviceptr,
    dparams: CUdeviceptr,
    rows: usize,
    h: usize,
    eps: f32,
) -> Result<(), CudaError> {
    let kn = name("norm_wgrad", dtype);
    let Some(cfg) = wgrad_geometry(rows)? else {
        return Ok(());
    };
    let (rows, h, layer) = (u(rows), u32_arg(&kn, "h", h)?, i32::from(layer_norm));
    launch!(&kn, s, k, cfg; x, dy, dparams, rows, h, eps, layer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wgrad_takes_one_block_per_32_rows_rounding_up() {
        assert!(wgrad_geometry(0).unwrap().is_none());
        assert_eq!(wgrad_geometry(1).unwrap().unwrap().grid_dim.0, 1);
        assert_eq!(wgrad_geometry(32).unwrap().unwrap().grid_dim.0, 1);
        assert_eq!(wgrad_geometry(33).unwrap().unwrap().grid_dim.0, 2);
        assert_eq!(
            wgrad_geometry(1 << 30).unwrap().unwrap().grid_dim.0,
            1 << 25
        );
    }
}
