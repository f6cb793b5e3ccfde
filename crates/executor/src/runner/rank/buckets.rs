//! The rank's ZeRO 0/1 gradient buckets (see [`crate::runner::grad_buckets`]): planned from
//! its layout, issued as its blocks' gradients become final, joined at the step.

use super::state::Rank;
use crate::backend::ProcessGroup;
use crate::backend::{Backend, DeviceCollectives};
use crate::error::ExecError;
use crate::runner::grad_buckets::{Bucket, GradBuckets};

impl<'a, B: Backend> Rank<'a, B> {
    /// The buckets of this rank, when ZeRO 0/1 reduces in buckets during backward: the Plan
    /// asks for it, the gradients are not exported unreduced, and a space's group has more
    /// than one member (spaces without a bucket reduce at the step, a no-op for one member).
    pub(super) fn plan_buckets(&self, export_grads: bool) -> Option<GradBuckets> {
        let params = self.plan.parallel.grad_bucket_params?;
        if self.zero >= 2 || export_grads {
            return None;
        }
        let spaces: Vec<usize> = self
            .spaces()
            .into_iter()
            .filter(|&sp| self.groups[sp].size() > 1)
            .collect();
        if spaces.is_empty() {
            return None;
        }
        Some(GradBuckets::new(
            &self.blocks,
            &self.stage_blocks,
            &spaces,
            params,
            &self.rp.actions,
        ))
    }

    /// Whether space `sp`'s gradient is reduced in buckets during backward.
    pub(super) fn bucketed(&self, sp: usize) -> bool {
        self.buckets.is_some() && self.groups[sp].size() > 1
    }

    /// Block `bi` of stage `stage` has its gradients (its experts' and adapters' included)
    /// for the step, in the stage's final action: the buckets now complete are issued.
    pub(super) fn block_final(&mut self, stage: u32, bi: usize) -> Result<(), ExecError> {
        let index = self.action_index;
        if !self
            .buckets
            .as_ref()
            .is_some_and(|b| b.finalizing(stage, index))
        {
            return Ok(());
        }
        let mut ids = vec![bi];
        ids.extend(self.experts_of(bi));
        ids.extend(self.adapters_of(bi));
        let ready = match self.buckets.as_mut() {
            Some(b) => b.ready(stage, &ids, false),
            None => Vec::new(),
        };
        self.issue(ready)
    }

    /// The end of stage `stage`'s action: in its final action, any bucket still pending.
    pub(super) fn stage_final(&mut self, stage: u32) -> Result<(), ExecError> {
        let index = self.action_index;
        let ready = match self.buckets.as_mut() {
            Some(b) if b.finalizing(stage, index) => b.ready(stage, &[], true),
            _ => Vec::new(),
        };
        self.issue(ready)
    }

    pub(super) fn issue(&mut self, buckets: Vec<Bucket>) -> Result<(), ExecError> {
        let sharded = self.zero == 1;
        for b in buckets {
            self.ctx.comm.reduce_grad_bucket(
                &self.groups[b.space],
                &mut self.grads[b.space],
                b.range,
                sharded,
            )?;
        }
        Ok(())
    }

    /// The optimizer step's wait for every bucket of the step.
    pub(super) fn join_buckets(&mut self) -> Result<(), ExecError> {
        if let Some(b) = self.buckets.as_mut() {
            b.end_step()?;
            self.ctx.comm.join_grad_buckets()?;
        }
        Ok(())
    }
}
