//! The vocab-parallel embedding (CPU twin: `cpu/ops/embedding.rs`; CUDA:
//! `cuda/ops/embedding/`).

use super::family::op_list;
use crate::backend::tensor::{View, ViewMut};

op_list! { $ embedding_ops:
    /// The lookup of a shard of the word table and its weight gradient.
    EmbeddingOps {
        /// out[r] = table[tokens[r] - lo] for the tokens in this shard's rows
        /// lo..lo + rows, zeros for the others. The gathered rows read, the output
        /// written.
        fn embedding_gather(
            table: View<'_, B::Tensor>,
            tokens: &[u32],
            lo: usize,
            out: &mut B::Tensor,
        ) -> () = memory(2 * tb(out));
        /// grad[tokens[r] - lo] += dy[r] for the tokens in this shard. dy read, the
        /// rows it adds into read and written.
        fn embedding_scatter_add(
            dy: &B::Tensor,
            tokens: &[u32],
            lo: usize,
            grad: ViewMut<'_, B::Tensor>,
        ) -> () = memory(3 * tb(dy));
    }
}
