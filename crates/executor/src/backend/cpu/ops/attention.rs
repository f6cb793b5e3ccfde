//! Causal grouped-query attention (Ainslie et al. 2023), forward and backward, one (batch,
//! head) at a time with [s, s] scratch. With `flash` it keeps only the per-row log-sum-exp
//! (Dao et al. 2022) and rebuilds the probabilities in backward; otherwise it keeps the softmax
//! (Korthikanti et al. 2022). Without either (selective recompute) backward recomputes the
//! softmax from Q and K.

use super::gemm::{gemm, View};
use crate::backend::bf16::round_bf16_slice;
use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::gemm_counter::GemmCounter;
use crate::backend::cpu::tensor::{store_all, Tensor};
use crate::backend::ops::{AttentionOps, AttnShape, Keep, Qkv, QkvGrads};
use crate::backend::DeviceTensor;
use crate::error::ExecError;
use crate::tracker::Category;
use parsim_plan::DType;

impl AttnShape {
    fn views(&self, bi: usize, hq: usize) -> (View, View) {
        self.views_of(bi, hq, self.d)
    }

    /// The value and output views (heads `dv` wide).
    fn v_views(&self, bi: usize, hq: usize) -> (View, View) {
        self.views_of(bi, hq, self.dv)
    }

    fn views_of(&self, bi: usize, hq: usize, d: usize) -> (View, View) {
        let s = self.s;
        let hk = hq / (self.heads / self.kv_heads);
        let q = View::block(s, d, self.heads * d, bi * s * self.heads * d + hq * d);
        let kv = View::block(s, d, self.kv_heads * d, bi * s * self.kv_heads * d + hk * d);
        (q, kv)
    }

    fn scale(&self) -> f32 {
        1.0 / (self.d as f32).sqrt()
    }

    /// The keys row `i` sees: `first..=i` (the causal mask and the span's).
    fn first_key(&self, i: usize) -> usize {
        self.span.first_key(i as u32) as usize
    }
}

/// What the CPU attention forward keeps for backward.
pub type AttnSaved = crate::backend::ops::AttnSaved<Tensor>;

/// Scores into `sc` and the row-wise softmax in place; returns nothing. Masked entries are 0.
fn scores(
    g: &GemmCounter,
    sh: &AttnShape,
    q: &[f32],
    k: &[f32],
    bi: usize,
    hq: usize,
    sc: &mut [f32],
) {
    let (qv, kv) = sh.views(bi, hq);
    let s = sh.s;
    gemm(
        g,
        sh.scale(),
        (q, qv),
        (k, kv.t()),
        0.0,
        (sc, View::rm(s, s)),
    );
}

fn softmax_rows(sh: &AttnShape, sc: &mut [f32], lse_out: Option<&mut [f32]>) {
    let s = sh.s;
    let mut lse_store = lse_out;
    for i in 0..s {
        let row = &mut sc[i * s..(i + 1) * s];
        let lo = sh.first_key(i);
        let max = row[lo..=i]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for x in row[lo..=i].iter_mut() {
            *x = (*x - max).exp();
            sum += *x;
        }
        for x in row[lo..=i].iter_mut() {
            *x /= sum;
        }
        row[..lo].fill(0.0);
        for x in row[i + 1..].iter_mut() {
            *x = 0.0;
        }
        if let Some(l) = lse_store.as_deref_mut() {
            l[i] = max + sum.ln();
        }
    }
}

/// `out` = `p` times the attention-dropout mask of (sequence `bi`, head `hq`) over the causal
/// [s, s] square (positions 0..s: the whole-sequence call).
fn masked(sh: &AttnShape, bi: usize, hq: usize, p: &[f32], out: &mut [f32]) {
    out.copy_from_slice(&p[..out.len()]);
    masked_in_place(sh, bi, hq, out);
}

fn masked_in_place(sh: &AttnShape, bi: usize, hq: usize, x: &mut [f32]) {
    let Some(dr) = &sh.dropout else { return };
    let s = sh.s;
    let mut z = vec![0.0; s];
    for i in 0..s {
        dr.fill_row(bi, hq, i as u32, 0, &mut z[..=i]);
        let row = &mut x[i * s..(i + 1) * s];
        row[..=i].iter_mut().zip(&z).for_each(|(v, m)| *v *= m);
    }
}

/// o = softmax(q k^T / sqrt(d), causal) v; returns what `keep` asks to save. The
/// probabilities are stored in `probs_dtype` (rounded before they multiply V, as a bf16 softmax
/// kernel's output would be).
pub fn attn_fwd(
    dev: &CpuOps,
    sh: &AttnShape,
    Qkv { q, k, v }: Qkv<'_, [f32]>,
    o: &mut [f32],
    keep: Keep,
    probs_dtype: DType,
) -> AttnSaved {
    let s = sh.s;
    let g = dev.gemm_counter();
    let mut probs = match keep {
        Keep::Probs => Some(Tensor::typed(
            dev.memory(),
            Category::Activations,
            probs_dtype,
            &[sh.b, sh.heads, s, s],
            vec![0.0; sh.b * sh.heads * s * s],
        )),
        _ => None,
    };
    let mut lse = match keep {
        Keep::Lse => Some(dev.zeros(Category::Activations, &[sh.b, sh.heads, s])),
        _ => None,
    };
    let mut scratch = dev.zeros(Category::Buffers, &[s, s]);
    let mut dropped = sh.dropout.map(|_| dev.zeros(Category::Buffers, &[s, s]));
    for bi in 0..sh.b {
        for hq in 0..sh.heads {
            let idx = bi * sh.heads + hq;
            let sc = match probs.as_mut() {
                Some(p) => &mut p.data_mut()[idx * s * s..(idx + 1) * s * s],
                None => scratch.data_mut(),
            };
            scores(g, sh, q, k, bi, hq, sc);
            softmax_rows(
                sh,
                sc,
                lse.as_mut()
                    .map(|l| &mut l.data_mut()[idx * s..(idx + 1) * s]),
            );
            if probs_dtype == DType::Bf16 {
                round_bf16_slice(sc);
            }
            let (ov, vv) = sh.v_views(bi, hq);
            match &mut dropped {
                // The kept probabilities stay undropped; the output sees P Z.
                Some(pz) => {
                    let pz = pz.data_mut();
                    masked(sh, bi, hq, sc, pz);
                    gemm(g, 1.0, (pz, View::rm(s, s)), (v, vv), 0.0, (o, ov));
                }
                None => gemm(g, 1.0, (sc, View::rm(s, s)), (v, vv), 0.0, (o, ov)),
            }
        }
    }
    match (probs, lse) {
        (Some(p), _) => AttnSaved::Probs(p),
        (_, Some(l)) => AttnSaved::Lse(l),
        _ => AttnSaved::None,
    }
}

/// dq (written), dk and dv (written) from do.
pub fn attn_bwd(
    dev: &CpuOps,
    sh: &AttnShape,
    Qkv { q, k, v }: Qkv<'_, [f32]>,
    saved: &AttnSaved,
    dout: &[f32],
    QkvGrads { dq, dk, dv }: QkvGrads<'_, [f32]>,
) {
    let s = sh.s;
    let g = dev.gemm_counter();
    dk.fill(0.0);
    dv.fill(0.0);
    let mut p_buf = dev.zeros(Category::Buffers, &[s, s]);
    let mut dp = dev.zeros(Category::Buffers, &[s, s]);
    let mut pz_buf = sh.dropout.map(|_| dev.zeros(Category::Buffers, &[s, s]));
    for bi in 0..sh.b {
        for hq in 0..sh.heads {
            let idx = bi * sh.heads + hq;
            let p: &[f32] = match saved {
                AttnSaved::Probs(t) => &t.data()[idx * s * s..(idx + 1) * s * s],
                AttnSaved::Lse(l) => {
                    let pb = p_buf.data_mut();
                    scores(g, sh, q, k, bi, hq, pb);
                    let lse = &l.data()[idx * s..(idx + 1) * s];
                    for i in 0..s {
                        let lo = sh.first_key(i);
                        for j in 0..s {
                            pb[i * s + j] = if j <= i && j >= lo {
                                (pb[i * s + j] - lse[i]).exp()
                            } else {
                                0.0
                            };
                        }
                    }
                    p_buf.data()
                }
                AttnSaved::None => {
                    let pb = p_buf.data_mut();
                    scores(g, sh, q, k, bi, hq, pb);
                    softmax_rows(sh, pb, None);
                    p_buf.data()
                }
            };
            let (qv, kv) = sh.views(bi, hq);
            let (ov, vv) = sh.v_views(bi, hq);
            let dpd = dp.data_mut();
            match &mut pz_buf {
                Some(pz) => {
                    // dV += (P Z)^T dO; dP = Z (dO V^T), the mask regenerated.
                    let pz = pz.data_mut();
                    masked(sh, bi, hq, p, pz);
                    gemm(g, 1.0, (pz, View::rm(s, s).t()), (dout, ov), 1.0, (dv, vv));
                    gemm(g, 1.0, (dout, ov), (v, vv.t()), 0.0, (dpd, View::rm(s, s)));
                    masked_in_place(sh, bi, hq, dpd);
                }
                None => {
                    // dV += P^T dO; dP = dO V^T
                    gemm(g, 1.0, (p, View::rm(s, s).t()), (dout, ov), 1.0, (dv, vv));
                    gemm(g, 1.0, (dout, ov), (v, vv.t()), 0.0, (dpd, View::rm(s, s)));
                }
            }
            // dS = P * (dP - rowsum(dP * P))
            for i in 0..s {
                let row = &mut dpd[i * s..(i + 1) * s];
                let prow = &p[i * s..(i + 1) * s];
                let lo = sh.first_key(i);
                let dot: f32 = row[lo..=i]
                    .iter()
                    .zip(&prow[lo..=i])
                    .map(|(a, b)| a * b)
                    .sum();
                for j in 0..s {
                    row[j] = if j <= i && j >= lo {
                        prow[j] * (row[j] - dot)
                    } else {
                        0.0
                    };
                }
            }
            // dQ = dS K * scale; dK += dS^T Q * scale
            gemm(g, sh.scale(), (dpd, View::rm(s, s)), (k, kv), 0.0, (dq, qv));
            gemm(
                g,
                sh.scale(),
                (dpd, View::rm(s, s).t()),
                (q, qv),
                1.0,
                (dk, kv),
            );
        }
    }
}

impl AttentionOps<Cpu> for CpuOps {
    fn attn_fwd(
        &self,
        sh: &AttnShape,
        x: Qkv<'_, Tensor>,
        o: &mut Tensor,
        keep: Keep,
    ) -> Result<AttnSaved, ExecError> {
        let host = Qkv {
            q: x.q.data(),
            k: x.k.data(),
            v: x.v.data(),
        };
        let saved = attn_fwd(self, sh, host, o.data_mut(), keep, x.q.dtype());
        store_all(o);
        Ok(saved)
    }

    fn attn_bwd(
        &self,
        sh: &AttnShape,
        x: Qkv<'_, Tensor>,
        saved: &AttnSaved,
        dout: &Tensor,
        g: QkvGrads<'_, Tensor>,
    ) -> Result<(), ExecError> {
        let host = Qkv {
            q: x.q.data(),
            k: x.k.data(),
            v: x.v.data(),
        };
        let host_grads = QkvGrads {
            dq: g.dq.data_mut(),
            dk: g.dk.data_mut(),
            dv: g.dv.data_mut(),
        };
        attn_bwd(self, sh, host, saved, dout.data(), host_grads);
        for t in [g.dq, g.dk, g.dv] {
            store_all(t);
        }
        Ok(())
    }
}
