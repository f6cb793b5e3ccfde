//! Plays a Plan on GPUs: [`run_cuda`] in one process (every rank a thread, spread over the visible
//! GPUs) or as one rank of a launched job. It checks the run, finds the driver and the GPUs, places
//! the ranks and chooses each process group's transport (NCCL, or device copies for ranks sharing a
//! GPU), loads the libraries those need and opens each rank's device and joins its NCCL
//! communicators, before any step; a missing library or GPU is an error naming it.

use super::assemble::{assemble, Exported};
use super::options::{check_run, RunOptions};
use super::rank::{run_rank, RankOutput};
use crate::backend::cuda::comm::collectives::{CudaComm, Joins};
use crate::backend::cuda::comm::comms::{
    join_multi_process, join_single_process, single_process_ids,
};
use crate::backend::cuda::comm::groups::{plan_groups, GroupSpec, Placement, Transport};
use crate::backend::cuda::comm::hub::Hub;
use crate::backend::cuda::comm::nccl::NcclComm;
use crate::backend::cuda::compile::kernels::Kernels;
use crate::backend::cuda::device::context::{drv, visible_gpus, RankGpu};
use crate::backend::cuda::device::device::CudaDevice;
use crate::backend::cuda::probe::{require, Library};
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::cuda::CudaError;
use crate::backend::DeviceCollectives;
use crate::error::ExecError;
use parsim_plan::plan::{Plan, RankPlan};
use parsim_plan::run_report::{DeviceMemoryReport, RunReport};
use std::collections::HashMap;
use std::sync::Arc;

/// Which ranks this process runs.
#[derive(Debug, Clone)]
pub enum CudaWorld {
    /// Every rank a thread of this process, over the visible GPUs; ranks that share a GPU
    /// communicate through device copies, ranks on distinct GPUs through NCCL.
    SingleProcess,
    /// This process is global rank `rank` of `world_size`, on its node's GPU `local_rank`;
    /// `unique_id` is the NCCL id rank 0 made and the launcher handed to every process.
    MultiProcess {
        rank: u32,
        world_size: u32,
        local_rank: u32,
        unique_id: [u8; 128],
    },
}

/// The ranks of this process, their GPUs and the Plan's groups, decided on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaLayout {
    /// (global rank, GPU ordinal) of each rank this process runs.
    pub local: Vec<(u32, u32)>,
    pub groups: Vec<GroupSpec>,
}

impl CudaLayout {
    /// Whether any group needs NCCL.
    pub fn needs_nccl(&self) -> bool {
        self.groups.iter().any(|g| g.transport == Transport::Nccl)
    }
}

/// Places `plan`'s ranks for `world` on `gpus` visible GPUs (host logic only).
pub fn layout(plan: &Plan, world: &CudaWorld, gpus: u32) -> Result<CudaLayout, CudaError> {
    let n = plan.world();
    match *world {
        CudaWorld::SingleProcess => {
            let placement = Placement::SingleProcess { gpus };
            let groups = plan_groups(plan, placement, |_| 0, |_| 0)?;
            let local = (0..n)
                .map(|r| {
                    crate::backend::cuda::comm::groups::device_of(placement, n, r, 0)
                        .map(|d| (r, d))
                })
                .collect::<Result<_, _>>()?;
            Ok(CudaLayout { local, groups })
        }
        CudaWorld::MultiProcess {
            rank,
            world_size,
            local_rank,
            ..
        } => {
            if world_size != n || rank >= n {
                return Err(CudaError::call(
                    Library::Nccl,
                    "ncclCommInitRank",
                    format!(
                        "the launcher's world ({world_size} processes, this one rank {rank}) \
                         does not match the Plan's {n} ranks"
                    ),
                ));
            }
            // One process per GPU at most on a node: processes on one node are numbered
            // contiguously by the launcher, so rank r's node-local rank is r mod the GPUs
            // per node when every node runs `gpus` processes; NCCL itself rejects a
            // duplicate device at communicator creation.
            let placement = Placement::MultiProcess { gpus };
            let per_node = gpus.max(1);
            let groups = plan_groups(plan, placement, |r| r / per_node, |r| r % per_node)?;
            let d = crate::backend::cuda::comm::groups::device_of(placement, n, rank, local_rank)?;
            Ok(CudaLayout {
                local: vec![(rank, d)],
                groups,
            })
        }
    }
}

/// Runs `plan` on GPUs. Fails with the missing library (and where it was looked for) when
/// there is no driver, cuBLASLt or (for groups across GPUs) NCCL.
pub fn run_cuda(plan: &Plan, opts: &RunOptions, world: CudaWorld) -> Result<RunReport, ExecError> {
    check_run(plan, opts)?;
    check_layer_kinds(plan)?;
    let gpus = visible_gpus()?;
    let lay = layout(plan, &world, gpus)?;
    require(Library::CublasLt)?;
    if lay.needs_nccl() || matches!(world, CudaWorld::MultiProcess { .. }) {
        require(Library::Nccl)?;
    }
    match world {
        CudaWorld::SingleProcess => run_single_process(plan, opts, &lay),
        CudaWorld::MultiProcess {
            rank,
            world_size,
            unique_id,
            ..
        } => {
            // This process's rank opens its GPU, joins the world communicator and splits
            // one per NCCL group, then plays its actions.
            let (_, ordinal) = lay.local[0];
            let gpu = RankGpu::open(ordinal)?;
            gpu.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
            let kernels = Arc::new(Kernels::load(&gpu.ctx)?);
            let (world_comm, comms) =
                join_multi_process(&lay.groups, &unique_id, rank, world_size)?;
            let rp = plan.ranks.iter().find(|r| r.rank == rank).ok_or_else(|| {
                CudaError::call(
                    Library::Nccl,
                    "ncclCommInitRank",
                    format!("rank {rank} is not in the Plan"),
                )
            })?;
            let hub = Hub::new();
            let out = play_rank(
                plan,
                rp,
                opts,
                gpu,
                kernels,
                &lay,
                comms,
                Some(world_comm),
                &hub,
            );
            // Only this rank's shards are here: rank 0 merges every process's pieces.
            assemble(plan, opts, vec![out], Exported::Pieces)
        }
    }
}

/// Refuses, before looking for a GPU, the layer kinds the CUDA kernels do not run yet (the
/// CPU backend runs them): sliding-window and chunked attention (the flash kernels mask
/// causally only) and attention sinks. QK norm, the router's linear bias and a MoE layer
/// pattern run on the existing kernels.
pub fn check_layer_kinds(plan: &Plan) -> Result<(), ExecError> {
    let a = &plan.model.attention;
    let refused: [(bool, &'static str, &'static str); 4] = [
        (
            // Its kernels are the CPU backend's (`backend/cpu/ops/mamba.rs`) only.
            !plan.model.hybrid.is_empty(),
            "model.hybrid",
            "the CUDA backend does not run hybrid Mamba-2 models yet; the CPU backend does",
        ),
        (
            a.window.is_some(),
            "model.attention.window",
            "the CUDA backend does not run sliding-window attention yet (the CPU backend does)",
        ),
        (
            a.chunk.is_some(),
            "model.attention.chunk",
            "the CUDA backend does not run chunked attention yet (the CPU backend does)",
        ),
        (
            a.sinks,
            "model.attention.sinks",
            "the CUDA backend does not run attention sinks yet (the CPU backend does)",
        ),
    ];
    match refused.into_iter().find(|(on, _, _)| *on) {
        Some((_, field, message)) => Err(ExecError::Unsupported { field, message }),
        None => Ok(()),
    }
}

/// Every rank a thread of this process: each opens its GPU first (so that an unusable device
/// fails before any rank waits in `ncclCommInitRank`), the kernels are loaded once per GPU,
/// then each thread joins its NCCL groups and plays its actions; a failing rank aborts the
/// shared-GPU meetings of the others.
fn run_single_process(
    plan: &Plan,
    opts: &RunOptions,
    lay: &CudaLayout,
) -> Result<RunReport, ExecError> {
    let ids = if lay.needs_nccl() {
        single_process_ids(&lay.groups)?
    } else {
        Default::default()
    };
    let mut gpus: Vec<(u32, RankGpu)> = Vec::with_capacity(lay.local.len());
    let mut kernels: HashMap<u32, Arc<Kernels>> = HashMap::new();
    for &(rank, ordinal) in &lay.local {
        let gpu = RankGpu::open(ordinal)?;
        if let std::collections::hash_map::Entry::Vacant(v) = kernels.entry(ordinal) {
            gpu.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
            v.insert(Arc::new(Kernels::load(&gpu.ctx)?));
        }
        gpus.push((rank, gpu));
    }
    let hub = Hub::new();
    let results: Vec<Result<RankOutput, ExecError>> = std::thread::scope(|s| {
        let hs: Vec<_> = gpus
            .into_iter()
            .zip(&lay.local)
            .map(|((rank, gpu), &(_, ordinal))| {
                let (ids, hub) = (&ids, &hub);
                let k = kernels.get(&ordinal).cloned();
                s.spawn(move || {
                    let r = (|| {
                        gpu.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
                        let k = k.ok_or_else(|| {
                            CudaError::call(
                                Library::Driver,
                                "cuModuleLoadData",
                                format!("no kernels loaded for GPU {ordinal}"),
                            )
                        })?;
                        let comms = join_single_process(&lay.groups, ids, rank)?;
                        let rp = &plan.ranks[rank as usize];
                        play_rank(plan, rp, opts, gpu, k, lay, comms, None, hub)
                    })();
                    match r {
                        Err(e) if gave_up(&e) => Err(ExecError::Aborted { rank }),
                        Err(e) => {
                            hub.abort();
                            Err(e)
                        }
                        ok => ok,
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ExecError::Rank {
                        rank: u32::MAX,
                        message: "rank thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    assemble(plan, opts, results, Exported::Whole)
}

/// Whether a rank stopped because another one failed (its own error is not the cause).
fn gave_up(e: &ExecError) -> bool {
    matches!(e, ExecError::Aborted { .. })
        || matches!(e, ExecError::Cuda(c) if c.to_string().contains("another rank failed"))
}

/// One rank on its GPU: the device and collectives built, the generic step loop played, and
/// the device's memory figures (the pool's reserved peak, the driver's used and total bytes)
/// added to its report.
#[allow(clippy::too_many_arguments)]
fn play_rank(
    plan: &Plan,
    rp: &RankPlan,
    opts: &RunOptions,
    gpu: RankGpu,
    kernels: Arc<Kernels>,
    lay: &CudaLayout,
    comms: HashMap<Vec<u32>, NcclComm>,
    world: Option<NcclComm>,
    hub: &Arc<Hub>,
) -> Result<RankOutput, ExecError> {
    let launched = world.is_some();
    let joins = Arc::new(Joins::default());
    let comm = CudaComm::new(
        rp.rank,
        &gpu,
        kernels.clone(),
        lay.groups.clone(),
        comms,
        world,
        hub.clone(),
        joins.clone(),
    );
    let (pool, ctx) = (gpu.pool.clone(), gpu.ctx.clone());
    let dev = CudaRank::new(CudaDevice::new(gpu), kernels, joins);
    let mut out = run_rank::<Cuda>(plan, rp, dev, &comm, opts)?;
    if launched {
        // The launcher takes rank 0's loss as the run's: every rank's sums, added.
        let everyone: Vec<u32> = (0..plan.world()).collect();
        let g = comm.group(&everyone)?;
        out.loss_sums = comm.sum_f64(&g, &out.loss_sums)?;
        out.aux_sums = comm.sum_f64(&g, &out.aux_sums)?;
    }
    // A last buffered send (a stage's final output) goes out before the rank ends.
    comm.finish()?;
    let stats = pool
        .lock()
        .map_err(|_| CudaError::call(Library::Driver, "cuMemGetInfo", "pool lock poisoned"))?
        .stats();
    ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
    let (free, total) = ctx.mem_get_info().map_err(drv("cuMemGetInfo"))?;
    out.report.device = Some(DeviceMemoryReport {
        pool_reserved_peak_bytes: stats.peak_reserved_bytes,
        driver_used_bytes: (total - free) as u64,
        driver_total_bytes: total as u64,
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use parsim_plan::plan::{AdamConfig, ModelShape, Recompute};

    fn one_rank() -> Plan {
        let shape = ModelShape {
            seq: 4,
            ..ModelShape::dense(1, 8, 2, 1, 12, 16)
        };
        Plan::single_rank(shape, AdamConfig::default(), 1, 1, Recompute::None)
    }

    #[test]
    fn without_a_driver_the_error_names_the_library() {
        if Library::Driver.present() {
            eprintln!("skipped: a CUDA driver is present, the missing-driver path cannot run");
            return;
        }
        let e = run_cuda(
            &one_rank(),
            &RunOptions::default(),
            CudaWorld::SingleProcess,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("CUDA driver") && e.contains("libcuda.so.1"),
            "{e}"
        );
    }

    #[test]
    fn a_rank_that_gave_up_is_not_reported_as_the_cause() {
        // A peer released from a shared-GPU meeting by the abort, and the runner's own
        // abort, are followers; a failed CUDA call or a missing library is the cause.
        let follower = ExecError::Cuda(CudaError::call(
            Library::Driver,
            "shared-GPU collective",
            "another rank failed",
        ));
        assert!(gave_up(&follower));
        assert!(gave_up(&ExecError::Aborted { rank: 3 }));
        let cause = ExecError::Cuda(CudaError::call(Library::Nccl, "ncclSend", "unhandled"));
        assert!(!gave_up(&cause));
        let missing = ExecError::Cuda(CudaError::NoDevice {
            visible: "unset".into(),
        });
        assert!(!gave_up(&missing));
    }

    #[test]
    fn windows_chunks_and_sinks_are_refused_by_name_before_looking_for_a_gpu() {
        use parsim_plan::plan::AttentionShape;
        let cases = [
            (
                AttentionShape {
                    window: Some(2),
                    ..AttentionShape::default()
                },
                "model.attention.window",
            ),
            (
                AttentionShape {
                    chunk: Some(2),
                    ..AttentionShape::default()
                },
                "model.attention.chunk",
            ),
            (
                AttentionShape {
                    sinks: true,
                    ..AttentionShape::default()
                },
                "model.attention.sinks",
            ),
        ];
        for (attention, field) in cases {
            let mut plan = one_rank();
            plan.model.attention = attention;
            let e = run_cuda(&plan, &RunOptions::default(), CudaWorld::SingleProcess)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(field) && e.contains("CPU backend"), "{e}");
        }
        // QK norm runs on the existing kernels: not refused here (whatever the GPU says).
        let mut plan = one_rank();
        plan.model.attention.qk_norm = true;
        assert!(check_layer_kinds(&plan).is_ok());
    }

    #[test]
    fn a_hybrid_model_is_refused_by_name_before_looking_for_a_gpu() {
        let mut plan = one_rank();
        plan.model.hybrid = vec![parsim_plan::plan::HybridLayer::Attention];
        let e = run_cuda(&plan, &RunOptions::default(), CudaWorld::SingleProcess).unwrap_err();
        assert!(e.to_string().starts_with("model.hybrid: "), "{e}");
    }

    #[test]
    fn bad_options_are_refused_before_looking_for_a_gpu() {
        let opts = RunOptions {
            steps: 1,
            warmup: 1,
            ..RunOptions::default()
        };
        let e = run_cuda(&one_rank(), &opts, CudaWorld::SingleProcess).unwrap_err();
        assert!(e.to_string().contains("warmup"), "{e}");
    }

    #[test]
    fn a_single_rank_needs_no_nccl_and_a_launcher_mismatch_is_named() {
        let lay = layout(&one_rank(), &CudaWorld::SingleProcess, 1).unwrap();
        assert_eq!(lay.local, vec![(0, 0)]);
        assert!(!lay.needs_nccl());
        let w = CudaWorld::MultiProcess {
            rank: 0,
            world_size: 4,
            local_rank: 0,
            unique_id: [0; 128],
        };
        let e = layout(&one_rank(), &w, 1).unwrap_err().to_string();
        assert!(e.contains("4 processes") && e.contains("1 ranks"), "{e}");
    }
}
