//! ZeRO over a rank's flat parameter buffers (Rajbhandari et al. 2020), as Megatron's
//! distributed optimizer shards them: sharding of each space (dense, experts) over its group,
//! the ZeRO-3 gather cache, the gradient buckets of ZeRO 2/3, and the optimizer step per stage.
//!
//! The rank's parameters are one flat buffer split into `dp` contiguous shards of
//! ceil(P / dp) elements.
//! - 0: full gradients, all-reduced over DP at the step; Adam on every parameter.
//! - 1: full gradients, reduce-scattered at the step; Adam on the shard; updated shards
//!   all-gathered.
//! - 2: as 1, but each block's gradients are reduce-scattered into the shard as soon as they
//!   are computed (one block-sized bucket at a time), so only the shard is kept.
//! - 3: as 2, and the parameters too are kept as a shard: a block is all-gathered before use
//!   and freed after; in forward two gather units are live at a time (the one in use and
//!   the next, as a prefetch would hold them; a LoRA layer's adapters go with its frozen
//!   weights, frozen experts with their adapters), in backward the one in use and its
//!   gradient bucket.
//!
//! Mixture-of-experts models keep their experts in a second flat buffer (an expert *space*),
//! as Megatron keeps expert parameters apart: everything above applies to it with the
//! expert-data-parallel group (the ranks holding the same experts) in place of DP.

use super::rank::Rank;
use crate::backend::{
    flat_shard, Backend, DType, Device, DeviceCollectives, DeviceTensor, ProcessGroup, ReduceOp,
    TensorOps, View, ViewMut,
};
use crate::error::ExecError;
use crate::layers::blocks::{
    init_range, is_frozen_space, layout_len, BlockKind, BlockLayout, DENSE_SPACE, EXPERT_SPACE,
    SPACES,
};
use crate::layers::embedding_group::GradShard;
use crate::plan::{Plan, Precision};
use crate::tracker::Category;
use std::ops::Range;
use std::rc::Rc;

/// One space's state on a rank.
pub(super) struct Space<T> {
    /// This rank's shard of the flat buffer.
    pub(super) shard: Range<usize>,
    /// The parameters the model reads (whole, or the shard under ZeRO-3): fp32, or the bf16
    /// weight copy in mixed precision.
    pub(super) params: T,
    /// Mixed precision: the fp32 master weights, kept with the optimizer states (whole under
    /// ZeRO-0, else the shard).
    pub(super) master: Option<T>,
    /// fp32 gradients (whole, or the shard under ZeRO 2/3).
    pub(super) grads: T,
    /// Adam moments (whole under ZeRO-0, else the shard).
    pub(super) m: T,
    pub(super) v: T,
}

/// Initialises space `sp` of `blocks` for a member of `group` (its ZeRO group), with the
/// finite-difference perturbations applied.
pub(super) fn init_space<B: Backend>(
    ops: &B::Device,
    plan: &Plan,
    blocks: &[BlockLayout],
    g: &B::Group,
    sp: usize,
    perturb: &[(String, usize, f32)],
    precision: Precision,
) -> Result<Space<B::Tensor>, ExecError> {
    let zero = plan.parallel.zero;
    let total = layout_len(blocks, sp);
    let shard = flat_shard(total, g.size(), g.index());
    // The initial values of a range, made on the host (the seeded generator) and uploaded.
    let values = |range: Range<usize>| {
        let mut data = vec![0.0f32; range.len()];
        init_range(plan.seed, blocks, sp, range.clone(), &mut data);
        for (name, gi, delta) in perturb {
            // A tied output weight aliases the embedding's table: perturb each element once.
            let mut done = std::collections::HashSet::new();
            for b in blocks.iter().filter(|b| b.space == sp) {
                for t in &b.tensors {
                    for i in 0..t.len() {
                        let (s, g) = t.global_of(i);
                        let flat = b.range.start + t.offset + i;
                        if &s.name == name && g == *gi && range.contains(&flat) && done.insert(flat)
                        {
                            data[flat - range.start] += delta;
                        }
                    }
                }
            }
        }
        data
    };
    let prange = if zero >= 3 { shard.clone() } else { 0..total };
    let orange = if zero >= 1 { shard.clone() } else { 0..total };
    let dtype = precision.compute_dtype();
    let params = ops.upload(Category::Weights, dtype, &[prange.len()], &values(prange))?;
    // LoRA's frozen base weights: parameters only.
    let frozen = is_frozen_space(sp);
    let master = match precision {
        _ if frozen => None,
        Precision::Fp32 => None,
        Precision::Bf16 => Some(ops.upload(
            Category::Optimizer,
            DType::F32,
            &[orange.len()],
            &values(orange.clone()),
        )?),
    };
    let glen = if zero >= 2 { shard.len() } else { total };
    let (glen, olen) = if frozen { (0, 0) } else { (glen, orange.len()) };
    Ok(Space {
        shard,
        params,
        master,
        grads: ops.alloc(Category::Gradients, DType::F32, &[glen])?,
        m: ops.alloc(Category::Optimizer, DType::F32, &[olen])?,
        v: ops.alloc(Category::Optimizer, DType::F32, &[olen])?,
    })
}

/// A block's parameters and its experts block's (index, parameters).
pub(super) type BlockHandles<T> = (Handle<T>, Option<(usize, Handle<T>)>);

pub(super) enum Handle<T> {
    Flat(usize, Range<usize>),
    Gathered(Rc<T>),
}

pub(super) fn params_of<'p, T: crate::backend::DeviceTensor>(
    params: &'p [T; SPACES],
    h: &'p Handle<T>,
) -> View<'p, T> {
    match h {
        Handle::Flat(space, r) => View {
            tensor: &params[*space],
            range: r.clone(),
        },
        Handle::Gathered(t) => View::all(t),
    }
}

impl<B: Backend> Rank<'_, B> {
    /// The parameters of block `bi` (gathering them over its space's group under ZeRO-3).
    pub(super) fn handle(&mut self, bi: usize) -> Result<Handle<B::Tensor>, ExecError> {
        let r = self.blocks[bi].range.clone();
        let sp = self.blocks[bi].space;
        if self.zero < 3 {
            return Ok(Handle::Flat(sp, r));
        }
        if let Some((_, t)) = self.cache.iter().find(|(b, _)| *b == bi) {
            return Ok(Handle::Gathered(Rc::clone(t)));
        }
        // Two gather units live: the one in use and the one before it, as the engine counts
        // them (a LoRA layer's adapters go with its frozen weights, frozen experts with their
        // adapters).
        let unit = self.gather_unit(bi);
        loop {
            let mut units: Vec<usize> = self
                .cache
                .iter()
                .map(|(b, _)| self.gather_unit(*b))
                .collect();
            units.push(unit);
            units.sort_unstable();
            units.dedup();
            if units.len() <= 2 {
                break;
            }
            self.cache.pop_front();
        }
        let mut t = self.ctx.zeros(Category::Buffers, &[r.len()])?;
        self.ctx.comm.gather_range(
            &self.groups[sp],
            self.shards[sp].start,
            View::all(&self.params[sp]),
            r,
            ViewMut::all(&mut t),
        )?;
        let t = Rc::new(t);
        self.cache.push_back((bi, Rc::clone(&t)));
        Ok(Handle::Gathered(t))
    }

    /// The ZeRO-3 gather unit of block `bi`, named by its first block: a LoRA layer's adapters
    /// block (right after its frozen layer block) and MoE frozen experts (right after their
    /// adapters' experts block) belong to the unit before them.
    fn gather_unit(&self, bi: usize) -> usize {
        match self.blocks[bi].kind {
            BlockKind::Adapters(_) | BlockKind::FrozenExperts(_) => bi.saturating_sub(1),
            _ => bi,
        }
    }

    /// The experts block of the MoE layer of block `bi`, when it is one.
    /// The parameters of block `bi` and of its experts block (MoE layers), gathered under
    /// ZeRO-3.
    pub(super) fn block_handles(
        &mut self,
        bi: usize,
    ) -> Result<BlockHandles<B::Tensor>, ExecError> {
        let h = self.handle(bi)?;
        let e = match self.experts_of(bi) {
            Some(ei) => Some((ei, self.handle(ei)?)),
            None => None,
        };
        Ok((h, e))
    }

    /// ZeRO-2/3: sums a block's gradient bucket over TP where SP split the norms' tokens, and
    /// reduce-scatters it over its space's group (DP or expert DP) into this rank's shard.
    pub(super) fn flush_bucket(
        &mut self,
        bi: usize,
        mut bucket: B::Tensor,
    ) -> Result<(), ExecError> {
        let l = &self.blocks[bi];
        if self.ctx.sp {
            for t in l.tensors.iter().filter(|t| t.tp_replicated) {
                self.ctx.comm.all_reduce(
                    &self.ctx.tp,
                    ViewMut::all(&mut bucket).sub(t.range()),
                    ReduceOp::Sum,
                )?;
            }
        }
        let sp = l.space;
        self.ctx.comm.reduce_scatter_range(
            &self.groups[sp],
            l.range.start,
            View::all(&bucket),
            self.shards[sp].clone(),
            ViewMut::all(&mut self.grads[sp]),
        )?;
        Ok(())
    }

    /// Sums the SP norm partials of the dense gradients over TP.
    pub(super) fn reduce_sp_norms(&mut self) -> Result<(), ExecError> {
        let comm = self.ctx.comm;
        for b in self.blocks.iter().filter(|b| b.space == DENSE_SPACE) {
            for t in b.tensors.iter().filter(|t| t.tp_replicated) {
                let r = b.range.start + t.offset..b.range.start + t.offset + t.len();
                comm.all_reduce(
                    &self.ctx.tp,
                    ViewMut {
                        tensor: &mut self.grads[DENSE_SPACE],
                        range: r,
                    },
                    ReduceOp::Sum,
                )?;
            }
        }
        Ok(())
    }

    /// The spaces that hold parameters (the same on every member of a space's group).
    pub(super) fn spaces(&self) -> Vec<usize> {
        [DENSE_SPACE, EXPERT_SPACE]
            .into_iter()
            .filter(|&sp| layout_len(&self.blocks, sp) > 0)
            .collect()
    }

    pub(super) fn optimizer_step(&mut self) -> Result<(), ExecError> {
        self.step += 1;
        if let Some(r) = self.plan.model.moe.as_ref().map(|m| m.router) {
            if r.expert_bias {
                let g = self.groups[DENSE_SPACE].clone();
                let ctx = &mut self.ctx;
                let rate = r.bias_update_rate;
                ctx.router_bias.update(&ctx.ops, ctx.comm, &g, rate)?;
            }
        }
        // The gradient buckets reduced during backward, then (as Megatron's
        // `finalize_model_grads`) the sums over TP.
        self.join_buckets()?;
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
            let bucketed = self.bucketed(sp);
            let sh = self.shards[sp].clone();
            let g = &self.groups[sp];
            let (params, grads) = (&mut self.params[sp], &mut self.grads[sp]);
            let (m, v) = (&mut self.m[sp], &mut self.v[sp]);
            let ops = &self.ctx.ops;
            match self.zero {
                _ if bucketed => {}
                0 => {
                    comm.all_reduce(g, ViewMut::all(grads), ReduceOp::Sum)?;
                }
                1 => {
                    comm.reduce_scatter_in_place(g, grads, sh.clone())?;
                }
                _ => {}
            }
            if sp == DENSE_SPACE {
                for t in &self.tied {
                    let whole = self.zero == 0;
                    let base = if self.zero >= 2 { sh.start } else { 0 };
                    let valid = if whole { 0..grads.len() } else { sh.clone() };
                    let dp = (!whole).then_some(g);
                    t.sync_grads(
                        ops,
                        comm,
                        GradShard {
                            grads: &mut *grads,
                            valid,
                            base,
                            dp,
                        },
                    )?;
                }
            }
            // The parameters this rank updates (its shard under ZeRO 1/2, all it holds
            // otherwise) and their gradient.
            let sharded = matches!(self.zero, 1 | 2);
            let upd = if sharded { sh.clone() } else { 0..params.len() };
            let gs = if self.zero == 1 {
                View::all(&*grads).sub(sh.clone())
            } else {
                View::all(&*grads)
            };
            let pv = ViewMut {
                tensor: &mut *params,
                range: upd,
            };
            // Mixed precision: Adam updates the fp32 master weights and writes the bf16 copy.
            match self.master[sp].as_mut() {
                Some(w) => ops.adam(&adam, self.step, ViewMut::all(w), gs, m, v, Some(pv))?,
                None => ops.adam(&adam, self.step, pv, gs, m, v, None)?,
            }
            if sharded {
                comm.all_gather_in_place(g, params, sh.clone())?;
            }
            ops.fill(grads, 0.0)?;
        }
        Ok(())
    }
}
