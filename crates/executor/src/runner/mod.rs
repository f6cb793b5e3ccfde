//! Plays a Plan on the CPU backend: one thread per rank (see [`rank`] for one rank's step
//! loop, [`zero`] for data parallelism with ZeRO 0-3 and the optimizer), a failing rank
//! stopping the others, and the ranks' results assembled into a [`RunReport`].

mod assemble;
#[cfg(feature = "cuda")]
mod cuda;
mod grad_buckets;
mod options;
mod rank;
mod zero;

use crate::backend::cpu::{Cpu, CpuComm, CpuOps, World};
use crate::error::ExecError;
use assemble::{assemble, Exported};
#[cfg(feature = "cuda")]
pub use cuda::{layout as cuda_layout, run_cuda, CudaLayout, CudaWorld};
use options::check_run;
pub use options::RunOptions;
use parsim_plan::run::RunLength;
use parsim_plan::Plan;
use parsim_plan::RunReport;
use rank::{run_rank, RankOutput};
use std::sync::Arc;

/// [`run_cpu`] for a caller that asks only for a [`RunLength`] (the engine's calibration
/// sweep), with the error boxed.
pub fn run_cpu_for(
    plan: &Plan,
    l: &RunLength,
) -> Result<RunReport, Box<dyn std::error::Error + Send + Sync>> {
    Ok(run_cpu(plan, &RunOptions::from(l))?)
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
