//! The DeepSeek-V3 router's kernels ("DeepSeek-V3 Technical Report", sec. 2.1.2; Megatron's
//! `--moe-router-score-function`, `--moe-router-enable-expert-bias`, `--moe-router-num-groups`,
//! `--moe-router-group-topk`): softmax or sigmoid scores, top-k of score + bias (the bias for
//! selection only) within the best groups, gates from the unbiased scores, optionally
//! renormalised over the k chosen; and the backward of all that.

use super::routes::{finish, softmax_rows};
use crate::backend::ops::Routing;
use parsim_plan::plan::{MoeShape, ScoreFunction};

/// Scores of `x` [n, e] in place: row softmax, or elementwise sigmoid.
pub fn scores(x: &mut [f32], e: usize, f: ScoreFunction) {
    match f {
        ScoreFunction::Softmax => softmax_rows(x, e),
        ScoreFunction::Sigmoid => x.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
    }
}

/// Indices of the `k` largest of `key` among `allowed` (ties: lower index first).
fn top(key: &[f32], allowed: impl Iterator<Item = usize>, k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = allowed.collect();
    order.sort_by(|&a, &b| key[b].total_cmp(&key[a]).then(a.cmp(&b)));
    order.truncate(k);
    order
}

/// The k experts of one token from its selection keys (score + bias): with groups, the best
/// `group_topk` groups by the sum of their top max(1, k / group_topk) keys (Megatron's
/// `group_limited_topk`), then the top k of the experts in them.
fn choose(key: &[f32], moe: &MoeShape) -> Vec<usize> {
    let (e, k, r) = (moe.num_experts, moe.top_k, &moe.router);
    if r.groups == 0 {
        return top(key, 0..e, k);
    }
    let per = e / r.groups;
    let take = (k / r.group_topk).max(1);
    let group_key: Vec<f32> = (0..r.groups)
        .map(|g| {
            top(key, g * per..(g + 1) * per, take)
                .iter()
                .map(|&x| key[x])
                .sum()
        })
        .collect();
    let groups = top(&group_key, 0..r.groups, r.group_topk);
    let allowed = groups.into_iter().flat_map(|g| g * per..(g + 1) * per);
    top(key, allowed, k)
}

/// Routing of `n` tokens with scores `s` [n, e] and the selection-only `bias` [e]; returns the
/// routing (capacity drops as the plain router's) and the chosen experts [n k] in choice order.
pub fn route(s: &[f32], n: usize, bias: Option<&[f32]>, moe: &MoeShape) -> (Routing, Vec<usize>) {
    let (e, k) = (moe.num_experts, moe.top_k);
    let mut per_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
    let mut chosen = Vec::with_capacity(n * k);
    let mut key = vec![0.0f32; e];
    for t in 0..n {
        let row = &s[t * e..(t + 1) * e];
        for (j, kv) in key.iter_mut().enumerate() {
            *kv = row[j] + bias.map_or(0.0, |b| b[j]);
        }
        let pick = if moe.router.force_balance {
            (0..k).map(|j| (t * k + j) % e).collect()
        } else {
            choose(&key, moe)
        };
        let sum: f32 = pick.iter().map(|&x| row[x]).sum();
        for &x in &pick {
            let gate = if moe.router.renormalize {
                row[x] / sum
            } else {
                row[x]
            };
            per_expert[x].push((t, gate));
        }
        chosen.extend(pick);
    }
    (finish(per_expert, n, moe), chosen)
}

/// Backward in place: `d` [n, e] holds the gates' gradients (at the chosen entries, zero
/// elsewhere) and becomes the logits' gradient: through the renormalisation g_j = s_j / S
/// (ds_j = (dg_j - sum_i dg_i g_i) / S over the chosen), the load-balancing loss's `aux_scale`
/// f_i (softmax scores only), then the score function.
pub fn router_bwd(
    d: &mut [f32],
    s: &[f32],
    chosen: &[usize],
    moe: &MoeShape,
    fraction: &[f64],
    aux_scale: f64,
) {
    let (e, k) = (moe.num_experts, moe.top_k);
    if moe.router.renormalize {
        for ((dr, sr), pick) in d
            .chunks_exact_mut(e)
            .zip(s.chunks_exact(e))
            .zip(chosen.chunks_exact(k))
        {
            let sum: f32 = pick.iter().map(|&x| sr[x]).sum();
            let dot: f32 = pick.iter().map(|&x| dr[x] * sr[x] / sum).sum();
            for &x in pick {
                dr[x] = (dr[x] - dot) / sum;
            }
        }
    }
    match moe.router.score {
        ScoreFunction::Softmax => super::routes::router_bwd(d, s, fraction, aux_scale),
        ScoreFunction::Sigmoid => {
            for (dv, sv) in d.iter_mut().zip(s) {
                *dv *= sv * (1.0 - sv);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parsim_plan::plan::RouterShape;

    fn shape(e: usize, k: usize, router: RouterShape) -> MoeShape {
        MoeShape {
            num_experts: e,
            top_k: k,
            ffn: 4,
            router,
            ..MoeShape::default()
        }
    }

    #[test]
    fn forced_balancing_gives_every_expert_the_same_tokens_with_the_scores_as_gates() {
        // Megatron's --moe-router-force-load-balancing as executed here: token t takes experts
        // (2t) mod 4 and (2t + 1) mod 4 whatever its scores; 4 tokens x top-2 over 4 experts:
        // each expert 2 tokens. Gates are the (softmax) scores of those experts.
        let r = RouterShape {
            force_balance: true,
            ..RouterShape::default()
        };
        let s: Vec<f32> = (0..16).map(|i| ((i * 7) % 5) as f32 / 10.0).collect();
        let (rt, chosen) = route(&s, 4, None, &shape(4, 2, r));
        assert_eq!(chosen, vec![0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(rt.fraction, vec![0.25; 4]);
        for x in &rt.routes {
            assert_eq!(x.gate, s[x.token * 4 + x.expert]);
        }
        let per: Vec<usize> = (0..4)
            .map(|e| rt.routes.iter().filter(|x| x.expert == e).count())
            .collect();
        assert_eq!(per, vec![2; 4]);
    }

    #[test]
    fn the_bias_moves_the_choice_but_not_the_gates() {
        // Scores .5 .4 .3 .2, top-2: experts 0 and 1. A bias of +.35 on expert 3 makes its key
        // .55, the largest: experts 3 and 0, with gates the unbiased .5 and .2, renormalised: 5/7, 2/7.
        let r = RouterShape {
            score: ScoreFunction::Sigmoid,
            renormalize: true,
            expert_bias: true,
            ..RouterShape::default()
        };
        let s = [0.5, 0.4, 0.3, 0.2];
        let (plain, chosen) = route(&s, 1, None, &shape(4, 2, r));
        assert_eq!(chosen, vec![0, 1]);
        assert!((plain.routes[0].gate - 5.0 / 9.0).abs() < 1e-6);
        let (biased, chosen) = route(&s, 1, Some(&[0.0, 0.0, 0.0, 0.35]), &shape(4, 2, r));
        assert_eq!(chosen, vec![3, 0]);
        let gates: Vec<f32> = biased.routes.iter().map(|x| x.gate).collect();
        assert!((gates[0] - 5.0 / 7.0).abs() < 1e-6 && (gates[1] - 2.0 / 7.0).abs() < 1e-6);
    }

    #[test]
    fn group_limited_routing_keeps_a_tokens_experts_in_its_best_groups() {
        // 8 experts in 4 groups of 2, top-2 within 1 group: group keys (top-2 sums) are
        // .9+.0, .5+.5, .8+.1, .3+.3 = .9, 1.0, .9, .6: group 1 wins, experts 2 and 3, although
        // expert 0 (.9) is the single best.
        let r = RouterShape {
            groups: 4,
            group_topk: 1,
            ..RouterShape::default()
        };
        let s = [0.9, 0.0, 0.5, 0.5, 0.8, 0.1, 0.3, 0.3];
        let (_, chosen) = route(&s, 1, None, &shape(8, 2, r));
        assert_eq!(chosen, vec![2, 3]);
        // Without groups: experts 0 and 4.
        let (_, chosen) = route(&s, 1, None, &shape(8, 2, RouterShape::default()));
        assert_eq!(chosen, vec![0, 4]);
    }

    #[test]
    fn the_renormalised_sigmoid_backward_matches_finite_differences() {
        // loss = sum_j c_j g_j(logits) over the chosen; d/dlogit by central differences.
        let r = RouterShape {
            score: ScoreFunction::Sigmoid,
            renormalize: true,
            ..RouterShape::default()
        };
        let m = shape(4, 2, r);
        let logits = [0.3f32, -0.2, 0.7, 0.1];
        let c = [-0.7f32, 0.0, 1.5, 0.0];
        let loss = |x: &[f32]| -> f64 {
            let mut s = x.to_vec();
            scores(&mut s, 4, ScoreFunction::Sigmoid);
            let (rt, _) = route(&s, 1, None, &m);
            rt.routes
                .iter()
                .map(|r| (c[r.expert] * r.gate) as f64)
                .sum()
        };
        let mut s = logits.to_vec();
        scores(&mut s, 4, ScoreFunction::Sigmoid);
        let (rt, chosen) = route(&s, 1, None, &m);
        assert_eq!(chosen, vec![2, 0]);
        let mut d = vec![0.0f32; 4];
        for r in &rt.routes {
            d[r.expert] = c[r.expert];
        }
        router_bwd(&mut d, &s, &chosen, &m, &rt.fraction, 0.0);
        for j in 0..4 {
            let (mut up, mut down) = (logits, logits);
            up[j] += 1e-3;
            down[j] -= 1e-3;
            let fd = (loss(&up) - loss(&down)) / 2e-3;
            assert!((fd - d[j] as f64).abs() < 2e-4, "{j}: {fd} vs {}", d[j]);
        }
    }
}
