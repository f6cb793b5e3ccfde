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
///
/// The order is PyTorch's over `max(2p-1, m)` microbatches; a phase whose counters have all
/// passed `m` pushes nothing, so it is skipped by moving its counters on (the work stays
/// O(pp x m), also where pp is far above m).
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
            // Iterations of a phase of `k` whose counters start at `lows` that can still push.
            let live = |k: u32, lows: &[u32]| {
                let low = lows.iter().copied().min().unwrap_or(m);
                k.min(m.saturating_sub(low))
            };
            let k = 2 * (pp - r) - 1;
            for i in 0..live(k, &[f0]) {
                push(&mut v, ActionKind::F, s0, f0 + i);
            }
            f0 += k;
            for i in 0..live(r, &[f0, f1]) {
                push(&mut v, ActionKind::F, s1, f1 + i);
                push(&mut v, ActionKind::F, s0, f0 + i);
            }
            (f0, f1) = (f0 + r, f1 + r);
            for i in 0..live(pp - r, &[f1, b1]) {
                push(&mut v, ActionKind::F, s1, f1 + i);
                push(&mut v, ActionKind::I, s1, b1 + i);
                push(&mut v, ActionKind::W, s1, b1 + i);
            }
            (f1, b1) = (f1 + pp - r, b1 + pp - r);
            while f1 < f0 || f0 < n {
                if f0.min(f1).min(b0).min(b1) >= m {
                    // Nothing below pushes again: every later counter starts at b0 or b1.
                    return v;
                }
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
            let (w0, w1) = (b0, b1);
            for i in 0..live(r, &[b0, b1]) {
                push(&mut v, ActionKind::I, s0, b0 + i);
                push(&mut v, ActionKind::I, s1, b1 + i);
            }
            (b0, b1) = (b0 + r, b1 + r);
            for i in 0..live(pp - r, &[b0, w0]) {
                push(&mut v, ActionKind::I, s0, b0 + i);
                push(&mut v, ActionKind::W, s0, w0 + i);
            }
            let w0 = w0 + (pp - r);
            b0 += pp - r;
            for mb in w1..b1.min(m) {
                push(&mut v, ActionKind::W, s1, mb);
            }
            for mb in w0..b0.min(m) {
                push(&mut v, ActionKind::W, s0, mb);
            }
            v
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order as PyTorch builds it: every phase run over all `max(2p-1, m)` microbatches,
    /// pushing those below m (the implementation before the skipped phases).
    fn in_full(pp: u32, m: u32) -> Vec<Vec<ComputeAction>> {
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

    /// Skipping the phases that push nothing leaves every rank's program as it was, for
    /// microbatch counts below, at and above 2p - 1.
    #[test]
    fn skipped_phases_change_no_program() {
        for pp in 1..=12 {
            for m in 1..=3 * pp + 2 {
                assert_eq!(ranks(pp, m), in_full(pp, m), "pp {pp}, m {m}");
            }
        }
    }
}
