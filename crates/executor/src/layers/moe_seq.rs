//! The MoE router over the whole sequence under context parallelism. A CP rank holds a shard
//! of each sequence, but the load-balancing loss's slot fractions f_i are those of the whole
//! microbatch (Megatron-Core reduces the router's token counts over the TP x CP group:
//! `get_tokens_per_expert_and_token_count` with `tp_cp_group`, then
//! `switch_load_balancing_loss_func`), and so is the expert capacity here, so that a CP run
//! drops the same assignments as the single-rank run. The router's logits [n, E] (E columns,
//! small beside the hidden states) are all-gathered over CP and put in sequence order; every
//! CP rank routes the whole microbatch identically and keeps its own tokens' assignments.

use super::ctx::Ctx;
use crate::backend::ops::*;
use crate::backend::{Backend, DeviceCollectives, DeviceTensor};
use crate::backend::{View, ViewMut};
use crate::error::ExecError;
use crate::tracker::Category;

/// What a router returns: the routing, the load-balancing loss, the chosen experts [n k].
pub type Routed = (Routing, f64, Vec<usize>);

/// Routes this rank's `logits` [n, E] (replaced by its rows' probabilities) with `route` run
/// on the whole microbatch gathered over CP; returns the rank's own assignments (tokens as
/// its rows), the global slot fractions, the whole microbatch's loss (each CP rank reports it
/// weighted by its n tokens, so the ranks' sum is the single-rank figure), the chosen experts
/// of its rows, and the assignments of its rows that the capacity dropped. Without CP,
/// `route` on `logits` itself.
pub fn route_whole_sequence<B: Backend>(
    ctx: &mut Ctx<B>,
    logits: &mut B::Tensor,
    k: usize,
    route: impl FnOnce(&mut Ctx<B>, &mut B::Tensor) -> Result<Routed, ExecError>,
) -> Result<Routed, ExecError> {
    let Some(cp) = ctx.cp.as_ref() else {
        return route(ctx, logits);
    };
    let (n, e) = (logits.rows(), logits.cols());
    let (size, me, group) = (cp.size, cp.rank, cp.group.clone());
    let seq = ctx.plan.model.seq;
    let s_loc = seq / size;
    // Row j of member r (rows are samples x the member's positions) in the whole microbatch.
    let global_row = |r: usize, j: usize| (j / s_loc) * seq + cp.positions[r][j % s_loc] as usize;
    let mut source = vec![0usize; size * n];
    for r in 0..size {
        for j in 0..n {
            source[global_row(r, j)] = r * n + j;
        }
    }
    let mine: Vec<usize> = (0..n).map(|j| global_row(me, j)).collect();
    let mut gathered = ctx.zeros(Category::Buffers, &[size * n, e])?;
    ctx.comm
        .all_gather(&group, View::all(logits), ViewMut::all(&mut gathered))?;
    let mut whole = ctx.zeros(Category::Buffers, &[size * n, e])?;
    ctx.ops.gather_rows(&gathered, &source, &mut whole)?;
    drop(gathered);
    let (routing, aux, chosen) = route(ctx, &mut whole)?;
    ctx.ops.gather_rows(&whole, &mine, logits)?;
    drop(whole);
    Ok((
        own_routing(routing, &mine, size * n, k),
        aux,
        own_chosen(&chosen, &mine, k),
    ))
}

/// [`route_whole_sequence`] for a TP rank routing only its sequence shard (every MoE layer
/// under TP + SP, as Megatron-Core's token dispatchers, whatever the expert TP): the shard's `logits` [n_sp, E] are
/// all-gathered over TP (the shards are consecutive rows) so that the decisions, the
/// load-balancing loss's fractions and the capacity are the whole microbatch's; the rank keeps
/// its rows' assignments, probabilities and choices. Also returns the choices of every row of
/// the gathered microbatch, which each TP rank counts for the expert bias (so that all update
/// it alike).
pub fn route_sp_shard<B: Backend>(
    ctx: &mut Ctx<B>,
    logits: &mut B::Tensor,
    k: usize,
    route: impl FnOnce(&mut Ctx<B>, &mut B::Tensor) -> Result<Routed, ExecError>,
) -> Result<(Routed, Vec<usize>), ExecError> {
    let (n_sp, e) = (logits.rows(), logits.cols());
    let t = ctx.rd.t;
    let mut whole = ctx.zeros(Category::Buffers, &[t * n_sp, e])?;
    let tp = ctx.tp.clone();
    ctx.comm
        .all_gather(&tp, View::all(logits), ViewMut::all(&mut whole))?;
    let (routing, aux, chosen) = route_whole_sequence(ctx, &mut whole, k, route)?;
    let lo = ctx.rd.tp_rank * n_sp;
    let mine: Vec<usize> = (lo..lo + n_sp).collect();
    ctx.ops.gather_rows(&whole, &mine, logits)?;
    drop(whole);
    let own = (
        own_routing(routing, &mine, t * n_sp, k),
        aux,
        own_chosen(&chosen, &mine, k),
    );
    Ok((own, chosen))
}

/// The assignments of the rows `mine` (their global rows) out of the whole microbatch's
/// routing of `total` tokens, renumbered as the rank's rows; the fractions stay global.
fn own_routing(whole: Routing, mine: &[usize], total: usize, k: usize) -> Routing {
    let mut local = vec![usize::MAX; total];
    for (j, &g) in mine.iter().enumerate() {
        local[g] = j;
    }
    let routes: Vec<_> = whole
        .routes
        .into_iter()
        .filter_map(|mut r| {
            let j = local[r.token];
            (j != usize::MAX).then(|| {
                r.token = j;
                r
            })
        })
        .collect();
    Routing {
        dropped: mine.len() * k - routes.len(),
        routes,
        fraction: whole.fraction,
    }
}

/// The chosen experts of the rows `mine` ([tokens k] in token order; empty stays empty).
fn own_chosen(chosen: &[usize], mine: &[usize], k: usize) -> Vec<usize> {
    if chosen.is_empty() {
        return Vec::new();
    }
    mine.iter()
        .flat_map(|&g| chosen[g * k..(g + 1) * k].iter().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_keeps_its_own_assignments_renumbered_and_counts_its_drops() {
        // Four tokens, top-1; the whole routing kept tokens 0 (expert 1), 2 and 3 (expert 0)
        // and dropped token 1's. The rank holding global rows 3 and 1 (its rows 0 and 1)
        // keeps token 3 as its row 0, and one of its two assignments was dropped.
        let route = |token, expert| Route {
            token,
            expert,
            gate: 0.5,
        };
        let whole = Routing {
            routes: vec![route(2, 0), route(3, 0), route(0, 1)],
            fraction: vec![0.75, 0.25],
            dropped: 1,
        };
        let r = own_routing(whole, &[3, 1], 4, 1);
        let got: Vec<(usize, usize)> = r.routes.iter().map(|x| (x.token, x.expert)).collect();
        assert_eq!(got, vec![(0, 0)]);
        assert_eq!(r.dropped, 1);
        assert_eq!(r.fraction, vec![0.75, 0.25]);
        // Top-2 choices of four tokens: rows 3 and 1.
        let chosen = [0, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(own_chosen(&chosen, &[3, 1], 2), vec![6, 7, 2, 3]);
        assert!(own_chosen(&[], &[3, 1], 2).is_empty());
    }
}
