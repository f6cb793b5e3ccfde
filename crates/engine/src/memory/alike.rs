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
pub struct RankStaticMemo(Vec<(Vec<ChunkContents>, RankStatic)>);

impl RankStaticMemo {
    /// True when nothing is kept yet.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn find(&self, chunks: &[ChunkContents], split: bool, handoff: bool) -> Option<RankStatic> {
        self.0
            .iter()
            .find(|(k, st)| alike(st, split, handoff, k, chunks))
            .map(|(_, st)| st.clone())
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
    seen: Vec<(usize, RankStatic)>,
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
        let known = self
            .seen
            .iter()
            .position(|(k, st)| alike(st, split, handoff, &chunks[*k], ch));
        if let Some(i) = known {
            return (self.seen[i].1.clone(), false, i);
        }
        let kept = self
            .memo
            .as_deref()
            .and_then(|m| m.find(ch, split, handoff));
        let remembered = kept.is_some();
        let st = kept.unwrap_or_else(|| RankStatic::of(self.r, self.s, self.l, ch, split));
        if !remembered {
            if let Some(m) = self.memo.as_deref_mut() {
                m.0.push((ch.clone(), st.clone()));
            }
        }
        self.seen.push((rank, st.clone()));
        (st, true, self.seen.len() - 1)
    }
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
