//! Search over every valid parallel mix for a GPU count: enumerate (search/enumerate.rs: tp,
//! cp and its exchange, pp with even, Megatron-style uneven and cost-balanced splits
//! (search/balance.rs), vpp and schedule, ep, ZeRO stage, micro batch, recomputation), drop
//! what the constraints exclude (search/mix.rs), prune what cannot be valid or cannot fit (a
//! memory lower bound, before any timing), estimate the rest on all cores, and rank the mixes
//! that fit by step time.

use crate::config::{Config, CpComm, GpuProfile, Recompute, Resolved, ScheduleKind};
use crate::estimate::{Estimate, Prepared};
use crate::layout::Layout;
use crate::network::Network;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

mod balance;
mod enumerate;
mod mix;

pub use enumerate::enumerate;
use enumerate::enumerate_in;
pub use mix::{Cmp, Constraint, Knob, Mix, SearchError, Slots};

/// What to search.
#[derive(Debug, Clone)]
pub struct SearchSpec {
    /// Model, cluster and training settings; its parallel section is replaced per mix.
    pub base: Config,
    pub mbs_max: u64,
    pub top: usize,
    pub constraints: Vec<Constraint>,
    /// Simulate every candidate that may fit (no step-time bound): slower, same answer.
    pub exhaustive: bool,
}

/// How many candidates were dropped, and why.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Pruned {
    /// Violated a constraint.
    pub constraint: u64,
    /// Failed validation (e.g. Ulysses with indivisible heads, a schedule's microbatch rule).
    pub invalid: u64,
    /// Cannot fit: weights, gradients, optimizer, buffers and one microbatch's activations
    /// already exceed the GPU (checked before any timing).
    pub memory_bound: u64,
    /// Estimated, but the simulated peak does not fit.
    pub memory: u64,
    /// Not simulated: a lower bound of its step time (busy time + data-parallel tail +
    /// optimizer) already loses to the top K, to the best of its schedule and of its ZeRO stage.
    pub time_bound: u64,
}

impl Pruned {
    pub fn total(&self) -> u64 {
        self.constraint + self.invalid + self.memory_bound + self.memory + self.time_bound
    }
}

/// A ranked mix.
#[derive(Debug, Clone, Serialize)]
pub struct Ranked {
    pub mix: Mix,
    #[serde(flatten)]
    pub estimate: Estimate,
}

/// The search's result (`parsim search --json`).
#[derive(Debug, Clone, Serialize)]
pub struct SearchResult {
    pub candidates: u64,
    pub pruned: Pruned,
    pub evaluated: u64,
    pub elapsed_s: f64,
    /// True when interrupted (Ctrl-C): the result covers what was evaluated.
    pub interrupted: bool,
    pub top: Vec<Ranked>,
    /// The fastest fitting mix of each schedule and each ZeRO stage.
    pub best_per_schedule: Vec<Ranked>,
    pub best_per_zero: Vec<Ranked>,
}

/// What phase 1 made of one candidate.
enum Screened {
    Constraint,
    Invalid,
    MemoryBound,
    /// Worth simulating unless the bound says otherwise.
    Open {
        mix: Mix,
        time_lb: f64,
    },
}

/// Layout-dependent link geometry, computed once per (tp, cp, ep, pp).
type NetworkCache = HashMap<(u32, u32, u32, u32), Network>;

fn network_cache(mixes: &[Mix], base: &Config, gpu: &GpuProfile) -> NetworkCache {
    let n = base.cluster.num_gpus;
    let mut keys: Vec<(u32, u32, u32, u32)> =
        mixes.iter().map(|m| (m.tp, m.cp, m.ep, m.pp)).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.into_par_iter()
        .filter_map(|(tp, cp, ep, pp)| {
            let dp = n / (tp * cp * pp);
            let layout = Layout::new(
                &base.parallel.order,
                tp,
                cp,
                ep,
                dp,
                pp,
                base.cluster.gpus_per_node,
            )
            .and_then(|l| l.with_nvlink_domain(base.cluster.nvlink_domain(gpu)))
            .and_then(|l| l.with_experts_of(base))
            .ok()?;
            Some(((tp, cp, ep, pp), Network::new(&layout, gpu)))
        })
        .collect()
}

fn resolve(mix: &Mix, spec: &SearchSpec, gpu: &GpuProfile) -> Option<Resolved> {
    Resolved::with_gpu(mix.apply(&spec.base), gpu.clone()).ok()
}

/// What a timed ledger depends on within one search: everything but the layer split.
type LedgerKey = (u32, u32, CpComm, u32, ScheduleKind, u32, u8, u64, Recompute);

fn ledger_key(m: &Mix) -> LedgerKey {
    (
        m.tp,
        m.cp,
        m.cp_comm,
        m.pp,
        m.schedule,
        m.ep,
        m.zero,
        m.mbs,
        m.recompute,
    )
}

/// The last timed ledger built while screening a run of neighbouring mixes.
type LedgerCache = Option<(LedgerKey, crate::model::Ledger, crate::model::LedgerSummary)>;

/// Phase 1: validity, the memory lower bound and the step-time lower bound; no simulation.
fn screen(
    mix: &Mix,
    spec: &SearchSpec,
    gpu: &GpuProfile,
    links: &NetworkCache,
    cache: &mut LedgerCache,
) -> Screened {
    let dp = spec.base.cluster.num_gpus / (mix.tp * mix.cp * mix.pp);
    if !spec.constraints.iter().all(|c| c.holds(mix, dp)) {
        return Screened::Constraint;
    }
    let Some(r) = resolve(mix, spec, gpu) else {
        return Screened::Invalid;
    };
    let cached = links.get(&(mix.tp, mix.cp, mix.ep, mix.pp)).cloned();
    let key = ledger_key(mix);
    let timed = match cache {
        Some((k, l, s)) if *k == key => Some((l.clone(), s.clone())),
        _ => None,
    };
    let Ok(prep) = Prepared::with_ledger(&r, cached, timed) else {
        return Screened::Invalid;
    };
    if !matches!(cache, Some((k, _, _)) if *k == key) {
        let (l, s) = prep.timed_ledger();
        *cache = Some((key, l, s));
    }
    if prep.memory_lower_bound() > r.gpu.usable_memory_bytes() {
        return Screened::MemoryBound;
    }
    Screened::Open {
        mix: *mix,
        time_lb: prep.time_lower_bound(),
    }
}

/// Best step times found so far: the top K, and the best per schedule and per ZeRO stage.
struct Bounds {
    top: Vec<f64>,
    k: usize,
    schedule: HashMap<ScheduleKind, f64>,
    zero: HashMap<u8, f64>,
}

impl Bounds {
    fn kth(&self) -> f64 {
        if self.top.len() < self.k {
            f64::INFINITY
        } else {
            self.top[self.k - 1]
        }
    }

    /// True when a mix whose step is at least `lb` can still enter some list.
    fn can_improve(&self, mix: &Mix, lb: f64) -> bool {
        lb < self.kth()
            || lb < *self.schedule.get(&mix.schedule).unwrap_or(&f64::INFINITY)
            || lb < *self.zero.get(&mix.zero).unwrap_or(&f64::INFINITY)
    }

    fn record(&mut self, mix: &Mix, step: f64) {
        let pos = self.top.partition_point(|&t| t <= step);
        if pos < self.k {
            self.top.insert(pos, step);
            self.top.truncate(self.k);
        }
        let s = self.schedule.entry(mix.schedule).or_insert(f64::INFINITY);
        *s = s.min(step);
        let z = self.zero.entry(mix.zero).or_insert(f64::INFINITY);
        *z = z.min(step);
    }
}

/// Runs the search. `progress(done, total)` is called as work finishes (phase 1 counts the
/// candidates, phase 2 the survivors); setting `cancel` stops it early with what has been
/// evaluated.
pub fn search(
    spec: &SearchSpec,
    progress: &(dyn Fn(u64, u64) + Sync),
    cancel: &AtomicBool,
) -> Result<SearchResult, SearchError> {
    if spec.mbs_max == 0 {
        return Err(SearchError::MbsMax);
    }
    if spec.top == 0 {
        return Err(SearchError::Top);
    }
    crate::config::check_base(&spec.base)?;
    let start = Instant::now();
    let gpu = GpuProfile::load(&spec.base.cluster.gpu)?;
    let mixes = enumerate_in(
        &spec.base,
        spec.mbs_max,
        spec.base.cluster.nvlink_domain(&gpu),
    );
    let total = mixes.len() as u64;
    let links = network_cache(&mixes, &spec.base, &gpu);

    // Phase 1: screen every candidate.
    let done = AtomicU64::new(0);
    const CHUNK: usize = 512;
    let screened: Vec<Vec<Screened>> = mixes
        .par_chunks(CHUNK)
        .map(|chunk| {
            if cancel.load(Ordering::Relaxed) {
                return Vec::new();
            }
            let mut cache = None;
            let out: Vec<Screened> = chunk
                .iter()
                .map(|m| screen(m, spec, &gpu, &links, &mut cache))
                .collect();
            let d = done.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
            progress(d, total);
            out
        })
        .collect();
    let mut pruned = Pruned::default();
    let mut open: Vec<(Mix, f64)> = Vec::new();
    for s in screened.into_iter().flatten() {
        match s {
            Screened::Constraint => pruned.constraint += 1,
            Screened::Invalid => pruned.invalid += 1,
            Screened::MemoryBound => pruned.memory_bound += 1,
            Screened::Open { mix, time_lb } => open.push((mix, time_lb)),
        }
    }

    // Phase 2: simulate in order of the lower bound, skipping what cannot win.
    open.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut bounds = Bounds {
        top: Vec::new(),
        k: spec.top.max(1),
        schedule: HashMap::new(),
        zero: HashMap::new(),
    };
    let mut fits: Vec<Ranked> = Vec::new();
    let mut evaluated = 0;
    let threads = rayon::current_num_threads().max(1);
    let mut i = 0;
    while i < open.len() && !cancel.load(Ordering::Relaxed) {
        let batch: Vec<&(Mix, f64)> = open[i..].iter().take(4 * threads).collect();
        i += batch.len();
        let (todo, skip): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .partition(|(m, lb)| spec.exhaustive || bounds.can_improve(m, *lb));
        pruned.time_bound += skip.len() as u64;
        let results: Vec<Option<Ranked>> = todo
            .par_iter()
            .map(|(mix, _)| {
                let r = resolve(mix, spec, &gpu)?;
                let cached = links.get(&(mix.tp, mix.cp, mix.ep, mix.pp)).cloned();
                let e = Prepared::new(&r, cached).ok()?.finish_with(false).ok()?;
                Some(Ranked {
                    mix: *mix,
                    estimate: e,
                })
            })
            .collect();
        for r in results {
            evaluated += 1;
            match r {
                Some(r) if r.estimate.memory.fits => {
                    bounds.record(&r.mix, r.estimate.time.step_s);
                    fits.push(r);
                }
                Some(_) => pruned.memory += 1,
                None => pruned.invalid += 1,
            }
        }
        progress(total.min(done.load(Ordering::Relaxed)), total);
    }
    if cancel.load(Ordering::Relaxed) {
        pruned.time_bound += (open.len() - i) as u64;
    }

    fits.sort_by(|a, b| {
        a.estimate
            .time
            .step_s
            .total_cmp(&b.estimate.time.step_s)
            .then_with(|| a.mix.to_string().cmp(&b.mix.to_string()))
    });
    let best_by = |key: &dyn Fn(&Ranked) -> String| -> Vec<Ranked> {
        let mut seen = std::collections::BTreeSet::new();
        fits.iter()
            .filter(|r| seen.insert(key(r)))
            .cloned()
            .collect()
    };
    let mut best_per_schedule = best_by(&|r| r.mix.schedule.as_str().to_string());
    let mut best_per_zero = best_by(&|r| r.mix.zero.to_string());
    fits.truncate(spec.top);
    // Ranked without the bubble's split by cause; what is reported gets the full estimate
    // (the same step time: the split only names the parts of the idle time). The mix was
    // estimated once already, so this cannot fail; were it to, the ranked figures stay.
    for list in [&mut fits, &mut best_per_schedule, &mut best_per_zero] {
        list.par_iter_mut().for_each(|ranked| {
            let m = &ranked.mix;
            let full = resolve(m, spec, &gpu).and_then(|r| {
                let cached = links.get(&(m.tp, m.cp, m.ep, m.pp)).cloned();
                Prepared::new(&r, cached).ok()?.finish().ok()
            });
            if let Some(e) = full {
                ranked.estimate = e;
            }
        });
    }
    Ok(SearchResult {
        candidates: total,
        pruned,
        evaluated,
        elapsed_s: start.elapsed().as_secs_f64(),
        interrupted: cancel.load(Ordering::Relaxed),
        top: fits,
        best_per_schedule,
        best_per_zero,
    })
}
