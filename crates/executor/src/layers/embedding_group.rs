//! Megatron's embedding group (`_EMBEDDING_GROUP`): a weight shared by the first and the last
//! pipeline stage (the word embedding tied to the output layer, GPT-2/3; a multi-token
//! prediction module's embedding and head, DeepSeek-V3) is held as one copy per block that
//! reads it, all copies starting equal (they are initialised from the same global tensor). At
//! the optimizer step every copy's gradient is replaced by the sum over all copies, on this rank
//! and over the group (the first- and last-stage ranks of this rank's TP/CP/DP position), so
//! every copy takes the same Adam update and stays equal to the single-tensor run's weight.
//!
//! Use: [`SharedWeight::new`] with the group's members ([`members`]) and the flat ranges (dense
//! space) of this rank's copies of one tensor ([`shared_embedding_copies`]), then
//! [`SharedWeight::sync_grads`] after the DP reduction of the gradients and before the
//! optimizer.

use super::blocks::{BlockKind, BlockLayout, LocalTensor, DENSE_SPACE};
use crate::backend::ops::*;
use crate::backend::{Backend, DeviceCollectives, ProcessGroup, ReduceOp, View, ViewMut};
use crate::error::ExecError;
use crate::traced_ops::TracedOps;
use crate::tracker::Category;
use parsim_plan::plan::{Plan, RankPlan};
use parsim_plan::GroupKind;
use std::ops::Range;

/// Members (global ranks, ascending, deduplicated) of the embedding group of a rank: the
/// ranks of its pipeline group that hold the first and the last stage. One member when both
/// stages sit on one rank (PP = 1, or the V schedules' ZB-V and DualPipe).
pub fn members(plan: &Plan, rp: &RankPlan) -> Vec<u32> {
    let first = plan.stages.first().map_or(0, |s| s.pp_rank) as usize;
    let last = plan.stages.last().map_or(0, |s| s.pp_rank) as usize;
    let pp_group = rp.groups.get(GroupKind::Pp);
    let mut m = vec![pp_group[first], pp_group[last]];
    m.sort_unstable();
    m.dedup();
    m
}

/// When one rank holds both the word table and the tied output layer (PP = 1, ZB-V, DualPipe;
/// or the last stage's copy for its MTP modules, [`BlockKind::MtpEmbedding`]), Megatron keeps
/// one tensor: the output block's range stretches over the embedding block's table (moving the
/// embedding block right after the output unless it is there already), its weight tensor
/// pointing at it. Both blocks then read the one table, and their gradients accumulate into it
/// (or into buckets of their own ranges under ZeRO 2/3).
pub fn alias_local_tied_output(blocks: &mut [BlockLayout]) {
    let find = |k: BlockKind| blocks.iter().position(|b| b.kind == k);
    let e = find(BlockKind::Embedding).or_else(|| find(BlockKind::MtpEmbedding));
    let (Some(e), Some(o)) = (e, find(BlockKind::Output)) else {
        return;
    };
    // Drop the output's own weight (its last tensor), then move the embedding to the end
    // unless it follows the output directly.
    let table = blocks[e].tensors[0].len();
    let out_end = blocks[o].range.end;
    shift_down(blocks, out_end, table);
    blocks[o].range.end -= table;
    if blocks[e].range.start != blocks[o].range.end {
        let emb = blocks[e].range.clone();
        let end = super::blocks::layout_len(blocks, DENSE_SPACE);
        shift_down(blocks, emb.end, emb.len());
        blocks[e].range = end - emb.len()..end;
    }
    let start = blocks[e].range.start;
    let out = &mut blocks[o];
    out.tensors[1].offset = start - out.range.start;
    out.range.end = start + table;
}

/// Moves every dense block starting at or after `from` down by `by` elements.
fn shift_down(blocks: &mut [BlockLayout], from: usize, by: usize) {
    for b in blocks.iter_mut().filter(|b| b.space == DENSE_SPACE) {
        if b.range.start >= from {
            b.range = b.range.start - by..b.range.end - by;
        }
    }
}

/// The flat ranges (dense space) of the shared embedding tensors' copies among `blocks`, one
/// list per shared tensor: the word table (the embedding block's and the MTP copy's tensor 0,
/// and the output block's weight, its tensor 1, when it is tied; one range when two are the
/// same tensor, [`alias_local_tied_output`]), then with multi-token prediction the learned
/// position table (tensor 1 of both embedding blocks). Every member of the embedding group
/// holds a copy of each, so all of them run the same reductions.
pub fn shared_embedding_copies(blocks: &[BlockLayout], mtp: bool) -> Vec<Vec<Range<usize>>> {
    let range = |b: &BlockLayout, t: &LocalTensor| {
        b.range.start + t.offset..b.range.start + t.offset + t.len()
    };
    let is_embedding =
        |b: &BlockLayout| matches!(b.kind, BlockKind::Embedding | BlockKind::MtpEmbedding);
    let mut word: Vec<Range<usize>> = blocks
        .iter()
        .filter_map(|b| {
            let t = match b.kind {
                BlockKind::Embedding | BlockKind::MtpEmbedding => &b.tensors[0],
                BlockKind::Output => &b.tensors[1],
                _ => return None,
            };
            let tied = t.segments.iter().all(|s| s.name == "embedding.weight");
            tied.then(|| range(b, t))
        })
        .collect();
    word.sort_by_key(|r| r.start);
    word.dedup();
    let mut out = vec![word];
    if mtp {
        let positions: Vec<Range<usize>> = blocks
            .iter()
            .filter(|b| is_embedding(b))
            .filter_map(|b| b.tensors.get(1).map(|t| range(b, t)))
            .collect();
        if !positions.is_empty() {
            out.push(positions);
        }
    }
    out
}

/// A weight shared over the embedding group: this rank's copies and the group.
pub struct SharedWeight<B: Backend> {
    /// The group (`None`: this rank is its only member).
    group: Option<B::Group>,
    /// Flat ranges of this rank's copies (dense space), all of one length.
    copies: Vec<Range<usize>>,
}

/// Where this rank's gradients of the dense space lie.
pub struct GradShard<'a, B: Backend> {
    pub grads: &'a mut B::Tensor,
    /// The flat range whose sums are valid in `grads` (all of it without ZeRO, else the shard).
    pub valid: Range<usize>,
    /// Flat index of `grads[0]` (0 when the buffer is whole, the shard's start under ZeRO 2/3).
    pub base: usize,
    /// The DP x CP group that shards the buffer (`None`: every gradient is whole here).
    pub dp_cp: Option<&'a B::Group>,
}

fn intersect(a: &Range<usize>, b: &Range<usize>) -> Range<usize> {
    a.start.max(b.start)..a.end.min(b.end).max(a.start.max(b.start))
}

impl<B: Backend> SharedWeight<B> {
    /// The shared weight of this rank (`None` when it holds no copy); `members` from
    /// [`members`]. Copies must all have the same length.
    pub fn new(
        comm: &impl DeviceCollectives<B>,
        members: &[u32],
        copies: Vec<Range<usize>>,
    ) -> Result<Option<SharedWeight<B>>, ExecError> {
        // Nothing to share: no copy here, or the one tensor of a rank holding both ends.
        if copies.is_empty() || (copies.len() == 1 && members.len() == 1) {
            return Ok(None);
        }
        let group = if members.len() > 1 {
            Some(comm.group(members)?)
        } else {
            None
        };
        Ok(Some(SharedWeight { group, copies }))
    }

    /// Each copy's part within `valid` (the flat range whose sums are valid in a gradient
    /// buffer starting at flat index `base`): (offset in the buffer, offset in the copy, length).
    fn valid_parts(&self, valid: &Range<usize>, base: usize) -> Vec<(usize, usize, usize)> {
        self.copies
            .iter()
            .filter_map(|c| {
                let part = intersect(c, valid);
                (!part.is_empty()).then(|| (part.start - base, part.start - c.start, part.len()))
            })
            .collect()
    }

    /// Replaces every copy's gradient by the sum over all copies (here and over the group),
    /// after the DP x CP reduction: under ZeRO each member holds the sums of its shard only, so
    /// the copies are first assembled by an all-reduce over DP x CP of the valid parts.
    pub fn sync_grads(
        &self,
        ops: &TracedOps<B>,
        comm: &impl DeviceCollectives<B>,
        g: GradShard<'_, B>,
    ) -> Result<(), ExecError> {
        let len = self.copies[0].len();
        let mut sum = super::ctx::zeros::<B>(ops, Category::Buffers, &[len])?;
        let parts = self.valid_parts(&g.valid, g.base);
        for &(gi, ci, n) in &parts {
            ops.axpy(
                1.0,
                View::all(&*g.grads).sub(gi..gi + n),
                ViewMut::all(&mut sum).sub(ci..ci + n),
            )?;
        }
        if let Some(dp_cp) = g.dp_cp.filter(|d| d.size() > 1) {
            comm.all_reduce(dp_cp, ViewMut::all(&mut sum), ReduceOp::Sum)?;
        }
        if let Some(group) = &self.group {
            comm.all_reduce(group, ViewMut::all(&mut sum), ReduceOp::Sum)?;
        }
        for &(gi, ci, n) in &parts {
            ops.copy(
                View::all(&sum).sub(ci..ci + n),
                ViewMut::all(&mut *g.grads).sub(gi..gi + n),
            )?;
        }
        Ok(())
    }
}
