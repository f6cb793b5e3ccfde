//! Plays a Plan on the CPU backend: one thread per rank, each running its action list for a
//! number of steps, with gradient accumulation over microbatches, activation recomputation,
//! split backward (I then W), data parallelism with ZeRO 1/2/3 (Rajbhandari et al. 2020) over
//! a flat parameter buffer, and Adam.
//!
//! ZeRO here, as Megatron's distributed optimizer: the rank's parameters are one flat buffer
//! split into `dp` contiguous shards of ceil(P / dp) elements.
//! - 0: full gradients, all-reduced over DP at the step; Adam on every parameter.
//! - 1: full gradients, reduce-scattered at the step; Adam on the shard; updated shards
//!   all-gathered.
//! - 2: as 1, but each block's gradients are reduce-scattered into the shard as soon as they
//!   are computed (one block-sized bucket at a time), so only the shard is kept.
//! - 3: as 2, and the parameters too are kept as a shard: a block is all-gathered before use
//!   and freed after; in forward two gathered blocks are live at a time (the one in use and
//!   the next, as a prefetch would hold them), in backward the one in use and its gradient
//!   bucket.
//!
//! Mixture-of-experts models keep their experts in a second flat buffer (an expert *space*),
//! as Megatron keeps expert parameters apart: everything above applies to it with the
//! expert-data-parallel group (the ranks holding the same experts) in place of DP.

use crate::backend::cpu::memory::{self, Category, MemoryBreakdown};
use crate::backend::cpu::ops::gemm;
use crate::backend::cpu::{CpuComm, Group, Tensor, World};
use crate::backend::{Collectives, ReduceOp, TensorOps};
use crate::error::ExecError;
use crate::model::cp::CpStats;
use crate::model::ends::{embedding_bwd, embedding_fwd, output_bwd, output_fwd, OutputSaved};
use crate::model::layer::Experts;
use crate::model::layer::{layer_bwd, layer_fwd, LayerSaved};
use crate::model::params::{
    init_range, layout_len, rank_layout, BlockKind, BlockLayout, DENSE_SPACE, EXPERT_SPACE,
};
use crate::model::{data, Ctx, WTask};
use crate::plan::{Action, Coords, Plan, RankPlan, Recompute};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

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
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            steps: 3,
            warmup: 1,
            export_params: false,
            export_grads: false,
            perturb: Vec::new(),
        }
    }
}

/// Seconds a rank spent per kind of action, per timed step (mean).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PhaseTimes {
    pub forward_s: f64,
    /// Full backward (B) and input-gradient (I) passes, with their weight gradients for B.
    pub backward_s: f64,
    /// Weight-gradient passes (W) of a split backward.
    pub backward_weight_s: f64,
    /// Sends and receives, waiting included.
    pub p2p_s: f64,
    /// Data-parallel reduction and Adam.
    pub optimizer_s: f64,
}

/// One rank's measurements.
#[derive(Debug, Clone, Serialize)]
pub struct RankReport {
    pub rank: u32,
    pub coords: Coords,
    /// Seconds of each timed step.
    pub step_s: Vec<f64>,
    /// Where the timed steps' time went.
    pub phases: PhaseTimes,
    /// Tracked bytes by category at the moment of the peak total.
    pub peak: MemoryBreakdown,
    /// Each category's own maximum (reached at different moments).
    pub category_max: MemoryBreakdown,
    /// Source location of the allocation that reached the peak (diagnosis).
    pub peak_site: Option<String>,
    /// FLOPs and seconds of this rank's GEMMs over all steps.
    pub gemm_flops: f64,
    pub gemm_seconds: f64,
    /// Context-parallel attention: per ring step compute and communication seconds (timed
    /// steps, summed), and the causal work (cp > 1).
    pub cp: Option<CpStats>,
    /// Token-to-expert assignments the expert capacity dropped, over all steps (MoE).
    pub moe_dropped: u64,
}

impl RankReport {
    /// Median of the timed steps.
    pub fn median_step_s(&self) -> f64 {
        median(&self.step_s)
    }
}

/// The median of a list (0 when empty).
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let k = v.len();
    if k % 2 == 1 {
        v[k / 2]
    } else {
        0.5 * (v[k / 2 - 1] + v[k / 2])
    }
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub world: u32,
    /// The global mean token loss of every step (warm-up included), computed on the
    /// parameters before that step's update; with MoE layers it includes the load-balancing
    /// loss.
    pub loss: Vec<f64>,
    /// The load-balancing part of `loss` (Fedus et al. 2021, eq. 4): per MoE layer and
    /// microbatch, averaged over the microbatches of the step and summed over the layers.
    pub aux_loss: Vec<f64>,
    pub ranks: Vec<RankReport>,
    /// Global parameter tensors after the last step (flat, row-major), when asked for.
    pub params: Option<BTreeMap<String, Vec<f32>>>,
    /// Global gradient tensors of the last step, when asked for.
    pub grads: Option<BTreeMap<String, Vec<f32>>>,
}

struct RankOutput {
    report: RankReport,
    loss_sums: Vec<f64>,
    aux_sums: Vec<f64>,
    params: Vec<(String, usize, f32)>,
    grads: Vec<(String, usize, f32)>,
}

fn assemble(items: Vec<&[(String, usize, f32)]>) -> BTreeMap<String, Vec<f32>> {
    let mut acc: HashMap<String, Vec<(usize, f32)>> = HashMap::new();
    for list in items {
        for (name, i, v) in list {
            acc.entry(name.clone()).or_default().push((*i, *v));
        }
    }
    acc.into_iter()
        .map(|(name, mut items)| {
            items.sort_by_key(|x| x.0);
            items.dedup_by_key(|x| x.0);
            (name, items.into_iter().map(|x| x.1).collect())
        })
        .collect()
}

/// Runs `plan` on CPU threads.
pub fn run_cpu(plan: &Plan, opts: &RunOptions) -> Result<RunReport, ExecError> {
    plan.validate()?;
    if opts.export_grads && plan.parallel.zero >= 2 {
        return Err(ExecError::Plan(
            "export_grads needs zero 0 or 1 (full gradients)".into(),
        ));
    }
    if opts.steps == 0 || opts.warmup >= opts.steps {
        return Err(ExecError::Plan(format!(
            "steps ({}) must exceed warmup ({})",
            opts.steps, opts.warmup
        )));
    }
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
                        run_rank(plan, rp, &comm, opts)
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
    // Report the first real failure rather than the ranks that gave up because of it.
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
    let params = opts
        .export_params
        .then(|| assemble(outs.iter().map(|o| o.params.as_slice()).collect()));
    let grads = opts
        .export_grads
        .then(|| assemble(outs.iter().map(|o| o.grads.as_slice()).collect()));
    Ok(RunReport {
        world: plan.world(),
        loss,
        aux_loss,
        ranks: outs.into_iter().map(|o| o.report).collect(),
        params,
        grads,
    })
}

enum BlockSaved {
    Embedding(Vec<u32>),
    Layer(Box<LayerSaved>),
    LayerInput(Tensor),
    Output(OutputSaved),
    /// An MoE layer's experts block: its state is saved with its layer.
    Experts,
}

type BlockTasks = Vec<(usize, Vec<WTask>)>;

/// A block's parameters: a range of the full flat buffer, or a gathered copy (ZeRO-3).
enum Handle {
    Flat(usize, Range<usize>),
    Gathered(Rc<Tensor>),
}

fn params_of<'p>(params: &'p [Tensor; 2], h: &'p Handle) -> &'p [f32] {
    match h {
        Handle::Flat(space, r) => &params[*space].data()[r.clone()],
        Handle::Gathered(t) => t.data(),
    }
}

struct Rank<'a> {
    plan: &'a Plan,
    rp: &'a RankPlan,
    ctx: Ctx<'a>,
    /// Per space (dense, experts): the group over which gradients reduce and ZeRO shards
    /// (DP, expert DP), this rank's shard, parameters, gradients and Adam moments.
    groups: [Group; 2],
    blocks: Vec<BlockLayout>,
    stage_blocks: HashMap<u32, Range<usize>>,
    zero: u8,
    shards: [Range<usize>; 2],
    params: [Tensor; 2],
    grads: [Tensor; 2],
    m: [Tensor; 2],
    v: [Tensor; 2],
    step: u32,
    cache: VecDeque<(usize, Rc<Tensor>)>,
    saved: HashMap<(u32, u32), Vec<BlockSaved>>,
    wtasks: HashMap<(u32, u32), BlockTasks>,
    mailbox: HashMap<(u32, u32, bool), Tensor>,
    recv_buf: Option<Tensor>,
    loss_sum: f64,
    grad_scale: f32,
}

fn tag(stage: u32, mb: u32, grad: bool) -> u64 {
    ((stage as u64) << 33) | ((mb as u64) << 1) | grad as u64
}

fn run_rank(
    plan: &Plan,
    rp: &RankPlan,
    comm: &CpuComm,
    opts: &RunOptions,
) -> Result<RankOutput, ExecError> {
    memory::reset_peak();
    let tp = comm.group(&rp.tp_group);
    let dp = comm.group(&rp.dp_group);
    let mut ctx = Ctx::new(plan, comm, tp, rp.coords.tp, comm.group(&rp.cp_group));
    let ep = comm.group(&rp.ep_group);
    let ep_rank = ep.index as u32;
    if plan.model.moe.is_some() {
        ctx.ep = Some(ep);
    }
    let blocks = rank_layout(plan, rp.coords.tp, ep_rank, &rp.stages);
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
    let groups = [dp, comm.group(&rp.expert_dp_group)];
    let space = |sp: usize| {
        let g = &groups[sp];
        let total = layout_len(&blocks, sp);
        let per = total.div_ceil(g.size());
        let shard = (g.index * per).min(total)..((g.index + 1) * per).min(total);
        let prange = if zero >= 3 { shard.clone() } else { 0..total };
        let mut pdata = vec![0.0f32; prange.len()];
        init_range(plan.seed, &blocks, sp, prange.clone(), &mut pdata);
        for (name, gi, delta) in &opts.perturb {
            for b in blocks.iter().filter(|b| b.space == sp) {
                for t in &b.tensors {
                    for i in 0..t.len() {
                        let (s, g) = t.global_of(i);
                        let flat = b.range.start + t.offset + i;
                        if &s.name == name && g == *gi && prange.contains(&flat) {
                            pdata[flat - prange.start] += delta;
                        }
                    }
                }
            }
        }
        let params = Tensor::from_vec(Category::Weights, &[prange.len()], pdata);
        let glen = if zero >= 2 { shard.len() } else { total };
        let olen = if zero >= 1 { shard.len() } else { total };
        (
            shard,
            params,
            Tensor::zeros(Category::Gradients, &[glen]),
            Tensor::zeros(Category::Optimizer, &[olen]),
            Tensor::zeros(Category::Optimizer, &[olen]),
        )
    };
    let (s0, p0, g0, m0, v0) = space(DENSE_SPACE);
    let (s1, p1, g1, m1, v1) = space(EXPERT_SPACE);
    let n_sp = ctx.n_sp;
    let h = plan.model.hidden;
    let pp = plan.parallel.pp > 1;
    let mut rank = Rank {
        plan,
        rp,
        groups,
        blocks,
        stage_blocks,
        zero,
        shards: [s0, s1],
        params: [p0, p1],
        grads: [g0, g1],
        m: [m0, m1],
        v: [v0, v1],
        step: 0,
        cache: VecDeque::new(),
        saved: HashMap::new(),
        wtasks: HashMap::new(),
        mailbox: HashMap::new(),
        recv_buf: pp.then(|| Tensor::zeros(Category::Buffers, &[n_sp, h])),
        loss_sum: 0.0,
        grad_scale: 1.0 / (plan.global_batch() * plan.model.seq) as f32,
        ctx,
    };
    let mut step_s = Vec::new();
    let mut loss_sums = Vec::new();
    let mut aux_sums = Vec::new();
    let mut phases = PhaseTimes::default();
    for step in 0..opts.steps {
        if let Some(cp) = rank.ctx.cp.as_mut() {
            cp.timing = step >= opts.warmup;
        }
        let t0 = Instant::now();
        rank.loss_sum = 0.0;
        rank.ctx.moe_aux_loss = 0.0;
        for a in &rp.actions {
            let ta = Instant::now();
            if opts.export_grads && *a == Action::OptimizerStep {
                rank.reduce_for_export()?;
                continue;
            }
            rank.act(*a)?;
            if step >= opts.warmup {
                let dt = ta.elapsed().as_secs_f64();
                let slot = match a {
                    Action::Forward { .. } => &mut phases.forward_s,
                    Action::Backward { .. } | Action::BackwardInput { .. } => {
                        &mut phases.backward_s
                    }
                    Action::BackwardWeight { .. } => &mut phases.backward_weight_s,
                    Action::OptimizerStep => &mut phases.optimizer_s,
                    _ => &mut phases.p2p_s,
                };
                *slot += dt;
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        if step >= opts.warmup {
            step_s.push(dt);
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
    let peak = memory::peak();
    let category_max = memory::category_max();
    let peak_site = memory::peak_site();
    let (gemm_flops, gemm_seconds) = gemm::gemm_stats();
    let params = if opts.export_params {
        rank.export()?
    } else {
        Vec::new()
    };
    let grads = if opts.export_grads {
        rank.export_grads()
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
            peak_site,
            gemm_flops,
            gemm_seconds,
            cp: rank.ctx.cp.as_ref().map(|c| c.stats.clone()),
            moe_dropped: rank.ctx.moe_dropped,
        },
        loss_sums,
        aux_sums,
        params,
        grads,
    })
}

impl<'a> Rank<'a> {
    fn act(&mut self, a: Action) -> Result<(), ExecError> {
        match a {
            Action::Forward { stage, mb } => self.forward(stage, mb),
            Action::Backward { stage, mb } => self.backward_input(stage, mb, true),
            Action::BackwardInput { stage, mb } => self.backward_input(stage, mb, false),
            Action::BackwardWeight { stage, mb } => {
                let tasks = self.wtasks.remove(&(stage, mb)).ok_or_else(|| {
                    ExecError::Plan(format!(
                        "W(stage {stage}, mb {mb}) before its I on rank {}",
                        self.rp.rank
                    ))
                })?;
                for (bi, ts) in tasks {
                    self.run_tasks(bi, ts)?;
                }
                Ok(())
            }
            Action::SendActivation { to, stage, mb } => self.send(to, stage, mb, false),
            Action::SendGrad { to, stage, mb } => self.send(to, stage, mb, true),
            Action::RecvActivation { from, stage, mb } => self.recv(from, stage, mb, false),
            Action::RecvGrad { from, stage, mb } => self.recv(from, stage, mb, true),
            Action::OptimizerStep => self.optimizer_step(),
        }
    }

    fn missing(&self, what: &str, stage: u32, mb: u32) -> ExecError {
        ExecError::Plan(format!(
            "rank {}: no {what} for stage {stage}, microbatch {mb} (actions out of order)",
            self.rp.rank
        ))
    }

    /// Sends a chunk's output (or input gradient) straight from its tensor, which is the
    /// pipeline send buffer until then, and frees it.
    fn send(&mut self, to: u32, stage: u32, mb: u32, grad: bool) -> Result<(), ExecError> {
        let t = self
            .mailbox
            .remove(&(stage, mb, grad))
            .ok_or_else(|| self.missing("tensor to send", stage, mb))?;
        self.ctx.comm.send(to, tag(stage, mb, grad), t.data())
    }

    fn recv(&mut self, from: u32, stage: u32, mb: u32, grad: bool) -> Result<(), ExecError> {
        let buf = self.recv_buf.as_mut().expect("pp buffers");
        self.ctx
            .comm
            .recv(from, tag(stage, mb, grad), buf.data_mut())?;
        let cat = if grad {
            Category::Buffers
        } else {
            Category::Activations
        };
        let t = Tensor::copy_of(cat, buf.shape(), buf.data());
        self.mailbox.insert((stage, mb, grad), t);
        Ok(())
    }

    /// The parameters of block `bi` (gathering them over its space's group under ZeRO-3).
    fn handle(&mut self, bi: usize) -> Result<Handle, ExecError> {
        let r = self.blocks[bi].range.clone();
        let sp = self.blocks[bi].space;
        if self.zero < 3 {
            return Ok(Handle::Flat(sp, r));
        }
        if let Some((_, t)) = self.cache.iter().find(|(b, _)| *b == bi) {
            return Ok(Handle::Gathered(Rc::clone(t)));
        }
        if self.cache.len() == 2 {
            self.cache.pop_front();
        }
        let mut t = Tensor::zeros(Category::Buffers, &[r.len()]);
        self.ctx.comm.gather_range(
            &self.groups[sp],
            self.shards[sp].start,
            self.params[sp].data(),
            r,
            t.data_mut(),
        )?;
        let t = Rc::new(t);
        self.cache.push_back((bi, Rc::clone(&t)));
        Ok(Handle::Gathered(t))
    }

    /// The experts block of the MoE layer of block `bi`, when it is one.
    /// The parameters of block `bi` and of its experts block (MoE layers), gathered under
    /// ZeRO-3.
    fn block_handles(&mut self, bi: usize) -> Result<(Handle, Option<(usize, Handle)>), ExecError> {
        let h = self.handle(bi)?;
        let e = match self.experts_of(bi) {
            Some(ei) => Some((ei, self.handle(ei)?)),
            None => None,
        };
        Ok((h, e))
    }

    fn experts_of(&self, bi: usize) -> Option<usize> {
        match (
            self.blocks[bi].kind,
            self.blocks.get(bi + 1).map(|b| b.kind),
        ) {
            (BlockKind::Layer(l), Some(BlockKind::Experts(e))) if l == e => Some(bi + 1),
            _ => None,
        }
    }

    fn forward(&mut self, stage: u32, mb: u32) -> Result<(), ExecError> {
        let bidx = self
            .stage_blocks
            .get(&stage)
            .cloned()
            .ok_or_else(|| self.missing("chunk", stage, mb))?;
        self.ctx.mb = mb;
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
            Some(
                self.mailbox
                    .remove(&(stage.wrapping_sub(1), mb, false))
                    .ok_or_else(|| self.missing("input activation", stage, mb))?
                    .recat(Category::Activations),
            )
        };
        let mut saved = Vec::with_capacity(bidx.len());
        let mut targets = Some(targets);
        for bi in bidx {
            if matches!(self.blocks[bi].kind, BlockKind::Experts(_)) {
                // Run with its layer.
                saved.push(BlockSaved::Experts);
                continue;
            }
            let (h, eh) = self.block_handles(bi)?;
            let p = params_of(&self.params, &h);
            let experts: Experts = eh
                .as_ref()
                .map(|(ei, eh)| (&self.blocks[*ei], params_of(&self.params, eh)));
            let l = &self.blocks[bi];
            match l.kind {
                BlockKind::Embedding => {
                    x = Some(embedding_fwd(&mut self.ctx, l, p, &tokens)?);
                    saved.push(BlockSaved::Embedding(tokens.clone()));
                }
                BlockKind::Layer(_) => {
                    let input = x.take().expect("layer input");
                    let (y, s) = layer_fwd(&mut self.ctx, l, p, experts, input)?;
                    if self.ctx.recompute == Recompute::Full {
                        saved.push(BlockSaved::LayerInput(s.x));
                    } else {
                        saved.push(BlockSaved::Layer(Box::new(s)));
                    }
                    x = Some(y);
                }
                BlockKind::Output => {
                    let input = x.take().expect("output input");
                    let (loss, s) =
                        output_fwd(&mut self.ctx, l, p, input, targets.take().expect("targets"))?;
                    if self.rp.coords.tp == 0 {
                        self.loss_sum += loss;
                    }
                    saved.push(BlockSaved::Output(s));
                }
                BlockKind::Experts(_) => {}
            }
        }
        if let Some(y) = x {
            // Waiting to be sent (or handed to the next chunk on this rank): a send buffer.
            self.mailbox
                .insert((stage, mb, false), y.recat(Category::Buffers));
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
        let saved = self
            .saved
            .remove(&(stage, mb))
            .ok_or_else(|| self.missing("forward", stage, mb))?;
        let mut dy = if matches!(self.blocks[bidx.end - 1].kind, BlockKind::Output) {
            None
        } else {
            Some(
                self.mailbox
                    .remove(&(stage + 1, mb, true))
                    .ok_or_else(|| self.missing("output gradient", stage, mb))?,
            )
        };
        let mut held: BlockTasks = Vec::new();
        for (bi, s) in bidx.rev().zip(saved.into_iter().rev()) {
            if matches!(s, BlockSaved::Experts) {
                // Its backward runs with its layer's.
                continue;
            }
            let ei = self.experts_of(bi);
            // ZeRO-3 in backward: the block in use (with its experts) and its gradient bucket.
            self.cache.retain(|(b, _)| *b == bi || Some(*b) == ei);
            let (h, eh) = self.block_handles(bi)?;
            let p = params_of(&self.params, &h);
            let experts: Experts = eh
                .as_ref()
                .map(|(ei, eh)| (&self.blocks[*ei], params_of(&self.params, eh)));
            let l = &self.blocks[bi];
            let le = ei.map(|ei| &self.blocks[ei]);
            // ZeRO-2/3: the gradient bucket is allocated at the first weight gradient, after a
            // full recompute's forward rerun.
            let mut bucket: Option<Tensor> = None;
            let mut ebucket: Option<Tensor> = None;
            let use_bucket = immediate && self.zero >= 2;
            let grads = &mut self.grads;
            let mut kept = Vec::new();
            let mut sink = |c: &mut Ctx, t: WTask| -> Result<(), ExecError> {
                if !immediate {
                    kept.push(t.hold(c, l));
                    return Ok(());
                }
                let (tl, bk, sp) = if t.is_expert() {
                    let le = le.ok_or_else(|| {
                        ExecError::Plan("an expert gradient without an experts block".into())
                    })?;
                    (le, &mut ebucket, EXPERT_SPACE)
                } else {
                    (l, &mut bucket, DENSE_SPACE)
                };
                if use_bucket {
                    let b = bk
                        .get_or_insert_with(|| Tensor::zeros(Category::Buffers, &[tl.range.len()]));
                    t.run(c, tl, b.data_mut())
                } else {
                    t.run(c, tl, &mut grads[sp].data_mut()[tl.range.clone()])
                }
            };
            let ctx = &mut self.ctx;
            match s {
                BlockSaved::Output(os) => {
                    dy = Some(output_bwd(ctx, l, p, os, self.grad_scale, &mut sink)?);
                }
                BlockSaved::Layer(ls) => {
                    dy = Some(layer_bwd(
                        ctx,
                        l,
                        p,
                        experts,
                        *ls,
                        dy.take().expect("grad"),
                        &mut sink,
                    )?);
                }
                BlockSaved::LayerInput(x) => {
                    // The rerun's load-balancing loss and drops were counted in forward.
                    let stats = (ctx.moe_aux_loss, ctx.moe_dropped);
                    ctx.recomputing = true;
                    let r = layer_fwd(ctx, l, p, experts, x);
                    ctx.recomputing = false;
                    let (y, ls) = r?;
                    (ctx.moe_aux_loss, ctx.moe_dropped) = stats;
                    drop(y);
                    dy = Some(layer_bwd(
                        ctx,
                        l,
                        p,
                        experts,
                        ls,
                        dy.take().expect("grad"),
                        &mut sink,
                    )?);
                }
                BlockSaved::Embedding(tokens) => {
                    embedding_bwd(ctx, tokens, dy.take().expect("grad"), &mut sink)?
                }
                BlockSaved::Experts => {}
            }

            drop((h, eh));
            if let Some(b) = bucket {
                self.flush_bucket(bi, b)?;
            }
            if let (Some(ei), true) = (ei, use_bucket) {
                // Every member of the expert-DP group flushes, even with no tokens routed here.
                let b = ebucket.unwrap_or_else(|| {
                    Tensor::zeros(Category::Buffers, &[self.blocks[ei].range.len()])
                });
                self.flush_bucket(ei, b)?;
            }
            if !immediate {
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

    /// Runs block `bi`'s held weight-gradient tasks (a W action), its experts' included.
    fn run_tasks(&mut self, bi: usize, tasks: Vec<WTask>) -> Result<(), ExecError> {
        let ei = self.experts_of(bi);
        let l = &self.blocks[bi];
        let le = ei.map(|ei| &self.blocks[ei]);
        let no_block = || ExecError::Plan("an expert gradient without an experts block".into());
        if self.zero < 2 {
            for t in tasks {
                if t.is_expert() {
                    let le = le.ok_or_else(no_block)?;
                    let g = &mut self.grads[EXPERT_SPACE].data_mut()[le.range.clone()];
                    t.run(&mut self.ctx, le, g)?;
                } else {
                    let g = &mut self.grads[DENSE_SPACE].data_mut()[l.range.clone()];
                    t.run(&mut self.ctx, l, g)?;
                }
            }
            return Ok(());
        }
        self.cache.clear();
        let mut bucket = Tensor::zeros(Category::Buffers, &[l.range.len()]);
        let mut ebucket = le.map(|le| Tensor::zeros(Category::Buffers, &[le.range.len()]));
        for t in tasks {
            if t.is_expert() {
                let (le, b) = le.zip(ebucket.as_mut()).ok_or_else(no_block)?;
                t.run(&mut self.ctx, le, b.data_mut())?;
            } else {
                t.run(&mut self.ctx, l, bucket.data_mut())?;
            }
        }
        self.flush_bucket(bi, bucket)?;
        if let (Some(ei), Some(b)) = (ei, ebucket) {
            self.flush_bucket(ei, b)?;
        }
        Ok(())
    }

    /// ZeRO-2/3: sums a block's gradient bucket over TP where SP split the norms' tokens, and
    /// reduce-scatters it over its space's group (DP or expert DP) into this rank's shard.
    fn flush_bucket(&mut self, bi: usize, mut bucket: Tensor) -> Result<(), ExecError> {
        let l = &self.blocks[bi];
        if self.ctx.sp {
            for t in l.tensors.iter().filter(|t| t.tp_replicated) {
                self.ctx.comm.all_reduce(
                    &self.ctx.tp,
                    &mut bucket.data_mut()[t.range()],
                    ReduceOp::Sum,
                )?;
            }
        }
        let sp = l.space;
        self.ctx.comm.reduce_scatter_range(
            &self.groups[sp],
            l.range.start,
            bucket.data(),
            self.shards[sp].clone(),
            self.grads[sp].data_mut(),
        )
    }

    /// Sums the SP norm partials of the dense gradients over TP.
    fn reduce_sp_norms(&mut self) -> Result<(), ExecError> {
        let comm = self.ctx.comm;
        for b in self.blocks.iter().filter(|b| b.space == DENSE_SPACE) {
            for t in b.tensors.iter().filter(|t| t.tp_replicated) {
                let r = b.range.start + t.offset..b.range.start + t.offset + t.len();
                comm.all_reduce(
                    &self.ctx.tp,
                    &mut self.grads[DENSE_SPACE].data_mut()[r],
                    ReduceOp::Sum,
                )?;
            }
        }
        Ok(())
    }

    /// The spaces that hold parameters (the same on every member of a space's group).
    fn spaces(&self) -> Vec<usize> {
        [DENSE_SPACE, EXPERT_SPACE]
            .into_iter()
            .filter(|&sp| layout_len(&self.blocks, sp) > 0)
            .collect()
    }

    fn optimizer_step(&mut self) -> Result<(), ExecError> {
        self.step += 1;
        let comm = self.ctx.comm;
        if self.zero < 2 && self.ctx.sp {
            // Sequence parallelism: norm gradients are partial sums over the sequence shards.
            self.reduce_sp_norms()?;
        }
        let adam = self.plan.adam;
        if self.zero >= 3 {
            self.cache.clear();
        }
        for sp in self.spaces() {
            let sh = self.shards[sp].clone();
            let g = &self.groups[sp];
            let (params, grads) = (&mut self.params[sp], &mut self.grads[sp]);
            let (m, v) = (&mut self.m[sp], &mut self.v[sp]);
            match self.zero {
                0 => {
                    comm.all_reduce(g, grads.data_mut(), ReduceOp::Sum)?;
                    self.ctx.ops.adam(
                        &adam,
                        self.step,
                        params.data_mut(),
                        grads.data(),
                        m.data_mut(),
                        v.data_mut(),
                    );
                }
                1 | 2 => {
                    if self.zero == 1 {
                        // Staging copy of the send side (NCCL's buffers, untracked).
                        let all = grads.data().to_vec();
                        grads.data_mut()[sh.clone()].fill(0.0);
                        comm.reduce_scatter_range(
                            g,
                            0,
                            &all,
                            sh.clone(),
                            &mut grads.data_mut()[sh.clone()],
                        )?;
                    }
                    let gs: &[f32] = if self.zero == 1 {
                        &grads.data()[sh.clone()]
                    } else {
                        grads.data()
                    };
                    self.ctx.ops.adam(
                        &adam,
                        self.step,
                        &mut params.data_mut()[sh.clone()],
                        gs,
                        m.data_mut(),
                        v.data_mut(),
                    );
                    let mine = params.data()[sh.clone()].to_vec();
                    let total = params.len();
                    comm.gather_range(g, sh.start, &mine, 0..total, params.data_mut())?;
                }
                _ => {
                    self.ctx.ops.adam(
                        &adam,
                        self.step,
                        params.data_mut(),
                        grads.data(),
                        m.data_mut(),
                        v.data_mut(),
                    );
                }
            }
            grads.data_mut().fill(0.0);
        }
        Ok(())
    }

    /// Sums the gradients over TP (SP norm partials) and DP (expert DP for the experts), as
    /// the optimizer step would.
    fn reduce_for_export(&mut self) -> Result<(), ExecError> {
        if self.ctx.sp {
            self.reduce_sp_norms()?;
        }
        for sp in self.spaces() {
            self.ctx
                .comm
                .all_reduce(&self.groups[sp], self.grads[sp].data_mut(), ReduceOp::Sum)?;
        }
        Ok(())
    }

    fn export_grads(&self) -> Vec<(String, usize, f32)> {
        let mut out = Vec::new();
        for b in &self.blocks {
            for t in &b.tensors {
                for i in 0..t.len() {
                    let (s, gi) = t.global_of(i);
                    out.push((
                        s.name.clone(),
                        gi,
                        self.grads[b.space].data()[b.range.start + t.offset + i],
                    ));
                }
            }
        }
        out
    }

    /// Every parameter element with its global tensor name and index.
    fn export(&mut self) -> Result<Vec<(String, usize, f32)>, ExecError> {
        let mut full: [Vec<f32>; 2] = [Vec::new(), Vec::new()];
        for sp in self.spaces() {
            let total = layout_len(&self.blocks, sp);
            full[sp] = if self.zero >= 3 {
                let mut out = vec![0.0; total];
                self.ctx.comm.gather_range(
                    &self.groups[sp],
                    self.shards[sp].start,
                    self.params[sp].data(),
                    0..total,
                    &mut out,
                )?;
                out
            } else {
                self.params[sp].data().to_vec()
            };
        }
        let mut out = Vec::new();
        for b in &self.blocks {
            for t in &b.tensors {
                for i in 0..t.len() {
                    let (s, gi) = t.global_of(i);
                    out.push((
                        s.name.clone(),
                        gi,
                        full[b.space][b.range.start + t.offset + i],
                    ));
                }
            }
        }
        Ok(out)
    }
}
