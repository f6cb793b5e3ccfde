//! `parsim.preflight`: the check a launcher makes before it asks for GPUs: does this exact
//! configuration fit with the memory margin, judged at the pessimistic end of the memory
//! estimate, and how long will a step take (with its interval)?

use parsim::estimate::Estimate;
use serde::Serialize;

/// The bytes the most loaded GPU needs at the pessimistic end of the memory estimate (the p90
/// of its memory interval, from the measured peaks of the run's framework), and the field of
/// the estimate it comes from.
pub fn pessimistic_memory_bytes(est: &Estimate) -> (u64, &'static str) {
    (
        est.memory.per_gpu_max_bytes_p90,
        "memory.per_gpu_max_bytes_p90",
    )
}

/// The answer: whether it fits, by how much, and the step time with its interval.
#[derive(Debug, Serialize)]
pub struct Verdict<'a> {
    /// The pessimistic memory is at most the usable memory (the capacity less the margin).
    pub fits: bool,
    /// The most loaded GPU's memory at the pessimistic end of the estimate.
    pub memory_bytes: u64,
    /// The capacity less the margin, rounded down: what `fits` is measured against.
    pub usable_bytes: u64,
    /// The device memory as the driver reports it.
    pub capacity_bytes: u64,
    /// The fraction of the capacity kept free (the `margin` argument, else the profile's).
    pub margin_fraction: f64,
    /// Usable less needed: negative by how far it is from fitting (null only past 2^63).
    pub headroom_bytes: Option<i64>,
    /// The predicted step time and its interval (the estimate's `time.step_s_p10/p90`).
    pub step_s: f64,
    pub step_s_p10: f64,
    pub step_s_p90: f64,
    /// Tokens per second at the predicted step time.
    pub tokens_per_s: f64,
    /// The GPU profile's name.
    pub gpu: &'a str,
    /// The world size.
    pub num_gpus: u32,
    /// What bounds the step, and what to try.
    pub verdict: &'a str,
    /// The estimate's field `memory_bytes` was read from.
    pub memory_source: &'static str,
}

/// The pre-flight verdict of `est`.
pub fn verdict(est: &Estimate) -> Verdict<'_> {
    let m = &est.memory;
    let (need_bytes, source) = pessimistic_memory_bytes(est);
    let t = &est.time;
    Verdict {
        fits: need_bytes <= m.usable_bytes,
        memory_bytes: need_bytes,
        memory_source: source,
        usable_bytes: m.usable_bytes,
        capacity_bytes: m.capacity_bytes,
        margin_fraction: m.margin_fraction,
        headroom_bytes: i64::try_from(i128::from(m.usable_bytes) - i128::from(need_bytes)).ok(),
        step_s: t.step_s,
        step_s_p10: t.step_s_p10,
        step_s_p90: t.step_s_p90,
        tokens_per_s: est.throughput.tokens_per_s,
        gpu: &est.gpu,
        num_gpus: est.config.cluster.num_gpus,
        verdict: &est.verdict,
    }
}
