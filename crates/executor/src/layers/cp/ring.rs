//! Ring attention (Liu et al. 2023): K/V blocks travel cp - 1 hops around the CP ring. As
//! TransformerEngine's `AttnFuncWithCPAndKVP2P` does, each step first posts the exchange of
//! the block it holds (send to the next rank, receive the next block from the previous) and
//! only then computes on it, so the exchange is in flight during the block's attention; the
//! received block is waited for when it is first read (double-buffered: the visiting block
//! and the next). Backward sends K/V around again, with a dK/dV accumulator that follows each
//! block from its first visitor back to its home rank (cp - 1 hops each): as
//! TransformerEngine, each step computes the visiting block's dK/dV into fresh buffers while
//! the accumulator from its earlier visitors is in flight, then adds the two and posts the sum
//! on (with the receive of the next accumulator in the same exchange). Under a causal mask
//! a block wholly in a rank's future is skipped; the contiguous layout leaves rank r with
//! r + 1/2 blocks of work, the zigzag layout every rank with cp. A sliding window or chunk on
//! the contiguous layout stops the ring once the blocks within its reach have visited
//! ([`steps`]); the last visitor then sends the block's dK/dV straight home.

use super::common::{fold_sinks, sinks_grad};
use super::common::{layer_shape, saved_lse, tag, timed, CoreSaved, Grads, Pass, Stats};
use crate::backend::ops::*;
use crate::backend::{Backend, DeviceTensor};
use crate::backend::{Pending, RecvInto, SendFrom};

use crate::backend::{DeviceCollectives, View, ViewMut};
use crate::error::ExecError;
use crate::layers::ctx::Ctx;
use crate::tracker::Category;
use parsim_plan::plan::{AttnSpan, CpComm};

const KEYS: u64 = 0;
const VALUES: u64 = 1;
/// The dK and dV accumulators travel as two messages.
const GRADS_K: u64 = 2;
const GRADS_V: u64 = 3;

/// A pair of tensors travelling together: K and V, or dK and dV.
type Pair<B> = (<B as Backend>::Tensor, <B as Backend>::Tensor);
/// Views of a [`Pair`] to send.
type PairView<'a, T> = (View<'a, T>, View<'a, T>);

/// Posts one ring exchange: `send` (K then V, or dK then dV) to `to` under the message tags
/// `tags`, and, when `into` is given, the receive of the pair from `from` into its two
/// buffers. Returns the posted exchange and the seconds posting took.
fn post<B: Backend>(
    ctx: &Ctx<B>,
    (to, from): (u32, u32),
    tags: (u64, u64),
    send: Option<PairView<'_, B::Tensor>>,
    into: Option<Pair<B>>,
) -> Result<(Pending<B>, f64), ExecError> {
    let sends: Vec<SendFrom<'_, B::Tensor>> = send
        .into_iter()
        .flat_map(|(a, b)| {
            [
                SendFrom {
                    to,
                    tag: tags.0,
                    data: a,
                },
                SendFrom {
                    to,
                    tag: tags.1,
                    data: b,
                },
            ]
        })
        .collect();
    let recvs = into
        .into_iter()
        .flat_map(|(a, b)| {
            [
                RecvInto {
                    from,
                    tag: tags.0,
                    buf: a,
                },
                RecvInto {
                    from,
                    tag: tags.1,
                    buf: b,
                },
            ]
        })
        .collect();
    let (r, dt) = timed(|| ctx.comm.p2p_start(&sends, recvs));
    Ok((r?, dt))
}

/// Waits for a posted exchange; returns its received pair (if it had one) and the seconds
/// the wait took.
fn wait<B: Backend>(ctx: &Ctx<B>, p: Pending<B>) -> Result<(Option<Pair<B>>, f64), ExecError> {
    let (r, dt) = timed(|| ctx.comm.wait(p));
    let mut got = r?.into_iter();
    let pair = match (got.next(), got.next()) {
        (Some(a), Some(b)) => Some((a, b)),
        _ => None,
    };
    Ok((pair, dt))
}

/// Zeroed receive buffers for a K/V (or dK/dV) pair of `kv_len` elements.
#[track_caller]
fn buffers<B: Backend>(ctx: &Ctx<B>, kv_len: (usize, usize)) -> Result<Pair<B>, ExecError> {
    let b = Category::Buffers;
    Ok((ctx.zeros(b, &[kv_len.0])?, ctx.zeros(b, &[kv_len.1])?))
}

/// The visiting block's K and V: this rank's own at the first step, else the received block.
fn block<'t, B: Backend>(
    cur: &'t Option<Pair<B>>,
    k: &'t B::Tensor,
    v: &'t B::Tensor,
) -> (View<'t, B::Tensor>, View<'t, B::Tensor>) {
    match cur {
        None => (View::all(k), View::all(v)),
        Some((ck, cv)) => (View::all(ck), View::all(cv)),
    }
}

/// The ring steps layer shape `sh` needs on `size` CP ranks of `s_loc` positions: every
/// rank's block under full attention or the zigzag layout; with a window or chunk on
/// contiguous shards only the blocks within its reach (w - 1 positions back), which arrive in
/// the first ceil(reach / s_loc) + 1 steps, as the engine's windowed exchange counts them.
fn steps<B: Backend>(ctx: &Ctx<B>, sh: &BlockShape, s_loc: usize, size: usize) -> usize {
    let reach = match sh.span {
        AttnSpan::Full => return size,
        AttnSpan::Window(w) | AttnSpan::Chunk(w) => w.saturating_sub(1),
    };
    match ctx.cp.as_ref().map(|c| c.comm) {
        Some(CpComm::Ring) => (reach.div_ceil(s_loc.max(1)) + 1).min(size),
        _ => size,
    }
}

/// The forward pass of the ring; returns (output, lse).
fn pass<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    which: Pass,
    q: &B::Tensor,
    k: &B::Tensor,
    v: &B::Tensor,
) -> Result<(B::Tensor, B::Tensor), ExecError> {
    let sh = layer_shape(ctx, layer);
    let mb = ctx.mb;
    let count = matches!(which, Pass::Forward);
    let cp = ctx.cp.as_mut().expect("cp context");
    let (me, size) = (cp.rank, cp.size);
    let ring = (cp.next(), cp.prev());
    let s_loc = cp.positions[me].len();
    let kv_len = (k.len(), v.len());
    let mut acc = ctx.zeros(Category::Activations, &[q.rows(), sh.hq * sh.dv])?;
    let mut st = Stats::<B>::new(ctx.ops, sh.b * sh.hq * s_loc)?;
    let mut tile = ctx.zeros(Category::Buffers, &[s_loc, s_loc])?;
    let mut cur: Option<Pair<B>> = None;
    let n_steps = steps(ctx, &sh, s_loc, size);
    for t in 0..n_steps {
        let src = (me + size - t) % size;
        let tags = (
            tag(layer, mb, which, t, KEYS),
            tag(layer, mb, which, t, VALUES),
        );
        let (kb, vb) = block::<B>(&cur, k, v);
        // Step t + 1's exchange goes out before step t computes.
        let (pending, mut comm_s) = if t + 1 < n_steps {
            let into = buffers(ctx, kv_len)?;
            let (p, dt) = post(ctx, ring, tags, Some((kb.clone(), vb.clone())), Some(into))?;
            (Some(p), dt)
        } else {
            (None, 0.0)
        };
        let (qs, ks) = sides(ctx, me, src, s_loc);
        let (work, compute_s) = timed(|| {
            ctx.comm.kernel("attn_fwd_block", || {
                ctx.ops.flash_fwd_block(
                    &sh,
                    BlockQuery { q, side: qs },
                    BlockKv {
                        k: kb,
                        v: vb,
                        side: ks,
                    },
                    BlockAcc {
                        acc: &mut acc,
                        max: &mut st.max,
                        sum: &mut st.sum,
                    },
                    &mut tile,
                )
            })
        });
        let work = work?;
        if let Some(p) = pending {
            let (got, dt) = wait(ctx, p)?;
            comm_s += dt;
            cur = got;
        }
        let cp = ctx.cp.as_mut().expect("cp context");
        if count {
            cp.stats.score_elements += work;
        }
        cp.record(false, t, compute_s, comm_s);
    }
    drop((cur, tile));
    let mut lse = st.finish(ctx.ops, &sh, s_loc, &mut acc)?;
    let sinks = ctx.cp.as_ref().and_then(|c| c.sinks.as_ref());
    fold_sinks::<B>(ctx.ops, sinks, &sh, s_loc, 0, &mut acc, &mut lse)?;
    Ok((acc, lse))
}

/// The query side (this rank `me`) and key side (CP rank `src`) of a ring step's block, each
/// `s_loc` rows at its rank's positions.
fn sides<'c, B: Backend>(
    ctx: &'c Ctx<B>,
    me: usize,
    src: usize,
    s_loc: usize,
) -> (Side<'c>, Side<'c>) {
    let cp = ctx.cp.as_ref().expect("cp context");
    let side = |r: usize| Side {
        pos: &cp.positions[r],
        tile: s_loc,
    };
    (side(me), side(src))
}

pub fn forward<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    keep: Keep,
) -> Result<(B::Tensor, CoreSaved<B>), ExecError> {
    let which = if ctx.recomputing {
        Pass::Recompute
    } else {
        Pass::Forward
    };
    let (o, lse) = pass(ctx, layer, which, &q, &k, &v)?;
    let attn = saved_lse::<B>(ctx.ops, keep, lse);
    Ok((o, CoreSaved { q, k, v, attn }))
}

pub fn backward<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    s: CoreSaved<B>,
    delta: B::Tensor,
    dout: B::Tensor,
) -> Result<Grads<B>, ExecError> {
    let CoreSaved { q, k, v, attn } = s;
    let lse = match attn {
        AttnSaved::Lse(l) => l,
        // Selective recomputation: the forward ring again, for the log-sum-exp.
        _ => pass(ctx, layer, Pass::Recompute, &q, &k, &v)?.1,
    };
    let sh = layer_shape(ctx, layer);
    sinks_grad(ctx, &sh, q.rows() / sh.b, 0, &lse, &delta)?;
    let mb = ctx.mb;
    let cp = ctx.cp.as_ref().expect("cp context");
    let (me, size) = (cp.rank, cp.size);
    let ring = (cp.next(), cp.prev());
    let s_loc = cp.positions[me].len();
    let n_steps = steps(ctx, &sh, s_loc, size);
    // The last visitor's accumulator goes straight home (n_steps - 1 ranks back) and this
    // rank's own comes back from its last visitor: the ring's neighbours when every rank
    // visits (n_steps = cp).
    let home = (cp.ahead(size - (n_steps - 1)), cp.ahead(n_steps - 1));
    let kv_len = (k.len(), v.len());
    let b = Category::Buffers;
    let mut dq = ctx.zeros(b, &[q.rows(), q.cols()])?;
    let mut dk = ctx.zeros(b, &[k.rows(), k.cols()])?;
    let mut dv = ctx.zeros(b, &[v.rows(), v.cols()])?;
    let mut p_tile = ctx.zeros(b, &[s_loc, s_loc])?;
    let mut dp_tile = ctx.zeros(b, &[s_loc, s_loc])?;
    let mut cur: Option<Pair<B>> = None;
    // The dK/dV accumulator of the block visiting next (after the last step: of this rank's
    // own block), in flight from the previous rank.
    let mut acc_in: Option<Pending<B>> = None;
    let which = Pass::Backward;
    let grad_tags = |t| {
        (
            tag(layer, mb, which, t, GRADS_K),
            tag(layer, mb, which, t, GRADS_V),
        )
    };
    for t in 0..n_steps {
        let src = (me + size - t) % size;
        let tags = (
            tag(layer, mb, which, t, KEYS),
            tag(layer, mb, which, t, VALUES),
        );
        // Step t + 1's K/V exchange goes out before step t computes.
        let (kv_in, mut comm_s) = if t + 1 < n_steps {
            let (kb, vb) = block::<B>(&cur, &k, &v);
            let into = buffers(ctx, kv_len)?;
            let (p, dt) = post(ctx, ring, tags, Some((kb, vb)), Some(into))?;
            (Some(p), dt)
        } else {
            (None, 0.0)
        };
        // This step's dK/dV of the visiting block: into this rank's own at step 0, else
        // into fresh buffers, added to the accumulator in flight once computed.
        let mut fresh = if t > 0 {
            Some(buffers(ctx, kv_len)?)
        } else {
            None
        };
        let (qs, ks) = sides(ctx, me, src, s_loc);
        let (kb, vb) = block::<B>(&cur, &k, &v);
        let (gk, gv) = match fresh.as_mut() {
            None => (ViewMut::all(&mut dk), ViewMut::all(&mut dv)),
            Some((fk, fv)) => (ViewMut::all(fk), ViewMut::all(fv)),
        };
        let (r, compute_s) = timed(|| {
            ctx.comm.kernel("attn_bwd_block", || {
                ctx.ops.flash_bwd_block(
                    &sh,
                    BlockQuery { q: &q, side: qs },
                    BlockKv {
                        k: kb,
                        v: vb,
                        side: ks,
                    },
                    BlockStats {
                        dout: &dout,
                        lse: &lse,
                        delta: &delta,
                    },
                    BlockGrads {
                        dq: &mut dq,
                        dk: gk,
                        dv: gv,
                    },
                    (&mut p_tile, &mut dp_tile),
                )
            })
        });
        r?;
        // The visiting block is done with (its onward send holds what it needs).
        cur = None;
        if let Some(f) = fresh {
            // The accumulator from the block's earlier visitors (first read here), plus ours.
            let acc = match acc_in.take() {
                None => f,
                Some(p) => {
                    let (got, dt) = wait(ctx, p)?;
                    comm_s += dt;
                    let (mut ak, mut av) = got.expect("the visiting block's accumulators");
                    ctx.ops.axpy(1.0, View::all(&f.0), ViewMut::all(&mut ak))?;
                    ctx.ops.axpy(1.0, View::all(&f.1), ViewMut::all(&mut av))?;
                    drop(f);
                    (ak, av)
                }
            };
            // On to the next rank, in one exchange with the receive of the next visitor's
            // accumulator (after the last step: this rank's own block coming home).
            let into = buffers(ctx, kv_len)?;
            let send = Some((View::all(&acc.0), View::all(&acc.1)));
            let peers = if t + 1 == n_steps { home } else { ring };
            let (p, dt) = post(ctx, peers, grad_tags(t), send, Some(into))?;
            comm_s += dt;
            acc_in = Some(p);
        }
        if let Some(p) = kv_in {
            let (got, dt) = wait(ctx, p)?;
            comm_s += dt;
            cur = got;
        }
        ctx.cp
            .as_mut()
            .expect("cp context")
            .record(true, t, compute_s, comm_s);
    }
    drop((cur, p_tile, dp_tile, delta, lse, q, k, v, dout));
    if let Some(p) = acc_in {
        // This rank's own block comes home with every other rank's contribution (nothing is
        // left to compute under this last exchange).
        let (got, dt) = wait(ctx, p)?;
        let (hk, hv) = got.expect("the home block's accumulators");
        ctx.ops.axpy(1.0, View::all(&hk), ViewMut::all(&mut dk))?;
        ctx.ops.axpy(1.0, View::all(&hv), ViewMut::all(&mut dv))?;
        ctx.cp
            .as_mut()
            .expect("cp context")
            .record(true, n_steps - 1, 0.0, dt);
    }
    Ok((dq, dk, dv))
}
