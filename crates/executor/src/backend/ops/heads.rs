//! MLA's query and key heads (CPU twin: `cpu/ops/heads.rs`; CUDA: `cuda/ops/heads/`).

use super::family::op_list;

op_list! { $ heads_ops:
    /// MLA's per-head concatenation (DeepSeek-V2, decoupled rotary) and its backward.
    HeadsOps {
        /// out [n, heads (da + db)] with head h = [a's head h, b's head h]; `a`
        /// [n, heads da], `b` [n, heads db] or [n, db] (the rotary key, shared by every
        /// head).
        fn heads_concat(
            a: &B::Tensor,
            b: &B::Tensor,
            heads: usize,
            out: &mut B::Tensor,
        ) -> () = memory(tb(a) + tb(b) + tb(out));
        /// The backward of `heads_concat`: `da` and `db` written from `dout` (a shared
        /// `db` sums the heads' gradients).
        fn heads_split(
            dout: &B::Tensor,
            heads: usize,
            da: &mut B::Tensor,
            db: &mut B::Tensor,
        ) -> () = memory(tb(dout) + tb(da) + tb(db));
    }
}
