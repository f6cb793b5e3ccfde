//! A linear layer's bias (CPU twin: `cpu/ops/bias.rs`; CUDA: rank-1 GEMMs in
//! `cuda/ops/linear/`).

use super::family::op_list;
use crate::backend::tensor::{View, ViewMut};

op_list! { $ bias_ops:
    /// A linear layer's bias and its gradient.
    BiasOps {
        /// y[n, o] += b[o] on every row (`b` holds o elements).
        fn bias_add(y: &mut B::Tensor, b: View<'_, B::Tensor>) -> ()
            = memory(2 * tb(y) + vb(&b));
        /// db[o] += the column sums of dy[n, o]: a bias's gradient over this rank's rows.
        fn bias_grad(dy: &B::Tensor, db: ViewMut<'_, B::Tensor>) -> ()
            = memory(tb(dy) + 2 * vmb(&db));
    }
}
