//! Mixture-of-experts kernels: the router's softmax then top-k with the expert capacity's
//! drops and the load-balancing loss (see `layers::moe` for the policies), token permutation
//! (rows gathered in route order) and its inverse (rows added back into their tokens, weighted
//! by the gates), and the backward of the combine and of the router.

use super::router;
use super::routes::{aux_loss, finish, router_bwd, softmax_rows};
use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{store_all, Tensor};
use crate::backend::ops::{MoeOps, Route, Routing};

use crate::error::ExecError;
use parsim_plan::plan::MoeShape;

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
    finish(per_expert, n, moe)
}

/// out[i] = src[rows[i]] (rows of `h`): tokens permuted into route order.
pub fn gather_rows(src: &[f32], rows: &[usize], h: usize, out: &mut [f32]) {
    for (i, &r) in rows.iter().enumerate() {
        out[i * h..(i + 1) * h].copy_from_slice(&src[r * h..(r + 1) * h]);
    }
}

/// out[rows[i]] += w_i src[i] (w_i = 1 without weights): rows added back into their tokens.
pub fn scatter_add_rows(
    src: &[f32],
    rows: &[usize],
    weights: Option<&[f32]>,
    h: usize,
    out: &mut [f32],
) {
    for (i, &r) in rows.iter().enumerate() {
        let w = weights.map_or(1.0, |w| w[i]);
        let dst = &mut out[r * h..(r + 1) * h];
        for (o, v) in dst.iter_mut().zip(&src[i * h..(i + 1) * h]) {
            *o += w * v;
        }
    }
}

/// Backward of the combine out[t] = sum_r gate_r y_r: d gate_r = dy[t] . y_r into
/// `dprobs` [n, e] at (t, expert), and dy_r = gate_r dy[t] into `dsend` [routes, h].
pub fn combine_bwd(
    dy: &[f32],
    y: &[f32],
    routes: &[Route],
    h: usize,
    e: usize,
    dprobs: &mut [f32],
    dsend: &mut [f32],
) {
    for (i, r) in routes.iter().enumerate() {
        let g = &dy[r.token * h..(r.token + 1) * h];
        let yr = &y[i * h..(i + 1) * h];
        dprobs[r.token * e + r.expert] = g.iter().zip(yr).map(|(a, b)| a * b).sum();
        for (d, v) in dsend[i * h..(i + 1) * h].iter_mut().zip(g) {
            *d = r.gate * v;
        }
    }
}

impl MoeOps<Cpu> for CpuOps {
    fn moe_route(&self, logits: &mut Tensor, moe: &MoeShape) -> Result<(Routing, f64), ExecError> {
        let (n, e) = (logits.rows(), logits.cols());
        softmax_rows(logits.data_mut(), e);
        let r = route(logits.data(), n, moe);
        let aux = aux_loss(moe.aux_loss_coeff, logits.data(), n, &r.fraction);
        store_all(logits);
        Ok((r, aux))
    }

    fn moe_route_scored(
        &self,
        logits: &mut Tensor,
        bias: Option<&[f32]>,
        moe: &MoeShape,
    ) -> Result<(Routing, f64, Vec<usize>), ExecError> {
        let (n, e) = (logits.rows(), logits.cols());
        router::scores(logits.data_mut(), e, moe.router.score);
        let (r, chosen) = router::route(logits.data(), n, bias, moe);
        let aux = aux_loss(moe.aux_loss_coeff, logits.data(), n, &r.fraction);
        store_all(logits);
        Ok((r, aux, chosen))
    }

    fn moe_router_bwd(
        &self,
        d: &mut Tensor,
        probs: &Tensor,
        fraction: &[f64],
        aux_scale: f64,
    ) -> Result<(), ExecError> {
        router_bwd(d.data_mut(), probs.data(), fraction, aux_scale);
        store_all(d);
        Ok(())
    }

    fn moe_router_scored_bwd(
        &self,
        d: &mut Tensor,
        scores: &Tensor,
        chosen: &[usize],
        moe: &MoeShape,
        fraction: &[f64],
        aux_scale: f64,
    ) -> Result<(), ExecError> {
        let s = scores.data();
        router::router_bwd(d.data_mut(), s, chosen, moe, fraction, aux_scale);
        store_all(d);
        Ok(())
    }

    fn gather_rows(&self, src: &Tensor, rows: &[usize], out: &mut Tensor) -> Result<(), ExecError> {
        gather_rows(src.data(), rows, src.cols(), out.data_mut());
        store_all(out);
        Ok(())
    }

    fn scatter_add_rows(
        &self,
        src: &Tensor,
        rows: &[usize],
        weights: Option<&[f32]>,
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        let h = out.cols();
        scatter_add_rows(src.data(), rows, weights, h, out.data_mut());
        store_all(out);
        Ok(())
    }

    fn moe_combine_bwd(
        &self,
        dy: &Tensor,
        y: &Tensor,
        routes: &[Route],
        dprobs: &mut Tensor,
        dsend: &mut Tensor,
    ) -> Result<(), ExecError> {
        let (h, e) = (dy.cols(), dprobs.cols());
        let (dp, ds) = (dprobs.data_mut(), dsend.data_mut());
        combine_bwd(dy.data(), y.data(), routes, h, e, dp, ds);
        store_all(dprobs);
        store_all(dsend);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::routes::capacity;
    use super::*;
    use parsim_plan::plan::MoeShape;

    fn shape(e: usize, k: usize, cf: f32) -> MoeShape {
        MoeShape {
            num_experts: e,
            top_k: k,
            ffn: 4,
            first_k_dense: 0,
            capacity_factor: cf,
            aux_loss_coeff: 0.01,
            ..MoeShape::default()
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
