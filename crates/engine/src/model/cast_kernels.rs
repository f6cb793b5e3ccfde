//! The kernels one cast of one tensor launches under a low-precision recipe and the HBM bytes
//! each moves (what the ledger records; src/op_cost/cast.rs prices them).
//!
//! Per-tensor FP8 (transformer_engine/pytorch/csrc/quantizer.cpp):
//! - delayed scaling (`Float8Quantizer`) casts with last step's scale and records the amax in
//!   the same kernel: one cast (and, where the GPU reads FP8 only rowwise, transpose) kernel;
//! - current scaling (`Float8CurrentScalingQuantizer::quantize_impl`) first reads the tensor
//!   for its amax (`nvte_compute_amax_with_config`), computes the scale
//!   (`nvte_compute_scale_from_amax`), then casts (`nvte_quantize_v2`): the bf16 tensor is
//!   read twice and three kernels run.
//!
//! A layer-norm-fused linear layer (TE's LayerNormLinear: Megatron-Core's QKV projection and a
//! dense MLP's fc1) quantises its input inside the norm (`layernorm_fwd` / `rmsnorm_fwd`,
//! transformer_engine/pytorch/csrc/extensions/normalization.cpp): delayed scaling runs the
//! norm kernel FULLY_FUSED, writing FP8 directly, so only the columnwise copy (a transpose of
//! the FP8 data, where the GPU needs one) is left to do; current scaling runs
//! FUSED_NORM_AMAX_FP8, the norm writing bf16 with its amax, then `quantize_with_amax`: the
//! cast without the amax pass. Block-scaled recipes (MXFP8, NVFP4, blockwise FP8) find each
//! block's scale inside their one cast kernel, and their norms run UNFUSED (MXFP8's fused
//! cuDNN path only under `NVTE_NORM_FWD_USE_CUDNN`).

use serde::Serialize;

/// How a recipe finds the scale of a tensor it casts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scaling {
    /// Per-tensor, from the amax history of past steps (TE's DelayedScaling).
    Delayed,
    /// Per-tensor, from the tensor's own amax read before the cast (Float8CurrentScaling).
    Current,
    /// Per block, found inside the cast kernel (MXFP8, NVFP4, blockwise FP8).
    Block,
}

/// Bytes of the amax and scale the scale kernel reads and writes (one FP32 each).
const SCALE_KERNEL_BYTES: u64 = 8;
/// A bf16 value.
const BF16: u64 = 2;

/// The kernels of one cast of one tensor: an amax pass (current scaling) and the cast
/// itself. Zero bytes: the kernel does not run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CastPass {
    /// HBM bytes the amax reduction reads (the bf16 tensor); 0 where the amax comes with the
    /// cast or the norm. Each amax pass is followed by the scale kernel.
    #[serde(skip_serializing_if = "super::op::is_zero")]
    pub amax_bytes: u64,
    /// HBM bytes of the cast (and transpose) kernel: what it reads plus the copies it writes.
    pub cast_bytes: u64,
}

/// One tensor to cast: `elements` bf16 values written as `quantized_bytes` (every copy the
/// recipe keeps, with scales); `norm_fused`: the tensor is the output of a norm that TE fuses
/// with the linear layer after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CastInput {
    pub scaling: Scaling,
    pub elements: u64,
    pub quantized_bytes: u64,
    /// Copies of the tensor the recipe keeps (2: a rowwise and a columnwise one).
    pub copies: u64,
    pub norm_fused: bool,
}

impl CastPass {
    /// The kernels TE runs to cast `t` (module docs).
    pub fn of(t: CastInput) -> CastPass {
        let read = t.elements * BF16;
        match (t.scaling, t.norm_fused) {
            // The norm wrote the rowwise FP8 copy; a transpose of it (FP8 read, FP8 written)
            // makes the columnwise one where the GPU needs it.
            (Scaling::Delayed, true) if t.copies > 1 => CastPass {
                amax_bytes: 0,
                cast_bytes: 2 * t.elements,
            },
            (Scaling::Delayed, true) => CastPass::default(),
            (Scaling::Current, false) => CastPass {
                amax_bytes: read,
                cast_bytes: read + t.quantized_bytes,
            },
            (Scaling::Delayed, false) | (Scaling::Current, true) | (Scaling::Block, _) => {
                CastPass {
                    amax_bytes: 0,
                    cast_bytes: read + t.quantized_bytes,
                }
            }
        }
    }

    /// The HBM bytes of each kernel the pass launches, in order: amax and scale where there
    /// is an amax pass, then the cast.
    pub fn kernels(&self) -> impl Iterator<Item = u64> {
        let amax = (self.amax_bytes > 0).then_some([self.amax_bytes, SCALE_KERNEL_BYTES]);
        amax.into_iter()
            .flatten()
            .chain((self.cast_bytes > 0).then_some(self.cast_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(scaling: Scaling, copies: u64, norm_fused: bool) -> CastInput {
        // 4096 tokens x 2048 features, per-tensor FP8: 1 byte a value per copy and a scale.
        let elements = 4096 * 2048;
        CastInput {
            scaling,
            elements,
            quantized_bytes: copies * (elements + 4),
            copies,
            norm_fused,
        }
    }

    /// Current scaling reads the bf16 tensor once for the amax and once for the cast; delayed
    /// reads it once; a delayed norm-fused cast leaves only the transpose, and nothing on a
    /// GPU that reads FP8 both ways.
    #[test]
    fn kernels_by_recipe_and_fusion() {
        let e = 4096 * 2048u64;
        let current = CastPass::of(input(Scaling::Current, 2, false));
        assert_eq!(current.amax_bytes, 2 * e);
        assert_eq!(current.cast_bytes, 2 * e + 2 * (e + 4));
        assert_eq!(current.kernels().count(), 3);
        let delayed = CastPass::of(input(Scaling::Delayed, 2, false));
        assert_eq!(
            (delayed.amax_bytes, delayed.cast_bytes),
            (0, 2 * e + 2 * (e + 4))
        );
        assert_eq!(delayed.kernels().count(), 1);
        let fused = CastPass::of(input(Scaling::Delayed, 2, true));
        assert_eq!((fused.amax_bytes, fused.cast_bytes), (0, 2 * e));
        let fused_native = CastPass::of(input(Scaling::Delayed, 1, true));
        assert_eq!(fused_native.kernels().count(), 0);
        let fused_current = CastPass::of(input(Scaling::Current, 1, true));
        assert_eq!(
            (fused_current.amax_bytes, fused_current.cast_bytes),
            (0, 2 * e + e + 4)
        );
    }
}
