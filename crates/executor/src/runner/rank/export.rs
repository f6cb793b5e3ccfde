//! Test and finite-difference export: every parameter (or gradient) element of a rank with
//! its global tensor name and index (merged into global tensors by [`parsim_plan::pieces`]).

use super::output::Element;
use super::state::Rank;
use crate::backend::ReduceOp;
use crate::backend::{Backend, Device, DeviceCollectives, View, ViewMut};
use crate::error::ExecError;
use crate::layers::blocks::layout_len;
use crate::layers::blocks::{FROZEN_EXPERT_SPACE, FROZEN_SPACE, SPACES};
use crate::tracker::Category;

impl<'a, B: Backend> Rank<'a, B> {
    /// Sums the gradients over TP (SP norm partials) and DP (expert DP for the experts), as
    /// the optimizer step would.
    pub(super) fn reduce_for_export(&mut self) -> Result<(), ExecError> {
        if self.ctx.sp {
            self.reduce_sp_norms()?;
        }
        for sp in self.spaces() {
            self.ctx.comm.all_reduce(
                &self.groups[sp],
                ViewMut::all(&mut self.grads[sp]),
                ReduceOp::Sum,
            )?;
        }
        Ok(())
    }

    pub(super) fn export_grads(&self) -> Result<Vec<Element>, ExecError> {
        // LoRA's frozen weights have no gradients (an empty buffer: not labelled).
        let full = [
            self.ctx.ops.download(View::all(&self.grads[0]))?,
            self.ctx.ops.download(View::all(&self.grads[1]))?,
            Vec::new(),
            Vec::new(),
        ];
        Ok(self.label(&full))
    }

    /// Every parameter element with its global tensor name and index.
    pub(super) fn export(&mut self) -> Result<Vec<Element>, ExecError> {
        let mut full: [Vec<f32>; SPACES] = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        // LoRA's frozen base weights and frozen experts (sharded under ZeRO-3 over DP and
        // expert DP).
        for sp in [FROZEN_SPACE, FROZEN_EXPERT_SPACE] {
            let sharded = self.zero >= 3 && layout_len(&self.blocks, sp) > 0;
            full[sp] = self.download_whole(sp, &self.params[sp], sharded, false)?;
        }
        for sp in self.spaces() {
            full[sp] = match self.master[sp].as_ref() {
                // Mixed precision: the fp32 master weights are the parameters.
                Some(w) => self.download_whole(sp, w, self.zero >= 1, true)?,
                None => self.download_whole(sp, &self.params[sp], self.zero >= 3, false)?,
            };
        }
        Ok(self.label(&full))
    }

    /// Space `sp`'s flat buffer `source` downloaded whole: all-gathered over the space's group
    /// first when the rank holds only its shard (`sharded`), in fp32 or the activation dtype.
    pub(super) fn download_whole(
        &self,
        sp: usize,
        source: &B::Tensor,
        sharded: bool,
        fp32: bool,
    ) -> Result<Vec<f32>, ExecError> {
        if !sharded {
            return self.ctx.ops.download(View::all(source));
        }
        let total = layout_len(&self.blocks, sp);
        let mut out = if fp32 {
            self.ctx.zeros_f32(Category::Buffers, &[total])?
        } else {
            self.ctx.zeros(Category::Buffers, &[total])?
        };
        self.ctx.comm.gather_range(
            &self.groups[sp],
            self.shards[sp].start,
            View::all(source),
            0..total,
            ViewMut::all(&mut out),
        )?;
        self.ctx.ops.download(View::all(&out))
    }

    /// Each element of the full (unsharded) parameter spaces with its global tensor name and
    /// index (blocks of a space given empty are left out).
    pub(super) fn label(&self, full: &[Vec<f32>; SPACES]) -> Vec<Element> {
        let mut out = Vec::new();
        for b in self.blocks.iter().filter(|b| !full[b.space].is_empty()) {
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
        out
    }
}
