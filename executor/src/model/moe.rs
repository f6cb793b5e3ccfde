//! The mixture-of-experts block of an MoE layer (Shazeer et al. 2017; Lepikhin et al. 2020,
//! GShard; Megatron-Core's MoE), replacing the dense MLP after the pre-MLP norm:
//!
//! - **Router**: a replicated linear hidden -> E, softmax over the experts, then top-k (ties go
//!   to the lower expert index). The gates are the chosen softmax probabilities, **not
//!   renormalised** over the k chosen (Switch Transformer and GShard; Megatron with
//!   `--moe-router-pre-softmax`).
//! - **Capacity** (optional, Lepikhin et al. 2020): each expert takes at most
//!   ceil(cf x n x k / E) assignments of a source rank's n tokens; beyond that the
//!   lowest-probability assignments are dropped (Megatron's "probs" policy; ties: the later
//!   token is dropped). A dropped assignment contributes nothing: the residual passes through.
//! - **Dispatch / combine** (expert parallelism): the kept assignments, ordered by expert then
//!   token, go to the rank holding their expert by a variable-size all-to-all over the EP
//!   group (per-expert counts exchanged first); the outputs come back by the reverse
//!   all-to-all and are summed into their tokens weighted by the gates. Backward reverses both.
//! - **Load-balancing loss** (Fedus et al. 2021, eq. 4; Megatron's `aux_loss`): per microbatch
//!   and layer, coeff x E x sum_i f_i P_i, with f_i the fraction of the n k routed slots that
//!   chose expert i (before dropping) and P_i the mean router probability of expert i. The
//!   step reports and differentiates the mean over all microbatches of the step.
//!
//! - **DeepSeek-V3 routers** (`moe.router` not plain): sigmoid or softmax scores, top-k of
//!   score + the selection-only expert bias ([`super::router_bias`]) within the best groups,
//!   gates renormalised over the k chosen when asked.
//! - **Shared experts** (DeepSeek-V2/V3): a dense MLP on every token, its output added to the
//!   routed experts' ([`super::shared`]).
//!
//! - **TP + SP** (expert tensor parallelism = tp): the block runs on the microbatch gathered
//!   over SP; every TP rank routes it identically and runs its slice of each expert, the
//!   partial outputs reduce-scatter into the SP region.
//! - **CP**: the router's decisions are the whole microbatch's ([`super::moe_seq`]): the
//!   load-balancing loss's fractions and the capacity over the whole sequence; each rank then
//!   dispatches its own tokens.

use super::params::BlockLayout;
use super::{Ctx, Sink, WTask};
use crate::backend::{Backend, Device, DeviceTensor, ProcessGroup};
use crate::backend::{DeviceCollectives, ReduceOp, TensorOps, View, ViewMut};
use crate::error::{ExecError, StateError};
use crate::memory::Category;
use crate::plan::{Activation, MoeShape};

pub use crate::backend::{Route, Routing};

/// The router's tensor in an MoE layer's block (after attn_norm, QKV, wo, mlp_norm).
pub const ROUTER: usize = 4;

/// Tensors per routed expert in the experts block: fc1 and fc2, then with linear biases
/// (Megatron's `--add-bias-linear`: each expert's fc1 and fc2 biases) fc1's and fc2's biases.
fn per_expert(m: &crate::plan::ModelShape) -> usize {
    if m.bias_linear {
        4
    } else {
        2
    }
}

/// The experts block's tensors of local expert `j`: (fc1, fc2, biases (fc1's, fc2's)).
fn expert_tensors(m: &crate::plan::ModelShape, j: usize) -> (usize, usize, Option<(usize, usize)>) {
    let t = per_expert(m) * j;
    (t, t + 1, m.bias_linear.then_some((t + 2, t + 3)))
}

/// What an MoE block keeps for backward (besides the norm's input and output).
pub struct MoeSaved<B: Backend> {
    /// Router probabilities [n, E].
    probs: B::Tensor,
    routing: Routing,
    /// Rows sent to each EP member and received from each, and, per source member, the rows
    /// of each local expert.
    send_rows: Vec<usize>,
    recv_rows: Vec<usize>,
    recv_expert_rows: Vec<Vec<usize>>,
    /// Per local expert: its input rows, fc1 output (the activation's input), activation output.
    x: Vec<B::Tensor>,
    u: Vec<B::Tensor>,
    act: Vec<B::Tensor>,
    /// The expert outputs of the kept assignments [routes, h] (for the gates' gradient).
    y: B::Tensor,
    /// The k experts each token chose (DeepSeek-V3 routers only; empty for the plain one).
    chosen: Vec<usize>,
    /// The shared experts' saved tensors.
    shared: Option<super::shared::SharedSaved<B>>,
}

fn moe_of<'c, B: Backend>(ctx: &'c Ctx<B>) -> Result<&'c MoeShape, ExecError> {
    ctx.plan
        .model
        .moe
        .as_ref()
        .ok_or_else(|| ExecError::from(StateError::MoeWithoutShape))
}

fn fc1_width(act: Activation, f: usize) -> usize {
    match act {
        Activation::Swiglu => 2 * f,
        Activation::Gelu => f,
    }
}

/// Row ranges in the received buffer of local expert `j`: (start row, rows) per source.
fn expert_rows(recv_expert_rows: &[Vec<usize>], j: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut base = 0;
    for per in recv_expert_rows {
        let lo = base + per[..j].iter().sum::<usize>();
        out.push((lo, per[j]));
        base += per.iter().sum::<usize>();
    }
    out
}

fn scale(v: &[usize], by: usize) -> Vec<usize> {
    v.iter().map(|x| x * by).collect()
}

/// Sends rows of width `h` (`send_rows` to each EP member) and returns the rows received
/// (`recv_rows` from each) as a new tensor of category `cat`.
fn exchange_rows<B: Backend>(
    ctx: &Ctx<B>,
    ep: &B::Group,
    send: &B::Tensor,
    send_rows: &[usize],
    recv_rows: &[usize],
    h: usize,
    cat: Category,
) -> Result<B::Tensor, ExecError> {
    let mut recv = ctx.zeros(cat, &[recv_rows.iter().sum(), h])?;
    DeviceCollectives::all_to_all_v(
        ctx.comm,
        ep,
        View::all(send),
        &scale(send_rows, h),
        ViewMut::all(&mut recv),
        &scale(recv_rows, h),
    )?;
    Ok(recv)
}

/// Copies row spans between tensors of width `h`: `(from row, to row, rows)` each.
fn copy_spans<B: Backend>(
    ctx: &Ctx<B>,
    src: &B::Tensor,
    dst: &mut B::Tensor,
    h: usize,
    spans: impl Iterator<Item = (usize, usize, usize)>,
) -> Result<(), ExecError> {
    for (from, to, rows) in spans {
        ctx.ops.copy(
            View::all(src).sub(from * h..(from + rows) * h),
            ViewMut::all(dst).sub(to * h..(to + rows) * h),
        )?;
    }
    Ok(())
}

/// The spans of local expert `j` in the received rows, with their rows in the expert's input.
fn gathered_spans(spans: &[(usize, usize)]) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    spans.iter().scan(0, |at, &(lo, rows)| {
        let out = (lo, *at, rows);
        *at += rows;
        Some(out)
    })
}

/// Forward of the MoE block on the normed input `ln2` [n, h] (the router's parameters in
/// `p`/`l`, the rank's experts in `pe`/`le`); returns the combined expert output [n, h].
pub fn moe_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    le: &BlockLayout,
    pe: View<'_, B::Tensor>,
    ln2: &B::Tensor,
) -> Result<(B::Tensor, MoeSaved<B>), ExecError> {
    // Every TP rank routes the whole microbatch (gathered over SP) the same way and runs its
    // slice of every expert it holds; the partial sums reduce into the SP region.
    let (partial, saved) =
        ctx.with_gathered(ln2, |c, xg| moe_fwd_full(c, l, p.clone(), le, pe, xg))?;
    let mut out = ctx.reduce_to_region(partial, Category::Buffers)?;
    // The shared experts' fc2 bias, after the reduction as the dense MLP's.
    super::bias::add(ctx, l, &p, super::bias::Site::Fc2, &mut out)?;
    Ok((out, saved))
}

/// [`moe_fwd`] on the whole microbatch `ln2` [n, h]; returns this TP rank's partial output.
fn moe_fwd_full<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    le: &BlockLayout,
    pe: View<'_, B::Tensor>,
    ln2: &B::Tensor,
) -> Result<(B::Tensor, MoeSaved<B>), ExecError> {
    let moe = moe_of(ctx)?.clone();
    let (n, h) = (ctx.n, ctx.rd.h);
    let e = moe.num_experts;
    let (a, b) = (Category::Activations, Category::Buffers);
    let mut probs = ctx.zeros(a, &[n, e])?;
    ctx.ops
        .linear_fwd(ln2, p.sub(l.tensors[ROUTER].range()), (n, h, e), &mut probs)?;
    let (routing, aux, chosen) =
        super::moe_seq::route_whole_sequence(ctx, &mut probs, moe.top_k, |c, t| {
            route(c, t, &moe, super::dropout::block_layer(l))
        })?;
    if moe.router.expert_bias && !ctx.recomputing {
        ctx.router_bias
            .count(super::dropout::block_layer(l), e, &chosen);
    }
    ctx.moe_aux_loss += aux;
    ctx.moe_dropped += routing.dropped as u64;

    let ep = ctx
        .ep
        .clone()
        .ok_or_else(|| ExecError::from(StateError::MoeWithoutEpGroup))?;
    let members = ep.size();
    let local = e / members;
    // Rows per (destination member, local expert), exchanged first.
    let mut counts = vec![0usize; e];
    for r in &routing.routes {
        counts[r.expert] += 1;
    }
    let got = ctx.comm.all_to_all_counts(&ep, &counts)?;
    let recv_expert_rows: Vec<Vec<usize>> = got.chunks(local).map(|c| c.to_vec()).collect();
    let send_rows: Vec<usize> = counts.chunks(local).map(|c| c.iter().sum()).collect();
    let recv_rows: Vec<usize> = recv_expert_rows.iter().map(|c| c.iter().sum()).collect();

    let tokens: Vec<usize> = routing.routes.iter().map(|r| r.token).collect();
    let mut send = ctx.zeros(b, &[tokens.len(), h])?;
    ctx.ops.gather_rows(ln2, &tokens, &mut send)?;
    let recv = exchange_rows(ctx, &ep, &send, &send_rows, &recv_rows, h, b)?;
    let total_recv = recv.rows();
    drop(send);

    // Expert tensor parallelism: this rank's slice of each expert's intermediate size.
    let f = moe.ffn / ctx.rd.t;
    let w1 = fc1_width(ctx.plan.model.activation, f);
    let act_kind = ctx.plan.model.activation;
    let mut back = ctx.zeros(b, &[total_recv, h])?;
    let (mut xs, mut us, mut acts) = (Vec::new(), Vec::new(), Vec::new());
    for j in 0..local {
        let spans = expert_rows(&recv_expert_rows, j);
        let c: usize = spans.iter().map(|s| s.1).sum();
        let mut x = ctx.zeros(a, &[c, h])?;
        copy_spans(ctx, &recv, &mut x, h, gathered_spans(&spans))?;
        let mut u = ctx.zeros(a, &[c, w1])?;
        let mut act = ctx.zeros(a, &[c, f])?;
        if c > 0 {
            let (t1, t2, biases) = expert_tensors(&ctx.plan.model, j);
            let w_fc1 = pe.sub(le.tensors[t1].range());
            let w_fc2 = pe.sub(le.tensors[t2].range());
            ctx.ops.linear_fwd(&x, w_fc1, (c, h, w1), &mut u)?;
            if let Some((b1, _)) = biases {
                ctx.ops.bias_add(&mut u, pe.sub(le.tensors[b1].range()))?;
            }
            ctx.ops.act_fwd(act_kind, &u, &mut act)?;
            let mut y = ctx.zeros(b, &[c, h])?;
            ctx.ops.linear_fwd(&act, w_fc2, (c, f, h), &mut y)?;
            // fc2's bias once over the TP partial sums (the gates weight it with the output).
            if let (Some((_, b2)), 0) = (biases, ctx.rd.tp_rank) {
                ctx.ops.bias_add(&mut y, pe.sub(le.tensors[b2].range()))?;
            }
            let back_spans = gathered_spans(&spans).map(|(lo, at, rows)| (at, lo, rows));
            copy_spans(ctx, &y, &mut back, h, back_spans)?;
        }
        xs.push(x);
        us.push(u);
        acts.push(act);
    }
    drop(recv);
    let y = exchange_rows(ctx, &ep, &back, &recv_rows, &send_rows, h, a)?;
    drop(back);
    let mut out = ctx.zeros(b, &[n, h])?;
    let gates: Vec<f32> = routing.routes.iter().map(|r| r.gate).collect();
    ctx.ops
        .scatter_add_rows(&y, &tokens, Some(&gates), &mut out)?;
    let shared = super::shared::shared_fwd(ctx, l, p.clone(), ln2, &mut out)?;
    Ok((
        out,
        MoeSaved {
            probs,
            routing,
            send_rows,
            recv_rows,
            recv_expert_rows,
            x: xs,
            u: us,
            act: acts,
            y,
            chosen,
            shared,
        },
    ))
}

/// The router's decisions on its logits `probs` [n, E] (scores in place): the plain router,
/// or DeepSeek-V3's with the expert bias of `layer` (the caller counts the loads).
fn route<B: Backend>(
    ctx: &mut Ctx<B>,
    probs: &mut B::Tensor,
    moe: &MoeShape,
    layer: u32,
) -> Result<(Routing, f64, Vec<usize>), ExecError> {
    if moe.router.is_plain() {
        let (r, aux) = ctx.ops.moe_route(probs, moe)?;
        return Ok((r, aux, Vec::new()));
    }
    let e = moe.num_experts;
    let bias = moe
        .router
        .expert_bias
        .then(|| ctx.router_bias.bias(layer, e).to_vec());
    ctx.ops.moe_route_scored(probs, bias.as_deref(), moe)
}

/// Input gradient of the MoE block: d ln2 [n, h] from the gradient `dy` [n, h] of its output;
/// the router's weight-gradient task (input `ln2`) and the experts' ([`WTask::Expert`]) go to
/// `sink`.
#[allow(clippy::too_many_arguments)]
pub fn moe_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    pe: View<'_, B::Tensor>,
    le: &BlockLayout,
    ln2: B::Tensor,
    s: MoeSaved<B>,
    dy: &B::Tensor,
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let moe = moe_of(ctx)?.clone();
    let (n, h) = (ctx.n, ctx.rd.h);
    let e = moe.num_experts;
    let bcat = Category::Buffers;
    let ep = ctx
        .ep
        .clone()
        .ok_or_else(|| ExecError::from(StateError::MoeWithoutEpGroup))?;
    let MoeSaved {
        probs,
        routing,
        send_rows,
        recv_rows,
        recv_expert_rows,
        x: xs,
        u: us,
        act: acts,
        y,
        chosen,
        shared,
    } = s;
    let routes = &routing.routes;
    super::bias::grad(ctx, l, super::bias::Site::Fc2, dy, sink)?;
    // The whole microbatch's output gradient (gathered over SP).
    let dy = ctx.expand_grad(dy)?;
    // Combine: d y_r = gate_r dy[t]; d gate_r = dy[t] . y_r (y_r this TP rank's partial
    // expert output: the dots sum over TP).
    let mut dprobs = ctx.zeros(bcat, &[n, e])?;
    let mut dsend = ctx.zeros(bcat, &[routes.len(), h])?;
    ctx.ops
        .moe_combine_bwd(&dy, &y, routes, &mut dprobs, &mut dsend)?;
    drop(y);
    if ctx.rd.t > 1 {
        ctx.comm
            .all_reduce(&ctx.tp, ViewMut::all(&mut dprobs), ReduceOp::Sum)?;
    }
    let drecv = exchange_rows(ctx, &ep, &dsend, &send_rows, &recv_rows, h, bcat)?;
    let total_recv = drecv.rows();
    drop(dsend);

    let f = moe.ffn / ctx.rd.t;
    let act_kind = ctx.plan.model.activation;
    let w1 = fc1_width(act_kind, f);
    let mut dback = ctx.zeros(bcat, &[total_recv, h])?;
    for (j, ((x, u), act)) in xs.into_iter().zip(us).zip(acts).enumerate() {
        let spans = expert_rows(&recv_expert_rows, j);
        let c: usize = spans.iter().map(|s| s.1).sum();
        if c == 0 {
            continue;
        }
        let mut dyj = ctx.zeros(bcat, &[c, h])?;
        copy_spans(ctx, &drecv, &mut dyj, h, gathered_spans(&spans))?;
        let (t1, t2, biases) = expert_tensors(&ctx.plan.model, j);
        if let Some((_, b2)) = biases {
            expert_bias_grad(ctx, le, b2, &dyj, sink)?;
        }
        let mut dact = ctx.zeros(bcat, &[c, f])?;
        ctx.ops.linear_dgrad(
            &dyj,
            pe.sub(le.tensors[t2].range()),
            (c, f, h),
            &mut dact,
            false,
        )?;
        sink(
            ctx,
            WTask::Expert {
                tensor: t2,
                x: act,
                dy: dyj,
                i: f,
                o: h,
            },
        )?;
        let mut du = ctx.ops.recat(u, bcat);
        ctx.ops.act_bwd_inplace(act_kind, &mut du, &dact)?;
        drop(dact);
        if let Some((b1, _)) = biases {
            expert_bias_grad(ctx, le, b1, &du, sink)?;
        }
        let mut dx = ctx.zeros(bcat, &[c, h])?;
        ctx.ops.linear_dgrad(
            &du,
            pe.sub(le.tensors[t1].range()),
            (c, h, w1),
            &mut dx,
            false,
        )?;
        sink(
            ctx,
            WTask::Expert {
                tensor: t1,
                x,
                dy: du,
                i: h,
                o: w1,
            },
        )?;
        let back_spans = gathered_spans(&spans).map(|(lo, at, rows)| (at, lo, rows));
        copy_spans(ctx, &dx, &mut dback, h, back_spans)?;
    }
    drop(drecv);
    let dx_routes = exchange_rows(ctx, &ep, &dback, &recv_rows, &send_rows, h, bcat)?;
    drop(dback);
    let mut d_ln2 = ctx.zeros(bcat, &[n, h])?;
    let tokens: Vec<usize> = routes.iter().map(|r| r.token).collect();
    ctx.ops
        .scatter_add_rows(&dx_routes, &tokens, None, &mut d_ln2)?;
    drop(dx_routes);

    // Router: the load-balancing loss adds coeff E f_i / (microbatches of the step x n) to the
    // gradient of every probability of expert i; then the softmax's backward.
    let aux_scale = if moe.aux_loss_coeff > 0.0 {
        let global_tokens = (ctx.plan.global_batch() * ctx.plan.model.seq) as f64;
        moe.aux_loss_coeff as f64 * e as f64 / global_tokens
    } else {
        0.0
    };
    let mut dlogits = dprobs;
    if moe.router.is_plain() {
        ctx.ops
            .moe_router_bwd(&mut dlogits, &probs, &routing.fraction, aux_scale)?;
    } else {
        ctx.ops.moe_router_scored_bwd(
            &mut dlogits,
            &probs,
            &chosen,
            &moe,
            &routing.fraction,
            aux_scale,
        )?;
    }
    drop(probs);
    // Every TP rank holds the same router gradient: its input gradient is added once.
    if ctx.rd.tp_rank == 0 {
        ctx.ops.linear_dgrad(
            &dlogits,
            p.sub(l.tensors[ROUTER].range()),
            (n, h, e),
            &mut d_ln2,
            true,
        )?;
    }
    let sp = ctx.sp;
    match shared {
        None => sink(
            ctx,
            WTask::Linear {
                tensor: ROUTER,
                x: ln2,
                dy: dlogits,
                i: h,
                o: e,
                gather_x: sp,
                dy_gathered: false,
                dy_shard: false,
            },
        )?,
        Some(sh) => {
            // The shared experts' fc1 takes `ln2` for its weight gradient: the router's (E x h,
            // small) is computed now, so that no copy of `ln2` is kept.
            let mut grad = ctx.zeros(bcat, &[e * h])?;
            ctx.with_gathered(&ln2, |c, xg| {
                c.ops
                    .linear_wgrad(&dlogits, xg, (n, h, e), ViewMut::all(&mut grad))
            })?;
            drop(dlogits);
            sink(
                ctx,
                WTask::Ready {
                    tensor: ROUTER,
                    grad,
                },
            )?;
            super::shared::shared_bwd(ctx, l, p.clone(), sh, ln2, dy, &mut d_ln2, sink)?;
        }
    }
    ctx.reduce_to_region(d_ln2, bcat)
}

/// A routed expert's bias gradient: the column sums of `dy` [rows, o] over the rows it
/// received, for tensor `tensor` of the experts block `le` (whole on every TP rank: the rows
/// are the whole microbatch's).
fn expert_bias_grad<B: Backend>(
    ctx: &mut Ctx<B>,
    le: &BlockLayout,
    tensor: usize,
    dy: &B::Tensor,
    sink: &mut Sink<B>,
) -> Result<(), ExecError> {
    let mut grad = ctx.zeros_f32(Category::Buffers, &[le.tensors[tensor].len()])?;
    ctx.ops.bias_grad(dy, ViewMut::all(&mut grad))?;
    sink(ctx, WTask::ExpertReady { tensor, grad })
}
