//! Launch of backend/cuda/ops/dropout/dropout.cu: inverted dropout in place from the Philox mask
//! (CPU twin: cpu/ops/dropout.rs with rng.rs's mask). The key's words are the host's
//! [`DropoutKey`]'s.

use crate::backend::cuda::ops::launch::*;
use crate::rng::DropoutKey;
use parsim_plan::DType;

/// x[i, j] *= mask(tokens[i], col_offset + j) over `rows` x `cols` elements of `dtype`.
///
/// # Safety
/// `x`: rows*cols of `dtype`; `tokens`: rows u64.
#[allow(clippy::too_many_arguments)]
pub unsafe fn dropout(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    key: &DropoutKey,
    x: CUdeviceptr,
    tokens: CUdeviceptr,
    rows: usize,
    cols: usize,
    col_offset: u64,
) -> Result<(), CudaError> {
    let kn = name("dropout", dtype);
    let w = key.words();
    launch!(&kn, s, k, maybe grid_stride(u(rows) * u(cols)); x, tokens, u(rows), u(cols), col_offset, w.seed, w.step,
        w.layer_site, w.threshold, key.keep_scale())
}
