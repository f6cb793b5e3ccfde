//! The search in slices: [`Search::new`] enumerates and bounds the candidates, each
//! [`Search::step`] does one bounded piece of work (screen one batch of runs, or simulate a
//! few batches of survivors), and [`Search::finish`] ranks. [`super::search`] steps it to the
//! end on all cores; the web build (one thread, no background work) steps it between frames,
//! so the page stays responsive. Stepping changes nothing: the batches are the same.

use super::run::Lead;
use super::{
    enumerate_in, group_lower_bounds, groups, leads, network_cache, resolve, Bounds, Gpu,
    NetworkCache, Pending, Pruned, Ranked, Run, Runs, SearchError, SearchResult, SearchSpec,
};
use crate::config::GpuProfile;
use crate::estimate::Prepared;
use rayon::prelude::*;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(not(target_arch = "wasm32"))]
use std::time::Instant;
#[cfg(target_arch = "wasm32")]
use web_time::Instant;

/// Simulation batches (of 4 mixes per thread, as [`Run::simulate`] takes them) per step.
const SIMULATE_BATCHES_PER_STEP: usize = 8;

/// What one [`Search::step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Screened a batch of runs: `done` of the `total` candidates are accounted for.
    Screened { done: u64, total: u64 },
    /// Simulated some survivors.
    Simulated,
    /// Nothing is left; call [`Search::finish`].
    Done,
}

/// A search in progress.
pub struct Search {
    spec: SearchSpec,
    start: Instant,
    gpu: Gpu,
    mixes: Vec<super::Mix>,
    links: NetworkCache,
    groups: Vec<Range<usize>>,
    leads: Vec<Option<Lead>>,
    group_lb: Vec<f64>,
    /// Runs in order of their bound; `next` is the first not yet screened.
    order: Vec<usize>,
    next: usize,
    run: Run,
    pending: Pending,
    /// Survivors taken for simulation (lowest bound first), not yet simulated.
    ready: Vec<(super::Mix, f64)>,
    /// True while `ready` is being worked through (the screening waits).
    simulating: bool,
    done: u64,
}

impl Search {
    /// Checks `spec`, enumerates its candidates and bounds their runs.
    pub fn new(spec: &SearchSpec) -> Result<Search, SearchError> {
        if spec.mbs_max == 0 {
            return Err(SearchError::MbsMax);
        }
        if spec.top == 0 {
            return Err(SearchError::Top);
        }
        crate::config::check_base(&spec.base)?;
        let start = Instant::now();
        let gpu = Gpu::new(GpuProfile::load(&spec.base.cluster.gpu)?);
        let mixes = enumerate_in(
            &spec.base,
            spec.mbs_max,
            spec.base.cluster.nvlink_domain(&gpu),
        );
        let links = network_cache(&mixes, &spec.base, &gpu);
        // Best-first over the runs of mixes that share a timed ledger: each run's split-free
        // lower bound orders them, and a run that cannot enter any list is not even screened.
        let groups = groups(&mixes);
        let leads = leads(&mixes, &groups, spec, &links);
        let group_lb: Vec<f64> = if spec.exhaustive {
            vec![0.0; groups.len()]
        } else {
            group_lower_bounds(&mixes, &groups, &leads, (spec, &gpu, &links))
        };
        let mut order: Vec<usize> = (0..groups.len()).collect();
        order.sort_by(|&a, &b| group_lb[a].total_cmp(&group_lb[b]));
        Ok(Search {
            spec: spec.clone(),
            start,
            gpu,
            mixes,
            links,
            groups,
            leads,
            group_lb,
            order,
            next: 0,
            run: Run {
                bounds: Bounds {
                    top: Vec::new(),
                    k: spec.top.max(1),
                    schedule: HashMap::new(),
                    zero: HashMap::new(),
                },
                fits: Vec::new(),
                pruned: Pruned::default(),
                evaluated: 0,
                closest: Vec::new(),
            },
            pending: Pending::default(),
            ready: Vec::new(),
            simulating: false,
            done: 0,
        })
    }

    /// Candidates accounted for so far, and all candidates.
    pub fn progress(&self) -> (u64, u64) {
        let total = self.mixes.len() as u64;
        (self.done.min(total), total)
    }

    /// Does the next piece of work: simulates, lowest bound first, what no unscreened run can
    /// undercut (a few batches a step), else screens the next runs (about 1024 candidates per
    /// thread between bound updates).
    pub fn step(&mut self, cancel: &AtomicBool) -> Step {
        let s = &self.spec;
        if !self.simulating {
            let frontier = self
                .order
                .get(self.next)
                .map_or(f64::INFINITY, |&g| self.group_lb[g]);
            self.ready = self.pending.take_up_to(frontier);
            self.simulating = true;
        }
        if !self.ready.is_empty() {
            let threads = rayon::current_num_threads().max(1);
            let n = self
                .ready
                .len()
                .min(4 * threads * SIMULATE_BATCHES_PER_STEP);
            let slice: Vec<_> = self.ready.drain(..n).collect();
            self.run.simulate(slice, s, &self.gpu, &self.links, cancel);
            return Step::Simulated;
        }
        self.simulating = false;
        if self.next == self.order.len() {
            return Step::Done;
        }
        let threads = rayon::current_num_threads().max(1);
        let mut batch = Vec::new();
        let mut size = 0;
        while self.next < self.order.len() && (batch.is_empty() || size < 1024 * threads) {
            let g = self.order[self.next];
            self.next += 1;
            size += self.groups[g].len();
            batch.push(g);
        }
        let cancelled = cancel.load(Ordering::Relaxed);
        self.done += self.run.screen_runs(
            &batch,
            &Runs {
                mixes: &self.mixes,
                groups: &self.groups,
                leads: &self.leads,
                bounds: &self.group_lb,
            },
            (s, &self.gpu, &self.links),
            cancelled,
            &mut self.pending,
        );
        let (done, total) = self.progress();
        Step::Screened { done, total }
    }

    /// Ranks what was found (call once [`Search::step`] returned [`Step::Done`]; earlier, the
    /// result covers what was evaluated and the rest is not counted).
    pub fn finish(self, cancel: &AtomicBool) -> SearchResult {
        self.finish_with(cancel, true)
    }

    /// [`Search::finish`]; with `why`, a result without a mix says why ([`super::NoFit`]:
    /// every candidate the constraints kept is validated again for its rule).
    pub(super) fn finish_with(self, cancel: &AtomicBool, why: bool) -> SearchResult {
        let Search {
            spec,
            start,
            gpu,
            mixes,
            links,
            run,
            ..
        } = self;
        let Run {
            mut fits,
            pruned,
            evaluated,
            closest,
            ..
        } = run;
        let no_fit = (why && fits.is_empty() && !cancel.load(Ordering::Relaxed))
            .then(|| super::NoFit::of(&spec, &gpu, &mixes, &pruned, &closest, cancel));
        // Cancelled while saying why: the answer is partial, so none is given.
        let interrupted = cancel.load(Ordering::Relaxed);
        let no_fit = no_fit.filter(|_| !interrupted);
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
                let full = resolve(m, &spec, &gpu).and_then(|r| {
                    let cached = links.get(&(m.tp, m.cp, m.ep, m.pp)).cloned();
                    Prepared::new(&r, cached).ok()?.finish().ok()
                });
                if let Some(e) = full {
                    ranked.estimate = e;
                }
            });
        }
        SearchResult {
            candidates: mixes.len() as u64,
            pruned,
            evaluated,
            elapsed_s: start.elapsed().as_secs_f64(),
            interrupted,
            top: fits,
            best_per_schedule,
            best_per_zero,
            no_fit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Layer};
    use crate::search::search;
    use std::sync::Mutex;

    fn spec(exhaustive: bool) -> SearchSpec {
        let base = Config::from_layers(&[Layer::overrides(serde_json::json!({
            "model": {"preset": "llama2-7b"}, "cluster": {"num_gpus": 16},
            "training": {"seq_length": 4096, "global_batch_size": 64}
        }))])
        .unwrap();
        SearchSpec {
            base,
            mbs_max: 2,
            top: 8,
            constraints: Vec::new(),
            exhaustive,
        }
    }

    /// Steps `spec` to its end; returns the result, the progress reports and the steps that
    /// simulated.
    fn stepped(spec: &SearchSpec) -> (SearchResult, Vec<(u64, u64)>, usize) {
        let cancel = AtomicBool::new(false);
        let mut s = Search::new(spec).unwrap();
        let (mut reports, mut simulated) = (Vec::new(), 0);
        loop {
            match s.step(&cancel) {
                Step::Screened { done, total } => reports.push((done, total)),
                Step::Simulated => simulated += 1,
                Step::Done => break,
            }
        }
        (s.finish(&cancel), reports, simulated)
    }

    fn key(r: &SearchResult) -> Vec<(String, u64)> {
        r.top
            .iter()
            .map(|t| (t.mix.to_string(), t.estimate.time.step_s.to_bits()))
            .collect()
    }

    /// Stepping gives what the one-shot search gives, bit for bit, with the same progress
    /// reports; in one thread (as in the browser) the top mixes are the exhaustive search's
    /// (which simulates every candidate that may fit), with simulation spread over steps.
    #[test]
    fn stepped_search_matches_the_one_shot_and_the_exhaustive_answer() {
        let spec = spec(false);
        let reports = Mutex::new(Vec::new());
        let one = search(
            &spec,
            &|d, t| reports.lock().unwrap().push((d, t)),
            &AtomicBool::new(false),
        )
        .unwrap();
        let (sliced, sliced_reports, _) = stepped(&spec);
        assert_eq!(key(&sliced), key(&one));
        assert_eq!(sliced_reports, *reports.lock().unwrap());
        assert_eq!(
            serde_json::to_value(sliced.pruned).unwrap(),
            serde_json::to_value(one.pruned).unwrap()
        );
        assert_eq!(
            (sliced.evaluated, sliced.candidates),
            (one.evaluated, one.candidates)
        );
        let last = *sliced_reports.last().unwrap();
        assert_eq!(last.0, last.1, "every candidate is accounted for");

        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (single, _, _) = pool.install(|| stepped(&spec));
        let (exhaustive, _, simulated) = pool.install(|| stepped(&self::spec(true)));
        assert!(!single.top.is_empty());
        assert_eq!(key(&single), key(&exhaustive));
        assert!(
            simulated > 1,
            "simulation was not sliced ({simulated} steps)"
        );
    }
}
