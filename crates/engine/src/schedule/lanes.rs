//! The per-lane arithmetic both plays share (the simulator's parking walk, `simulate.rs`, and a
//! kept program's compiled play order, `play_order.rs`): each of N cost sets is played in its
//! own lane, so times are `[f64; N]`.

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
