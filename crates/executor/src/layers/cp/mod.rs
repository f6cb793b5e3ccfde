//! Context parallelism's attention core (every other op is token-wise and runs unchanged on the
//! rank's sequence shard): the ring of K/V blocks (Liu et al. 2023, Ring Attention; zigzag as
//! Megatron's CP balances it), the all-gather of K/V (Megatron's all-gather CP), and
//! DeepSpeed-Ulysses' all-to-alls (Jacobs et al. 2023). Each needs flash attention's log-sum-exp,
//! so CP runs keep it (or recompute it under selective recomputation).

mod allgather;
mod ring;
mod ulysses;

use super::{zeros, Ctx};
use crate::backend::BlockShape;
use crate::backend::TensorOps;
use crate::backend::{AttnSaved, Keep};
use crate::backend::{Backend, Device, DeviceTensor, ProcessGroup};
use crate::error::ExecError;
use crate::plan::CpComm;
use crate::run_report::{CpStats, StepTime};
use crate::tracker::Category;
use std::time::Instant;

/// dQ, dK and dV of the attention core.
pub type Grads<B> = (
    <B as Backend>::Tensor,
    <B as Backend>::Tensor,
    <B as Backend>::Tensor,
);

/// A rank's context-parallel state.
pub struct CpCtx<B: Backend> {
    pub group: B::Group,
    /// This rank's index in the CP group (its CP coordinate).
    pub rank: usize,
    pub size: usize,
    pub comm: CpComm,
    /// Positions (within a sequence) of every CP rank's rows.
    pub positions: Vec<Vec<u32>>,
    pub stats: CpStats,
    /// Whether times are being recorded (the timed steps).
    pub timing: bool,
}

impl<B: Backend> CpCtx<B> {
    pub fn new(group: B::Group, comm: CpComm, seq: usize) -> CpCtx<B> {
        let size = group.size();
        CpCtx {
            rank: group.index(),
            positions: (0..size).map(|r| comm.positions(seq, size, r)).collect(),
            group,
            size,
            comm,
            stats: CpStats::default(),
            timing: false,
        }
    }

    fn next(&self) -> u32 {
        self.group.members()[(self.rank + 1) % self.size]
    }

    fn prev(&self) -> u32 {
        self.group.members()[(self.rank + self.size - 1) % self.size]
    }

    fn record(&mut self, backward: bool, step: usize, compute_s: f64, comm_s: f64) {
        if !self.timing {
            return;
        }
        let v = if backward {
            &mut self.stats.backward
        } else {
            &mut self.stats.forward
        };
        if v.len() <= step {
            v.resize(step + 1, StepTime::default());
        }
        v[step].compute_s += compute_s;
        v[step].comm_s += comm_s;
    }
}

/// Which pass a message belongs to (tags must not collide between them).
#[derive(Debug, Clone, Copy)]
enum Pass {
    Forward = 1,
    Recompute = 2,
    Backward = 3,
}

/// Message tag of a CP exchange: the top bit keeps it apart from pipeline tags.
fn tag(layer: u32, mb: u32, pass: Pass, step: usize, part: u64) -> u64 {
    (1u64 << 63)
        | ((layer as u64) << 40)
        | ((mb as u64 & 0xFF_FFFF) << 16)
        | ((pass as u64) << 12)
        | ((step as u64 & 0xFF) << 4)
        | part
}

/// What the attention core keeps for backward under CP: Q, K, V (head shards of the whole
/// sequence with Ulysses, sequence shards otherwise) and the log-sum-exp, unless recomputed.
pub struct CoreSaved<B: Backend> {
    pub q: B::Tensor,
    pub k: B::Tensor,
    pub v: B::Tensor,
    pub attn: AttnSaved<B::Tensor>,
}

/// The running statistics of the online softmax as tracked tensors.
struct Stats<B: Backend> {
    max: B::Tensor,
    sum: B::Tensor,
}

impl<B: Backend> Stats<B> {
    /// Statistics before any key: maximum -inf, sum 0.
    fn new(ops: &B::Device, len: usize) -> Result<Stats<B>, ExecError> {
        let mut max = zeros::<B>(ops, Category::Buffers, &[len])?;
        ops.fill(&mut max, f32::NEG_INFINITY)?;
        Ok(Stats {
            max,
            sum: zeros::<B>(ops, Category::Buffers, &[len])?,
        })
    }
}

/// Runs `f`, returning its result and the seconds it took.
fn timed<R>(f: impl FnOnce() -> R) -> (R, f64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_secs_f64())
}

/// The shape of this rank's attention (its TP share of the heads).
fn shape<B: Backend>(ctx: &Ctx<B>) -> BlockShape {
    BlockShape {
        b: ctx.plan.model.micro_batch,
        hq: ctx.rd.a_r,
        hk: ctx.rd.g_r,
        d: ctx.rd.d,
        dv: ctx.rd.dv,
        dropout: None,
    }
}

/// [`shape`] with the attention dropout of global layer `layer`.
fn layer_shape<B: Backend>(ctx: &Ctx<B>, layer: u32) -> BlockShape {
    BlockShape {
        dropout: super::dropout::attention_dropout(ctx, layer),
        ..shape(ctx)
    }
}

/// Forward of the attention core of layer `layer` on the sequence shards `q`, `k`, `v`
/// (rotary applied): the output [n, a_r d] (the projection's input) and what backward needs.
pub fn forward<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    keep: Keep,
) -> Result<(B::Tensor, CoreSaved<B>), ExecError> {
    let comm = ctx.cp.as_ref().map(|c| c.comm).expect("cp context");
    match comm {
        CpComm::Ring | CpComm::Zigzag => ring::forward(ctx, layer, q, k, v, keep),
        CpComm::AllGather => allgather::forward(ctx, layer, q, k, v, keep),
        CpComm::A2a => ulysses::forward(ctx, layer, q, k, v, keep),
    }
}

/// FlashAttention-2's D = rowsum(dO * O) per row and head of the sequence shard, [n, a_r]:
/// computed before the output `o` goes to the projection's weight gradient.
pub fn row_delta<B: Backend>(
    ctx: &Ctx<B>,
    dout: &B::Tensor,
    o: &B::Tensor,
) -> Result<B::Tensor, ExecError> {
    let sh = shape(ctx);
    let rows = dout.rows() / sh.b;
    let mut out = ctx.zeros_f32(Category::Buffers, &[sh.b * rows * sh.hq])?;
    ctx.ops.flash_delta(&sh, rows, dout, o, &mut out)?;
    Ok(out)
}

/// Backward of the attention core: dQ, dK, dV as sequence shards [n, ..] (rotary not yet
/// undone) from the output gradient `dout` and its [`row_delta`].
pub fn backward<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    s: CoreSaved<B>,
    delta: B::Tensor,
    dout: B::Tensor,
) -> Result<Grads<B>, ExecError> {
    let comm = ctx.cp.as_ref().map(|c| c.comm).expect("cp context");
    match comm {
        CpComm::Ring | CpComm::Zigzag => ring::backward(ctx, layer, s, delta, dout),
        CpComm::AllGather => allgather::backward(ctx, layer, s, delta, dout),
        CpComm::A2a => ulysses::backward(ctx, layer, s, delta, dout),
    }
}

/// The log-sum-exp to keep (`Keep::Lse`) or nothing (selective recomputation).
fn saved_lse<B: Backend>(ops: &B::Device, keep: Keep, lse: B::Tensor) -> AttnSaved<B::Tensor> {
    match keep {
        Keep::Nothing => AttnSaved::None,
        _ => AttnSaved::Lse(ops.recat(lse, Category::Activations)),
    }
}
