//! One rank's step loop: its action list played for a number of steps, with gradient
//! accumulation over microbatches, activation recomputation, split backward (I then W), the
//! pipeline mailbox (chunk outputs and input gradients waiting to be sent or consumed), and
//! the rank's measurements. [`Rank`](state::Rank) holds the state; each concern's methods
//! are in a file of their own.

mod backward;
mod buckets;
mod export;
mod forward;
pub(super) mod output;
mod pipeline;
mod shards;
mod state;
mod step;

pub(super) use output::RankOutput;

use super::options::RunOptions;
use super::zero;
use crate::backend::{Backend, Device, DeviceCollectives};
use crate::error::ExecError;
use crate::layers::blocks::{DENSE_SPACE, EXPERT_SPACE, FROZEN_EXPERT_SPACE, FROZEN_SPACE};
use crate::layers::embedding_group::{self, SharedWeight};
use crate::layers::params::rank_layout;
use crate::layers::Ctx;
use crate::plan::Action;
use crate::plan::{Plan, RankPlan};
use crate::run_report::{PhaseTimes, RankReport};
use crate::trace::RankTrace;
use crate::traced_comm::TracedComm;
use crate::tracker::Category;
use state::Rank;
use std::collections::{HashMap, VecDeque};
use step::retime_on_events;

/// Plays rank `rp` of `plan` for `opts.steps` steps on device `ops` and collectives `comm`.
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
