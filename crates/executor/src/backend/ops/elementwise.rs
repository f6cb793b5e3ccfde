//! Element-wise arithmetic and copies (CPU twin: `cpu/ops/elementwise.rs`; CUDA:
//! `cuda/ops/elementwise/`).

use super::family::op_list;
use crate::backend::tensor::{View, ViewMut};

op_list! { $ elementwise_ops:
    /// Sums, scaled sums, copies (with the dtype's conversion) and fills.
    ElementwiseOps {
        /// out = a + b.
        fn add(a: &B::Tensor, b: &B::Tensor, out: &mut B::Tensor) -> ()
            = memory(tb(a) + tb(b) + tb(out));
        /// y += alpha * x.
        fn axpy(alpha: f32, x: View<'_, B::Tensor>, y: ViewMut<'_, B::Tensor>) -> ()
            = memory(vb(&x) + 2 * vmb(&y));
        /// dst = src (converting the dtype: fp32 to bf16 rounds to nearest even).
        fn copy(src: View<'_, B::Tensor>, dst: ViewMut<'_, B::Tensor>) -> ()
            = memory(vb(&src) + vmb(&dst));
        /// Every element of `t` set to `value`.
        fn fill(t: &mut B::Tensor, value: f32) -> () = memory(tb(t));
    }
}
