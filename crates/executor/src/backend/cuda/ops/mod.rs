//! [`TensorOps`] on the CUDA backend: every op is one or more launches of the typed wrappers
//! of each family's `kernel.rs` (or cuBLASLt for the linear layers) on the rank's compute stream, with the
//! operands staged to the kernel's dtype by [`CudaRank`]'s helpers. Host metadata (tokens,
//! positions, routes) is uploaded as small index arrays; the only host reads are the loss
//! rows of `ce_loss` and the routers' n x k chosen experts and gates (routing.rs: the
//! capacity's drops are host metadata, as the split sizes of the dispatch all-to-all are on
//! the host for NCCL too).

pub mod activation;
pub mod adam;
pub mod cross_entropy;
pub mod dropout;
pub mod elementwise;
pub mod embedding;
pub mod flash;
pub mod heads;
pub mod launch;
pub mod linear;
pub mod moe;
pub mod norm;
pub mod rotary;
pub mod ulysses;

use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::{
    AttnSaved, AttnShape, BlockShape, Keep, Route, Routing, Side, TensorOps, UlyssesGeo,
    UlyssesLayout, UlyssesPart, View, ViewMut,
};
use crate::error::ExecError;
use crate::plan::{Activation, AdamConfig, MoeShape, Norm};

/// Each method is its family's function (`ops/<family>/mod.rs`).
impl TensorOps<Cuda> for CudaRank {
    fn linear_fwd(
        &self,
        x: &CudaTensor,
        w: View<'_, CudaTensor>,
        dims: (usize, usize, usize),
        y: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        linear::linear_fwd(self, x, w, dims, y)
    }

    fn linear_dgrad(
        &self,
        dy: &CudaTensor,
        w: View<'_, CudaTensor>,
        dims: (usize, usize, usize),
        dx: &mut CudaTensor,
        acc: bool,
    ) -> Result<(), ExecError> {
        linear::linear_dgrad(self, dy, w, dims, dx, acc)
    }

    fn linear_wgrad(
        &self,
        dy: &CudaTensor,
        x: &CudaTensor,
        dims: (usize, usize, usize),
        dw: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        linear::linear_wgrad(self, dy, x, dims, dw)
    }

    fn norm_fwd(
        &self,
        kind: Norm,
        x: &CudaTensor,
        p: View<'_, CudaTensor>,
        eps: f32,
        y: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        norm::norm_fwd(self, kind, x, p, eps, y)
    }

    fn norm_dgrad(
        &self,
        kind: Norm,
        x: &CudaTensor,
        p: View<'_, CudaTensor>,
        dy: &CudaTensor,
        eps: f32,
        dx: &mut CudaTensor,
        acc: bool,
    ) -> Result<(), ExecError> {
        norm::norm_dgrad(self, kind, x, p, dy, eps, dx, acc)
    }

    fn norm_wgrad(
        &self,
        kind: Norm,
        x: &CudaTensor,
        dy: &CudaTensor,
        eps: f32,
        dp: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        norm::norm_wgrad(self, kind, x, dy, eps, dp)
    }

    fn rotary(
        &self,
        x: &mut CudaTensor,
        heads: usize,
        positions: &[u32],
        theta: f32,
        inverse: bool,
    ) -> Result<(), ExecError> {
        rotary::rotary(self, x, heads, positions, theta, inverse)
    }

    fn act_fwd(
        &self,
        kind: Activation,
        u: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        activation::act_fwd(self, kind, u, out)
    }

    fn act_bwd_inplace(
        &self,
        kind: Activation,
        u: &mut CudaTensor,
        dout: &CudaTensor,
    ) -> Result<(), ExecError> {
        activation::act_bwd_inplace(self, kind, u, dout)
    }

    fn add(&self, a: &CudaTensor, b: &CudaTensor, out: &mut CudaTensor) -> Result<(), ExecError> {
        elementwise::add(self, a, b, out)
    }

    fn bias_add(&self, y: &mut CudaTensor, b: View<'_, CudaTensor>) -> Result<(), ExecError> {
        linear::bias_add(self, y, b)
    }

    fn bias_grad(&self, dy: &CudaTensor, db: ViewMut<'_, CudaTensor>) -> Result<(), ExecError> {
        linear::bias_grad(self, dy, db)
    }

    fn axpy(
        &self,
        alpha: f32,
        x: View<'_, CudaTensor>,
        y: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        elementwise::axpy(self, alpha, x, y)
    }

    fn copy(
        &self,
        src: View<'_, CudaTensor>,
        dst: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        elementwise::copy(self, src, dst)
    }

    fn qkv_split(
        &self,
        qkv: &CudaTensor,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        v: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        linear::qkv_split(self, qkv, q, k, v)
    }

    fn qkv_merge(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        qkv: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        linear::qkv_merge(self, q, k, v, qkv)
    }

    fn embedding_gather(
        &self,
        table: View<'_, CudaTensor>,
        tokens: &[u32],
        lo: usize,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        embedding::embedding_gather(self, table, tokens, lo, out)
    }

    fn embedding_scatter_add(
        &self,
        dy: &CudaTensor,
        tokens: &[u32],
        lo: usize,
        grad: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        embedding::embedding_scatter_add(self, dy, tokens, lo, grad)
    }

    fn ce_row_max(&self, logits: &CudaTensor, max: &mut CudaTensor) -> Result<(), ExecError> {
        cross_entropy::ce_row_max(self, logits, max)
    }

    fn ce_exp(
        &self,
        logits: &CudaTensor,
        max: &CudaTensor,
        probs: &mut CudaTensor,
        sum: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        cross_entropy::ce_exp(self, logits, max, probs, sum)
    }

    fn ce_target_logit(
        &self,
        logits: &CudaTensor,
        targets: &[u32],
        lo: usize,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        cross_entropy::ce_target_logit(self, logits, targets, lo, out)
    }

    fn ce_loss(
        &self,
        probs: &mut CudaTensor,
        sum: &CudaTensor,
        max: &CudaTensor,
        target_logit: &CudaTensor,
    ) -> Result<f64, ExecError> {
        cross_entropy::ce_loss(self, probs, sum, max, target_logit)
    }

    fn ce_grad(
        &self,
        probs: &mut CudaTensor,
        targets: &[u32],
        lo: usize,
        scale: f32,
    ) -> Result<(), ExecError> {
        cross_entropy::ce_grad(self, probs, targets, lo, scale)
    }

    fn attn_fwd(
        &self,
        sh: &AttnShape,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        o: &mut CudaTensor,
        keep: Keep,
    ) -> Result<AttnSaved<CudaTensor>, ExecError> {
        flash::attn_fwd(self, sh, q, k, v, o, keep)
    }

    fn attn_bwd(
        &self,
        sh: &AttnShape,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        _saved: &AttnSaved<CudaTensor>,
        dout: &CudaTensor,
        dq: &mut CudaTensor,
        dk: &mut CudaTensor,
        dv: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        flash::attn_bwd(self, sh, q, k, v, _saved, dout, dq, dk, dv)
    }

    fn moe_route(
        &self,
        logits: &mut CudaTensor,
        moe: &MoeShape,
    ) -> Result<(Routing, f64), ExecError> {
        moe::moe_route(self, logits, moe)
    }

    fn gather_rows(
        &self,
        src: &CudaTensor,
        rows: &[usize],
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        moe::gather_rows(self, src, rows, out)
    }

    fn scatter_add_rows(
        &self,
        src: &CudaTensor,
        rows: &[usize],
        weights: Option<&[f32]>,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        moe::scatter_add_rows(self, src, rows, weights, out)
    }

    fn moe_combine_bwd(
        &self,
        dy: &CudaTensor,
        y: &CudaTensor,
        routes: &[Route],
        dprobs: &mut CudaTensor,
        dsend: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        moe::moe_combine_bwd(self, dy, y, routes, dprobs, dsend)
    }

    fn moe_router_bwd(
        &self,
        d: &mut CudaTensor,
        probs: &CudaTensor,
        fraction: &[f64],
        aux_scale: f64,
    ) -> Result<(), ExecError> {
        moe::moe_router_bwd(self, d, probs, fraction, aux_scale)
    }

    fn fill(&self, t: &mut CudaTensor, value: f32) -> Result<(), ExecError> {
        elementwise::fill(self, t, value)
    }

    fn flash_fwd_block(
        &self,
        sh: &BlockShape,
        q: &CudaTensor,
        qs: Side<'_>,
        k: View<'_, CudaTensor>,
        v: View<'_, CudaTensor>,
        ks: Side<'_>,
        acc: &mut CudaTensor,
        max: &mut CudaTensor,
        sum: &mut CudaTensor,
        _tile: &mut CudaTensor,
    ) -> Result<u64, ExecError> {
        flash::flash_fwd_block(self, sh, q, qs, k, v, ks, acc, max, sum, _tile)
    }

    fn flash_finish(
        &self,
        sh: &BlockShape,
        rows: usize,
        acc: &mut CudaTensor,
        max: &CudaTensor,
        sum: &CudaTensor,
        lse: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        flash::flash_finish(self, sh, rows, acc, max, sum, lse)
    }

    fn flash_delta(
        &self,
        sh: &BlockShape,
        rows: usize,
        dout: &CudaTensor,
        o: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        flash::flash_delta(self, sh, rows, dout, o, out)
    }

    fn flash_bwd_block(
        &self,
        sh: &BlockShape,
        q: &CudaTensor,
        qs: Side<'_>,
        k: View<'_, CudaTensor>,
        v: View<'_, CudaTensor>,
        ks: Side<'_>,
        dout: &CudaTensor,
        lse: &CudaTensor,
        delta: &CudaTensor,
        dq: &mut CudaTensor,
        dk: ViewMut<'_, CudaTensor>,
        dv: ViewMut<'_, CudaTensor>,
        _p_tile: &mut CudaTensor,
        _dp_tile: &mut CudaTensor,
    ) -> Result<u64, ExecError> {
        flash::flash_bwd_block(
            self, sh, q, qs, k, v, ks, dout, lse, delta, dq, dk, dv, _p_tile, _dp_tile,
        )
    }

    fn ulysses_pack(
        &self,
        geo: &UlyssesGeo,
        from: UlyssesLayout,
        xs: &[(&CudaTensor, UlyssesPart)],
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        ulysses::ulysses_pack(self, geo, from, xs, out)
    }

    fn ulysses_unpack(
        &self,
        geo: &UlyssesGeo,
        to: UlyssesLayout,
        recv: &CudaTensor,
        parts: &[UlyssesPart],
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), ExecError> {
        ulysses::ulysses_unpack(self, geo, to, recv, parts, outs)
    }

    fn adam(
        &self,
        c: &AdamConfig,
        t: u32,
        p: ViewMut<'_, CudaTensor>,
        g: View<'_, CudaTensor>,
        m: &mut CudaTensor,
        v: &mut CudaTensor,
        weight_copy: Option<ViewMut<'_, CudaTensor>>,
    ) -> Result<(), ExecError> {
        adam::adam(self, c, t, p, g, m, v, weight_copy)
    }

    fn heads_concat(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        heads: usize,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        Ok(heads::heads_concat(self, a, b, heads, out)?)
    }

    fn heads_split(
        &self,
        dout: &CudaTensor,
        heads: usize,
        da: &mut CudaTensor,
        db: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        Ok(heads::heads_split(self, dout, heads, da, db)?)
    }

    fn moe_route_scored(
        &self,
        logits: &mut CudaTensor,
        bias: Option<&[f32]>,
        moe: &MoeShape,
    ) -> Result<(Routing, f64, Vec<usize>), ExecError> {
        moe::moe_route_scored(self, logits, bias, moe)
    }

    fn moe_router_scored_bwd(
        &self,
        d: &mut CudaTensor,
        scores: &CudaTensor,
        chosen: &[usize],
        moe: &MoeShape,
        fraction: &[f64],
        aux_scale: f64,
    ) -> Result<(), ExecError> {
        moe::moe_router_scored_bwd(self, d, scores, chosen, moe, fraction, aux_scale)
    }

    fn dropout_inplace(
        &self,
        key: &crate::rng::DropoutKey,
        tokens: &[u64],
        col_offset: u64,
        x: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        dropout::dropout_inplace(self, key, tokens, col_offset, x)
    }

    fn dropout_save(
        &self,
        key: &crate::rng::DropoutKey,
        tokens: &[u64],
        col_offset: u64,
        x: ViewMut<'_, CudaTensor>,
    ) -> Result<CudaTensor, ExecError> {
        dropout::dropout_save(self, key, tokens, col_offset, x)
    }

    fn dropout_apply(
        &self,
        mask: &CudaTensor,
        scale: f32,
        x: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        dropout::dropout_apply(self, mask, scale, x)
    }
}
