//! A rank's allocations and frees in the order a PyTorch framework makes them, from the op
//! ledger, for the caching allocator ([`super::caching_allocator`]): what it reserves beyond
//! what is allocated at once, the blocks a kept tensor pins inside a segment that transients
//! freed being the fragmentation a run of many microbatches builds up.
//!
//! One microbatch's forward runs the rank's blocks in order. A layer under full recompute
//! runs without autograd (Megatron-LM's and DeepSpeed's `CheckpointFunction`): each op's
//! tensors (the ledger's saved set stands for what an op produces for the next) are freed once
//! the next op has run, its transient right after itself, and only the layer's output, the next
//! layer's kept input, stays. Any other block keeps its saved set until its backward. The
//! backward runs the blocks in reverse: a recomputed layer first rebuilds its saved set, then
//! each op, last to first, allocates its input gradient (the size of the float tensors it
//! saved) and frees its saved tensors and the gradient it consumed. Each weight gradient is a
//! fresh tensor: the first microbatch's becomes `.grad` (autograd's `AccumulateGrad` steals
//! it) and lives to the step; later ones are added in and freed. The step then allocates the
//! framework's buffers in order, and `zero_grad(set_to_none=True)` frees every `.grad`
//! (DeepSpeed's ZeRO-1/2 `zero_grad`, deepspeed/runtime/zero/stage_1_and_2.py).

use super::allocator::StepAlloc;
use super::caching_allocator::CachingAllocator;
use crate::config::Recompute;
use crate::model::{Block, ChunkContents, Ledger, TensorRole};
use crate::schedule::{ActionKind, ComputeAction};
use std::sync::Mutex;

/// One event of a microbatch's (or the step's) sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Alloc {
        id: u32,
        bytes: u64,
    },
    Free {
        id: u32,
    },
    /// A weight gradient of `bytes` for parameter `param`.
    WeightGrad {
        param: u32,
        bytes: u64,
    },
}

/// The events of one rank: a microbatch's forward and backward (one id space: what the
/// forward keeps, the backward frees), and the step's.
#[derive(Debug, Default)]
pub struct RankTrace {
    forward: Vec<Event>,
    backward: Vec<Event>,
    step: Vec<Event>,
    /// The largest event id and parameter number.
    ids: u32,
    params: u32,
    /// Replays already run.
    replays: Mutex<Vec<Replayed>>,
}

/// What the trace reads of the rank beyond its ledger blocks.
#[derive(Debug, Clone, Copy)]
pub struct TraceInputs {
    pub recompute: Recompute,
    pub grad_bytes: u64,
    /// The residual stream's bytes: a block's output and the gradient flowing between blocks.
    pub residual_bytes: u64,
    /// What a microbatch keeps beside its blocks' tensors on a chunk that is not the last
    /// (DeepSpeed's partitioned stage output) and not the first (its received input).
    pub kept_output: u64,
    pub kept_input: u64,
}

/// A replay already run: its order of forwards (true) and backwards, its steps, and its
/// (peak reserved, peak allocated) bytes.
type Replayed = (Vec<bool>, u32, (u64, u64));

/// Builds the events, assigning ids.
#[derive(Default)]
struct Builder {
    next: u32,
    params: u32,
}

impl Builder {
    fn alloc(&mut self, to: &mut Vec<Event>, bytes: u64) -> Option<u32> {
        (bytes > 0).then(|| {
            self.next += 1;
            to.push(Event::Alloc {
                id: self.next,
                bytes,
            });
            self.next
        })
    }
}

fn free(to: &mut Vec<Event>, id: Option<u32>) {
    if let Some(id) = id {
        to.push(Event::Free { id });
    }
}

/// The float tensors an op saved, which its backward differentiates: its input gradient's size.
fn grad_in_bytes(op: &crate::model::Op) -> u64 {
    op.saved
        .iter()
        .filter(|s| {
            !matches!(
                s.role,
                TensorRole::DropoutMask | TensorRole::SoftmaxLse | TensorRole::Routing
            )
        })
        .map(|s| s.bytes)
        .sum()
}

/// Plays `events` on `alloc`: `live` holds the sequence's blocks by id, `grads` each
/// parameter's `.grad`.
fn run(
    events: &[Event],
    live: &mut [Option<u64>],
    grads: &mut [Option<u64>],
    alloc: &mut CachingAllocator,
) {
    for e in events {
        match *e {
            Event::Alloc { id, bytes } => live[id as usize] = Some(alloc.malloc(bytes)),
            Event::Free { id } => {
                if let Some(a) = live[id as usize].take() {
                    alloc.free(a);
                }
            }
            Event::WeightGrad { param, bytes } => {
                let a = alloc.malloc(bytes);
                match grads[param as usize] {
                    Some(_) => alloc.free(a),
                    None => grads[param as usize] = Some(a),
                }
            }
        }
    }
}

impl RankTrace {
    /// The trace of a rank of the one chunk `chunk` of ledger `l`; the step allocates `step`.
    pub fn of(l: &Ledger, chunk: &ChunkContents, t: TraceInputs, step: &[StepAlloc]) -> Self {
        let mut b = Builder::default();
        let mut tr = RankTrace::default();
        let blocks: Vec<&Block> = chunk
            .ledger_blocks(l)
            .flat_map(|(blk, n)| std::iter::repeat_n(blk, n as usize))
            .collect();
        // Per block: its kept input (a recomputed layer) or its saved tensors (others).
        let mut kept: Vec<(Option<u32>, Vec<Option<u32>>)> = Vec::new();
        let kept_input = b.alloc(&mut tr.forward, t.kept_input);
        let mut flowing = b.alloc(&mut tr.forward, t.residual_bytes);
        for blk in &blocks {
            let recomputed = t.recompute == Recompute::Full && blk.is_layer();
            let mut saved = Vec::new();
            let mut previous: Vec<Option<u32>> = Vec::new();
            for op in &blk.ops {
                let outs: Vec<Option<u32>> = op
                    .saved
                    .iter()
                    .map(|s| b.alloc(&mut tr.forward, s.bytes))
                    .collect();
                let temp = b.alloc(&mut tr.forward, op.temp_bytes);
                free(&mut tr.forward, temp);
                if recomputed {
                    for id in previous.drain(..) {
                        free(&mut tr.forward, id);
                    }
                    previous = outs;
                } else {
                    saved.extend(outs);
                }
            }
            for id in previous {
                free(&mut tr.forward, id);
            }
            if recomputed {
                // The layer keeps its input; its output flows on.
                kept.push((flowing, Vec::new()));
                flowing = b.alloc(&mut tr.forward, t.residual_bytes);
            } else {
                kept.push((None, saved));
            }
        }
        let kept_output = b.alloc(&mut tr.forward, t.kept_output);
        free(&mut tr.forward, flowing);

        // Backward: the output's gradient, then the blocks in reverse.
        let mut grad = b.alloc(&mut tr.backward, t.residual_bytes);
        for (blk, (input, saved)) in blocks.iter().zip(kept).rev() {
            let recomputed = input.is_some();
            let mut saved_by_op: Vec<Vec<Option<u32>>> = Vec::new();
            let mut forward_saved = saved.into_iter();
            for op in &blk.ops {
                let ids: Vec<Option<u32>> = if recomputed {
                    let ids = op
                        .saved
                        .iter()
                        .map(|s| b.alloc(&mut tr.backward, s.bytes))
                        .collect();
                    let temp = b.alloc(&mut tr.backward, op.temp_bytes);
                    free(&mut tr.backward, temp);
                    ids
                } else {
                    forward_saved.by_ref().take(op.saved.len()).collect()
                };
                saved_by_op.push(ids);
            }
            for (op, ids) in blk.ops.iter().zip(saved_by_op).rev() {
                let scratch = b.alloc(&mut tr.backward, op.backward_scratch_bytes);
                let grad_in = b.alloc(&mut tr.backward, grad_in_bytes(op));
                if let Some(p) = op.params.filter(|p| p.trainable && p.rank > 0) {
                    b.params += 1;
                    tr.backward.push(Event::WeightGrad {
                        param: b.params,
                        bytes: p.rank * t.grad_bytes,
                    });
                }
                free(&mut tr.backward, scratch);
                for id in ids {
                    free(&mut tr.backward, id);
                }
                if grad_in.is_some() {
                    free(&mut tr.backward, grad);
                    grad = grad_in;
                }
            }
            free(&mut tr.backward, input);
        }
        free(&mut tr.backward, grad);
        free(&mut tr.backward, kept_output);
        free(&mut tr.backward, kept_input);

        let mut held = Vec::new();
        for a in step {
            let id = b.alloc(&mut tr.step, a.bytes);
            if a.kept {
                held.push(id);
            } else {
                free(&mut tr.step, id);
            }
        }
        for id in held {
            free(&mut tr.step, id);
        }
        tr.ids = b.next;
        tr.params = b.params;
        tr
    }

    /// The allocator's (peak reserved, peak allocated) bytes over `iterations` steps of
    /// `actions` (whole forwards and backwards of the rank's one chunk; `None` for a split
    /// backward, which the trace does not follow). A step runs its first `in-flight + 2`
    /// microbatches: past them the steady state only repeats what the allocator has cached
    /// (the BLOOM tr11 rows' figures are the same with twice as many). Replays are kept by
    /// the order of forwards and backwards they ran.
    pub fn replay(&self, actions: &[ComputeAction], iterations: u32) -> Option<(u64, u64)> {
        if actions
            .iter()
            .any(|a| !matches!(a.kind, ActionKind::F | ActionKind::B))
        {
            return None;
        }
        let mut live = 0u32;
        let mut most = 0u32;
        for a in actions {
            if a.kind == ActionKind::F {
                live += 1;
                most = most.max(live);
            } else {
                live = live.saturating_sub(1);
            }
        }
        let cap = most + 2;
        let order: Vec<bool> = actions
            .iter()
            .filter(|a| a.microbatch < cap)
            .map(|a| a.kind == ActionKind::F)
            .collect();
        let mut replays = self.replays.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, peaks)) = replays
            .iter()
            .find(|(o, n, _)| *o == order && *n == iterations)
        {
            return Some(*peaks);
        }
        let mut alloc = CachingAllocator::new();
        // Each microbatch's (and the step's, the last) live blocks by id, and `.grad` by
        // parameter; ids count up from 1 across the sequences.
        let ids = self.ids as usize + 1;
        let mut addrs: Vec<Vec<Option<u64>>> = vec![vec![None; ids]; cap as usize + 1];
        let mut grads: Vec<Option<u64>> = vec![None; self.params as usize + 1];
        for _ in 0..iterations {
            for a in actions.iter().filter(|a| a.microbatch < cap) {
                let events = if a.kind == ActionKind::F {
                    &self.forward
                } else {
                    &self.backward
                };
                let live = &mut addrs[a.microbatch as usize];
                run(events, live, &mut grads, &mut alloc);
            }
            run(&self.step, &mut addrs[cap as usize], &mut grads, &mut alloc);
            for a in grads.iter_mut().filter_map(Option::take) {
                alloc.free(a);
            }
        }
        let peaks = (alloc.peak_reserved_bytes, alloc.peak_allocated_bytes);
        replays.push((order, iterations, peaks));
        Some(peaks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A microbatch whose forward frees a 256 MiB transient and keeps a 224 MiB tensor until
    /// its backward, which makes a 16 MiB weight gradient first.
    fn trace() -> RankTrace {
        RankTrace {
            forward: vec![
                Event::Alloc {
                    id: 1,
                    bytes: 256 * MIB,
                },
                Event::Free { id: 1 },
                Event::Alloc {
                    id: 2,
                    bytes: 224 * MIB,
                },
            ],
            backward: vec![
                Event::WeightGrad {
                    param: 1,
                    bytes: 16 * MIB,
                },
                Event::Free { id: 2 },
            ],
            ids: 2,
            params: 1,
            ..RankTrace::default()
        }
    }

    fn actions(kinds: &[(ActionKind, u32)]) -> Vec<ComputeAction> {
        kinds
            .iter()
            .map(|&(k, mb)| ComputeAction::new(k, 0, mb))
            .collect()
    }

    /// Traced by hand: F0 takes a 256 MiB segment, frees it, and keeps 224 MiB of it (32 MiB
    /// split off). F1's 256 MiB fits nowhere: a second segment, 512 MiB reserved, 224 + 256
    /// allocated; it keeps 224 MiB there too. B0's gradient (16 MiB) takes the lower 32 MiB
    /// remainder and stays as `.grad`; B1's is freed after its use. Allocated at most 480 MiB.
    #[test]
    fn a_kept_tensor_carved_from_a_freed_transient_takes_a_second_segment() {
        let f = |mb| (ActionKind::F, mb);
        let b = |mb| (ActionKind::B, mb);
        let t = trace();
        let peaks = t.replay(&actions(&[f(0), f(1), b(0), b(1)]), 1);
        assert_eq!(peaks, Some((512 * MIB, 480 * MIB)));
        // One microbatch at a time still takes two segments: B0's `.grad` stays in the first
        // segment's remainder, so the freed 224 MiB cannot merge back into 256 MiB for F1's
        // transient. Allocated at most F1's 256 MiB beside the 16 MiB gradient.
        let one = t.replay(&actions(&[f(0), b(0), f(1), b(1)]), 1);
        assert_eq!(one, Some((512 * MIB, 272 * MIB)));
        // A second step reuses the segments: nothing more reserved.
        let twice = t.replay(&actions(&[f(0), f(1), b(0), b(1)]), 2);
        assert_eq!(twice, Some((512 * MIB, 480 * MIB)));
    }

    /// Only the first in-flight + 2 microbatches run (here 1 + 2), and a split backward is not
    /// followed.
    #[test]
    fn replays_cut_the_steady_state_and_refuse_a_split_backward() {
        let t = trace();
        let long: Vec<(ActionKind, u32)> = (0..50)
            .flat_map(|mb| [(ActionKind::F, mb), (ActionKind::B, mb)])
            .collect();
        assert_eq!(t.replay(&actions(&long), 1), Some((512 * MIB, 272 * MIB)));
        let first_three: Vec<(ActionKind, u32)> = long[..6].to_vec();
        assert_eq!(
            t.replay(&actions(&long), 1),
            t.replay(&actions(&first_three), 1)
        );
        let split = actions(&[(ActionKind::F, 0), (ActionKind::I, 0), (ActionKind::W, 0)]);
        assert_eq!(t.replay(&split, 1), None);
    }
}
