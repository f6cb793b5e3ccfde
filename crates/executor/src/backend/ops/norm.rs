//! RMSNorm and LayerNorm over rows (CPU twin: `cpu/ops/norm.rs`; CUDA: `cuda/ops/norm/`).

use super::family::op_list;
use crate::backend::tensor::{View, ViewMut};
use parsim_plan::plan::{ModelShape, Norm};

/// Which norm, and its epsilon.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormSpec {
    pub kind: Norm,
    pub eps: f32,
}

impl NormSpec {
    /// The model's norm.
    pub fn of(m: &ModelShape) -> NormSpec {
        NormSpec {
            kind: m.norm,
            eps: m.norm_eps,
        }
    }
}

op_list! { $ norm_ops:
    /// A norm over the rows of `x` with gain (and bias for LayerNorm) `p`, and its two
    /// gradients.
    NormOps {
        /// y = norm(x) with `p`.
        fn norm_fwd(
            spec: NormSpec,
            x: &B::Tensor,
            p: View<'_, B::Tensor>,
            y: &mut B::Tensor,
        ) -> () = memory(tb(x) + vb(&p) + tb(y));
        /// dx (+)= the norm's input gradient.
        fn norm_dgrad(
            spec: NormSpec,
            x: &B::Tensor,
            p: View<'_, B::Tensor>,
            dy: &B::Tensor,
            dx: &mut B::Tensor,
            acc: bool,
        ) -> () = memory(tb(x) + vb(&p) + tb(dy) + tb(dx) * (1 + u64::from(acc)));
        /// dp += the gain (and bias) gradient.
        fn norm_wgrad(
            spec: NormSpec,
            x: &B::Tensor,
            dy: &B::Tensor,
            dp: ViewMut<'_, B::Tensor>,
        ) -> () = memory(tb(x) + tb(dy) + 2 * vmb(&dp));
    }
}
