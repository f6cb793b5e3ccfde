//! The estimate's last steps, after [`Prepared`]: simulate the schedule, walk the memory,
//! count the step's collectives, find the critical rank's step time, and assemble the
//! [`Estimate`].

use super::breakdown;
use super::{
    verdict_with_margin, CommReport, Estimate, EstimateError, GroupInfo, MemoryReport, Prepared,
    ScheduleReport, Throughput,
};
use crate::comm::rank_step_bytes;
use crate::config::ScheduleKind;
use crate::layout::GroupKind;
use crate::memory::{peak_total_until, stage_memories, Pipeline, StageMemory};
use crate::model::{CommKind, PerGroup};
use crate::schedule::{
    simulate_extrapolated, simulate_summaries, simulate_summary, simulates_in_full,
    GeneratedProgram, PipelineSummary,
};
use crate::time::StepTime;

/// Programs of at most this many (stage, microbatch) cells are generated in full for the
/// memory walk ([`crate::memory::activation_peak`]).
const MAX_WALKED_CELLS: u64 = 1 << 16;

/// What rank `rank` of the generated program `g` runs, for the memory walk: its actions, with
/// the live sets kept with the program where they are whole passes.
fn walked(g: &GeneratedProgram, rank: usize) -> Pipeline<'_> {
    let actions = &g.program().ranks[rank];
    match g.whole_passes_sets(rank) {
        Some(sets) => Pipeline::WholePasses { actions, sets },
        None => Pipeline::Actions(actions),
    }
}

/// The simulated schedule: the generated program when short enough to walk, the simulation,
/// and (for the bubble split) the run with free hops.
struct Simulated {
    generated: Option<GeneratedProgram>,
    sim: PipelineSummary,
    free_run: Option<PipelineSummary>,
}

impl Prepared<'_> {
    /// Simulates the schedule and assembles the estimate.
    pub fn finish(self) -> Result<Estimate, EstimateError> {
        self.finish_with(true)
    }

    /// As [`Prepared::finish`]; without `split_bubble` the bubble is not split by cause (two
    /// simulations fewer: `warmup_cooldown_s`, `imbalance_s` and `pp_wait_s` are 0), for a
    /// search that ranks by step time and re-estimates what it reports.
    pub fn finish_with(self, split_bubble: bool) -> Result<Estimate, EstimateError> {
        let params = self.param_report();
        let flops = self.flops_report();
        let r = self.r;
        let cfg = &r.config;
        let tr = &cfg.training;
        let par = &cfg.parallel;
        let (per_step_model, per_step_hardware) = (flops.per_step_model, flops.per_step_hardware);
        let tokens_per_step = (tr.global_batch_size * tr.seq_length) as f64;

        let simulated = self.simulate(split_bubble)?;
        let sim = &simulated.sim;
        let memory_stages = self.memory_stages(&simulated);
        let comm = self.step_bytes();
        let time = self.step_time(&simulated, split_bubble)?;
        let step_s = time.step_s;
        let per_gpu_max_bytes = memory_stages.iter().map(|st| st.total).max().unwrap_or(0);
        let reserved = memory_stages
            .iter()
            .map(|st| st.reserved())
            .max()
            .unwrap_or(0);
        let world = r.world() as f64;
        let groups = GroupKind::ALL
            .iter()
            .map(|&g| GroupInfo {
                group: g,
                size: self.network.geometry(g).size,
                crosses_nodes: self.network.crosses_nodes(g),
            })
            .collect();
        let usable_bytes = r.gpu.usable_memory_bytes();
        // Fits on the allocated peak: the caching allocator returns its cached segments before
        // a request fails (src/memory/allocator.rs), so its reserve never makes a run fail.
        let fits = per_gpu_max_bytes <= usable_bytes;
        let memory_interval = crate::interval::memory::shipped()
            .map_err(|e| EstimateError::Interval(e.to_string()))?
            .lookup(cfg.training.framework);
        let verdict = memory_interval.verdict(reserved, usable_bytes);
        for (quantity, value) in [
            ("step time", step_s),
            ("compute time", time.compute_s),
            ("exposed communication", time.exposed_comm_s),
            ("bubble fraction", sim.bubble_fraction),
        ] {
            if !value.is_finite() {
                return Err(EstimateError::NonFinite { quantity, value });
            }
        }
        let interval = crate::interval::shipped()
            .map_err(|e| EstimateError::Interval(e.to_string()))?
            .lookup(&crate::interval::Regime::of(
                cfg,
                &r.gpu,
                time.exposed_comm_s / step_s,
            ));
        let mut estimate = Estimate {
            config: cfg.clone(),
            gpu: r.gpu.name.clone(),
            params,
            flops,
            memory: MemoryReport {
                per_gpu_max_bytes,
                capacity_bytes: r.gpu.memory_bytes,
                fits,
                fits_at_p90: verdict.fits,
                per_gpu_max_bytes_p10: verdict.peak_bytes_p10,
                per_gpu_max_bytes_p90: verdict.peak_bytes_p90,
                margin_bytes_p90: verdict.margin_bytes_p90,
                interval: memory_interval,
                margin_fraction: r.gpu.memory_margin_fraction,
                usable_bytes,
                stages: memory_stages,
            },
            communication: CommReport {
                per_step_bytes_per_gpu: comm.map(|b| b.round() as u64),
                groups,
            },
            schedule: ScheduleReport {
                name: par.schedule.to_string(),
                pp: par.pp,
                vpp: par.vpp,
                microbatches: r.microbatches,
                bubble_fraction: sim.bubble_fraction,
                peak_inflight_microbatches: sim.peak_inflight.clone(),
            },
            time,
            throughput: Throughput {
                tokens_per_s: tokens_per_step / step_s,
                tflops_per_gpu: per_step_model / step_s / world / 1e12,
                hardware_tflops_per_gpu: per_step_hardware / step_s / world / 1e12,
                mfu: per_step_model / (step_s * world * self.peak),
                tokens_per_s_p10: 0.0,
                tokens_per_s_p90: 0.0,
                mfu_p10: 0.0,
                mfu_p90: 0.0,
            },
            step_interval: interval.clone(),
            verdict: verdict_with_margin(&time, per_gpu_max_bytes, &r.gpu, self.advice_context()),
            warnings: r.warnings.clone(),
            framework_overrides: r.config.training.framework.overrides(&r.config.parallel),
            table_coverage: self.table_coverage(),
            nvlink_domain: Some(r.nvlink_domain.clone()).filter(|d| d.is_worth_saying()),
        };
        estimate.set_interval(interval);
        Ok(estimate)
    }

    /// What the verdict's advice needs of the layout: routed experts, and which groups run
    /// inside one NVLink domain already.
    fn advice_context(&self) -> breakdown::AdviceContext {
        let inside = |g| !self.network.crosses_nodes(g);
        breakdown::AdviceContext {
            moe: self.r.config.model.is_moe(),
            tp_inside_domain: inside(GroupKind::Tp),
            ep_inside_domain: inside(GroupKind::Ep),
            expert_tp_inside_domain: inside(GroupKind::ExpertTp),
        }
    }

    /// Which ops the profile's measured tables time, `None` without tables.
    fn table_coverage(&self) -> Option<crate::time::TableCoverage> {
        let l = &self.ledger;
        let blocks = [&l.embedding, &l.dense, &l.output]
            .into_iter()
            .chain(
                [&l.moe, &l.mtp, &l.dense_hp, &l.moe_hp]
                    .into_iter()
                    .flatten(),
            )
            .chain(&l.variants);
        let rates = super::prepare::rates(self.r);
        crate::time::TableCoverage::when_tables(&self.r.gpu.tables, blocks, &rates, &self.network)
    }

    /// Generates the program when it is short enough to walk and simulates it (in full when
    /// it would not be extrapolated anyway, with the free-hop run the bubble split needs).
    fn simulate(&self, split_bubble: bool) -> Result<Simulated, EstimateError> {
        let r = self.r;
        let par = &r.config.parallel;
        let costs = &self.costs;
        // Activations walk each rank's action list when the program is short enough to
        // generate (the memory of `parsim execute` runs is compared with it); longer programs,
        // which the simulation extrapolates, use the peak count of live chunk sets.
        let generated =
            if par.pp as u64 * par.vpp as u64 * r.microbatches as u64 <= MAX_WALKED_CELLS {
                Some(GeneratedProgram::of(
                    par.schedule,
                    par.pp,
                    par.vpp,
                    r.microbatches,
                )?)
            } else {
                None
            };
        // One generation serves both the memory walk and, when it would not be extrapolated
        // anyway, the simulation.
        // The bubble split's run with free hops shares the walk of the schedule.
        let checked = generated.as_ref().map(GeneratedProgram::checked);
        let (sim, free_run) = match checked {
            Some(p) if simulates_in_full(par.schedule, par.pp, r.microbatches) => {
                if split_bubble && par.pp > 1 {
                    let free = breakdown::free_hops(costs);
                    let [sim, free_run] = simulate_summaries(p, [costs, &free])?;
                    (sim, Some(free_run))
                } else {
                    (simulate_summary(p, costs)?, None)
                }
            }
            _ => (
                simulate_extrapolated(par.schedule, par.pp, par.vpp, r.microbatches, costs)?,
                None,
            ),
        };
        Ok(Simulated {
            generated,
            sim,
            free_run,
        })
    }

    /// Memory stage by stage: each rank's action list walked when generated, else its peak
    /// of live chunk sets from the simulation.
    fn memory_stages(&self, simulated: &Simulated) -> Vec<StageMemory> {
        let r = self.r;
        let par = &r.config.parallel;
        if let Some(g) = &simulated.generated {
            return self.walked_stages(g);
        }
        let sim = &simulated.sim;
        stage_memories(r, &self.s, &self.ledger, &self.chunks, |rank| {
            Pipeline::Inflight {
                sets: sim.peak_inflight[rank],
                split: matches!(par.schedule, ScheduleKind::ZbH1 | ScheduleKind::ZbV),
            }
        })
    }

    /// Memory stage by stage from each rank's action list in the generated program `g`.
    fn walked_stages(&self, g: &GeneratedProgram) -> Vec<StageMemory> {
        stage_memories(self.r, &self.s, &self.ledger, &self.chunks, |rank| {
            walked(g, rank)
        })
    }

    /// The most loaded rank's memory as [`Prepared::finish`] reports it, before any
    /// simulation, where the program is short enough to walk (`None` otherwise: the
    /// simulation's peak of live chunk sets gives it). A search skips simulating what
    /// cannot fit.
    pub fn walked_peak_bytes(&self) -> Result<Option<u64>, EstimateError> {
        self.walked_peak_bytes_until(u64::MAX)
    }

    /// As [`Prepared::walked_peak_bytes`], but once a rank's total exceeds `stop_above` that
    /// total is the answer (the ranks left are not walked): whether the mix fits, cheaply.
    pub fn walked_peak_bytes_until(&self, stop_above: u64) -> Result<Option<u64>, EstimateError> {
        let r = self.r;
        let par = &r.config.parallel;
        if par.pp as u64 * par.vpp as u64 * r.microbatches as u64 > MAX_WALKED_CELLS {
            return Ok(None);
        }
        let g = GeneratedProgram::of(par.schedule, par.pp, par.vpp, r.microbatches)?;
        Ok(Some(peak_total_until(
            r,
            &self.s,
            &self.ledger,
            &self.chunks,
            |rank| walked(&g, rank),
            stop_above,
        )))
    }

    /// The step's communication volume per group on the most loaded rank.
    fn step_bytes(&self) -> PerGroup {
        let mut comm = PerGroup::default();
        // Ranks sharing a step-collective list hold the same blocks: their bytes are one count.
        for (i, list) in self.step.iter().enumerate() {
            if let Some(rank) = self.step_of.iter().position(|&j| j == i) {
                comm.max(&rank_step_bytes(
                    self.r,
                    &self.s,
                    &self.ledger,
                    &self.chunks[rank],
                    list,
                ));
            }
        }
        comm
    }

    /// The step time of the critical rank (the last to finish: its last action, then the
    /// data-parallel tail and the optimizer step), split into compute, exposed communication
    /// and bubble.
    fn step_time(
        &self,
        simulated: &Simulated,
        split_bubble: bool,
    ) -> Result<StepTime, EstimateError> {
        let r = self.r;
        let par = &r.config.parallel;
        let (chunks, chunk_times, sim) = (&self.chunks, &self.chunk_times, &simulated.sim);
        let mut critical = (f64::MIN, 0usize, 0.0, 0.0);
        for (rank, &(tail, optimizer_s)) in self.after.iter().enumerate() {
            let finish = sim.finish[rank];
            let end = finish + tail + optimizer_s;
            if end > critical.0 {
                critical = (end, rank, tail, optimizer_s);
            }
        }
        let (step_s, crit, dp_tail, optimizer_s) = critical;
        let crit_chunks = &chunks[crit];
        let mb = r.microbatches as f64;
        let compute_s = mb
            * crit_chunks
                .iter()
                .map(|c| chunk_times[c.stage].compute)
                .sum::<f64>();
        let mut by_group = PerGroup::default();
        for c in crit_chunks {
            by_group.add(&chunk_times[c.stage].exposed, mb);
        }
        by_group[CommKind::Dp] += dp_tail;
        let finish = sim.finish[crit];
        let bubble_s = (finish - sim.busy[crit]).max(0.0);
        let pipe = breakdown::Pipe {
            kind: par.schedule,
            pp: par.pp,
            vpp: par.vpp,
            microbatches: r.microbatches,
        };
        let idle = if split_bubble {
            let checked = simulated.generated.as_ref().map(GeneratedProgram::checked);
            let free_run = simulated.free_run.as_ref();
            breakdown::split_idle(pipe, &self.costs, sim, crit, checked, free_run)?
        } else {
            breakdown::IdleSplit::default()
        };
        let per_mb_s: Vec<f64> = chunks
            .iter()
            .map(|ch| {
                ch.iter()
                    .map(|c| {
                        let t = &chunk_times[c.stage];
                        t.fwd + t.input_grad + t.weight_grad
                    })
                    .sum()
            })
            .collect();
        Ok(StepTime {
            step_s,
            // Set with the interval, once the estimate is assembled.
            step_s_p10: step_s,
            step_s_p90: step_s,
            compute_s,
            exposed_comm_s: by_group.total(),
            exposed_comm_by_group_s: by_group,
            bubble_s,
            warmup_cooldown_s: idle.warmup_cooldown_s,
            imbalance_s: idle.imbalance_s,
            pp_wait_s: idle.pp_wait_s,
            imbalance: breakdown::slowest_stage(chunks, &per_mb_s),
            dp_tail_s: dp_tail,
            optimizer_s,
        })
    }
}
