//! Search over every valid parallel mix for a GPU count: enumerate (search/enumerate.rs: tp,
//! cp and its exchange, pp with even, Megatron-style uneven and cost-balanced splits
//! (search/balance.rs), vpp and schedule, ep, ZeRO stage, micro batch, recomputation), drop
//! what the constraints exclude (search/mix.rs), take the runs of mixes that share a timed
//! ledger best first by a step-time bound common to the run (search/run.rs), prune what
//! cannot be valid or cannot fit (a memory lower bound, before any timing), simulate the rest
//! on all cores in order of their own bound, and rank the mixes that fit by step time.

use crate::config::{
    Config, CpComm, GpuProfile, PipelinePlacement, Recompute, Resolved, ScheduleKind,
};
use crate::estimate::{timed_ledger, Chunked, Estimate, RunMemo};
use crate::layout::{GroupKind, Layout};
use crate::network::ep_dispatch::EpDispatch;
use crate::network::Network;
use rayon::prelude::*;
use serde::Serialize;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

mod balance;
mod enumerate;
mod grid;
mod mix;
mod objective;
mod options;
mod pessimistic;
mod reproduce;
mod request;
mod run;
mod sliced;
mod why;

pub use enumerate::enumerate;
use enumerate::enumerate_in;
pub use mix::{framework_schedules, Cmp, Constraint, Knob, Mix, SearchError, Slots};
pub use objective::{
    deadline_search, parse_deadline_s, rank_by, rank_result, DeadlineAnswer, DeadlinePoint,
    Objective, ObjectiveError, ObjectiveResult, RunRanked, POOL,
};
pub use pessimistic::{search_by_memory_p90, search_by_p90, sort_by_memory_p90, RankBy};
pub use reproduce::MIX_FLAGS;
pub use request::SearchRequest;
use run::{group_lower_bounds, groups, leads, Pending, Run, Runs};
pub use sliced::{Search, Step};
pub use why::{Closest, ConstraintCount, NoFit, RuleCount};

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
    /// optimizer, or the pipeline's fill and drain) already loses to the top K, to the best of
    /// its schedule and of its ZeRO stage; or not even screened, its run's split-free bound
    /// losing to all of those.
    pub time_bound: u64,
}

impl Pruned {
    /// The candidates dropped before any estimate: with [`SearchResult::evaluated`], every
    /// candidate once. `memory` is not among them: those mixes were evaluated, and counted there.
    pub fn unevaluated(&self) -> u64 {
        self.constraint + self.invalid + self.memory_bound + self.time_bound
    }
}

/// A ranked mix.
#[derive(Debug, Clone, Serialize)]
pub struct Ranked {
    pub mix: Mix,
    /// The row's label ([`Mix::label`]).
    pub label: String,
    /// The `parsim estimate` command that reproduces this row (set by the command line,
    /// which knows the flags the search was given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
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
    /// When no mix fits (and the search ran to its end): what removed the last candidates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_fit: Option<NoFit>,
}

/// What phase 1 made of one candidate.
enum Screened {
    Constraint,
    Invalid,
    /// The memory lower bound, in bytes, exceeds the GPU's usable memory.
    MemoryBound {
        mix: Mix,
        bytes: u64,
    },
    /// Not screened: its run's step-time bound already loses to every list it could enter.
    TimeBound,
    /// Worth simulating unless the bound says otherwise.
    Open {
        mix: Mix,
        time_lb: f64,
    },
}

/// The GPU profile every mix of a search resolves on, shared.
type Gpu = Arc<GpuProfile>;

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
                base.cluster.gpus_per_node_on(gpu),
            )
            .and_then(|l| l.with_nvlink_domain(base.cluster.nvlink_domain(gpu)))
            .and_then(|l| l.with_experts_of(base))
            .ok()?;
            Some((
                (tp, cp, ep, pp),
                Network::new(&layout, gpu).with_ep_dispatch(EpDispatch::of(base)),
            ))
        })
        .collect()
}

fn resolve(mix: &Mix, spec: &SearchSpec, gpu: &Gpu) -> Option<Resolved> {
    Resolved::with_gpu(mix.apply(&spec.base), Arc::clone(gpu)).ok()
}

/// [`resolve`] for a mix of a run in which another mix passed every rule (`checked`): only the
/// rules that read the split are checked again ([`Resolved::resplit`]); `checked` is set once
/// a mix passes them all.
fn resolve_in_run(mix: &Mix, spec: &SearchSpec, gpu: &Gpu, checked: &mut bool) -> Option<Resolved> {
    if *checked {
        return Resolved::resplit(mix.apply(&spec.base), Arc::clone(gpu)).ok();
    }
    let r = resolve(mix, spec, gpu);
    *checked = r.is_some();
    r
}

/// What a timed ledger depends on within one search: everything but the layer split and the
/// schedule, save the pipeline's shape ([`pipeline_shape`]).
type LedgerKey = (u32, u32, CpComm, u32, u8, u32, u8, u64, Recompute);

/// 0 for Megatron's loop placement, 1 for ZB-V and 2 for DualPipe-V: a V puts the last stage
/// on the first rank (so tied embeddings and MTP's embedding copy differ), and DualPipe-V also
/// overlaps the expert all-to-all with compute (its blocks are timed with that overlap).
fn pipeline_shape(schedule: ScheduleKind) -> u8 {
    match schedule {
        ScheduleKind::ZbV => 1,
        ScheduleKind::DualPipeV => 2,
        _ => 0,
    }
}

fn ledger_key(m: &Mix) -> LedgerKey {
    (
        m.tp,
        m.cp,
        m.cp_comm,
        m.pp,
        pipeline_shape(m.schedule),
        m.ep,
        m.zero,
        m.mbs,
        m.recompute,
    )
}

/// What a timed ledger depends on within one search: the [`ledger_key`] less the pipeline's
/// depth (one microbatch's blocks do not depend on it), whether the last stage sits on the
/// first rank (tied embeddings, MTP's embedding copy), and the shape (size, members per
/// domain, domains) of each group the blocks' own collectives run on (tp, cp, ep, expert tp),
/// which is all the network times them by. Runs of different depths share one ledger.
type TimedKey = (
    u32,
    u32,
    u8,
    u8,
    u32,
    u8,
    u64,
    u8,
    bool,
    [(u32, u32, u32); 4],
);

fn timed_key(m: &Mix, network: &Network) -> TimedKey {
    let shape = |k| {
        let g = network.geometry(k);
        (g.size, g.per_node, g.nodes)
    };
    // The placement a resolved mix gets (config/resolve.rs): from pp, vpp and the schedule.
    let last = (m.pp * m.vpp).saturating_sub(1);
    let last_on_first = PipelinePlacement::stage_rank_of(last, m.pp, m.schedule)
        == PipelinePlacement::stage_rank_of(0, m.pp, m.schedule);
    (
        m.tp,
        m.cp,
        m.cp_comm as u8,
        pipeline_shape(m.schedule),
        m.ep,
        m.zero,
        m.mbs,
        m.recompute as u8,
        last_on_first,
        [
            shape(GroupKind::Tp),
            shape(GroupKind::Cp),
            shape(GroupKind::Ep),
            shape(GroupKind::ExpertTp),
        ],
    )
}

/// What a timed ledger's block times depend on: its [`TimedKey`] less the ZeRO stage, which
/// changes what a block holds in memory (gradient buckets, gathered weights) but none of its
/// ops (ZeRO's collectives are timed per stage, estimate/dp.rs). The runs of all four stages
/// share one split-free bound.
type BoundKey = TimedKey;

fn bound_key(key: TimedKey) -> BoundKey {
    let mut k = key;
    k.5 = 0;
    k
}

/// A timed ledger shared by the runs of one [`TimedKey`].
type SharedLedger = (TimedKey, crate::model::Ledger, crate::model::LedgerSummary);

/// The layout's links from the cache, else built for this mix alone.
fn network_of<'a>(mix: &Mix, r: &Resolved, links: &'a NetworkCache) -> Cow<'a, Network> {
    match links.get(&(mix.tp, mix.cp, mix.ep, mix.pp)) {
        Some(n) => Cow::Borrowed(n),
        None => Cow::Owned(
            Network::new(&Layout::of(r), &r.gpu).with_ep_dispatch(EpDispatch::of(&r.config)),
        ),
    }
}

/// The schedules whose mixes of one run share a vpp-1 split's screening: one timed ledger,
/// the same placement, chunks and per-stage costs; only the drain bound differs.
const SPLIT_SHARED: [ScheduleKind; 3] = [
    ScheduleKind::Gpipe,
    ScheduleKind::OneFOneB,
    ScheduleKind::ZbH1,
];

/// What one split screened to, for the [`SPLIT_SHARED`] schedules of a run.
#[derive(Clone, Copy)]
enum SplitScreen {
    Invalid,
    /// The memory lower bound, in bytes (the same for each of the split's schedules).
    MemoryBound(u64),
    /// The busy bound and each shared schedule's drain bound.
    Open {
        busy_lb: f64,
        drain_lb: [f64; 3],
    },
}

/// What a run has screened so far: its splits ([`SPLIT_SHARED`]) by (first, last, slots),
/// what its mixes work out alike under the run's shared timed ledger ([`RunMemo`]), and
/// whether one of them passed every rule.
#[derive(Default)]
struct SplitCache {
    splits: Vec<(SplitKey, SplitScreen)>,
    memo: RunMemo,
    /// A mix of the run passed every rule ([`resolve_in_run`]).
    checked: bool,
}

/// A vpp-1 split: first and last stage layers, and the embedding/loss slots.
type SplitKey = (Option<u32>, Option<u32>, Slots);

impl SplitCache {
    /// Splits held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.splits.len()
    }
}

/// Phase 1: validity, the memory lower bound and the step-time lower bound; no simulation.
/// A mix borrows its run's timed ledger (`shared`) when its own [`TimedKey`] matches, else
/// times its own; the per-stage costs are built only for a mix that passes the memory bound.
/// A mix of a [`SPLIT_SHARED`] schedule takes its split's outcome (validity included) from
/// `cache` when a mix of its run with another of those schedules screened it.
fn screen(
    mix: &Mix,
    spec: &SearchSpec,
    gpu: &Gpu,
    links: &NetworkCache,
    shared: Option<&SharedLedger>,
    cache: &mut SplitCache,
) -> Screened {
    let dp = spec.base.cluster.num_gpus / (mix.tp * mix.cp * mix.pp);
    if !spec.constraints.iter().all(|c| c.holds(mix, dp)) {
        return Screened::Constraint;
    }
    let slot = SPLIT_SHARED
        .iter()
        .position(|&k| k == mix.schedule)
        .filter(|_| mix.vpp == 1);
    let split = (mix.first_stage_layers, mix.last_stage_layers, mix.slots);
    let of = |s: SplitScreen, slot: usize| match s {
        SplitScreen::Invalid => Screened::Invalid,
        SplitScreen::MemoryBound(bytes) => Screened::MemoryBound { mix: *mix, bytes },
        SplitScreen::Open { busy_lb, drain_lb } => Screened::Open {
            mix: *mix,
            time_lb: busy_lb.max(drain_lb[slot]),
        },
    };
    // No rule tells these schedules apart at vpp 1 (one chunk per rank, the same loop
    // placement), so a split's validity holds for all three: a cached split is not
    // validated again.
    if let Some(slot) = slot {
        if let Some(&(_, s)) = cache.splits.iter().find(|(k, _)| *k == split) {
            return of(s, slot);
        }
    }
    let Some(r) = resolve_in_run(mix, spec, gpu, &mut cache.checked) else {
        if slot.is_some() {
            cache.splits.push((split, SplitScreen::Invalid));
        }
        return Screened::Invalid;
    };
    let network = network_of(mix, &r, links);
    let key = timed_key(mix, &network);
    // The run's static memories hold for the run's shared ledger only.
    let (chunked, borrowed) = match shared {
        Some((k, ledger, s)) if *k == key => (
            Chunked::new(&r, Cow::Borrowed(ledger), Cow::Borrowed(s)),
            true,
        ),
        _ => {
            let (ledger, s) = timed_ledger(&r, &network);
            (Chunked::new(&r, Cow::Owned(ledger), Cow::Owned(s)), false)
        }
    };
    let mut own = RunMemo::default();
    let memo = if borrowed { &mut cache.memo } else { &mut own };
    let bytes = chunked.memory_lower_bound_memo(memo);
    if bytes > r.gpu.usable_memory_bytes() {
        if slot.is_some() {
            cache.splits.push((split, SplitScreen::MemoryBound(bytes)));
        }
        return Screened::MemoryBound { mix: *mix, bytes };
    }
    let Ok(prep) = chunked.prepare_memo(network, memo) else {
        if slot.is_some() {
            cache.splits.push((split, SplitScreen::Invalid));
        }
        return Screened::Invalid;
    };
    let Some(slot) = slot else {
        return Screened::Open {
            mix: *mix,
            time_lb: prep.time_lower_bound(),
        };
    };
    let s = SplitScreen::Open {
        busy_lb: prep.busy_lower_bound(),
        drain_lb: SPLIT_SHARED.map(|k| prep.drain_lower_bound_as(k)),
    };
    cache.splits.push((split, s));
    of(s, slot)
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

    /// True when some mix of `mixes` (one zero stage, any schedules) whose step is at least
    /// `lb` can still enter some list.
    fn can_improve_any(&self, mixes: &[Mix], lb: f64) -> bool {
        lb < self.kth() || mixes.iter().any(|m| self.can_improve(m, lb))
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
/// evaluated. The same as [`Search`] stepped to its end, and when no mix fits, a second
/// search without the constraints for [`NoFit::without_constraints`].
pub fn search(
    spec: &SearchSpec,
    progress: &(dyn Fn(u64, u64) + Sync),
    cancel: &AtomicBool,
) -> Result<SearchResult, SearchError> {
    let mut result = run_to_end(spec, progress, cancel, true)?;
    // Nothing fits: a search of the same space without the constraints tells whether they
    // removed the last mixes that fit, and which.
    if let Some(no_fit) = result
        .no_fit
        .as_mut()
        .filter(|n| n.constraints_removed_any())
    {
        let free = SearchSpec {
            constraints: Vec::new(),
            top: spec.top.max(POOL),
            ..spec.clone()
        };
        let fitting = run_to_end(&free, &|_, _| {}, cancel, false)?;
        if fitting.interrupted {
            // Cancelled while saying why: the answer is partial, so none is given.
            result.interrupted = true;
            result.no_fit = None;
        } else {
            no_fit.without_constraints(spec, &fitting.top);
        }
    }
    Ok(result)
}

/// [`Search`] stepped to its end; with `why`, an empty result says why ([`NoFit`]).
fn run_to_end(
    spec: &SearchSpec,
    progress: &(dyn Fn(u64, u64) + Sync),
    cancel: &AtomicBool,
    why: bool,
) -> Result<SearchResult, SearchError> {
    let mut s = Search::new(spec)?;
    loop {
        match s.step(cancel) {
            Step::Screened { done, total } => progress(done, total),
            Step::Simulated => {}
            Step::Done => return Ok(s.finish_with(cancel, why)),
        }
    }
}
