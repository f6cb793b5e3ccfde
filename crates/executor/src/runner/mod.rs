//! Plays a Plan on the CPU backend: one thread per rank (see [`rank`] for one rank's step
//! loop, [`zero`] for data parallelism with ZeRO 0-3 and the optimizer), a failing rank
//! stopping the others, and the ranks' results assembled into a [`RunReport`].

#[cfg(feature = "cuda")]
mod cuda;
mod export;
mod grad_buckets;
mod rank;
mod zero;

use crate::backend::cpu::{Cpu, CpuComm, CpuOps, World};
use crate::error::{ExecError, OptionsError};
use crate::pieces::{merge, pieces_of, TensorPieces};
use crate::plan::{Plan, Precision};
pub use crate::run_report::{PhaseTimes, RankReport, RunReport};
use crate::trace::Clock;
#[cfg(feature = "cuda")]
pub use cuda::{layout as cuda_layout, run_cuda, CudaLayout, CudaWorld};
use export::Element;
use parsim_plan::run::RunLength;
use rank::{run_rank, RankOutput};
use std::sync::Arc;

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Steps in all (warm-up included).
    pub steps: u32,
    /// Leading steps left out of the timing.
    pub warmup: u32,
    /// Collect every parameter (as global tensors) after the last step.
    pub export_params: bool,
    /// Skip the optimizer and collect the accumulated gradients of the last step instead
    /// (ZeRO 0/1 only: the full gradients, summed over data parallelism).
    pub export_grads: bool,
    /// Added to parameter elements (global tensor, flat index, delta) after initialisation:
    /// finite differences.
    pub perturb: Vec<(String, usize, f32)>,
    /// fp32, or the bf16 mixed-precision recipe.
    pub precision: Precision,
    /// Record every action of the timed steps on this clock (`RunReport::traces`).
    pub trace: Option<Clock>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            steps: 3,
            warmup: 1,
            export_params: false,
            export_grads: false,
            perturb: Vec::new(),
            precision: Precision::Fp32,
            trace: None,
        }
    }
}

impl From<&RunLength> for RunOptions {
    /// A timed run of `l.steps` steps in `l.precision`, exporting nothing.
    fn from(l: &RunLength) -> Self {
        RunOptions {
            steps: l.steps,
            warmup: l.warmup,
            precision: l.precision,
            ..RunOptions::default()
        }
    }
}

/// [`run_cpu`] for a caller that asks only for a [`RunLength`] (the engine's calibration
/// sweep), with the error boxed.
pub fn run_cpu_for(
    plan: &Plan,
    l: &RunLength,
) -> Result<RunReport, Box<dyn std::error::Error + Send + Sync>> {
    Ok(run_cpu(plan, &RunOptions::from(l))?)
}

/// The checks every backend makes before running: a valid Plan, at least one timed step,
/// gradients exported only where they are whole.
fn check_run(plan: &Plan, opts: &RunOptions) -> Result<(), ExecError> {
    plan.validate()?;
    if opts.export_grads && plan.parallel.zero >= 2 {
        return Err(OptionsError::ExportGradsNeedsFullGradients {
            zero: plan.parallel.zero,
        }
        .into());
    }
    if opts.steps == 0 || opts.warmup >= opts.steps {
        return Err(OptionsError::StepsNotAboveWarmup {
            steps: opts.steps,
            warmup: opts.warmup,
        }
        .into());
    }
    Ok(())
}

/// Runs `plan` on CPU threads.
pub fn run_cpu(plan: &Plan, opts: &RunOptions) -> Result<RunReport, ExecError> {
    check_run(plan, opts)?;
    let world = World::new(plan.ranks.len());
    let results: Vec<Result<RankOutput, ExecError>> = std::thread::scope(|s| {
        let handles: Vec<_> = plan
            .ranks
            .iter()
            .map(|rp| {
                let world = Arc::clone(&world);
                s.spawn(move || {
                    let comm = CpuComm::new(rp.rank, Arc::clone(&world));
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run_rank::<Cpu>(plan, rp, CpuOps::new(), &comm, opts)
                    }));
                    let r = match r {
                        Ok(r) => r,
                        Err(e) => Err(ExecError::Rank {
                            rank: rp.rank,
                            message: e
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_else(|| "panic".into()),
                        }),
                    };
                    if r.is_err() {
                        world.abort();
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ExecError::Rank {
                        rank: u32::MAX,
                        message: "thread died".into(),
                    })
                })
            })
            .collect()
    });
    assemble(plan, opts, results, Exported::Whole)
}

/// How a report carries the exported tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Exported {
    /// Merged into whole tensors: every rank ran in this process.
    Whole,
    /// As this process's pieces, for rank 0 of a launched job to merge.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Pieces,
}

/// The run's report from every rank's result (every backend): the first real failure rather
/// than the ranks that gave up because of it, else the losses averaged over the global
/// batch's tokens and the exported tensors, merged from the ranks' pieces or (`Pieces`, one
/// rank of a launched job) left in pieces.
fn assemble(
    plan: &Plan,
    opts: &RunOptions,
    results: Vec<Result<RankOutput, ExecError>>,
    exported: Exported,
) -> Result<RunReport, ExecError> {
    let mut results = results;
    if let Some(i) = results
        .iter()
        .position(|r| matches!(r, Err(e) if !matches!(e, ExecError::Aborted { .. })))
    {
        results.swap_remove(i)?;
    }
    let outs: Vec<RankOutput> = results.into_iter().collect::<Result<_, _>>()?;
    let tokens = (plan.global_batch() * plan.model.seq) as f64;
    let loss = (0..opts.steps as usize)
        .map(|i| outs.iter().map(|o| o.loss_sums[i]).sum::<f64>() / tokens)
        .collect();
    let aux_loss = (0..opts.steps as usize)
        .map(|i| outs.iter().map(|o| o.aux_sums[i]).sum::<f64>() / tokens)
        .collect();
    let pieces = |on: bool, of: &dyn Fn(&RankOutput) -> &[Element]| {
        on.then(|| outs.iter().map(|o| pieces_of(of(o))).collect::<Vec<_>>())
    };
    let param_pieces = pieces(opts.export_params, &|o| &o.params);
    let grad_pieces = pieces(opts.export_grads, &|o| &o.grads);
    let (params, grads, param_pieces, grad_pieces) = match exported {
        Exported::Whole => (
            param_pieces.map(merge).transpose()?,
            grad_pieces.map(merge).transpose()?,
            None,
            None,
        ),
        Exported::Pieces => {
            // Every rank of this process (one in a launched job), each tensor's pieces kept.
            let one = |p: Option<Vec<TensorPieces>>| {
                p.map(|v| {
                    let mut all = TensorPieces::new();
                    for (name, ps) in v.into_iter().flatten() {
                        all.entry(name).or_default().extend(ps);
                    }
                    all
                })
            };
            (None, None, one(param_pieces), one(grad_pieces))
        }
    };
    let traces = opts.trace.map(|_| {
        outs.iter()
            .map(|o| o.trace.clone().unwrap_or_default())
            .collect()
    });
    Ok(RunReport {
        world: plan.world(),
        loss,
        aux_loss,
        ranks: outs.into_iter().map(|o| o.report).collect(),
        params,
        grads,
        param_pieces,
        grad_pieces,
        traces,
    })
}
