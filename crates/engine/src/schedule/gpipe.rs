//! GPipe (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using
//! Pipeline Parallelism"): every rank runs all its forwards, then all its backwards.
//!
//! Backwards run in microbatch order 0..m, as PyTorch's `ScheduleGPipe` does. Every rank holds
//! all m activation sets at the turn, and the bubble is (p-1)/m of the ideal time when F = B
//! and communication is free (Narayanan et al. 2021, §2.2.1).

use super::action::{ActionKind, ComputeAction};

/// Rank programs for `pp` ranks and `m` microbatches (one stage per rank).
pub(super) fn ranks(pp: u32, m: u32) -> Vec<Vec<ComputeAction>> {
    (0..pp)
        .map(|r| {
            let mut v = Vec::with_capacity(2 * m as usize);
            v.extend((0..m).map(|mb| ComputeAction::new(ActionKind::F, r, mb)));
            v.extend((0..m).map(|mb| ComputeAction::new(ActionKind::B, r, mb)));
            v
        })
        .collect()
}
