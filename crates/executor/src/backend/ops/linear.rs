//! The linear layers' matrix products (CPU twin: `cpu/ops/gemm.rs`; CUDA: cuBLASLt in
//! `cuda/ops/linear/`). `dims` is (n, i, o): `n` rows of `i` inputs and `o` outputs, weights
//! [o, i].

use super::family::op_list;
use crate::backend::tensor::{View, ViewMut};

op_list! { $ linear_ops:
    /// The linear layers' forward and its two gradients.
    LinearOps {
        /// y[n, o] = x[n, i] . w[o, i]^T.
        fn linear_fwd(
            x: &B::Tensor,
            w: View<'_, B::Tensor>,
            dims: (usize, usize, usize),
            y: &mut B::Tensor,
        ) -> () = gemm(dims.0, dims.2, dims.1, x.dtype());
        /// dx[n, i] (+)= dy[n, o] . w[o, i].
        fn linear_dgrad(
            dy: &B::Tensor,
            w: View<'_, B::Tensor>,
            dims: (usize, usize, usize),
            dx: &mut B::Tensor,
            acc: bool,
        ) -> () = gemm(dims.0, dims.1, dims.2, dy.dtype());
        /// dw[o, i] += dy^T . x.
        fn linear_wgrad(
            dy: &B::Tensor,
            x: &B::Tensor,
            dims: (usize, usize, usize),
            dw: ViewMut<'_, B::Tensor>,
        ) -> () = gemm(dims.2, dims.1, dims.0, dy.dtype());
    }
}
