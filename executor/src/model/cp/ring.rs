//! Ring attention (Liu et al. 2023): K/V blocks travel cp - 1 hops around the CP ring; each
//! step merges the visiting block into the running output by the online softmax while the next
//! block is in flight (its receive buffer is allocated before the step computes, as a
//! double-buffered implementation holds it). Backward sends K/V around again, with a dK/dV
//! accumulator that follows each block from its first visitor back to its home rank (cp - 1
//! hops each). Under a causal mask a block wholly in a rank's future is skipped; the contiguous
//! layout leaves rank r with r + 1/2 blocks of work, the zigzag layout every rank with cp.

use super::{layer_shape, saved_lse, tag, timed, CoreSaved, Grads, Pass, Stats};
use crate::backend::Side;
use crate::backend::{AttnSaved, Keep};
use crate::backend::{Backend, DeviceTensor};
use crate::backend::{DeviceCollectives, TensorOps, View, ViewMut};
use crate::error::ExecError;
use crate::memory::Category;
use crate::model::Ctx;

const KEYS: u64 = 0;
const VALUES: u64 = 1;
/// The dK and dV accumulators travel as two messages.
const GRADS_K: u64 = 2;
const GRADS_V: u64 = 3;

/// Sends a K/V block to the next rank; returns the seconds it took.
fn send_kv<B: Backend>(
    ctx: &Ctx<B>,
    to: u32,
    tags: (u64, u64),
    k: View<'_, B::Tensor>,
    v: View<'_, B::Tensor>,
) -> Result<f64, ExecError> {
    let (r, dt) = timed(|| -> Result<(), ExecError> {
        ctx.comm.send(to, tags.0, k)?;
        ctx.comm.send(to, tags.1, v)
    });
    r.map(|()| dt)
}

/// Receives a K/V block (K then V, `kv_len` elements: MLA's values are narrower than its keys)
/// into `buf`; returns the seconds it took.
fn recv_kv<B: Backend>(
    ctx: &Ctx<B>,
    from: u32,
    tags: (u64, u64),
    buf: &mut B::Tensor,
    kv_len: (usize, usize),
) -> Result<f64, ExecError> {
    let (kl, vl) = kv_len;
    let (r, dt) = timed(|| -> Result<(), ExecError> {
        ctx.comm.recv(from, tags.0, ViewMut::all(buf).sub(0..kl))?;
        ctx.comm
            .recv(from, tags.1, ViewMut::all(buf).sub(kl..kl + vl))
    });
    r.map(|()| dt)
}

/// The visiting block's K and V: this rank's own at the first step, else the received block.
fn block<'t, B: Backend>(
    cur: &'t Option<B::Tensor>,
    k: &'t B::Tensor,
    v: &'t B::Tensor,
    kv_len: (usize, usize),
) -> (View<'t, B::Tensor>, View<'t, B::Tensor>) {
    let (kl, vl) = kv_len;
    match cur {
        None => (View::all(k), View::all(v)),
        Some(c) => (View::all(c).sub(0..kl), View::all(c).sub(kl..kl + vl)),
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
    let (next, prev) = (cp.next(), cp.prev());
    let s_loc = cp.positions[me].len();
    let kv_len = (k.len(), v.len());
    let mut acc = ctx.zeros(Category::Activations, &[q.rows(), sh.hq * sh.dv])?;
    let mut st = Stats::<B>::new(&ctx.ops, sh.b * sh.hq * s_loc)?;
    let mut tile = ctx.zeros(Category::Buffers, &[s_loc, s_loc])?;
    let mut cur: Option<B::Tensor> = None;
    for t in 0..size {
        let src = (me + size - t) % size;
        let mut comm_s = 0.0;
        let mut nxt = None;
        let tags = (
            tag(layer, mb, which, t, KEYS),
            tag(layer, mb, which, t, VALUES),
        );
        let (kb, vb) = block::<B>(&cur, k, v, kv_len);
        if t + 1 < size {
            comm_s += send_kv(ctx, next, tags, kb.clone(), vb.clone())?;
            nxt = Some(ctx.zeros(Category::Buffers, &[kv_len.0 + kv_len.1])?);
        }
        let cp = ctx.cp.as_ref().expect("cp context");
        let qs = Side {
            pos: &cp.positions[me],
            tile: s_loc,
        };
        let ks = Side {
            pos: &cp.positions[src],
            tile: s_loc,
        };
        let (work, compute_s) = timed(|| {
            ctx.ops.flash_fwd_block(
                &sh,
                q,
                qs,
                kb,
                vb,
                ks,
                &mut acc,
                &mut st.max,
                &mut st.sum,
                &mut tile,
            )
        });
        let work = work?;
        if let Some(mut n) = nxt {
            comm_s += recv_kv(ctx, prev, tags, &mut n, kv_len)?;
            cur = Some(n);
        }
        let cp = ctx.cp.as_mut().expect("cp context");
        if count {
            cp.stats.score_elements += work;
        }
        cp.record(false, t, compute_s, comm_s);
    }
    drop((cur, tile));
    let mut lse = ctx.zeros_f32(Category::Buffers, &[sh.b * sh.hq * s_loc])?;
    ctx.ops
        .flash_finish(&sh, s_loc, &mut acc, &st.max, &st.sum, &mut lse)?;
    Ok((acc, lse))
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
    let attn = saved_lse::<B>(&ctx.ops, keep, lse);
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
    let mb = ctx.mb;
    let cp = ctx.cp.as_ref().expect("cp context");
    let (me, size) = (cp.rank, cp.size);
    let (next, prev) = (cp.next(), cp.prev());
    let s_loc = cp.positions[me].len();
    let kv_len = (k.len(), v.len());
    let (kl, vl) = kv_len;
    let b = Category::Buffers;
    let mut dq = ctx.zeros(b, &[q.rows(), q.cols()])?;
    let mut dk = ctx.zeros(b, &[k.rows(), k.cols()])?;
    let mut dv = ctx.zeros(b, &[v.rows(), v.cols()])?;
    let mut p_tile = ctx.zeros(b, &[s_loc, s_loc])?;
    let mut dp_tile = ctx.zeros(b, &[s_loc, s_loc])?;
    let mut cur: Option<B::Tensor> = None;
    let mut acc: Option<(B::Tensor, B::Tensor)> = None;
    let which = Pass::Backward;
    for t in 0..size {
        let src = (me + size - t) % size;
        let mut comm_s = 0.0;
        // Post the next step's buffers (K/V, and the dK/dV accumulator from step 2 on).
        let nxt = if t + 1 < size {
            Some(ctx.zeros(b, &[kl + vl])?)
        } else {
            None
        };
        let nxt_acc = if t + 1 < size && t >= 1 {
            Some((ctx.zeros(b, &[kl])?, ctx.zeros(b, &[vl])?))
        } else {
            None
        };
        let tags = (
            tag(layer, mb, which, t, KEYS),
            tag(layer, mb, which, t, VALUES),
        );
        if t + 1 < size {
            let (kb, vb) = block::<B>(&cur, &k, &v, kv_len);
            comm_s += send_kv(ctx, next, tags, kb, vb)?;
        }
        let cp = ctx.cp.as_ref().expect("cp context");
        let qs = Side {
            pos: &cp.positions[me],
            tile: s_loc,
        };
        let ks = Side {
            pos: &cp.positions[src],
            tile: s_loc,
        };
        let compute_s = if t == 0 {
            let (r, dt) = timed(|| {
                ctx.ops.flash_bwd_block(
                    &sh,
                    &q,
                    qs,
                    View::all(&k),
                    View::all(&v),
                    ks,
                    &dout,
                    &lse,
                    &delta,
                    &mut dq,
                    ViewMut::all(&mut dk),
                    ViewMut::all(&mut dv),
                    &mut p_tile,
                    &mut dp_tile,
                )
            });
            r?;
            dt
        } else {
            let c = cur.as_ref().expect("visiting block");
            let (kb, vb) = (View::all(c).sub(0..kl), View::all(c).sub(kl..kl + vl));
            // The first visitor starts the block's accumulators (dK, dV).
            let (mut ak, mut av) = match acc.take() {
                Some(a) => a,
                None => (ctx.zeros(b, &[kl])?, ctx.zeros(b, &[vl])?),
            };
            let (r, dt) = timed(|| {
                ctx.ops.flash_bwd_block(
                    &sh,
                    &q,
                    qs,
                    kb,
                    vb,
                    ks,
                    &dout,
                    &lse,
                    &delta,
                    &mut dq,
                    ViewMut::all(&mut ak),
                    ViewMut::all(&mut av),
                    &mut p_tile,
                    &mut dp_tile,
                )
            });
            r?;
            // On to the next rank (the block's home after the last step).
            let (r, ct) = timed(|| -> Result<(), ExecError> {
                ctx.comm
                    .send(next, tag(layer, mb, which, t, GRADS_K), View::all(&ak))?;
                ctx.comm
                    .send(next, tag(layer, mb, which, t, GRADS_V), View::all(&av))
            });
            r?;
            comm_s += ct;
            dt
        };
        if let Some(mut n) = nxt {
            comm_s += recv_kv(ctx, prev, tags, &mut n, kv_len)?;
            cur = Some(n);
        }
        if let Some((mut ak, mut av)) = nxt_acc {
            let (r, dt) = timed(|| -> Result<(), ExecError> {
                ctx.comm.recv(
                    prev,
                    tag(layer, mb, which, t, GRADS_K),
                    ViewMut::all(&mut ak),
                )?;
                ctx.comm.recv(
                    prev,
                    tag(layer, mb, which, t, GRADS_V),
                    ViewMut::all(&mut av),
                )
            });
            r?;
            comm_s += dt;
            acc = Some((ak, av));
        }
        ctx.cp
            .as_mut()
            .expect("cp context")
            .record(true, t, compute_s, comm_s);
    }
    drop((cur, acc, p_tile, dp_tile, delta, lse, q, k, v, dout));
    if size > 1 {
        // This rank's own block comes home with every other rank's contribution.
        let (mut hk, mut hv) = (ctx.zeros(b, &[kl])?, ctx.zeros(b, &[vl])?);
        let last = size - 1;
        let (r, dt) = timed(|| -> Result<(), ExecError> {
            ctx.comm.recv(
                prev,
                tag(layer, mb, which, last, GRADS_K),
                ViewMut::all(&mut hk),
            )?;
            ctx.comm.recv(
                prev,
                tag(layer, mb, which, last, GRADS_V),
                ViewMut::all(&mut hv),
            )
        });
        r?;
        ctx.ops.axpy(1.0, View::all(&hk), ViewMut::all(&mut dk))?;
        ctx.ops.axpy(1.0, View::all(&hv), ViewMut::all(&mut dv))?;
        ctx.cp
            .as_mut()
            .expect("cp context")
            .record(true, size - 1, 0.0, dt);
    }
    Ok((dq, dk, dv))
}
