//! The weight-gradient work a backward pass leaves ([`WTask`]) and where it goes ([`Sink`]).

use super::blocks::BlockLayout;
use super::ctx::Ctx;
use super::positions;
use crate::backend::ops::*;
use crate::backend::{Backend, Device, DeviceTensor, View, ViewMut};
use crate::error::ExecError;
use crate::tracker::Category;

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
    /// learned positions also the rows of the positions `shift` ahead ([`super::positions`]).
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
    pub fn hold(self, ctx: &Ctx<B>, layout: &BlockLayout) -> Result<WTask<B>, ExecError> {
        let a = Category::Activations;
        Ok(match self {
            WTask::Norm { tensor, x, dy } => {
                let t = &layout.tensors[tensor];
                let mut grad = ctx.zeros(a, &[t.len()])?;
                let m = &ctx.plan.model;
                ctx.ops
                    .norm_wgrad(NormSpec::of(m), &x, &dy, ViewMut::all(&mut grad))?;
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
        layout: &BlockLayout,
        mut grad: ViewMut<'_, B::Tensor>,
    ) -> Result<(), ExecError> {
        let spec = NormSpec::of(&ctx.plan.model);
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
                ctx.ops.norm_wgrad(spec, &x, &dy, grad.sub(r))?;
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
