//! Element-wise kernels: the residual add and axpy; and [`ElementwiseOps`] for the CPU (add,
//! axpy, copy with the dtype's rounding, fill).

use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{dst, src, store_all, store_view, Tensor};
use crate::backend::ops::ElementwiseOps;
use crate::backend::{check_copy, View, ViewMut};
use crate::error::ExecError;

/// out = a + b.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

/// y += alpha * x.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    if alpha == 1.0 {
        y.iter_mut().zip(x).for_each(|(d, s)| *d += s);
    } else {
        y.iter_mut().zip(x).for_each(|(d, s)| *d += alpha * s);
    }
}

impl ElementwiseOps<Cpu> for CpuOps {
    fn add(&self, a: &Tensor, b: &Tensor, out: &mut Tensor) -> Result<(), ExecError> {
        add(a.data(), b.data(), out.data_mut());
        store_all(out);
        Ok(())
    }

    fn axpy(
        &self,
        alpha: f32,
        x: View<'_, Tensor>,
        mut y: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        axpy(alpha, src(&x), dst(&mut y));
        store_view(&mut y);
        Ok(())
    }

    fn copy(&self, s: View<'_, Tensor>, mut d: ViewMut<'_, Tensor>) -> Result<(), ExecError> {
        check_copy(s.len(), d.len())?;
        dst(&mut d).copy_from_slice(src(&s));
        store_view(&mut d);
        Ok(())
    }

    fn fill(&self, t: &mut Tensor, value: f32) -> Result<(), ExecError> {
        t.data_mut().fill(value);
        store_all(t);
        Ok(())
    }
}
