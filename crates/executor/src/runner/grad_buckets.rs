//! ZeRO 0/1 gradient buckets reduced during the last microbatch's backward, as Megatron-Core's
//! DDP with `overlap_grad_reduce` (its `_ParamAndGradBuffer` and `finish_grad_sync`): each
//! stage's (model chunk's) blocks of one space are cut, walking back from the stage's last
//! block, into buckets closed once they hold at least `parallel.grad_bucket_params`
//! parameters; a block (a layer, the embedding, the output) is never split. In the action
//! after which a stage's gradients are final (its last backward, or its last W under split
//! backward) a bucket is reduced as soon as the backward of every block in it is done:
//! all-reduce under ZeRO 0, reduce-scatter under ZeRO 1, over the space's group
//! ([`crate::backend::DeviceCollectives::reduce_grad_bucket`], which a device may overlap with
//! the backward still running). The optimizer step joins them, then sums the sequence-parallel
//! norm partials over TP as Megatron's `finalize_model_grads` does after the DP sync.

use crate::error::ExecError;
use crate::layers::blocks::BlockLayout;
use parsim_plan::plan::Action;
use std::collections::{HashMap, HashSet};
use std::ops::Range;

/// One bucket: a contiguous range of a space's flat buffer and the blocks it holds.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Bucket {
    pub(super) space: usize,
    pub(super) range: Range<usize>,
    pub(super) blocks: Vec<usize>,
}

/// Cuts the blocks `stage_blocks` of `space` into buckets of at least `params` parameters,
/// walking back from the last block (the order backward produces them); the last bucket
/// takes what is left. Empty blocks join a bucket but never close one.
pub(super) fn cut(
    blocks: &[BlockLayout],
    stage_blocks: Range<usize>,
    space: usize,
    params: usize,
) -> Vec<Bucket> {
    let mut out = Vec::new();
    let mut cur: Option<Bucket> = None;
    for bi in stage_blocks.rev().filter(|&b| blocks[b].space == space) {
        let r = blocks[bi].range.clone();
        let b = cur.get_or_insert_with(|| Bucket {
            space,
            range: r.clone(),
            blocks: Vec::new(),
        });
        // Walking back, each block lies just below the bucket: the range grows downwards.
        b.range = r.start.min(b.range.start)..r.end.max(b.range.end);
        b.blocks.push(bi);
        if b.range.len() >= params {
            out.extend(cur.take());
        }
    }
    out.extend(cur.filter(|b| !b.range.is_empty()));
    out
}

/// For each stage, the index in `actions` of the action after which its weight gradients
/// are final: its last full backward or its last W.
pub(super) fn final_actions(actions: &[Action]) -> HashMap<u32, usize> {
    let mut out = HashMap::new();
    for (i, a) in actions.iter().enumerate() {
        if let Action::Backward { stage, .. } | Action::BackwardWeight { stage, .. } = a {
            out.insert(*stage, i);
        }
    }
    out
}

/// A rank's buckets and what of them this step has issued.
pub(super) struct GradBuckets {
    /// Per stage, its buckets in backward order, each with whether it was issued this step.
    by_stage: HashMap<u32, Vec<(Bucket, bool)>>,
    final_action: HashMap<u32, usize>,
    /// Blocks whose gradients are final this step.
    done: HashSet<usize>,
}

impl GradBuckets {
    /// The buckets of `spaces` over `stage_blocks` (stage -> its block range), issued in the
    /// final actions of `actions`.
    pub(super) fn new(
        blocks: &[BlockLayout],
        stage_blocks: &HashMap<u32, Range<usize>>,
        spaces: &[usize],
        params: usize,
        actions: &[Action],
    ) -> GradBuckets {
        let by_stage = stage_blocks
            .iter()
            .map(|(&s, r)| {
                let mut list: Vec<Bucket> = spaces
                    .iter()
                    .flat_map(|&sp| cut(blocks, r.clone(), sp, params))
                    .collect();
                // Backward order over both spaces: the bucket whose lowest block the backward
                // reaches first goes first.
                list.sort_by_key(|b| std::cmp::Reverse(b.blocks.iter().min().copied()));
                (s, list.into_iter().map(|b| (b, false)).collect())
            })
            .collect();
        GradBuckets {
            by_stage,
            final_action: final_actions(actions),
            done: HashSet::new(),
        }
    }

    /// Whether action `index` is the one after which stage `stage`'s gradients are final.
    pub(super) fn finalizing(&self, stage: u32, index: usize) -> bool {
        self.final_action.get(&stage) == Some(&index)
    }

    /// Marks `blocks` final and hands out (marking them issued) stage `stage`'s buckets now
    /// complete, in order; with `all`, every bucket of the stage not issued yet.
    pub(super) fn ready(&mut self, stage: u32, blocks: &[usize], all: bool) -> Vec<Bucket> {
        self.done.extend(blocks.iter().copied());
        let done = &self.done;
        let mut out = Vec::new();
        for (b, issued) in self.by_stage.get_mut(&stage).into_iter().flatten() {
            if !*issued && (all || b.blocks.iter().all(|x| done.contains(x))) {
                *issued = true;
                out.push(b.clone());
            }
        }
        out
    }

    /// Ends the step: every bucket must have been issued (else the optimizer would read an
    /// unreduced gradient); all are reset for the next step.
    pub(super) fn end_step(&mut self) -> Result<(), ExecError> {
        let missing: Vec<u32> = self
            .by_stage
            .iter()
            .filter(|(_, l)| l.iter().any(|(_, issued)| !issued))
            .map(|(&s, _)| s)
            .collect();
        for (_, issued) in self.by_stage.values_mut().flatten() {
            *issued = false;
        }
        self.done.clear();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(ExecError::from(
                crate::error::StateError::GradBucketsNotIssued(missing),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::blocks::BlockKind;

    fn block(kind: BlockKind, space: usize, range: Range<usize>) -> BlockLayout {
        BlockLayout {
            kind,
            stage: 0,
            space,
            range,
            tensors: Vec::new(),
        }
    }

    /// Embedding 0..10, layers of 30 at 10..40, 40..70, 70..100, an experts block (space 1)
    /// beside the last layer, the output 100..105.
    fn blocks() -> Vec<BlockLayout> {
        vec![
            block(BlockKind::Embedding, 0, 0..10),
            block(BlockKind::Layer(0), 0, 10..40),
            block(BlockKind::Layer(1), 0, 40..70),
            block(BlockKind::Layer(2), 0, 70..100),
            block(BlockKind::Experts(2), 1, 0..50),
            block(BlockKind::Output, 0, 100..105),
        ]
    }

    #[test]
    fn buckets_close_once_they_reach_the_size_walking_back() {
        let b = blocks();
        // 60: output + layer 2 = 35, + layer 1 = 65 closes; layer 0 + embedding = 40 is left.
        let got: Vec<(Range<usize>, Vec<usize>)> = cut(&b, 0..6, 0, 60)
            .into_iter()
            .map(|b| (b.range, b.blocks))
            .collect();
        assert_eq!(got, vec![(40..105, vec![5, 3, 2]), (0..40, vec![1, 0])]);
        // One parameter: a bucket per block; a huge size: one bucket for the stage.
        assert_eq!(cut(&b, 0..6, 0, 1).len(), 5);
        let one = cut(&b, 0..6, 0, usize::MAX);
        assert_eq!((one.len(), one[0].range.clone()), (1, 0..105));
        // The experts' space alone.
        assert_eq!(cut(&b, 0..6, 1, 60)[0].blocks, vec![4]);
    }

    #[test]
    fn a_bucket_is_ready_once_all_its_blocks_are_final_in_the_final_action() {
        let b = blocks();
        let stages = HashMap::from([(0u32, 0..6)]);
        let actions = [
            Action::Backward { stage: 0, mb: 0 },
            Action::Backward { stage: 0, mb: 1 },
            Action::OptimizerStep,
        ];
        let mut g = GradBuckets::new(&b, &stages, &[0, 1], 60, &actions);
        assert!(!g.finalizing(0, 0) && g.finalizing(0, 1));
        assert!(g.ready(0, &[5], false).is_empty());
        // Layer 2 with its experts: the experts' bucket is complete, the dense one not yet.
        let r = g.ready(0, &[3, 4], false);
        assert_eq!(r.iter().map(|b| b.space).collect::<Vec<_>>(), vec![1]);
        let r = g.ready(0, &[2], false);
        assert_eq!(
            r.iter().map(|b| b.range.clone()).collect::<Vec<_>>(),
            vec![40..105]
        );
        // A step ending with a bucket not issued is an error, and resets.
        assert!(g.end_step().is_err());
        assert_eq!(g.ready(0, &[], true).len(), 3);
        assert!(g.end_step().is_ok());
    }

    #[test]
    fn the_last_backward_or_w_of_each_stage_is_final() {
        let a = [
            Action::BackwardInput { stage: 1, mb: 0 },
            Action::BackwardWeight { stage: 1, mb: 0 },
            Action::Backward { stage: 0, mb: 0 },
            Action::BackwardInput { stage: 1, mb: 1 },
            Action::BackwardWeight { stage: 1, mb: 1 },
            Action::Backward { stage: 0, mb: 1 },
            Action::OptimizerStep,
        ];
        assert_eq!(final_actions(&a), HashMap::from([(1, 4), (0, 5)]));
    }
}
