//! Linear-layer biases of a dense decoder layer (Megatron's `--add-bias-linear` and
//! `--add-qkv-bias`). Column-parallel layers (QKV, fc1) split their bias with their output
//! columns; row-parallel layers (the attention projection, fc2) keep theirs whole on every TP
//! rank and add it once, after the reduction (after the reduce-scatter under SP). A bias's
//! gradient is the column sum of its output gradient over this rank's rows: for a row-parallel
//! bias under SP that is a partial sum over the sequence shard, all-reduced over TP like the
//! norms' (Megatron marks these parameters `sequence_parallel`).
//!
//! The bias tensors follow the layer's others (a dense layer's six; an MoE layer's router and
//! shared experts), in the order QKV (when either flag is set; never with MLA, whose
//! projections Megatron-Core builds without bias), projection, fc1, fc2 (with `bias_linear`;
//! in an MoE layer the shared experts', when it has them: the routed experts' biases sit in
//! the experts block, [`mlp_biases`], and the router has none, as Megatron-Core's). They are
//! initialised like the weights (uniform with the init std) rather than zero as Megatron does,
//! so that the equivalence tests see a wrong bias slice in the very first forward.

use super::blocks::{fc1_rows, seg, BlockLayout, Builder, RankDims};
use super::ctx::Ctx;
use super::dropout::block_layer;
use super::wtask::{Sink, WTask};
use crate::backend::ops::*;
use crate::backend::{Backend, DeviceTensor, View, ViewMut};
use crate::error::ExecError;
use crate::tracker::Category;
use parsim_plan::plan::{Activation, ModelShape};

/// Which linear layer a bias belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    Qkv,
    Proj,
    Fc1,
    Fc2,
}

/// Index of the first bias tensor in the block of layer `layer`: after a dense layer's six
/// tensors (norm, QKV, projection, norm, fc1, fc2), after an MoE layer's router and shared
/// experts.
fn first(m: &ModelShape, layer: u32) -> usize {
    match &m.moe {
        Some(moe) if m.is_moe_layer(layer) => {
            super::blocks::ROUTER + 1 + if moe.shared_ffn > 0 { 2 } else { 0 }
        }
        _ => 6,
    }
}

/// The MLP whose fc1/fc2 biases layer `layer`'s block holds: the dense MLP's intermediate
/// size, or an MoE layer's shared experts' (`None` without them).
fn mlp_ffn(m: &ModelShape, layer: u32) -> Option<usize> {
    match &m.moe {
        Some(moe) if m.is_moe_layer(layer) => (moe.shared_ffn > 0).then_some(moe.shared_ffn),
        _ => Some(m.ffn),
    }
}

/// Whether the QKV projection has a bias (MHA/GQA only).
fn qkv(m: &ModelShape) -> bool {
    m.qkv_bias && m.mla.is_none()
}

/// The block tensor of `site`'s bias in layer `layer`, or `None` when it has none there.
pub fn tensor(m: &ModelShape, layer: u32, site: Site) -> Option<usize> {
    let f = first(m, layer);
    let q = usize::from(qkv(m));
    let mlp = m.bias_linear && mlp_ffn(m, layer).is_some();
    match site {
        Site::Qkv => qkv(m).then_some(f),
        Site::Proj => m.bias_linear.then_some(f + q),
        Site::Fc1 => mlp.then_some(f + q + 1),
        Site::Fc2 => mlp.then_some(f + q + 2),
    }
}

/// Index one past the last bias tensor of layer `layer` (where its later tensors start).
pub fn end(m: &ModelShape, layer: u32) -> usize {
    let linear = if m.bias_linear {
        1 + 2 * usize::from(mlp_ffn(m, layer).is_some())
    } else {
        0
    };
    first(m, layer) + usize::from(qkv(m)) + linear
}

/// Appends the bias tensors of layer `layer` (name prefix `p`) to its block, as columns
/// ([o, 1], so that split segments stack by rows as the weights' do).
pub(super) fn push(b: &mut Builder, m: &ModelShape, layer: u32, p: &str, rd: &RankDims, std: f32) {
    let (h, d, r) = (rd.h, rd.d, rd.tp_rank);
    if qkv(m) {
        let (qa, kg) = (rd.a_r * d, rd.g_r * d);
        let segs = vec![
            seg(format!("{p}.bq"), 1, r * qa..(r + 1) * qa, 0..1, std),
            seg(format!("{p}.bk"), 1, r * kg..(r + 1) * kg, 0..1, std),
            seg(format!("{p}.bv"), 1, r * kg..(r + 1) * kg, 0..1, std),
        ];
        b.push(rd.qkv_r(), 1, segs, false);
    }
    if !m.bias_linear {
        return;
    }
    b.push(h, 1, vec![seg(format!("{p}.bo"), 1, 0..h, 0..1, std)], true);
    if m.is_moe_layer(layer) {
        if let Some(f) = mlp_ffn(m, layer) {
            let q = format!("{p}.shared_experts");
            mlp_biases(b, m.activation, &q, (f, h), (rd.t, r), std, true);
        }
        return;
    }
    let f = rd.f_r;
    let fc1 = match m.activation {
        Activation::Swiglu => vec![
            seg(format!("{p}.b_gate"), 1, r * f..(r + 1) * f, 0..1, std),
            seg(format!("{p}.b_up"), 1, r * f..(r + 1) * f, 0..1, std),
        ],
        Activation::Gelu => vec![seg(format!("{p}.b_fc1"), 1, r * f..(r + 1) * f, 0..1, std)],
    };
    b.push(rd.fc1_r, 1, fc1, false);
    b.push(
        h,
        1,
        vec![seg(format!("{p}.b_down"), 1, 0..h, 0..1, std)],
        true,
    );
}

/// An expert MLP's biases `{q}.fc1_bias` (this rank's rows of fc1 as `{q}.fc1` splits them
/// over `(size, rank)` of its tensor-parallel group: under SwiGLU the gate rows then the up
/// rows of its slice) and `{q}.fc2_bias` [h], whole on every rank (added once, after the
/// reduction). `fc2_partial`: its gradient is a partial sum over TP under SP (a bias added to
/// the sequence-sharded region, as the dense layer's `b_down`).
pub(super) fn mlp_biases(
    b: &mut Builder,
    act: Activation,
    q: &str,
    (f, h): (usize, usize),
    (t, r): (usize, usize),
    std: f32,
    fc2_partial: bool,
) {
    let (w1, segs) = fc1_rows(act, format!("{q}.fc1_bias"), 1, f, (t, r), std);
    b.push(w1, 1, segs, false);
    let fc2 = vec![seg(format!("{q}.fc2_bias"), 1, 0..h, 0..1, std)];
    b.push(h, 1, fc2, fc2_partial);
}

/// Adds `site`'s bias (if any) to every row of `y`, a layer output (after the reduction for a
/// row-parallel layer).
pub fn add<B: Backend>(
    ctx: &Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    site: Site,
    y: &mut B::Tensor,
) -> Result<(), ExecError> {
    match tensor(&ctx.plan.model, block_layer(l), site) {
        Some(t) => ctx.ops.bias_add(y, p.sub(l.tensors[t].range())),
        None => Ok(()),
    }
}

/// Sends `site`'s bias gradient (the column sums of the output gradient `dy` over this rank's
/// rows) to `sink`, as a ready gradient.
pub fn grad<B: Backend>(
    ctx: &mut Ctx<B>,
    l: &BlockLayout,
    site: Site,
    dy: &B::Tensor,
    sink: &mut Sink<B>,
) -> Result<(), ExecError> {
    let Some(t) = tensor(&ctx.plan.model, block_layer(l), site) else {
        return Ok(());
    };
    let mut g = ctx.zeros_f32(Category::Buffers, &[l.tensors[t].len()])?;
    ctx.ops.bias_grad(dy, ViewMut::all(&mut g))?;
    debug_assert_eq!(dy.len() % g.len().max(1), 0);
    sink(ctx, WTask::Ready { tensor: t, grad: g })
}
