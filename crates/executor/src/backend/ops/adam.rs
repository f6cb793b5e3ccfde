//! The optimizer step (CPU twin: `cpu/ops/adam.rs`; CUDA: `cuda/ops/adam/`).

use super::family::op_list;
use crate::backend::tensor::{View, ViewMut};

/// The tensors of one Adam step: the fp32 master weights `p`, their gradient `g`, the moments
/// `m` and `v`, and the weight copy the model reads (the bf16 copy in mixed precision),
/// written in the same pass as a fused mixed-precision optimizer kernel does.
#[derive(Debug)]
pub struct AdamState<'a, T> {
    pub p: ViewMut<'a, T>,
    pub g: View<'a, T>,
    pub m: &'a mut T,
    pub v: &'a mut T,
    pub weight_copy: Option<ViewMut<'a, T>>,
}

op_list! { $ adam_ops:
    /// Adam (Kingma and Ba 2015) with decoupled weight decay (Loshchilov and Hutter 2019).
    AdamOps {
        /// Step `t` of Adam with `c` on `s`.
        fn adam(
            c: &parsim_plan::plan::AdamConfig,
            t: u32,
            s: AdamState<'_, B::Tensor>,
        ) -> () = memory(
            2 * (vmb(&s.p) + tb(s.m) + tb(s.v)) + vb(&s.g) + s.weight_copy.as_ref().map_or(0, vmb)
        );
    }
}
