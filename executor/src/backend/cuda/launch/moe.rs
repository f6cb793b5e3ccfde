//! Launches of kernels/moe.cu: router softmax and top-k, token permutation and its inverse,
//! and the backward of the combine and of the router (CPU twin: cpu/ops/moe.rs). Row indices
//! are u32 on the device.

use super::*;

/// Row-wise softmax of x [n, e] in place.
///
/// # Safety
/// `x`: n*e f32.
pub unsafe fn softmax_rows(
    s: &CudaStream,
    k: &Kernels,
    x: CUdeviceptr,
    n: usize,
    e: usize,
) -> Result<(), CudaError> {
    let kn = "moe_softmax_rows_f32";
    let Some(cfg) = grid_stride(u(n)) else {
        return Ok(());
    };
    launch!(kn, s, k, cfg; x, u(n), u32_arg(kn, "e", e)?)
}

/// experts [n, topk] (u32) and gates [n, topk] (f32): each row's top-k, lower expert first on
/// ties.
///
/// # Safety
/// `probs`: n*e f32; `experts`: n*topk u32; `gates`: n*topk f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn topk(
    s: &CudaStream,
    k: &Kernels,
    probs: CUdeviceptr,
    n: usize,
    e: usize,
    topk: usize,
    experts: CUdeviceptr,
    gates: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = "moe_topk_f32";
    if topk == 0 || topk > e {
        return Err(shape_error(
            kn,
            format!("top_k = {topk} must be in 1..=experts ({e})"),
        ));
    }
    let Some(cfg) = grid_stride(u(n)) else {
        return Ok(());
    };
    launch!(kn, s, k, cfg; probs, u(n), u32_arg(kn, "e", e)?, u32_arg(kn, "top_k", topk)?, experts, gates)
}

/// out[i] = src[rows[i]] for m rows of h.
///
/// # Safety
/// `src`: rows of h of `dtype` covering every index in `rows` (m u32); `out`: m*h.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gather_rows(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    src: CUdeviceptr,
    rows: CUdeviceptr,
    m: usize,
    h: usize,
    out: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = name("gather_rows", dtype);
    let Some(cfg) = grid_stride(u(m) * u(h)) else {
        return Ok(());
    };
    launch!(&kn, s, k, cfg; src, rows, u(m), u(h), out)
}

/// out[rows[i]] += w_i src[i] (out f32; `weights` 0 for none).
///
/// # Safety
/// `src`: m*h of `dtype`; `rows`: m u32; `weights`: 0 or m f32; `out` covers every row index.
#[allow(clippy::too_many_arguments)]
pub unsafe fn scatter_add_rows(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    src: CUdeviceptr,
    rows: CUdeviceptr,
    weights: CUdeviceptr,
    m: usize,
    h: usize,
    out: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = name("scatter_add_rows", dtype);
    let Some(cfg) = grid_stride(u(m) * u(h)) else {
        return Ok(());
    };
    launch!(&kn, s, k, cfg; src, rows, weights, u(m), u(h), out)
}

/// Backward of the combine over m routes (token, expert, gate as three device arrays).
///
/// # Safety
/// `dy`: tokens*h f32; `y`, `dsend`: m*h f32; `tokens`, `experts`: m u32; `gates`: m f32;
/// `dprobs`: tokens*e f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn combine_bwd(
    s: &CudaStream,
    k: &Kernels,
    dy: CUdeviceptr,
    y: CUdeviceptr,
    tokens: CUdeviceptr,
    experts: CUdeviceptr,
    gates: CUdeviceptr,
    m: usize,
    h: usize,
    e: usize,
    dprobs: CUdeviceptr,
    dsend: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = "moe_combine_bwd_f32";
    let Some(cfg) = per_row(kn, u(m))? else {
        return Ok(());
    };
    launch!(kn, s, k, cfg; dy, y, tokens, experts, gates, u(h), u32_arg(kn, "e", e)?, dprobs, dsend)
}

/// The router's backward in place on d [n, e] (`fraction`: e f32 slot fractions).
///
/// # Safety
/// `d`, `probs`: n*e f32; `fraction`: e f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn router_bwd(
    s: &CudaStream,
    k: &Kernels,
    d: CUdeviceptr,
    probs: CUdeviceptr,
    fraction: CUdeviceptr,
    n: usize,
    e: usize,
    aux_scale: f32,
) -> Result<(), CudaError> {
    let kn = "moe_router_bwd_f32";
    let Some(cfg) = grid_stride(u(n)) else {
        return Ok(());
    };
    let has_aux = i32::from(aux_scale != 0.0);
    launch!(kn, s, k, cfg; d, probs, fraction, u(n), u32_arg(kn, "e", e)?, aux_scale, has_aux)
}
