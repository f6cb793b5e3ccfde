//! What one rank needs to run model code: its [`Ctx`] (plan, dimensions, device, collectives,
//! process groups, sequence-parallel buffer, context-parallel and MoE state).

use super::blocks::RankDims;
use super::cp_state::CpCtx;
use super::router_bias::RouterBias;
use crate::backend::ops::*;
use crate::backend::{
    Backend, Device, DeviceCollectives, DeviceTensor, ProcessGroup, ReduceOp, View, ViewMut,
};
use crate::error::ExecError;
use crate::traced_comm::TracedComm;
use crate::traced_ops::TracedOps;
use crate::tracker::Category;
use parsim_plan::plan::{Plan, RankPlan, Recompute};
use parsim_plan::run_report::MoeLoad;
use parsim_plan::DType;

/// A zero-filled fp32 tensor on `ops`' device.
#[track_caller]
pub fn zeros<B: Backend>(
    ops: &TracedOps<B>,
    cat: Category,
    shape: &[usize],
) -> Result<B::Tensor, ExecError> {
    ops.alloc(cat, DType::F32, shape)
}

/// What one rank needs to run model code on backend `B`.
pub struct Ctx<'a, B: Backend> {
    pub plan: &'a Plan,
    pub rd: RankDims,
    /// The rank's device: allocation, memory tracker, tensor ops (timed when profiling ops).
    pub ops: &'a TracedOps<B>,
    /// dtype of activations, activation gradients and weight copies (bf16 in mixed precision).
    pub act_dtype: DType,
    /// The rank's collectives, recorded when tracing (see [`TracedComm`]).
    pub comm: &'a TracedComm<'a, B>,
    pub tp: B::Group,
    /// The expert-TP group: the `rd.et` ranks over which the received expert rows gather (the
    /// TP group itself when expert TP = tp, a block of it below, TP groups of several DP or CP
    /// ranks above).
    pub etp: B::Group,
    pub sp: bool,
    pub recompute: Recompute,
    /// Tokens of a microbatch on this CP rank, and of its sequence-parallel shard.
    pub n: usize,
    pub n_sp: usize,
    /// Positions (within a sequence) of this rank's rows: 0..seq without CP.
    pub positions: Vec<u32>,
    /// Context parallelism (cp > 1).
    pub cp: Option<CpCtx<B>>,
    /// The microbatch being run (tags of CP messages).
    pub mb: u32,
    /// A full recomputation's forward rerun is in progress.
    pub recomputing: bool,
    /// Megatron's global buffer for the SP all-gather of the column-parallel input (n x h).
    pub sp_buf: Option<B::Tensor>,
    /// Expert parallelism: the EP group (MoE models only).
    pub ep: Option<B::Group>,
    /// Sum over the forwards run of each MoE layer's load-balancing loss, and the assignments
    /// the expert capacity dropped.
    pub moe_aux_loss: f64,
    pub moe_dropped: u64,
    /// The rows the routing sent this rank's experts, and the assignments it routed.
    pub moe_load: MoeLoad,
    /// The MoE layers' selection-only expert biases (DeepSeek-V3), when the router has them.
    pub router_bias: RouterBias,
    /// Optimizer steps taken (the dropout mask's step) and the rank's data-parallel index
    /// (which samples its microbatches hold): the coordinates of [`super::dropout`].
    pub step: u32,
    pub dp_rank: u32,
}

impl<'a, B: Backend> Ctx<'a, B> {
    /// `cp` is this rank's context-parallel group (a group of one without CP).
    pub fn new(
        plan: &'a Plan,
        ops: &'a TracedOps<B>,
        comm: &'a TracedComm<'a, B>,
        tp: B::Group,
        rp: &RankPlan,
        cp: B::Group,
        act_dtype: DType,
    ) -> Result<Ctx<'a, B>, ExecError> {
        let rd = RankDims::new(plan, rp);
        let sp = plan.parallel.sp && plan.parallel.tp > 1;
        let m = &plan.model;
        let c = cp.size();
        let cp_comm = plan.parallel.cp_comm;
        let positions = cp_comm.positions(m.seq, c, cp.index());
        let cp = (c > 1).then(|| CpCtx::new(cp, cp_comm, m.seq));
        let n = plan.model.tokens() / c;
        let sp_buf = if sp {
            Some(ops.alloc(Category::Buffers, act_dtype, &[n, rd.h])?)
        } else {
            None
        };
        Ok(Ctx {
            plan,
            rd,
            comm,
            etp: tp.clone(),
            tp,
            sp,
            recompute: plan.parallel.recompute,
            n,
            n_sp: if sp { n / rd.t } else { n },
            positions,
            cp,
            mb: 0,
            recomputing: false,
            sp_buf,
            ops,
            act_dtype,
            ep: None,
            moe_aux_loss: 0.0,
            moe_dropped: 0,
            moe_load: MoeLoad::default(),
            router_bias: RouterBias::default(),
            step: 0,
            dp_rank: 0,
        })
    }

    /// A zero-filled tensor of the activation dtype on the rank's device.
    #[track_caller]
    pub fn zeros(&self, cat: Category, shape: &[usize]) -> Result<B::Tensor, ExecError> {
        self.ops.alloc(cat, self.act_dtype, shape)
    }

    /// A zero-filled fp32 tensor whatever the recipe (statistics, the loss's softmax,
    /// gradient buckets).
    #[track_caller]
    pub fn zeros_f32(&self, cat: Category, shape: &[usize]) -> Result<B::Tensor, ExecError> {
        zeros::<B>(self.ops, cat, shape)
    }

    /// Gathers a sequence shard [n_sp, h] into the SP buffer (SP only).
    fn gather_into_buf(&mut self, x: &B::Tensor) -> Result<(), ExecError> {
        let buf = self.sp_buf.as_mut().expect("sp buffer");
        self.comm
            .all_gather(&self.tp, View::all(x), ViewMut::all(buf))
    }

    /// Runs `f` on the column-parallel input: the SP all-gather of `x`, or `x` itself.
    pub fn with_gathered<R>(
        &mut self,
        x: &B::Tensor,
        f: impl FnOnce(&mut Self, &B::Tensor) -> Result<R, ExecError>,
    ) -> Result<R, ExecError> {
        if self.sp {
            self.gather_into_buf(x)?;
            let buf = self.sp_buf.take().expect("sp buffer");
            let r = f(self, &buf);
            self.sp_buf = Some(buf);
            r
        } else {
            f(self, x)
        }
    }

    /// A partial sum [n, h] reduced over TP into the SP region: reduce-scatter to [n_sp, h]
    /// with SP, all-reduce otherwise (row-parallel output forward; column-parallel input
    /// gradient backward).
    pub fn reduce_to_region(
        &mut self,
        mut partial: B::Tensor,
        cat: Category,
    ) -> Result<B::Tensor, ExecError> {
        if self.sp {
            let mut out = self.zeros(cat, &[self.n_sp, self.rd.h])?;
            self.comm
                .reduce_scatter(&self.tp, View::all(&partial), ViewMut::all(&mut out))?;
            Ok(out)
        } else {
            self.comm
                .all_reduce(&self.tp, ViewMut::all(&mut partial), ReduceOp::Sum)?;
            Ok(self.ops.recat(partial, cat))
        }
    }

    /// The full-sequence gradient [n, h] of a row-parallel output from its region gradient:
    /// all-gather with SP, a copy otherwise (the gradient is already whole on every TP rank).
    pub fn expand_grad(&mut self, dy: &B::Tensor) -> Result<B::Tensor, ExecError> {
        let mut out = self.zeros(Category::Buffers, &[self.n, self.rd.h])?;
        if self.sp {
            self.comm
                .all_gather(&self.tp, View::all(dy), ViewMut::all(&mut out))?;
        } else {
            self.ops.copy(View::all(dy), ViewMut::all(&mut out))?;
        }
        Ok(out)
    }
}

impl<B: Backend> Ctx<'_, B> {
    /// This TP rank's sequence shard (rows) of a full-sequence tensor [n, c], as an activation.
    pub fn own_shard(&self, full: &B::Tensor) -> Result<B::Tensor, ExecError> {
        let c = full.cols();
        let lo = self.rd.tp_rank * self.n_sp * c;
        let mut out = self.zeros(Category::Activations, &[self.n_sp, c])?;
        self.ops.copy(
            View::all(full).sub(lo..lo + self.n_sp * c),
            ViewMut::all(&mut out),
        )?;
        Ok(out)
    }
}
