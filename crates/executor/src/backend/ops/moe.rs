//! MoE routing and token permutation (CPU twin: `cpu/ops/moe.rs` and `cpu/ops/router.rs`;
//! CUDA: `cuda/ops/moe/`), and the routes they produce.

use super::family::op_list;

/// One kept assignment of a token to an expert (MoE routing: host metadata, as the split
/// sizes of the dispatch all-to-all are on the host for NCCL too).
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

op_list! { $ moe_ops:
    /// The router (plain, and with DeepSeek-V3's options), its backward, the token
    /// permutation and the gated combine's backward.
    MoeOps {
        /// Softmax of `logits` [n, E] in place (they become the probabilities), then
        /// top-k with the capacity's drops; returns the routing and the load-balancing
        /// loss.
        fn moe_route(
            logits: &mut B::Tensor,
            moe: &parsim_plan::plan::MoeShape,
        ) -> (Routing, f64) = memory(2 * tb(logits));
        /// The router with DeepSeek-V3's options (`moe.router`): scores of `logits`
        /// [n, E] in place (softmax or sigmoid), then per token the top-k of score +
        /// `bias` (host, [E]; for selection only) within its best `group_topk` groups;
        /// gates are the chosen unbiased scores, renormalised over the k when asked;
        /// capacity drops as `moe_route`. Returns the routing, the load-balancing loss
        /// (softmax scores) and the k chosen experts of every token before dropping
        /// ([n k], choice order).
        fn moe_route_scored(
            logits: &mut B::Tensor,
            bias: Option<&[f32]>,
            moe: &parsim_plan::plan::MoeShape,
        ) -> (Routing, f64, Vec<usize>) = memory(2 * tb(logits));
        /// Backward of the router in place: `d` [n, E] (probabilities' gradient, plus
        /// `aux_scale` f_i of the load-balancing loss) becomes the logits' gradient.
        fn moe_router_bwd(
            d: &mut B::Tensor,
            probs: &B::Tensor,
            fraction: &[f64],
            aux_scale: f64,
        ) -> () = memory(2 * tb(d) + tb(probs));
        /// Backward of `moe_route_scored` in place: `d` [n, E] (the gates' gradients at
        /// the chosen entries, zero elsewhere) becomes the logits' gradient, through
        /// the renormalisation, the load-balancing loss's `aux_scale` f_i (softmax
        /// only) and the score function; `scores` [n, E] as the forward left them.
        fn moe_router_scored_bwd(
            d: &mut B::Tensor,
            scores: &B::Tensor,
            chosen: &[usize],
            moe: &parsim_plan::plan::MoeShape,
            fraction: &[f64],
            aux_scale: f64,
        ) -> () = memory(2 * tb(d) + tb(scores));
        /// Token permutation: out[i] = src[rows[i]].
        fn gather_rows(src: &B::Tensor, rows: &[usize], out: &mut B::Tensor) -> ()
            = memory(2 * tb(out));
        /// Its inverse, adding: out[rows[i]] += w_i src[i] (w_i = 1 without weights).
        fn scatter_add_rows(
            src: &B::Tensor,
            rows: &[usize],
            weights: Option<&[f32]>,
            out: &mut B::Tensor,
        ) -> () = memory(3 * tb(src));
        /// Backward of the gated combine: gate gradients into `dprobs` [n, E], the
        /// routed rows' gradients into `dsend` [routes, h].
        fn moe_combine_bwd(
            dy: &B::Tensor,
            y: &B::Tensor,
            routes: &[Route],
            dprobs: &mut B::Tensor,
            dsend: &mut B::Tensor,
        ) -> () = memory(tb(dy) + tb(y) + tb(dprobs) + tb(dsend));
    }
}
