//! Vocab-parallel cross-entropy (Megatron-LM) in pieces, so that the three small reductions
//! over TP (row maximum, sum of exponentials, target logit) run between them: each rank holds
//! the logits of its vocabulary columns `lo..lo + v`.

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{store_all, Tensor};
use crate::backend::ops::CrossEntropyOps;
use crate::error::ExecError;

/// max[r] = the maximum of row r of `logits` [n, v].
pub fn row_max(logits: &[f32], v: usize, max: &mut [f32]) {
    for (m, row) in max.iter_mut().zip(logits.chunks_exact(v)) {
        *m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    }
}

/// probs = exp(logits - max) row-wise, and sum[r] its row sums.
pub fn exp_rows(logits: &[f32], v: usize, max: &[f32], probs: &mut [f32], sum: &mut [f32]) {
    for (r, (src, dst)) in logits
        .chunks_exact(v)
        .zip(probs.chunks_exact_mut(v))
        .enumerate()
    {
        let mut s = 0.0;
        for (o, &z) in dst.iter_mut().zip(src) {
            *o = (z - max[r]).exp();
            s += *o;
        }
        sum[r] = s;
    }
}

/// out[r] = logits[r, targets[r] - lo] where the target is a column of this shard, else 0.
pub fn target_logit(logits: &[f32], v: usize, targets: &[u32], lo: usize, out: &mut [f32]) {
    for (r, (&t, o)) in targets.iter().zip(out.iter_mut()).enumerate() {
        let t = t as usize;
        *o = if t >= lo && t < lo + v {
            logits[r * v + t - lo]
        } else {
            0.0
        };
    }
}

/// Normalises `probs` by the global row sums; returns the sum over rows of the token losses
/// log(sum) + max - target logit.
pub fn loss(probs: &mut [f32], v: usize, sum: &[f32], max: &[f32], target_logit: &[f32]) -> f64 {
    let mut loss = 0.0f64;
    for (r, row) in probs.chunks_exact_mut(v).enumerate() {
        for o in row.iter_mut() {
            *o /= sum[r];
        }
        loss += (sum[r].ln() + max[r] - target_logit[r]) as f64;
    }
    loss
}

/// In place: probs becomes scale * (probs - onehot(target)) (the logits' gradient).
pub fn grad(probs: &mut [f32], v: usize, targets: &[u32], lo: usize, scale: f32) {
    for (r, &t) in targets.iter().enumerate() {
        let t = t as usize;
        if t >= lo && t < lo + v {
            probs[r * v + t - lo] -= 1.0;
        }
    }
    probs.iter_mut().for_each(|x| *x *= scale);
}

impl CrossEntropyOps<Cpu> for CpuOps {
    fn ce_row_max(&self, logits: &Tensor, max: &mut Tensor) -> Result<(), ExecError> {
        row_max(logits.data(), logits.cols(), max.data_mut());
        Ok(())
    }

    fn ce_exp(
        &self,
        logits: &Tensor,
        max: &Tensor,
        probs: &mut Tensor,
        sum: &mut Tensor,
    ) -> Result<(), ExecError> {
        let v = logits.cols();
        exp_rows(
            logits.data(),
            v,
            max.data(),
            probs.data_mut(),
            sum.data_mut(),
        );
        Ok(())
    }

    fn ce_target_logit(
        &self,
        logits: &Tensor,
        targets: &[u32],
        lo: usize,
        out: &mut Tensor,
    ) -> Result<(), ExecError> {
        let v = logits.cols();
        target_logit(logits.data(), v, targets, lo, out.data_mut());
        Ok(())
    }

    fn ce_loss(
        &self,
        probs: &mut Tensor,
        sum: &Tensor,
        max: &Tensor,
        target_logit: &Tensor,
    ) -> Result<f64, ExecError> {
        let v = probs.cols();
        let (s, m, t) = (sum.data(), max.data(), target_logit.data());
        Ok(loss(probs.data_mut(), v, s, m, t))
    }

    fn ce_grad(
        &self,
        probs: &mut Tensor,
        targets: &[u32],
        lo: usize,
        scale: f32,
    ) -> Result<(), ExecError> {
        let v = probs.cols();
        grad(probs.data_mut(), v, targets, lo, scale);
        store_all(probs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_gives_the_textbook_loss_and_gradient() {
        // Two rows over a vocabulary of 3, targets 2 and 0.
        let logits = [1.0f32, 2.0, 3.0, 0.5, 0.5, -1.0];
        let (mut max, mut sum, mut tl) = ([0.0; 2], [0.0; 2], [0.0; 2]);
        let mut probs = [0.0; 6];
        row_max(&logits, 3, &mut max);
        exp_rows(&logits, 3, &max, &mut probs, &mut sum);
        target_logit(&logits, 3, &[2, 0], 0, &mut tl);
        let l = loss(&mut probs, 3, &sum, &max, &tl);
        let lse = |r: &[f32]| r.iter().map(|x| (*x as f64).exp()).sum::<f64>().ln();
        let want = (lse(&logits[..3]) - 3.0) + (lse(&logits[3..]) - 0.5);
        assert!((l - want).abs() < 1e-6, "{l} vs {want}");
        grad(&mut probs, 3, &[2, 0], 0, 0.5);
        // Each row of the gradient sums to zero.
        assert!((probs[..3].iter().sum::<f32>()).abs() < 1e-6);
        assert!(probs[2] < 0.0 && probs[3] < 0.0);
    }
}
