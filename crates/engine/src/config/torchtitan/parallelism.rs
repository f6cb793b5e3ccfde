//! torchtitan's `[parallelism]` degrees and the batch: the device mesh
//! (torchtitan/distributed/parallel_dims.py, `ParallelDims._validate` and `build_mesh`: ranks
//! ordered pp, dp_replicate, fsdp = dp_shard x cp, tp, slowest first), FSDP2 or DDP
//! (torchtitan/models/llama3/infra/parallelize.py, `parallelize_llama`, `apply_fsdp`,
//! `apply_ddp`) and the batch (torchtitan/train.py, `Trainer.__init__`).

use super::job::Job;
use super::{Out, TorchtitanError};
use crate::config::megatron::put;
use serde_json::json;

const SHARD: &str = "parallelism.data_parallel_shard_degree";
const REPLICATE: &str = "parallelism.data_parallel_replicate_degree";
const RESHARD: &str = "parallelism.fsdp_reshard_after_forward";
const ASYNC_TP: &str = "parallelism.enable_async_tensor_parallel";
const GBS: &str = "training.global_batch_size";

/// torch DDP's gradient bucket under torchtitan (`apply_ddp`: `bucket_cap_mb=100`), in fp32
/// gradient elements: 100 MiB / 4 bytes.
pub const DDP_BUCKET_PARAMS: u64 = 100 * (1 << 20) / 4;

/// The resolved degrees of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Degrees {
    pub tp: u32,
    pub cp: u32,
    pub pp: u32,
    pub replicate: u32,
    /// `data_parallel_shard_degree`, -1 resolved over the world size.
    pub shard: u32,
    /// torchtitan's `fsdp_enabled`: dp_shard > 1 or cp > 1 (FSDP2 over dp_shard x cp).
    pub fsdp: bool,
}

impl Degrees {
    /// The data-parallel degree (torchtitan's batch mesh: replicate x shard).
    pub fn dp(&self) -> u32 {
        self.replicate * self.shard
    }
}

/// Reads the degrees; `world` is the GPU count (`cluster.num_gpus`) that
/// `data_parallel_shard_degree = -1` takes what is left of, as torchtitan takes WORLD_SIZE.
pub fn degrees(job: &Job, world: u32) -> Result<Degrees, TorchtitanError> {
    let degree = |path: &str| -> Result<u32, TorchtitanError> {
        match job.int(path).map(u32::try_from) {
            Some(Ok(d)) if d >= 1 => Ok(d),
            _ => Err(job.invalid(
                path,
                format!(
                    "must be 1 or more, got {} (ParallelDims._validate)",
                    job.get(path)
                ),
            )),
        }
    };
    let tp = degree("parallelism.tensor_parallel_degree")?;
    let cp = degree("parallelism.context_parallel_degree")?;
    let pp = degree("parallelism.pipeline_parallel_degree")?;
    let replicate = degree(REPLICATE)?;
    let others = u64::from(replicate) * u64::from(cp) * u64::from(tp) * u64::from(pp);
    let shard = match job.int(SHARD) {
        Some(-1) => {
            let shard = u64::from(world) / others;
            if shard == 0 || u64::from(world) % others != 0 {
                return Err(job.invalid(
                    SHARD,
                    format!("-1 takes the GPUs left, but cluster.num_gpus {world} is not a multiple of replicate x cp x tp x pp = {others} (ParallelDims._validate)"),
                ));
            }
            u32::try_from(shard).unwrap_or(u32::MAX)
        }
        _ => degree(SHARD)?,
    };
    let fsdp = shard > 1 || cp > 1;
    let d = Degrees {
        tp,
        cp,
        pp,
        replicate,
        shard,
        fsdp,
    };
    if replicate > 1 && shard > 1 {
        return Err(job.unmodelled(
            REPLICATE,
            format!("HSDP (replicate {replicate} x shard {shard}): parsim's FSDP shards over the whole data-parallel group (src/config/fsdp.rs), not within replica groups"),
        ));
    }
    if replicate > 1 && !fsdp && (tp > 1 || pp > 1) {
        return Err(job.invalid(
            REPLICATE,
            "DDP with tensor or pipeline parallelism: torchtitan refuses it (\"DDP has not supported > 1D parallelism\", parallelize_llama)",
        ));
    }
    Ok(d)
}

/// Puts the data-parallel and tensor/context-parallel settings of `d` into `layer`.
pub fn put_parallel(job: &Job, d: &Degrees, out: &mut Out) -> Result<(), TorchtitanError> {
    let Out { layer, notes } = out;
    if job.int(SHARD) != Some(-1) {
        let world = d.dp() * d.cp * d.tp * d.pp;
        put(layer, "cluster", "num_gpus", json!(world));
    } else {
        notes.push(format!(
            "{SHARD} = -1: {} (the GPUs left of cluster.num_gpus over replicate x cp x tp x pp)",
            d.shard
        ));
    }
    put(layer, "parallel", "dp", json!(d.dp()));
    put(layer, "parallel", "tp", json!(d.tp));
    // apply_tp: the norms are SequenceParallel and the blocks' outputs Shard(1).
    put(layer, "parallel", "sp", json!(true));
    put(layer, "parallel", "cp", json!(d.cp));
    if d.cp > 1 {
        put(layer, "parallel", "cp_comm", json!(cp_comm(job)?));
    }
    if d.fsdp {
        put(layer, "parallel", "zero", json!(3));
        put(layer, "parallel", "fsdp", json!("torch"));
        check_reshard(job, d)?;
    } else {
        put(layer, "parallel", "zero", json!(0));
        if d.replicate > 1 {
            put(
                layer,
                "parallel",
                "ddp_bucket_size",
                json!(DDP_BUCKET_PARAMS),
            );
        }
    }
    let async_tp = job.flag(ASYNC_TP);
    let compiled =
        job.flag("compile.enable") && job.list("compile.components").iter().any(|c| c == "model");
    if async_tp && !compiled {
        return Err(job.invalid(
            ASYNC_TP,
            "async TP needs compile.enable and \"model\" in compile.components (maybe_enable_async_tp)",
        ));
    }
    // Async TP (inductor's micro-pipelined TP) overlaps the TP collectives with the GEMMs.
    put(
        layer,
        "parallel",
        "tp_comm_overlap",
        json!(async_tp && d.tp > 1),
    );
    Ok(())
}

/// `fsdp_reshard_after_forward` (`apply_fsdp`): "default" reshards after forward without
/// pipeline parallelism and not with it, which is what parsim's FSDP2 model does
/// (src/config/fsdp.rs, `syncs_once_per_step`); the other choice of either case is refused.
fn check_reshard(job: &Job, d: &Degrees) -> Result<(), TorchtitanError> {
    match job.string(RESHARD).as_deref() {
        Some("default") => Ok(()),
        Some("always") if d.pp > 1 => Err(job.unmodelled(
            RESHARD,
            "resharding after every forward under pipeline parallelism (an all-gather per microbatch) is not modelled: parsim's FSDP2 under pipelining keeps the stage gathered for the step",
        )),
        Some("never") if d.pp == 1 => Err(job.unmodelled(
            RESHARD,
            "keeping every layer gathered from forward to backward is not modelled: parsim's FSDP2 reshards each layer after its forward",
        )),
        Some("always" | "never") => Ok(()),
        _ => Err(job.invalid(RESHARD, "must be \"default\", \"always\" or \"never\" (apply_fsdp)")),
    }
}

/// parsim's `cp_comm` for torchtitan's context parallelism: the K/V exchange
/// (`context_parallel_rotate_method`) and the sequence layout (`context_parallel_load_balancer`;
/// "headtail" is the zigzag layout of 2 x cp chunks).
fn cp_comm(job: &Job) -> Result<&'static str, TorchtitanError> {
    const ROTATE: &str = "parallelism.context_parallel_rotate_method";
    const BALANCER: &str = "parallelism.context_parallel_load_balancer";
    let balancer = job.string(BALANCER);
    match (job.string(ROTATE).as_deref(), balancer.as_deref()) {
        (_, Some("ptrr")) => Err(job.unmodelled(
            BALANCER,
            "the PTRR load balancer of FlexAttention is not modelled",
        )),
        (_, Some(b)) if b != "headtail" => Err(job.invalid(
            BALANCER,
            format!("unknown load balancer '{b}' (headtail, ptrr, or none)"),
        )),
        (Some("allgather"), Some(_)) => Ok("allgather"),
        (Some("allgather"), None) => Err(job.unmodelled(
            BALANCER,
            "all-gather context parallelism without load balancing is not modelled (parsim's allgather splits the sequence head-tail)",
        )),
        (Some("alltoall"), Some(_)) => Ok("zigzag"),
        (Some("alltoall"), None) => Ok("p2p"),
        _ => Err(job.invalid(ROTATE, "must be \"allgather\" or \"alltoall\"")),
    }
}

/// Puts the batch into `layer` and returns the global batch: `local_batch_size` per
/// data-parallel rank, `global_batch_size` (-1: local x dp) a multiple of local x dp
/// (gradient accumulation); under pipeline parallelism each local batch runs as
/// `pipeline_parallel_microbatch_size` microbatches in one schedule.
pub fn put_batch(job: &Job, d: &Degrees, out: &mut Out) -> Result<u64, TorchtitanError> {
    let layer = &mut out.layer;
    const LOCAL: &str = "training.local_batch_size";
    const MBS: &str = "parallelism.pipeline_parallel_microbatch_size";
    let positive = |path: &str| match job.int(path) {
        Some(v) if v >= 1 => Ok(v as u64),
        _ => Err(job.invalid(path, format!("must be 1 or more, got {}", job.get(path)))),
    };
    let local = positive(LOCAL)?;
    let per_step = local * u64::from(d.dp());
    let global = match job.int(GBS) {
        Some(g) if g < 0 => per_step,
        _ => positive(GBS)?,
    };
    if global % per_step != 0 {
        return Err(job.invalid(
            GBS,
            format!("{global} must be a multiple of local_batch_size x data-parallel degree = {local} x {} (Trainer.__init__)", d.dp()),
        ));
    }
    let accumulation = global / per_step;
    let micro = if d.pp > 1 {
        let mbs = positive(MBS)?;
        if local % mbs != 0 {
            return Err(job.invalid(
                MBS,
                format!("local_batch_size {local} must be a multiple of it, got {mbs} (build_pipeline_schedule)"),
            ));
        }
        if accumulation > 1 {
            return Err(job.unmodelled(
                GBS,
                format!("{accumulation} pipeline schedules a step (gradient accumulation under pipeline parallelism): parsim runs the step's microbatches in one schedule"),
            ));
        }
        mbs
    } else {
        local
    };
    put(layer, "training", "micro_batch_size", json!(micro));
    put(layer, "training", "global_batch_size", json!(global));
    Ok(global)
}
