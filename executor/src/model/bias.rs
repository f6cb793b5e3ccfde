//! Linear-layer biases of a dense decoder layer (Megatron's `--add-bias-linear` and
//! `--add-qkv-bias`). Column-parallel layers (QKV, fc1) split their bias with their output
//! columns; row-parallel layers (the attention projection, fc2) keep theirs whole on every TP
//! rank and add it once, after the reduction (after the reduce-scatter under SP). A bias's
//! gradient is the column sum of its output gradient over this rank's rows: for a row-parallel
//! bias under SP that is a partial sum over the sequence shard, all-reduced over TP like the
//! norms' (Megatron marks these parameters `sequence_parallel`).
//!
//! The bias tensors follow the layer's six others, in the order QKV (when either flag is set),
//! projection, fc1, fc2 (with `bias_linear`). They are initialised like the weights (uniform
//! with the init std) rather than zero as Megatron does, so that the equivalence tests see a
//! wrong bias slice in the very first forward.

use super::params::{seg, BlockLayout, Builder, RankDims};
use super::{Ctx, Sink, WTask};
use crate::backend::{Backend, DeviceTensor, TensorOps, View, ViewMut};
use crate::error::ExecError;
use crate::memory::Category;
use crate::plan::{Activation, ModelShape};

/// Which linear layer a bias belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    Qkv,
    Proj,
    Fc1,
    Fc2,
}

/// Index of the first bias tensor in a dense layer block.
const FIRST: usize = 6;

/// The block tensor of `site`'s bias, or `None` when the model has none there.
pub fn tensor(m: &ModelShape, site: Site) -> Option<usize> {
    let q = usize::from(m.qkv_bias);
    match site {
        Site::Qkv => m.qkv_bias.then_some(FIRST),
        Site::Proj => m.bias_linear.then_some(FIRST + q),
        Site::Fc1 => m.bias_linear.then_some(FIRST + q + 1),
        Site::Fc2 => m.bias_linear.then_some(FIRST + q + 2),
    }
}

/// Appends the bias tensors of dense layer `p` (name prefix) to its block, as columns
/// ([o, 1], so that split segments stack by rows as the weights' do).
pub(super) fn push(b: &mut Builder, m: &ModelShape, p: &str, rd: &RankDims, std: f32) {
    let (h, d, r) = (rd.h, rd.d, rd.tp_rank);
    if m.qkv_bias {
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

/// Adds `site`'s bias (if any) to every row of `y`, a layer output (after the reduction for a
/// row-parallel layer).
pub fn add<B: Backend>(
    ctx: &Ctx<B>,
    l: &BlockLayout,
    p: &View<'_, B::Tensor>,
    site: Site,
    y: &mut B::Tensor,
) -> Result<(), ExecError> {
    match tensor(&ctx.plan.model, site) {
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
    let Some(t) = tensor(&ctx.plan.model, site) else {
        return Ok(());
    };
    let mut g = ctx.zeros_f32(Category::Buffers, &[l.tensors[t].len()])?;
    ctx.ops.bias_grad(dy, ViewMut::all(&mut g))?;
    debug_assert_eq!(dy.len() % g.len().max(1), 0);
    sink(ctx, WTask::Ready { tensor: t, grad: g })
}
