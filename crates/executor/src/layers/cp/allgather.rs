//! All-gather context parallelism (Megatron's `all_gather` CP comm type): K and V are
//! all-gathered over the CP group before attention and only the local shard is saved; backward
//! gathers them again and reduce-scatters dK and dV. The sequence uses the load-balanced layout
//! (rank r holds chunks r and 2cp - 1 - r), so the causal work is even. The gathered K/V are
//! visited one source rank's block at a time, so score tiles stay (s/cp)^2.

use super::common::{
    fold_sinks, layer_shape, saved_lse, sinks_grad, timed, CoreSaved, Grads, Stats,
};

use crate::backend::ops::*;
use crate::backend::{Backend, DeviceTensor};
use crate::backend::{DeviceCollectives, View, ViewMut};
use crate::error::ExecError;
use crate::layers::ctx::Ctx;
use crate::tracker::Category;

/// Gathers K and V over the CP group: [cp x k.len()] each, source-rank major.
fn gather<B: Backend>(
    ctx: &Ctx<B>,
    k: &B::Tensor,
    v: &B::Tensor,
) -> Result<(B::Tensor, B::Tensor, f64), ExecError> {
    let cp = ctx.cp.as_ref().expect("cp context");
    let size = cp.size;
    let mut gk = ctx.zeros(Category::Buffers, &[size * k.len()])?;
    let mut gv = ctx.zeros(Category::Buffers, &[size * v.len()])?;
    let (r, dt) = timed(|| -> Result<(), ExecError> {
        ctx.comm
            .all_gather(&cp.group, View::all(k), ViewMut::all(&mut gk))?;
        ctx.comm
            .all_gather(&cp.group, View::all(v), ViewMut::all(&mut gv))
    });
    r?;
    Ok((gk, gv, dt))
}

/// Output and log-sum-exp of the local queries against the gathered K/V, and the seconds.
fn pass<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    q: &B::Tensor,
    gk: &B::Tensor,
    gv: &B::Tensor,
    count: bool,
) -> Result<(B::Tensor, B::Tensor, f64), ExecError> {
    let sh = layer_shape(ctx, layer);
    let cp = ctx.cp.as_ref().expect("cp context");
    let (me, size) = (cp.rank, cp.size);
    let s_loc = cp.positions[me].len();
    let (blk, vblk) = (gk.len() / size, gv.len() / size);
    let mut acc = ctx.zeros(Category::Activations, &[q.rows(), sh.hq * sh.dv])?;
    let mut st = Stats::<B>::new(ctx.ops, sh.b * sh.hq * s_loc)?;
    let mut tile = ctx.zeros(Category::Buffers, &[s_loc, s_loc])?;
    let qs = Side {
        pos: &cp.positions[me],
        tile: s_loc,
    };
    let (work, compute_s) = timed(|| -> Result<u64, ExecError> {
        let mut work = 0;
        for src in 0..size {
            let r = src * blk..(src + 1) * blk;
            let rv = src * vblk..(src + 1) * vblk;
            work += ctx.ops.flash_fwd_block(
                &sh,
                BlockQuery { q, side: qs },
                BlockKv {
                    k: View::all(gk).sub(r),
                    v: View::all(gv).sub(rv),
                    side: Side {
                        pos: &cp.positions[src],
                        tile: s_loc,
                    },
                },
                BlockAcc {
                    acc: &mut acc,
                    max: &mut st.max,
                    sum: &mut st.sum,
                },
                &mut tile,
            )?;
        }
        Ok(work)
    });
    let work = work?;
    drop(tile);
    let mut lse = st.finish(ctx.ops, &sh, s_loc, &mut acc)?;
    let sinks = ctx.cp.as_ref().and_then(|c| c.sinks.as_ref());
    fold_sinks::<B>(ctx.ops, sinks, &sh, s_loc, 0, &mut acc, &mut lse)?;
    if count {
        ctx.cp.as_mut().expect("cp context").stats.score_elements += work;
    }
    Ok((acc, lse, compute_s))
}

pub fn forward<B: Backend>(
    ctx: &mut Ctx<B>,
    layer: u32,
    q: B::Tensor,
    k: B::Tensor,
    v: B::Tensor,
    keep: Keep,
) -> Result<(B::Tensor, CoreSaved<B>), ExecError> {
    let (gk, gv, comm_s) = gather(ctx, &k, &v)?;
    let count = !ctx.recomputing;
    let (o, lse, compute_s) = pass(ctx, layer, &q, &gk, &gv, count)?;
    drop((gk, gv));
    ctx.cp
        .as_mut()
        .expect("cp context")
        .record(false, 0, compute_s, comm_s);
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
    let (gk, gv, mut comm_s) = gather(ctx, &k, &v)?;
    let lse = match attn {
        AttnSaved::Lse(l) => l,
        // Selective recomputation: the forward once more on the gathered K/V.
        _ => {
            let (o2, lse, _) = pass(ctx, layer, &q, &gk, &gv, false)?;
            drop(o2);
            lse
        }
    };
    let sh = layer_shape(ctx, layer);
    sinks_grad(ctx, &sh, q.rows() / sh.b, 0, &lse, &delta)?;
    let cp = ctx.cp.as_ref().expect("cp context");
    let (me, size) = (cp.rank, cp.size);
    let s_loc = cp.positions[me].len();
    let (blk, vblk) = (k.len(), v.len());
    let b = Category::Buffers;
    let mut dq = ctx.zeros(b, &[q.rows(), q.cols()])?;
    let mut gdk = ctx.zeros(b, &[size * blk])?;
    let mut gdv = ctx.zeros(b, &[size * vblk])?;
    let mut p_tile = ctx.zeros(b, &[s_loc, s_loc])?;
    let mut dp_tile = ctx.zeros(b, &[s_loc, s_loc])?;
    let qs = Side {
        pos: &cp.positions[me],
        tile: s_loc,
    };
    let (r, compute_s) = timed(|| -> Result<(), ExecError> {
        for src in 0..size {
            let r = src * blk..(src + 1) * blk;
            let rv = src * vblk..(src + 1) * vblk;
            ctx.ops.flash_bwd_block(
                &sh,
                BlockQuery { q: &q, side: qs },
                BlockKv {
                    k: View::all(&gk).sub(r.clone()),
                    v: View::all(&gv).sub(rv.clone()),
                    side: Side {
                        pos: &cp.positions[src],
                        tile: s_loc,
                    },
                },
                BlockStats {
                    dout: &dout,
                    lse: &lse,
                    delta: &delta,
                },
                BlockGrads {
                    dq: &mut dq,
                    dk: ViewMut::all(&mut gdk).sub(r),
                    dv: ViewMut::all(&mut gdv).sub(rv),
                },
                (&mut p_tile, &mut dp_tile),
            )?;
        }
        Ok(())
    });
    r?;
    drop((gk, gv, p_tile, dp_tile, delta, lse, dout));
    let mut dk = ctx.zeros(b, &[k.rows(), k.cols()])?;
    let mut dv = ctx.zeros(b, &[v.rows(), v.cols()])?;
    let (r, dt) = timed(|| -> Result<(), ExecError> {
        ctx.comm
            .reduce_scatter(&cp.group, View::all(&gdk), ViewMut::all(&mut dk))?;
        ctx.comm
            .reduce_scatter(&cp.group, View::all(&gdv), ViewMut::all(&mut dv))
    });
    r?;
    comm_s += dt;
    drop((gdk, gdv, q, k, v));
    ctx.cp
        .as_mut()
        .expect("cp context")
        .record(true, 0, compute_s, comm_s);
    Ok((dq, dk, dv))
}
