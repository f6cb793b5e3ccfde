//! Textbook closed forms for pipeline bubbles and activation peaks.
//!
//! These are *oracles* for tests and comparison columns; the simulator is the implementation.
//! The one exception is the estimate's bubble split, which takes [`bubble_1f1b`] for GPipe and
//! 1F1B with balanced stages instead of a third simulation (checked against the simulator on
//! every rank). Each function cites where its formula comes from. `p` is the number of
//! pipeline ranks, `v` the chunks per rank, `m` the microbatches.

/// Bubble over ideal time of GPipe and 1F1B with F = B and free communication:
/// (p-1)/m (Narayanan et al. 2021, §2.2.1).
pub fn bubble_fraction_1f1b(p: u32, m: u32) -> f64 {
    (p as f64 - 1.0) / m as f64
}

/// Bubble over ideal time of interleaved 1F1B: (p-1)/(v m) (Narayanan et al. 2021, §2.2.2).
pub fn bubble_fraction_interleaved(p: u32, v: u32, m: u32) -> f64 {
    (p as f64 - 1.0) / (v as f64 * m as f64)
}

/// Idle time per rank of 1F1B, DualPipe README table: (PP-1)(F+B), B the full backward.
pub fn bubble_1f1b(p: u32, f: f64, b: f64) -> f64 {
    (p as f64 - 1.0) * (f + b)
}

/// Idle time per rank of ZB1P (ZB-H1), DualPipe README table: (PP-1)(F+B-2W), B the full
/// backward (Qi et al. 2024 give the same as (p-1)(T_F + T_B - T_W) with T_B the input part).
pub fn bubble_zb1p(p: u32, f: f64, b: f64, w: f64) -> f64 {
    (p as f64 - 1.0) * (f + b - 2.0 * w)
}

/// Idle time per device of DualPipe and DualPipeV, DualPipe README table:
/// (PP/2-1)(F&B + B - 3W), with PP the number of pipeline *stages* (DualPipeV runs them on
/// PP/2 devices, so PP = 2p here) and F&B the time of an overlapped forward-and-backward slot.
pub fn bubble_dualpipe(stages: u32, f_and_b: f64, b: f64, w: f64) -> f64 {
    (stages as f64 / 2.0 - 1.0) * (f_and_b + b - 3.0 * w)
}

/// GPipe holds every microbatch's activations at the turn: m on every rank
/// (Huang et al. 2019).
pub fn peak_gpipe(m: u32) -> u32 {
    m
}

/// 1F1B holds p - i activation sets on rank i (0-based), or m if fewer
/// (Narayanan et al. 2021, §2.2.1).
pub fn peak_1f1b(p: u32, rank: u32, m: u32) -> u32 {
    (p - rank).min(m)
}

/// Megatron-LM's interleaved schedule: warm-up `(p-r-1)*2 + (v-1)*N` forwards, then one more
/// forward before the first backward, capped at m v (`get_pp_rank_microbatches`).
pub fn peak_interleaved(p: u32, v: u32, m: u32, group: u32, rank: u32) -> u32 {
    let warm = (p - rank - 1) as u64 * 2 + (v as u64 - 1) * group as u64;
    (warm + 1).min(m as u64 * v as u64) as u32
}

/// ZB-H1: the paper keeps the largest rank at p live microbatches, like 1F1B's rank 0
/// (Qi et al. 2024, §3.1).
pub fn peak_zbh1_max(p: u32, m: u32) -> u32 {
    p.min(m)
}

/// ZB-V: the same peak memory as 1F1B, p stage-sized activation sets = 2p chunk-sized ones
/// per rank (Qi et al. 2024, §6), for m >= 2p.
pub fn peak_zbv(p: u32) -> u32 {
    2 * p
}

/// DualPipeV: "PP+1" activation sets per device with PP = 2p stages (DualPipe README table),
/// for m >= 2p.
pub fn peak_dualpipe_v(p: u32) -> u32 {
    2 * p + 1
}
