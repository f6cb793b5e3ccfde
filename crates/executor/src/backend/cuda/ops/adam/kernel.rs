//! Launch of backend/cuda/ops/adam/adam.cu: one Adam step with the optional bf16 weight copy (CPU
//! twin: cpu/ops/adam.rs).

use crate::backend::cuda::ops::launch::*;
use parsim_plan::plan::AdamConfig;

/// The bias corrections (1 - beta1^t, 1 - beta2^t), computed in f32 as the CPU does.
pub fn bias_corrections(c: &AdamConfig, t: u32) -> (f32, f32) {
    (1.0 - c.beta1.powi(t as i32), 1.0 - c.beta2.powi(t as i32))
}

/// Step `t` on p, m, v (f32, n each) from gradient g; `bf16_copy` (0 for none) receives the
/// rounded weights.
///
/// # Safety
/// `p`, `g`, `m`, `v`: n f32 each; `bf16_copy`: 0 or n bf16.
#[allow(clippy::too_many_arguments)]
pub unsafe fn adam_step(
    s: &CudaStream,
    k: &Kernels,
    c: &AdamConfig,
    t: u32,
    p: CUdeviceptr,
    g: CUdeviceptr,
    m: CUdeviceptr,
    v: CUdeviceptr,
    n: usize,
    bf16_copy: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = "adam_step_f32";
    if t == 0 {
        return Err(shape_error(kn, "the step t counts from 1"));
    }
    let (bc1, bc2) = bias_corrections(c, t);
    let n = u(n);
    launch!(
        kn, s, k, maybe grid_stride(n);
        p, g, m, v, n, c.beta1, c.beta2, c.eps, c.lr, c.weight_decay, bc1, bc2, bf16_copy
    )
}
