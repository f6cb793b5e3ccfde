//! Causal block attention with the online softmax (Milakov & Gimelshein 2018; Dao et al. 2022
//! FlashAttention; Liu et al. 2023 Ring Attention): the local queries meet one block of keys
//! and values at a time, each block is merged into a running output by its running row maximum
//! and sum, and the backward rebuilds each block's probabilities from the final log-sum-exp.
//! Rows carry their sequence positions, so the same kernel serves contiguous, zigzag and
//! gathered layouts; the causal mask compares positions, and a pair of position runs that is
//! entirely in the future is skipped.

use super::gemm::{gemm, View};
use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::gemm_counter::GemmCounter;
use crate::backend::cpu::tensor::{dst, src, store, store_all, store_view, Tensor};
use crate::backend::ops::{
    BlockAcc, BlockGrads, BlockKv, BlockQuery, BlockShape, BlockStats, FlashOps, Side,
};
use crate::backend::{View as TensorView, ViewMut};
use crate::error::ExecError;
use parsim_plan::plan::AttnSpan;

impl BlockShape {
    fn scale(&self) -> f32 {
        1.0 / (self.d as f32).sqrt()
    }
}

impl Side<'_> {
    fn rows(&self) -> usize {
        self.pos.len()
    }

    /// Runs of consecutive positions, cut at `tile` rows: (first row, rows).
    fn runs(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut start = 0;
        for i in 1..=self.pos.len() {
            let cut = i == self.pos.len()
                || self.pos[i] != self.pos[i - 1] + 1
                || i - start == self.tile.max(1);
            if cut {
                out.push((start, i - start));
                start = i;
            }
        }
        out
    }
}

/// Keys of a query row at position `qp` among a run of `len` keys starting at position `k0`
/// (the run holds consecutive positions): the unmasked range `lo..hi` of the run, under the
/// causal mask and the span's (window, chunk); empty when none is.
fn visible(span: AttnSpan, qp: u32, k0: u32, len: usize) -> (usize, usize) {
    if qp < k0 {
        return (0, 0);
    }
    let hi = ((qp - k0) as usize + 1).min(len);
    let lo = (span.first_key(qp).saturating_sub(k0) as usize).min(hi);
    (lo, hi)
}

/// Running statistics of the online softmax, [b, hq, rows] each.
pub struct Online<'a> {
    /// Running row maximum of the scaled scores (-inf before any key).
    pub max: &'a mut [f32],
    /// Running sum of exp(score - max).
    pub sum: &'a mut [f32],
}

/// Views of head `h` of sequence `bi` over rows `r0..r0 + n` of a [b, rows, heads, d] tensor.
fn head_view(
    rows: usize,
    heads: usize,
    d: usize,
    bi: usize,
    h: usize,
    r0: usize,
    n: usize,
) -> View {
    View::block(n, d, heads * d, ((bi * rows + r0) * heads + h) * d)
}

/// One (sequence, query head, query run, key run) meeting that is not wholly masked.
struct Pair<'a> {
    bi: usize,
    h: usize,
    /// First query row of the run and its row count; keys in the run.
    r0: usize,
    rn: usize,
    cn: usize,
    /// Query and K/V head views over the runs, the output and value head views (`dv` wide),
    /// and the [rn, cn] score tile.
    qv: View,
    kv: View,
    ov: View,
    vv: View,
    tv: View,
    /// Index of the run's first row in the [b, hq, rows] statistics.
    stat0: usize,
    full: bool,
    k0: u32,
    qpos: &'a [u32],
    span: AttnSpan,
}

impl Pair<'_> {
    /// Unmasked keys `lo..hi` of query row `i` of the run.
    fn visible(&self, i: usize) -> (usize, usize) {
        if self.full {
            (0, self.cn)
        } else {
            visible(self.span, self.qpos[self.r0 + i], self.k0, self.cn)
        }
    }
}

/// Calls `f` for every meeting of a query run and a key run that the causal mask leaves
/// anything of, per sequence and query head.
fn for_each_pair(sh: &BlockShape, qs: Side, ks: Side, mut f: impl FnMut(&Pair)) {
    let (sq, sk, d) = (qs.rows(), ks.rows(), sh.d);
    let group = sh.hq / sh.hk;
    let (qruns, kruns) = (qs.runs(), ks.runs());
    for bi in 0..sh.b {
        for h in 0..sh.hq {
            for &(r0, rn) in &qruns {
                let (qlo, qhi) = (qs.pos[r0], qs.pos[r0 + rn - 1]);
                for &(c0, cn) in &kruns {
                    let (k0, klast) = (ks.pos[c0], ks.pos[c0 + cn - 1]);
                    // Wholly in the future, or wholly before the span of the run's first
                    // query (the span's first key never decreases with the position).
                    if k0 > qhi || klast < sh.span.first_key(qlo) {
                        continue;
                    }
                    f(&Pair {
                        bi,
                        h,
                        r0,
                        rn,
                        cn,
                        qv: head_view(sq, sh.hq, d, bi, h, r0, rn),
                        kv: head_view(sk, sh.hk, d, bi, h / group, c0, cn),
                        ov: head_view(sq, sh.hq, sh.dv, bi, h, r0, rn),
                        vv: head_view(sk, sh.hk, sh.dv, bi, h / group, c0, cn),
                        tv: View::rm(rn, cn),
                        stat0: (bi * sh.hq + h) * sq + r0,
                        full: klast <= qlo && k0 >= sh.span.first_key(qhi),
                        k0,
                        qpos: qs.pos,
                        span: sh.span,
                    });
                }
            }
        }
    }
}

/// Merges one K/V block into the running output `acc` ([b, q rows, hq, d], unnormalised) and
/// statistics. `tile` is scratch of at least (q tile x k tile). Returns the unmasked score
/// elements computed (the causal work).
pub fn forward_block(
    g: &GemmCounter,
    sh: &BlockShape,
    BlockQuery { q, side: qs }: BlockQuery<'_, [f32]>,
    (k, v, ks): (&[f32], &[f32], Side),
    acc: &mut [f32],
    st: &mut Online,
    tile: &mut [f32],
) -> u64 {
    let d = sh.dv;
    let sq = qs.rows();
    let mut work = 0u64;
    let mut z = Vec::new();
    for_each_pair(sh, qs, ks, |pr| {
        let (rn, cn) = (pr.rn, pr.cn);
        gemm(
            g,
            sh.scale(),
            (q, pr.qv),
            (k, pr.kv.t()),
            0.0,
            (tile, pr.tv),
        );
        for i in 0..rn {
            let (lo, hi) = pr.visible(i);
            let row = &mut tile[i * cn..(i + 1) * cn];
            let si = pr.stat0 + i;
            work += (hi - lo) as u64;
            if hi == lo {
                row.fill(0.0);
                continue;
            }
            let m_old = st.max[si];
            let m_new = row[lo..hi].iter().copied().fold(m_old, f32::max);
            let alpha = if m_old == f32::NEG_INFINITY {
                0.0
            } else {
                (m_old - m_new).exp()
            };
            let mut sum = 0.0f32;
            for x in row[lo..hi].iter_mut() {
                *x = (*x - m_new).exp();
                sum += *x;
            }
            row[..lo].fill(0.0);
            row[hi..].fill(0.0);
            // The running sum is the undropped softmax's; only the output sees the mask.
            if let Some(dr) = &sh.dropout {
                z.resize(hi, 0.0);
                dr.fill_row(pr.bi, pr.h, pr.qpos[pr.r0 + i], pr.k0, &mut z);
                row[..hi].iter_mut().zip(&z).for_each(|(x, m)| *x *= m);
            }
            st.max[si] = m_new;
            st.sum[si] = st.sum[si] * alpha + sum;
            if alpha != 1.0 {
                let o = ((pr.bi * sq + pr.r0 + i) * sh.hq + pr.h) * d;
                acc[o..o + d].iter_mut().for_each(|x| *x *= alpha);
            }
        }
        gemm(g, 1.0, (tile, pr.tv), (v, pr.vv), 1.0, (acc, pr.ov));
    });
    work
}

/// Normalises the running output into `o` (in place) and writes the log-sum-exp.
pub fn finish(
    sh: &BlockShape,
    rows: usize,
    o: &mut [f32],
    max: &[f32],
    sum: &[f32],
    lse: &mut [f32],
) {
    for bi in 0..sh.b {
        for h in 0..sh.hq {
            for i in 0..rows {
                let si = (bi * sh.hq + h) * rows + i;
                let (m, l) = (max[si], sum[si]);
                lse[si] = m + l.ln();
                let off = ((bi * rows + i) * sh.hq + h) * sh.dv;
                o[off..off + sh.dv].iter_mut().for_each(|x| *x /= l);
            }
        }
    }
}

/// Attention sinks (GPT-OSS): head h's logit `sinks[h]` joins the denominator of each of its
/// rows. From the normalised output `o` [b, rows, hq, dv] and log-sum-exp `lse` [b, hq, rows]
/// of the keys: lse' = log(exp(lse) + exp(sink)) and o *= exp(lse - lse'), in place.
pub fn sink_fwd(sh: &BlockShape, rows: usize, o: &mut [f32], lse: &mut [f32], sinks: &[f32]) {
    for bi in 0..sh.b {
        for (h, &z) in sinks.iter().enumerate().take(sh.hq) {
            for i in 0..rows {
                let si = (bi * sh.hq + h) * rows + i;
                let l = lse[si];
                let m = l.max(z);
                let total = m + ((l - m).exp() + (z - m).exp()).ln();
                let scale = (l - total).exp();
                lse[si] = total;
                let off = ((bi * rows + i) * sh.hq + h) * sh.dv;
                o[off..off + sh.dv].iter_mut().for_each(|x| *x *= scale);
            }
        }
    }
}

/// The sinks' gradient: dL/dsink_h = -sum over h's rows of P_sink D, P_sink = exp(sink_h -
/// lse') with the final log-sum-exp `lse` [b, hq, rows] and D = rowsum(dO * O) `delta`
/// [b, rows, hq] (the output is sum_j P_j v_j and every P_j falls by P_j P_sink per unit of
/// sink). Added into `dsinks`.
pub fn sink_grad(
    sh: &BlockShape,
    rows: usize,
    lse: &[f32],
    delta: &[f32],
    sinks: &[f32],
    dsinks: &mut [f32],
) {
    for (h, g) in dsinks.iter_mut().enumerate().take(sh.hq) {
        let mut acc = 0.0f64;
        for bi in 0..sh.b {
            for i in 0..rows {
                let p = (sinks[h] - lse[(bi * sh.hq + h) * rows + i]).exp();
                acc += f64::from(p * delta[(bi * rows + i) * sh.hq + h]);
            }
        }
        *g -= acc as f32;
    }
}

/// delta[b, rows, hq] = rowsum(dO * O) per head (FlashAttention-2's D, which replaces the row
/// sum of dP * P when the probabilities of a row are spread over blocks).
pub fn delta(sh: &BlockShape, rows: usize, dout: &[f32], o: &[f32], out: &mut [f32]) {
    for bi in 0..sh.b {
        for i in 0..rows {
            for h in 0..sh.hq {
                let off = ((bi * rows + i) * sh.hq + h) * sh.dv;
                out[(bi * rows + i) * sh.hq + h] = dout[off..off + sh.dv]
                    .iter()
                    .zip(&o[off..off + sh.dv])
                    .map(|(a, b)| a * b)
                    .sum();
            }
        }
    }
}

/// Gradients of one K/V block: dQ (local rows) += , dK and dV (the block's rows) += , from
/// the final log-sum-exp [b, hq, rows] and `delta` [b, rows, hq] ([`delta`]).
/// `p_tile` and `dp_tile` are scratch of at least (q tile x k tile) each. Returns the unmasked
/// score elements.
pub fn backward_block(
    g: &GemmCounter,
    sh: &BlockShape,
    BlockQuery { q, side: qs }: BlockQuery<'_, [f32]>,
    (k, v, ks): (&[f32], &[f32], Side),
    BlockStats { dout, lse, delta }: BlockStats<'_, [f32]>,
    (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
    (p_tile, dp_tile): (&mut [f32], &mut [f32]),
) -> u64 {
    let sq = qs.rows();
    let scale = sh.scale();
    let mut work = 0u64;
    let mut z = Vec::new();
    for_each_pair(sh, qs, ks, |pr| {
        let (rn, cn, tv) = (pr.rn, pr.cn, pr.tv);
        gemm(g, scale, (q, pr.qv), (k, pr.kv.t()), 0.0, (p_tile, tv));
        for i in 0..rn {
            let (lo, hi) = pr.visible(i);
            work += (hi - lo) as u64;
            let l = lse[pr.stat0 + i];
            let row = &mut p_tile[i * cn..(i + 1) * cn];
            row[lo..hi].iter_mut().for_each(|x| *x = (*x - l).exp());
            row[..lo].fill(0.0);
            row[hi..].fill(0.0);
        }
        // dP = dO V^T (of the dropped probabilities)
        gemm(g, 1.0, (dout, pr.ov), (v, pr.vv.t()), 0.0, (dp_tile, tv));
        // With the mask Z (regenerated): dS = P * (Z dP - D), and P becomes P Z for dV.
        // D = rowsum(dO * O) is still rowsum(P * Z dP) since O = (P Z) V.
        z.resize(cn, 1.0);
        for i in 0..rn {
            let dl = delta[(pr.bi * sq + pr.r0 + i) * sh.hq + pr.h];
            let (p, dp) = (
                &mut p_tile[i * cn..(i + 1) * cn],
                &mut dp_tile[i * cn..(i + 1) * cn],
            );
            if let Some(dr) = &sh.dropout {
                dr.fill_row(pr.bi, pr.h, pr.qpos[pr.r0 + i], pr.k0, &mut z);
            }
            for ((x, pj), &zj) in dp.iter_mut().zip(p.iter_mut()).zip(&z) {
                *x = *pj * (zj * *x - dl);
                *pj *= zj;
            }
        }
        // dV += (P Z)^T dO
        gemm(g, 1.0, (p_tile, tv.t()), (dout, pr.ov), 1.0, (dv, pr.vv));
        // dQ += scale dS K; dK += scale dS^T Q
        gemm(g, scale, (dp_tile, tv), (k, pr.kv), 1.0, (dq, pr.qv));
        gemm(g, scale, (dp_tile, tv.t()), (q, pr.qv), 1.0, (dk, pr.kv));
    });
    work
}

impl FlashOps<Cpu> for CpuOps {
    fn flash_fwd_block(
        &self,
        sh: &BlockShape,
        q: BlockQuery<'_, Tensor>,
        kv: BlockKv<'_, Tensor>,
        run: BlockAcc<'_, Tensor>,
        tile: &mut Tensor,
    ) -> Result<u64, ExecError> {
        let mut st = Online {
            max: run.max.data_mut(),
            sum: run.sum.data_mut(),
        };
        let g = self.gemm_counter();
        let (qd, k, v) = (q.q.data(), src(&kv.k), src(&kv.v));
        let acc = run.acc.data_mut();
        let work = forward_block(
            g,
            sh,
            BlockQuery {
                q: qd,
                side: q.side,
            },
            (k, v, kv.side),
            acc,
            &mut st,
            tile.data_mut(),
        );
        store_all(run.acc);
        Ok(work)
    }

    fn flash_finish(
        &self,
        sh: &BlockShape,
        rows: usize,
        acc: &mut Tensor,
        max: &Tensor,
        sum: &Tensor,
        lse: &mut Tensor,
    ) -> Result<(), ExecError> {
        finish(
            sh,
            rows,
            acc.data_mut(),
            max.data(),
            sum.data(),
            lse.data_mut(),
        );
        store_all(acc);
        Ok(())
    }

    fn flash_delta(
        &self,
        sh: &BlockShape,
        rows: usize,
        dout: &Tensor,
        o: &Tensor,
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        delta(sh, rows, dout.data(), o.data(), out.data_mut());
        Ok(())
    }

    fn attn_sink_fwd(
        &self,
        sh: &BlockShape,
        rows: usize,
        o: &mut Tensor,
        lse: &mut Tensor,
        sinks: TensorView<'_, Tensor>,
    ) -> Result<(), ExecError> {
        sink_fwd(sh, rows, o.data_mut(), lse.data_mut(), src(&sinks));
        store_all(o);
        Ok(())
    }

    fn attn_sink_grad(
        &self,
        sh: &BlockShape,
        rows: usize,
        lse: &Tensor,
        delta: &Tensor,
        sinks: TensorView<'_, Tensor>,
        mut dsinks: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        let d = dst(&mut dsinks);
        sink_grad(sh, rows, lse.data(), delta.data(), src(&sinks), d);
        store_view(&mut dsinks);
        Ok(())
    }

    fn flash_bwd_block(
        &self,
        sh: &BlockShape,
        q: BlockQuery<'_, Tensor>,
        kv: BlockKv<'_, Tensor>,
        stats: BlockStats<'_, Tensor>,
        grads: BlockGrads<'_, Tensor>,
        (p_tile, dp_tile): (&mut Tensor, &mut Tensor),
    ) -> Result<u64, ExecError> {
        let BlockGrads { dq, mut dk, mut dv } = grads;
        let work = backward_block(
            self.gemm_counter(),
            sh,
            BlockQuery {
                q: q.q.data(),
                side: q.side,
            },
            (src(&kv.k), src(&kv.v), kv.side),
            BlockStats {
                dout: stats.dout.data(),
                lse: stats.lse.data(),
                delta: stats.delta.data(),
            },
            (dq.data_mut(), dst(&mut dk), dst(&mut dv)),
            (p_tile.data_mut(), dp_tile.data_mut()),
        );
        store_all(dq);
        let (rk, rv) = (dk.range.clone(), dv.range.clone());
        store(dk.tensor, rk);
        store(dv.tensor, rv);
        Ok(work)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::ops::attention::{attn_bwd, attn_fwd, AttnSaved};
    use crate::backend::cpu::CpuOps;
    use crate::backend::ops::{AttnShape, Keep, Qkv, QkvGrads};

    fn rand(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
            })
            .collect()
    }

    fn rel(a: &[f32], b: &[f32]) -> f32 {
        let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
        let den: f32 = b.iter().map(|y| y * y).sum();
        (num / den).sqrt()
    }

    /// Blocked (several K/V blocks in an arbitrary order, zigzag positions) against the
    /// reference kernel that materialises the whole softmax: forward output and all gradients.
    #[test]
    fn blocks_in_any_order_match_the_whole_softmax() {
        // Value heads as wide as query/key heads, and narrower (MLA).
        for dvw in [8, 6] {
            blocks_match_whole(dvw, None);
        }
    }

    /// With attention dropout (p = 0.2, heads shifted as on TP rank 1 and a later
    /// microbatch): the tiles regenerate the whole softmax's mask, forward and backward.
    #[test]
    fn blocks_with_attention_dropout_match_the_whole_softmax() {
        let dr = crate::rng::AttnDropout {
            seed: 7,
            step: 1,
            layer: 3,
            p: 0.2,
            head0: 4,
            sample0: 2,
            seq: 16,
        };
        blocks_match_whole(8, Some(dr));
    }

    /// Finite differences of L = sum(r * O) against the analytic dQ, dK, dV of the whole
    /// attention with its dropout mask (the mask fixed by its coordinates).
    #[test]
    fn attention_dropout_gradients_match_finite_differences() {
        let (b, s, hq, hk, d) = (1, 6, 2, 1, 4);
        let ash = AttnShape {
            b,
            s,
            heads: hq,
            kv_heads: hk,
            d,
            dv: d,
            dropout: Some(crate::rng::AttnDropout {
                seed: 11,
                step: 0,
                layer: 0,
                p: 0.3,
                head0: 0,
                sample0: 0,
                seq: s as u64,
            }),
            span: parsim_plan::plan::AttnSpan::Full,
        };
        let dev = CpuOps::new();
        let mut x = [
            rand(s * hq * d, 5),
            rand(s * hk * d, 6),
            rand(s * hk * d, 7),
        ];
        let r = rand(s * hq * d, 8);
        let fwd = |x: &[Vec<f32>; 3], o: &mut [f32]| {
            let dt = parsim_plan::DType::F32;
            attn_fwd(
                &dev,
                &ash,
                Qkv {
                    q: &x[0],
                    k: &x[1],
                    v: &x[2],
                },
                o,
                Keep::Lse,
                dt,
            )
        };
        let loss = |x: &[Vec<f32>; 3]| -> f64 {
            let mut o = vec![0.0; r.len()];
            fwd(x, &mut o);
            o.iter().zip(&r).map(|(a, b)| f64::from(a * b)).sum()
        };
        let mut o = vec![0.0; r.len()];
        let saved = fwd(&x, &mut o);
        let mut g = [
            vec![0.0; x[0].len()],
            vec![0.0; x[1].len()],
            vec![0.0; x[2].len()],
        ];
        let [g0, g1, g2] = &mut g;
        attn_bwd(
            &dev,
            &ash,
            Qkv {
                q: &x[0],
                k: &x[1],
                v: &x[2],
            },
            &saved,
            &r,
            QkvGrads {
                dq: g0,
                dk: g1,
                dv: g2,
            },
        );
        let eps = 1e-2f32;
        let mut worst = 0.0f64;
        for t in 0..3 {
            for i in 0..x[t].len() {
                let keep = x[t][i];
                x[t][i] = keep + eps;
                let up = loss(&x);
                x[t][i] = keep - eps;
                let down = loss(&x);
                x[t][i] = keep;
                let fd = (up - down) / (2.0 * f64::from(eps));
                worst = worst.max((fd - f64::from(g[t][i])).abs());
            }
        }
        assert!(worst < 2e-3, "worst |fd - analytic| = {worst}");
    }

    fn blocks_match_whole(dvw: usize, dropout: Option<crate::rng::AttnDropout>) {
        let (b, s, hq, hk, d) = (2, 16, 4, 2, 8);
        let sh = BlockShape {
            b,
            hq,
            hk,
            d,
            dv: dvw,
            dropout,
            span: parsim_plan::plan::AttnSpan::Full,
        };
        let q = rand(b * s * hq * d, 1);
        let k = rand(b * s * hk * d, 2);
        let v = rand(b * s * hk * dvw, 3);
        let dout = rand(b * s * hq * dvw, 4);
        let ash = AttnShape {
            b,
            s,
            heads: hq,
            kv_heads: hk,
            d,
            dv: dvw,
            dropout,
            span: parsim_plan::plan::AttnSpan::Full,
        };
        let mut o_ref = vec![0.0; dout.len()];
        let dev = CpuOps::new();
        let saved = attn_fwd(
            &dev,
            &ash,
            Qkv {
                q: &q,
                k: &k,
                v: &v,
            },
            &mut o_ref,
            Keep::Probs,
            parsim_plan::DType::F32,
        );
        let (mut dq_ref, mut dk_ref, mut dv_ref) =
            (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
        attn_bwd(
            &dev,
            &ash,
            Qkv {
                q: &q,
                k: &k,
                v: &v,
            },
            &saved,
            &dout,
            QkvGrads {
                dq: &mut dq_ref,
                dk: &mut dk_ref,
                dv: &mut dv_ref,
            },
        );
        drop(saved);
        let _ = AttnSaved::None;

        // K/V cut into 4 blocks of 4 positions, visited in the order 2, 0, 3, 1; queries whole.
        let pos: Vec<u32> = (0..s as u32).collect();
        let block = |x: &[f32], heads: usize, j: usize, d: usize| -> Vec<f32> {
            let mut out = Vec::new();
            for bi in 0..b {
                let lo = (bi * s + j * 4) * heads * d;
                out.extend_from_slice(&x[lo..lo + 4 * heads * d]);
            }
            out
        };
        let qs = Side { pos: &pos, tile: 5 };
        let mut acc = vec![0.0; dout.len()];
        let (mut mx, mut sm) = (vec![f32::NEG_INFINITY; b * hq * s], vec![0.0; b * hq * s]);
        let mut tile = vec![0.0; 5 * 4];
        let order = [2usize, 0, 3, 1];
        let mut work = 0;
        for &j in &order {
            let kp: Vec<u32> = (j as u32 * 4..j as u32 * 4 + 4).collect();
            let ks = Side { pos: &kp, tile: 4 };
            let mut st = Online {
                max: &mut mx,
                sum: &mut sm,
            };
            work += forward_block(
                &dev.gemm_counter().clone(),
                &sh,
                BlockQuery { q: &q, side: qs },
                (&block(&k, hk, j, d), &block(&v, hk, j, dvw), ks),
                &mut acc,
                &mut st,
                &mut tile,
            );
        }
        // Causal work: s(s+1)/2 per (sequence, head).
        assert_eq!(work as usize, b * hq * s * (s + 1) / 2);
        let mut lse = vec![0.0; b * hq * s];
        finish(&sh, s, &mut acc, &mx, &sm, &mut lse);
        assert!(rel(&acc, &o_ref) < 1e-5, "forward {}", rel(&acc, &o_ref));

        let mut dl = vec![0.0; b * hq * s];
        delta(&sh, s, &dout, &acc, &mut dl);
        let mut dq = vec![0.0; q.len()];
        let (mut dk, mut dv) = (vec![0.0; k.len()], vec![0.0; v.len()]);
        let (mut pt, mut dpt) = (vec![0.0; 20], vec![0.0; 20]);
        for &j in &order {
            let kp: Vec<u32> = (j as u32 * 4..j as u32 * 4 + 4).collect();
            let ks = Side { pos: &kp, tile: 4 };
            let (mut dkb, mut dvb) = (vec![0.0; b * 4 * hk * d], vec![0.0; b * 4 * hk * dvw]);
            backward_block(
                dev.gemm_counter(),
                &sh,
                BlockQuery { q: &q, side: qs },
                (&block(&k, hk, j, d), &block(&v, hk, j, dvw), ks),
                BlockStats {
                    dout: &dout,
                    lse: &lse,
                    delta: &dl,
                },
                (&mut dq, &mut dkb, &mut dvb),
                (&mut pt, &mut dpt),
            );
            for bi in 0..b {
                let lo = (bi * s + j * 4) * hk * d;
                let n = 4 * hk * d;
                dk[lo..lo + n].copy_from_slice(&dkb[bi * n..(bi + 1) * n]);
                let (lo, n) = ((bi * s + j * 4) * hk * dvw, 4 * hk * dvw);
                dv[lo..lo + n].copy_from_slice(&dvb[bi * n..(bi + 1) * n]);
            }
        }
        assert!(rel(&dq, &dq_ref) < 1e-5, "dq {}", rel(&dq, &dq_ref));
        assert!(rel(&dk, &dk_ref) < 1e-5, "dk {}", rel(&dk, &dk_ref));
        assert!(rel(&dv, &dv_ref) < 1e-5, "dv {}", rel(&dv, &dv_ref));
    }

    #[test]
    fn runs_cut_at_gaps_and_tiles() {
        let pos = [0u32, 1, 2, 7, 8, 9, 10];
        let s = Side { pos: &pos, tile: 3 };
        assert_eq!(s.runs(), vec![(0, 3), (3, 3), (6, 1)]);
    }
}
