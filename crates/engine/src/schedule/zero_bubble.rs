//! ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §3.1; the "ZB1P" row of the
//! DualPipe README): 1F1B with the backward split into I (input gradient) and W (weight
//! gradient), the W passes moved into the bubbles.
//!
//! Construction as PyTorch's `ScheduleInterleavedZeroBubble` with one stage per rank: rank r
//! runs `p - r - 1` warm-up forwards, then steps of F and I; from the `r`-th step on each step
//! also runs the oldest pending W; the cool-down runs I (and, past step r, a W), and the W
//! passes still pending close the step. With F = I = W and free communication the bubble is
//! (p-1)(F + B - 2W) = (p-1)(F + I - W), a third of 1F1B's.
//!
//! Activation memory: the paper bounds the *largest* rank's live microbatches by p, the same
//! as 1F1B's rank 0. Counting an activation set as live until its W (the definition used in
//! this crate), the `r` W passes that rank r postpones keep `p` sets live on every rank, not
//! `p - r` as in 1F1B.

use super::action::{ActionKind, ComputeAction};

/// Rank programs for `pp` ranks and `m` microbatches (one stage per rank).
pub(super) fn ranks(pp: u32, m: u32) -> Vec<Vec<ComputeAction>> {
    (0..pp)
        .map(|r| {
            let warmup = (pp - r - 1).min(m);
            let mut v = Vec::with_capacity(3 * m as usize);
            let mut next_w = 0u32;
            v.extend((0..warmup).map(|mb| ComputeAction::new(ActionKind::F, r, mb)));
            for op in warmup..m + warmup {
                if op < m {
                    v.push(ComputeAction::new(ActionKind::F, r, op));
                }
                let k = op - warmup;
                v.push(ComputeAction::new(ActionKind::I, r, k));
                if k >= r {
                    v.push(ComputeAction::new(ActionKind::W, r, next_w));
                    next_w += 1;
                }
            }
            v.extend((next_w..m).map(|mb| ComputeAction::new(ActionKind::W, r, mb)));
            v
        })
        .collect()
}
