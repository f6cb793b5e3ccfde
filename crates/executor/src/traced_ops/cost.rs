//! What an op costs, in the words the op lists of `backend::ops` use after each op's `=`:
//! [`memory`] (the bytes a memory-bound op moves), [`gemm`] (a matrix product's shape) or
//! [`attention`] (an attention's shape, mask and pass), with [`mask_of`] and the byte counts
//! [`tb`], [`vb`] and [`vmb`].
//!
//! Bytes of a memory-bound op: each tensor it reads or writes once, an output it also reads
//! (in place, or accumulated) twice; a gather or scatter counts the rows it touches.

use crate::backend::ops::BlockShape;
use crate::backend::{DeviceTensor, View, ViewMut};
use parsim_plan::op_timing::{MaskKind, OpKey, Pass};
use parsim_plan::plan::AttnSpan;
use parsim_plan::DType;

/// An op's cost class: its key, or an attention's shape whose key also names the kernel the
/// device runs for it.
pub enum Cost {
    Key(OpKey),
    Attention(AttentionCost),
}

/// An attention call's shape: `sh`'s batch and heads, `q_len` by `kv_len` positions.
pub struct AttentionCost {
    pub sh: BlockShape,
    pub dtype: DType,
    pub q_len: usize,
    pub kv_len: usize,
    pub mask: MaskKind,
    pub pass: Pass,
}

impl AttentionCost {
    /// The key, with the name of the kernel that runs it.
    pub fn key(&self, kernel: &str) -> OpKey {
        OpKey::Attention {
            batch_heads: (self.sh.b * self.sh.hq) as u64,
            q_len: self.q_len as u64,
            kv_len: self.kv_len as u64,
            head_dim: self.sh.d as u64,
            mask: self.mask,
            pass: self.pass,
            kernel: kernel.to_string(),
        }
    }
}

/// A memory-bound op moving `bytes`.
pub fn memory(bytes: u64) -> Cost {
    Cost::Key(OpKey::Memory { bytes })
}

/// `C[m, n] = A[m, k] B[k, n]` in `dtype`.
pub fn gemm(m: usize, n: usize, k: usize, dtype: DType) -> Cost {
    Cost::Key(OpKey::Gemm {
        m: m as u64,
        n: n as u64,
        k: k as u64,
        dtype,
    })
}

/// An attention of `q_len` queries against `kv_len` keys of shape `sh` on `dtype` inputs.
pub fn attention(
    sh: &BlockShape,
    dtype: DType,
    q_len: usize,
    kv_len: usize,
    mask: MaskKind,
    pass: Pass,
) -> Cost {
    Cost::Attention(AttentionCost {
        sh: *sh,
        dtype,
        q_len,
        kv_len,
        mask,
        pass,
    })
}

/// The mask a block attention of queries at `q` against keys at `k` applies: banded under a
/// window or chunk, full when every key precedes every query, causal otherwise.
pub fn mask_of(span: AttnSpan, q: &[u32], k: &[u32]) -> MaskKind {
    if span != AttnSpan::Full {
        return MaskKind::Banded;
    }
    match (q.iter().min(), k.iter().max()) {
        (Some(qlo), Some(khi)) if khi <= qlo => MaskKind::Full,
        _ => MaskKind::Causal,
    }
}

/// Bytes of a view.
pub fn vb<T: DeviceTensor>(v: &View<'_, T>) -> u64 {
    v.len() as u64 * v.tensor.dtype().size_bytes()
}

/// Bytes of a writable view.
pub fn vmb<T: DeviceTensor>(v: &ViewMut<'_, T>) -> u64 {
    v.len() as u64 * v.tensor.dtype().size_bytes()
}

/// Bytes of a tensor.
pub fn tb<T: DeviceTensor>(t: &T) -> u64 {
    t.size_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_masks_follow_the_positions_and_the_span() {
        // Keys wholly before the queries: every pair visible.
        assert_eq!(mask_of(AttnSpan::Full, &[4, 5], &[0, 1]), MaskKind::Full);
        // The diagonal block: causal.
        assert_eq!(mask_of(AttnSpan::Full, &[0, 1], &[0, 1]), MaskKind::Causal);
        assert_eq!(mask_of(AttnSpan::Window(2), &[4], &[0]), MaskKind::Banded);
    }
}
