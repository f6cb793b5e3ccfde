//! Ranks that hold the same blocks share their static memory ([`RankStatic`]): worked out
//! once per set of alike ranks within a mix, and, through [`RankStaticMemo`], once per run of
//! a search's mixes that differ only in their pipeline split.

use super::{hands_off, same_blocks, RankStatic};
use crate::config::Resolved;
use crate::model::{ChunkContents, Ledger, LedgerSummary};

/// Static memories already worked out ([`RankStatic`]), by the blocks a rank holds (whatever
/// their stages), its backward split and hand-off. Valid for one resolved run of mixes that
/// differ only in their pipeline split (vpp, schedule, first/last stage layers, slots) and
/// share one timed ledger: none of those enters a rank's static memory, so a search screening
/// such a run reuses the middle ranks' figures from one split to the next.
#[derive(Default)]
pub struct RankStaticMemo(Vec<(u64, Vec<ChunkContents>, RankStatic)>);

impl RankStaticMemo {
    /// True when nothing is kept yet.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn find(
        &self,
        key: u64,
        chunks: &[ChunkContents],
        split: bool,
        handoff: bool,
    ) -> Option<RankStatic> {
        self.0
            .iter()
            .find(|(h, k, st)| *h == key && alike(st, split, handoff, k, chunks))
            .map(|(_, _, st)| *st)
    }
}

/// Each rank's [`RankStatic`] (its backward split as asked), worked out once per set of alike
/// ranks (the same blocks, split and hand-off: the middle of a pipeline), on demand; from
/// `memo` when given (and kept there).
pub(super) struct AlikeRanks<'a, 'm> {
    r: &'a Resolved,
    s: &'a LedgerSummary,
    l: &'a Ledger,
    chunks: &'a [Vec<ChunkContents>],
    seen: Vec<(usize, u64, RankStatic)>,
    /// Each rank's set in `seen` (by rank; `usize::MAX` for a rank not asked for).
    set_of: Vec<usize>,
    pub(super) memo: Option<&'m mut RankStaticMemo>,
}

impl<'a, 'm> AlikeRanks<'a, 'm> {
    pub(super) fn new(
        r: &'a Resolved,
        s: &'a LedgerSummary,
        l: &'a Ledger,
        chunks: &'a [Vec<ChunkContents>],
    ) -> Self {
        AlikeRanks {
            r,
            s,
            l,
            chunks,
            seen: Vec::new(),
            set_of: Vec::new(),
            memo: None,
        }
    }

    /// `rank`'s static memory with its backward `split` or not, and whether it is the first
    /// of its set of alike ranks asked for.
    pub(super) fn of(&mut self, rank: usize, split: bool) -> (RankStatic, bool) {
        let (st, first, _) = self.indexed(rank, split);
        (st, first)
    }

    /// [`AlikeRanks::of`], with the index of `rank`'s set of alike ranks (in the order the
    /// sets were first asked for).
    pub(super) fn indexed(&mut self, rank: usize, split: bool) -> (RankStatic, bool, usize) {
        let ch = &self.chunks[rank];
        let chunks = self.chunks;
        let handoff = hands_off(ch);
        // The middle of a pipeline: most often the rank before holds the same blocks.
        if let Some(i) = rank.checked_sub(1).and_then(|before| {
            let i = self
                .set_of
                .get(before)
                .copied()
                .filter(|&i| i != usize::MAX)?;
            let st = &self.seen[i].2;
            alike(st, split, handoff, &chunks[before], ch).then_some(i)
        }) {
            self.remember(rank, i);
            return (self.seen[i].2, false, i);
        }
        let (st, first, i) = self.find_or_work_out(rank, split, handoff);
        self.remember(rank, i);
        (st, first, i)
    }

    /// Notes that `rank` is of set `i`.
    fn remember(&mut self, rank: usize, i: usize) {
        if self.set_of.len() <= rank {
            self.set_of.resize(rank + 1, usize::MAX);
        }
        self.set_of[rank] = i;
    }

    /// [`AlikeRanks::indexed`] past the rank before: the sets seen, the memo, or worked out now.
    fn find_or_work_out(
        &mut self,
        rank: usize,
        split: bool,
        handoff: bool,
    ) -> (RankStatic, bool, usize) {
        let ch = &self.chunks[rank];
        let chunks = self.chunks;
        let key = blocks_key(ch);
        let known = self
            .seen
            .iter()
            .position(|(k, h, st)| *h == key && alike(st, split, handoff, &chunks[*k], ch));
        if let Some(i) = known {
            return (self.seen[i].2, false, i);
        }
        let kept = self
            .memo
            .as_deref()
            .and_then(|m| m.find(key, ch, split, handoff));
        let st = kept.unwrap_or_else(|| RankStatic::of(self.r, self.s, self.l, ch, split));
        if kept.is_none() {
            if let Some(m) = self.memo.as_deref_mut() {
                m.0.push((key, ch.clone(), st));
            }
        }
        self.seen.push((rank, key, st));
        (st, true, self.seen.len() - 1)
    }
}

/// A fingerprint of the blocks a rank holds, chunk by chunk, whatever their stages: equal for
/// ranks that hold the same blocks ([`same_blocks`]), so most ranks that do not are told apart
/// by one comparison.
fn blocks_key(chunks: &[ChunkContents]) -> u64 {
    let mut h = chunks.len() as u64;
    for c in chunks {
        let fields = [
            u64::from(c.embedding) | u64::from(c.output) << 1,
            c.dense_layers.into(),
            c.moe_layers.into(),
            c.mtp_layers.into(),
            c.hp_dense_layers.into(),
            c.hp_moe_layers.into(),
        ];
        for x in fields.into_iter().chain(c.variant_layers.map(u64::from)) {
            h = (h.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    h
}

/// Whether `st`, worked out for a rank holding `held`, serves a rank holding `chunks` with
/// that backward `split` and `handoff`: the same blocks, whatever their stages.
fn alike(
    st: &RankStatic,
    split: bool,
    handoff: bool,
    held: &[ChunkContents],
    chunks: &[ChunkContents],
) -> bool {
    st.split == split && st.handoff == handoff && same_blocks(held, chunks)
}
