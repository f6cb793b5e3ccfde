//! Ranks that hold the same blocks share their static memory ([`RankStatic`]): worked out
//! once per set of alike ranks within a mix, and, through [`RankStaticMemo`], once per run of
//! a search's mixes that differ only in their pipeline split.

use super::{hands_off, same_blocks, RankStatic, RuntimeLines};
use crate::config::Resolved;
use crate::model::{ChunkContents, Ledger, LedgerSummary};
use std::sync::Arc;

/// Static memories already worked out ([`RankStatic`]), by the blocks a rank holds (whatever
/// their stages), its backward split and hand-off. Valid for one resolved run of mixes that
/// differ only in their pipeline split (vpp, schedule, first/last stage layers, slots) and
/// share one timed ledger: none of those enters a rank's static memory, so a search screening
/// such a run reuses the middle ranks' figures from one split to the next. Each entry also
/// keeps the rank's total under [`super::Pipeline::Inflight`] by number of live sets, which
/// follows from the same inputs (what the rank holds, its split and hand-off) alone; and the
/// runtime lines every rank of the run has (one layout).
#[derive(Default)]
pub struct RankStaticMemo {
    kept: Vec<Kept>,
    runtime: Option<RuntimeLines>,
}

/// One set of alike ranks' static memory, shared rather than copied, and its in-flight totals
/// as (live sets, bytes).
struct Kept {
    chunks: Vec<ChunkContents>,
    st: Arc<RankStatic>,
    inflight: Vec<(u32, u64)>,
}

impl RankStaticMemo {
    /// True when nothing is kept yet.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    fn position(&self, chunks: &[ChunkContents], split: bool, handoff: bool) -> Option<usize> {
        self.kept
            .iter()
            .position(|k| alike(&k.st, split, handoff, &k.chunks, chunks))
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
    /// Each set's first rank, its static memory and its entry in `memo` (when given).
    seen: Vec<(usize, Arc<RankStatic>, Option<usize>)>,
    /// The runtime lines every rank has, once worked out.
    runtime: Option<RuntimeLines>,
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
            runtime: None,
            memo: None,
        }
    }

    /// `rank`'s static memory with its backward `split` or not, whether it is the first of its
    /// set of alike ranks asked for, and the index of that set (in the order the sets were
    /// first asked for).
    pub(super) fn indexed(&mut self, rank: usize, split: bool) -> (&RankStatic, bool, usize) {
        let (set, first) = self.set_of(rank, split);
        (&self.seen[set].1, first, set)
    }

    /// The total of `rank` under [`super::Pipeline::Inflight`] with `sets` live and its
    /// backward `split` or not, when it is the first of its set of alike ranks asked for (else
    /// `None`); `total` works it out from the rank's static memory where `memo` does not hold it.
    pub(super) fn inflight_total(
        &mut self,
        rank: usize,
        split: bool,
        sets: u32,
        total: impl FnOnce(&RankStatic) -> u64,
    ) -> Option<u64> {
        let (set, first) = self.set_of(rank, split);
        if !first {
            return None;
        }
        let (_, st, kept) = &self.seen[set];
        let Some((memo, i)) = self.memo.as_deref_mut().zip(*kept) else {
            return Some(total(st));
        };
        let known = &mut memo.kept[i].inflight;
        if let Some(&(_, bytes)) = known.iter().find(|(n, _)| *n == sets) {
            return Some(bytes);
        }
        let bytes = total(st);
        known.push((sets, bytes));
        Some(bytes)
    }

    /// The index of `rank`'s set of alike ranks in `seen` (worked out, or taken from `memo`,
    /// when it is the first of its set), and whether it is the first.
    fn set_of(&mut self, rank: usize, split: bool) -> (usize, bool) {
        let chunks = self.chunks;
        let ch = &chunks[rank];
        let handoff = hands_off(ch);
        let known = self
            .seen
            .iter()
            .position(|(k, st, _)| alike(st, split, handoff, &chunks[*k], ch));
        if let Some(i) = known {
            return (i, false);
        }
        let kept = match self.memo.as_deref().map(|m| m.position(ch, split, handoff)) {
            Some(Some(i)) => Some(i),
            Some(None) => {
                let st = self.work_out(ch, split);
                let m = self.memo.as_deref_mut().expect("a memo is given");
                m.kept.push(Kept {
                    chunks: ch.clone(),
                    st: Arc::new(st),
                    inflight: Vec::new(),
                });
                Some(m.kept.len() - 1)
            }
            None => None,
        };
        let st = match (kept, self.memo.as_deref()) {
            (Some(i), Some(m)) => Arc::clone(&m.kept[i].st),
            _ => Arc::new(self.work_out(ch, split)),
        };
        self.seen.push((rank, st, kept));
        (self.seen.len() - 1, true)
    }

    /// The static memory of a rank holding `chunks`, with the runtime lines worked out once
    /// for every rank (they depend on the layout alone, and walk its process groups).
    fn work_out(&mut self, chunks: &[ChunkContents], split: bool) -> RankStatic {
        let r = self.r;
        let runtime = match (self.runtime, self.memo.as_deref_mut()) {
            (Some(lines), _) => lines,
            (None, Some(m)) => *m.runtime.get_or_insert_with(|| RuntimeLines::of(r)),
            (None, None) => RuntimeLines::of(r),
        };
        self.runtime = Some(runtime);
        RankStatic::of(r, self.s, self.l, chunks, split, runtime)
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
