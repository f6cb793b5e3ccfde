//! Block attention: one K/V block at a time merged by the online softmax, FlashAttention-2's
//! backward, and attention sinks (CPU twin: `cpu/ops/flash.rs`; CUDA: `cuda/ops/flash/`).
//! Context parallelism runs its attention on these.

use super::family::op_list;
use crate::backend::tensor::{View, ViewMut};

/// Shapes shared by the query and key sides of a block attention: `b` sequences, `hq` query
/// heads and `hk` K/V heads of `d` features (GQA: query head h reads K/V head h / (hq / hk)).
#[derive(Debug, Clone, Copy)]
pub struct BlockShape {
    pub b: usize,
    pub hq: usize,
    pub hk: usize,
    /// Query/key head width.
    pub d: usize,
    /// Value (and output) head width: `d` except under MLA (DeepSeek-V2).
    pub dv: usize,
    /// Dropout of the attention probabilities (`None`: none), its mask regenerated in backward.
    pub dropout: Option<crate::rng::AttnDropout>,
    /// The keys each query sees besides the causal mask (sliding window, chunk).
    pub span: parsim_plan::plan::AttnSpan,
}

/// One side of a block attention: rows of `b` sequences, [b, pos.len(), heads, d] row-major,
/// row i of a sequence at position `pos[i]`, processed in runs of at most `tile` rows.
#[derive(Debug, Clone, Copy)]
pub struct Side<'a> {
    pub pos: &'a [u32],
    pub tile: usize,
}

/// The queries of a block attention (this rank's rows) and their side.
#[derive(Debug)]
pub struct BlockQuery<'a, T: ?Sized> {
    pub q: &'a T,
    pub side: Side<'a>,
}

/// One K/V block and its side.
#[derive(Debug)]
pub struct BlockKv<'a, T> {
    pub k: View<'a, T>,
    pub v: View<'a, T>,
    pub side: Side<'a>,
}

/// What a forward block merges into: the running output `acc` and the online softmax's row
/// maximum and sum ([b, hq, q rows] each).
#[derive(Debug)]
pub struct BlockAcc<'a, T> {
    pub acc: &'a mut T,
    pub max: &'a mut T,
    pub sum: &'a mut T,
}

/// What a block's backward reads besides Q, K and V: the output gradient, the final
/// log-sum-exp and D = rowsum(dO * O).
#[derive(Debug)]
pub struct BlockStats<'a, T: ?Sized> {
    pub dout: &'a T,
    pub lse: &'a T,
    pub delta: &'a T,
}

/// What a block's backward adds into: dQ for the local rows, dK and dV for the block's.
#[derive(Debug)]
pub struct BlockGrads<'a, T> {
    pub dq: &'a mut T,
    pub dk: ViewMut<'a, T>,
    pub dv: ViewMut<'a, T>,
}

op_list! { $ flash_ops:
    /// Block attention (FlashAttention-2's forward and backward, one K/V block at a
    /// time), its end and the sinks' terms.
    FlashOps {
        /// Merges one K/V block into `run`; `tile` is scratch of at least (q tile x k
        /// tile). Returns the unmasked score elements (the causal work).
        fn flash_fwd_block(
            sh: &BlockShape,
            q: BlockQuery<'_, B::Tensor>,
            kv: BlockKv<'_, B::Tensor>,
            run: BlockAcc<'_, B::Tensor>,
            tile: &mut B::Tensor,
        ) -> u64 = attention(
            sh, q.q.dtype(), q.side.pos.len(), kv.side.pos.len(),
            mask_of(sh.span, q.side.pos, kv.side.pos), Pass::Forward
        );
        /// The merge's end: normalises `acc` in place and writes the log-sum-exp.
        fn flash_finish(
            sh: &BlockShape,
            rows: usize,
            acc: &mut B::Tensor,
            max: &B::Tensor,
            sum: &B::Tensor,
            lse: &mut B::Tensor,
        ) -> () = memory(2 * tb(acc) + tb(max) + tb(sum) + tb(lse));
        /// FlashAttention-2's D = rowsum(dO * O) per row and head, [b, rows, hq].
        fn flash_delta(
            sh: &BlockShape,
            rows: usize,
            dout: &B::Tensor,
            o: &B::Tensor,
            out: &mut B::Tensor,
        ) -> () = memory(tb(dout) + tb(o) + tb(out));
        /// Attention sinks (GPT-OSS): head h's logit `sinks[h]` joins every row's
        /// softmax denominator. From the normalised output `o` [b, rows, hq, dv] and the
        /// keys' log-sum-exp `lse` [b, hq, rows], in place: lse' = log(exp(lse) +
        /// exp(sink)), o *= exp(lse - lse'). The backward of the keys then runs
        /// unchanged on lse'.
        fn attn_sink_fwd(
            sh: &BlockShape,
            rows: usize,
            o: &mut B::Tensor,
            lse: &mut B::Tensor,
            sinks: View<'_, B::Tensor>,
        ) -> () = memory(2 * tb(o) + 2 * tb(lse) + vb(&sinks));
        /// The sinks' gradient, added into `dsinks`: -sum over each head's rows of
        /// exp(sink - lse') D, from the final `lse` [b, hq, rows] and D (`flash_delta`,
        /// [b, rows, hq]).
        fn attn_sink_grad(
            sh: &BlockShape,
            rows: usize,
            lse: &B::Tensor,
            delta: &B::Tensor,
            sinks: View<'_, B::Tensor>,
            dsinks: ViewMut<'_, B::Tensor>,
        ) -> () = memory(tb(lse) + tb(delta) + vb(&sinks) + 2 * vmb(&dsinks));
        /// Block attention backward: `grads` +=, from the final log-sum-exp and D;
        /// `tiles` (p, dp) are scratch. Returns the work.
        fn flash_bwd_block(
            sh: &BlockShape,
            q: BlockQuery<'_, B::Tensor>,
            kv: BlockKv<'_, B::Tensor>,
            stats: BlockStats<'_, B::Tensor>,
            grads: BlockGrads<'_, B::Tensor>,
            tiles: (&mut B::Tensor, &mut B::Tensor),
        ) -> u64 = attention(
            sh, q.q.dtype(), q.side.pos.len(), kv.side.pos.len(),
            mask_of(sh.span, q.side.pos, kv.side.pos), Pass::Backward
        );
    }
}
