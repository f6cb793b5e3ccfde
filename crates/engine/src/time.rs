//! The time model: each ledger op's calls (its GEMMs, attention kernel calls, memory-bound
//! kernels, collectives), priced by the one op-cost function ([`crate::op_cost`]); the
//! communication each op leaves exposed per the overlap switches; per-stage durations for the
//! schedule simulator; and the step's breakdown.
//!
//! Efficiency is data (STYLE.md, Calculon): every constant lives in the GPU profile, where
//! calibration fits it. Where the profile's measured tables (`[tables]`, config/tables.rs)
//! cover an op, they time it instead; [`TableCoverage`] counts the ops they leave out.

use crate::config::tables::RateTables;
use crate::config::{CpComm, Recompute};
use crate::ep_overlap::{self, EpWindows};
use crate::layout::GroupKind;
use crate::model::{Block, BlockTimes, Op, OpKind, PerGroup, Phase, TensorRole};
use crate::network::{CollectiveGroup, Network};
use crate::op_cost::host_issue::{BlockIssue, HostIssue};
use crate::op_cost::{AttentionCall, AttentionKernel, Call, CollectiveCall, CostModel, OpCost};
use parsim_plan::op_timing::{MaskKind, Pass};
use serde::Serialize;
use std::collections::BTreeMap;

pub use crate::op_cost::Rates;

/// An attention core's shape, read off its ledger op.
#[derive(Debug, Clone, Copy)]
struct Core {
    seq_len: u64,
    causal: bool,
    fused: bool,
    head_dim: u64,
    ring: Option<crate::model::RingCalls>,
    window: Option<u64>,
}

impl Core {
    fn of(op: &Op) -> Option<Core> {
        match op.kind {
            OpKind::Attention {
                seq_len,
                causal,
                fused,
                head_dim,
                ring,
                window,
            } => Some(Core {
                seq_len,
                causal,
                fused,
                head_dim,
                ring,
                window,
            }),
            _ => None,
        }
    }
}

impl Rates<'_> {
    /// The cost of one call with no network (compute calls only).
    #[inline]
    fn cost(&self, call: &Call) -> OpCost {
        let model = CostModel {
            rates: *self,
            network: None,
        };
        model.cost(call).unwrap_or_default()
    }

    /// Seconds for an [m x k] . [k x n] GEMM (its measured bucket where the profile's table
    /// covers it, else the roofline with wave quantisation), with its launch.
    pub fn gemm_s(&self, m: u64, n: u64, k: u64) -> f64 {
        self.cost(&Call::Gemm { m, n, k }).total_s()
    }

    /// Seconds of one pass of a matmul of `groups` equal groups: per group an
    /// [m x k] . [k x n] GEMM (a grouped GEMM, [`Call::GroupedGemm`]), with its launch.
    pub fn grouped_gemm_s(&self, groups: u64, m: u64, n: u64, k: u64) -> f64 {
        self.cost(&Call::GroupedGemm { groups, m, n, k }).total_s()
    }

    /// Seconds to stream `bytes` through HBM once, with the launch.
    pub fn memory_s(&self, bytes: u64) -> f64 {
        self.cost(&Call::Memory { bytes }).total_s()
    }

    /// Seconds of attention-core FLOPs at the fused kernel's efficiency, with the launch; 0
    /// for no FLOPs. The core runs at most at the bf16 rate: FP8 training (Transformer
    /// Engine's recipe) casts the linear layers' GEMMs, not the attention kernel.
    pub fn attention_s(&self, flops: f64) -> f64 {
        if flops <= 0.0 {
            return 0.0;
        }
        self.attention_efficiency(flops).total_s()
    }

    /// Seconds of the attention core's (forward, backward) FLOPs. A fused core whose both
    /// passes the profile's measured curves cover runs at them, as one call. Else a fused core
    /// on a GPU whose profile names a published kernel runs at that kernel's measured rate for
    /// its sequence length, head dimension and mask (src/attention_rates.rs; FlashAttention-3
    /// Figures 5 and 6 on H100, FlashAttention-2 Figure 4 on A100): the backward's rate is
    /// quoted for 2.5 forward FLOPs, so its time is 2.5 x forward FLOPs over it. An unfused
    /// core runs its batched GEMMs ([`Rates::unfused_core_s`]). Otherwise both run at
    /// `efficiency.attention`. A ring core is one call per KV block ([`Self::ring_calls_s`]).
    /// Every call is priced by [`CostModel::cost`].
    pub fn attention_pass_s(&self, op: &Op) -> (f64, f64) {
        let Some(core) = Core::of(op) else {
            return (0.0, 0.0);
        };
        if let Some(t) = self.table_attention_s(op, &core) {
            return t;
        }
        let (diag, other) = self.ring_calls_s(op, &core);
        match core.ring {
            Some(r) => {
                let others = f64::from(r.blocks.saturating_sub(1));
                (diag.0 + others * other.0, diag.1 + others * other.1)
            }
            None => other,
        }
    }

    /// The (forward, backward) seconds of the attention calls of `share` of the core's FLOPs,
    /// `len` long, masked or not, by `kernel`.
    fn core_calls_s(
        &self,
        op: &Op,
        core: &Core,
        (share, len, causal): (f64, u64, bool),
        kernel: AttentionKernel,
    ) -> (f64, f64) {
        let f = &op.rank_flops;
        let call = |flops: f64, pass: Pass| {
            let call = AttentionCall {
                flops,
                pass,
                len,
                causal,
                head_dim: core.head_dim,
                window: core.window,
                kernel,
            };
            self.cost(&Call::Attention(call)).total_s()
        };
        (
            call(share * f.fwd, Pass::Forward),
            call(share * f.dgrad, Pass::Backward),
        )
    }

    /// The attention core's (forward, backward) seconds of one kernel call: for a ring
    /// ([`crate::model::RingCalls`]), the diagonal call and one off-diagonal call (each with
    /// its launch; the zigzag layout's off-diagonal calls are half blocks, timed at the rate
    /// of their s/2cp length); else the whole core, as both.
    fn ring_calls_s(&self, op: &Op, core: &Core) -> ((f64, f64), (f64, f64)) {
        // (FLOP share, call length, mask) of the diagonal and of each other call.
        let (diag, other) = match core.ring {
            Some(r) => {
                let (d, o) = r.flop_shares();
                let len = if r.zigzag {
                    core.seq_len / 2
                } else {
                    core.seq_len
                };
                ((d, core.seq_len, true), (o, len.max(1), core.causal))
            }
            None => {
                let whole = (1.0, core.seq_len, core.causal);
                (whole, whole)
            }
        };
        let kernel = if core.fused {
            AttentionKernel::Fused { measured: None }
        } else {
            AttentionKernel::Unfused
        };
        (
            self.core_calls_s(op, core, diag, kernel),
            self.core_calls_s(op, core, other, kernel),
        )
    }

    /// A ring core's (diagonal, off-diagonal) call seconds in `phase` (forward; backward is
    /// input gradient), for the exchange's overlap: `None` when the core is not a ring or
    /// measured tables time it (their single figure is not split by call).
    pub fn ring_block_s(&self, op: &Op, phase: Phase) -> Option<(f64, f64)> {
        let core = Core::of(op).filter(|c| c.ring.is_some())?;
        if self.table_attention_rates(op).is_some() {
            return None;
        }
        let (diag, other) = self.ring_calls_s(op, &core);
        Some(match phase {
            Phase::Forward => (diag.0, other.0),
            Phase::Backward => (diag.1, other.1),
        })
    }

    /// The implementation whose measured curves (`tables.attention_kernel`) cover both passes
    /// of a fused core at its sequence length, mask and head dimension.
    fn table_attention_rates(&self, op: &Op) -> Option<&str> {
        let core = Core::of(op).filter(|c| c.fused)?;
        let t = &self.gpu.tables;
        let kernel = t.attention_kernel.as_deref()?;
        let mask = if core.causal {
            MaskKind::Causal
        } else {
            MaskKind::Full
        };
        let covers = |pass| {
            t.attention_flops_per_s(kernel, pass, mask, core.head_dim, core.seq_len)
                .is_some()
        };
        (covers(Pass::Forward) && covers(Pass::Backward)).then_some(kernel)
    }

    /// [`Self::attention_pass_s`] from the measured curves ([`Self::table_attention_rates`]):
    /// the whole core as one call.
    fn table_attention_s(&self, op: &Op, core: &Core) -> Option<(f64, f64)> {
        let measured = self.table_attention_rates(op)?;
        let whole = (1.0, core.seq_len, core.causal);
        let kernel = AttentionKernel::Fused {
            measured: Some(measured),
        };
        Some(self.core_calls_s(op, core, whole, kernel))
    }

    /// Whether the profile's tables time `op`'s compute: every GEMM of a matmul (forward and
    /// both gradients), both passes of a fused attention core, a memory-bound op's forward
    /// and backward bytes, every cast kernel. `None` for ops no table times (an unfused core).
    pub fn table_covers(&self, op: &Op) -> Option<(&'static str, bool)> {
        let mem = |b: u64| b == 0 || self.table_memory(b).is_some();
        match op.kind {
            // A grouped GEMM is covered where its groups' GEMMs are (each group its rows).
            OpKind::Matmul { m, n, k } => {
                let f = &op.rank_flops;
                let m = m.div_ceil(op.gemm_groups.max(1));
                let passes = [
                    (f.fwd, (m, n, k)),
                    (f.dgrad, (m, k, n)),
                    (f.wgrad, (k, n, m)),
                ];
                Some((
                    "gemm",
                    passes
                        .iter()
                        .filter(|(flops, _)| *flops > 0.0)
                        .all(|&(_, (a, b, c))| self.table_gemm(a, b, c).is_some()),
                ))
            }
            OpKind::Attention { fused: true, .. } => {
                Some(("attention", self.table_attention_rates(op).is_some()))
            }
            OpKind::Attention { .. } => None,
            OpKind::MemoryBound { bytes } => Some(("memory", mem(bytes) && mem(2 * bytes))),
            OpKind::Quantize { fwd, bwd, .. } => Some((
                "memory",
                [fwd, bwd]
                    .iter()
                    .all(|p| mem(p.amax_bytes) && mem(p.cast_bytes)),
            )),
        }
    }

    /// HBM bytes an unfused attention core streams in its forward: the s x s scores are
    /// written by QK^T, read and written by the softmax and read by the product with V (4x
    /// the saved softmax); with attention dropout, the dropout reads the probabilities and
    /// writes its output and mask, which the product with V reads instead (2x its output
    /// plus the mask). Zero for a fused (flash) kernel, which saves no s x s tensor.
    pub fn unfused_attention_bytes(op: &Op) -> u64 {
        op.saved
            .iter()
            .map(|t| match t.role {
                TensorRole::Softmax => 4 * t.bytes,
                TensorRole::DropoutOut => 2 * t.bytes,
                TensorRole::DropoutMask => t.bytes,
                _ => 0,
            })
            .sum()
    }

    /// Compute seconds of one op: (forward, input gradient, weight gradient).
    pub fn op_s(&self, op: &Op) -> (f64, f64, f64) {
        match op.kind {
            OpKind::Matmul { m, n, k } => {
                let f = &op.rank_flops;
                // A grouped GEMM's groups split the rows: each group's forward is
                // [m/g x k] . [k x n], its dX = dY . W^T [m/g x n] . [n x k] and its
                // dW = X^T . dY [k x m/g] . [m/g x n] (one weight gradient per group).
                let g = op.gemm_groups.max(1);
                let rows = m.div_ceil(g);
                let pass = |flops: f64, (a, b, c): (u64, u64, u64)| {
                    if flops > 0.0 {
                        self.grouped_gemm_s(g, a, b, c)
                    } else {
                        0.0
                    }
                };
                (
                    pass(f.fwd, (rows, n, k)),
                    pass(f.dgrad, (rows, k, n)),
                    pass(f.wgrad, (k, n, rows)),
                )
            }
            // An unfused core also streams its s x s tensors. Backward moves about 1.5 times
            // the forward's bytes: the product with V reads the probabilities and writes
            // their gradient, the dropout and softmax backward read it (with the mask and
            // the probabilities) and write theirs, which both products for dQ and dK read.
            OpKind::Attention { .. } => {
                let bytes = Self::unfused_attention_bytes(op);
                let (fwd, bwd) = self.attention_pass_s(op);
                (
                    fwd + self.memory_s(bytes),
                    bwd + self.memory_s(bytes * 3 / 2),
                    0.0,
                )
            }
            // Backward reads the output gradient and the saved input and writes the input gradient.
            OpKind::MemoryBound { bytes } => (self.memory_s(bytes), self.memory_s(2 * bytes), 0.0),
            // Each cast's kernels (src/op_cost/cast.rs), each with its launch.
            OpKind::Quantize { fwd, bwd, .. } => (fwd.seconds(self), bwd.seconds(self), 0.0),
        }
    }
}

/// Which overlaps are on (ParallelConfig's switches, resolved for one configuration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Overlaps {
    pub tp_comm: bool,
    pub cp_ring: bool,
    /// EP all-to-all hidden behind compute (DualPipe's overlapped forward-backward slots).
    pub ep: bool,
    /// Megatron-Core's EP overlap in its combined 1F1B schedule
    /// (`parallel.overlap_moe_expert_parallel_comm`, [`crate::ep_overlap`]).
    pub ep_1f1b: bool,
}

/// What the time model needs to time a block.
#[derive(Debug, Clone, Copy)]
pub struct TimingContext<'a> {
    pub rates: Rates<'a>,
    pub network: &'a Network,
    pub overlaps: Overlaps,
    pub cp_comm: CpComm,
    /// The group every rank waits at once a step at least ([`step_sync_group`]).
    pub step_sync: Option<GroupKind>,
    /// How the host issues the kernels: the device waits where the host falls behind
    /// ([`crate::op_cost::host_issue`]); [`HostIssue::NONE`] times the device alone.
    pub host: HostIssue<'a>,
}

/// The group where the ranks of a configuration wait for each other at least once a step,
/// for blocks that issue no synchronising collective themselves: the data-parallel gradient
/// reduction when dp > 1, else the pipeline hand-offs when pp > 1; `None` on one rank.
pub fn step_sync_group(dp: u32, pp: u32) -> Option<GroupKind> {
    if dp > 1 {
        Some(GroupKind::Dp)
    } else if pp > 1 {
        Some(GroupKind::Pp)
    } else {
        None
    }
}

impl TimingContext<'_> {
    /// Times one block under `recompute` ([`block_times`]); a layer a low-precision recipe
    /// keeps in bf16 runs its GEMMs at the bf16 peak and share.
    pub fn block_times(&self, b: &Block, recompute: Recompute) -> BlockTimes {
        let bf16 = Rates {
            peak_flops: self.rates.gpu.peak_flops.bf16,
            matmul_efficiency: self.rates.gpu.efficiency.matmul,
            ..self.rates
        };
        self.times(
            b,
            if b.high_precision { &bf16 } else { &self.rates },
            recompute,
        )
    }

    /// Times one block at `rates`: compute per op and the communication each op leaves
    /// exposed, plus the members' waiting for each other (`efficiency.sync_skew` of the
    /// compute) at the block's first synchronising collective of each pass, else at
    /// `step_sync`; plus the device's waiting on the host's issue in each pass (in the
    /// pass's compute: the stream is held by it).
    fn times(&self, b: &Block, rates: &Rates, recompute: Recompute) -> BlockTimes {
        let mut t = BlockTimes::default();
        let model = CostModel {
            rates: *rates,
            network: Some(self.network),
        };
        let mut issue = BlockIssue::default();
        // The first synchronising collective of each pass: where the block's members wait for
        // each other ([`crate::config::gpu::Efficiency::sync_skew`]).
        let mut sync: [Option<GroupKind>; 2] = [None, None];
        // Under the combined 1F1B's EP overlap the EP transfers are exposed per window once
        // the layer is walked.
        let mut windows = self.overlaps.ep_1f1b.then(EpWindows::default);
        for op in &b.ops {
            let (f, d, w) = rates.op_s(op);
            let mut ep_s = [0.0; 2];
            t.fwd_s += f;
            t.dgrad_s += d;
            t.wgrad_s += w;
            let rerun = b.reruns(op, recompute);
            if rerun {
                t.recompute_s += f * op.rerun_compute_share();
            }
            issue.op(&self.host, op, (f, d, w), rerun);
            for c in &op.comms {
                if c.group_size > 1
                    && matches!(
                        c.group,
                        GroupKind::Tp | GroupKind::Cp | GroupKind::Ep | GroupKind::ExpertTp
                    )
                {
                    let pass = usize::from(c.phase == Phase::Backward);
                    sync[pass].get_or_insert(c.group);
                }
                let call = Call::Collective(CollectiveCall {
                    kind: c.kind,
                    payload_bytes: c.payload_bytes,
                    group_size: c.group_size,
                    group: CollectiveGroup::Kind(c.group),
                });
                let cost = model.cost(&call).unwrap_or_default();
                let compute_s = match c.phase {
                    Phase::Forward => f,
                    Phase::Backward => d + w,
                };
                if windows.is_some() && c.group == GroupKind::Ep && c.group_size > 1 {
                    ep_s[ep_overlap::pass(c.phase)] += cost.total_s() * c.count as f64;
                    if c.payload_bytes > 0 {
                        issue.collective(&self.host, c.phase, 0.0, false);
                    }
                    continue;
                }
                let exposed = self.exposed_s(rates, op, c, cost, compute_s);
                let rerun_comm = rerun && op.rerun_repeats_comms() && c.phase == Phase::Forward;
                if c.group_size > 1 && c.payload_bytes > 0 {
                    issue.collective(&self.host, c.phase, exposed, rerun_comm);
                }
                let slot = match c.phase {
                    Phase::Forward => &mut t.exposed_fwd,
                    Phase::Backward => &mut t.exposed_bwd,
                };
                slot.add_group(c.group, exposed);
                if rerun_comm {
                    t.exposed_bwd.add_group(c.group, exposed);
                }
            }
            if let Some(win) = windows.as_mut() {
                win.op(f, d + w, ep_s);
            }
        }
        if let Some(win) = windows {
            let e = win.exposed();
            let charge = |p: usize| rates.gpu.efficiency.charged_s(e.comm_s[p], e.exposed_s[p]);
            t.exposed_fwd.add_group(GroupKind::Ep, charge(0));
            t.exposed_bwd.add_group(GroupKind::Ep, charge(1));
        }
        let skew = rates.gpu.efficiency.sync_skew;
        if skew > 0.0 {
            let sync = sync.map(|g| g.or(self.step_sync));
            if let Some(g) = sync[0] {
                t.exposed_fwd.add_group(g, skew * t.fwd_s);
                if recompute != Recompute::None && t.recompute_s > 0.0 {
                    t.exposed_bwd.add_group(g, skew * t.recompute_s);
                }
            }
            if let Some(g) = sync[1] {
                t.exposed_bwd.add_group(g, skew * (t.dgrad_s + t.wgrad_s));
            }
        }
        let wait = issue.wait(&self.host);
        t.fwd_s += wait.fwd_s;
        t.dgrad_s += wait.bwd_s;
        t.recompute_s += wait.recompute_s;
        t
    }

    /// What collective `c` of `op` leaves on the critical path, its `cost` per call, beside
    /// `compute_s` of the op's pass, per the overlap switches; hidden communication still
    /// slows the compute it overlaps (`efficiency.charged_s`).
    fn exposed_s(
        &self,
        rates: &Rates,
        op: &Op,
        c: &crate::model::Collective,
        cost: OpCost,
        compute_s: f64,
    ) -> f64 {
        let overlaps = self.overlaps;
        let (total_s, pipeline_s) = (cost.total_s(), cost.pipeline_s);
        // Overlapped TP transfers run through Megatron-Core's userbuffers (copy engines),
        // not NCCL's chunk pipeline.
        let tp_userbuffers = c.group == GroupKind::Tp && overlaps.tp_comm;
        let comm_s = if tp_userbuffers {
            total_s - pipeline_s
        } else {
            total_s
        } * c.count as f64;
        let exposed = match c.group {
            GroupKind::Tp if overlaps.tp_comm => (comm_s - compute_s).max(0.0),
            // Ring attention: each of the cp-1 hops hides behind the call on the block at
            // hand (the diagonal first, then the off-diagonal ones), as far as it lasts.
            GroupKind::Cp
                if overlaps.cp_ring && matches!(self.cp_comm, CpComm::P2p | CpComm::Zigzag) =>
            {
                let steps = c.count.max(1) as f64;
                let hop = comm_s / steps;
                match rates.ring_block_s(op, c.phase) {
                    Some((diag, other)) => {
                        (hop - diag).max(0.0) + (steps - 1.0) * (hop - other).max(0.0)
                    }
                    None => {
                        let per_block = compute_s / (steps + 1.0);
                        steps * (hop - per_block).max(0.0)
                    }
                }
            }
            GroupKind::Ep if overlaps.ep => (comm_s - compute_s).max(0.0),
            // The expert-TP all-gather and reduce-scatter run between the all-to-all and
            // the experts (Megatron-Core's dispatch post- and combine pre-processing, where
            // its docstrings warn communication "may get exposed" even when the all-to-all
            // overlaps): never hidden, DualPipe's overlap included.
            GroupKind::ExpertTp => comm_s,
            _ => comm_s,
        };
        rates.gpu.efficiency.charged_s(comm_s, exposed)
    }
}

/// Times one block with free host issue ([`TimingContext::block_times`] with
/// [`HostIssue::NONE`]): the device's time alone.
pub fn block_times(
    b: &Block,
    rates: &Rates,
    network: &Network,
    overlaps: Overlaps,
    recompute: Recompute,
    cp_comm: CpComm,
    step_sync: Option<GroupKind>,
) -> BlockTimes {
    let ctx = TimingContext {
        rates: *rates,
        network,
        overlaps,
        cp_comm,
        step_sync,
        host: HostIssue::NONE,
    };
    ctx.times(b, rates, recompute)
}

/// Step time and its parts, in seconds (docs/design.md, `time`). The parts add up to the
/// step: compute + exposed communication (DP tail included) + bubble + optimizer, and the
/// bubble splits into warm-up/cool-down + stage imbalance + pipeline send/receive waits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepTime {
    pub step_s: f64,
    /// The interval's lower and upper step time (`step_interval`: the lower and upper
    /// percentile of measured residuals of the estimate's regime, 0.1 and 0.9 by default).
    pub step_s_p10: f64,
    pub step_s_p90: f64,
    /// Compute of the critical pipeline rank (recomputation included).
    pub compute_s: f64,
    /// Exposed communication of that rank plus the data-parallel tail.
    pub exposed_comm_s: f64,
    /// Exposed communication per group; `dp` includes the DP tail, `ep` is the exposed expert
    /// all-to-all, `pp` holds only the members' waiting at the pipeline hand-offs
    /// (`efficiency.sync_skew`; pipeline transfers on the critical path are `pp_wait_s`).
    pub exposed_comm_by_group_s: PerGroup,
    /// Idle time of the critical rank in the simulated schedule: the sum of the next three.
    pub bubble_s: f64,
    /// The schedule's own fill and drain: the idle time of the same schedule with every stage
    /// at the mean stage's cost and free hops ((p-1)(F+B) for 1F1B, whatever the batch).
    pub warmup_cooldown_s: f64,
    /// Idle time from unequal stages: the critical rank waiting on a slower one, every
    /// microbatch (grows with the batch; an uneven split helps, more microbatches do not).
    pub imbalance_s: f64,
    /// Idle time from pipeline send/receive latency and transfer on the critical path.
    pub pp_wait_s: f64,
    /// The slowest pipeline stage and what makes it slow (absent without pipelining).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imbalance: Option<StageImbalance>,
    /// Data-parallel gradient reduction and parameter gather left after the last backward.
    pub dp_tail_s: f64,
    pub optimizer_s: f64,
}

/// The slowest pipeline rank against the mean, with what it holds that the others do not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StageImbalance {
    /// Pipeline rank (0-based) of the slowest stage.
    pub stage: u32,
    /// Its busy time per microbatch (all its chunks: forward, backward, exposed communication).
    pub stage_s: f64,
    /// The mean over pipeline ranks of the same.
    pub mean_stage_s: f64,
    /// stage_s / mean_stage_s - 1.
    pub excess_fraction: f64,
    /// Decoder layers (dense + MoE + MTP) on the slowest rank, and the mean per rank.
    pub layers: u32,
    pub mean_layers: f64,
    pub holds_embedding: bool,
    /// The output layer and the loss.
    pub holds_output: bool,
}

impl StageImbalance {
    /// Why the stage is slow, in words ("holds the output layer and loss", ...).
    pub fn reason(&self) -> String {
        let mut why = Vec::new();
        if self.holds_output {
            why.push("it also holds the output layer and the loss".to_string());
        }
        if self.holds_embedding {
            why.push("it also holds the input embedding".to_string());
        }
        if self.layers as f64 > self.mean_layers + 1e-9 {
            why.push(format!(
                "it holds {} layers against {:.1} on average",
                self.layers, self.mean_layers
            ));
        }
        if why.is_empty() {
            "its layers' exposed communication differs".into()
        } else {
            why.join(", ")
        }
    }
}

/// How many of a configuration's ops the profile's measured tables time ([`RateTables`]),
/// and per op class how many fell outside them (timed by the analytic model instead), over
/// the ops of the ledger's distinct blocks and their collectives. Absent from an estimate
/// whose profile has no tables.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TableCoverage {
    pub covered_ops: u64,
    pub outside_ops: u64,
    /// Op class ("gemm", "attention", "memory", "collective") -> ops outside its table.
    pub outside_by_class: BTreeMap<String, u64>,
}

impl TableCoverage {
    /// Counts `blocks`' ops and collectives.
    pub fn of<'b>(
        blocks: impl IntoIterator<Item = &'b Block>,
        rates: &Rates,
        network: &Network,
    ) -> TableCoverage {
        let mut c = TableCoverage::default();
        let mut count = |class: &str, covered: bool| {
            if covered {
                c.covered_ops += 1;
            } else {
                c.outside_ops += 1;
                // Counted in place once the class has an entry: no key allocated per op.
                match c.outside_by_class.get_mut(class) {
                    Some(n) => *n += 1,
                    None => {
                        c.outside_by_class.insert(class.to_string(), 1);
                    }
                }
            }
        };
        for b in blocks {
            for op in &b.ops {
                if let Some((class, covered)) = rates.table_covers(op) {
                    count(class, covered);
                }
                for cm in &op.comms {
                    if cm.group_size > 1 && cm.payload_bytes > 0 {
                        let covered = network
                            .table_collective_s(cm.group, cm.kind, cm.payload_bytes, cm.group_size)
                            .is_some();
                        count("collective", covered);
                    }
                }
            }
        }
        c
    }

    /// The coverage of `tables`' profile, `None` when it has no tables.
    pub fn when_tables<'b>(
        tables: &RateTables,
        blocks: impl IntoIterator<Item = &'b Block>,
        rates: &Rates,
        network: &Network,
    ) -> Option<TableCoverage> {
        (!tables.is_empty()).then(|| Self::of(blocks, rates, network))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GpuProfile;
    use crate::model::CommKind;

    fn rates(gpu: &GpuProfile) -> Rates<'_> {
        Rates {
            gpu,
            peak_flops: gpu.peak_flops.bf16,
            element_bytes: 2,
            matmul_efficiency: gpu.efficiency.matmul,
        }
    }

    /// Every overlap switch off.
    const NO_OVERLAPS: Overlaps = Overlaps {
        tp_comm: false,
        cp_ring: false,
        ep: false,
        ep_1f1b: false,
    };

    /// A dense layer of `ops`.
    fn dense_block(ops: Vec<Op>) -> Block {
        Block {
            kind: crate::model::BlockKind::DenseLayer,
            ops,
            input_bytes: 0,
            unit_starts: Vec::new(),
            high_precision: false,
        }
    }

    /// `efficiency.sync_skew` charges its share of each pass's compute, by hand: at the pass's
    /// first synchronising collective (TP forward, CP backward here), else at the step's sync
    /// group, and nothing on one rank or at a skew of 0.
    #[test]
    fn sync_skew_charges_its_share_of_each_pass_at_the_first_synchronising_group() {
        use crate::layout::Layout;
        use crate::model::{Collective, CollectiveKind};
        let mut gpu = GpuProfile::load("h100-sxm").unwrap();
        let layout = Layout::new("tp-cp-ep-dp-pp", 2, 2, 1, 2, 1, 8).unwrap();
        let network = Network::new(&layout, &gpu);
        let coll = |group, phase| Collective {
            kind: CollectiveKind::AllGather,
            group,
            group_size: 2,
            phase,
            payload_bytes: 1 << 20,
            count: 1,
        };
        let op = |comms: Vec<Collective>| {
            let mut o = Op::new("x", OpKind::MemoryBound { bytes: 1 << 30 });
            for c in comms {
                o = o.comm(c);
            }
            o
        };
        let block = dense_block;
        let overlaps = NO_OVERLAPS;
        let times = |gpu: &GpuProfile, b: &Block, step_sync| {
            block_times(
                b,
                &rates(gpu),
                &network,
                overlaps,
                Recompute::None,
                CpComm::P2p,
                step_sync,
            )
        };
        let synced = block(vec![
            op(vec![coll(GroupKind::Tp, Phase::Forward)]),
            op(vec![coll(GroupKind::Cp, Phase::Backward)]),
        ]);
        let plain = block(vec![op(Vec::new())]);
        let base = times(&gpu, &synced, Some(GroupKind::Dp));
        let base_plain = times(&gpu, &plain, Some(GroupKind::Dp));
        assert_eq!(base_plain.exposed_fwd.total(), 0.0);
        gpu.efficiency.sync_skew = 0.1;
        let t = times(&gpu, &synced, Some(GroupKind::Dp));
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1e-30);
        assert!(close(
            t.exposed_fwd[CommKind::Tp] - base.exposed_fwd[CommKind::Tp],
            0.1 * t.fwd_s
        ));
        assert!(close(
            t.exposed_bwd[CommKind::Cp] - base.exposed_bwd[CommKind::Cp],
            0.1 * (t.dgrad_s + t.wgrad_s)
        ));
        assert_eq!(
            (t.exposed_fwd[CommKind::Dp], t.exposed_bwd[CommKind::Dp]),
            (0.0, 0.0)
        );
        // No synchronising collective: the step's group takes it; on one rank nothing does.
        let p = times(&gpu, &plain, Some(GroupKind::Dp));
        assert!(close(p.exposed_fwd[CommKind::Dp], 0.1 * p.fwd_s) && p.fwd_s > 0.0);
        assert!(close(
            p.exposed_bwd[CommKind::Dp],
            0.1 * (p.dgrad_s + p.wgrad_s)
        ));
        let alone = times(&gpu, &plain, None);
        assert_eq!(alone.exposed_fwd.total() + alone.exposed_bwd.total(), 0.0);
    }

    /// The EP overlap (DualPipe's) hides the all-to-all behind the op's compute but never the
    /// expert-TP all-gather beside it, which stays whole on the critical path.
    #[test]
    fn the_ep_overlap_hides_the_all_to_all_but_not_the_expert_tp_gather() {
        use crate::layout::Layout;
        use crate::model::{BlockKind, Collective, CollectiveKind};
        let gpu = GpuProfile::load("h100-sxm").unwrap();
        let layout = Layout::new("tp-cp-ep-dp-pp", 2, 1, 2, 2, 1, 8)
            .and_then(|l| l.with_expert_tp(2))
            .unwrap();
        let network = Network::new(&layout, &gpu);
        let coll = |kind, group| Collective {
            kind,
            group,
            group_size: 2,
            phase: Phase::Forward,
            payload_bytes: 1 << 20,
            count: 1,
        };
        // 64 GiB of memory-bound work: tens of milliseconds, against microseconds of transfer.
        let op = Op::new("x", OpKind::MemoryBound { bytes: 1 << 36 })
            .comm(coll(CollectiveKind::AllToAll, GroupKind::Ep))
            .comm(coll(CollectiveKind::AllGather, GroupKind::ExpertTp));
        let block = Block {
            kind: BlockKind::MoeLayer,
            ops: vec![op],
            input_bytes: 0,
            unit_starts: Vec::new(),
            high_precision: false,
        };
        let times = |ep| {
            let overlaps = Overlaps {
                tp_comm: false,
                cp_ring: false,
                ep,
                ep_1f1b: false,
            };
            let r = rates(&gpu);
            block_times(
                &block,
                &r,
                &network,
                overlaps,
                Recompute::None,
                CpComm::P2p,
                None,
            )
            .exposed_fwd
        };
        let (open, hidden) = (times(false), times(true));
        assert!(
            open[CommKind::Ep] > 0.0 && hidden[CommKind::Ep] < open[CommKind::Ep],
            "{open:?} {hidden:?}"
        );
        assert!(open[CommKind::ExpertTp] > 0.0);
        assert_eq!(hidden[CommKind::ExpertTp], open[CommKind::ExpertTp]);
    }

    /// A ring core is one kernel call per KV block (Transformer Engine's context parallelism):
    /// by hand at cp 4, s/cp = 8192 on H100's FlashAttention-3 rates, the contiguous ring's
    /// busiest rank runs the causal diagonal (0.5 / 3.5 of its FLOPs) and three full blocks
    /// (1 / 3.5 each) at the 8192-long rates; the zigzag ring the diagonal and three half
    /// blocks (1/4 each), the half blocks at the 4096-long unmasked rate; every call pays its
    /// launch. The exchange then hides behind each call as far as it lasts.
    #[test]
    fn ring_attention_is_one_call_per_block() {
        let gpu = GpuProfile::load("h100-sxm").unwrap();
        let k = crate::attention_rates::attention_kernel(gpu.attention_kernel.as_deref().unwrap())
            .unwrap();
        let overhead = gpu.efficiency.kernel_overhead_s;
        let (fwd, len) = (3.0e12, 8192u64);
        for zigzag in [false, true] {
            let mut core = Op::new(
                "attn.core",
                OpKind::Attention {
                    seq_len: len,
                    causal: false,
                    fused: true,
                    head_dim: 128,
                    ring: Some(crate::model::RingCalls { blocks: 4, zigzag }),
                    window: None,
                },
            );
            core.rank_flops.fwd = fwd;
            core.rank_flops.dgrad = 2.0 * fwd;
            let (d, o, other_len) = if zigzag {
                (0.25, 0.25, len / 2)
            } else {
                (0.5 / 3.5, 1.0 / 3.5, len)
            };
            let diag_s = d * fwd / k.forward_flops_per_s(len, true, 128) + overhead;
            let other_s = o * fwd / k.forward_flops_per_s(other_len, false, 128) + overhead;
            let r = rates(&gpu);
            let (t_fwd, _, _) = r.op_s(&core);
            assert!((t_fwd - diag_s - 3.0 * other_s).abs() < 1e-12, "{zigzag}");
            let (bd, bo) = r.ring_block_s(&core, Phase::Forward).unwrap();
            assert!((bd - diag_s).abs() < 1e-15 && (bo - other_s).abs() < 1e-15);
        }
    }

    /// An unfused core pays for streaming its s x s tensors; a fused one does not.
    #[test]
    fn unfused_attention_streams_its_scores() {
        let gpu = GpuProfile::load("a100-80g").unwrap();
        let r = rates(&gpu);
        let mut core = Op::new(
            "attn.core",
            OpKind::Attention {
                seq_len: 4096,
                causal: true,
                fused: false,
                head_dim: 128,
                ring: None,
                window: None,
            },
        );
        core.rank_flops.fwd = 1e12;
        core.rank_flops.dgrad = 2e12;
        let fused = r.op_s(&core);
        let s = 1u64 << 30;
        let unfused = core
            .clone()
            .save_selective(TensorRole::Softmax, s)
            .save_selective(TensorRole::DropoutMask, s / 2)
            .save_selective(TensorRole::DropoutOut, s);
        assert_eq!(
            Rates::unfused_attention_bytes(&unfused),
            4 * s + s / 2 + 2 * s
        );
        let t = r.op_s(&unfused);
        let bw = gpu.hbm_bytes_per_s * gpu.efficiency.memory_bound;
        let fwd_extra = (4 * s + s / 2 + 2 * s) as f64 / bw;
        assert!((t.0 - fused.0 - fwd_extra - gpu.efficiency.kernel_overhead_s).abs() < 1e-9);
        assert!(t.1 > fused.1 + 1.4 * fwd_extra);
    }

    /// An unfused core runs as batched GEMMs at `efficiency.matmul`, not at the attention
    /// efficiency: with 27 heads of 128 over s = 4096 on an A100 (108 SMs, 128 x 256 tiles)
    /// both QK^T (512 tiles per head) and PV (32 per head) fill whole waves, so the forward
    /// is its 4 s^2 d FLOPs per head over peak x matmul, plus two launches, and the backward
    /// (four GEMMs, four launches) exactly twice the forward's compute.
    #[test]
    fn unfused_core_runs_as_gemms_at_the_matmul_efficiency() {
        let mut gpu = GpuProfile::load("a100-80g").unwrap();
        let (s, d, heads) = (4096u64, 128u64, 27.0);
        let mut core = Op::new(
            "attn.core",
            OpKind::Attention {
                seq_len: s,
                causal: true,
                fused: false,
                head_dim: d,
                ring: None,
                window: None,
            },
        );
        let fwd_flops = 4.0 * heads * (s * s * d) as f64;
        core.rank_flops.fwd = fwd_flops;
        core.rank_flops.dgrad = 2.0 * fwd_flops;
        let overhead = gpu.efficiency.kernel_overhead_s;
        let t = rates(&gpu).op_s(&core);
        let rate = gpu.peak_flops.bf16 * gpu.efficiency.matmul;
        assert!((t.0 - fwd_flops / rate - 2.0 * overhead).abs() < 1e-12 * t.0.max(1.0));
        assert!((t.1 - 2.0 * fwd_flops / rate - 4.0 * overhead).abs() < 1e-12 * t.1.max(1.0));
        gpu.efficiency.attention *= 0.5;
        assert_eq!(
            rates(&gpu).op_s(&core),
            t,
            "no longer depends on efficiency.attention"
        );
        gpu.efficiency.matmul *= 0.5;
        let slower = rates(&gpu).op_s(&core);
        assert!((slower.0 - 2.0 * overhead) / (t.0 - 2.0 * overhead) > 1.99);
    }

    /// FP8 training runs the attention kernel at the bf16 rate.
    #[test]
    fn attention_runs_at_most_at_the_bf16_rate() {
        let gpu = GpuProfile::load("h100-sxm").unwrap();
        let bf16 = rates(&gpu);
        let fp8 = Rates {
            peak_flops: gpu.peak_flops.fp8.unwrap(),
            matmul_efficiency: gpu.matmul_efficiency_for(crate::config::Precision::Fp8),
            ..bf16
        };
        assert_eq!(bf16.attention_s(1e12), fp8.attention_s(1e12));
        assert!(fp8.gemm_s(8192, 8192, 8192) < bf16.gemm_s(8192, 8192, 8192));
    }

    /// An FP8 GEMM runs at the FP8 peak times the bf16 efficiency scaled by the measured
    /// FP8 / bf16 achievable ratio: on H100 1978.9 TF x matmul x 0.709 / 0.803 (Bekman's MAMF
    /// table), so a large compute-bound GEMM takes bf16's time x 989.4 / 1978.9 x 0.803 / 0.709.
    #[test]
    fn fp8_gemms_run_at_the_measured_fp8_share_of_their_peak() {
        let gpu = GpuProfile::load("h100-sxm").unwrap();
        assert_eq!(gpu.gemm.achievable_bf16_fraction, Some(0.803));
        assert_eq!(gpu.gemm.achievable_fp8_fraction, Some(0.709));
        let bf16 = rates(&gpu);
        let fp8 = Rates {
            peak_flops: gpu.peak_flops.fp8.unwrap(),
            matmul_efficiency: gpu.matmul_efficiency_for(crate::config::Precision::Fp8),
            ..bf16
        };
        let overhead = gpu.efficiency.kernel_overhead_s;
        let (m, n, k) = (16384, 16384, 16384);
        let ratio = (fp8.gemm_s(m, n, k) - overhead) / (bf16.gemm_s(m, n, k) - overhead);
        let by_hand = 989.4 / 1978.9 * 0.803 / 0.709;
        assert!((ratio / by_hand - 1.0).abs() < 1e-9, "{ratio} vs {by_hand}");
        // Without the two measurements FP8 keeps the bf16 efficiency.
        let mut bare = gpu.clone();
        bare.gemm.achievable_fp8_fraction = None;
        assert_eq!(
            bare.matmul_efficiency_for(crate::config::Precision::Fp8),
            gpu.efficiency.matmul
        );
    }

    /// The host's issue adds nothing where the device is the slower (kernels of
    /// milliseconds: the device-only times, exactly), and makes a pass of short kernels the
    /// host's: by hand, one 1 KiB memory-bound op under Megatron-DeepSpeed is the layer's own
    /// 10 calls and the op's 2 forward (12 x the per-call cost), 16 and 2 backward (18 x).
    #[test]
    fn host_issue_binds_only_short_kernels() {
        use crate::config::Framework;
        use crate::layout::Layout;
        use crate::op_cost::host_issue::HostIssue;
        let gpu = GpuProfile::load("a100-80g").unwrap();
        let layout = Layout::new("tp-cp-ep-dp-pp", 1, 1, 1, 1, 1, 8).unwrap();
        let network = Network::new(&layout, &gpu);
        let block =
            |bytes| dense_block(vec![Op::new("mlp.dropout", OpKind::MemoryBound { bytes })]);
        let overlaps = NO_OVERLAPS;
        let host = HostIssue::of(Framework::Deepspeed, false);
        let ctx = TimingContext {
            rates: rates(&gpu),
            network: &network,
            overlaps,
            cp_comm: CpComm::P2p,
            step_sync: None,
            host,
        };
        let device_only = |b: &Block| {
            block_times(
                b,
                &rates(&gpu),
                &network,
                overlaps,
                Recompute::None,
                CpComm::P2p,
                None,
            )
        };
        let long = block(1 << 34);
        let (with, without) = (ctx.block_times(&long, Recompute::None), device_only(&long));
        assert!(without.fwd_s > 1e-3, "{without:?}");
        assert_eq!(
            (with.fwd_s, with.dgrad_s, with.wgrad_s),
            (without.fwd_s, without.dgrad_s, without.wgrad_s)
        );
        let short = block(1 << 10);
        let t = ctx.block_times(&short, Recompute::None);
        let c = host.per_call_s;
        assert!(
            device_only(&short).fwd_s < c,
            "the kernel is shorter than one call"
        );
        assert!((t.fwd_s - 12.0 * c).abs() < 1e-12, "{t:?}");
        assert!((t.dgrad_s - 18.0 * c).abs() < 1e-12, "{t:?}");
    }
}
