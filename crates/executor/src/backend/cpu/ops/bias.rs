//! Linear-layer biases (Megatron's `--add-bias-linear`, `--add-qkv-bias`): the forward adds
//! the bias to every row of the output; the backward's bias gradient is the column sum of the
//! output gradient over the rows this rank holds.

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{dst, src, store_all, store_view, Tensor};
use crate::backend::ops::BiasOps;
use crate::backend::{View, ViewMut};
use crate::error::ExecError;

/// y[n, o] += b[o] for every row.
pub fn bias_add(y: &mut [f32], b: &[f32]) {
    if b.is_empty() {
        return;
    }
    for row in y.chunks_mut(b.len()) {
        row.iter_mut().zip(b).for_each(|(x, c)| *x += c);
    }
}

/// db[o] += sum over the rows of dy[n, o].
pub fn bias_grad(dy: &[f32], db: &mut [f32]) {
    if db.is_empty() {
        return;
    }
    for row in dy.chunks(db.len()) {
        db.iter_mut().zip(row).for_each(|(g, d)| *g += d);
    }
}

impl BiasOps<Cpu> for CpuOps {
    fn bias_add(&self, y: &mut Tensor, b: View<'_, Tensor>) -> Result<(), ExecError> {
        bias_add(y.data_mut(), src(&b));
        store_all(y);
        Ok(())
    }

    fn bias_grad(&self, dy: &Tensor, mut db: ViewMut<'_, Tensor>) -> Result<(), ExecError> {
        bias_grad(dy.data(), dst(&mut db));
        store_view(&mut db);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// L = sum(r * (x + b)) over a [3, 4] output: central finite differences of L in each b_j
    /// against the analytic gradient (the column sum of r), and the forward against the sum.
    #[test]
    fn bias_gradient_matches_finite_differences() {
        let x: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
        let r: Vec<f32> = (0..12).map(|i| (i as f32 * 0.91).cos()).collect();
        let mut b = vec![0.1f32, -0.2, 0.3, 0.05];
        let loss = |b: &[f32]| -> f64 {
            let mut y = x.clone();
            bias_add(&mut y, b);
            y.iter().zip(&r).map(|(a, c)| f64::from(a * c)).sum()
        };
        let mut db = vec![0.0; 4];
        bias_grad(&r, &mut db);
        for j in 0..4 {
            let eps = 1e-2;
            let keep = b[j];
            b[j] = keep + eps;
            let up = loss(&b);
            b[j] = keep - eps;
            let down = loss(&b);
            b[j] = keep;
            let fd = (up - down) / (2.0 * f64::from(eps));
            assert!(
                (fd - f64::from(db[j])).abs() < 1e-4,
                "b{j}: fd {fd} vs {}",
                db[j]
            );
        }
        let mut y = x.clone();
        bias_add(&mut y, &b);
        assert_eq!(y[5], x[5] + b[1]);
        // Accumulates: a second call doubles the gradient.
        bias_grad(&r, &mut db);
        assert!((db[2] - 2.0 * (r[2] + r[6] + r[10])).abs() < 1e-6);
    }
}
