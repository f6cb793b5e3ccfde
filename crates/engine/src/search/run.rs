//! The search's best-first pass: runs of neighbouring mixes that share a timed ledger, the
//! step-time lower bound every pipeline split of a run shares (so that a run that cannot win
//! is not screened at all), and the simulation of what survives, in order of its own bound.

use super::{
    bound_key, ledger_key, network_of, resolve, screen, timed_key, BoundKey, Bounds, Gpu, Mix,
    NetworkCache, Pruned, Ranked, Screened, SearchSpec, SharedLedger, SplitCache, TimedKey,
};
use crate::config::ScheduleKind;
use crate::estimate::{split_free_bound_of, split_free_per_microbatch_s, timed_ledger, Prepared};
use rayon::prelude::*;
use std::collections::{BinaryHeap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

/// The runs of consecutive mixes with the same timed ledger (the enumeration puts the
/// pipeline splits innermost).
pub(super) fn groups(mixes: &[Mix]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, m) in mixes.iter().enumerate() {
        match out.last_mut() {
            Some(g) if ledger_key(&mixes[g.start]) == ledger_key(m) => g.end = i + 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// Whether `mix` meets every constraint.
fn passes(mix: &Mix, spec: &SearchSpec) -> bool {
    let dp = spec.base.cluster.num_gpus / (mix.tp * mix.cp * mix.pp);
    spec.constraints.iter().all(|c| c.holds(mix, dp))
}

/// A run's first mix that meets the constraints: its index, microbatches and the key of the
/// timed ledger every mix of the run shares (all from the mix and its layout's links; no
/// validation, which [`first_valid`] does once per key instead of once per run).
pub(super) struct Lead {
    mix: usize,
    microbatches: u32,
    key: TimedKey,
}

/// Each run's [`Lead`] (`None` when no mix of it meets the constraints, or its layout has no
/// links: such a run is screened mix by mix).
pub(super) fn leads(
    mixes: &[Mix],
    groups: &[Range<usize>],
    spec: &SearchSpec,
    links: &NetworkCache,
) -> Vec<Option<Lead>> {
    let n = u64::from(spec.base.cluster.num_gpus);
    let gbs = spec.base.training.global_batch_size;
    groups
        .par_iter()
        .map(|g| {
            let i = g.clone().find(|&i| passes(&mixes[i], spec))?;
            let m = &mixes[i];
            let network = links.get(&(m.tp, m.cp, m.ep, m.pp))?;
            let dp = n / u64::from(m.tp * m.cp * m.pp);
            // The enumeration keeps only micro batches with gbs % (mbs x dp) == 0.
            let microbatches = u32::try_from(gbs / (m.mbs * dp)).ok()?;
            Some(Lead {
                mix: i,
                microbatches,
                key: timed_key(m, network),
            })
        })
        .collect()
}

/// The runs among `runs` (indices into `groups`) that have a lead, by `project` of its key,
/// each key's runs in order.
fn runs_by_key<K: std::hash::Hash + Eq>(
    runs: impl Iterator<Item = usize>,
    leads: &[Option<Lead>],
    project: impl Fn(TimedKey) -> K,
) -> HashMap<K, Vec<usize>> {
    let mut out: HashMap<K, Vec<usize>> = HashMap::new();
    for g in runs {
        if let Some(l) = &leads[g] {
            out.entry(project(l.key)).or_default().push(g);
        }
    }
    out
}

/// The first mix of `runs` (in order) that meets the constraints and validates, resolved,
/// with its links.
fn first_valid<'a>(
    runs: &[usize],
    mixes: &[Mix],
    groups: &[Range<usize>],
    (spec, gpu, links): (&SearchSpec, &Gpu, &'a NetworkCache),
) -> Option<(
    crate::config::Resolved,
    std::borrow::Cow<'a, crate::network::Network>,
)> {
    runs.iter()
        .flat_map(|&g| groups[g].clone())
        .filter(|&i| passes(&mixes[i], spec))
        .find_map(|i| {
            let m = &mixes[i];
            let r = resolve(m, spec, gpu)?;
            let network = network_of(m, &r, links);
            Some((r, network))
        })
}

/// The timed ledger of each distinct key among the runs `todo`, from the first of their mixes
/// that validates.
fn shared_ledgers(
    todo: &[usize],
    runs: &Runs<'_>,
    ctx: (&SearchSpec, &Gpu, &NetworkCache),
) -> HashMap<TimedKey, SharedLedger> {
    runs_by_key(todo.iter().copied(), runs.leads, |k| k)
        .into_par_iter()
        .filter_map(|(key, of_key)| {
            let (r, network) = first_valid(&of_key, runs.mixes, runs.groups, ctx)?;
            let (ledger, s) = timed_ledger(&r, &network);
            Some((key, (key, ledger, s)))
        })
        .collect()
}

/// A lower bound of the step of every mix of each run ([`crate::estimate::split_free_lower_bound`]):
/// one microbatch's split-free work, computed once per [`super::BoundKey`] (runs that differ
/// only in pipeline depth or ZeRO stage share it, to the bit) from the first valid mix of the
/// runs that have it, times the run's microbatches over its depth. 0 (never skipped) for a
/// run without a lead or whose key no mix validates, and for DualPipe-V, whose overlapped
/// forward and backward the bound does not cover.
pub(super) fn group_lower_bounds(
    mixes: &[Mix],
    groups: &[Range<usize>],
    leads: &[Option<Lead>],
    ctx: (&SearchSpec, &Gpu, &NetworkCache),
) -> Vec<f64> {
    let dual = |g: &Range<usize>| {
        mixes[g.clone()]
            .iter()
            .any(|m| m.schedule == ScheduleKind::DualPipeV)
    };
    let bounded: Vec<usize> = (0..groups.len()).filter(|&g| !dual(&groups[g])).collect();
    let per_microbatch_s: HashMap<BoundKey, f64> =
        runs_by_key(bounded.iter().copied(), leads, bound_key)
            .into_par_iter()
            .filter_map(|(key, of_key)| {
                let (r, network) = first_valid(&of_key, mixes, groups, ctx)?;
                let (_, s) = timed_ledger(&r, &network);
                Some((key, split_free_per_microbatch_s(&r, &s)))
            })
            .collect();
    let mut out = vec![0.0; groups.len()];
    for g in bounded {
        if let Some(l) = &leads[g] {
            if let Some(per) = per_microbatch_s.get(&bound_key(l.key)) {
                out[g] = split_free_bound_of(*per, l.microbatches, mixes[l.mix].pp);
            }
        }
    }
    out
}

/// Screened mixes waiting for their simulation: the lowest bound comes out first, and of
/// equal bounds the last screened.
#[derive(Default)]
pub(super) struct Pending {
    heap: BinaryHeap<Waiting>,
    screened: u64,
}

/// A mix in [`Pending`] with its bound and screening order.
struct Waiting {
    lb: f64,
    order: u64,
    mix: Mix,
}

impl Ord for Waiting {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other
            .lb
            .total_cmp(&self.lb)
            .then(self.order.cmp(&other.order))
    }
}

impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Waiting {}

impl Pending {
    fn push(&mut self, mix: Mix, lb: f64) {
        self.screened += 1;
        self.heap.push(Waiting {
            lb,
            order: self.screened,
            mix,
        });
    }

    /// Takes out, lowest first, the mixes whose bound is at most `frontier`.
    pub fn take_up_to(&mut self, frontier: f64) -> Vec<(Mix, f64)> {
        let mut out = Vec::new();
        while self.heap.peek().is_some_and(|w| w.lb <= frontier) {
            out.extend(self.heap.pop().map(|w| (w.mix, w.lb)));
        }
        out
    }
}

/// What the search has found so far.
pub(super) struct Run {
    pub bounds: Bounds,
    pub fits: Vec<Ranked>,
    pub pruned: Pruned,
    pub evaluated: u64,
    /// Of the mixes whose memory exceeds the GPU's, the [`CLOSEST_KEPT`] that exceed it
    /// least, fewest bytes first (the memory lower bound, or the estimate's peak once
    /// simulated).
    pub closest: Vec<(Mix, u64)>,
}

/// How many of the mixes closest to fitting a search keeps ([`Run::closest`]).
pub(super) const CLOSEST_KEPT: usize = 8;

/// The enumerated mixes, their runs and each run's split-free lower bound.
pub(super) struct Runs<'a> {
    pub mixes: &'a [Mix],
    pub groups: &'a [Range<usize>],
    pub leads: &'a [Option<Lead>],
    pub bounds: &'a [f64],
}

impl Run {
    /// Keeps `mix` among [`Run::closest`] when it needs fewer bytes than one held.
    fn note_over_memory(&mut self, mix: Mix, bytes: u64) {
        let at = self.closest.partition_point(|&(_, b)| b <= bytes);
        if at < CLOSEST_KEPT {
            self.closest.insert(at, (mix, bytes));
            self.closest.truncate(CLOSEST_KEPT);
        }
    }

    /// Screens the runs `batch` (indices into `runs`) on all cores, skipping those whose
    /// bound already loses everywhere (all of them once `cancelled`), and adds the mixes that
    /// survive to `pending` with their own bounds. Returns how many mixes it accounted for.
    pub fn screen_runs(
        &mut self,
        batch: &[usize],
        runs: &Runs<'_>,
        (spec, gpu, links): (&SearchSpec, &Gpu, &NetworkCache),
        cancelled: bool,
        pending: &mut Pending,
    ) -> u64 {
        let members = |g: usize| &runs.mixes[runs.groups[g].clone()];
        let (todo, skip): (Vec<usize>, Vec<usize>) = batch.iter().partition(|&&g| {
            !cancelled
                && (spec.exhaustive || self.bounds.can_improve_any(members(g), runs.bounds[g]))
        });
        let mut done = 0;
        for g in skip {
            let n = members(g).len() as u64;
            let kept = members(g).iter().filter(|m| passes(m, spec)).count() as u64;
            self.pruned.constraint += n - kept;
            self.pruned.time_bound += kept;
            done += n;
        }
        // Runs of one batch that differ only in pipeline depth share one timed ledger.
        let lead_of = |&g: &usize| runs.leads[g].as_ref();
        let shared = shared_ledgers(&todo, runs, (spec, gpu, links));
        // A mix whose own lists (its schedule's, its ZeRO stage's) and the top K all beat its
        // run's bound is not screened: its own bound is at least the run's, and the lists only
        // get faster, so it would be skipped before its simulation anyway.
        let bounds = &self.bounds;
        let screened: Vec<Vec<Screened>> = todo
            .par_iter()
            .map(|g| {
                let ledger = lead_of(g).and_then(|l| shared.get(&l.key));
                let lb = runs.bounds[*g];
                let mut cache = SplitCache::default();
                members(*g)
                    .iter()
                    .map(|m| {
                        if !spec.exhaustive && !bounds.can_improve(m, lb) {
                            if passes(m, spec) {
                                Screened::TimeBound
                            } else {
                                Screened::Constraint
                            }
                        } else {
                            screen(m, spec, gpu, links, ledger, &mut cache)
                        }
                    })
                    .collect()
            })
            .collect();
        for s in screened.into_iter().flatten() {
            done += 1;
            match s {
                Screened::Constraint => self.pruned.constraint += 1,
                Screened::Invalid => self.pruned.invalid += 1,
                Screened::MemoryBound { mix, bytes } => {
                    self.pruned.memory_bound += 1;
                    self.note_over_memory(mix, bytes);
                }
                Screened::TimeBound => self.pruned.time_bound += 1,
                Screened::Open { mix, time_lb } => pending.push(mix, time_lb),
            }
        }
        done
    }

    /// Simulates `open` (mixes with their step-time lower bounds) in order of the bound, in
    /// batches over the cores, skipping what can no longer enter any list; what is left when
    /// `cancel` is set counts as skipped.
    pub fn simulate(
        &mut self,
        mut open: Vec<(Mix, f64)>,
        spec: &SearchSpec,
        gpu: &Gpu,
        links: &NetworkCache,
        cancel: &AtomicBool,
    ) {
        open.sort_by(|a, b| a.1.total_cmp(&b.1));
        let threads = rayon::current_num_threads().max(1);
        let mut i = 0;
        while i < open.len() && !cancel.load(Ordering::Relaxed) {
            let batch: Vec<&(Mix, f64)> = open[i..].iter().take(4 * threads).collect();
            i += batch.len();
            let (todo, skip): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .partition(|(m, lb)| spec.exhaustive || self.bounds.can_improve(m, *lb));
            self.pruned.time_bound += skip.len() as u64;
            // Each mix looks at `cancel` before it starts: a cancelled search stops after the
            // estimates already running, not after a whole batch.
            let results: Vec<Simulated> = todo
                .par_iter()
                .map(|(mix, _)| {
                    if cancel.load(Ordering::Relaxed) {
                        Simulated::Cancelled
                    } else {
                        simulate_one(mix, spec, gpu, links)
                    }
                })
                .collect();
            // Every candidate is counted once: a mix that fails here (its estimate refused it)
            // is invalid, not simulated.
            for r in results {
                match r {
                    Simulated::Fits(r) => {
                        self.evaluated += 1;
                        self.bounds.record(&r.mix, r.estimate.time.step_s);
                        self.fits.push(*r);
                    }
                    Simulated::DoesNotFit { mix, bytes } => {
                        self.evaluated += 1;
                        self.pruned.memory += 1;
                        self.note_over_memory(mix, bytes);
                    }
                    Simulated::Invalid => self.pruned.invalid += 1,
                    Simulated::Cancelled => self.pruned.time_bound += 1,
                }
            }
        }
        self.pruned.time_bound += (open.len() - i) as u64;
    }
}

/// What the simulation of one mix found.
enum Simulated {
    Fits(Box<Ranked>),
    /// Its memory (the walked or the simulated peak, in bytes) exceeds the GPU's.
    DoesNotFit {
        mix: Mix,
        bytes: u64,
    },
    Invalid,
    /// Not started: the search was cancelled (counted with the skipped ones).
    Cancelled,
}

/// Estimates `mix` (without the bubble's split by cause); one whose walked memory already
/// exceeds the GPU ([`Prepared::walked_peak_bytes`], the figure the estimate reports) is not
/// simulated.
fn simulate_one(mix: &Mix, spec: &SearchSpec, gpu: &Gpu, links: &NetworkCache) -> Simulated {
    let Some(r) = resolve(mix, spec, gpu) else {
        return Simulated::Invalid;
    };
    let cached = links.get(&(mix.tp, mix.cp, mix.ep, mix.pp)).cloned();
    let Ok(prepared) = Prepared::new(&r, cached) else {
        return Simulated::Invalid;
    };
    let usable = r.gpu.usable_memory_bytes();
    match prepared.walked_peak_bytes_until(usable) {
        Err(_) => return Simulated::Invalid,
        Ok(Some(peak)) if peak > usable => {
            return Simulated::DoesNotFit {
                mix: *mix,
                bytes: peak,
            }
        }
        Ok(_) => {}
    }
    match prepared.finish_with(false) {
        Ok(e) if e.memory.fits => Simulated::Fits(Box::new(Ranked {
            mix: *mix,
            label: mix.label(&spec.base),
            command: None,
            estimate: e,
        })),
        Ok(e) => Simulated::DoesNotFit {
            mix: *mix,
            bytes: e.memory.per_gpu_max_bytes,
        },
        Err(_) => Simulated::Invalid,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{enumerate_in, network_cache, network_of, timed_key};
    use super::*;
    use crate::config::{Config, GpuProfile, Layer};
    use crate::estimate::split_free_lower_bound;
    use crate::memory::{inflight_peak_bytes, stage_memories, Pipeline};

    fn spec(overlay: serde_json::Value) -> SearchSpec {
        SearchSpec {
            base: Config::from_layers(&[Layer::overrides(overlay)]).unwrap(),
            mbs_max: 2,
            top: 10,
            constraints: vec![],
            exhaustive: false,
        }
    }

    /// A small MoE with MTP and tied embeddings (so a V's last stage on the first rank changes
    /// the ledger) whose ep folds over cp x dp, and a dense model with cp, pp and vpp.
    fn cases() -> Vec<SearchSpec> {
        vec![
            spec(serde_json::json!({
                "model": {"preset": "mixtral-8x7b", "num_layers": 8, "mtp_num_layers": 1,
                          "tied_embeddings": true},
                "cluster": {"num_gpus": 16, "gpus_per_node": 8, "gpu": "h100-sxm"},
                "training": {"seq_length": 4096, "global_batch_size": 32}
            })),
            spec(serde_json::json!({
                "model": {"preset": "llama2-7b", "num_layers": 8},
                "cluster": {"num_gpus": 16, "gpus_per_node": 4, "gpu": "h100-sxm"},
                "training": {"seq_length": 8192, "global_batch_size": 16}
            })),
        ]
    }

    /// The run bounds computed once per timed ledger equal, to the bit, the bound of each
    /// run's own first valid mix timed afresh; every valid mix of a run has that run's
    /// per-microbatch work to the bit (the [`TimedKey`] names all a timed ledger depends on);
    /// and no bound exceeds the simulated step of any valid mix of its run.
    #[test]
    fn shared_run_bounds_equal_direct_ones_and_never_exceed_a_step() {
        for spec in cases() {
            let gpu = Gpu::new(GpuProfile::load(&spec.base.cluster.gpu).unwrap());
            let domain = spec.base.cluster.nvlink_domain(&gpu);
            let mixes = enumerate_in(&spec.base, spec.mbs_max, domain);
            let links = network_cache(&mixes, &spec.base, &gpu);
            let groups = groups(&mixes);
            let leads = leads(&mixes, &groups, &spec, &links);
            let bounds = group_lower_bounds(&mixes, &groups, &leads, (&spec, &gpu, &links));
            let (mut checked, mut shared, mut walked_checked) = (0, 0, 0);
            let mut per_key: HashMap<TimedKey, f64> = HashMap::new();
            let mut zeros = std::collections::HashSet::new();
            for (g_index, (g, lb)) in groups.iter().zip(&bounds).enumerate() {
                let dual = mixes[g.clone()]
                    .iter()
                    .any(|m| m.schedule == ScheduleKind::DualPipeV);
                let mut lead_seen = false;
                for m in &mixes[g.clone()] {
                    let Some(r) = resolve(m, &spec, &gpu) else {
                        continue;
                    };
                    let network = network_of(m, &r, &links);
                    let (ledger, s) = timed_ledger(&r, &network);
                    // The in-flight peak worked out once per alike rank is every rank's most.
                    let chunks = crate::model::chunks_per_rank(&r);
                    for (sets, split) in [(1, false), (3, true)] {
                        let each = stage_memories(&r, &s, &ledger, &chunks, |_| {
                            Pipeline::Inflight { sets, split }
                        });
                        let most = each.iter().map(|m| m.total).max().unwrap_or(0);
                        let once = inflight_peak_bytes(&r, &s, &ledger, &chunks, sets, split);
                        assert_eq!(once, most, "{m}");
                    }
                    let key = timed_key(m, &network);
                    if let Some(l) = &leads[g_index] {
                        assert_eq!(key, l.key, "{m}");
                    }
                    let per = split_free_per_microbatch_s(&r, &s);
                    // Every ZeRO stage shares the bound key's per-microbatch work, to the bit.
                    let first = *per_key.entry(bound_key(key)).or_insert(per);
                    assert_eq!(per.to_bits(), first.to_bits(), "{m}: {key:?}");
                    zeros.insert((bound_key(key), m.zero));
                    shared += 1;
                    if !lead_seen {
                        lead_seen = true;
                        let direct = if dual {
                            0.0
                        } else {
                            split_free_lower_bound(&r, &s)
                        };
                        assert_eq!(lb.to_bits(), direct.to_bits(), "{m}");
                    }
                    // Every third valid mix is simulated (keeps the test quick).
                    if shared % 3 == 0 {
                        let Ok(p) = Prepared::new(&r, Some(network.into_owned())) else {
                            continue;
                        };
                        let walked = p.walked_peak_bytes();
                        // Stopped below the peak, the walk answers a figure above the limit
                        // and no more than the peak; at the peak or above, the peak itself.
                        if let Ok(Some(w)) = walked {
                            let stop = w / 2;
                            let early = p.walked_peak_bytes_until(stop).unwrap().unwrap();
                            assert!(early > stop && early <= w, "{m}: {early} vs {w}");
                            assert_eq!(p.walked_peak_bytes_until(w).unwrap(), Some(w), "{m}");
                        }
                        if let Ok(e) = p.finish_with(false) {
                            assert!(*lb <= e.time.step_s, "{m}: {lb} > {}", e.time.step_s);
                            checked += 1;
                            // The memory a search checks before simulating is the estimate's.
                            if let Ok(Some(w)) = walked {
                                assert_eq!(w, e.memory.per_gpu_max_bytes, "{m}");
                                walked_checked += 1;
                            }
                        }
                    }
                }
            }
            assert!(checked > 50, "{checked} steps checked");
            assert!(walked_checked > 50, "{walked_checked} walked peaks checked");
            assert!(
                per_key.len() * 2 < shared,
                "{} ledgers for {shared} mixes",
                per_key.len()
            );
            // The sharing across ZeRO stages was exercised: bound keys met with several stages.
            assert!(
                zeros.len() >= 2 * per_key.len(),
                "{} for {}",
                zeros.len(),
                per_key.len()
            );
        }
    }

    /// What [`screen`] makes of a mix, comparable: the outcome and, for an open mix, its
    /// bound's bits.
    fn outcome(s: Screened) -> (u8, u64) {
        match s {
            Screened::Constraint => (0, 0),
            Screened::Invalid => (1, 0),
            Screened::MemoryBound { bytes, .. } => (2, bytes),
            Screened::TimeBound => (3, 0),
            Screened::Open { time_lb, .. } => (4, time_lb.to_bits()),
        }
    }

    /// Screening a run's mixes through one [`SplitCache`] with the run's shared ledger gives
    /// each mix, to the bit, what screening it alone with its own ledger gives (its validity
    /// included: in the run, mixes after the first valid one check only the split's rules,
    /// alone every rule); and the cache was used (GPipe, 1F1B and ZB-H1 splits served, the
    /// ranks' static memories kept).
    #[test]
    fn a_split_screened_once_serves_its_runs_schedules_to_the_bit() {
        for spec in cases() {
            let gpu = Gpu::new(GpuProfile::load(&spec.base.cluster.gpu).unwrap());
            let domain = spec.base.cluster.nvlink_domain(&gpu);
            let mixes = enumerate_in(&spec.base, spec.mbs_max, domain);
            let links = network_cache(&mixes, &spec.base, &gpu);
            let (mut served, mut open, mut memos) = (0, 0, 0);
            for g in groups(&mixes) {
                let mut cache = SplitCache::default();
                // The run's ledger, timed from its first valid mix.
                let shared = mixes[g.clone()].iter().find_map(|m| {
                    let r = resolve(m, &spec, &gpu)?;
                    let network = network_of(m, &r, &links);
                    let (ledger, s) = timed_ledger(&r, &network);
                    Some((timed_key(m, &network), ledger, s))
                });
                for m in &mixes[g] {
                    let before = cache.len();
                    let run = shared.as_ref();
                    let cached = outcome(screen(m, &spec, &gpu, &links, run, &mut cache));
                    let alone = outcome(screen(
                        m,
                        &spec,
                        &gpu,
                        &links,
                        None,
                        &mut SplitCache::default(),
                    ));
                    assert_eq!(cached, alone, "{m}");
                    let shares = m.vpp == 1 && super::super::SPLIT_SHARED.contains(&m.schedule);
                    served += usize::from(cache.len() == before && shares);
                    open += usize::from(cached.0 == 4);
                }
                memos += usize::from(!cache.memo.is_empty());
            }
            assert!(served > 100 && open > 100, "{served} served, {open} open");
            assert!(memos > 10, "{memos} runs kept static memories");
        }
    }
}
