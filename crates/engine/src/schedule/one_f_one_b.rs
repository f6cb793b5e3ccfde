//! 1F1B, the PipeDream-Flush schedule (Narayanan et al. 2021, "Efficient Large-Scale Language
//! Model Training on GPU Clusters Using Megatron-LM", §2.2.1; Megatron-LM's
//! `forward_backward_pipelining_without_interleaving`).
//!
//! Rank i runs `p - i - 1` warm-up forwards, then alternates one forward and one backward, then
//! drains the remaining backwards. At most `p - i` activation sets are live on rank i, and the
//! bubble is the same (p-1)/m as GPipe's.

use super::action::{ActionKind, ComputeAction};

/// Rank programs for `pp` ranks and `m` microbatches (one stage per rank).
pub(super) fn ranks(pp: u32, m: u32) -> Vec<Vec<ComputeAction>> {
    (0..pp)
        .map(|r| {
            let warmup = (pp - r - 1).min(m);
            let mut v = Vec::with_capacity(2 * m as usize);
            v.extend((0..warmup).map(|mb| ComputeAction::new(ActionKind::F, r, mb)));
            for k in 0..m - warmup {
                v.push(ComputeAction::new(ActionKind::F, r, warmup + k));
                v.push(ComputeAction::new(ActionKind::B, r, k));
            }
            v.extend((m - warmup..m).map(|mb| ComputeAction::new(ActionKind::B, r, mb)));
            v
        })
        .collect()
}
