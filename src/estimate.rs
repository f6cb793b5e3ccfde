//! One full estimate of a resolved configuration: parameters, FLOPs, memory stage by stage,
//! communication per group, the pipeline schedule, step time and throughput, shaped as the
//! DESIGN.md output contract.

use crate::comm::rank_step_bytes;
use crate::config::{Config, Resolved};
use crate::layout::{GroupKind, Layout};
use crate::memory::{
    chunks_per_rank, inflight_chunks, rank_params, stage_memory, LedgerSummary, StageMemory,
};
use crate::model::{GroupBytes, Ledger};
use crate::time::{step_time, StageWork, StepTime};
use serde::Serialize;

/// Adam's HBM traffic per updated parameter: read the fp32 gradient (4), read and write the
/// fp32 master weight and both moments (24), write the bf16 weight (2).
pub const ADAM_BYTES_PER_PARAM: f64 = 30.0;

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

#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    pub per_gpu_max_bytes: u64,
    pub capacity_bytes: u64,
    pub fits: bool,
    pub stages: Vec<StageMemory>,
}

/// Wire bytes per step sent by the most loaded GPU, per group.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct GroupBytesInt {
    pub tp: u64,
    pub cp: u64,
    pub pp: u64,
    pub dp: u64,
    pub ep: u64,
}

impl From<GroupBytes> for GroupBytesInt {
    fn from(g: GroupBytes) -> Self {
        GroupBytesInt {
            tp: g.tp.round() as u64,
            cp: g.cp.round() as u64,
            pp: g.pp.round() as u64,
            dp: g.dp.round() as u64,
            ep: g.ep.round() as u64,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupInfo {
    pub group: GroupKind,
    pub size: u32,
    pub crosses_nodes: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct CommReport {
    pub per_step_bytes_per_gpu: GroupBytesInt,
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
    /// Model FLOPs per second per GPU, in TFLOP/s.
    pub tflops_per_gpu: f64,
    /// Hardware FLOPs (recomputation included) per second per GPU, in TFLOP/s.
    pub hardware_tflops_per_gpu: f64,
    pub mfu: f64,
}

/// The whole estimate (DESIGN.md output contract).
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
    pub warnings: Vec<String>,
}

/// Runs every part of the estimate.
pub fn estimate(r: &Resolved) -> Estimate {
    let ledger = Ledger::build(r);
    let cfg = &r.config;
    let tr = &cfg.training;
    let par = &cfg.parallel;
    let m = &cfg.model;
    let s = LedgerSummary::of(&ledger, tr.recompute);

    // Parameters.
    let moe_layers = m.num_moe_layers() as u64;
    let dense_layers = m.num_layers as u64 - moe_layers;
    let mtp = m.mtp_num_layers as u64;
    let layer_sum = |f: &dyn Fn(&crate::memory::BlockSummary) -> f64| -> f64 {
        let mut x = f(&s.embedding) + f(&s.output) + dense_layers as f64 * f(&s.dense);
        if let Some(b) = &s.moe {
            x += moe_layers as f64 * f(b);
        }
        if let Some(b) = &s.mtp {
            x += mtp as f64 * f(b);
        }
        x
    };
    let total = layer_sum(&|b| b.params.total as f64) as u64;
    let expert_total = layer_sum(&|b| b.params.expert_total as f64);
    let activated = if m.is_moe() {
        let k = m.moe_router_topk as f64 / m.num_experts as f64;
        (total as f64 - expert_total * (1.0 - k)).round() as u64
    } else {
        total
    };
    let trainable_total: u64 = ledger
        .embedding
        .ops
        .iter()
        .chain(&ledger.output.ops)
        .filter_map(|o| o.params)
        .filter(|p| p.trainable)
        .map(|p| p.total)
        .sum::<u64>()
        + [
            (&ledger.dense, dense_layers),
            (ledger.moe.as_ref().unwrap_or(&ledger.dense), moe_layers),
        ]
        .iter()
        .chain(ledger.mtp.as_ref().map(|b| (b, mtp)).iter())
        .map(|(b, n)| {
            n * b
                .ops
                .iter()
                .filter_map(|o| o.params)
                .filter(|p| p.trainable)
                .map(|p| p.total)
                .sum::<u64>()
        })
        .sum::<u64>();

    let chunks = chunks_per_rank(r);
    let per_gpu_max = chunks
        .iter()
        .map(|c| rank_params(c, &s).rank())
        .max()
        .unwrap_or(0);

    // FLOPs.
    let microbatches_per_step = (tr.global_batch_size / tr.micro_batch_size) as f64;
    let model_per_mb = layer_sum(&|b| b.model_flops);
    let recompute_per_mb = layer_sum(&|b| b.recompute_model);
    let per_step_model = model_per_mb * microbatches_per_step;
    let per_step_hardware = (model_per_mb + recompute_per_mb) * microbatches_per_step;
    let tokens_per_step = (tr.global_batch_size * tr.seq_length) as f64;

    // Memory, communication and the slowest stage's work, per pipeline rank.
    let layout = Layout::of(r);
    let peak = r
        .gpu
        .peak_flops_for(tr.precision)
        .unwrap_or(r.gpu.peak_flops.bf16);
    let rate = peak * r.gpu.efficiency.matmul;
    let mut stages = Vec::with_capacity(chunks.len());
    let mut inflight = Vec::with_capacity(chunks.len());
    let mut comm = GroupBytes::default();
    let mut work = StageWork::default();
    let mut optimizer_params = 0f64;
    for (rank, ch) in chunks.iter().enumerate() {
        let n = inflight_chunks(par.schedule, par.pp, par.vpp, r.microbatches, rank as u32);
        inflight.push(n);
        stages.push(stage_memory(r, &s, &ledger, rank as u32, ch, n));
        comm.max(&rank_step_bytes(r, &s, &ledger, ch));
        let mut w = StageWork::default();
        for (b, k) in ch.iter().flat_map(|c| c.blocks(&s)) {
            let k = k as f64;
            w.fwd_s += k * b.rank_fwd / rate;
            w.dgrad_s += k * (b.rank_dgrad + b.recompute_rank) / rate;
            w.wgrad_s += k * b.rank_wgrad / rate;
        }
        if w.fwd_s + w.dgrad_s + w.wgrad_s > work.fwd_s + work.dgrad_s + work.wgrad_s {
            work = w;
        }
        let p = rank_params(ch, &s);
        let updated = if par.zero >= 1 {
            p.rank_dense_trainable as f64 / r.dense_replicas() as f64
                + p.rank_expert_trainable as f64 / r.expert_dp() as f64
        } else {
            (p.rank_dense_trainable + p.rank_expert_trainable) as f64
        };
        optimizer_params = optimizer_params.max(updated);
    }
    let per_gpu_max_bytes = stages.iter().map(|st| st.total).max().unwrap_or(0);
    let time = step_time(
        r,
        &layout,
        &work,
        &comm,
        optimizer_params * ADAM_BYTES_PER_PARAM,
    );
    let ideal = r.microbatches as f64 * (work.fwd_s + work.dgrad_s + work.wgrad_s);
    let bubble_fraction = if ideal > 0.0 {
        time.bubble_s / ideal
    } else {
        0.0
    };
    let world = r.world() as f64;

    let mut warnings = r.warnings.clone();
    warnings.push("time: closed-form model (efficiency x peak, textbook bubble); the op-level time model is not built yet".into());
    let groups = GroupKind::ALL
        .iter()
        .map(|&g| GroupInfo {
            group: g,
            size: layout.group_of(g, 0).len() as u32,
            crosses_nodes: layout.group_crosses_nodes(g, 0),
        })
        .collect();

    Estimate {
        config: cfg.clone(),
        gpu: r.gpu.name.clone(),
        params: ParamReport {
            total,
            embedding: s.embedding.params.total,
            output_layer: s.output.params.total
                - ledger.output.ops[0].params.map_or(0, |p| p.total),
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
        },
        flops: FlopsReport {
            per_step_model,
            per_step_hardware,
            per_token_model: per_step_model / tokens_per_step,
        },
        memory: MemoryReport {
            per_gpu_max_bytes,
            capacity_bytes: r.gpu.memory_bytes,
            fits: per_gpu_max_bytes <= r.gpu.memory_bytes,
            stages,
        },
        communication: CommReport {
            per_step_bytes_per_gpu: comm.into(),
            groups,
        },
        schedule: ScheduleReport {
            name: par.schedule.to_string(),
            pp: par.pp,
            vpp: par.vpp,
            microbatches: r.microbatches,
            bubble_fraction,
            peak_inflight_microbatches: inflight,
        },
        time,
        throughput: Throughput {
            tokens_per_s: tokens_per_step / time.step_s,
            tflops_per_gpu: per_step_model / time.step_s / world / 1e12,
            hardware_tflops_per_gpu: per_step_hardware / time.step_s / world / 1e12,
            mfu: per_step_model / (time.step_s * world * peak),
        },
        warnings,
    }
}
