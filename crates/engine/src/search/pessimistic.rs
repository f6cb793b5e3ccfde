//! `parsim search --rank-by p90`: the mixes ranked by the upper end of their step-time
//! interval, the pessimistic figure a planner who must meet a date ranks by.
//!
//! The search is exact by step time; the upper step time is the step time times a factor
//! that, within one search (one model, GPU, framework, GPU count and sequence), depends on the
//! mix only through its communication share. So a mix outside the pool of the fastest by step
//! time can still rank by p90 only if its step time times the smallest factor any share gets
//! beats the pool's K-th upper step time; the pool is doubled until none can.

use super::{search, SearchError, SearchResult, SearchSpec, POOL};
use crate::interval::IntervalModel;
use std::sync::atomic::AtomicBool;

/// What a ranking orders mixes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RankBy {
    /// The predicted step time.
    #[default]
    Step,
    /// The interval's upper step time (`time.step_s_p90`).
    P90,
    /// The pessimistic peak memory (`memory.per_gpu_max_bytes_p90`), then the step time: the
    /// mix with the most room at the end a fits verdict is decided at.
    MemoryP90,
}

impl RankBy {
    /// `step`, `p90` or `memory-p90`.
    pub fn parse(text: &str) -> Result<RankBy, SearchError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "step" => Ok(RankBy::Step),
            "p90" => Ok(RankBy::P90),
            "memory-p90" => Ok(RankBy::MemoryP90),
            _ => Err(SearchError::RankBy(text.to_string())),
        }
    }
}

/// The search's top `spec.top` mixes by upper step time (ties by mix name), each with its
/// interval from `model`; `best_per_schedule` and `best_per_zero` stay by step time.
pub fn search_by_p90(
    spec: &SearchSpec,
    model: &IntervalModel,
    progress: &(dyn Fn(u64, u64) + Sync),
    cancel: &AtomicBool,
) -> Result<SearchResult, SearchError> {
    let mut pool = spec.top.max(POOL);
    loop {
        let wide = SearchSpec {
            top: pool,
            ..spec.clone()
        };
        let mut r = search(&wide, progress, cancel)?;
        for t in &mut r.top {
            t.estimate.use_interval_model(model);
        }
        // A pool that is not full holds every fitting mix; a full one leaves out only mixes
        // at least as slow as its slowest member.
        let full = r.top.len() == pool;
        let slowest_s = r
            .top
            .iter()
            .map(|t| t.estimate.time.step_s)
            .fold(0.0, f64::max);
        let min_factor = r.top.first().map_or(1.0, |t| {
            model.min_upper_factor(&t.estimate.step_interval.regime)
        });
        r.top.sort_by(|a, b| {
            a.estimate
                .time
                .step_s_p90
                .total_cmp(&b.estimate.time.step_s_p90)
                .then_with(|| a.mix.to_string().cmp(&b.mix.to_string()))
        });
        r.top.truncate(spec.top);
        let kth_p90 = r
            .top
            .last()
            .map_or(f64::INFINITY, |t| t.estimate.time.step_s_p90);
        if r.interrupted || !full || slowest_s * min_factor >= kth_p90 {
            return Ok(r);
        }
        pool *= 2;
    }
}

/// Every fitting mix the search keeps when asked for all of them.
const EVERY_MIX: usize = 1 << 20;

/// The search's top `spec.top` mixes by pessimistic peak memory (`per_gpu_max_bytes_p90`),
/// ties by step time then mix name. Memory and step time do not bound each other, so every
/// fitting mix is kept and sorted; `best_per_schedule` and `best_per_zero` stay by step time.
pub fn search_by_memory_p90(
    spec: &SearchSpec,
    progress: &(dyn Fn(u64, u64) + Sync),
    cancel: &AtomicBool,
) -> Result<SearchResult, SearchError> {
    let every = SearchSpec {
        top: EVERY_MIX,
        ..spec.clone()
    };
    let mut r = search(&every, progress, cancel)?;
    sort_by_memory_p90(&mut r.top);
    r.top.truncate(spec.top);
    Ok(r)
}

/// Orders mixes by p90 peak memory, then step time, then name.
pub fn sort_by_memory_p90(top: &mut [super::Ranked]) {
    top.sort_by(|a, b| {
        let (x, y) = (&a.estimate, &b.estimate);
        x.memory
            .per_gpu_max_bytes_p90
            .cmp(&y.memory.per_gpu_max_bytes_p90)
            .then_with(|| x.time.step_s.total_cmp(&y.time.step_s))
            .then_with(|| a.mix.to_string().cmp(&b.mix.to_string()))
    });
}
