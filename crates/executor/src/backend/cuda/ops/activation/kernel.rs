//! Launches of backend/cuda/ops/activation/activation.cu: SwiGLU and GeLU forward and backward (CPU
//! twin: cpu/ops/activation.rs). The backward may run in place (`du == u`).

use crate::backend::cuda::ops::launch::*;
use parsim_plan::plan::Activation;
use parsim_plan::DType;

fn stem(kind: Activation, fwd: bool) -> &'static str {
    match (kind, fwd) {
        (Activation::Swiglu, true) => "swiglu_fwd",
        (Activation::Swiglu, false) => "swiglu_bwd",
        (Activation::Gelu, true) => "gelu_fwd",
        (Activation::Gelu, false) => "gelu_bwd",
    }
}

/// out [n, f] = act(u) (u is [n, 2f] for SwiGLU, [n, f] for GeLU).
///
/// # Safety
/// `u` and `out` must hold the sizes above in `dtype`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn act_fwd(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    kind: Activation,
    u_: CUdeviceptr,
    out: CUdeviceptr,
    n: usize,
    f: usize,
) -> Result<(), CudaError> {
    let kn = name(stem(kind, true), dtype);
    let Some(cfg) = grid_stride(u(n) * u(f)) else {
        return Ok(());
    };
    let (n, f, total) = (u(n), u(f), u(n) * u(f));
    match kind {
        Activation::Swiglu => launch!(&kn, s, k, cfg; u_, out, n, f),
        Activation::Gelu => launch!(&kn, s, k, cfg; u_, out, total),
    }
}

/// du = the input gradient from dout [n, f]; `du` may equal `u`.
///
/// # Safety
/// `u`, `du` as `u` of [`act_fwd`], `dout` [n, f], all `dtype`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn act_bwd(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    kind: Activation,
    u_: CUdeviceptr,
    dout: CUdeviceptr,
    du: CUdeviceptr,
    n: usize,
    f: usize,
) -> Result<(), CudaError> {
    let kn = name(stem(kind, false), dtype);
    let Some(cfg) = grid_stride(u(n) * u(f)) else {
        return Ok(());
    };
    let (n, f, total) = (u(n), u(f), u(n) * u(f));
    match kind {
        Activation::Swiglu => launch!(&kn, s, k, cfg; u_, dout, du, n, f),
        Activation::Gelu => launch!(&kn, s, k, cfg; u_, dout, du, total),
    }
}
