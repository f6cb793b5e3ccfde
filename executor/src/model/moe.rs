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
//! Runs with tp = 1 (every rank routes all n tokens of its microbatch).

use super::params::BlockLayout;
use super::{Ctx, Sink, WTask};
use crate::backend::cpu::{Category, Group, Tensor};
use crate::backend::{Collectives, HostOps};
use crate::error::{ExecError, StateError};
use crate::plan::{Activation, MoeShape};

/// The router's tensor in an MoE layer's block (after attn_norm, QKV, wo, mlp_norm).
pub const ROUTER: usize = 4;

/// One kept assignment of a token to an expert.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Route {
    pub token: usize,
    pub expert: usize,
    pub gate: f32,
}

/// The router's decisions for one microbatch.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    /// Kept assignments ordered by expert, then token.
    pub routes: Vec<Route>,
    /// Fraction of the n k routed slots that chose each expert (before dropping).
    pub fraction: Vec<f64>,
    /// Assignments dropped by the capacity.
    pub dropped: usize,
}

/// Row-wise softmax of `logits` [n, e] in place.
pub fn softmax_rows(x: &mut [f32], e: usize) {
    for row in x.chunks_exact_mut(e) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        for v in row.iter_mut() {
            *v /= sum;
        }
    }
}

/// Expert capacity for `tokens` tokens: ceil(cf x tokens x k / E); `None` without dropping.
pub fn capacity(cf: f32, tokens: usize, k: usize, experts: usize) -> Option<usize> {
    (cf > 0.0).then(|| (cf as f64 * tokens as f64 * k as f64 / experts as f64).ceil() as usize)
}

/// Top-k of each row of `probs` [n, E] (ties: lower expert first), then the capacity's drops.
pub fn route(probs: &[f32], n: usize, moe: &MoeShape) -> Routing {
    let (e, k) = (moe.num_experts, moe.top_k);
    let mut per_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
    let mut order: Vec<usize> = Vec::with_capacity(e);
    for t in 0..n {
        let row = &probs[t * e..(t + 1) * e];
        order.clear();
        order.extend(0..e);
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for &x in &order[..k] {
            per_expert[x].push((t, row[x]));
        }
    }
    let slots = (n * k) as f64;
    let fraction = per_expert.iter().map(|v| v.len() as f64 / slots).collect();
    let cap = capacity(moe.capacity_factor, n, k, e);
    let mut dropped = 0;
    let mut routes = Vec::with_capacity(n * k);
    for (x, mut list) in per_expert.into_iter().enumerate() {
        if let Some(c) = cap {
            if list.len() > c {
                // Keep the c most probable (earlier token on ties), then back to token order.
                list.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                dropped += list.len() - c;
                list.truncate(c);
                list.sort_by_key(|a| a.0);
            }
        }
        routes.extend(list.into_iter().map(|(token, gate)| Route {
            token,
            expert: x,
            gate,
        }));
    }
    Routing {
        routes,
        fraction,
        dropped,
    }
}

/// The load-balancing loss coeff x E x sum_i f_i P_i (Fedus et al. 2021, eq. 4) of `probs`
/// [n, E] with slot fractions `fraction`.
pub fn aux_loss(coeff: f32, probs: &[f32], n: usize, fraction: &[f64]) -> f64 {
    let e = fraction.len();
    let mut mean = vec![0.0f64; e];
    for row in probs.chunks_exact(e) {
        for (m, p) in mean.iter_mut().zip(row) {
            *m += *p as f64;
        }
    }
    let s: f64 = mean
        .iter()
        .zip(fraction)
        .map(|(m, f)| m / n as f64 * f)
        .sum();
    coeff as f64 * e as f64 * s
}

/// What an MoE block keeps for backward (besides the norm's input and output).
pub struct MoeSaved {
    /// Router probabilities [n, E].
    probs: Tensor,
    routing: Routing,
    /// Rows sent to each EP member and received from each, and, per source member, the rows
    /// of each local expert.
    send_rows: Vec<usize>,
    recv_rows: Vec<usize>,
    recv_expert_rows: Vec<Vec<usize>>,
    /// Per local expert: its input rows, fc1 output (the activation's input), activation output.
    x: Vec<Tensor>,
    u: Vec<Tensor>,
    act: Vec<Tensor>,
    /// The expert outputs of the kept assignments [routes, h] (for the gates' gradient).
    y: Tensor,
}

fn moe_of<'c>(ctx: &'c Ctx) -> Result<&'c MoeShape, ExecError> {
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

/// Counts as exact f32 bit patterns (for the fixed-size count exchange).
fn to_bits(c: &[usize]) -> Vec<f32> {
    c.iter().map(|&x| f32::from_bits(x as u32)).collect()
}

fn from_bits(c: &[f32]) -> Vec<usize> {
    c.iter().map(|x| x.to_bits() as usize).collect()
}

fn scale(v: &[usize], by: usize) -> Vec<usize> {
    v.iter().map(|x| x * by).collect()
}

/// Sends rows of width `h` (`send_rows` to each EP member) and returns the rows received
/// (`recv_rows` from each) as a new tensor of category `cat`.
fn exchange_rows(
    ctx: &Ctx,
    ep: &Group,
    send: &Tensor,
    send_rows: &[usize],
    recv_rows: &[usize],
    h: usize,
    cat: Category,
) -> Result<Tensor, ExecError> {
    let mut recv = ctx.ops.zeros(cat, &[recv_rows.iter().sum(), h]);
    ctx.comm.all_to_all_v(
        ep,
        send.data(),
        &scale(send_rows, h),
        recv.data_mut(),
        &scale(recv_rows, h),
    )?;
    Ok(recv)
}

/// Forward of the MoE block on the normed input `ln2` [n, h] (the router's parameters in
/// `p`/`l`, the rank's experts in `pe`/`le`); returns the combined expert output [n, h].
pub fn moe_fwd(
    ctx: &mut Ctx,
    l: &BlockLayout,
    p: &[f32],
    le: &BlockLayout,
    pe: &[f32],
    ln2: &Tensor,
) -> Result<(Tensor, MoeSaved), ExecError> {
    let moe = moe_of(ctx)?.clone();
    let (n, h) = (ctx.n, ctx.rd.h);
    let e = moe.num_experts;
    let (a, b) = (Category::Activations, Category::Buffers);
    let mut probs = ctx.ops.zeros(a, &[n, e]);
    ctx.ops.linear_fwd(
        ln2.data(),
        &p[l.tensors[ROUTER].range()],
        n,
        h,
        e,
        probs.data_mut(),
    );
    softmax_rows(probs.data_mut(), e);
    let routing = route(probs.data(), n, &moe);
    ctx.moe_aux_loss += aux_loss(moe.aux_loss_coeff, probs.data(), n, &routing.fraction);
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
    let mut got = vec![0.0f32; e];
    ctx.comm.all_to_all(&ep, &to_bits(&counts), &mut got)?;
    let recv_expert_rows: Vec<Vec<usize>> =
        from_bits(&got).chunks(local).map(|c| c.to_vec()).collect();
    let send_rows: Vec<usize> = counts.chunks(local).map(|c| c.iter().sum()).collect();
    let recv_rows: Vec<usize> = recv_expert_rows.iter().map(|c| c.iter().sum()).collect();

    let mut send = ctx.ops.zeros(b, &[routing.routes.len(), h]);
    for (i, r) in routing.routes.iter().enumerate() {
        send.data_mut()[i * h..(i + 1) * h]
            .copy_from_slice(&ln2.data()[r.token * h..(r.token + 1) * h]);
    }
    let recv = exchange_rows(ctx, &ep, &send, &send_rows, &recv_rows, h, b)?;
    let total_recv = recv.rows();
    drop(send);

    let f = moe.ffn;
    let w1 = fc1_width(ctx.plan.model.activation, f);
    let act_kind = ctx.plan.model.activation;
    let mut back = ctx.ops.zeros(b, &[total_recv, h]);
    let (mut xs, mut us, mut acts) = (Vec::new(), Vec::new(), Vec::new());
    for j in 0..local {
        let spans = expert_rows(&recv_expert_rows, j);
        let c: usize = spans.iter().map(|s| s.1).sum();
        let mut x = ctx.ops.zeros(a, &[c, h]);
        let mut at = 0;
        for &(lo, rows) in &spans {
            x.data_mut()[at * h..(at + rows) * h]
                .copy_from_slice(&recv.data()[lo * h..(lo + rows) * h]);
            at += rows;
        }
        let mut u = ctx.ops.zeros(a, &[c, w1]);
        let mut act = ctx.ops.zeros(a, &[c, f]);
        if c > 0 {
            let w_fc1 = &pe[le.tensors[2 * j].range()];
            let w_fc2 = &pe[le.tensors[2 * j + 1].range()];
            ctx.ops.linear_fwd(x.data(), w_fc1, c, h, w1, u.data_mut());
            ctx.ops.act_fwd(act_kind, u.data(), c, f, act.data_mut());
            let mut y = ctx.ops.zeros(b, &[c, h]);
            ctx.ops.linear_fwd(act.data(), w_fc2, c, f, h, y.data_mut());
            let mut at = 0;
            for &(lo, rows) in &spans {
                back.data_mut()[lo * h..(lo + rows) * h]
                    .copy_from_slice(&y.data()[at * h..(at + rows) * h]);
                at += rows;
            }
        }
        xs.push(x);
        us.push(u);
        acts.push(act);
    }
    drop(recv);
    let y = exchange_rows(ctx, &ep, &back, &recv_rows, &send_rows, h, a)?;
    drop(back);
    let mut out = ctx.ops.zeros(b, &[n, h]);
    for (i, r) in routing.routes.iter().enumerate() {
        let dst = &mut out.data_mut()[r.token * h..(r.token + 1) * h];
        for (o, v) in dst.iter_mut().zip(&y.data()[i * h..(i + 1) * h]) {
            *o += r.gate * v;
        }
    }
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
        },
    ))
}

/// Input gradient of the MoE block: d ln2 [n, h] from the gradient `dy` [n, h] of its output;
/// the router's weight-gradient task (input `ln2`) and the experts' ([`WTask::Expert`]) go to
/// `sink`.
#[allow(clippy::too_many_arguments)]
pub fn moe_bwd(
    ctx: &mut Ctx,
    l: &BlockLayout,
    p: &[f32],
    pe: &[f32],
    le: &BlockLayout,
    ln2: Tensor,
    s: MoeSaved,
    dy: &Tensor,
    sink: &mut Sink,
) -> Result<Tensor, ExecError> {
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
    } = s;
    let routes = &routing.routes;
    // Combine: d y_r = gate_r dy[t]; d gate_r = dy[t] . y_r.
    let mut dprobs = ctx.ops.zeros(bcat, &[n, e]);
    let mut dsend = ctx.ops.zeros(bcat, &[routes.len(), h]);
    for (i, r) in routes.iter().enumerate() {
        let g = &dy.data()[r.token * h..(r.token + 1) * h];
        let yr = &y.data()[i * h..(i + 1) * h];
        dprobs.data_mut()[r.token * e + r.expert] = g.iter().zip(yr).map(|(a, b)| a * b).sum();
        for (d, v) in dsend.data_mut()[i * h..(i + 1) * h].iter_mut().zip(g) {
            *d = r.gate * v;
        }
    }
    drop(y);
    let drecv = exchange_rows(ctx, &ep, &dsend, &send_rows, &recv_rows, h, bcat)?;
    let total_recv = drecv.rows();
    drop(dsend);

    let f = moe.ffn;
    let act_kind = ctx.plan.model.activation;
    let w1 = fc1_width(act_kind, f);
    let mut dback = ctx.ops.zeros(bcat, &[total_recv, h]);
    for (j, ((x, u), act)) in xs.into_iter().zip(us).zip(acts).enumerate() {
        let spans = expert_rows(&recv_expert_rows, j);
        let c: usize = spans.iter().map(|s| s.1).sum();
        if c == 0 {
            continue;
        }
        let mut dyj = ctx.ops.zeros(bcat, &[c, h]);
        let mut at = 0;
        for &(lo, rows) in &spans {
            dyj.data_mut()[at * h..(at + rows) * h]
                .copy_from_slice(&drecv.data()[lo * h..(lo + rows) * h]);
            at += rows;
        }
        let (t1, t2) = (2 * j, 2 * j + 1);
        let mut dact = ctx.ops.zeros(bcat, &[c, f]);
        ctx.ops.linear_dgrad(
            dyj.data(),
            &pe[le.tensors[t2].range()],
            c,
            f,
            h,
            dact.data_mut(),
            false,
        );
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
        let mut du = u.recat(bcat);
        ctx.ops
            .act_bwd_inplace(act_kind, du.data_mut(), dact.data(), c, f);
        drop(dact);
        let mut dx = ctx.ops.zeros(bcat, &[c, h]);
        ctx.ops.linear_dgrad(
            du.data(),
            &pe[le.tensors[t1].range()],
            c,
            h,
            w1,
            dx.data_mut(),
            false,
        );
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
        let mut at = 0;
        for &(lo, rows) in &spans {
            dback.data_mut()[lo * h..(lo + rows) * h]
                .copy_from_slice(&dx.data()[at * h..(at + rows) * h]);
            at += rows;
        }
    }
    drop(drecv);
    let dx_routes = exchange_rows(ctx, &ep, &dback, &recv_rows, &send_rows, h, bcat)?;
    drop(dback);
    let mut d_ln2 = ctx.ops.zeros(bcat, &[n, h]);
    for (i, r) in routes.iter().enumerate() {
        let dst = &mut d_ln2.data_mut()[r.token * h..(r.token + 1) * h];
        for (d, v) in dst.iter_mut().zip(&dx_routes.data()[i * h..(i + 1) * h]) {
            *d += v;
        }
    }
    drop(dx_routes);

    // Router: the load-balancing loss adds coeff E f_i / (microbatches of the step x n) to the
    // gradient of every probability of expert i; then the softmax's backward.
    if moe.aux_loss_coeff > 0.0 {
        let global_tokens = (ctx.plan.global_batch() * ctx.plan.model.seq) as f64;
        let c = moe.aux_loss_coeff as f64 * e as f64 / global_tokens;
        for row in dprobs.data_mut().chunks_exact_mut(e) {
            for (d, fi) in row.iter_mut().zip(&routing.fraction) {
                *d += (c * fi) as f32;
            }
        }
    }
    let mut dlogits = dprobs;
    for (dl, pr) in dlogits
        .data_mut()
        .chunks_exact_mut(e)
        .zip(probs.data().chunks_exact(e))
    {
        let dot: f32 = dl.iter().zip(pr).map(|(a, b)| a * b).sum();
        for (d, q) in dl.iter_mut().zip(pr) {
            *d = q * (*d - dot);
        }
    }
    drop(probs);
    ctx.ops.linear_dgrad(
        dlogits.data(),
        &p[l.tensors[ROUTER].range()],
        n,
        h,
        e,
        d_ln2.data_mut(),
        true,
    );
    sink(
        ctx,
        WTask::Linear {
            tensor: ROUTER,
            x: ln2,
            dy: dlogits,
            i: h,
            o: e,
            gather_x: false,
            dy_gathered: false,
            dy_shard: false,
        },
    )?;
    Ok(d_ln2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(e: usize, k: usize, cf: f32) -> MoeShape {
        MoeShape {
            num_experts: e,
            top_k: k,
            ffn: 4,
            first_k_dense: 0,
            capacity_factor: cf,
            aux_loss_coeff: 0.01,
        }
    }

    #[test]
    fn top_k_takes_the_largest_probabilities_with_ties_to_the_lower_expert() {
        // Token 0: 0.1 0.4 0.4 0.1 -> experts 1 and 2 (tie at 0.4 broken by index for 1st).
        // Token 1: 0.7 0.1 0.1 0.1 -> 0, then the tie among 1, 2, 3 goes to 1.
        let probs = [0.1, 0.4, 0.4, 0.1, 0.7, 0.1, 0.1, 0.1];
        let r = route(&probs, 2, &shape(4, 2, 0.0));
        let got: Vec<(usize, usize, f32)> = r
            .routes
            .iter()
            .map(|x| (x.expert, x.token, x.gate))
            .collect();
        assert_eq!(
            got,
            vec![(0, 1, 0.7), (1, 0, 0.4), (1, 1, 0.1), (2, 0, 0.4)]
        );
        assert_eq!(r.fraction, vec![0.25, 0.5, 0.25, 0.0]);
        assert_eq!(r.dropped, 0);
    }

    #[test]
    fn capacity_drops_the_least_probable_assignments_of_a_full_expert() {
        // Four tokens, top-1, two experts, cf 1: capacity ceil(1 x 4 x 1 / 2) = 2. All four
        // choose expert 0 with probabilities .6 .9 .7 .6: the two least probable go, and of
        // the tie at .6 the later token (3); kept: tokens 1 and 2.
        assert_eq!(capacity(1.0, 4, 1, 2), Some(2));
        assert_eq!(capacity(1.5, 5, 2, 4), Some(4)); // ceil(3.75)
        assert_eq!(capacity(0.0, 4, 1, 2), None);
        let probs = [0.6, 0.4, 0.9, 0.1, 0.7, 0.3, 0.6, 0.4];
        let r = route(&probs, 4, &shape(2, 1, 1.0));
        let kept: Vec<usize> = r.routes.iter().map(|x| x.token).collect();
        assert_eq!(kept, vec![1, 2]);
        assert_eq!(r.dropped, 2);
        // The fractions count the choices before dropping.
        assert_eq!(r.fraction, vec![1.0, 0.0]);
    }

    #[test]
    fn the_load_balancing_loss_is_switch_transformers_equation_4() {
        // Fedus et al. 2021, eq. 4: alpha N sum_i f_i P_i. Two tokens, two experts, top-1:
        // both choose expert 0, f = (1, 0); P = ((.8 + .6) / 2, (.2 + .4) / 2) = (.7, .3);
        // loss = alpha x 2 x (1 x .7) = 1.4 alpha.
        let probs = [0.8, 0.2, 0.6, 0.4];
        let r = route(&probs, 2, &shape(2, 1, 0.0));
        let got = aux_loss(0.5, &probs, 2, &r.fraction);
        assert!((got - 0.7).abs() < 1e-7, "{got}");
        // Perfect balance (f_i = P_i = 1/N) gives alpha, its minimum.
        let probs = [0.5, 0.5, 0.5, 0.5];
        let got = aux_loss(0.5, &probs, 2, &[0.5, 0.5]);
        assert!((got - 0.5).abs() < 1e-7, "{got}");
    }

    #[test]
    fn softmax_rows_sum_to_one() {
        let mut x = [1.0, 2.0, 3.0, -1.0, 0.0, 1000.0];
        softmax_rows(&mut x, 3);
        let e = [1.0f32.exp(), 2.0f32.exp(), 3.0f32.exp()];
        let s: f32 = e.iter().sum();
        for i in 0..3 {
            assert!((x[i] - e[i] / s).abs() < 1e-6);
        }
        assert!((x[5] - 1.0).abs() < 1e-6 && x[3] == 0.0);
    }
}
