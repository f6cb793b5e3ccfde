//! A rank's start: its process groups, layout, parameter spaces (initialised and sharded), the
//! pipeline receive buffer, the embedding group's shared weights and the gradient buckets.

use super::state::Rank;
use crate::backend::{Backend, DeviceCollectives, ProcessGroup};
use crate::error::ExecError;
use crate::layers::blocks::{
    BlockLayout, DENSE_SPACE, EXPERT_SPACE, FROZEN_EXPERT_SPACE, FROZEN_SPACE,
};
use crate::layers::embedding_group::{self, SharedWeight};
use crate::layers::params::rank_layout;
use crate::layers::Ctx;
use crate::runner::options::RunOptions;
use crate::runner::zero;
use crate::tracker::Category;
use parsim_plan::plan::{Plan, RankPlan};
use parsim_plan::GroupKind;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;

/// The range of `blocks` each of `stages` holds (blocks of a stage are contiguous).
fn stage_ranges(blocks: &[BlockLayout], stages: &[u32]) -> HashMap<u32, Range<usize>> {
    let mut stage_blocks = HashMap::new();
    for &s in stages {
        let idx: Vec<usize> = (0..blocks.len())
            .filter(|&i| blocks[i].stage == s)
            .collect();
        let r = match (idx.first(), idx.last()) {
            (Some(&a), Some(&b)) => a..b + 1,
            _ => 0..0,
        };
        stage_blocks.insert(s, r);
    }
    stage_blocks
}

impl<'a, B: Backend> Rank<'a, B> {
    /// Rank `rp` of `plan` with its context `ctx` and DP x CP group `dp_cp` (the dense
    /// parameters' replicas).
    pub(super) fn new(
        plan: &'a Plan,
        rp: &'a RankPlan,
        mut ctx: Ctx<'a, B>,
        dp_cp: B::Group,
        opts: &RunOptions,
    ) -> Result<Rank<'a, B>, ExecError> {
        let comm = ctx.comm;
        let ep = comm.group(rp.groups.get(GroupKind::Ep))?;
        let ep_rank = ep.index() as u32;
        if plan.model.moe.is_some() {
            ctx.ep = Some(ep);
            ctx.etp = comm.group(rp.groups.get(GroupKind::ExpertTp))?;
        }
        let blocks = rank_layout(plan, rp, ep_rank);
        let stage_blocks = stage_ranges(&blocks, &rp.stages);
        let edp = comm.group(rp.groups.get(GroupKind::ExpertDp))?;
        let groups = [dp_cp.clone(), edp.clone(), dp_cp, edp];
        let space = |sp: usize| {
            let g = &groups[sp];
            zero::init_space::<B>(ctx.ops, plan, &blocks, g, sp, &opts.perturb, opts.precision)
        };
        let (d, e, f, fe) = (
            space(DENSE_SPACE)?,
            space(EXPERT_SPACE)?,
            space(FROZEN_SPACE)?,
            space(FROZEN_EXPERT_SPACE)?,
        );
        let recv_buf = if plan.parallel.pp > 1 {
            Some(ctx.zeros(Category::Buffers, &[ctx.n_sp, plan.model.hidden])?)
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
            zero: plan.parallel.zero,
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
        Ok(rank)
    }
}
