//! The fused QKV projection's layout (CPU twin: `cpu/ops/layout.rs`; CUDA: 2-D copies in
//! `cuda/ops/linear/`).

use super::family::op_list;

op_list! { $ layout_ops:
    /// The fused projection's split into Q, K and V, and its merge back.
    LayoutOps {
        /// Splits the rows of a fused projection [n, q + k + v] into q [n, q], k [n, k],
        /// v [n, v].
        fn qkv_split(
            qkv: &B::Tensor,
            q: &mut B::Tensor,
            k: &mut B::Tensor,
            v: &mut B::Tensor,
        ) -> () = memory(tb(qkv) + tb(q) + tb(k) + tb(v));
        /// The inverse of `qkv_split`.
        fn qkv_merge(
            q: &B::Tensor,
            k: &B::Tensor,
            v: &B::Tensor,
            qkv: &mut B::Tensor,
        ) -> () = memory(tb(qkv) + tb(q) + tb(k) + tb(v));
    }
}
