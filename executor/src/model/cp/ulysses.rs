//! DeepSpeed-Ulysses (Jacobs et al. 2023): one all-to-all turns the sequence shards of Q, K and
//! V into head shards of the whole sequence (rank j of the CP group takes head group j of its TP
//! rank's heads), attention runs per head group unchanged, and a second all-to-all brings the
//! output back to sequence shards; backward reverses both (the output gradient and
//! FlashAttention-2's row statistic D = rowsum(dO * O) travel together, then dQ, dK, dV return).
//! Needs the heads and K/V heads of a TP rank divisible by cp; the layout is contiguous.

use super::{saved_lse, shape, timed, CoreSaved, Stats};
use crate::backend::cpu::ops::attention::{AttnSaved, Keep};
use crate::backend::cpu::ops::flash::{self, BlockShape, Side};
use crate::backend::cpu::{Category, CpuOps, Tensor};
use crate::backend::Collectives;
use crate::error::ExecError;
use crate::model::Ctx;

/// One tensor of an all-to-all: its heads on the sequence side and its features per head.
#[derive(Debug, Clone, Copy)]
struct Part {
    heads: usize,
    e: usize,
}

/// The geometry of the exchange: `b` sequences of `cp` shards of `s_loc` rows.
#[derive(Debug, Clone, Copy)]
struct Geo {
    b: usize,
    s_loc: usize,
    cp: usize,
}

impl Geo {
    fn chunk(&self, parts: &[Part]) -> usize {
        parts
            .iter()
            .map(|p| self.b * self.s_loc * p.heads / self.cp * p.e)
            .sum()
    }

    /// Walks the sequence-shard side [b, s_loc, H, e]: for chunk j (head group j), each part
    /// and row, `f(part, offset in the shard, offset in the chunk buffer, width)`.
    fn walk_seq(&self, parts: &[Part], mut f: impl FnMut(usize, usize, usize, usize)) {
        let chunk = self.chunk(parts);
        for j in 0..self.cp {
            let mut off = j * chunk;
            for (t, p) in parts.iter().enumerate() {
                let w = p.heads / self.cp * p.e;
                for row in 0..self.b * self.s_loc {
                    f(t, row * p.heads * p.e + j * w, off, w);
                    off += w;
                }
            }
        }
    }

    /// Walks the head-shard side [b, s, Hl, e]: for chunk j (rank j's rows), each part and
    /// row, `f(part, offset in the head shard, offset in the chunk buffer, width)`.
    fn walk_head(&self, parts: &[Part], mut f: impl FnMut(usize, usize, usize, usize)) {
        let chunk = self.chunk(parts);
        let s = self.s_loc * self.cp;
        for j in 0..self.cp {
            let mut off = j * chunk;
            for (t, p) in parts.iter().enumerate() {
                let w = p.heads / self.cp * p.e;
                for bi in 0..self.b {
                    for il in 0..self.s_loc {
                        f(t, (bi * s + j * self.s_loc + il) * w, off, w);
                        off += w;
                    }
                }
            }
        }
    }

    /// Sequence shards -> send chunks, chunk j holding head group j.
    fn pack_seq(&self, xs: &[(&[f32], Part)], out: &mut [f32]) {
        let parts: Vec<Part> = xs.iter().map(|x| x.1).collect();
        self.walk_seq(&parts, |t, x, c, w| {
            out[c..c + w].copy_from_slice(&xs[t].0[x..x + w])
        });
    }

    /// Received chunks (chunk i: head group i of this rank's rows) -> sequence shards.
    fn unpack_seq(&self, recv: &[f32], parts: &[Part], outs: &mut [&mut [f32]]) {
        self.walk_seq(parts, |t, x, c, w| {
            outs[t][x..x + w].copy_from_slice(&recv[c..c + w])
        });
    }

    /// Head shards -> send chunks, chunk j holding rank j's rows.
    fn pack_head(&self, xs: &[(&[f32], Part)], out: &mut [f32]) {
        let parts: Vec<Part> = xs.iter().map(|x| x.1).collect();
        self.walk_head(&parts, |t, x, c, w| {
            out[c..c + w].copy_from_slice(&xs[t].0[x..x + w])
        });
    }

    /// Received chunks (chunk i: rank i's rows of this head group) -> head shards [b, s, Hl, e].
    fn unpack_head(&self, recv: &[f32], parts: &[Part], outs: &mut [&mut [f32]]) {
        self.walk_head(parts, |t, x, c, w| {
            outs[t][x..x + w].copy_from_slice(&recv[c..c + w])
        });
    }
}

/// The exchange's geometry and the head-group attention shape of this rank.
fn setup(ctx: &Ctx) -> (Geo, BlockShape, Vec<u32>) {
    let sh = shape(ctx);
    let cp = ctx.cp.as_ref().expect("cp context");
    let geo = Geo {
        b: sh.b,
        s_loc: cp.positions[cp.rank].len(),
        cp: cp.size,
    };
    let local = BlockShape {
        hq: sh.hq / cp.size,
        hk: sh.hk / cp.size,
        ..sh
    };
    let all: Vec<u32> = (0..(geo.s_loc * geo.cp) as u32).collect();
    (geo, local, all)
}

/// All-to-all of `send` over the CP group into a new buffer of category `cat`.
fn exchange(ctx: &Ctx, send: &Tensor, cat: Category) -> Result<(Tensor, f64), ExecError> {
    let cp = ctx.cp.as_ref().expect("cp context");
    let mut recv = ctx.ops.zeros(cat, &[send.len()]);
    let (r, dt) = timed(|| ctx.comm.all_to_all(&cp.group, send.data(), recv.data_mut()));
    r?;
    Ok((recv, dt))
}

/// Attention of the head group over the whole sequence: (unnormalised output, lse, work).
fn attend(
    ops: &CpuOps,
    geo: &Geo,
    sh: &BlockShape,
    all: &[u32],
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> (Tensor, Tensor, u64) {
    let s = all.len();
    let side = Side {
        pos: all,
        tile: geo.s_loc,
    };
    let mut acc = ops.zeros(Category::Buffers, &[q.rows(), q.cols()]);
    let mut st = Stats::new(ops, sh.b * sh.hq * s);
    let mut tile = ops.zeros(Category::Buffers, &[geo.s_loc, geo.s_loc]);
    let work = flash::forward_block(
        ops.gemm_counter(),
        sh,
        q.data(),
        side,
        k.data(),
        v.data(),
        side,
        acc.data_mut(),
        &mut st.online(),
        tile.data_mut(),
    );
    drop(tile);
    let mut lse = ops.zeros(Category::Buffers, &[sh.b * sh.hq * s]);
    flash::finish(sh, s, acc.data_mut(), &st.online(), lse.data_mut());
    (acc, lse, work)
}

pub fn forward(
    ctx: &mut Ctx,
    _layer: u32,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Keep,
) -> Result<(Tensor, CoreSaved), ExecError> {
    let (geo, sh, all) = setup(ctx);
    let (a_r, g_r, d) = (ctx.rd.a_r, ctx.rd.g_r, ctx.rd.d);
    let parts = [
        Part { heads: a_r, e: d },
        Part { heads: g_r, e: d },
        Part { heads: g_r, e: d },
    ];
    let b = Category::Buffers;
    let mut send = ctx.ops.zeros(b, &[q.len() + k.len() + v.len()]);
    geo.pack_seq(
        &[
            (q.data(), parts[0]),
            (k.data(), parts[1]),
            (v.data(), parts[2]),
        ],
        send.data_mut(),
    );
    let s = geo.s_loc * geo.cp;
    let rows = geo.b * s;
    drop((q, k, v));
    let (recv, mut comm_s) = exchange(ctx, &send, b)?;
    drop(send);
    let a = Category::Activations;
    let mut qh = ctx.ops.zeros(a, &[rows, sh.hq * d]);
    let mut kh = ctx.ops.zeros(a, &[rows, sh.hk * d]);
    let mut vh = ctx.ops.zeros(a, &[rows, sh.hk * d]);
    geo.unpack_head(
        recv.data(),
        &parts,
        &mut [qh.data_mut(), kh.data_mut(), vh.data_mut()],
    );
    drop(recv);
    let ((oh, lse, work), compute_s) = timed(|| attend(&ctx.ops, &geo, &sh, &all, &qh, &kh, &vh));
    let mut send = ctx.ops.zeros(b, &[oh.len()]);
    geo.pack_head(&[(oh.data(), parts[0])], send.data_mut());
    drop(oh);
    let (recv, dt) = exchange(ctx, &send, b)?;
    comm_s += dt;
    drop(send);
    let mut o = ctx.ops.zeros(a, &[geo.b * geo.s_loc, a_r * d]);
    geo.unpack_seq(recv.data(), &parts[..1], &mut [o.data_mut()]);
    drop(recv);
    let cp = ctx.cp.as_mut().expect("cp context");
    if !ctx.recomputing {
        cp.stats.score_elements += work;
    }
    cp.record(false, 0, compute_s, comm_s);
    let attn = saved_lse(keep, lse);
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

pub fn backward(
    ctx: &mut Ctx,
    _layer: u32,
    s: CoreSaved,
    d_rows: Tensor,
    dout: Tensor,
) -> Result<(Tensor, Tensor, Tensor), ExecError> {
    let (geo, sh, all) = setup(ctx);
    let CoreSaved { q, k, v, attn } = s;
    let lse = match attn {
        AttnSaved::Lse(l) => l,
        // Selective recomputation: the head group's attention again (no communication).
        _ => attend(&ctx.ops, &geo, &sh, &all, &q, &k, &v).1,
    };
    let (a_r, g_r, d) = (ctx.rd.a_r, ctx.rd.g_r, ctx.rd.d);
    let b = Category::Buffers;
    let seq_rows = geo.b * geo.s_loc;
    let out_parts = [Part { heads: a_r, e: d }, Part { heads: a_r, e: 1 }];
    let mut send = ctx.ops.zeros(b, &[dout.len() + d_rows.len()]);
    geo.pack_seq(
        &[(dout.data(), out_parts[0]), (d_rows.data(), out_parts[1])],
        send.data_mut(),
    );
    drop((dout, d_rows));
    let (recv, mut comm_s) = exchange(ctx, &send, b)?;
    drop(send);
    let s = geo.s_loc * geo.cp;
    let rows = geo.b * s;
    let mut doh = ctx.ops.zeros(b, &[rows, sh.hq * d]);
    let mut delta = ctx.ops.zeros(b, &[rows * sh.hq]);
    geo.unpack_head(
        recv.data(),
        &out_parts,
        &mut [doh.data_mut(), delta.data_mut()],
    );
    drop(recv);
    let mut dqh = ctx.ops.zeros(b, &[rows, sh.hq * d]);
    let mut dkh = ctx.ops.zeros(b, &[rows, sh.hk * d]);
    let mut dvh = ctx.ops.zeros(b, &[rows, sh.hk * d]);
    let mut p_tile = ctx.ops.zeros(b, &[geo.s_loc, geo.s_loc]);
    let mut dp_tile = ctx.ops.zeros(b, &[geo.s_loc, geo.s_loc]);
    let side = Side {
        pos: &all,
        tile: geo.s_loc,
    };
    let compute_s = timed(|| {
        flash::backward_block(
            ctx.ops.gemm_counter(),
            &sh,
            q.data(),
            side,
            k.data(),
            v.data(),
            side,
            doh.data(),
            lse.data(),
            delta.data(),
            dqh.data_mut(),
            dkh.data_mut(),
            dvh.data_mut(),
            p_tile.data_mut(),
            dp_tile.data_mut(),
        )
    })
    .1;
    drop((doh, p_tile, dp_tile, delta, lse, q, k, v));
    let parts = [
        Part { heads: a_r, e: d },
        Part { heads: g_r, e: d },
        Part { heads: g_r, e: d },
    ];
    let mut send = ctx.ops.zeros(b, &[dqh.len() + dkh.len() + dvh.len()]);
    geo.pack_head(
        &[
            (dqh.data(), parts[0]),
            (dkh.data(), parts[1]),
            (dvh.data(), parts[2]),
        ],
        send.data_mut(),
    );
    drop((dqh, dkh, dvh));
    let (recv, dt) = exchange(ctx, &send, b)?;
    comm_s += dt;
    drop(send);
    let mut dq = ctx.ops.zeros(b, &[seq_rows, a_r * d]);
    let mut dk = ctx.ops.zeros(b, &[seq_rows, g_r * d]);
    let mut dv = ctx.ops.zeros(b, &[seq_rows, g_r * d]);
    geo.unpack_seq(
        recv.data(),
        &parts,
        &mut [dq.data_mut(), dk.data_mut(), dv.data_mut()],
    );
    drop(recv);
    ctx.cp
        .as_mut()
        .expect("cp context")
        .record(true, 0, compute_s, comm_s);
    Ok((dq, dk, dv))
}
