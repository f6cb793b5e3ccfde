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

use crate::backend::cpu::memory::{self, Category, MemoryBreakdown};
use crate::backend::cpu::ops::gemm;
use crate::backend::cpu::{CpuComm, Group, Tensor, World};
use crate::backend::{Collectives, ReduceOp, TensorOps};
use crate::error::ExecError;
use crate::model::cp::CpStats;
use crate::model::ends::{embedding_bwd, embedding_fwd, output_bwd, output_fwd, OutputSaved};
use crate::model::layer::{layer_bwd, layer_fwd, LayerSaved};
use crate::model::params::{init_range, layout_len, rank_layout, BlockKind, BlockLayout};
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
    /// parameters before that step's update.
    pub loss: Vec<f64>,
    pub ranks: Vec<RankReport>,
    /// Global parameter tensors after the last step (flat, row-major), when asked for.
    pub params: Option<BTreeMap<String, Vec<f32>>>,
    /// Global gradient tensors of the last step, when asked for.
    pub grads: Option<BTreeMap<String, Vec<f32>>>,
}

struct RankOutput {
    report: RankReport,
    loss_sums: Vec<f64>,
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
    let params = opts
        .export_params
        .then(|| assemble(outs.iter().map(|o| o.params.as_slice()).collect()));
    let grads = opts
        .export_grads
        .then(|| assemble(outs.iter().map(|o| o.grads.as_slice()).collect()));
    Ok(RunReport {
        world: plan.world(),
        loss,
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
}

type BlockTasks = Vec<(usize, Vec<WTask>)>;

/// A block's parameters: a range of the full flat buffer, or a gathered copy (ZeRO-3).
enum Handle {
    Flat(Range<usize>),
    Gathered(Rc<Tensor>),
}

struct Rank<'a> {
    plan: &'a Plan,
    rp: &'a RankPlan,
    ctx: Ctx<'a>,
    dp: Group,
    blocks: Vec<BlockLayout>,
    stage_blocks: HashMap<u32, Range<usize>>,
    zero: u8,
    /// This rank's ZeRO shard of the flat buffer.
    shard: Range<usize>,
    params: Tensor,
    grads: Tensor,
    m: Tensor,
    v: Tensor,
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
    let ctx = Ctx::new(plan, comm, tp, rp.coords.tp, comm.group(&rp.cp_group));
    let blocks = rank_layout(plan, rp.coords.tp, &rp.stages);
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
    let total = layout_len(&blocks);
    let dps = dp.size();
    let per = total.div_ceil(dps);
    let shard = (dp.index * per).min(total)..((dp.index + 1) * per).min(total);
    let zero = plan.parallel.zero;
    let prange = if zero >= 3 { shard.clone() } else { 0..total };
    let mut pdata = vec![0.0f32; prange.len()];
    init_range(plan.seed, &blocks, prange.clone(), &mut pdata);
    for (name, gi, delta) in &opts.perturb {
        for b in &blocks {
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
    let n_sp = ctx.n_sp;
    let h = plan.model.hidden;
    let pp = plan.parallel.pp > 1;
    let mut rank = Rank {
        plan,
        rp,
        dp,
        blocks,
        stage_blocks,
        zero,
        shard,
        params,
        grads: Tensor::zeros(Category::Gradients, &[glen]),
        m: Tensor::zeros(Category::Optimizer, &[olen]),
        v: Tensor::zeros(Category::Optimizer, &[olen]),
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
    let mut phases = PhaseTimes::default();
    for step in 0..opts.steps {
        if let Some(cp) = rank.ctx.cp.as_mut() {
            cp.timing = step >= opts.warmup;
        }
        let t0 = Instant::now();
        rank.loss_sum = 0.0;
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
        loss_sums.push(rank.loss_sum);
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
        },
        loss_sums,
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

    /// The parameters of block `bi` (gathering them over DP under ZeRO-3).
    fn handle(&mut self, bi: usize) -> Result<Handle, ExecError> {
        let r = self.blocks[bi].range.clone();
        if self.zero < 3 {
            return Ok(Handle::Flat(r));
        }
        if let Some((_, t)) = self.cache.iter().find(|(b, _)| *b == bi) {
            return Ok(Handle::Gathered(Rc::clone(t)));
        }
        if self.cache.len() == 2 {
            self.cache.pop_front();
        }
        let mut t = Tensor::zeros(Category::Buffers, &[r.len()]);
        self.ctx.comm.gather_range(
            &self.dp,
            self.shard.start,
            self.params.data(),
            r,
            t.data_mut(),
        )?;
        let t = Rc::new(t);
        self.cache.push_back((bi, Rc::clone(&t)));
        Ok(Handle::Gathered(t))
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
            let h = self.handle(bi)?;
            let p: &[f32] = match &h {
                Handle::Flat(r) => &self.params.data()[r.clone()],
                Handle::Gathered(t) => t.data(),
            };
            let l = &self.blocks[bi];
            match l.kind {
                BlockKind::Embedding => {
                    x = Some(embedding_fwd(&mut self.ctx, l, p, &tokens)?);
                    saved.push(BlockSaved::Embedding(tokens.clone()));
                }
                BlockKind::Layer(_) => {
                    let input = x.take().expect("layer input");
                    let (y, s) = layer_fwd(&mut self.ctx, l, p, input)?;
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
            // ZeRO-3 in backward: the block in use and its gradient bucket, nothing else.
            self.cache.retain(|(b, _)| *b == bi);
            let h = self.handle(bi)?;
            let p: &[f32] = match &h {
                Handle::Flat(r) => &self.params.data()[r.clone()],
                Handle::Gathered(t) => t.data(),
            };
            let l = &self.blocks[bi];
            // ZeRO-2/3: the gradient bucket is allocated at the first weight gradient, after a
            // full recompute's forward rerun.
            let mut bucket: Option<Tensor> = None;
            let use_bucket = immediate && self.zero >= 2;
            let grads = &mut self.grads;
            let mut kept = Vec::new();
            let mut sink = |c: &mut Ctx, t: WTask| -> Result<(), ExecError> {
                if !immediate {
                    kept.push(t.hold(c, l));
                    return Ok(());
                }
                if use_bucket {
                    let b = bucket
                        .get_or_insert_with(|| Tensor::zeros(Category::Buffers, &[l.range.len()]));
                    t.run(c, l, b.data_mut())
                } else {
                    t.run(c, l, &mut grads.data_mut()[l.range.clone()])
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
                        *ls,
                        dy.take().expect("grad"),
                        &mut sink,
                    )?);
                }
                BlockSaved::LayerInput(x) => {
                    ctx.recomputing = true;
                    let r = layer_fwd(ctx, l, p, x);
                    ctx.recomputing = false;
                    let (y, ls) = r?;
                    drop(y);
                    dy = Some(layer_bwd(
                        ctx,
                        l,
                        p,
                        ls,
                        dy.take().expect("grad"),
                        &mut sink,
                    )?);
                }
                BlockSaved::Embedding(tokens) => {
                    embedding_bwd(ctx, tokens, dy.take().expect("grad"), &mut sink)?
                }
            }

            drop(h);
            if let Some(b) = bucket {
                self.flush_bucket(bi, b)?;
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

    /// Runs block `bi`'s held weight-gradient tasks (a W action).
    fn run_tasks(&mut self, bi: usize, tasks: Vec<WTask>) -> Result<(), ExecError> {
        let l = &self.blocks[bi];
        if self.zero < 2 {
            let g = &mut self.grads.data_mut()[l.range.clone()];
            for t in tasks {
                t.run(&mut self.ctx, l, g)?;
            }
            return Ok(());
        }
        self.cache.clear();
        let mut bucket = Tensor::zeros(Category::Buffers, &[l.range.len()]);
        for t in tasks {
            t.run(&mut self.ctx, l, bucket.data_mut())?;
        }
        self.flush_bucket(bi, bucket)
    }

    /// ZeRO-2/3: sums a block's gradient bucket over TP where SP split the norms' tokens, and
    /// reduce-scatters it over DP into this rank's gradient shard.
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
        self.ctx.comm.reduce_scatter_range(
            &self.dp,
            l.range.start,
            bucket.data(),
            self.shard.clone(),
            self.grads.data_mut(),
        )
    }

    fn optimizer_step(&mut self) -> Result<(), ExecError> {
        self.step += 1;
        let comm = self.ctx.comm;
        if self.zero < 2 && self.ctx.sp {
            // Sequence parallelism: norm gradients are partial sums over the sequence shards.
            for b in &self.blocks {
                for t in b.tensors.iter().filter(|t| t.tp_replicated) {
                    let r = b.range.start + t.offset..b.range.start + t.offset + t.len();
                    comm.all_reduce(&self.ctx.tp, &mut self.grads.data_mut()[r], ReduceOp::Sum)?;
                }
            }
        }
        let sh = self.shard.clone();
        let adam = self.plan.adam;
        match self.zero {
            0 => {
                comm.all_reduce(&self.dp, self.grads.data_mut(), ReduceOp::Sum)?;
                self.ctx.ops.adam(
                    &adam,
                    self.step,
                    self.params.data_mut(),
                    self.grads.data(),
                    self.m.data_mut(),
                    self.v.data_mut(),
                );
            }
            1 | 2 => {
                if self.zero == 1 {
                    // Staging copy of the send side (NCCL's buffers, untracked).
                    let all = self.grads.data().to_vec();
                    self.grads.data_mut()[sh.clone()].fill(0.0);
                    comm.reduce_scatter_range(
                        &self.dp,
                        0,
                        &all,
                        sh.clone(),
                        &mut self.grads.data_mut()[sh.clone()],
                    )?;
                }
                let g: &[f32] = if self.zero == 1 {
                    &self.grads.data()[sh.clone()]
                } else {
                    self.grads.data()
                };
                self.ctx.ops.adam(
                    &adam,
                    self.step,
                    &mut self.params.data_mut()[sh.clone()],
                    g,
                    self.m.data_mut(),
                    self.v.data_mut(),
                );
                let mine = self.params.data()[sh.clone()].to_vec();
                let total = self.params.len();
                comm.gather_range(&self.dp, sh.start, &mine, 0..total, self.params.data_mut())?;
            }
            _ => {
                self.cache.clear();
                self.ctx.ops.adam(
                    &adam,
                    self.step,
                    self.params.data_mut(),
                    self.grads.data(),
                    self.m.data_mut(),
                    self.v.data_mut(),
                );
            }
        }
        self.grads.data_mut().fill(0.0);
        Ok(())
    }

    /// Sums the gradients over TP (SP norm partials) and DP, as the optimizer step would.
    fn reduce_for_export(&mut self) -> Result<(), ExecError> {
        let comm = self.ctx.comm;
        if self.ctx.sp {
            for b in &self.blocks {
                for t in b.tensors.iter().filter(|t| t.tp_replicated) {
                    let r = b.range.start + t.offset..b.range.start + t.offset + t.len();
                    comm.all_reduce(&self.ctx.tp, &mut self.grads.data_mut()[r], ReduceOp::Sum)?;
                }
            }
        }
        comm.all_reduce(&self.dp, self.grads.data_mut(), ReduceOp::Sum)
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
                        self.grads.data()[b.range.start + t.offset + i],
                    ));
                }
            }
        }
        out
    }

    /// Every parameter element with its global tensor name and index.
    fn export(&mut self) -> Result<Vec<(String, usize, f32)>, ExecError> {
        let total = layout_len(&self.blocks);
        let full: Vec<f32> = if self.zero >= 3 {
            let mut out = vec![0.0; total];
            self.ctx.comm.gather_range(
                &self.dp,
                self.shard.start,
                self.params.data(),
                0..total,
                &mut out,
            )?;
            out
        } else {
            self.params.data().to_vec()
        };
        let mut out = Vec::with_capacity(total);
        for b in &self.blocks {
            for t in &b.tensors {
                for i in 0..t.len() {
                    let (s, gi) = t.global_of(i);
                    out.push((s.name.clone(), gi, full[b.range.start + t.offset + i]));
                }
            }
        }
        Ok(out)
    }
}
