//! One full estimate of a resolved configuration: parameters, FLOPs, memory stage by stage,
//! communication per group, the pipeline schedule, step time and throughput, shaped as the
//! output contract of docs/design.md.

use crate::comm::StepCollective;
use crate::config::{Config, PpP2p, Resolved, ScheduleKind};
use crate::layout::{GroupKind, Layout};
use crate::memory::StageMemory;
use crate::model::{
    rank_params, BlockSummary, ChunkContents, CollectiveKind, CommKind, Ledger, LedgerSummary,
    OpRole, PerGroup,
};
use crate::network::ep_dispatch::EpDispatch;
use crate::network::Network;
use crate::schedule::{generate, Costs, ScheduleError};
use crate::time::{Overlaps, StepTime};
use serde::Serialize;

pub mod breakdown;
mod dp;
mod finish;
mod interval;
mod prepare;

use dp::per_microbatch_dp_s;
pub use prepare::{
    split_free_bound_of, split_free_lower_bound, split_free_per_microbatch_s, time_ledger,
    timed_ledger, Chunked, RunMemo,
};
use std::borrow::Cow;

#[derive(Debug, Clone, Serialize)]
pub struct ParamReport {
    pub total: u64,
    /// Input embedding (word + learned positions).
    pub embedding: u64,
    /// Output layer (0 when tied to the embedding).
    pub output_layer: u64,
    /// The largest decoder layer.
    pub per_layer: u64,
    pub per_layer_dense: u64,
    pub per_layer_moe: Option<u64>,
    /// Parameters on the most loaded GPU (before ZeRO-3 sharding).
    pub per_gpu_max: u64,
    /// Parameters a token passes through (MoE: top-k routed experts only).
    pub activated_per_token: u64,
    pub trainable: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FlopsReport {
    pub per_step_model: f64,
    /// Model FLOPs plus the forward work recomputation reruns.
    pub per_step_hardware: f64,
    pub per_token_model: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct MemoryReport {
    /// The most loaded GPU's allocated peak (what `torch.cuda.max_memory_allocated` shows,
    /// with the runtime's reserve).
    pub per_gpu_max_bytes: u64,
    /// Device memory as the driver reports it.
    pub capacity_bytes: u64,
    /// True when the most loaded GPU reserves at most `usable_bytes` (the margin kept free).
    /// The verdict stays at the prediction until each framework's memory interval rests on
    /// its own measured peaks (today only DeepSpeed's does); `fits_at_p90` is the verdict at
    /// the interval's pessimistic end.
    pub fits: bool,
    /// The pessimistic peak (`per_gpu_max_bytes_p90`) is at most `usable_bytes`.
    pub fits_at_p90: bool,
    /// The peak's interval from the framework's measured residuals ([`crate::interval::memory`]).
    pub per_gpu_max_bytes_p10: u64,
    pub per_gpu_max_bytes_p90: u64,
    /// `usable_bytes` less the p90 peak: the room left at the pessimistic end (negative: short).
    pub margin_bytes_p90: i64,
    pub interval: crate::interval::memory::MemoryInterval,
    /// Fraction of the capacity kept free for allocator fragmentation and reserve.
    pub margin_fraction: f64,
    /// The capacity less the margin: what "fits" is measured against.
    pub usable_bytes: u64,
    pub stages: Vec<StageMemory>,
}

impl MemoryReport {
    /// The most loaded GPU's reserved peak ([`StageMemory::reserved`]: the caching allocator's
    /// blocks it cannot reuse on top of the allocated peak), what `torch.cuda.max_memory_reserved`
    /// and nvidia-smi show and what `fits` is decided on; `None` where it equals the allocated.
    pub fn reserved_peak_bytes(&self) -> Option<u64> {
        let reserved = self.stages.iter().map(StageMemory::reserved).max()?;
        (reserved > self.per_gpu_max_bytes).then_some(reserved)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupInfo {
    pub group: GroupKind,
    pub size: u32,
    /// Whether the group runs on the network: it spans NVLink domains (nodes, unless
    /// `cluster.nvlink_domain_size` makes several nodes one domain).
    pub crosses_nodes: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct CommReport {
    /// Wire bytes per step sent by the most loaded GPU, per group.
    pub per_step_bytes_per_gpu: PerGroup<u64>,
    pub groups: Vec<GroupInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScheduleReport {
    pub name: String,
    pub pp: u32,
    pub vpp: u32,
    pub microbatches: u32,
    /// Idle time over ideal compute (Megatron's (p-1)/(v m) convention).
    pub bubble_fraction: f64,
    /// Chunk activation sets live at once, per pipeline rank (microbatches when vpp = 1).
    pub peak_inflight_microbatches: Vec<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub tokens_per_s: f64,
    /// Tokens per second at the interval's upper and lower step time (p10 is the slow end).
    pub tokens_per_s_p10: f64,
    pub tokens_per_s_p90: f64,
    /// Model FLOPs per second per GPU, in TFLOP/s.
    pub tflops_per_gpu: f64,
    /// Hardware FLOPs (recomputation included) per second per GPU, in TFLOP/s.
    pub hardware_tflops_per_gpu: f64,
    pub mfu: f64,
    /// MFU at the interval's upper and lower step time.
    pub mfu_p10: f64,
    pub mfu_p90: f64,
}

/// The whole estimate (the output contract of docs/design.md).
#[derive(Debug, Clone, Serialize)]
pub struct Estimate {
    pub config: Config,
    pub gpu: String,
    pub params: ParamReport,
    pub flops: FlopsReport,
    pub memory: MemoryReport,
    pub communication: CommReport,
    pub schedule: ScheduleReport,
    pub time: StepTime,
    pub throughput: Throughput,
    /// What the step time's interval rests on (`time.step_s_p10`, `time.step_s_p90`).
    pub step_interval: crate::interval::StepInterval,
    /// One line: what bounds the step.
    pub verdict: String,
    pub warnings: Vec<String>,
    /// Settings that differ from `training.framework`'s defaults (explicit overrides), as
    /// `field = value (overrides ...)` lines.
    pub framework_overrides: Vec<String>,
    /// Ops the profile's measured tables time and those outside them (absent without tables).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table_coverage: Option<crate::time::TableCoverage>,
    /// The NVLink domain and how it was chosen, where that is more than "each node", as ever
    /// (a rack of an NVL72, racks of 64, a given size, a fallback to the node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<crate::config::NvlinkDomain>,
}

/// Why an estimate could not be made (the configuration validated, but its schedule did not).
#[derive(Debug, thiserror::Error)]
pub enum EstimateError {
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// A figure overflowed (e.g. a profile's latencies add up past the largest float): no
    /// null or infinity is printed as a result.
    #[error("the estimated {quantity} is not a finite number ({value}): the configuration's or the hardware profile's figures overflow")]
    NonFinite { quantity: &'static str, value: f64 },
    /// The shipped residual model (calibration/residuals.json) did not load.
    #[error("the step-time interval: {0}")]
    Interval(String),
}

/// Per-stage durations of one chunk for one microbatch, with its exposed communication.
#[derive(Debug, Clone, Copy, Default)]
struct ChunkTimes {
    fwd: f64,
    input_grad: f64,
    weight_grad: f64,
    compute: f64,
    exposed: PerGroup,
}

/// Per-stage durations of one microbatch (F, I, W with exposed communication) and the hop
/// costs between stages: the schedule simulator's input.
fn stage_costs(
    r: &Resolved,
    s: &LedgerSummary,
    ledger: &Ledger,
    chunks: &[Vec<ChunkContents>],
    network: &Network,
    timed: &mut Vec<(ChunkContents, ChunkTimes)>,
) -> Result<(Vec<ChunkTimes>, Costs), EstimateError> {
    let par = &r.config.parallel;
    let stages = r.placement.num_stages();
    let mut chunk_times = vec![ChunkTimes::default(); stages];
    // A chunk's times depend on what it holds, not on its stage: the many alike chunks of a
    // deep pipeline (and, through `timed`, of a search run's splits) are timed once.
    for c in chunks.iter().flatten() {
        let contents = ChunkContents { stage: 0, ..*c };
        if let Some((_, t)) = timed.iter().find(|(k, _)| *k == contents) {
            chunk_times[c.stage] = *t;
            continue;
        }
        let mut t = ChunkTimes::default();
        for (b, n) in c.blocks(s) {
            let k = n as f64;
            let bt = &b.times;
            t.fwd += k * (bt.fwd_s + bt.exposed_fwd_s());
            t.input_grad += k * (bt.dgrad_s + bt.recompute_s + bt.exposed_bwd_s());
            t.weight_grad += k * bt.wgrad_s;
            t.compute += k * (bt.fwd_s + bt.dgrad_s + bt.recompute_s + bt.wgrad_s);
            t.exposed.add(&bt.exposed_fwd, k);
            t.exposed.add(&bt.exposed_bwd, k);
        }
        if r.config.training.offload_activation_layers > 0 {
            let layers = crate::offload::Layers::of(s, std::slice::from_ref(c));
            let (of, ob) = crate::offload::exposed_s(r, &layers);
            t.fwd += of;
            t.input_grad += ob;
            t.exposed[CommKind::Host] += of + ob;
        }
        let fwd_compute = t.fwd - t.exposed.total();
        let (zf, zb) = per_microbatch_dp_s(
            r,
            network,
            ledger,
            s,
            c,
            fwd_compute,
            t.input_grad + t.weight_grad,
        );
        t.fwd += zf;
        t.input_grad += zb;
        t.exposed[CommKind::Dp] += zf + zb;
        chunk_times[c.stage] = t;
        timed.push((contents, t));
    }
    let hop_bytes = ledger.dims.residual_bytes();
    let latency_s = if par.pp > 1 {
        network.latency_s(GroupKind::Pp)
    } else {
        0.0
    };
    let blocking = par.pp_p2p_under(r.config.training.framework) == PpP2p::Blocking;
    let hop_s = if blocking {
        blocking_hop_s(r, network, hop_bytes)
    } else {
        network.collective_s(GroupKind::Pp, CollectiveKind::SendRecv, hop_bytes, par.pp)
    } - latency_s;
    let costs = Costs::from_split(
        chunk_times.iter().map(|t| t.fwd).collect(),
        chunk_times.iter().map(|t| t.input_grad).collect(),
        chunk_times.iter().map(|t| t.weight_grad).collect(),
        latency_s,
        vec![hop_s.max(0.0); stages.saturating_sub(1)],
    )?;
    if !blocking {
        return Ok((chunk_times, costs));
    }
    // The hops are now busy time of the stages at their ends: exposed pipeline communication.
    let costs = costs.with_blocking_hops(crate::schedule::placement_of(par.schedule), par.pp)?;
    for (s, t) in chunk_times.iter_mut().enumerate() {
        let added_s = (costs.forward[s] - t.fwd) + (costs.input_grad[s] - t.input_grad);
        t.fwd = costs.forward[s];
        t.input_grad = costs.input_grad[s];
        t.exposed[CommKind::Pp] += added_s;
    }
    Ok((chunk_times, costs))
}

/// Seconds one blocking pipeline transfer holds a stage: the send/recv of `hop_bytes` over the
/// pipeline group, latency included. Both blocking engines split a tensor-parallel rank's
/// activation when TP replicates it (no sequence parallelism): 2021 Megatron-LM's
/// `--scatter-gather-tensors-in-pipeline` (on by default; Narayanan et al. 2021, Section 4.1)
/// and DeepSpeed's `pipe_partitioned` / `grad_partitioned` (on by default with model
/// parallelism). Each of the t ranks then sends 1/t of it and the receiver all-gathers it over
/// the TP group. With sequence parallelism the residual is already the 1/t shard
/// (`residual_bytes` counts n/t tokens) and nothing is gathered.
fn blocking_hop_s(r: &Resolved, network: &Network, hop_bytes: u64) -> f64 {
    let par = &r.config.parallel;
    let p2p =
        |bytes: u64| network.collective_s(GroupKind::Pp, CollectiveKind::SendRecv, bytes, par.pp);
    if par.tp > 1 && !par.sp_active() {
        let shard_bytes = hop_bytes.div_ceil(par.tp as u64);
        p2p(shard_bytes)
            + network.collective_s(GroupKind::Tp, CollectiveKind::AllGather, hop_bytes, par.tp)
    } else {
        p2p(hop_bytes)
    }
}

/// The schedule program and per-stage costs the estimate simulates (for `parsim schedule
/// --config`).
pub fn pipeline(r: &Resolved) -> Result<(crate::schedule::Program, Costs), EstimateError> {
    let par = &r.config.parallel;
    let prepared = Prepared::new(r, None)?;
    Ok((
        generate(par.schedule, par.pp, par.vpp, r.microbatches)?,
        prepared.costs,
    ))
}

/// The overlap switches of a configuration.
/// Under blocking launches (`training.launch_blocking`) none: the host waits out each
/// collective's kernel before it issues the compute that would hide it.
fn overlaps(r: &Resolved) -> Overlaps {
    let par = &r.config.parallel;
    let asynchronous = !r.config.training.launch_blocking;
    Overlaps {
        tp_comm: par.tp_comm_overlap && asynchronous,
        cp_ring: par.cp_comm_overlap && asynchronous,
        ep: par.schedule == ScheduleKind::DualPipeV && asynchronous,
        ep_1f1b: par.overlap_moe_expert_parallel_comm && asynchronous,
    }
}

/// Everything an estimate needs before the schedule simulation: the ledger, per-block times,
/// per-stage costs, and what each rank does after its last backward. Search uses its lower
/// bounds to skip simulating mixes that cannot win.
pub struct Prepared<'a> {
    r: &'a Resolved,
    ledger: Cow<'a, Ledger>,
    s: Cow<'a, LedgerSummary>,
    network: Cow<'a, Network>,
    chunks: Vec<Vec<ChunkContents>>,
    /// The distinct step-level collective lists, and per pipeline rank the index of its own.
    step: Vec<Vec<StepCollective>>,
    step_of: Vec<usize>,
    chunk_times: Vec<ChunkTimes>,
    costs: Costs,
    /// Per pipeline rank: (data-parallel tail, optimizer step) seconds.
    after: Vec<(f64, f64)>,
    peak: f64,
}

impl<'a> Prepared<'a> {
    /// Builds the ledger and the per-stage costs; `network` may be passed in when many
    /// configurations share one layout.
    pub fn new(r: &'a Resolved, network: Option<Network>) -> Result<Prepared<'a>, EstimateError> {
        Self::with_ledger(r, network, None)
    }

    /// As [`Prepared::new`], reusing the timed ledger of a configuration that differs only in
    /// how the layers are split over the pipeline (vpp, first/last stage, layout, slots): the
    /// ledger depends on the parallel degrees, the schedule, micro batch and recomputation.
    pub fn with_ledger(
        r: &'a Resolved,
        network: Option<Network>,
        timed: Option<(Ledger, LedgerSummary)>,
    ) -> Result<Prepared<'a>, EstimateError> {
        let network = network.unwrap_or_else(|| {
            Network::new(&Layout::of(r), &r.gpu).with_ep_dispatch(EpDispatch::of(&r.config))
        });
        let (ledger, s) = timed.unwrap_or_else(|| timed_ledger(r, &network));
        Chunked::new(r, Cow::Owned(ledger), Cow::Owned(s)).prepare(Cow::Owned(network))
    }

    /// The timed ledger, for [`Prepared::with_ledger`].
    pub fn timed_ledger(&self) -> (Ledger, LedgerSummary) {
        (
            self.ledger.clone().into_owned(),
            self.s.clone().into_owned(),
        )
    }

    /// A lower bound of the step time: every rank starts no earlier than the first
    /// microbatch's forward through the stages before its first one, is busy for its whole
    /// work, then runs its data-parallel tail and optimizer step.
    pub fn time_lower_bound(&self) -> f64 {
        self.busy_lower_bound()
            .max(self.drain_lower_bound_as(self.r.config.parallel.schedule))
    }

    /// The pipeline-drain bound of [`Prepared::time_lower_bound`] were the schedule
    /// `schedule` (GPipe, 1F1B and ZB-H1 share a split's [`Prepared`]; 0 where it does not
    /// apply).
    pub fn drain_lower_bound_as(&self, schedule: ScheduleKind) -> f64 {
        prepare::drain_lower_bound(self, schedule)
    }

    /// [`Prepared::time_lower_bound`] less the drain bound: each rank's fill, busy time, tail
    /// and optimizer step, at its most (0 without ranks).
    pub fn busy_lower_bound(&self) -> f64 {
        let m = self.r.microbatches as f64;
        let fwd: Vec<f64> = self.chunk_times.iter().map(|t| t.fwd).collect();
        self.chunks
            .iter()
            .zip(&self.after)
            .map(|(ch, (tail, opt))| {
                let busy: f64 = ch
                    .iter()
                    .map(|c| {
                        let t = &self.chunk_times[c.stage];
                        t.fwd + t.input_grad + t.weight_grad
                    })
                    .sum();
                let first = ch.iter().map(|c| c.stage).min().unwrap_or(0);
                let head: f64 = fwd[..first].iter().sum();
                head + m * busy + tail + opt
            })
            .fold(0.0, f64::max)
    }

    /// A lower bound of the most loaded rank's memory: one activation set in flight.
    pub fn memory_lower_bound(&self) -> u64 {
        prepare::memory_lower_bound(self.r, &self.s, &self.ledger, &self.chunks)
    }

    /// `f` summed over every block of one model replica (per microbatch).
    fn layer_sum(&self, f: impl Fn(&BlockSummary) -> f64) -> f64 {
        let m = &self.r.config.model;
        let s = &self.s;
        let moe_layers = m.num_moe_layers() as u64;
        let dense_layers = m.num_layers as u64 - moe_layers;
        if m.layer_variants().is_empty() {
            let mut x = f(&s.embedding) + f(&s.output) + dense_layers as f64 * f(&s.dense);
            if let Some(b) = &s.moe {
                x += moe_layers as f64 * f(b);
            }
            if let Some(b) = &s.mtp {
                x += m.mtp_num_layers as f64 * f(b);
            }
            return x;
        }
        ChunkContents::whole_model(m)
            .blocks(s)
            .map(|(b, n)| n as f64 * f(b))
            .sum()
    }

    /// Parameter counts: whole model, per block kind, the most loaded GPU, activated per token.
    fn param_report(&self) -> ParamReport {
        let m = &self.r.config.model;
        let (s, ledger) = (&self.s, &self.ledger);
        let moe_layers = m.num_moe_layers() as u64;
        let dense_layers = m.num_layers as u64 - moe_layers;
        let mtp = m.mtp_num_layers as u64;
        let total = self.layer_sum(|b| b.params.total as f64) as u64;
        let expert_total = self.layer_sum(|b| b.params.expert_total as f64);
        let activated = if m.is_moe() {
            let k = m.moe_router_topk as f64 / m.num_experts as f64;
            (total as f64 - expert_total * (1.0 - k)).round() as u64
        } else {
            total
        };
        let trainable_of = |b: &crate::model::Block| -> u64 {
            b.ops
                .iter()
                .filter_map(|o| o.params)
                .filter(|p| p.trainable)
                .map(|p| p.total)
                .sum()
        };
        let trainable_total = if ledger.variants.is_empty() {
            trainable_of(&ledger.embedding)
                + trainable_of(&ledger.output)
                + dense_layers * trainable_of(&ledger.dense)
                + ledger
                    .moe
                    .as_ref()
                    .map_or(0, |b| moe_layers * trainable_of(b))
                + ledger.mtp.as_ref().map_or(0, |b| mtp * trainable_of(b))
        } else {
            ChunkContents::whole_model(m)
                .ledger_blocks(ledger)
                .map(|(b, n)| n * trainable_of(b))
                .sum()
        };
        // Ranks that share a step-collective list hold the same blocks: one count each.
        let per_gpu_max = self
            .chunks
            .iter()
            .zip(&self.step_of)
            .enumerate()
            .filter(|&(rank, (_, j))| !self.step_of[..rank].contains(j))
            .map(|(_, (c, _))| rank_params(c, s).rank())
            .max()
            .unwrap_or(0);
        let final_norm: u64 = ledger
            .output
            .ops
            .iter()
            .filter(|o| o.role == OpRole::FinalNorm)
            .filter_map(|o| o.params)
            .map(|p| p.total)
            .sum();
        ParamReport {
            total,
            embedding: s.embedding.params.total,
            output_layer: s.output.params.total - final_norm,
            per_layer: s
                .dense
                .params
                .total
                .max(s.moe.map_or(0, |b| b.params.total)),
            per_layer_dense: s.dense.params.total,
            per_layer_moe: s.moe.map(|b| b.params.total),
            per_gpu_max,
            activated_per_token: activated,
            trainable: trainable_total,
        }
    }

    /// FLOPs per step: model (Megatron's count) and hardware (recomputation included).
    fn flops_report(&self) -> FlopsReport {
        let tr = &self.r.config.training;
        let microbatches_per_step = (tr.global_batch_size / tr.micro_batch_size) as f64;
        let model_per_mb = self.layer_sum(|b| b.model_flops);
        let recompute_per_mb = self.layer_sum(|b| b.recompute_model);
        let per_step_model = model_per_mb * microbatches_per_step;
        let tokens_per_step = (tr.global_batch_size * tr.seq_length) as f64;
        FlopsReport {
            per_step_model,
            per_step_hardware: (model_per_mb + recompute_per_mb) * microbatches_per_step,
            per_token_model: per_step_model / tokens_per_step,
        }
    }
}

/// Runs every part of the estimate.
pub fn estimate(r: &Resolved) -> Result<Estimate, EstimateError> {
    Prepared::new(r, None)?.finish()
}

/// [`verdict`] measured against the usable memory: a configuration that fits the device but
/// not its margin is named as such.
pub fn verdict_with_margin(
    t: &StepTime,
    need: u64,
    gpu: &crate::config::GpuProfile,
    ctx: breakdown::AdviceContext,
) -> String {
    let usable = gpu.usable_memory_bytes();
    if need > usable && need <= gpu.memory_bytes {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        return format!(
            "does not fit with the memory margin: the most loaded GPU needs {:.1} GiB, {:.1} GiB of {:.1} GiB usable ({:.0}% kept free; --memory-margin)",
            gib(need),
            gib(usable),
            gib(gpu.memory_bytes),
            100.0 * gpu.memory_margin_fraction
        );
    }
    verdict(t, need <= usable, need, gpu.memory_bytes, ctx)
}

/// One line naming what bounds the step; for a configuration that does not fit, what frees
/// memory (with routed experts, raising EP first: they hold most of an MoE model's weights and
/// optimizer state, and shard over it).
pub fn verdict(
    t: &StepTime,
    fits: bool,
    need: u64,
    capacity: u64,
    ctx: breakdown::AdviceContext,
) -> String {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    if !fits {
        let fixes = if ctx.moe {
            "raise EP (the routed experts shard over it), more TP/PP/CP, a higher ZeRO stage or more recomputation"
        } else {
            "more TP/PP/CP, a higher ZeRO stage or more recomputation"
        };
        return format!(
            "does not fit: the most loaded GPU needs {:.1} GiB of {:.1} GiB ({fixes})",
            gib(need),
            gib(capacity)
        );
    }
    breakdown::verdict_line(t, ctx)
}
