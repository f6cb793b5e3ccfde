//! The search's best-first pass: runs of neighbouring mixes that share a timed ledger, the
//! step-time lower bound every pipeline split of a run shares (so that a run that cannot win
//! is not screened at all), and the simulation of what survives, in order of its own bound.

use super::{
    ledger_key, network_of, resolve, screen, timed_key, Bounds, Mix, NetworkCache, Pruned, Ranked,
    Screened, SearchSpec, SharedLedger, TimedKey,
};
use crate::config::{GpuProfile, ScheduleKind};
use crate::estimate::{split_free_bound_of, split_free_per_microbatch_s, timed_ledger, Prepared};
use rayon::prelude::*;
use std::collections::HashMap;
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

/// A run's first mix that meets the constraints and validates: its index, microbatches and
/// the key of the timed ledger every mix of the run shares.
pub(super) struct Lead {
    mix: usize,
    microbatches: u32,
    key: TimedKey,
}

/// Each run's [`Lead`] (`None` when no mix of it meets the constraints and validates).
pub(super) fn leads(
    mixes: &[Mix],
    groups: &[Range<usize>],
    spec: &SearchSpec,
    gpu: &GpuProfile,
    links: &NetworkCache,
) -> Vec<Option<Lead>> {
    groups
        .par_iter()
        .map(|g| {
            g.clone()
                .filter(|&i| passes(&mixes[i], spec))
                .find_map(|i| {
                    let m = &mixes[i];
                    let r = resolve(m, spec, gpu)?;
                    let network = network_of(m, &r, links);
                    Some(Lead {
                        mix: i,
                        microbatches: r.microbatches,
                        key: timed_key(m, &r, &network),
                    })
                })
        })
        .collect()
}

/// The timed ledger of each distinct key among `leads`, from the first lead that has it.
fn shared_ledgers<'a>(
    mixes: &[Mix],
    leads: impl Iterator<Item = &'a Lead>,
    spec: &SearchSpec,
    gpu: &GpuProfile,
    links: &NetworkCache,
) -> HashMap<TimedKey, SharedLedger> {
    let mut firsts: HashMap<TimedKey, usize> = HashMap::new();
    for l in leads {
        firsts.entry(l.key).or_insert(l.mix);
    }
    firsts
        .into_par_iter()
        .filter_map(|(key, i)| {
            let m = &mixes[i];
            let r = resolve(m, spec, gpu)?;
            let network = network_of(m, &r, links);
            let (ledger, s) = timed_ledger(&r, &network);
            Some((key, (key, ledger, s)))
        })
        .collect()
}

/// A lower bound of the step of every mix of each run ([`crate::estimate::split_free_lower_bound`]), from its
/// lead; 0 (never skipped) when it has none, and for DualPipe-V, whose overlapped forward and
/// backward the bound does not cover. The per-microbatch work is computed once per timed
/// ledger (runs that differ only in pipeline depth share it), so to the bit as per run.
pub(super) fn group_lower_bounds(
    mixes: &[Mix],
    groups: &[Range<usize>],
    leads: &[Option<Lead>],
    spec: &SearchSpec,
    gpu: &GpuProfile,
    links: &NetworkCache,
) -> Vec<f64> {
    let dual = |g: &Range<usize>| {
        mixes[g.clone()]
            .iter()
            .any(|m| m.schedule == ScheduleKind::DualPipeV)
    };
    let bounded: Vec<Option<&Lead>> = groups
        .iter()
        .zip(leads)
        .map(|(g, l)| l.as_ref().filter(|_| !dual(g)))
        .collect();
    let mut firsts: HashMap<TimedKey, usize> = HashMap::new();
    for l in bounded.iter().flatten() {
        firsts.entry(l.key).or_insert(l.mix);
    }
    let per_microbatch_s: HashMap<TimedKey, f64> = firsts
        .into_par_iter()
        .filter_map(|(key, i)| {
            let m = &mixes[i];
            let r = resolve(m, spec, gpu)?;
            let network = network_of(m, &r, links);
            let (_, s) = timed_ledger(&r, &network);
            Some((key, split_free_per_microbatch_s(&r, &s)))
        })
        .collect();
    bounded
        .iter()
        .map(|l| {
            l.and_then(|l| {
                let per = per_microbatch_s.get(&l.key)?;
                Some(split_free_bound_of(*per, l.microbatches, mixes[l.mix].pp))
            })
            .unwrap_or(0.0)
        })
        .collect()
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
    pub leads: &'a [Option<Lead>],
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
        // Runs of one batch that differ only in pipeline depth share one timed ledger.
        let lead_of = |&g: &usize| runs.leads[g].as_ref();
        let shared = shared_ledgers(
            runs.mixes,
            todo.iter().filter_map(lead_of),
            spec,
            gpu,
            links,
        );
        // A mix whose own lists (its schedule's, its ZeRO stage's) and the top K all beat its
        // run's bound is not screened: its own bound is at least the run's, and the lists only
        // get faster, so it would be skipped before its simulation anyway.
        let bounds = &self.bounds;
        let screened: Vec<Vec<Screened>> = todo
            .par_iter()
            .map(|g| {
                let ledger = lead_of(g).and_then(|l| shared.get(&l.key));
                let lb = runs.bounds[*g];
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
                            screen(m, spec, gpu, links, ledger)
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
                Screened::MemoryBound => self.pruned.memory_bound += 1,
                Screened::TimeBound => self.pruned.time_bound += 1,
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

#[cfg(test)]
mod tests {
    use super::super::{enumerate_in, network_cache};
    use super::*;
    use crate::config::{Config, Layer};
    use crate::estimate::split_free_lower_bound;

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
            let gpu = GpuProfile::load(&spec.base.cluster.gpu).unwrap();
            let domain = spec.base.cluster.nvlink_domain(&gpu);
            let mixes = enumerate_in(&spec.base, spec.mbs_max, domain);
            let links = network_cache(&mixes, &spec.base, &gpu);
            let groups = groups(&mixes);
            let leads = leads(&mixes, &groups, &spec, &gpu, &links);
            let bounds = group_lower_bounds(&mixes, &groups, &leads, &spec, &gpu, &links);
            let (mut checked, mut shared) = (0, 0);
            let mut per_key: HashMap<TimedKey, f64> = HashMap::new();
            for (g, lb) in groups.iter().zip(&bounds) {
                let dual = mixes[g.clone()]
                    .iter()
                    .any(|m| m.schedule == ScheduleKind::DualPipeV);
                let mut lead_seen = false;
                for m in &mixes[g.clone()] {
                    let Some(r) = resolve(m, &spec, &gpu) else {
                        continue;
                    };
                    let network = network_of(m, &r, &links);
                    let (_, s) = timed_ledger(&r, &network);
                    let key = timed_key(m, &r, &network);
                    let per = split_free_per_microbatch_s(&r, &s);
                    let first = *per_key.entry(key).or_insert(per);
                    assert_eq!(per.to_bits(), first.to_bits(), "{m}: {key:?}");
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
                        let e = Prepared::new(&r, Some(network.into_owned()))
                            .and_then(|p| p.finish_with(false));
                        if let Ok(e) = e {
                            assert!(*lb <= e.time.step_s, "{m}: {lb} > {}", e.time.step_s);
                            checked += 1;
                        }
                    }
                }
            }
            assert!(checked > 50, "{checked} steps checked");
            assert!(
                per_key.len() * 2 < shared,
                "{} ledgers for {shared} mixes",
                per_key.len()
            );
        }
    }
}
