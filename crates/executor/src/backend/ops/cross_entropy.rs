//! The vocab-parallel cross-entropy, in pieces between its all-reduces (CPU twin:
//! `cpu/ops/cross_entropy.rs`; CUDA: `cuda/ops/cross_entropy/`).

use super::family::op_list;

op_list! { $ cross_entropy_ops:
    /// The pieces of the vocab-parallel cross-entropy (Megatron's
    /// `vocab_parallel_cross_entropy`) and its backward.
    CrossEntropyOps {
        /// First piece: the row maximum of the logits shard [n, v].
        fn ce_row_max(logits: &B::Tensor, max: &mut B::Tensor) -> ()
            = memory(tb(logits) + tb(max));
        /// Second piece: probs = exp(logits - max) and its row sums.
        fn ce_exp(
            logits: &B::Tensor,
            max: &B::Tensor,
            probs: &mut B::Tensor,
            sum: &mut B::Tensor,
        ) -> () = memory(tb(logits) + tb(max) + tb(probs) + tb(sum));
        /// Third piece: the logit of each row's target where this shard (columns lo..)
        /// holds it, 0 elsewhere. One logit read per row, the row's value written.
        fn ce_target_logit(
            logits: &B::Tensor,
            targets: &[u32],
            lo: usize,
            out: &mut B::Tensor,
        ) -> () = memory(2 * tb(out));
        /// Last piece: normalises `probs` by the global row sums and returns the sum
        /// over rows of log(sum) + max - target logit (the only host read of the
        /// forward).
        fn ce_loss(
            probs: &mut B::Tensor,
            sum: &B::Tensor,
            max: &B::Tensor,
            target_logit: &B::Tensor,
        ) -> f64 = memory(2 * tb(probs) + tb(sum) + tb(max) + tb(target_logit));
        /// Backward, in place: dlogits = scale * (probs - onehot(target)).
        fn ce_grad(probs: &mut B::Tensor, targets: &[u32], lo: usize, scale: f32) -> ()
            = memory(2 * tb(probs));
    }
}
