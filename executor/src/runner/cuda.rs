//! Plays a Plan on GPUs: [`run_cuda`] in one process (every rank a thread, spread over the
//! visible GPUs) or as one rank of a launched job. It checks the run, finds the driver and
//! the GPUs, places the ranks and chooses each process group's transport (NCCL, or device
//! copies for ranks sharing a GPU), loads the libraries those need and opens each rank's
//! device and joins its NCCL communicators, before any step; a missing library or GPU is an error naming it.

use super::{check_run, RunOptions};
use crate::backend::cuda::comms::{join_multi_process, join_single_process, single_process_ids};
use crate::backend::cuda::context::{drv, visible_gpus, RankGpu};
use crate::backend::cuda::groups::{plan_groups, GroupSpec, Placement, Transport};
use crate::backend::cuda::probe::{require, Library};
use crate::backend::cuda::CudaError;
use crate::error::ExecError;
use crate::plan::Plan;
use crate::report::RunReport;

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
                    crate::backend::cuda::groups::device_of(placement, n, r, 0).map(|d| (r, d))
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
            let d = crate::backend::cuda::groups::device_of(placement, n, rank, local_rank)?;
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
    let gpus = visible_gpus()?;
    let lay = layout(plan, &world, gpus)?;
    require(Library::CublasLt)?;
    if lay.needs_nccl() || matches!(world, CudaWorld::MultiProcess { .. }) {
        require(Library::Nccl)?;
    }
    // Each rank of this process opens its GPU (context, streams, pool, cuBLASLt) and joins
    // its NCCL communicators, so that an unusable device or network fails here, by name.
    match world {
        CudaWorld::SingleProcess => {
            let ids = if lay.needs_nccl() {
                single_process_ids(&lay.groups)?
            } else {
                Default::default()
            };
            // Every device first: a rank that cannot open its GPU must fail before the others
            // block in ncclCommInitRank waiting for it.
            let devs: Vec<(u32, RankGpu)> = lay
                .local
                .iter()
                .map(|&(rank, gpu)| RankGpu::open(gpu).map(|d| (rank, d)))
                .collect::<Result<_, _>>()?;
            let results: Vec<Result<(), CudaError>> = std::thread::scope(|s| {
                let hs: Vec<_> = devs
                    .iter()
                    .map(|(rank, dev)| {
                        let (groups, ids, rank, ctx) = (&lay.groups, &ids, *rank, dev.ctx.clone());
                        s.spawn(move || {
                            ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
                            join_single_process(groups, ids, rank).map(drop)
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(CudaError::call(Library::Driver, "rank thread", "panicked"))
                        })
                    })
                    .collect()
            });
            results.into_iter().collect::<Result<Vec<()>, _>>()?;
        }
        CudaWorld::MultiProcess {
            rank,
            world_size,
            unique_id,
            ..
        } => {
            let dev = RankGpu::open(lay.local[0].1)?;
            dev.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
            join_multi_process(&lay.groups, &unique_id, rank, world_size)?;
        }
    }
    Err(CudaError::Unfinished {
        what: "a training step",
        why: "the device TensorOps/DeviceCollectives of the cuda backend are not in this build",
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Activation, AdamConfig, ModelShape, Norm, Recompute};

    fn one_rank() -> Plan {
        let shape = ModelShape {
            num_layers: 1,
            hidden: 8,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            ffn: 12,
            vocab: 16,
            data_vocab: 16,
            seq: 4,
            micro_batch: 1,
            norm: Norm::RmsNorm,
            norm_eps: 1e-5,
            activation: Activation::Swiglu,
            rope_theta: 10000.0,
            flash: true,
            init_std: 0.02,
            moe: None,
            mla: None,
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
