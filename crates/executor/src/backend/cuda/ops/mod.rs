//! [`TensorOps`] on the CUDA backend: every op is one or more launches of the typed wrappers of
//! each family's `kernel.rs` (or cuBLASLt for the linear layers) on the rank's compute stream, with
//! the operands staged to the kernel's dtype by [`CudaRank`]'s helpers. Host metadata (tokens,
//! positions, routes) is uploaded as small index arrays; the only host reads are the loss rows of
//! `ce_loss` and the routers' n x k chosen experts and gates (routing.rs: the capacity's drops are
//! host metadata, as the split sizes of the dispatch all-to-all are on the host for NCCL too).

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
use parsim_plan::plan::{Activation, AdamConfig, MoeShape, Norm};

/// Writes each listed method as a call of its family's function of the same name and
/// arguments: `family::method(args) -> Ret;` becomes
/// `fn method(&self, args) -> Ret { family::method(self, args) }`.
macro_rules! by_family {
    ($($fam:ident::$name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(fn $name(&self, $($arg: $ty),*) -> $ret {
            $fam::$name(self, $($arg),*)
        })*
    };
}

/// Each method is its family's function (`ops/<family>/mod.rs`).
#[rustfmt::skip]
/// No Mamba-2 kernels yet: the mixer's ops answer with the refusal naming `model.mamba`.
impl crate::backend::MambaOps<Cuda> for CudaRank {}

impl TensorOps<Cuda> for CudaRank {
    by_family! {
        linear::linear_fwd(
            x: &CudaTensor, w: View<'_, CudaTensor>, dims: (usize, usize, usize),
            y: &mut CudaTensor) -> Result<(), ExecError>;
        linear::linear_dgrad(
            dy: &CudaTensor, w: View<'_, CudaTensor>, dims: (usize, usize, usize),
            dx: &mut CudaTensor, acc: bool) -> Result<(), ExecError>;
        linear::linear_wgrad(
            dy: &CudaTensor, x: &CudaTensor, dims: (usize, usize, usize),
            dw: ViewMut<'_, CudaTensor>) -> Result<(), ExecError>;
        norm::norm_fwd(
            kind: Norm, x: &CudaTensor, p: View<'_, CudaTensor>, eps: f32, y: &mut CudaTensor)
            -> Result<(), ExecError>;
        norm::norm_dgrad(
            kind: Norm, x: &CudaTensor, p: View<'_, CudaTensor>, dy: &CudaTensor, eps: f32,
            dx: &mut CudaTensor, acc: bool) -> Result<(), ExecError>;
        norm::norm_wgrad(
            kind: Norm, x: &CudaTensor, dy: &CudaTensor, eps: f32, dp: ViewMut<'_, CudaTensor>)
            -> Result<(), ExecError>;
        rotary::rotary(
            x: &mut CudaTensor, heads: usize, positions: &[u32], theta: f32, inverse: bool)
            -> Result<(), ExecError>;
        activation::act_fwd(
            kind: Activation, u: &CudaTensor, out: &mut CudaTensor) -> Result<(), ExecError>;
        activation::act_bwd_inplace(
            kind: Activation, u: &mut CudaTensor, dout: &CudaTensor) -> Result<(), ExecError>;
        elementwise::add(
            a: &CudaTensor, b: &CudaTensor, out: &mut CudaTensor) -> Result<(), ExecError>;
        linear::bias_add(y: &mut CudaTensor, b: View<'_, CudaTensor>) -> Result<(), ExecError>;
        linear::bias_grad(dy: &CudaTensor, db: ViewMut<'_, CudaTensor>) -> Result<(), ExecError>;
        elementwise::axpy(
            alpha: f32, x: View<'_, CudaTensor>, y: ViewMut<'_, CudaTensor>)
            -> Result<(), ExecError>;
        elementwise::copy(
            src: View<'_, CudaTensor>, dst: ViewMut<'_, CudaTensor>) -> Result<(), ExecError>;
        linear::qkv_split(
            qkv: &CudaTensor, q: &mut CudaTensor, k: &mut CudaTensor, v: &mut CudaTensor)
            -> Result<(), ExecError>;
        linear::qkv_merge(
            q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, qkv: &mut CudaTensor)
            -> Result<(), ExecError>;
        embedding::embedding_gather(
            table: View<'_, CudaTensor>, tokens: &[u32], lo: usize, out: &mut CudaTensor)
            -> Result<(), ExecError>;
        embedding::embedding_scatter_add(
            dy: &CudaTensor, tokens: &[u32], lo: usize, grad: ViewMut<'_, CudaTensor>)
            -> Result<(), ExecError>;
        cross_entropy::ce_row_max(
            logits: &CudaTensor, max: &mut CudaTensor) -> Result<(), ExecError>;
        cross_entropy::ce_exp(
            logits: &CudaTensor, max: &CudaTensor, probs: &mut CudaTensor, sum: &mut CudaTensor)
            -> Result<(), ExecError>;
        cross_entropy::ce_target_logit(
            logits: &CudaTensor, targets: &[u32], lo: usize, out: &mut CudaTensor)
            -> Result<(), ExecError>;
        cross_entropy::ce_loss(
            probs: &mut CudaTensor, sum: &CudaTensor, max: &CudaTensor, target_logit: &CudaTensor)
            -> Result<f64, ExecError>;
        cross_entropy::ce_grad(
            probs: &mut CudaTensor, targets: &[u32], lo: usize, scale: f32)
            -> Result<(), ExecError>;
        flash::attn_fwd(
            sh: &AttnShape, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, o: &mut CudaTensor,
            keep: Keep) -> Result<AttnSaved<CudaTensor>, ExecError>;
        flash::attn_bwd(
            sh: &AttnShape, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor,
            _saved: &AttnSaved<CudaTensor>, dout: &CudaTensor, dq: &mut CudaTensor,
            dk: &mut CudaTensor, dv: &mut CudaTensor) -> Result<(), ExecError>;
        moe::moe_route(
            logits: &mut CudaTensor, moe: &MoeShape) -> Result<(Routing, f64), ExecError>;
        moe::gather_rows(
            src: &CudaTensor, rows: &[usize], out: &mut CudaTensor) -> Result<(), ExecError>;
        moe::scatter_add_rows(
            src: &CudaTensor, rows: &[usize], weights: Option<&[f32]>, out: &mut CudaTensor)
            -> Result<(), ExecError>;
        moe::moe_combine_bwd(
            dy: &CudaTensor, y: &CudaTensor, routes: &[Route], dprobs: &mut CudaTensor,
            dsend: &mut CudaTensor) -> Result<(), ExecError>;
        moe::moe_router_bwd(
            d: &mut CudaTensor, probs: &CudaTensor, fraction: &[f64], aux_scale: f64)
            -> Result<(), ExecError>;
        elementwise::fill(t: &mut CudaTensor, value: f32) -> Result<(), ExecError>;
        flash::flash_fwd_block(
            sh: &BlockShape, q: &CudaTensor, qs: Side<'_>, k: View<'_, CudaTensor>,
            v: View<'_, CudaTensor>, ks: Side<'_>, acc: &mut CudaTensor, max: &mut CudaTensor,
            sum: &mut CudaTensor, _tile: &mut CudaTensor) -> Result<u64, ExecError>;
        flash::flash_finish(
            sh: &BlockShape, rows: usize, acc: &mut CudaTensor, max: &CudaTensor, sum: &CudaTensor,
            lse: &mut CudaTensor) -> Result<(), ExecError>;
        flash::flash_delta(
            sh: &BlockShape, rows: usize, dout: &CudaTensor, o: &CudaTensor, out: &mut CudaTensor)
            -> Result<(), ExecError>;
        flash::attn_sink_fwd(
            sh: &BlockShape, rows: usize, o: &mut CudaTensor, lse: &mut CudaTensor,
            sinks: View<'_, CudaTensor>) -> Result<(), ExecError>;
        flash::attn_sink_grad(
            sh: &BlockShape, rows: usize, lse: &CudaTensor, delta: &CudaTensor,
            sinks: View<'_, CudaTensor>, dsinks: ViewMut<'_, CudaTensor>)
            -> Result<(), ExecError>;
        flash::flash_bwd_block(
            sh: &BlockShape, q: &CudaTensor, qs: Side<'_>, k: View<'_, CudaTensor>,
            v: View<'_, CudaTensor>, ks: Side<'_>, dout: &CudaTensor, lse: &CudaTensor,
            delta: &CudaTensor, dq: &mut CudaTensor, dk: ViewMut<'_, CudaTensor>,
            dv: ViewMut<'_, CudaTensor>, _p_tile: &mut CudaTensor, _dp_tile: &mut CudaTensor)
            -> Result<u64, ExecError>;
        ulysses::ulysses_pack(
            geo: &UlyssesGeo, from: UlyssesLayout, xs: &[(&CudaTensor, UlyssesPart)],
            out: &mut CudaTensor) -> Result<(), ExecError>;
        ulysses::ulysses_unpack(
            geo: &UlyssesGeo, to: UlyssesLayout, recv: &CudaTensor, parts: &[UlyssesPart],
            outs: &mut [&mut CudaTensor]) -> Result<(), ExecError>;
        adam::adam(
            c: &AdamConfig, t: u32, p: ViewMut<'_, CudaTensor>, g: View<'_, CudaTensor>,
            m: &mut CudaTensor, v: &mut CudaTensor, weight_copy: Option<ViewMut<'_, CudaTensor>>)
            -> Result<(), ExecError>;
        heads::heads_concat(
            a: &CudaTensor, b: &CudaTensor, heads: usize, out: &mut CudaTensor)
            -> Result<(), ExecError>;
        heads::heads_split(
            dout: &CudaTensor, heads: usize, da: &mut CudaTensor, db: &mut CudaTensor)
            -> Result<(), ExecError>;
        moe::moe_route_scored(
            logits: &mut CudaTensor, bias: Option<&[f32]>, moe: &MoeShape)
            -> Result<(Routing, f64, Vec<usize>), ExecError>;
        moe::moe_router_scored_bwd(
            d: &mut CudaTensor, scores: &CudaTensor, chosen: &[usize], moe: &MoeShape,
            fraction: &[f64], aux_scale: f64) -> Result<(), ExecError>;
        dropout::dropout_inplace(
            key: &crate::rng::DropoutKey, tokens: &[u64], col_offset: u64,
            x: ViewMut<'_, CudaTensor>) -> Result<(), ExecError>;
        dropout::dropout_save(
            key: &crate::rng::DropoutKey, tokens: &[u64], col_offset: u64,
            x: ViewMut<'_, CudaTensor>) -> Result<CudaTensor, ExecError>;
        dropout::dropout_apply(
            mask: &CudaTensor, scale: f32, x: ViewMut<'_, CudaTensor>) -> Result<(), ExecError>;
    }
}
