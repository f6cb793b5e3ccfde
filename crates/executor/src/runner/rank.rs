//! One rank's step loop: its action list played for a number of steps, with gradient
//! accumulation over microbatches, activation recomputation, split backward (I then W), the
//! pipeline mailbox (chunk outputs and input gradients waiting to be sent or consumed), and
//! the rank's measurements.

use super::export::Element;
use super::grad_buckets::GradBuckets;
use super::zero::params_of;
use super::{zero, RunOptions};
use crate::backend::{Backend, Device, DeviceCollectives, DeviceTensor, TensorOps, View, ViewMut};
use crate::error::{ExecError, StateError};
use crate::layers::blocks::{
    is_frozen_space, BlockKind, BlockLayout, DENSE_SPACE, EXPERT_SPACE, FROZEN_EXPERT_SPACE,
    FROZEN_SPACE, SPACES,
};
use crate::layers::embedding_group::{self, SharedWeight};
use crate::layers::ends::{
    embedding_bwd, embedding_fwd, head_bwd, head_fwd, output_bwd, output_fwd, OutputSaved,
};
use crate::layers::layer::Experts;
use crate::layers::layer::{layer_bwd, layer_fwd, LayerSaved};
use crate::layers::lora::Adapters;
use crate::layers::mtp::{mtp_in_bwd, mtp_in_fwd, MtpInSaved};
use crate::layers::params::rank_layout;
use crate::layers::{data, Ctx, WTask};
use crate::plan::{Action, Plan, RankPlan, Recompute};
use crate::run_report::{PhaseTimes, RankReport};
use crate::trace::{stream_of, Clock, EventKind, RankTrace, Stream, TraceEvent};
use crate::traced_comm::TracedComm;
use crate::tracker::Category;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::rc::Rc;

/// What a rank hands back to the orchestration.
pub(super) struct RankOutput {
    pub(super) report: RankReport,
    pub(super) loss_sums: Vec<f64>,
    pub(super) aux_sums: Vec<f64>,
    pub(super) params: Vec<Element>,
    pub(super) grads: Vec<Element>,
    pub(super) trace: Option<RankTrace>,
}

enum BlockSaved<B: Backend> {
    /// The tokens and the embedding dropout's saved mask.
    Embedding(Vec<u32>, Option<B::Tensor>),
    Layer(Box<LayerSaved<B>>),
    LayerInput(B::Tensor),
    Output(OutputSaved<B>),
    /// A block run with another (an MoE layer's experts, a LoRA layer's adapters, the MTP
    /// modules' embedding copy): its state is saved with that block.
    Experts,
    /// A multi-token-prediction module's input block and its final norm with the shared head.
    MtpIn(Box<MtpInSaved<B>>),
    MtpOut(OutputSaved<B>),
}

type BlockTasks<B> = Vec<(usize, Vec<WTask<B>>)>;

/// A LoRA layer's adapters block (index, parameters).
type AdapterHandle<T> = Option<(usize, zero::Handle<T>)>;

/// One rank's state across steps.
pub(super) struct Rank<'a, B: Backend> {
    pub(super) plan: &'a Plan,
    pub(super) rp: &'a RankPlan,
    pub(super) ctx: Ctx<'a, B>,
    /// Per space (dense, experts, LoRA's frozen weights): the group over which gradients
    /// reduce and ZeRO shards (DP, expert DP, DP), this rank's shard, parameters, gradients
    /// and Adam moments (none for the frozen space).
    pub(super) groups: [B::Group; SPACES],
    pub(super) blocks: Vec<BlockLayout>,
    pub(super) stage_blocks: HashMap<u32, Range<usize>>,
    pub(super) zero: u8,
    pub(super) shards: [Range<usize>; SPACES],
    /// The embedding group's shared tensors held here (the tied word embedding; with multi-token
    /// prediction the word and position tables): their copies and the group.
    pub(super) tied: Vec<SharedWeight<B>>,
    pub(super) params: [B::Tensor; SPACES],
    /// Mixed precision: the fp32 master weights per space.
    pub(super) master: [Option<B::Tensor>; SPACES],
    pub(super) grads: [B::Tensor; SPACES],
    pub(super) m: [B::Tensor; SPACES],
    pub(super) v: [B::Tensor; SPACES],
    pub(super) step: u32,
    pub(super) cache: VecDeque<(usize, Rc<B::Tensor>)>,
    saved: HashMap<(u32, u32), Vec<BlockSaved<B>>>,
    wtasks: HashMap<(u32, u32), BlockTasks<B>>,
    mailbox: HashMap<(u32, u32, bool), B::Tensor>,
    recv_buf: Option<B::Tensor>,
    pub(super) loss_sum: f64,
    pub(super) grad_scale: f32,
    /// Tracing: the run's clock and when the last receive's message arrived.
    clock: Option<Clock>,
    recv_arrived_s: Option<f64>,
    /// ZeRO 0/1 gradient buckets reduced during the last backward (`None`: at the step).
    pub(super) buckets: Option<GradBuckets>,
    /// The index of the action being played in the rank's list.
    pub(super) action_index: usize,
}

fn tag(stage: u32, mb: u32, grad: bool) -> u64 {
    ((stage as u64) << 33) | ((mb as u64) << 1) | grad as u64
}

pub(super) fn run_rank<B: Backend>(
    plan: &Plan,
    rp: &RankPlan,
    ops: B::Device,
    comm: &B::Comm,
    opts: &RunOptions,
) -> Result<RankOutput, ExecError> {
    let tp = comm.group(&rp.tp_group)?;
    let dp = comm.group(&rp.dp_group)?;
    let cp = comm.group(&rp.cp_group)?;
    let act_dtype = opts.precision.compute_dtype();
    let comm = &TracedComm::<B>::new(comm, rp.rank, opts.trace);
    let mut ctx = Ctx::<B>::new(plan, ops, comm, tp, rp, cp, act_dtype)?;
    let ep = comm.group(&rp.ep_group)?;
    let ep_rank = crate::backend::ProcessGroup::index(&ep) as u32;
    if plan.model.moe.is_some() {
        ctx.ep = Some(ep);
        ctx.etp = comm.group(&rp.expert_tp_group)?;
    }
    let blocks = rank_layout(plan, rp, ep_rank);
    let mut stage_blocks = HashMap::new();
    for &s in &rp.stages {
        let idx: Vec<usize> = (0..blocks.len())
            .filter(|&i| blocks[i].stage == s)
            .collect();
        let r = match (idx.first(), idx.last()) {
            (Some(&a), Some(&b)) => a..b + 1,
            _ => 0..0,
        };
        stage_blocks.insert(s, r);
    }
    let zero = plan.parallel.zero;
    let edp = comm.group(&rp.expert_dp_group)?;
    let groups = [dp.clone(), edp.clone(), dp, edp];
    let space = |sp: usize| {
        let g = &groups[sp];
        zero::init_space::<B>(
            &ctx.ops,
            plan,
            &blocks,
            g,
            sp,
            &opts.perturb,
            opts.precision,
        )
    };
    let (d, e, f, fe) = (
        space(DENSE_SPACE)?,
        space(EXPERT_SPACE)?,
        space(FROZEN_SPACE)?,
        space(FROZEN_EXPERT_SPACE)?,
    );
    let n_sp = ctx.n_sp;
    let h = plan.model.hidden;
    let pp = plan.parallel.pp > 1;
    let recv_buf = if pp {
        Some(ctx.zeros(Category::Buffers, &[n_sp, h])?)
    } else {
        None
    };
    let mut tied = Vec::new();
    let mtp = plan.model.mtp_layers > 0;
    if plan.model.tied_embeddings || mtp {
        let members = embedding_group::members(plan, rp);
        for copies in embedding_group::shared_embedding_copies(&blocks, mtp) {
            tied.extend(SharedWeight::new(comm, &members, copies)?);
        }
    }
    let mut rank = Rank {
        plan,
        rp,
        groups,
        blocks,
        stage_blocks,
        zero,
        shards: [d.shard, e.shard, f.shard, fe.shard],
        tied,
        params: [d.params, e.params, f.params, fe.params],
        master: [d.master, e.master, f.master, fe.master],
        grads: [d.grads, e.grads, f.grads, fe.grads],
        m: [d.m, e.m, f.m, fe.m],
        v: [d.v, e.v, f.v, fe.v],
        step: 0,
        cache: VecDeque::new(),
        saved: HashMap::new(),
        wtasks: HashMap::new(),
        mailbox: HashMap::new(),
        recv_buf,
        loss_sum: 0.0,
        grad_scale: 1.0 / (plan.global_batch() * plan.model.seq) as f32,
        ctx,
        clock: opts.trace,
        recv_arrived_s: None,
        buckets: None,
        action_index: 0,
    };
    rank.buckets = rank.plan_buckets(opts.export_grads);
    let mut trace = opts.trace.map(|_| RankTrace::default());
    let mut step_s = Vec::new();
    let mut loss_sums = Vec::new();
    let mut aux_sums = Vec::new();
    let mut phases = PhaseTimes::default();
    for step in 0..opts.steps {
        if let Some(cp) = rank.ctx.cp.as_mut() {
            cp.timing = step >= opts.warmup;
        }
        // Events around the step and each action, read after the step (one wait per step).
        // The trace's clock is read before the step's first event: events placed from `t0` then
        // land no later than the host readings of the same moments, so an action's retimed
        // start never passes the host-timed collectives it calls first (the other order made
        // the span start after them whenever the two readings were far enough apart).
        let step_start_s = opts.trace.map(|c| c.now_s());
        let t0 = rank.ctx.ops.record()?;
        rank.loss_sum = 0.0;
        rank.ctx.moe_aux_loss = 0.0;
        let mut marks = Vec::with_capacity(rp.actions.len());
        for (index, a) in rp.actions.iter().enumerate() {
            let ta = rank.ctx.ops.record()?;
            let start_s = opts.trace.map(|c| c.now_s());
            rank.recv_arrived_s = None;
            rank.action_index = index;
            rank.ctx.comm.take();
            if opts.export_grads && *a == Action::OptimizerStep {
                rank.reduce_for_export()?;
                continue;
            }
            rank.act(*a)?;
            let mut traced_at = None;
            if let (Some(t), Some(c), Some(start_s)) = (trace.as_mut(), opts.trace, start_s) {
                if step >= opts.warmup {
                    traced_at =
                        Some(rank.record(t, step - opts.warmup, index, a, start_s, c.now_s()));
                }
            }
            if step >= opts.warmup {
                marks.push((*a, ta, rank.ctx.ops.record()?, traced_at));
            }
        }
        let t1 = rank.ctx.ops.record()?;
        if step >= opts.warmup {
            for (a, ta, tb, _) in &marks {
                let slot = match a {
                    Action::Forward { .. } => &mut phases.forward_s,
                    Action::Backward { .. } | Action::BackwardInput { .. } => {
                        &mut phases.backward_s
                    }
                    Action::BackwardWeight { .. } => &mut phases.backward_weight_s,
                    Action::OptimizerStep => &mut phases.optimizer_s,
                    _ => &mut phases.p2p_s,
                };
                *slot += rank.ctx.ops.elapsed_s(ta, tb)?;
            }
            step_s.push(rank.ctx.ops.elapsed_s(&t0, &t1)?);
            if let (Some(t), Some(s0)) = (trace.as_mut(), step_start_s) {
                retime_on_events::<B>(&rank.ctx.ops, t, &t0, &t1, s0, &marks)?;
            }
        }
        // The load-balancing loss of each microbatch, weighted by its tokens so that the
        // division by the step's tokens averages it over the microbatches.
        let aux = rank.ctx.moe_aux_loss * rank.ctx.n as f64;
        let aux = if rp.coords.tp == 0 { aux } else { 0.0 };
        loss_sums.push(rank.loss_sum + aux);
        aux_sums.push(aux);
    }
    let timed = (opts.steps - opts.warmup) as f64;
    for x in [
        &mut phases.forward_s,
        &mut phases.backward_s,
        &mut phases.backward_weight_s,
        &mut phases.p2p_s,
        &mut phases.optimizer_s,
    ] {
        *x /= timed;
    }
    let tracker = rank.ctx.ops.memory();
    let (peak, category_max, peak_site) =
        (tracker.peak(), tracker.category_max(), tracker.peak_site());
    let reserved_peak = tracker.reserved_peak();
    let (gemm_flops, gemm_seconds) = rank.ctx.ops.gemm_stats();
    let params = if opts.export_params {
        rank.export()?
    } else {
        Vec::new()
    };
    let grads = if opts.export_grads {
        rank.export_grads()?
    } else {
        Vec::new()
    };
    Ok(RankOutput {
        report: RankReport {
            rank: rp.rank,
            coords: rp.coords,
            step_s,
            phases,
            peak,
            category_max,
            reserved_peak,
            peak_site,
            gemm_flops,
            gemm_seconds,
            cp: rank.ctx.cp.as_ref().map(|c| c.stats.clone()),
            moe_dropped: rank.ctx.moe_dropped,
            moe_load: rank.ctx.moe_load.clone(),
            device: None,
        },
        loss_sums,
        aux_sums,
        params,
        grads,
        trace,
    })
}

impl<'a, B: Backend> Rank<'a, B> {
    /// Adds action `index` (`a`, played from `start_s` to `end_s` in timed step `step`) to
    /// the trace: a receive as its wait then its copy, with the collectives it called.
    fn record(
        &mut self,
        t: &mut RankTrace,
        step: u32,
        index: usize,
        a: &Action,
        start_s: f64,
        end_s: f64,
    ) -> usize {
        let begin_s = match self.recv_arrived_s.take() {
            Some(arrived_s) => {
                t.events.push(TraceEvent {
                    step,
                    stream: Stream::Pipeline,
                    kind: EventKind::Wait { index },
                    start_s,
                    end_s: arrived_s,
                });
                arrived_s
            }
            None => start_s,
        };
        let at = t.events.len();
        t.events.push(TraceEvent {
            step,
            stream: stream_of(a),
            kind: EventKind::Action { action: *a, index },
            start_s: begin_s,
            end_s,
        });
        for c in self.ctx.comm.take() {
            let kind = match c.stream {
                Stream::Kernels => EventKind::Kernel { name: c.op.into() },
                _ => EventKind::Collective {
                    op: c.op.into(),
                    group: c.group,
                    bytes: c.bytes,
                },
            };
            t.events.push(TraceEvent {
                step,
                stream: c.stream,
                kind,
                start_s: c.start_s,
                end_s: c.end_s,
            });
        }
        at
    }

    fn act(&mut self, a: Action) -> Result<(), ExecError> {
        match a {
            Action::Forward { stage, mb } => self.forward(stage, mb),
            Action::Backward { stage, mb } => {
                self.backward_input(stage, mb, true)?;
                self.stage_final(stage)
            }
            Action::BackwardInput { stage, mb } => self.backward_input(stage, mb, false),
            Action::BackwardWeight { stage, mb } => {
                let tasks =
                    self.wtasks
                        .remove(&(stage, mb))
                        .ok_or(ExecError::WeightBeforeInput {
                            rank: self.rp.rank,
                            stage,
                            mb,
                        })?;
                // A block's gradients are complete after its last task list (an MTP module
                // routes some to the output layer's block ahead of the block's own).
                let blocks: Vec<usize> = tasks.iter().map(|t| t.0).collect();
                for (k, (bi, ts)) in tasks.into_iter().enumerate() {
                    self.run_tasks(bi, ts)?;
                    if !blocks[k + 1..].contains(&bi) {
                        self.block_final(stage, bi)?;
                    }
                }
                self.stage_final(stage)
            }
            Action::SendActivation { to, stage, mb } => self.send(to, stage, mb, false),
            Action::SendGrad { to, stage, mb } => self.send(to, stage, mb, true),
            Action::RecvActivation { from, stage, mb } => self.recv(from, stage, mb, false),
            Action::RecvGrad { from, stage, mb } => self.recv(from, stage, mb, true),
            Action::OptimizerStep => self.optimizer_step(),
        }
    }

    fn missing(&self, what: &'static str, stage: u32, mb: u32) -> ExecError {
        ExecError::OutOfOrder {
            rank: self.rp.rank,
            what,
            stage,
            mb,
        }
    }

    /// Sends a chunk's output (or input gradient) straight from its tensor, which is the
    /// pipeline send buffer until then, and frees it.
    fn send(&mut self, to: u32, stage: u32, mb: u32, grad: bool) -> Result<(), ExecError> {
        let t = self
            .mailbox
            .remove(&(stage, mb, grad))
            .ok_or_else(|| self.missing("tensor to send", stage, mb))?;
        // Pipeline messages are actions of the trace, not collectives.
        self.ctx
            .comm
            .inner()
            .send(to, tag(stage, mb, grad), View::all(&t))
    }

    fn recv(&mut self, from: u32, stage: u32, mb: u32, grad: bool) -> Result<(), ExecError> {
        let buf = self.recv_buf.as_mut().expect("pp buffers");
        self.ctx
            .comm
            .inner()
            .recv(from, tag(stage, mb, grad), ViewMut::all(buf))?;
        self.recv_arrived_s = self.clock.map(|c| c.now_s());
        let cat = if grad {
            Category::Buffers
        } else {
            Category::Activations
        };
        let mut t = self.ctx.zeros(cat, buf.shape())?;
        self.ctx.ops.copy(View::all(buf), ViewMut::all(&mut t))?;
        self.mailbox.insert((stage, mb, grad), t);
        Ok(())
    }

    /// The index of this rank's block of kind `kind`.
    fn block_of(&self, kind: BlockKind) -> Result<usize, ExecError> {
        self.blocks
            .iter()
            .position(|b| b.kind == kind)
            .ok_or_else(|| ExecError::from(StateError::MtpWithoutBlock(format!("{kind:?}"))))
    }

    /// The block whose weights MTP block `bi` shares: the embedding (or the last stage's copy
    /// of it) for an input block, the output layer for a final norm (none for other blocks).
    fn mtp_shared_block(&self, bi: usize) -> Result<Option<usize>, ExecError> {
        match self.blocks[bi].kind {
            BlockKind::MtpIn(_) => self
                .block_of(BlockKind::Embedding)
                .or_else(|_| self.block_of(BlockKind::MtpEmbedding))
                .map(Some),
            BlockKind::MtpOut(_) => self.block_of(BlockKind::Output).map(Some),
            _ => Ok(None),
        }
    }

    /// A copy of `x` as a saved activation.
    fn copy_activation(&self, x: &B::Tensor) -> Result<B::Tensor, ExecError> {
        let mut t = self.ctx.zeros(Category::Activations, x.shape())?;
        self.ctx.ops.copy(View::all(x), ViewMut::all(&mut t))?;
        Ok(t)
    }

    /// Multi-token prediction's (inputs, targets) `shift` tokens ahead for microbatch `mb`,
    /// this rank's context-parallel positions only.
    fn mtp_data(&self, mb: u32, shift: usize) -> (Vec<u32>, Vec<u32>) {
        let (seq, pos) = (self.plan.model.seq, &self.ctx.positions);
        let (x, y) = data::shifted(
            &self.plan.model,
            self.plan.seed,
            self.plan.microbatches,
            self.rp.coords.dp,
            mb,
            shift,
        );
        if self.ctx.cp.is_some() {
            (
                data::at_positions(&x, seq, pos),
                data::at_positions(&y, seq, pos),
            )
        } else {
            (x, y)
        }
    }

    pub(super) fn experts_of(&self, bi: usize) -> Option<usize> {
        // Under LoRA the layer's adapters block comes between.
        let ei = bi + 1 + usize::from(self.adapters_of(bi).is_some());
        match (self.blocks[bi].kind, self.blocks.get(ei).map(|b| b.kind)) {
            (BlockKind::Layer(l), Some(BlockKind::Experts(e))) if l == e => Some(ei),
            _ => None,
        }
    }

    /// The frozen-experts block of the MoE layer of block `bi` (LoRA with routed-expert
    /// adapters: right after its experts block), when it has one.
    pub(super) fn frozen_experts_of(&self, bi: usize) -> Option<usize> {
        let fi = self.experts_of(bi)? + 1;
        match (self.blocks[bi].kind, self.blocks.get(fi).map(|b| b.kind)) {
            (BlockKind::Layer(l), Some(BlockKind::FrozenExperts(e))) if l == e => Some(fi),
            _ => None,
        }
    }

    /// The frozen-experts block of block `bi` and its parameters (gathered over expert DP
    /// under ZeRO-3), when it has one.
    fn frozen_experts_handle(&mut self, bi: usize) -> Result<AdapterHandle<B::Tensor>, ExecError> {
        match self.frozen_experts_of(bi) {
            Some(fi) => Ok(Some((fi, self.handle(fi)?))),
            None => Ok(None),
        }
    }

    /// The adapters block of LoRA layer block `bi`, when the run has adapters.
    pub(super) fn adapters_of(&self, bi: usize) -> Option<usize> {
        match (
            self.blocks[bi].kind,
            self.blocks.get(bi + 1).map(|b| b.kind),
        ) {
            (BlockKind::Layer(l), Some(BlockKind::Adapters(a))) if l == a => Some(bi + 1),
            _ => None,
        }
    }

    /// The adapters block of LoRA layer block `bi` and its parameters (gathered under
    /// ZeRO-3), when the run has adapters.
    fn adapter_handle(&mut self, bi: usize) -> Result<AdapterHandle<B::Tensor>, ExecError> {
        match self.adapters_of(bi) {
            Some(ai) => Ok(Some((ai, self.handle(ai)?))),
            None => Ok(None),
        }
    }

    fn forward(&mut self, stage: u32, mb: u32) -> Result<(), ExecError> {
        let bidx = self
            .stage_blocks
            .get(&stage)
            .cloned()
            .ok_or_else(|| self.missing("chunk", stage, mb))?;
        self.ctx.mb = mb;
        (self.ctx.step, self.ctx.dp_rank) = (self.step, self.rp.coords.dp);
        let (tokens, targets) = data::microbatch(
            &self.plan.model,
            self.plan.seed,
            self.plan.microbatches,
            self.rp.coords.dp,
            mb,
        );
        let (tokens, targets) = if self.ctx.cp.is_some() {
            let (seq, pos) = (self.plan.model.seq, &self.ctx.positions);
            (
                data::at_positions(&tokens, seq, pos),
                data::at_positions(&targets, seq, pos),
            )
        } else {
            (tokens, targets)
        };
        let mut x = if matches!(self.blocks[bidx.start].kind, BlockKind::Embedding) {
            None
        } else {
            let t = self
                .mailbox
                .remove(&(stage.wrapping_sub(1), mb, false))
                .ok_or_else(|| self.missing("input activation", stage, mb))?;
            Some(self.ctx.ops.recat(t, Category::Activations))
        };
        let mut saved = Vec::with_capacity(bidx.len());
        let mut targets = Some(targets);
        // Multi-token prediction: the hidden states the next depth's module takes.
        let mtp = self.plan.model.mtp_layers;
        let mut mtp_h: Option<B::Tensor> = None;
        for bi in bidx {
            if matches!(
                self.blocks[bi].kind,
                BlockKind::Experts(_)
                    | BlockKind::FrozenExperts(_)
                    | BlockKind::Adapters(_)
                    | BlockKind::MtpEmbedding
            ) {
                // Run with its layer (or with the MTP modules, for the embedding's copy).
                saved.push(BlockSaved::Experts);
                continue;
            }
            // An MTP module's blocks use the embedding's or the output layer's weights too.
            let shared = self.mtp_shared_block(bi)?;
            let sh = match shared {
                Some(o) => Some(self.block_handles(o)?.0),
                None => None,
            };
            let (h, eh) = self.block_handles(bi)?;
            let ah = self.adapter_handle(bi)?;
            let fh = self.frozen_experts_handle(bi)?;
            let p = params_of(&self.params, &h);
            let sp_ = sh.as_ref().map(|h| params_of(&self.params, h));
            let frozen = fh
                .as_ref()
                .map(|(fi, h)| (&self.blocks[*fi], params_of(&self.params, h)));
            let experts: Experts<B> = eh
                .as_ref()
                .map(|(ei, eh)| (&self.blocks[*ei], params_of(&self.params, eh), frozen));
            let ad: Adapters<B> = ah
                .as_ref()
                .map(|(ai, h)| (&self.blocks[*ai], params_of(&self.params, h)));
            let l = &self.blocks[bi];
            match l.kind {
                BlockKind::Embedding => {
                    let (y, mask) = embedding_fwd(&mut self.ctx, l, p, &tokens, 0)?;
                    x = Some(y);
                    saved.push(BlockSaved::Embedding(tokens.clone(), mask));
                }
                BlockKind::Layer(_) => {
                    let input = x.take().expect("layer input");
                    let (y, s) = layer_fwd(&mut self.ctx, l, p, experts, ad, input)?;
                    if self.ctx.recompute == Recompute::Full {
                        saved.push(BlockSaved::LayerInput(s.x));
                    } else {
                        saved.push(BlockSaved::Layer(Box::new(s)));
                    }
                    x = Some(y);
                }
                BlockKind::Output => {
                    let input = x.take().expect("output input");
                    if mtp > 0 {
                        mtp_h = Some(self.copy_activation(&input)?);
                    }
                    let (loss, s) =
                        output_fwd(&mut self.ctx, l, p, input, targets.take().expect("targets"))?;
                    if self.rp.coords.tp == 0 {
                        self.loss_sum += loss;
                    }
                    saved.push(BlockSaved::Output(s));
                }
                BlockKind::MtpIn(k) => {
                    let (tokens, _) = self.mtp_data(mb, k as usize + 1);
                    let ebi = shared.expect("embedding block");
                    let emb = (&self.blocks[ebi], sp_.expect("embedding parameters"));
                    let hin = mtp_h.take().expect("MTP hidden states");
                    let (y, s) = mtp_in_fwd(&mut self.ctx, l, p, emb, hin, tokens)?;
                    saved.push(BlockSaved::MtpIn(Box::new(s)));
                    x = Some(y);
                }
                BlockKind::MtpOut(k) => {
                    let input = x.take().expect("MTP output input");
                    if k + 1 < mtp {
                        mtp_h = Some(self.copy_activation(&input)?);
                    }
                    let (_, targets) = self.mtp_data(mb, k as usize + 1);
                    let obi = shared.expect("output block");
                    let head = sp_.expect("output parameters");
                    let head = head.sub(self.blocks[obi].tensors[1].range());
                    let norm = p.sub(l.tensors[0].range());
                    let (loss, s) = head_fwd(&mut self.ctx, norm, head, input, targets)?;
                    if self.rp.coords.tp == 0 {
                        self.loss_sum += self.plan.model.mtp_loss_scale as f64 * loss;
                    }
                    saved.push(BlockSaved::MtpOut(s));
                }
                BlockKind::Experts(_)
                | BlockKind::FrozenExperts(_)
                | BlockKind::Adapters(_)
                | BlockKind::MtpEmbedding => {}
            }
        }
        if let Some(y) = x {
            // Waiting to be sent (or handed to the next chunk on this rank): a send buffer.
            self.mailbox
                .insert((stage, mb, false), self.ctx.ops.recat(y, Category::Buffers));
        }
        self.saved.insert((stage, mb), saved);
        Ok(())
    }

    /// Input gradients of a chunk. The weight-gradient tasks run as soon as the backward
    /// produces them (`immediate`, a full backward) or wait for the W action.
    fn backward_input(&mut self, stage: u32, mb: u32, immediate: bool) -> Result<(), ExecError> {
        let bidx = self
            .stage_blocks
            .get(&stage)
            .cloned()
            .ok_or_else(|| self.missing("chunk", stage, mb))?;
        self.ctx.mb = mb;
        (self.ctx.step, self.ctx.dp_rank) = (self.step, self.rp.coords.dp);
        let saved = self
            .saved
            .remove(&(stage, mb))
            .ok_or_else(|| self.missing("forward", stage, mb))?;
        let last = self.blocks[bidx.end - 1].kind;
        let mut dy = if matches!(last, BlockKind::Output | BlockKind::MtpOut(_)) {
            None
        } else {
            Some(
                self.mailbox
                    .remove(&(stage + 1, mb, true))
                    .ok_or_else(|| self.missing("output gradient", stage, mb))?,
            )
        };
        let mut held: BlockTasks<B> = Vec::new();
        // Multi-token prediction: the gradient of the hidden states an MTP module took.
        let mut mtp_dh: Option<B::Tensor> = None;
        for (bi, s) in bidx.rev().zip(saved.into_iter().rev()) {
            if matches!(s, BlockSaved::Experts) {
                // Its backward runs with its layer's.
                continue;
            }
            let ei = self.experts_of(bi);
            let ai = self.adapters_of(bi);
            let fi = self.frozen_experts_of(bi);
            // ZeRO-3 in backward: the block in use (with its experts, adapters and frozen
            // experts) and its gradient bucket.
            self.cache
                .retain(|(b, _)| [Some(bi), ei, ai, fi].contains(&Some(*b)));
            let shared = self.mtp_shared_block(bi)?;
            let sh = match shared {
                Some(o) => Some(self.block_handles(o)?.0),
                None => None,
            };
            let (h, eh) = self.block_handles(bi)?;
            let ah = self.adapter_handle(bi)?;
            let fh = self.frozen_experts_handle(bi)?;
            let p = params_of(&self.params, &h);
            let sp_ = sh.as_ref().map(|h| params_of(&self.params, h));
            let shared_l = shared.map(|o| &self.blocks[o]);
            let frozen = fh
                .as_ref()
                .map(|(fi, h)| (&self.blocks[*fi], params_of(&self.params, h)));
            let experts: Experts<B> = eh
                .as_ref()
                .map(|(ei, eh)| (&self.blocks[*ei], params_of(&self.params, eh), frozen));
            let ad: Adapters<B> = ah
                .as_ref()
                .map(|(ai, h)| (&self.blocks[*ai], params_of(&self.params, h)));
            let la = ai.map(|ai| &self.blocks[ai]);
            let l = &self.blocks[bi];
            let le = ei.map(|ei| &self.blocks[ei]);
            // ZeRO-2/3: the gradient bucket is allocated at the first weight gradient, after a
            // full recompute's forward rerun.
            let mut bucket: Option<B::Tensor> = None;
            let mut ebucket: Option<B::Tensor> = None;
            let mut abucket: Option<B::Tensor> = None;
            let use_bucket = immediate && self.zero >= 2;
            let grads = &mut self.grads;
            let mut kept = Vec::new();
            // An MTP module's embedding and output-head gradients, for those blocks.
            let mut routed = Vec::new();
            let mut sink = |c: &mut Ctx<B>, t: WTask<B>| -> Result<(), ExecError> {
                if l.space == FROZEN_SPACE && !t.is_adapter() && !t.is_expert() {
                    // LoRA: a frozen weight's gradient is not computed (the frozen experts
                    // send none; an expert task is their adapters').
                    return Ok(());
                }
                let to_shared = matches!(
                    (&t, l.kind),
                    (WTask::Embedding { .. }, BlockKind::MtpIn(_))
                        | (WTask::Linear { tensor: 1, .. }, BlockKind::MtpOut(_))
                );
                if let (true, Some(sl)) = (to_shared, shared_l) {
                    routed.push(if immediate { t } else { t.hold(c, sl)? });
                    return Ok(());
                }
                if !immediate {
                    kept.push(t.hold(c, l)?);
                    return Ok(());
                }
                let (tl, bk, sp) = if t.is_expert() {
                    let le =
                        le.ok_or_else(|| ExecError::from(StateError::ExpertGradientWithoutBlock))?;
                    (le, &mut ebucket, EXPERT_SPACE)
                } else if t.is_adapter() {
                    let la =
                        la.ok_or_else(|| ExecError::from(StateError::AdapterGradientWithoutBlock))?;
                    (la, &mut abucket, DENSE_SPACE)
                } else {
                    (l, &mut bucket, DENSE_SPACE)
                };
                if use_bucket {
                    if bk.is_none() {
                        *bk = Some(c.zeros_f32(Category::Buffers, &[tl.range.len()])?);
                    }
                    let b = bk.as_mut().expect("bucket");
                    t.run(c, tl, ViewMut::all(b))
                } else {
                    t.run(
                        c,
                        tl,
                        ViewMut {
                            tensor: &mut grads[sp],
                            range: tl.range.clone(),
                        },
                    )
                }
            };
            let ctx = &mut self.ctx;
            match s {
                BlockSaved::Output(os) => {
                    let mut d = output_bwd(ctx, l, p, os, self.grad_scale, &mut sink)?;
                    if let Some(dh) = mtp_dh.take() {
                        ctx.ops.axpy(1.0, View::all(&dh), ViewMut::all(&mut d))?;
                    }
                    dy = Some(d);
                }
                BlockSaved::MtpOut(os) => {
                    let obi = shared.expect("output block");
                    let head = sp_.expect("output parameters");
                    let head = head.sub(self.blocks[obi].tensors[1].range());
                    let norm = p.sub(l.tensors[0].range());
                    let scale = self.grad_scale * self.plan.model.mtp_loss_scale;
                    let mut d = head_bwd(ctx, norm, head, os, scale, &mut sink)?;
                    if let Some(dh) = mtp_dh.take() {
                        ctx.ops.axpy(1.0, View::all(&dh), ViewMut::all(&mut d))?;
                    }
                    dy = Some(d);
                }
                BlockSaved::MtpIn(ms) => {
                    let d = dy.take().expect("grad");
                    mtp_dh = Some(mtp_in_bwd(ctx, l, p, *ms, d, &mut sink)?);
                }
                BlockSaved::Layer(ls) => {
                    dy = Some(layer_bwd(
                        ctx,
                        l,
                        p,
                        experts,
                        ad,
                        *ls,
                        dy.take().expect("grad"),
                        &mut sink,
                    )?);
                }
                BlockSaved::LayerInput(x) => {
                    // The rerun's load-balancing loss and drops were counted in forward.
                    let stats = (ctx.moe_aux_loss, ctx.moe_dropped);
                    ctx.recomputing = true;
                    let r = layer_fwd(ctx, l, p.clone(), experts.clone(), ad.clone(), x);
                    ctx.recomputing = false;
                    let (y, ls) = r?;
                    (ctx.moe_aux_loss, ctx.moe_dropped) = stats;
                    drop(y);
                    dy = Some(layer_bwd(
                        ctx,
                        l,
                        p,
                        experts,
                        ad,
                        ls,
                        dy.take().expect("grad"),
                        &mut sink,
                    )?);
                }
                BlockSaved::Embedding(tokens, mask) => {
                    embedding_bwd(ctx, tokens, mask, dy.take().expect("grad"), 0, &mut sink)?
                }
                BlockSaved::Experts => {}
            }

            drop((h, eh, ah, sh));
            if let Some(b) = bucket {
                self.flush_bucket(bi, b)?;
            }
            if let (Some(sbi), false) = (shared, routed.is_empty()) {
                if immediate {
                    self.run_tasks(sbi, routed)?;
                } else {
                    held.push((sbi, routed));
                }
            }
            // LoRA's frozen experts (without their adapters) have no gradient to flush.
            let trained = ei.filter(|&ei| !is_frozen_space(self.blocks[ei].space));
            if let (Some(ei), true) = (trained, use_bucket) {
                // Every member of the expert-DP group flushes, even with no tokens routed here.
                let b = match ebucket {
                    Some(b) => b,
                    None => self
                        .ctx
                        .zeros_f32(Category::Buffers, &[self.blocks[ei].range.len()])?,
                };
                self.flush_bucket(ei, b)?;
            }
            if let (Some(ai), Some(b)) = (ai, abucket) {
                self.flush_bucket(ai, b)?;
            }
            if immediate {
                self.block_final(stage, bi)?;
            } else {
                held.push((bi, kept));
            }
        }
        if let Some(dx) = dy {
            self.mailbox.insert((stage, mb, true), dx);
        }
        if !immediate {
            self.wtasks.insert((stage, mb), held);
        }
        Ok(())
    }

    /// Runs LoRA's held tasks of the routed experts' adapters into experts block `ei`.
    fn run_expert_tasks(
        &mut self,
        ei: Option<usize>,
        tasks: Vec<WTask<B>>,
    ) -> Result<(), ExecError> {
        if tasks.is_empty() {
            return Ok(());
        }
        let ei = ei.ok_or_else(|| ExecError::from(StateError::ExpertGradientWithoutBlock))?;
        self.run_into(ei, tasks)
    }

    /// Runs `tasks` into block `bi`'s gradients: a bucket reduce-scattered when done under
    /// ZeRO-2/3, else the block's range of its space's gradients.
    fn run_into(
        &mut self,
        bi: usize,
        tasks: impl IntoIterator<Item = WTask<B>>,
    ) -> Result<(), ExecError> {
        let l = &self.blocks[bi];
        let mut bucket = if self.zero >= 2 {
            Some(self.ctx.zeros_f32(Category::Buffers, &[l.range.len()])?)
        } else {
            None
        };
        for t in tasks {
            let g = match bucket.as_mut() {
                Some(b) => ViewMut::all(b),
                None => ViewMut {
                    tensor: &mut self.grads[l.space],
                    range: l.range.clone(),
                },
            };
            t.run(&mut self.ctx, l, g)?;
        }
        match bucket {
            Some(b) => self.flush_bucket(bi, b),
            None => Ok(()),
        }
    }

    /// Runs block `bi`'s held weight-gradient tasks (a W action), its experts' included.
    fn run_tasks(&mut self, bi: usize, tasks: Vec<WTask<B>>) -> Result<(), ExecError> {
        let ei = self.experts_of(bi);
        if let Some(ai) = self.adapters_of(bi) {
            // LoRA: the layer's own block is frozen; its tasks are the adapters' (in the
            // adapters block) and the routed experts' adapters' (in their experts block).
            let (experts, tasks): (Vec<_>, Vec<_>) = tasks.into_iter().partition(|t| t.is_expert());
            self.run_into(ai, tasks.into_iter().filter(|t| t.is_adapter()))?;
            return self.run_expert_tasks(ei, experts);
        }
        let l = &self.blocks[bi];
        let le = ei.map(|ei| &self.blocks[ei]);
        let no_block = || ExecError::from(StateError::ExpertGradientWithoutBlock);
        if l.space == FROZEN_SPACE {
            return Ok(());
        }
        if self.zero < 2 {
            for t in tasks {
                if t.is_expert() {
                    let le = le.ok_or_else(no_block)?;
                    let g = ViewMut {
                        tensor: &mut self.grads[EXPERT_SPACE],
                        range: le.range.clone(),
                    };
                    t.run(&mut self.ctx, le, g)?;
                } else {
                    let g = ViewMut {
                        tensor: &mut self.grads[DENSE_SPACE],
                        range: l.range.clone(),
                    };
                    t.run(&mut self.ctx, l, g)?;
                }
            }
            return Ok(());
        }
        self.cache.clear();
        let mut bucket = self.ctx.zeros_f32(Category::Buffers, &[l.range.len()])?;
        let mut ebucket = match le {
            Some(le) => Some(self.ctx.zeros_f32(Category::Buffers, &[le.range.len()])?),
            None => None,
        };
        for t in tasks {
            if t.is_expert() {
                let (le, b) = le.zip(ebucket.as_mut()).ok_or_else(no_block)?;
                t.run(&mut self.ctx, le, ViewMut::all(b))?;
            } else {
                t.run(&mut self.ctx, l, ViewMut::all(&mut bucket))?;
            }
        }
        self.flush_bucket(bi, bucket)?;
        if let (Some(ei), Some(b)) = (ei, ebucket) {
            self.flush_bucket(ei, b)?;
        }
        Ok(())
    }
}

/// One timed action: the action, its start and end events, and where its span sits in the
/// rank's trace (when tracing).
type Mark<B> = (
    Action,
    <B as Backend>::Event,
    <B as Backend>::Event,
    Option<usize>,
);

/// Puts a timed step's actions on the backend's clock: each action ends where its end event
/// says (CUDA events on the GPU, the host clock on the CPU), measured from the step's first
/// event and placed on the trace's axis at the step's start `s0`; an action starts at its
/// start event or, after a wait for a message, where the wait ended. The step's span comes
/// from the same events, so the trace and the reported step time agree.
fn retime_on_events<B: Backend>(
    ops: &B::Device,
    t: &mut RankTrace,
    t0: &B::Event,
    t1: &B::Event,
    s0: f64,
    marks: &[Mark<B>],
) -> Result<(), ExecError> {
    for (_, ta, tb, at) in marks {
        let Some(e) = at.and_then(|i| t.events.get_mut(i)) else {
            continue;
        };
        let start_s = s0 + ops.elapsed_s(t0, ta)?;
        let end_s = s0 + ops.elapsed_s(t0, tb)?;
        e.end_s = end_s;
        e.start_s = e.start_s.max(start_s).min(end_s);
    }
    t.steps.push((s0, s0 + ops.elapsed_s(t0, t1)?));
    Ok(())
}
