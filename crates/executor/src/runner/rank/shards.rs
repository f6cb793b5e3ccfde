//! The rank's ZeRO machinery (see [`crate::runner::zero`]): block parameters gathered under
//! ZeRO-3, gradient buckets reduce-scattered into the shard, and the optimizer step.

use super::state::Rank;
use crate::backend::ops::*;
use crate::backend::ReduceOp;
use crate::backend::{Backend, DeviceCollectives, DeviceTensor, View, ViewMut};
use crate::error::ExecError;
use crate::layers::blocks::layout_len;
use crate::layers::blocks::{BlockKind, DENSE_SPACE, EXPERT_SPACE};
use crate::layers::embedding_group::GradShard;
use crate::runner::zero::BlockHandles;
use crate::runner::zero::Handle;
use crate::tracker::Category;
use std::rc::Rc;

impl<'a, B: Backend> Rank<'a, B> {
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
    pub(super) fn gather_unit(&self, bi: usize) -> usize {
        match self.blocks[bi].kind {
            BlockKind::Adapters(_) | BlockKind::FrozenExperts(_) => bi.saturating_sub(1),
            _ => bi,
        }
    }

    /// The parameters of block `bi` and of its experts block (MoE layers), gathered under
    /// ZeRO-3.
    pub(super) fn block_handles(
        &mut self,
        bi: usize,
    ) -> Result<BlockHandles<B::Tensor>, ExecError> {
        let h = self.handle(bi)?;
        let e = self.handle_at(self.experts_of(bi))?;
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
                ctx.router_bias.update(ctx.ops, ctx.comm, &g, rate)?;
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
                    let dp_cp = (!whole).then_some(g);
                    t.sync_grads(
                        ops,
                        comm,
                        GradShard {
                            grads: &mut *grads,
                            valid,
                            base,
                            dp_cp,
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
                Some(w) => ops.adam(
                    &adam,
                    self.step,
                    AdamState {
                        p: ViewMut::all(w),
                        g: gs,
                        m,
                        v,
                        weight_copy: Some(pv),
                    },
                )?,
                None => ops.adam(
                    &adam,
                    self.step,
                    AdamState {
                        p: pv,
                        g: gs,
                        m,
                        v,
                        weight_copy: None,
                    },
                )?,
            }
            if sharded {
                comm.all_gather_in_place(g, params, sh.clone())?;
            }
            ops.fill(grads, 0.0)?;
        }
        Ok(())
    }
}
