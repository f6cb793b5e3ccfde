//! The decoder-only transformer on one rank, Megatron-style (Shoeybi et al. 2019): column-
//! parallel QKV and fc1, row-parallel output projection and fc2, vocab-parallel embedding,
//! output layer and cross-entropy; with sequence parallelism (Korthikanti et al. 2022) the
//! norms and residuals run on sequence shards, the column-parallel input is all-gathered
//! (forward, and again in backward for the weight gradient, since only the shard is saved) and
//! the row-parallel output reduce-scattered; the reverse in backward.
//!
//! Backward is split as zero-bubble schedules split it (Qi et al. 2024): `*_bwd` computes the
//! input gradient and returns [`WTask<B>`]s, the weight-gradient work, run at once for a full
//! backward or later for a W action.

pub mod bias;
pub mod blocks;
pub mod cp;
pub mod data;
pub mod dropout;
pub mod embedding_group;
pub mod ends;
pub mod layer;
pub mod lora;
pub mod mla;
pub mod moe;
pub mod moe_etp;
pub mod moe_lora;
pub mod moe_seq;
pub mod mtp;
pub mod params;
pub mod positions;
pub mod router_bias;
pub mod shared;

use crate::backend::{
    Backend, DType, Device, DeviceCollectives, DeviceTensor, ProcessGroup, ReduceOp, TensorOps,
    View, ViewMut,
};
use crate::error::ExecError;
use crate::plan::{Plan, RankPlan, Recompute};
use crate::traced_comm::TracedComm;
use crate::tracker::Category;
use blocks::RankDims;

/// A zero-filled fp32 tensor on `ops`' device.
#[track_caller]
pub fn zeros<B: Backend>(
    ops: &B::Device,
    cat: Category,
    shape: &[usize],
) -> Result<B::Tensor, ExecError> {
    ops.alloc(cat, DType::F32, shape)
}

/// What one rank needs to run model code on backend `B`.
pub struct Ctx<'a, B: Backend> {
    pub plan: &'a Plan,
    pub rd: RankDims,
    /// The rank's device: allocation, memory tracker, tensor ops.
    pub ops: B::Device,
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
    pub cp: Option<cp::CpCtx<B>>,
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
    pub moe_load: crate::run_report::MoeLoad,
    /// The MoE layers' selection-only expert biases (DeepSeek-V3), when the router has them.
    pub router_bias: router_bias::RouterBias,
    /// Optimizer steps taken (the dropout mask's step) and the rank's data-parallel index
    /// (which samples its microbatches hold): the coordinates of [`dropout`].
    pub step: u32,
    pub dp_rank: u32,
}

impl<'a, B: Backend> Ctx<'a, B> {
    /// `cp` is this rank's context-parallel group (a group of one without CP).
    pub fn new(
        plan: &'a Plan,
        ops: B::Device,
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
        let cp = (c > 1).then(|| cp::CpCtx::new(cp, cp_comm, m.seq));
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
            moe_load: crate::run_report::MoeLoad::default(),
            router_bias: router_bias::RouterBias::default(),
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
        zeros::<B>(&self.ops, cat, shape)
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

/// Weight-gradient work left by an input-gradient pass.
pub enum WTask<B: Backend> {
    /// dW += dY^T X for the block tensor `tensor` [o, i]; X is gathered over SP first when
    /// `gather_x` (only its sequence shard was saved), and so is dY when `dy_shard` (a held
    /// row-parallel task keeps only its shard of the all-gathered output gradient).
    Linear {
        tensor: usize,
        x: B::Tensor,
        dy: B::Tensor,
        i: usize,
        o: usize,
        gather_x: bool,
        /// dY is the SP all-gather of every rank's shard (a row-parallel output gradient).
        dy_gathered: bool,
        dy_shard: bool,
    },
    /// Norm gain (and bias) gradient from the saved input and the output gradient.
    Norm {
        tensor: usize,
        x: B::Tensor,
        dy: B::Tensor,
    },
    /// Embedding rows: dE[id - lo] += dY[t] (dY gathered over SP first when `dy_shard`); with
    /// learned positions also the rows of the positions `shift` ahead ([`positions`]).
    Embedding {
        tokens: Vec<u32>,
        dy: B::Tensor,
        dy_shard: bool,
        shift: usize,
    },
    /// A gradient already computed (a norm's, when its task is held for a W action: the
    /// norm's input and output gradient need not wait).
    Ready { tensor: usize, grad: B::Tensor },
    /// A LoRA adapter's gradient, computed: added to tensor `tensor` of the layer's adapters
    /// block (the layer's own block is frozen).
    Adapter { tensor: usize, grad: B::Tensor },
    /// A gradient already computed for tensor `tensor` of an MoE layer's experts block (a
    /// routed expert's bias).
    ExpertReady { tensor: usize, grad: B::Tensor },
    /// dW += dY^T X for tensor `tensor` [o, i] of an MoE layer's experts block (rows: those
    /// the expert received); the caller runs it against that block.
    Expert {
        tensor: usize,
        x: B::Tensor,
        dy: B::Tensor,
        i: usize,
        o: usize,
    },
}

/// Where a backward pass sends its weight-gradient tasks: run at once, or held.
pub type Sink<'s, B> = dyn FnMut(&mut Ctx<B>, WTask<B>) -> Result<(), ExecError> + 's;

impl<B: Backend> WTask<B> {
    /// Keeps the task's tensors as activations while it waits for its W action; a norm's
    /// (small) gradient is computed now, so its input and output gradient are freed.
    pub fn hold(self, ctx: &Ctx<B>, layout: &blocks::BlockLayout) -> Result<WTask<B>, ExecError> {
        let a = Category::Activations;
        Ok(match self {
            WTask::Norm { tensor, x, dy } => {
                let t = &layout.tensors[tensor];
                let mut grad = ctx.zeros(a, &[t.len()])?;
                let m = &ctx.plan.model;
                ctx.ops
                    .norm_wgrad(m.norm, &x, &dy, m.norm_eps, ViewMut::all(&mut grad))?;
                WTask::Ready { tensor, grad }
            }
            WTask::Ready { tensor, grad } => WTask::Ready { tensor, grad },
            WTask::Adapter { tensor, grad } => WTask::Adapter {
                tensor,
                grad: ctx.ops.recat(grad, a),
            },
            WTask::ExpertReady { tensor, grad } => WTask::ExpertReady {
                tensor,
                grad: ctx.ops.recat(grad, a),
            },
            WTask::Expert {
                tensor,
                x,
                dy,
                i,
                o,
            } => WTask::Expert {
                tensor,
                x: ctx.ops.recat(x, a),
                dy: ctx.ops.recat(dy, a),
                i,
                o,
            },
            WTask::Linear {
                tensor,
                x,
                dy,
                i,
                o,
                gather_x,
                dy_gathered,
                dy_shard,
            } => {
                // A row-parallel output gradient was all-gathered from sequence shards: keep
                // this rank's shard only and gather it again in W, as the input is.
                let shard = ctx.sp && dy_gathered && !dy_shard;
                WTask::Linear {
                    tensor,
                    x: ctx.ops.recat(x, a),
                    dy: if shard {
                        ctx.own_shard(&dy)?
                    } else {
                        ctx.ops.recat(dy, a)
                    },
                    i,
                    o,
                    gather_x,
                    dy_gathered,
                    dy_shard: dy_shard || shard,
                }
            }
            WTask::Embedding {
                tokens,
                dy,
                dy_shard,
                shift,
            } => {
                let shard = ctx.sp && !dy_shard;
                WTask::Embedding {
                    shift,
                    tokens,
                    dy: if shard {
                        ctx.own_shard(&dy)?
                    } else {
                        ctx.ops.recat(dy, a)
                    },
                    dy_shard: dy_shard || shard,
                }
            }
        })
    }

    /// True for a LoRA adapter's gradient (it goes to the layer's adapters block).
    pub fn is_adapter(&self) -> bool {
        matches!(self, WTask::Adapter { .. })
    }

    /// True for a task of an MoE layer's experts block.
    pub fn is_expert(&self) -> bool {
        matches!(self, WTask::Expert { .. } | WTask::ExpertReady { .. })
    }

    /// Accumulates into `grad`, the block's gradient (block-local offsets from `layout`; for
    /// [`WTask::Expert`], the experts block's).
    pub fn run(
        self,
        ctx: &mut Ctx<B>,
        layout: &blocks::BlockLayout,
        mut grad: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError> {
        let eps = ctx.plan.model.norm_eps;
        let norm = ctx.plan.model.norm;
        match self {
            WTask::Linear {
                tensor,
                x,
                dy,
                i,
                o,
                gather_x,
                dy_shard,
                ..
            } => {
                let r = layout.tensors[tensor].range();
                let n = ctx.n;
                let dy = if dy_shard { ctx.expand_grad(&dy)? } else { dy };
                if gather_x && ctx.sp {
                    ctx.with_gathered(&x, |c, xg| {
                        c.ops.linear_wgrad(&dy, xg, (n, i, o), grad.sub(r))
                    })?;
                } else {
                    ctx.ops.linear_wgrad(&dy, &x, (n, i, o), grad.sub(r))?;
                }
            }
            WTask::Norm { tensor, x, dy } => {
                let r = layout.tensors[tensor].range();
                ctx.ops.norm_wgrad(norm, &x, &dy, eps, grad.sub(r))?;
            }
            WTask::Expert {
                tensor,
                x,
                dy,
                i,
                o,
            } => {
                let r = layout.tensors[tensor].range();
                let rows = x.len() / i.max(1);
                ctx.ops.linear_wgrad(&dy, &x, (rows, i, o), grad.sub(r))?;
            }
            WTask::Ready {
                tensor,
                grad: ready,
            }
            | WTask::Adapter {
                tensor,
                grad: ready,
            }
            | WTask::ExpertReady {
                tensor,
                grad: ready,
            } => {
                let r = layout.tensors[tensor].range();
                ctx.ops.axpy(1.0, View::all(&ready), grad.sub(r))?;
            }
            WTask::Embedding {
                tokens,
                dy,
                dy_shard,
                shift,
            } => {
                let dy = if dy_shard { ctx.expand_grad(&dy)? } else { dy };
                let r = layout.tensors[0].range();
                let lo = ctx.rd.tp_rank * ctx.rd.v_r;
                ctx.ops
                    .embedding_scatter_add(&dy, &tokens, lo, grad.sub(r))?;
                positions::scatter_grad(ctx, layout, &dy, grad, shift)?;
            }
        }
        Ok(())
    }
}
