//! Inverted dropout in place from the counter-based mask of [`crate::rng`]. The mask is a
//! function of the element's coordinates, so it could be redrawn; the model keeps it instead
//! ([`dropout_save`], one byte per element, then [`dropout_apply`] in backward), as Megatron
//! does, so that the memory held is Megatron's.

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{dst, store_view, Tensor};
use crate::backend::ops::DropoutOps;
use crate::backend::ViewMut;
use crate::error::ExecError;
use crate::rng::{DropoutError, DropoutKey};
use crate::tracker::Category;
use parsim_plan::DType;

/// Checks the key and that `elements` split into one row per token (shared with the CUDA
/// kernel's launch, so both backends refuse the same inputs with the same error).
pub fn check(key: &DropoutKey, tokens: &[u64], elements: usize) -> Result<(), DropoutError> {
    key.validate()?;
    if tokens.is_empty() || elements % tokens.len() != 0 {
        return Err(DropoutError::Rows {
            elements,
            rows: tokens.len(),
        });
    }
    Ok(())
}

/// x[i, j] *= mask(tokens[i], col_offset + j) for the rows of `x` (one per token).
pub fn dropout_inplace(
    key: &DropoutKey,
    tokens: &[u64],
    col_offset: u64,
    x: &mut [f32],
) -> Result<(), DropoutError> {
    check(key, tokens, x.len())?;
    if key.p == 0.0 {
        return Ok(());
    }
    let mut mask = vec![0.0; x.len()];
    key.fill_mask(tokens, col_offset, &mut mask);
    x.iter_mut().zip(&mask).for_each(|(v, m)| *v *= m);
    Ok(())
}

/// [`dropout_inplace`] that also writes the keep flags (1 kept, 0 dropped) into `keep`.
pub fn dropout_save(
    key: &DropoutKey,
    tokens: &[u64],
    col_offset: u64,
    x: &mut [f32],
    keep: &mut [f32],
) -> Result<(), DropoutError> {
    dropout_inplace(key, tokens, col_offset, x)?;
    key.fill_mask(tokens, col_offset, keep);
    keep.iter_mut()
        .for_each(|m| *m = if *m != 0.0 { 1.0 } else { 0.0 });
    Ok(())
}

/// x *= keep x scale.
pub fn dropout_apply(keep: &[f32], scale: f32, x: &mut [f32]) {
    x.iter_mut().zip(keep).for_each(|(v, k)| *v *= k * scale);
}

impl DropoutOps<Cpu> for CpuOps {
    fn dropout_inplace(
        &self,
        key: &DropoutKey,
        tokens: &[u64],
        col_offset: u64,
        mut x: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        dropout_inplace(key, tokens, col_offset, dst(&mut x))?;
        store_view(&mut x);
        Ok(())
    }

    fn dropout_save(
        &self,
        key: &DropoutKey,
        tokens: &[u64],
        col_offset: u64,
        mut x: ViewMut<'_, Tensor>,
    ) -> Result<Tensor, ExecError> {
        let n = x.range.len();
        let mut keep = vec![0.0; n];
        dropout_save(key, tokens, col_offset, dst(&mut x), &mut keep)?;
        store_view(&mut x);
        let cat = Category::Activations;
        Ok(Tensor::typed(self.memory(), cat, DType::U8, &[n], keep))
    }

    fn dropout_apply(
        &self,
        mask: &Tensor,
        scale: f32,
        mut x: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        dropout_apply(mask.data(), scale, dst(&mut x));
        store_view(&mut x);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::DropoutSite;

    fn key() -> DropoutKey {
        DropoutKey {
            seed: 7,
            step: 1,
            layer: 3,
            site: DropoutSite::Attention,
            p: 0.1,
        }
    }

    /// Finite differences of f(x) = sum_i w_i dropout(x)_i against the backward (dropout of w):
    /// central differences in f64 of an f32 op, step 1e-2 (f is linear, so the only error is
    /// rounding).
    #[test]
    fn backward_matches_finite_differences() {
        let tokens = [5u64, 9, 2];
        let cols = 8;
        let n = tokens.len() * cols;
        let x: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.1).collect();
        let w: Vec<f32> = (0..n).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.3).collect();
        let f = |x: &[f32]| -> f64 {
            let mut y = x.to_vec();
            dropout_inplace(&key(), &tokens, 4, &mut y).unwrap();
            y.iter()
                .zip(&w)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum()
        };
        let mut grad = w.clone();
        dropout_inplace(&key(), &tokens, 4, &mut grad).unwrap();
        let eps = 1e-2f32;
        let mut zeros = 0;
        for i in 0..n {
            let (mut xp, mut xm) = (x.clone(), x.clone());
            xp[i] += eps;
            xm[i] -= eps;
            let fd = (f(&xp) - f(&xm)) / (2.0 * f64::from(eps));
            let tol = 1e-4 * (1.0 + fd.abs());
            assert!(
                (fd - f64::from(grad[i])).abs() < tol,
                "{i}: {fd} vs {}",
                grad[i]
            );
            zeros += usize::from(grad[i] == 0.0 && w[i] != 0.0);
        }
        // Some element is dropped, or the check would not exercise the mask.
        assert!(zeros > 0);
    }

    #[test]
    fn bad_rows_and_probability_are_refused() {
        let mut x = vec![1.0; 10];
        assert_eq!(
            dropout_inplace(&key(), &[1, 2, 3], 0, &mut x),
            Err(DropoutError::Rows {
                elements: 10,
                rows: 3
            })
        );
        let bad = DropoutKey { p: 1.5, ..key() };
        assert!(dropout_inplace(&bad, &[1, 2], 0, &mut x).is_err());
    }

    /// The saved mask applied to a gradient equals redrawing the mask on it (the backward of
    /// the in-place dropout), and the keep flags are 0 or 1.
    #[test]
    fn a_saved_mask_applies_as_the_redrawn_one() {
        let k = DropoutKey { p: 0.5, ..key() };
        let tokens = [3u64, 9, 4];
        let mut x: Vec<f32> = (0..3 * 10).map(|i| i as f32 * 0.1 - 1.0).collect();
        let mut keep = vec![0.0; x.len()];
        dropout_save(&k, &tokens, 2, &mut x, &mut keep).expect("saves");
        assert!(keep.iter().all(|&m| m == 0.0 || m == 1.0));
        assert!(keep.contains(&0.0) && keep.contains(&1.0));
        let dy: Vec<f32> = (0..30).map(|i| (i as f32).sin()).collect();
        let mut a = dy.clone();
        dropout_apply(&keep, k.keep_scale(), &mut a);
        let mut b = dy;
        dropout_inplace(&k, &tokens, 2, &mut b).expect("redraws");
        assert_eq!(a, b);
    }
}
