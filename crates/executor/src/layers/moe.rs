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
//! - **TP + SP**: each TP rank routes its own sequence shard with the whole microbatch's
//!   decisions ([`super::moe_seq::route_sp_shard`]) and dispatches its rows over EP. With
//!   expert TP > 1 the received rows are all-gathered over the expert-TP group (the TP group,
//!   or a block of it) before each rank's slice of the experts and their outputs
//!   reduce-scatter back before the combine ([`super::moe_etp`]); with whole experts (expert
//!   TP 1) they run whole.
//! - **CP**: the router's decisions are the whole microbatch's ([`super::moe_seq`]): the
//!   load-balancing loss's fractions and the capacity over the whole sequence; each rank then
//!   dispatches its own tokens.

use super::blocks::{BlockLayout, ROUTER};
use super::ctx::Ctx;
use super::lora::{Adapters, LoraSaved};
use super::shared::SharedLora;
use super::wtask::{Sink, WTask};
use crate::backend::ops::*;
use crate::backend::{Backend, Device, DeviceTensor, ProcessGroup};
use crate::backend::{DeviceCollectives, View, ViewMut};
use crate::error::{ExecError, StateError};
use crate::tracker::Category;
use parsim_plan::plan::{Activation, MoeShape};

/// Tensors per routed expert in the experts block: fc1 and fc2, then with linear biases
/// (Megatron's `--add-bias-linear`: each expert's fc1 and fc2 biases) fc1's and fc2's biases.
fn per_expert(m: &parsim_plan::plan::ModelShape) -> usize {
    if m.bias_linear {
        4
    } else {
        2
    }
}

/// The experts block's tensors of local expert `j`: (fc1, fc2, biases (fc1's, fc2's)).
fn expert_tensors(
    m: &parsim_plan::plan::ModelShape,
    j: usize,
) -> (usize, usize, Option<(usize, usize)>) {
    let t = per_expert(m) * j;
    (t, t + 1, m.bias_linear.then_some((t + 2, t + 3)))
}

/// An MoE layer's experts block and its parameters, and under LoRA with routed-expert adapters
/// (then the experts block) the frozen routed experts' block and parameters.
pub type ExpertsIn<'e, B> = (
    &'e BlockLayout,
    View<'e, <B as Backend>::Tensor>,
    Option<(&'e BlockLayout, View<'e, <B as Backend>::Tensor>)>,
);

/// Local expert `j`'s base weights (fc1, fc2) and with linear biases its biases (fc1's,
/// fc2's).
type ExpertWeights<'p, T> = (View<'p, T>, View<'p, T>, Option<(View<'p, T>, View<'p, T>)>);

/// [`ExpertWeights`] of local expert `j`: in the frozen-experts block `fe` when there is one
/// (laid out as the experts block without LoRA), else in the experts block `(le, pe)`.
fn expert_weights<'p, T: crate::backend::DeviceTensor>(
    m: &parsim_plan::plan::ModelShape,
    fe: Option<(&BlockLayout, &View<'p, T>)>,
    (le, pe): (&BlockLayout, &View<'p, T>),
    j: usize,
) -> ExpertWeights<'p, T> {
    let (t1, t2, biases) = expert_tensors(m, j);
    let (bl, bp) = fe.unwrap_or((le, pe));
    let v = |t: usize| bp.sub(bl.tensors[t].range());
    (v(t1), v(t2), biases.map(|(b1, b2)| (v(b1), v(b2))))
}

/// A block and a borrow of its parameters.
type BlockRef<'a, 'e, T> = (&'e BlockLayout, &'a View<'e, T>);

/// The frozen-experts block of `ex`, checked against the plan: present exactly under LoRA
/// with routed-expert adapters.
fn frozen_of<'a, 'e, B: Backend>(
    ctx: &Ctx<B>,
    ex: &'a ExpertsIn<'e, B>,
) -> Result<Option<BlockRef<'a, 'e, B::Tensor>>, ExecError> {
    let fe = ex.2.as_ref().map(|(l, p)| (*l, p));
    if fe.is_some() != super::moe_lora::routed(ctx.plan) {
        return Err(StateError::MoeSavedMismatch.into());
    }
    Ok(fe)
}

/// What an MoE block keeps for backward (besides the norm's input and output).
pub struct MoeSaved<B: Backend> {
    /// Router probabilities [n, E].
    probs: B::Tensor,
    routing: Routing,
    /// Rows sent to each EP member and received from each, and the rows of each local expert
    /// per source member (per TP member and source, gathered over expert TP).
    send_rows: Vec<usize>,
    recv_rows: Vec<usize>,
    recv_expert_rows: super::moe_etp::EtRows,
    /// Per local expert: its input rows, fc1 output (the activation's input), activation output.
    x: Vec<B::Tensor>,
    u: Vec<B::Tensor>,
    act: Vec<B::Tensor>,
    /// LoRA: per local expert, the saved rank-r intermediates of fc1's and fc2's adapters.
    lora: Vec<[Option<B::Tensor>; 2]>,
    /// The expert outputs of the kept assignments [routes, h], whole (for the gates' gradient).
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
/// `p`/`l`, the rank's experts in `pe`/`le`, the shared experts' LoRA adapters in `ad`);
/// returns the combined expert output [n, h].
pub fn moe_fwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    ex: ExpertsIn<'_, B>,
    ln2: &B::Tensor,
    (ad, ls): (&Adapters<B>, &mut LoraSaved<B>),
) -> Result<(B::Tensor, MoeSaved<B>), ExecError> {
    let (mut out, saved) = if ctx.plan.parallel.moe_routes_sp_shard() {
        // This rank routes its own sequence shard and gets its rows' outputs whole; the
        // shared experts (split over TP) run on the gathered microbatch.
        let (mut out, mut saved) = moe_fwd_full(ctx, l, p.clone(), &ex, ln2)?;
        if has_shared(ctx) {
            let mut part = ctx.zeros(Category::Buffers, &[ctx.n, ctx.rd.h])?;
            saved.shared = ctx.with_gathered(ln2, |c, xg| {
                let lo = SharedLora {
                    ad,
                    ls: &mut *ls,
                    x_reg: ln2,
                };
                super::shared::shared_fwd(c, l, p.clone(), xg, &mut part, lo)
            })?;
            let mut shared = ctx.reduce_to_region(part, Category::Buffers)?;
            if let Some(sh) = &saved.shared {
                super::shared::shared_fc2_lora(ctx, sh, (ad, ls), &mut shared)?;
            }
            ctx.ops
                .axpy(1.0, View::all(&shared), ViewMut::all(&mut out))?;
        }
        (out, saved)
    } else {
        // Without TP: the routed and the shared experts on the rank's rows.
        let (mut out, mut saved) = moe_fwd_full(ctx, l, p.clone(), &ex, ln2)?;
        let lo = SharedLora {
            ad,
            ls: &mut *ls,
            x_reg: ln2,
        };
        saved.shared = super::shared::shared_fwd(ctx, l, p.clone(), ln2, &mut out, lo)?;
        let mut out = ctx.reduce_to_region(out, Category::Buffers)?;
        if let Some(sh) = &saved.shared {
            super::shared::shared_fc2_lora(ctx, sh, (ad, ls), &mut out)?;
        }
        (out, saved)
    };
    // The shared experts' fc2 bias, after the reduction as the dense MLP's.
    super::bias::add(ctx, l, &p, super::bias::Site::Fc2, &mut out)?;
    Ok((out, saved))
}

/// Whether the MoE layers have shared experts.
fn has_shared<B: Backend>(ctx: &Ctx<B>) -> bool {
    ctx.plan
        .model
        .moe
        .as_ref()
        .is_some_and(|m| m.shared_ffn > 0)
}

/// The routed experts of [`moe_fwd`] on the rows `ln2` [rows, h] this rank routes (its
/// sequence shard under TP); returns their output, whole. The caller adds the shared experts.
fn moe_fwd_full<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: View<'_, B::Tensor>,
    ex: &ExpertsIn<'_, B>,
    ln2: &B::Tensor,
) -> Result<(B::Tensor, MoeSaved<B>), ExecError> {
    let (le, pe) = (ex.0, &ex.1);
    let fe = frozen_of(ctx, ex)?;
    let moe = moe_of(ctx)?.clone();
    let (n, h) = (ln2.rows(), ctx.rd.h);
    let e = moe.num_experts;
    let (a, b) = (Category::Activations, Category::Buffers);
    let mut probs = ctx.zeros(a, &[n, e])?;
    ctx.ops
        .linear_fwd(ln2, p.sub(l.tensors[ROUTER].range()), (n, h, e), &mut probs)?;
    if let Some((_, bias)) = super::modern::router_bias(ctx, l, &p) {
        ctx.ops.bias_add(&mut probs, bias)?;
    }
    let layer = super::dropout::block_layer(l);
    let router = |c: &mut Ctx<B>, t: &mut B::Tensor| route(c, t, &moe, layer);
    let ((routing, aux, chosen), counted) = if ctx.plan.parallel.moe_routes_sp_shard() {
        super::moe_seq::route_sp_shard(ctx, &mut probs, moe.top_k, router)?
    } else {
        let r = super::moe_seq::route_whole_sequence(ctx, &mut probs, moe.top_k, router)?;
        let counted = r.2.clone();
        (r, counted)
    };
    if moe.router.expert_bias && !ctx.recomputing {
        ctx.router_bias.count(layer, e, &counted);
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
    let et_rows = super::moe_etp::layout(ctx, recv_expert_rows)?;
    if !ctx.recomputing {
        // The load: rows per local expert from every source (and every expert-TP member: the
        // rows its slice runs on), beside the assignments of the microbatch.
        let per_source = &et_rows.per_source;
        let per_expert = (0..local).map(|j| per_source.iter().map(|c| c[j] as u64).sum());
        let assigned = (routing.routes.len() + routing.dropped) as u64;
        ctx.moe_load.add(assigned, ctx.rd.et as u64, per_expert);
    }

    let tokens: Vec<usize> = routing.routes.iter().map(|r| r.token).collect();
    let mut send = ctx.zeros(b, &[tokens.len(), h])?;
    ctx.ops.gather_rows(ln2, &tokens, &mut send)?;
    let recv = exchange_rows(ctx, &ep, &send, &send_rows, &recv_rows, h, b)?;
    drop(send);
    let recv = super::moe_etp::gather(ctx, recv, &et_rows, h, b)?;
    let total_recv = recv.rows();

    // Expert tensor parallelism: this rank's slice of each expert's intermediate size.
    let f = moe.ffn / ctx.rd.et;
    let w1 = fc1_width(ctx.plan.model.activation, f);
    let act_kind = ctx.plan.model.activation;
    let mut back = ctx.zeros(b, &[total_recv, h])?;
    let (mut xs, mut us, mut acts) = (Vec::new(), Vec::new(), Vec::new());
    let mut lora_saved = Vec::new();
    let routed_lora = super::moe_lora::routed(ctx.plan);
    for j in 0..local {
        let spans = expert_rows(&et_rows.per_source, j);
        let c: usize = spans.iter().map(|s| s.1).sum();
        let mut x = ctx.zeros(a, &[c, h])?;
        copy_spans(ctx, &recv, &mut x, h, gathered_spans(&spans))?;
        let mut u = ctx.zeros(a, &[c, w1])?;
        let mut act = ctx.zeros(a, &[c, f])?;
        let mut ls = [None, None];
        if c > 0 {
            let (w_fc1, w_fc2, biases) = expert_weights(&ctx.plan.model, fe, (le, pe), j);
            ctx.ops.linear_fwd(&x, w_fc1, (c, h, w1), &mut u)?;
            if routed_lora {
                ls[0] = super::moe_lora::fc1_fwd(ctx, (le, pe), j, &x, &mut u)?;
            }
            if let Some((b1, _)) = &biases {
                ctx.ops.bias_add(&mut u, b1.clone())?;
            }
            ctx.ops.act_fwd(act_kind, &u, &mut act)?;
            let mut y = ctx.zeros(b, &[c, h])?;
            ctx.ops.linear_fwd(&act, w_fc2, (c, f, h), &mut y)?;
            if routed_lora {
                ls[1] = super::moe_lora::fc2_fwd(ctx, (le, pe), j, &act, &mut y)?;
            }
            // fc2's bias once over the TP partial sums (the gates weight it with the output).
            if let (Some((_, b2)), 0) = (biases, ctx.rd.et_rank) {
                ctx.ops.bias_add(&mut y, b2)?;
            }
            let back_spans = gathered_spans(&spans).map(|(lo, at, rows)| (at, lo, rows));
            copy_spans(ctx, &y, &mut back, h, back_spans)?;
        }
        xs.push(x);
        us.push(u);
        acts.push(act);
        lora_saved.push(ls);
    }
    drop(recv);
    let back = super::moe_etp::reduce_scatter(ctx, back, &et_rows, h, b)?;
    let y = exchange_rows(ctx, &ep, &back, &recv_rows, &send_rows, h, a)?;
    drop(back);
    let mut out = ctx.zeros(b, &[n, h])?;
    let gates: Vec<f32> = routing.routes.iter().map(|r| r.gate).collect();
    ctx.ops
        .scatter_add_rows(&y, &tokens, Some(&gates), &mut out)?;
    Ok((
        out,
        MoeSaved {
            probs,
            routing,
            send_rows,
            recv_rows,
            recv_expert_rows: et_rows,
            x: xs,
            u: us,
            act: acts,
            lora: lora_saved,
            y,
            chosen,
            shared: None,
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

/// Input gradient of the MoE block: d ln2 [n_sp, h] (its region's) from the gradient `dy`
/// [n_sp, h] of its output; the router's, the experts' ([`WTask::Expert`]) and the shared
/// experts' weight-gradient tasks go to `sink`.
pub fn moe_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    (l, p): (&BlockLayout, View<'_, B::Tensor>),
    ex: ExpertsIn<'_, B>,
    (ln2, mut s): (B::Tensor, MoeSaved<B>),
    dy: &B::Tensor,
    (ad, ls): (&Adapters<B>, &mut LoraSaved<B>),
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let sharded = ctx.plan.parallel.moe_routes_sp_shard();
    let (h, e) = (ctx.rd.h, moe_of(ctx)?.num_experts);
    let bcat = Category::Buffers;
    let shared = s.shared.take();
    super::bias::grad(ctx, l, super::bias::Site::Fc2, dy, sink)?;
    // The whole microbatch's output gradient (gathered over SP) for the shared experts, and
    // without TP the routed rows' (a copy; under TP each rank routed its own shard).
    let dy_full = if sharded && shared.is_none() {
        None
    } else {
        Some(ctx.expand_grad(dy)?)
    };
    let dy_routed = match (&dy_full, sharded) {
        (Some(d), false) => d,
        _ => dy,
    };
    let (d_rows, dlogits) = routed_bwd(ctx, l, &p, &ex, s, dy_routed, sink)?;
    if let Some((tensor, _)) = super::modern::router_bias(ctx, l, &p) {
        // The router's linear bias: the column sums of the logits' gradient (a partial sum
        // over TP when each rank routed its own shard, as the router's weight).
        let mut grad = ctx.zeros_f32(bcat, &[e])?;
        ctx.ops.bias_grad(&dlogits, ViewMut::all(&mut grad))?;
        sink(ctx, WTask::Ready { tensor, grad })?;
    }
    let rows = dlogits.rows();
    let sp = ctx.sp;
    if shared.is_none() && !sharded {
        sink(
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
        )?;
        return ctx.reduce_to_region(d_rows, bcat);
    }
    // The router's weight gradient (E x h, small) now: the shared experts' fc1 takes `ln2`
    // for its own, so no copy of it is kept; under TP its rows are this rank's shard.
    let mut grad = ctx.zeros(bcat, &[e * h])?;
    if sharded {
        ctx.ops
            .linear_wgrad(&dlogits, &ln2, (rows, h, e), ViewMut::all(&mut grad))?;
    } else {
        ctx.with_gathered(&ln2, |c, xg| {
            c.ops
                .linear_wgrad(&dlogits, xg, (rows, h, e), ViewMut::all(&mut grad))
        })?;
    }
    drop(dlogits);
    sink(
        ctx,
        WTask::Ready {
            tensor: ROUTER,
            grad,
        },
    )?;
    let dy_full = dy_full.ok_or_else(|| ExecError::from(StateError::MoeSavedMismatch));
    if !sharded {
        // Without TP: the shared experts' gradient joins the routed rows'.
        let mut d = d_rows;
        let mut d_lora = None;
        if let Some(sh) = shared {
            let dys = (dy_full?, dy);
            d_lora =
                super::shared::shared_bwd(ctx, (l, p), (sh, ln2), dys, &mut d, (ad, ls), sink)?;
        }
        let mut d = ctx.reduce_to_region(d, bcat)?;
        if let Some(dl) = d_lora {
            ctx.ops.axpy(1.0, View::all(&dl), ViewMut::all(&mut d))?;
        }
        return Ok(d);
    }
    let mut d = d_rows;
    if let Some(sh) = shared {
        let mut part = ctx.zeros(bcat, &[ctx.n, h])?;
        let dys = (dy_full?, dy);
        let d_lora =
            super::shared::shared_bwd(ctx, (l, p), (sh, ln2), dys, &mut part, (ad, ls), sink)?;
        let region = ctx.reduce_to_region(part, bcat)?;
        ctx.ops
            .axpy(1.0, View::all(&region), ViewMut::all(&mut d))?;
        if let Some(dl) = d_lora {
            ctx.ops.axpy(1.0, View::all(&dl), ViewMut::all(&mut d))?;
        }
    }
    Ok(d)
}

/// Backward of the routed experts and the router over the rows this rank routed, from their
/// output gradient `dy` [rows, h]: the rows' input gradient (the experts' and the router's)
/// and the router's logit gradient [rows, E].
fn routed_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    ex: &ExpertsIn<'_, B>,
    s: MoeSaved<B>,
    dy: &B::Tensor,
    sink: &mut Sink<B>,
) -> Result<(B::Tensor, B::Tensor), ExecError> {
    let moe = moe_of(ctx)?.clone();
    let (n, h) = (s.probs.rows(), ctx.rd.h);
    let e = moe.num_experts;
    let bcat = Category::Buffers;
    let ep = ctx
        .ep
        .clone()
        .ok_or_else(|| ExecError::from(StateError::MoeWithoutEpGroup))?;
    let routes = &s.routing.routes;
    // Combine: d y_r = gate_r dy[t]; d gate_r = dy[t] . y_r (y_r whole: reduced over expert TP
    // before the combine).
    let mut dprobs = ctx.zeros(bcat, &[n, e])?;
    let mut dsend = ctx.zeros(bcat, &[routes.len(), h])?;
    ctx.ops
        .moe_combine_bwd(dy, &s.y, routes, &mut dprobs, &mut dsend)?;
    drop(s.y);
    let drecv = exchange_rows(ctx, &ep, &dsend, &s.send_rows, &s.recv_rows, h, bcat)?;
    drop(dsend);
    // Expert TP: the output gradients of every TP member's received rows, gathered; the
    // slices' input gradients are partial sums over TP, reduce-scattered back.
    let at = &s.recv_expert_rows;
    let drecv = super::moe_etp::gather(ctx, drecv, at, h, bcat)?;
    let saved = (s.x, s.u, s.act, s.lora);
    let blocks = (frozen_of(ctx, ex)?, (ex.0, &ex.1));
    let dback = experts_bwd(ctx, blocks, saved, &at.per_source, drecv, sink)?;
    let dback = super::moe_etp::reduce_scatter(ctx, dback, at, h, bcat)?;
    let dx_routes = exchange_rows(ctx, &ep, &dback, &s.recv_rows, &s.send_rows, h, bcat)?;
    drop(dback);
    let mut d_rows = ctx.zeros(bcat, &[n, h])?;
    let tokens: Vec<usize> = routes.iter().map(|r| r.token).collect();
    ctx.ops
        .scatter_add_rows(&dx_routes, &tokens, None, &mut d_rows)?;
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
    let fraction = &s.routing.fraction;
    if moe.router.is_plain() {
        ctx.ops
            .moe_router_bwd(&mut dlogits, &s.probs, fraction, aux_scale)?;
    } else {
        ctx.ops.moe_router_scored_bwd(
            &mut dlogits,
            &s.probs,
            &s.chosen,
            &moe,
            fraction,
            aux_scale,
        )?;
    }
    drop(s.probs);
    // The router's input gradient: every rank's for the rows it routed.
    ctx.ops.linear_dgrad(
        &dlogits,
        p.sub(l.tensors[ROUTER].range()),
        (n, h, e),
        &mut d_rows,
        true,
    )?;
    Ok((d_rows, dlogits))
}

/// Per local expert: its input rows, fc1 output and activation output, and (LoRA) its
/// adapters' saved intermediates.
type ExpertsSaved<B> = (
    Vec<<B as Backend>::Tensor>,
    Vec<<B as Backend>::Tensor>,
    Vec<<B as Backend>::Tensor>,
    Vec<[Option<<B as Backend>::Tensor>; 2]>,
);

/// The frozen-experts block and its parameters (LoRA with routed-expert adapters), and the
/// experts block and its parameters.
type ExpertBlocks<'a, 'p, T> = (
    Option<(&'a BlockLayout, &'a View<'p, T>)>,
    (&'a BlockLayout, &'a View<'p, T>),
);

/// Backward of this rank's experts on the rows they received (`drecv`, laid out by
/// `recv_expert_rows`, every expert-TP member's): their weight-gradient tasks go to `sink`;
/// returns the received rows' input gradients (partial sums over expert TP), to be sent back.
fn experts_bwd<B: Backend>(
    ctx: &mut Ctx<B>,
    (fe, (le, pe)): ExpertBlocks<'_, '_, B::Tensor>,
    (xs, us, acts, lora): ExpertsSaved<B>,
    recv_expert_rows: &[Vec<usize>],
    drecv: B::Tensor,
    sink: &mut Sink<B>,
) -> Result<B::Tensor, ExecError> {
    let (h, bcat) = (ctx.rd.h, Category::Buffers);
    // Under LoRA the base experts are frozen: no weight gradient of theirs is sent.
    let frozen = ctx.plan.lora.is_some();
    let f = moe_of(ctx)?.ffn / ctx.rd.et;
    let act_kind = ctx.plan.model.activation;
    let w1 = fc1_width(act_kind, f);
    let mut dback = ctx.zeros(bcat, &[drecv.rows(), h])?;
    let saved = xs.into_iter().zip(us).zip(acts).zip(lora);
    for (j, (((x, u), act), [ls1, ls2])) in saved.enumerate() {
        let spans = expert_rows(recv_expert_rows, j);
        let c: usize = spans.iter().map(|s| s.1).sum();
        if c == 0 {
            continue;
        }
        let mut dyj = ctx.zeros(bcat, &[c, h])?;
        copy_spans(ctx, &drecv, &mut dyj, h, gathered_spans(&spans))?;
        // The trained experts' tensors (gradients), and the weights the rank runs.
        let (t1, t2, biases) = expert_tensors(&ctx.plan.model, j);
        let m = &ctx.plan.model;
        let (w_fc1, w_fc2, _) = expert_weights(m, fe, (le, pe), j);
        if let (Some((_, b2)), false) = (biases, frozen) {
            expert_bias_grad(ctx, le, b2, &dyj, sink)?;
        }
        let mut dact = ctx.zeros(bcat, &[c, f])?;
        ctx.ops
            .linear_dgrad(&dyj, w_fc2, (c, f, h), &mut dact, false)?;
        if let Some(s2) = ls2 {
            super::moe_lora::fc2_bwd(ctx, (le, pe), j, s2, (&act, &dyj), &mut dact, sink)?;
        }
        if !frozen {
            let (x, dy) = (act, dyj);
            sink(
                ctx,
                WTask::Expert {
                    tensor: t2,
                    x,
                    dy,
                    i: f,
                    o: h,
                },
            )?;
        }
        let mut du = ctx.ops.recat(u, bcat);
        ctx.ops.act_bwd_inplace(act_kind, &mut du, &dact)?;
        drop(dact);
        if let (Some((b1, _)), false) = (biases, frozen) {
            expert_bias_grad(ctx, le, b1, &du, sink)?;
        }
        let mut dx = ctx.zeros(bcat, &[c, h])?;
        ctx.ops
            .linear_dgrad(&du, w_fc1, (c, h, w1), &mut dx, false)?;
        if let Some(s1) = ls1 {
            super::moe_lora::fc1_bwd(ctx, (le, pe), j, s1, (&x, &du), &mut dx, sink)?;
        }
        if !frozen {
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
        }
        let back_spans = gathered_spans(&spans).map(|(lo, at, rows)| (at, lo, rows));
        copy_spans(ctx, &dx, &mut dback, h, back_spans)?;
    }
    Ok(dback)
}

/// A routed expert's bias gradient: the column sums of `dy` [rows, o] over the rows it
/// received, for tensor `tensor` of the experts block `le` (whole on every TP rank: the rows
/// are every expert-TP member's).
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
