//! Causal grouped-query attention over whole sequences (CPU twin: `cpu/ops/attention.rs`;
//! CUDA: `cuda/ops/flash/`), its shape and what its forward keeps.

use super::family::op_list;
use super::flash::BlockShape;

/// Shapes of one causal grouped-query attention call on one rank: `b` sequences of `s`
/// positions, `heads` query heads sharing `kv_heads` K/V heads of width `d`; rows are
/// (sequence, position), columns (head, feature).
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Sequences in the microbatch.
    pub b: usize,
    pub s: usize,
    /// Query heads on this rank.
    pub heads: usize,
    /// K/V heads on this rank.
    pub kv_heads: usize,
    /// Query/key head width.
    pub d: usize,
    /// Value (and output) head width: `d` except under MLA (DeepSeek-V2).
    pub dv: usize,
    /// Dropout of the attention probabilities (`None`: none), its mask regenerated in backward.
    pub dropout: Option<crate::rng::AttnDropout>,
    /// The keys each query sees besides the causal mask (sliding window, chunk).
    pub span: parsim_plan::plan::AttnSpan,
}

impl AttnShape {
    /// The block shape of this whole-sequence attention.
    pub fn block(&self) -> BlockShape {
        BlockShape {
            b: self.b,
            hq: self.heads,
            hk: self.kv_heads,
            d: self.d,
            dv: self.dv,
            dropout: self.dropout,
            span: self.span,
        }
    }
}

/// What the attention forward saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The softmax (no flash attention).
    Probs,
    /// The per-row log-sum-exp (flash attention).
    Lse,
    /// Nothing (selective recompute).
    Nothing,
}

/// What the attention forward kept for backward.
#[derive(Debug)]
pub enum AttnSaved<T> {
    /// The softmax, [b, heads, s, s].
    Probs(T),
    /// The log-sum-exp of each query row, [b, heads, s].
    Lse(T),
    /// Nothing (selective recompute).
    None,
}

/// The queries, keys and values of an attention.
#[derive(Debug)]
pub struct Qkv<'a, T: ?Sized> {
    pub q: &'a T,
    pub k: &'a T,
    pub v: &'a T,
}

impl<T: ?Sized> Clone for Qkv<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized> Copy for Qkv<'_, T> {}

/// The gradients of the queries, keys and values (written).
#[derive(Debug)]
pub struct QkvGrads<'a, T: ?Sized> {
    pub dq: &'a mut T,
    pub dk: &'a mut T,
    pub dv: &'a mut T,
}

op_list! { $ attention_ops:
    /// Causal GQA attention over whole sequences and its backward.
    AttentionOps {
        /// o = softmax(q k^T / sqrt(d)) v over whole sequences; returns what `keep` asks
        /// to save.
        fn attn_fwd(
            sh: &AttnShape,
            x: Qkv<'_, B::Tensor>,
            o: &mut B::Tensor,
            keep: Keep,
        ) -> AttnSaved<B::Tensor> = attention(
            &sh.block(), x.q.dtype(), sh.s, sh.s, mask_of(sh.span, &[], &[]), Pass::Forward
        );
        /// dq, dk and dv (written) from do.
        fn attn_bwd(
            sh: &AttnShape,
            x: Qkv<'_, B::Tensor>,
            saved: &AttnSaved<B::Tensor>,
            dout: &B::Tensor,
            grads: QkvGrads<'_, B::Tensor>,
        ) -> () = attention(
            &sh.block(), x.q.dtype(), sh.s, sh.s, mask_of(sh.span, &[], &[]), Pass::Backward
        );
    }
}
