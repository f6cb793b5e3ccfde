//! The CPU backend's tensor ops, one family per file, each forward and backward, on host
//! slices; and [`TensorOps`] for the rank's [`CpuOps`], which runs them on the tensors'
//! storage, grouped below in the same families. A write into a bf16 tensor rounds each
//! element to bf16 (nearest, ties to even) after fp32 accumulation, where a GPU kernel would
//! round when storing its fp32 result.

pub mod activation;
pub mod adam;
pub mod attention;
#[cfg(test)]
mod attention_variants;
pub mod bias;
pub mod cross_entropy;
pub mod dropout;
pub mod elementwise;
pub mod flash;
pub mod gemm;
pub mod layout;
pub mod mamba;
pub mod mla;
pub mod moe;
pub mod norm;
pub mod rotary;
pub mod router;
pub mod ulysses;

use super::tensor::{dst, src, store, store_all, store_view};
use super::{Cpu, CpuOps, Tensor};
use crate::backend::{
    check_copy, AttnSaved, AttnShape, BlockShape, DeviceTensor, Keep, Route, Routing, Side,
    TensorOps, UlyssesGeo, UlyssesLayout, UlyssesPart, View, ViewMut,
};
use crate::error::ExecError;
use crate::tracker::Category;
use parsim_plan::plan::{Activation, AdamConfig, MoeShape, Norm};

impl TensorOps<Cpu> for CpuOps {
    // --- linear layers (ops/gemm.rs) ---

    fn linear_fwd(
        &self,
        x: &Tensor,
        w: View<'_, Tensor>,
        (n, i, o): (usize, usize, usize),
        y: &mut Tensor,
    ) -> Result<(), ExecError> {
        let g = self.gemm_counter();
        gemm::linear_fwd(g, x.data(), src(&w), n, i, o, y.data_mut());
        store_all(y);
        Ok(())
    }

    fn linear_dgrad(
        &self,
        dy: &Tensor,
        w: View<'_, Tensor>,
        (n, i, o): (usize, usize, usize),
        dx: &mut Tensor,
        acc: bool,
    ) -> Result<(), ExecError> {
        let g = self.gemm_counter();
        gemm::linear_dgrad(g, dy.data(), src(&w), n, i, o, dx.data_mut(), acc);
        store_all(dx);
        Ok(())
    }

    fn linear_wgrad(
        &self,
        dy: &Tensor,
        x: &Tensor,
        (n, i, o): (usize, usize, usize),
        mut dw: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        let g = self.gemm_counter();
        gemm::linear_wgrad(g, dy.data(), x.data(), n, i, o, dst(&mut dw));
        store_view(&mut dw);
        Ok(())
    }

    // --- norms (ops/norm.rs) ---

    fn norm_fwd(
        &self,
        kind: Norm,
        x: &Tensor,
        p: View<'_, Tensor>,
        eps: f32,
        y: &mut Tensor,
    ) -> Result<(), ExecError> {
        norm::norm_fwd(kind, x.data(), src(&p), x.cols(), eps, y.data_mut());
        store_all(y);
        Ok(())
    }

    fn norm_dgrad(
        &self,
        kind: Norm,
        x: &Tensor,
        p: View<'_, Tensor>,
        dy: &Tensor,
        eps: f32,
        dx: &mut Tensor,
        acc: bool,
    ) -> Result<(), ExecError> {
        let h = x.cols();
        if acc {
            norm::norm_dgrad_acc(kind, x.data(), src(&p), dy.data(), h, eps, dx.data_mut());
        } else {
            norm::norm_dgrad(kind, x.data(), src(&p), dy.data(), h, eps, dx.data_mut());
        }
        store_all(dx);
        Ok(())
    }

    fn norm_wgrad(
        &self,
        kind: Norm,
        x: &Tensor,
        dy: &Tensor,
        eps: f32,
        mut dp: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        norm::norm_wgrad(kind, x.data(), dy.data(), x.cols(), eps, dst(&mut dp));
        store_view(&mut dp);
        Ok(())
    }

    // --- rotary embedding (ops/rotary.rs) ---

    fn rotary(
        &self,
        x: &mut Tensor,
        heads: usize,
        positions: &[u32],
        theta: f32,
        inverse: bool,
    ) -> Result<(), ExecError> {
        let (rows, d) = (x.rows(), x.cols() / heads.max(1));
        rotary::rotary(x.data_mut(), rows, heads, d, positions, theta, inverse);
        store_all(x);
        Ok(())
    }

    // --- activations (ops/activation.rs) ---

    fn act_fwd(&self, kind: Activation, u: &Tensor, out: &mut Tensor) -> Result<(), ExecError> {
        let (n, f) = (out.rows(), out.cols());
        activation::act_fwd(kind, u.data(), n, f, out.data_mut());
        store_all(out);
        Ok(())
    }

    fn act_bwd_inplace(
        &self,
        kind: Activation,
        u: &mut Tensor,
        dout: &Tensor,
    ) -> Result<(), ExecError> {
        let (n, f) = (dout.rows(), dout.cols());
        activation::act_bwd_inplace(kind, u.data_mut(), dout.data(), n, f);
        store_all(u);
        Ok(())
    }

    // --- element-wise (ops/elementwise.rs) ---

    fn add(&self, a: &Tensor, b: &Tensor, out: &mut Tensor) -> Result<(), ExecError> {
        elementwise::add(a.data(), b.data(), out.data_mut());
        store_all(out);
        Ok(())
    }

    fn axpy(
        &self,
        alpha: f32,
        x: View<'_, Tensor>,
        mut y: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        elementwise::axpy(alpha, src(&x), dst(&mut y));
        store_view(&mut y);
        Ok(())
    }

    fn copy(&self, s: View<'_, Tensor>, mut d: ViewMut<'_, Tensor>) -> Result<(), ExecError> {
        check_copy(s.len(), d.len())?;
        dst(&mut d).copy_from_slice(src(&s));
        store_view(&mut d);
        Ok(())
    }

    fn fill(&self, t: &mut Tensor, value: f32) -> Result<(), ExecError> {
        t.data_mut().fill(value);
        store_all(t);
        Ok(())
    }

    // --- biases (ops/bias.rs) ---

    fn bias_add(&self, y: &mut Tensor, b: View<'_, Tensor>) -> Result<(), ExecError> {
        bias::bias_add(y.data_mut(), src(&b));
        store_all(y);
        Ok(())
    }

    fn bias_grad(&self, dy: &Tensor, mut db: ViewMut<'_, Tensor>) -> Result<(), ExecError> {
        bias::bias_grad(dy.data(), dst(&mut db));
        store_view(&mut db);
        Ok(())
    }

    // --- layouts: the fused projection and the embedding (ops/layout.rs) ---

    fn qkv_split(
        &self,
        qkv: &Tensor,
        q: &mut Tensor,
        k: &mut Tensor,
        v: &mut Tensor,
    ) -> Result<(), ExecError> {
        let n = qkv.rows();
        layout::qkv_split(qkv.data(), q.data_mut(), k.data_mut(), v.data_mut(), n);
        for t in [q, k, v] {
            store_all(t);
        }
        Ok(())
    }

    fn qkv_merge(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        qkv: &mut Tensor,
    ) -> Result<(), ExecError> {
        let n = qkv.rows();
        layout::qkv_merge(q.data(), k.data(), v.data(), qkv.data_mut(), n);
        store_all(qkv);
        Ok(())
    }

    fn embedding_gather(
        &self,
        table: View<'_, Tensor>,
        tokens: &[u32],
        lo: usize,
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        let h = out.cols();
        layout::embedding_gather(src(&table), tokens, lo, h, out.data_mut());
        store_all(out);
        Ok(())
    }

    fn embedding_scatter_add(
        &self,
        dy: &Tensor,
        tokens: &[u32],
        lo: usize,
        mut grad: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        let h = dy.cols();
        layout::embedding_scatter_add(dy.data(), tokens, lo, h, dst(&mut grad));
        store_view(&mut grad);
        Ok(())
    }

    // --- MLA's heads (ops/mla.rs) ---

    fn heads_concat(
        &self,
        a: &Tensor,
        b: &Tensor,
        heads: usize,
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        let n = out.rows();
        mla::heads_concat(a.data(), b.data(), out.data_mut(), n, heads);
        store_all(out);
        Ok(())
    }

    fn heads_split(
        &self,
        dout: &Tensor,
        heads: usize,
        da: &mut Tensor,
        db: &mut Tensor,
    ) -> Result<(), ExecError> {
        let n = dout.rows();
        mla::heads_split(dout.data(), da.data_mut(), db.data_mut(), n, heads);
        store_all(da);
        store_all(db);
        Ok(())
    }

    // --- vocab-parallel cross-entropy (ops/cross_entropy.rs) ---

    fn ce_row_max(&self, logits: &Tensor, max: &mut Tensor) -> Result<(), ExecError> {
        cross_entropy::row_max(logits.data(), logits.cols(), max.data_mut());
        Ok(())
    }

    fn ce_exp(
        &self,
        logits: &Tensor,
        max: &Tensor,
        probs: &mut Tensor,
        sum: &mut Tensor,
    ) -> Result<(), ExecError> {
        let v = logits.cols();
        cross_entropy::exp_rows(
            logits.data(),
            v,
            max.data(),
            probs.data_mut(),
            sum.data_mut(),
        );
        Ok(())
    }

    fn ce_target_logit(
        &self,
        logits: &Tensor,
        targets: &[u32],
        lo: usize,
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        let v = logits.cols();
        cross_entropy::target_logit(logits.data(), v, targets, lo, out.data_mut());
        Ok(())
    }

    fn ce_loss(
        &self,
        probs: &mut Tensor,
        sum: &Tensor,
        max: &Tensor,
        target_logit: &Tensor,
    ) -> Result<f64, ExecError> {
        let v = probs.cols();
        let l = cross_entropy::loss(
            probs.data_mut(),
            v,
            sum.data(),
            max.data(),
            target_logit.data(),
        );
        Ok(l)
    }

    fn ce_grad(
        &self,
        probs: &mut Tensor,
        targets: &[u32],
        lo: usize,
        scale: f32,
    ) -> Result<(), ExecError> {
        let v = probs.cols();
        cross_entropy::grad(probs.data_mut(), v, targets, lo, scale);
        store_all(probs);
        Ok(())
    }

    // --- whole-sequence attention (ops/attention.rs) ---

    fn attn_fwd(
        &self,
        sh: &AttnShape,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &mut Tensor,
        keep: Keep,
    ) -> Result<AttnSaved<Tensor>, ExecError> {
        let saved = attention::attn_fwd(
            self,
            sh,
            q.data(),
            k.data(),
            v.data(),
            o.data_mut(),
            keep,
            q.dtype(),
        );
        store_all(o);
        Ok(saved)
    }

    fn attn_bwd(
        &self,
        sh: &AttnShape,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        saved: &AttnSaved<Tensor>,
        dout: &Tensor,
        dq: &mut Tensor,
        dk: &mut Tensor,
        dv: &mut Tensor,
    ) -> Result<(), ExecError> {
        attention::attn_bwd(
            self,
            sh,
            q.data(),
            k.data(),
            v.data(),
            saved,
            dout.data(),
            dq.data_mut(),
            dk.data_mut(),
            dv.data_mut(),
        );
        for t in [dq, dk, dv] {
            store_all(t);
        }
        Ok(())
    }

    // --- block attention (ops/flash.rs) ---

    fn flash_fwd_block(
        &self,
        sh: &BlockShape,
        q: &Tensor,
        qs: Side<'_>,
        k: View<'_, Tensor>,
        v: View<'_, Tensor>,
        ks: Side<'_>,
        acc: &mut Tensor,
        max: &mut Tensor,
        sum: &mut Tensor,
        tile: &mut Tensor,
    ) -> Result<u64, ExecError> {
        let mut st = flash::Online {
            max: max.data_mut(),
            sum: sum.data_mut(),
        };
        let work = flash::forward_block(
            self.gemm_counter(),
            sh,
            q.data(),
            qs,
            src(&k),
            src(&v),
            ks,
            acc.data_mut(),
            &mut st,
            tile.data_mut(),
        );
        store_all(acc);
        Ok(work)
    }

    fn flash_finish(
        &self,
        sh: &BlockShape,
        rows: usize,
        acc: &mut Tensor,
        max: &Tensor,
        sum: &Tensor,
        lse: &mut Tensor,
    ) -> Result<(), ExecError> {
        flash::finish(
            sh,
            rows,
            acc.data_mut(),
            max.data(),
            sum.data(),
            lse.data_mut(),
        );
        store_all(acc);
        Ok(())
    }

    fn flash_delta(
        &self,
        sh: &BlockShape,
        rows: usize,
        dout: &Tensor,
        o: &Tensor,
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        flash::delta(sh, rows, dout.data(), o.data(), out.data_mut());
        Ok(())
    }

    fn attn_sink_fwd(
        &self,
        sh: &BlockShape,
        rows: usize,
        o: &mut Tensor,
        lse: &mut Tensor,
        sinks: View<'_, Tensor>,
    ) -> Result<(), ExecError> {
        flash::sink_fwd(sh, rows, o.data_mut(), lse.data_mut(), src(&sinks));
        store_all(o);
        Ok(())
    }

    fn attn_sink_grad(
        &self,
        sh: &BlockShape,
        rows: usize,
        lse: &Tensor,
        delta: &Tensor,
        sinks: View<'_, Tensor>,
        mut dsinks: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        let d = dst(&mut dsinks);
        flash::sink_grad(sh, rows, lse.data(), delta.data(), src(&sinks), d);
        store_view(&mut dsinks);
        Ok(())
    }

    fn flash_bwd_block(
        &self,
        sh: &BlockShape,
        q: &Tensor,
        qs: Side<'_>,
        k: View<'_, Tensor>,
        v: View<'_, Tensor>,
        ks: Side<'_>,
        dout: &Tensor,
        lse: &Tensor,
        delta: &Tensor,
        dq: &mut Tensor,
        mut dk: ViewMut<'_, Tensor>,
        mut dv: ViewMut<'_, Tensor>,
        p_tile: &mut Tensor,
        dp_tile: &mut Tensor,
    ) -> Result<u64, ExecError> {
        let work = flash::backward_block(
            self.gemm_counter(),
            sh,
            q.data(),
            qs,
            src(&k),
            src(&v),
            ks,
            dout.data(),
            lse.data(),
            delta.data(),
            dq.data_mut(),
            dst(&mut dk),
            dst(&mut dv),
            p_tile.data_mut(),
            dp_tile.data_mut(),
        );
        store_all(dq);
        let (rk, rv) = (dk.range.clone(), dv.range.clone());
        store(dk.tensor, rk);
        store(dv.tensor, rv);
        Ok(work)
    }

    // --- Ulysses' all-to-all layouts (ops/ulysses.rs) ---

    fn ulysses_pack(
        &self,
        geo: &UlyssesGeo,
        from: UlyssesLayout,
        xs: &[(&Tensor, UlyssesPart)],
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        let hx: Vec<(&[f32], UlyssesPart)> = xs.iter().map(|(t, p)| (t.data(), *p)).collect();
        ulysses::pack(geo, from, &hx, out.data_mut());
        store_all(out);
        Ok(())
    }

    fn ulysses_unpack(
        &self,
        geo: &UlyssesGeo,
        to: UlyssesLayout,
        recv: &Tensor,
        parts: &[UlyssesPart],
        outs: &mut [&mut Tensor],
    ) -> Result<(), ExecError> {
        {
            let mut ho: Vec<&mut [f32]> = outs.iter_mut().map(|t| t.data_mut()).collect();
            ulysses::unpack(geo, to, recv.data(), parts, &mut ho);
        }
        for t in outs.iter_mut() {
            store_all(t);
        }
        Ok(())
    }

    // --- MoE routing and token permutation (ops/moe.rs, ops/router.rs) ---

    fn moe_route(&self, logits: &mut Tensor, moe: &MoeShape) -> Result<(Routing, f64), ExecError> {
        let (n, e) = (logits.rows(), logits.cols());
        moe::softmax_rows(logits.data_mut(), e);
        let r = moe::route(logits.data(), n, moe);
        let aux = moe::aux_loss(moe.aux_loss_coeff, logits.data(), n, &r.fraction);
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
        let aux = moe::aux_loss(moe.aux_loss_coeff, logits.data(), n, &r.fraction);
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
        moe::router_bwd(d.data_mut(), probs.data(), fraction, aux_scale);
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
        router::router_bwd(
            d.data_mut(),
            scores.data(),
            chosen,
            moe,
            fraction,
            aux_scale,
        );
        store_all(d);
        Ok(())
    }

    fn gather_rows(&self, src: &Tensor, rows: &[usize], out: &mut Tensor) -> Result<(), ExecError> {
        let h = src.cols();
        moe::gather_rows(src.data(), rows, h, out.data_mut());
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
        moe::scatter_add_rows(src.data(), rows, weights, h, out.data_mut());
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
        moe::combine_bwd(
            dy.data(),
            y.data(),
            routes,
            h,
            e,
            dprobs.data_mut(),
            dsend.data_mut(),
        );
        store_all(dprobs);
        store_all(dsend);
        Ok(())
    }

    // --- dropout (ops/dropout.rs) ---

    fn dropout_inplace(
        &self,
        key: &crate::rng::DropoutKey,
        tokens: &[u64],
        col_offset: u64,
        mut x: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        dropout::dropout_inplace(key, tokens, col_offset, dst(&mut x))?;
        store_view(&mut x);
        Ok(())
    }

    fn dropout_save(
        &self,
        key: &crate::rng::DropoutKey,
        tokens: &[u64],
        col_offset: u64,
        mut x: ViewMut<'_, Tensor>,
    ) -> Result<Tensor, ExecError> {
        let n = x.range.len();
        let mut keep = vec![0.0; n];
        dropout::dropout_save(key, tokens, col_offset, dst(&mut x), &mut keep)?;
        store_view(&mut x);
        Ok(Tensor::typed(
            self.memory(),
            Category::Activations,
            parsim_plan::DType::U8,
            &[n],
            keep,
        ))
    }

    fn dropout_apply(
        &self,
        mask: &Tensor,
        scale: f32,
        mut x: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        dropout::dropout_apply(mask.data(), scale, dst(&mut x));
        store_view(&mut x);
        Ok(())
    }

    // --- the optimizer (ops/adam.rs) ---

    fn adam(
        &self,
        c: &AdamConfig,
        t: u32,
        mut p: ViewMut<'_, Tensor>,
        g: View<'_, Tensor>,
        m: &mut Tensor,
        v: &mut Tensor,
        weight_copy: Option<ViewMut<'_, Tensor>>,
    ) -> Result<(), ExecError> {
        adam::adam_step(c, t, dst(&mut p), src(&g), m.data_mut(), v.data_mut());
        if let Some(mut w) = weight_copy {
            dst(&mut w).copy_from_slice(&p.tensor.data()[p.range.clone()]);
            store_view(&mut w);
        }
        Ok(())
    }
}
