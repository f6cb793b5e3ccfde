//! RMSNorm (Zhang and Sennrich 2019) and LayerNorm (Ba et al. 2016), forward and backward, over
//! rows of `h` features. The per-row statistics are recomputed in backward from the saved input
//! (the engine does not count them, as Korthikanti et al. 2022 do not).

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{dst, src, store_all, store_view, Tensor};
use crate::backend::ops::{NormOps, NormSpec};
use crate::backend::{View, ViewMut};
use crate::error::ExecError;
use parsim_plan::plan::Norm;

fn stats(kind: Norm, x: &[f32], eps: f32) -> (f32, f32) {
    let h = x.len() as f32;
    match kind {
        Norm::RmsNorm => {
            let ms: f32 = x.iter().map(|v| v * v).sum::<f32>() / h;
            (0.0, 1.0 / (ms + eps).sqrt())
        }
        Norm::LayerNorm => {
            let mean: f32 = x.iter().sum::<f32>() / h;
            let var: f32 = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / h;
            (mean, 1.0 / (var + eps).sqrt())
        }
    }
}

/// y = norm(x) * gamma (+ beta for LayerNorm). `params` is gamma then (LayerNorm) beta.
pub fn norm_fwd(kind: Norm, x: &[f32], params: &[f32], h: usize, eps: f32, y: &mut [f32]) {
    let gamma = &params[..h];
    for (xr, yr) in x.chunks_exact(h).zip(y.chunks_exact_mut(h)) {
        let (mean, rstd) = stats(kind, xr, eps);
        for j in 0..h {
            yr[j] = (xr[j] - mean) * rstd * gamma[j];
        }
        if kind == Norm::LayerNorm {
            for j in 0..h {
                yr[j] += params[h + j];
            }
        }
    }
}

/// dx = d norm(x) / dx . dy (written, not accumulated).
pub fn norm_dgrad(
    kind: Norm,
    x: &[f32],
    params: &[f32],
    dy: &[f32],
    h: usize,
    eps: f32,
    dx: &mut [f32],
) {
    dx.fill(0.0);
    norm_dgrad_acc(kind, x, params, dy, h, eps, dx)
}

/// dx += d norm(x) / dx . dy (the residual path's gradient already in `dx`).
pub fn norm_dgrad_acc(
    kind: Norm,
    x: &[f32],
    params: &[f32],
    dy: &[f32],
    h: usize,
    eps: f32,
    dx: &mut [f32],
) {
    let gamma = &params[..h];
    let hf = h as f32;
    for ((xr, dyr), dxr) in x
        .chunks_exact(h)
        .zip(dy.chunks_exact(h))
        .zip(dx.chunks_exact_mut(h))
    {
        let (mean, rstd) = stats(kind, xr, eps);
        // g = dy * gamma; xhat = (x - mean) * rstd
        let mut sum_g = 0.0f32;
        let mut sum_gx = 0.0f32;
        for j in 0..h {
            let g = dyr[j] * gamma[j];
            sum_g += g;
            sum_gx += g * (xr[j] - mean) * rstd;
        }
        for j in 0..h {
            let g = dyr[j] * gamma[j];
            let xhat = (xr[j] - mean) * rstd;
            dxr[j] += match kind {
                Norm::RmsNorm => rstd * (g - xhat * sum_gx / hf),
                Norm::LayerNorm => rstd * (g - sum_g / hf - xhat * sum_gx / hf),
            };
        }
    }
}

/// dgamma (and dbeta) += over rows of dy * xhat (and dy).
pub fn norm_wgrad(kind: Norm, x: &[f32], dy: &[f32], h: usize, eps: f32, dparams: &mut [f32]) {
    for (xr, dyr) in x.chunks_exact(h).zip(dy.chunks_exact(h)) {
        let (mean, rstd) = stats(kind, xr, eps);
        for j in 0..h {
            dparams[j] += dyr[j] * (xr[j] - mean) * rstd;
        }
        if kind == Norm::LayerNorm {
            for j in 0..h {
                dparams[h + j] += dyr[j];
            }
        }
    }
}

impl NormOps<Cpu> for CpuOps {
    fn norm_fwd(
        &self,
        spec: NormSpec,
        x: &Tensor,
        p: View<'_, Tensor>,
        y: &mut Tensor,
    ) -> Result<(), ExecError> {
        norm_fwd(
            spec.kind,
            x.data(),
            src(&p),
            x.cols(),
            spec.eps,
            y.data_mut(),
        );
        store_all(y);
        Ok(())
    }

    fn norm_dgrad(
        &self,
        spec: NormSpec,
        x: &Tensor,
        p: View<'_, Tensor>,
        dy: &Tensor,
        dx: &mut Tensor,
        acc: bool,
    ) -> Result<(), ExecError> {
        let (h, eps, kind) = (x.cols(), spec.eps, spec.kind);
        if acc {
            norm_dgrad_acc(kind, x.data(), src(&p), dy.data(), h, eps, dx.data_mut());
        } else {
            norm_dgrad(kind, x.data(), src(&p), dy.data(), h, eps, dx.data_mut());
        }
        store_all(dx);
        Ok(())
    }

    fn norm_wgrad(
        &self,
        spec: NormSpec,
        x: &Tensor,
        dy: &Tensor,
        mut dp: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        norm_wgrad(
            spec.kind,
            x.data(),
            dy.data(),
            x.cols(),
            spec.eps,
            dst(&mut dp),
        );
        store_view(&mut dp);
        Ok(())
    }
}
