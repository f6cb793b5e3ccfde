//! The search's best-first pass: runs of neighbouring mixes that share a timed ledger, the
//! step-time lower bound every pipeline split of a run shares (so that a run that cannot win
//! is not screened at all), and the simulation of what survives, in order of its own bound.

use super::{
    ledger_key, network_of, resolve, screen, Bounds, Mix, NetworkCache, Pruned, Ranked, Screened,
    SearchSpec,
};
use crate::config::{GpuProfile, ScheduleKind};
use crate::estimate::{split_free_lower_bound, timed_ledger, Prepared};
use rayon::prelude::*;
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

/// A lower bound of the step of every mix of one run ([`split_free_lower_bound`]), from its
/// first mix that meets the constraints and validates; 0 (never skipped) when none does, and
/// for DualPipe-V, whose overlapped forward and backward the bound does not cover.
pub(super) fn group_lower_bound(
    group: &[Mix],
    spec: &SearchSpec,
    gpu: &GpuProfile,
    links: &NetworkCache,
) -> f64 {
    if group.iter().any(|m| m.schedule == ScheduleKind::DualPipeV) {
        return 0.0;
    }
    group
        .iter()
        .filter(|m| passes(m, spec))
        .find_map(|m| {
            let r = resolve(m, spec, gpu)?;
            let network = network_of(m, &r, links);
            let (_, s) = timed_ledger(&r, &network);
            Some(split_free_lower_bound(&r, &s))
        })
        .unwrap_or(0.0)
}

/// What the search has found so far.
pub(super) struct Run {
    pub bounds: Bounds,
    pub fits: Vec<Ranked>,
    pub pruned: Pruned,
    pub evaluated: u64,
}

/// The enumerated mixes, their runs and each run's split-free lower bound.
pub(super) struct Runs<'a> {
    pub mixes: &'a [Mix],
    pub groups: &'a [Range<usize>],
    pub bounds: &'a [f64],
}

impl Run {
    /// Screens the runs `batch` (indices into `runs`) on all cores, skipping those whose
    /// bound already loses everywhere (all of them once `cancelled`), and adds the mixes that
    /// survive to `pending` with their own bounds. Returns how many mixes it accounted for.
    pub fn screen_runs(
        &mut self,
        batch: &[usize],
        runs: &Runs<'_>,
        (spec, gpu, links): (&SearchSpec, &GpuProfile, &NetworkCache),
        cancelled: bool,
        pending: &mut Vec<(Mix, f64)>,
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
        let screened: Vec<Vec<Screened>> = todo
            .par_iter()
            .map(|&g| {
                let mut cache = None;
                members(g)
                    .iter()
                    .map(|m| screen(m, spec, gpu, links, &mut cache))
                    .collect()
            })
            .collect();
        for s in screened.into_iter().flatten() {
            done += 1;
            match s {
                Screened::Constraint => self.pruned.constraint += 1,
                Screened::Invalid => self.pruned.invalid += 1,
                Screened::MemoryBound => self.pruned.memory_bound += 1,
                Screened::Open { mix, time_lb } => pending.push((mix, time_lb)),
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
        gpu: &GpuProfile,
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
            let results: Vec<Option<Ranked>> = todo
                .par_iter()
                .map(|(mix, _)| {
                    let r = resolve(mix, spec, gpu)?;
                    let cached = links.get(&(mix.tp, mix.cp, mix.ep, mix.pp)).cloned();
                    let e = Prepared::new(&r, cached).ok()?.finish_with(false).ok()?;
                    Some(Ranked {
                        mix: *mix,
                        estimate: e,
                    })
                })
                .collect();
            for r in results {
                self.evaluated += 1;
                match r {
                    Some(r) if r.estimate.memory.fits => {
                        self.bounds.record(&r.mix, r.estimate.time.step_s);
                        self.fits.push(r);
                    }
                    Some(_) => self.pruned.memory += 1,
                    None => self.pruned.invalid += 1,
                }
            }
        }
        self.pruned.time_bound += (open.len() - i) as u64;
    }
}
