//! Ulysses' all-to-all layouts (CPU twin: `cpu/ops/ulysses.rs`; CUDA: `cuda/ops/ulysses/`):
//! sequence shards to head shards and back (Jacobs et al. 2023, DeepSpeed-Ulysses).

use super::family::op_list;

/// The geometry of a Ulysses all-to-all: `b` sequences of `cp` shards of `s_loc` rows.
#[derive(Debug, Clone, Copy)]
pub struct UlyssesGeo {
    pub b: usize,
    pub s_loc: usize,
    pub cp: usize,
}

impl UlyssesGeo {
    /// Elements of part `p` in one chunk of the all-to-all buffer: its `b s_loc` rows of
    /// `heads / cp` heads of `e` features.
    pub fn part_len(&self, p: &UlyssesPart) -> usize {
        self.b * self.s_loc * p.heads / self.cp * p.e
    }

    /// Where each part starts inside a chunk (parts one after another, in order), and the
    /// chunk's length; chunk j starts at j times that length. The layout both backends pack.
    pub fn part_offsets(&self, parts: &[UlyssesPart]) -> (Vec<usize>, usize) {
        let mut offs = Vec::with_capacity(parts.len());
        let mut off = 0;
        for p in parts {
            offs.push(off);
            off += self.part_len(p);
        }
        (offs, off)
    }
}

/// One tensor of a Ulysses all-to-all: its heads on the sequence side and features per head.
#[derive(Debug, Clone, Copy)]
pub struct UlyssesPart {
    pub heads: usize,
    pub e: usize,
}

/// Which side of a Ulysses exchange a tensor is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UlyssesLayout {
    /// Sequence shards [b, s_loc, H, e]; chunk j of the buffer holds head group j.
    Seq,
    /// Head shards of the whole sequence [b, s, H / cp, e]; chunk j holds rank j's rows.
    Head,
}

op_list! { $ ulysses_ops:
    /// The all-to-all buffers' packing and unpacking.
    UlyssesOps {
        /// Tensors on side `from` into the all-to-all send buffer `out`.
        fn ulysses_pack(
            geo: &UlyssesGeo,
            from: UlyssesLayout,
            xs: &[(&B::Tensor, UlyssesPart)],
            out: &mut B::Tensor,
        ) -> () = memory(2 * tb(out));
        /// The received buffer into tensors on side `to`.
        fn ulysses_unpack(
            geo: &UlyssesGeo,
            to: UlyssesLayout,
            recv: &B::Tensor,
            parts: &[UlyssesPart],
            outs: &mut [&mut B::Tensor],
        ) -> () = memory(2 * tb(recv));
    }
}
