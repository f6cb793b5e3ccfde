//! `execute --backend cuda`: in one process, as the local supervisor of `--nproc-per-node`
//! workers, or as one rank under torchrun, Slurm or that supervisor. Every path ends in
//! [`run_cuda_rank`], the one place that calls the CUDA runner.

use super::launch_args::LaunchArgs;
use anyhow::ensure;
use parsim_executor::backend::cuda::comm::nccl_id::nccl_unique_id;
use parsim_executor::backend::cuda::{probe, Library};
use parsim_executor::runner::{run_cuda, CudaWorld, RunOptions};
use parsim_executor::ExecError;
use parsim_launch::worker::WORKER_MARKER;
use parsim_launch::{run_worker, supervise, LaunchInfo, RankEnv, UniqueId, WorkerOptions};
use parsim_plan::{Plan, RunReport};

/// Runs `plan` on CUDA. `Some(report)` where this process prints the run's report (a single
/// process, or rank 0 of many, with every rank's report combined); `None` on the other ranks
/// and in the supervisor (rank 0's worker printed it).
pub fn run(
    launch: &LaunchArgs,
    plan: &Plan,
    opts: &RunOptions,
    world: u32,
) -> anyhow::Result<Option<RunReport>> {
    let is_worker = std::env::var_os(WORKER_MARKER).is_some();
    if let (Some(n), false) = (launch.nproc_per_node, is_worker) {
        let local = launch.local(n, world)?;
        let exe = std::env::current_exe()?;
        let args: Vec<_> = std::env::args_os().skip(1).collect();
        supervise(&exe, &args, &local)?;
        return Ok(None);
    }
    let Some(env) = RankEnv::from_process(&launch.overrides())? else {
        return Ok(Some(run_cuda_rank(plan, opts, None)?));
    };
    ensure!(
        env.world_size == world,
        "the launcher's world size ({}, from {}) differs from the configuration's {world} ranks (cluster.num_gpus): one process per rank",
        env.world_size,
        env.source
    );
    let worker = WorkerOptions {
        rendezvous_timeout: launch.timeout(),
        exit_with_supervisor: is_worker,
        new_id: new_unique_id,
    };
    Ok(run_worker(&env, &worker, |info| {
        run_cuda_rank(plan, opts, Some(info))
    })?)
}

/// Rank 0's id for the rendezvous: NCCL's where the library loads, else a stand-in (a run that
/// needs NCCL then stops at its first NCCL call, naming the library).
fn new_unique_id() -> Result<UniqueId, String> {
    let bytes = nccl_unique_id().map_err(|e| e.to_string())?;
    Ok(UniqueId::nccl_or_stand_in(bytes))
}

/// Runs this process's share of the plan on CUDA: every rank (as threads) when `info` is
/// `None`, else the one rank `info` names, with the NCCL unique id of the rendezvous.
fn run_cuda_rank(
    plan: &Plan,
    opts: &RunOptions,
    info: Option<&LaunchInfo>,
) -> Result<RunReport, ExecError> {
    probe::require(Library::Driver)?;
    // Past the rendezvous, ranks in separate processes talk only through NCCL: without it
    // (where rank 0 handed out a stand-in id) the run stops here, naming the library.
    if info.is_some_and(|i| i.world_size > 1) {
        probe::require(Library::Nccl)?;
    }
    let world = info.map_or(CudaWorld::SingleProcess, |i| CudaWorld::MultiProcess {
        rank: i.rank,
        world_size: i.world_size,
        local_rank: i.local_rank,
        unique_id: i.unique_id,
    });
    run_cuda(plan, opts, world)
}
