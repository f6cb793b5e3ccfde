//! DeepSpeed-Ulysses (Jacobs et al. 2023): one all-to-all turns the sequence shards of Q, K and
//! V into head shards of the whole sequence (rank j of the CP group takes head group j of its TP
//! rank's heads), attention runs per head group unchanged, and a second all-to-all brings the
//! output back to sequence shards; backward reverses both (the output gradient and
//! FlashAttention-2's row statistic D = rowsum(dO * O) travel together, then dQ, dK, dV return).
//! Needs the heads and K/V heads of a TP rank divisible by cp; the layout is contiguous.

use super::common::{
    fold_sinks, layer_shape, saved_lse, sinks_grad, timed, CoreSaved, Grads, Stats,
};

use crate::backend::ops::*;
use crate::backend::{Backend, DeviceTensor};

use crate::backend::{DeviceCollectives, View, ViewMut};
use crate::error::ExecError;
use crate::layers::ctx::zeros;
use crate::layers::ctx::Ctx;
use crate::rng::AttnDropout;
use crate::traced_ops::TracedOps;
use crate::tracker::Category;

type Geo = UlyssesGeo;
type Part = UlyssesPart;
use UlyssesLayout::{Head, Seq};

/// The exchange's geometry and the head-group attention shape of this rank.
/// The head group of CP rank r is heads r hq / cp .. (r + 1) hq / cp of the TP rank's, so the
/// attention dropout's first global head moves by that offset.
fn setup<B: Backend>(ctx: &Ctx<B>, layer: u32) -> (Geo, BlockShape, Vec<u32>) {
    let sh = layer_shape(ctx, layer);
    let cp = ctx.cp.as_ref().expect("cp context");
    let geo = Geo {
        b: sh.b,
        s_loc: cp.positions[cp.rank].len(),
        cp: cp.size,
    };
    let local = BlockShape {
        hq: sh.hq / cp.size,
        hk: sh.hk / cp.size,
        dropout: sh.dropout.map(|d| AttnDropout {
            head0: d.head0 + (cp.rank * sh.hq / cp.size) as u32,
            ..d
        }),
        ..sh
    };
    let all: Vec<u32> = (0..(geo.s_loc * geo.cp) as u32).collect();
    (geo, local, all)
}

/// The first of this CP rank's heads among its TP rank's (`sh`: the head group's shape).
fn head0<B: Backend>(ctx: &Ctx<B>, sh: &BlockShape) -> usize {
    ctx.cp.as_ref().map_or(0, |c| c.rank * sh.hq)
}

/// All-to-all of `send` over the CP group into a new buffer of category `cat`.
fn exchange<B: Backend>(
    ctx: &Ctx<B>,
    send: &B::Tensor,
    cat: Category,
) -> Result<(B::Tensor, f64), ExecError> {
    let cp = ctx.cp.as_ref().expect("cp context");
    let mut recv = ctx.zeros(cat, &[send.len()])?;
    let (r, dt) = timed(|| {
        ctx.comm
            .all_to_all(&cp.group, View::all(send), ViewMut::all(&mut recv))
    });
    r?;
    Ok((recv, dt))
}

/// Attention of the head group over the whole sequence, with the sinks of its heads
/// (`sinks`: the TP rank's logits and the group's first head): (normalised output, lse,
/// work).
fn attend<B: Backend>(
    ops: &TracedOps<B>,
    geo: &Geo,
    sh: &BlockShape,
    all: &[u32],
    Qkv { q, k, v }: Qkv<'_, B::Tensor>,
    sinks: (Option<&B::Tensor>, usize),
) -> Result<(B::Tensor, B::Tensor, u64), ExecError> {
    let s = all.len();
    let side = Side {
        pos: all,
        tile: geo.s_loc,
    };
    let mut acc = zeros::<B>(ops, Category::Buffers, &[q.rows(), sh.hq * sh.dv])?;
    let mut st = Stats::<B>::new(ops, sh.b * sh.hq * s)?;
    let mut tile = zeros::<B>(ops, Category::Buffers, &[geo.s_loc, geo.s_loc])?;
    let work = ops.flash_fwd_block(
        sh,
        BlockQuery { q, side },
        BlockKv {
            k: View::all(k),
            v: View::all(v),
            side,
        },
        BlockAcc {
            acc: &mut acc,
            max: &mut st.max,
            sum: &mut st.sum,
        },
        &mut tile,
    )?;
    drop(tile);
    let mut lse = st.finish(ops, sh, s, &mut acc)?;
    fold_sinks::<B>(ops, sinks.0, sh, s, sinks.1, &mut acc, &mut lse)?;
    Ok((acc, lse, work))
}

pub fn forward<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    keep: Keep,
) -> Result<(B::Tensor, CoreSaved<B>), ExecError> {
    let (geo, sh, all) = setup(ctx, layer);
    let (a_r, g_r, d, dv) = (ctx.rd.a_r, ctx.rd.g_r, ctx.rd.d, ctx.rd.dv);
    let parts = [
        Part { heads: a_r, e: d },
        Part { heads: g_r, e: d },
        Part { heads: g_r, e: dv },
    ];
    let o_part = [Part { heads: a_r, e: dv }];
    let b = Category::Buffers;
    let mut send = ctx.zeros(b, &[q.len() + k.len() + v.len()])?;
    ctx.ops.ulysses_pack(
        &geo,
        Seq,
        &[(&q, parts[0]), (&k, parts[1]), (&v, parts[2])],
        &mut send,
    )?;
    let s = geo.s_loc * geo.cp;
    let rows = geo.b * s;
    drop((q, k, v));
    let (recv, mut comm_s) = exchange(ctx, &send, b)?;
    drop(send);
    let a = Category::Activations;
    let mut qh = ctx.zeros(a, &[rows, sh.hq * d])?;
    let mut kh = ctx.zeros(a, &[rows, sh.hk * d])?;
    let mut vh = ctx.zeros(a, &[rows, sh.hk * dv])?;
    ctx.ops
        .ulysses_unpack(&geo, Head, &recv, &parts, &mut [&mut qh, &mut kh, &mut vh])?;
    drop(recv);
    let z = (
        ctx.cp.as_ref().and_then(|c| c.sinks.as_ref()),
        head0(ctx, &sh),
    );
    let (r, compute_s) = timed(|| {
        attend::<B>(
            ctx.ops,
            &geo,
            &sh,
            &all,
            Qkv {
                q: &qh,
                k: &kh,
                v: &vh,
            },
            z,
        )
    });
    let (oh, lse, work) = r?;
    let mut send = ctx.zeros(b, &[oh.len()])?;
    ctx.ops
        .ulysses_pack(&geo, Head, &[(&oh, o_part[0])], &mut send)?;
    drop(oh);
    let (recv, dt) = exchange(ctx, &send, b)?;
    comm_s += dt;
    drop(send);
    let mut o = ctx.zeros(a, &[geo.b * geo.s_loc, a_r * dv])?;
    ctx.ops
        .ulysses_unpack(&geo, Seq, &recv, &o_part, &mut [&mut o])?;
    drop(recv);
    let cp = ctx.cp.as_mut().expect("cp context");
    if !ctx.recomputing {
        cp.stats.score_elements += work;
    }
    cp.record(false, 0, compute_s, comm_s);
    let attn = saved_lse::<B>(ctx.ops, keep, lse);
    Ok((
        o,
        CoreSaved {
            q: qh,
            k: kh,
            v: vh,
            attn,
        },
    ))
}

pub fn backward<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    s: CoreSaved<B>,
    d_rows: B::Tensor,
    dout: B::Tensor,
) -> Result<Grads<B>, ExecError> {
    let (geo, sh, all) = setup(ctx, layer);
    let CoreSaved { q, k, v, attn } = s;
    let lse = match attn {
        AttnSaved::Lse(l) => l,
        // Selective recomputation: the head group's attention again (no communication).
        _ => {
            let z = (
                ctx.cp.as_ref().and_then(|c| c.sinks.as_ref()),
                head0(ctx, &sh),
            );
            attend::<B>(
                ctx.ops,
                &geo,
                &sh,
                &all,
                Qkv {
                    q: &q,
                    k: &k,
                    v: &v,
                },
                z,
            )?
            .1
        }
    };
    let (a_r, g_r, d, dv) = (ctx.rd.a_r, ctx.rd.g_r, ctx.rd.d, ctx.rd.dv);
    let b = Category::Buffers;
    let seq_rows = geo.b * geo.s_loc;
    let out_parts = [Part { heads: a_r, e: dv }, Part { heads: a_r, e: 1 }];
    let mut send = ctx.zeros(b, &[dout.len() + d_rows.len()])?;
    ctx.ops.ulysses_pack(
        &geo,
        Seq,
        &[(&dout, out_parts[0]), (&d_rows, out_parts[1])],
        &mut send,
    )?;
    drop((dout, d_rows));
    let (recv, mut comm_s) = exchange(ctx, &send, b)?;
    drop(send);
    let s = geo.s_loc * geo.cp;
    let rows = geo.b * s;
    let mut doh = ctx.zeros(b, &[rows, sh.hq * dv])?;
    let mut delta = ctx.zeros_f32(b, &[rows * sh.hq])?;
    ctx.ops
        .ulysses_unpack(&geo, Head, &recv, &out_parts, &mut [&mut doh, &mut delta])?;
    drop(recv);
    sinks_grad(ctx, &sh, s, head0(ctx, &sh), &lse, &delta)?;
    let mut dqh = ctx.zeros(b, &[rows, sh.hq * d])?;
    let mut dkh = ctx.zeros(b, &[rows, sh.hk * d])?;
    let mut dvh = ctx.zeros(b, &[rows, sh.hk * dv])?;
    let mut p_tile = ctx.zeros(b, &[geo.s_loc, geo.s_loc])?;
    let mut dp_tile = ctx.zeros(b, &[geo.s_loc, geo.s_loc])?;
    let side = Side {
        pos: &all,
        tile: geo.s_loc,
    };
    let (r, compute_s) = timed(|| {
        ctx.ops.flash_bwd_block(
            &sh,
            BlockQuery { q: &q, side },
            BlockKv {
                k: View::all(&k),
                v: View::all(&v),
                side,
            },
            BlockStats {
                dout: &doh,
                lse: &lse,
                delta: &delta,
            },
            BlockGrads {
                dq: &mut dqh,
                dk: ViewMut::all(&mut dkh),
                dv: ViewMut::all(&mut dvh),
            },
            (&mut p_tile, &mut dp_tile),
        )
    });
    r?;
    drop((doh, p_tile, dp_tile, delta, lse, q, k, v));
    let parts = [
        Part { heads: a_r, e: d },
        Part { heads: g_r, e: d },
        Part { heads: g_r, e: dv },
    ];
    let mut send = ctx.zeros(b, &[dqh.len() + dkh.len() + dvh.len()])?;
    ctx.ops.ulysses_pack(
        &geo,
        Head,
        &[(&dqh, parts[0]), (&dkh, parts[1]), (&dvh, parts[2])],
        &mut send,
    )?;
    drop((dqh, dkh, dvh));
    let (recv, dt) = exchange(ctx, &send, b)?;
    comm_s += dt;
    drop(send);
    let mut dq = ctx.zeros(b, &[seq_rows, a_r * d])?;
    let mut dk = ctx.zeros(b, &[seq_rows, g_r * d])?;
    let mut dv = ctx.zeros(b, &[seq_rows, g_r * dv])?;
    ctx.ops
        .ulysses_unpack(&geo, Seq, &recv, &parts, &mut [&mut dq, &mut dk, &mut dv])?;
    drop(recv);
    ctx.cp
        .as_mut()
        .expect("cp context")
        .record(true, 0, compute_s, comm_s);
    Ok((dq, dk, dv))
}
