//! The per-lane arithmetic both plays share (the simulator's parking walk, `simulate.rs`, and a
//! kept program's compiled play order, `play_order.rs`): each of N cost sets is played in its
//! own lane, so times are `[f64; N]`.

use super::action::{rank_of_stage, ActionKind, Program};
use super::costs::Costs;

/// Start and end time of one action.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    /// When the action starts.
    pub start: f64,
    /// When it ends. The two halves of an overlapped slot both end when the slot ends.
    pub end: f64,
}

/// What one play of a program leaves per rank: when its last action ends and its compute time.
pub(super) struct Played {
    pub finish: Vec<f64>,
    pub busy: Vec<f64>,
}

pub(super) fn plus<const N: usize>(a: [f64; N], b: [f64; N]) -> [f64; N] {
    std::array::from_fn(|i| a[i] + b[i])
}

/// The later of two times, lane by lane. Times here are never NaN (sums of finite,
/// non-negative costs, [`Costs::validate`]), so a plain comparison gives what `f64::max` does
/// without its NaN handling.
pub(super) fn max<const N: usize>(a: [f64; N], b: [f64; N]) -> [f64; N] {
    std::array::from_fn(|i| if b[i] > a[i] { b[i] } else { a[i] })
}

/// Each lane's [`Played`] from the ranks' free times and busy times.
pub(super) fn played<const N: usize>(free: &[[f64; N]], busy: &[[f64; N]]) -> [Played; N] {
    std::array::from_fn(|i| Played {
        finish: free.iter().map(|t| t[i]).collect(),
        busy: busy.iter().map(|t| t[i]).collect(),
    })
}

/// One span per lane from start and end times.
pub(super) fn spans<const N: usize>(t0: [f64; N], t1: [f64; N]) -> [Span; N] {
    std::array::from_fn(|i| Span {
        start: t0[i],
        end: t1[i],
    })
}

/// [`StageLanes::hop`]'s slot of the forward input's hop (from the stage before).
pub(super) const FROM_BEFORE: usize = 0;
/// [`StageLanes::hop`]'s slot of the gradient input's hop (from the stage after).
pub(super) const FROM_AFTER: usize = 1;

/// One stage as every lane of a play sees it, looked up once per play rather than per
/// action: its rank, the durations of its F, B, I and W, and the hops its inputs pay.
#[derive(Clone, Copy)]
pub(super) struct StageLanes<const N: usize> {
    pub owner: u32,
    /// Durations per lane, indexed by [`kind_slot`].
    pub duration: [[f64; N]; 4],
    /// The hops its inputs pay, indexed by [`FROM_BEFORE`] (the forward input, from s - 1: 0 on
    /// the first stage or the same rank) and [`FROM_AFTER`] (the gradient input, from s + 1: 0
    /// on the last stage or the same rank).
    pub hop: [[f64; N]; 2],
}

/// The slot of an action kind in [`StageLanes::duration`].
pub(super) fn kind_slot(kind: ActionKind) -> usize {
    match kind {
        ActionKind::F => 0,
        ActionKind::B => 1,
        ActionKind::I => 2,
        ActionKind::W => 3,
    }
}

/// Every stage's [`StageLanes`] for `costs` on `program`'s placement.
pub(super) fn stage_lanes<const N: usize>(
    program: &Program,
    costs: [&Costs; N],
) -> Vec<StageLanes<N>> {
    let stages = program.num_stages();
    let owner = |s: u32| rank_of_stage(program.placement, program.pp, s);
    // A hop between `a` and `b` (stages), across the boundary above `lower`: paid only when
    // the two run on different ranks (a checked program runs each stage on its owner).
    let crossing = |a: u32, b: u32, lower: u32| -> [f64; N] {
        if owner(a) != owner(b) {
            costs.map(|c| c.hop(lower))
        } else {
            [0.0; N]
        }
    };
    (0..stages)
        .map(|s| {
            let i = s as usize;
            StageLanes {
                owner: owner(s),
                duration: [
                    costs.map(|c| c.forward[i]),
                    costs.map(|c| c.backward[i]),
                    costs.map(|c| c.input_grad[i]),
                    costs.map(|c| c.weight_grad[i]),
                ],
                hop: [
                    if s == 0 {
                        [0.0; N]
                    } else {
                        crossing(s - 1, s, s - 1)
                    },
                    if s + 1 == stages {
                        [0.0; N]
                    } else {
                        crossing(s + 1, s, s)
                    },
                ],
            }
        })
        .collect()
}
