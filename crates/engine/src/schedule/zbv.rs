//! ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §6): two chunks per rank in a V,
//! rank r holding stages r and 2p-1-r, the backward split into I and W.
//!
//! Order as PyTorch's `ScheduleZBVZeroBubble`: `2(p-r)-1` forwards of chunk 0, then `r`
//! pairs (F chunk 1, F chunk 0), then `p-r` triples (F, I, W of chunk 1); the steady state
//! alternates F/I/W of chunk 0 and chunk 1; the cool-down runs `r` pairs of I, then `p-r`
//! (I, W) pairs of chunk 0, then the pending W passes. The order is built for
//! `max(2p-1, m)` microbatches and the ones past m are dropped, as PyTorch does. With m >= 2p
//! every rank peaks at 2p live chunk activations, i.e. p stage-sized sets: the paper's "same
//! peak memory as 1F1B".

use super::action::{ActionKind, ComputeAction};

/// Rank programs for `pp` ranks and `m` microbatches (two chunks per rank).
pub(super) fn ranks(pp: u32, m: u32) -> Vec<Vec<ComputeAction>> {
    let n = m.max(2 * pp - 1);
    (0..pp)
        .map(|r| {
            let s0 = r;
            let s1 = 2 * pp - 1 - r;
            let mut v: Vec<ComputeAction> = Vec::with_capacity(6 * m as usize);
            let (mut f0, mut f1, mut b0, mut b1) = (0u32, 0u32, 0u32, 0u32);
            let push = |v: &mut Vec<ComputeAction>, kind, stage, mb: u32| {
                if mb < m {
                    v.push(ComputeAction::new(kind, stage, mb));
                }
            };
            for _ in 0..2 * (pp - r) - 1 {
                push(&mut v, ActionKind::F, s0, f0);
                f0 += 1;
            }
            for _ in 0..r {
                push(&mut v, ActionKind::F, s1, f1);
                f1 += 1;
                push(&mut v, ActionKind::F, s0, f0);
                f0 += 1;
            }
            for _ in 0..pp - r {
                push(&mut v, ActionKind::F, s1, f1);
                f1 += 1;
                push(&mut v, ActionKind::I, s1, b1);
                push(&mut v, ActionKind::W, s1, b1);
                b1 += 1;
            }
            while f1 < f0 || f0 < n {
                if f0 < n {
                    push(&mut v, ActionKind::F, s0, f0);
                    f0 += 1;
                }
                push(&mut v, ActionKind::I, s0, b0);
                push(&mut v, ActionKind::W, s0, b0);
                b0 += 1;
                push(&mut v, ActionKind::F, s1, f1);
                f1 += 1;
                push(&mut v, ActionKind::I, s1, b1);
                push(&mut v, ActionKind::W, s1, b1);
                b1 += 1;
            }
            let (mut w0, mut w1) = (b0, b1);
            for _ in 0..r {
                push(&mut v, ActionKind::I, s0, b0);
                b0 += 1;
                push(&mut v, ActionKind::I, s1, b1);
                b1 += 1;
            }
            for _ in 0..pp - r {
                push(&mut v, ActionKind::I, s0, b0);
                b0 += 1;
                push(&mut v, ActionKind::W, s0, w0);
                w0 += 1;
            }
            while w1 < b1 {
                push(&mut v, ActionKind::W, s1, w1);
                w1 += 1;
            }
            while w0 < b0 {
                push(&mut v, ActionKind::W, s0, w0);
                w0 += 1;
            }
            v
        })
        .collect()
}
