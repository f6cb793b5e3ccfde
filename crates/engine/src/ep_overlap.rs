//! Megatron-Core's EP overlap (`overlap_moe_expert_parallel_comm`): the combined 1F1B
//! schedule runs one microbatch's forward and another's backward through a layer together,
//! the EP communication of each on its own stream beside the other's compute
//! (megatron/core/models/common/model_chunk_schedule_plan.py,
//! `TransformerLayerSchedulePlan.run`):
//!
//! ```text
//! comm:    combine_bwd      | dispatch_fwd -> dispatch_bwd   | combine_fwd
//! compute: pre_dispatch_fwd | mlp_bwd -> mlp_dw -> mlp_fwd   | pre_dispatch_bwd
//! ```
//!
//! so the backward's combine hides behind the forward's attention and routing, both
//! dispatches behind the experts of both passes, and the forward's combine behind the
//! backward's attention. Each window exposes what its transfer outlasts. Only the steady
//! state is modelled: the schedule's warm-up forwards and cool-down backwards, which run
//! unpaired, are timed as if paired.

use crate::model::Phase;

/// Where in a MoE layer an op lies, relative to its EP dispatch and combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Region {
    /// Before the dispatch (norm, attention, router, permute): `pre_dispatch_computation`.
    PreDispatch,
    /// Between dispatch and combine (the experts): `mlp`.
    Mlp,
    /// After the combine: the next layer's pre-dispatch compute in the pairing.
    PostCombine,
}

/// One MoE layer's compute per region and pass, and its EP transfers, as the block is
/// walked op by op.
#[derive(Debug, Clone, Copy, Default)]
pub struct EpWindows {
    /// Ops whose EP collectives were seen so far: 0 before the dispatch op, 1 after it,
    /// 2 after the combine op.
    seen: u8,
    pre_s: [f64; 2],
    mlp_s: [f64; 2],
    dispatch_s: [f64; 2],
    combine_s: [f64; 2],
}

/// Exposed seconds of the EP transfers, per pass (forward, backward), with the transfer
/// seconds they came from.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EpExposed {
    pub comm_s: [f64; 2],
    pub exposed_s: [f64; 2],
}

impl EpWindows {
    fn region(&self) -> Region {
        match self.seen {
            0 => Region::PreDispatch,
            1 => Region::Mlp,
            _ => Region::PostCombine,
        }
    }

    /// An op of `fwd_s` and `bwd_s` compute whose EP transfers (each pass's seconds, count
    /// included) are `ep_s`: the first op carrying any is the dispatch (its permute counted
    /// before it), the second the combine (its unpermute counted with the experts).
    pub fn op(&mut self, fwd_s: f64, bwd_s: f64, ep_s: [f64; 2]) {
        let carries = ep_s[0] > 0.0 || ep_s[1] > 0.0;
        let region = if carries && self.seen == 1 {
            Region::Mlp
        } else {
            self.region()
        };
        let slot = match region {
            Region::PreDispatch | Region::PostCombine => &mut self.pre_s,
            Region::Mlp => &mut self.mlp_s,
        };
        slot[0] += fwd_s;
        slot[1] += bwd_s;
        if carries {
            let to = if self.seen == 0 {
                &mut self.dispatch_s
            } else {
                &mut self.combine_s
            };
            to[0] += ep_s[0];
            to[1] += ep_s[1];
            self.seen = self.seen.saturating_add(1);
        }
    }

    /// The transfers' exposure over the three windows of the pairing.
    pub fn exposed(&self) -> EpExposed {
        let (f, b) = (0, 1);
        let w1 = (self.combine_s[b] - self.pre_s[f]).max(0.0);
        let dispatch = self.dispatch_s[f] + self.dispatch_s[b];
        let w2 = (dispatch - (self.mlp_s[f] + self.mlp_s[b])).max(0.0);
        let w3 = (self.combine_s[f] - self.pre_s[b]).max(0.0);
        // The dispatch window's exposure split over its two transfers by their share.
        let share = |x: f64| {
            if dispatch > 0.0 {
                w2 * x / dispatch
            } else {
                0.0
            }
        };
        EpExposed {
            comm_s: [
                self.dispatch_s[f] + self.combine_s[f],
                self.dispatch_s[b] + self.combine_s[b],
            ],
            exposed_s: [
                share(self.dispatch_s[f]) + w3,
                share(self.dispatch_s[b]) + w1,
            ],
        }
    }
}

/// The pass index of a collective's phase in [`EpExposed`].
pub fn pass(phase: Phase) -> usize {
    usize::from(phase == Phase::Backward)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: attention 3 ms forward and 6 ms backward before the dispatch, experts 2 ms
    /// forward and 4 ms backward, each transfer 2 ms. Windows: the backward combine (2) behind
    /// the forward attention (3) hides; both dispatches (4) behind both experts' passes (6)
    /// hide; the forward combine (2) behind the backward attention (6) hides. Shrink the
    /// experts to 1 + 1 ms: the dispatch window exposes 4 - 2 = 2 ms, 1 ms a pass.
    #[test]
    fn the_three_windows_by_hand() {
        let walk = |mlp: [f64; 2]| {
            let mut w = EpWindows::default();
            w.op(3e-3, 6e-3, [0.0, 0.0]);
            w.op(0.0, 0.0, [2e-3, 2e-3]);
            w.op(mlp[0], mlp[1], [0.0, 0.0]);
            w.op(0.0, 0.0, [2e-3, 2e-3]);
            w.exposed()
        };
        let e = walk([2e-3, 4e-3]);
        assert_eq!(e.exposed_s, [0.0, 0.0]);
        assert!((e.comm_s[0] - 4e-3).abs() < 1e-15 && (e.comm_s[1] - 4e-3).abs() < 1e-15);
        let e = walk([1e-3, 1e-3]);
        assert!((e.exposed_s[0] - 1e-3).abs() < 1e-15, "{e:?}");
        assert!((e.exposed_s[1] - 1e-3).abs() < 1e-15, "{e:?}");
    }

    /// A long transfer beside little compute is exposed for all but the compute it pairs
    /// with: the backward combine of 10 ms beside 3 ms of forward attention leaves 7 ms.
    #[test]
    fn a_transfer_longer_than_its_window_is_exposed_by_the_difference() {
        let mut w = EpWindows::default();
        w.op(3e-3, 6e-3, [0.0, 0.0]);
        w.op(0.0, 0.0, [0.0, 0.0]);
        w.op(0.0, 0.0, [1e-4, 1e-4]);
        w.op(1.0, 1.0, [0.0, 0.0]);
        w.op(0.0, 0.0, [0.0, 10e-3]);
        let e = w.exposed();
        assert!((e.exposed_s[1] - 7e-3).abs() < 1e-12, "{e:?}");
        assert_eq!(e.exposed_s[0], 0.0);
    }
}
