//! What both routers share (the plain softmax top-k of `moe.rs` and DeepSeek-V3's of
//! `router.rs`): the row softmax, the expert capacity, the routing of per-expert choices with
//! the capacity's drops, the load-balancing loss, and the softmax router's backward.

use crate::backend::ops::{Route, Routing};
use parsim_plan::plan::MoeShape;

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

/// The routing of the assignments `per_expert` (token, gate) of `n` tokens (in token order):
/// the slot fractions, then the capacity's drops (the lowest gates of a full expert).
pub fn finish(per_expert: Vec<Vec<(usize, f32)>>, n: usize, moe: &MoeShape) -> Routing {
    let (e, k) = (moe.num_experts, moe.top_k);
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

/// The router's backward in place: the load-balancing loss adds `aux_scale` f_i to the
/// gradient of every probability of expert i, then the softmax's backward turns `d` [n, e]
/// into the logits' gradient.
pub fn router_bwd(d: &mut [f32], probs: &[f32], fraction: &[f64], aux_scale: f64) {
    let e = fraction.len();
    if aux_scale != 0.0 {
        for row in d.chunks_exact_mut(e) {
            for (x, fi) in row.iter_mut().zip(fraction) {
                *x += (aux_scale * fi) as f32;
            }
        }
    }
    for (dl, pr) in d.chunks_exact_mut(e).zip(probs.chunks_exact(e)) {
        let dot: f32 = dl.iter().zip(pr).map(|(a, b)| a * b).sum();
        for (x, q) in dl.iter_mut().zip(pr) {
            *x = q * (*x - dot);
        }
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
