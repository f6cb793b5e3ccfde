//! Matrix multiplication through `matrixmultiply`'s sgemm (packed, SIMD micro-kernels), with
//! transposes expressed as strides, counted in the rank's [`GemmCounter`]; the linear layers
//! on it, and [`LinearOps`] for the CPU.

use super::super::gemm_counter::GemmCounter;
use crate::backend::cpu::device::{Cpu, CpuOps};
use crate::backend::cpu::tensor::{dst, src, store_all, store_view, Tensor};
use crate::backend::ops::LinearOps;
use crate::backend::tensor::ViewMut;
use crate::error::ExecError;
use std::time::Instant;

/// A strided matrix view: element (i, j) at `offset + i * rs + j * cs`.
#[derive(Debug, Clone, Copy)]
pub struct View {
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
    pub offset: usize,
}

impl View {
    /// A row-major [rows, cols] matrix.
    pub fn rm(rows: usize, cols: usize) -> View {
        View {
            rows,
            cols,
            rs: cols,
            cs: 1,
            offset: 0,
        }
    }

    /// The transpose of this view (no copy).
    pub fn t(self) -> View {
        View {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            offset: self.offset,
        }
    }

    /// A row-major block of a wider matrix with row stride `ld`.
    pub fn block(rows: usize, cols: usize, ld: usize, offset: usize) -> View {
        View {
            rows,
            cols,
            rs: ld,
            cs: 1,
            offset,
        }
    }

    fn last(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            self.offset
        } else {
            self.offset + (self.rows - 1) * self.rs + (self.cols - 1) * self.cs
        }
    }
}

/// C = alpha * A . B + beta * C for strided views (each operand with its view; beta = 0
/// overwrites C, NaNs included), counted in `counter`.
pub fn gemm(
    counter: &GemmCounter,
    alpha: f32,
    (a, av): (&[f32], View),
    (b, bv): (&[f32], View),
    beta: f32,
    (c, cv): (&mut [f32], View),
) {
    assert_eq!(av.cols, bv.rows, "gemm inner dimensions");
    assert_eq!((av.rows, bv.cols), (cv.rows, cv.cols), "gemm output shape");
    if cv.rows == 0 || cv.cols == 0 {
        return;
    }
    assert!(
        av.last() < a.len().max(1) || av.cols == 0,
        "gemm: A out of bounds"
    );
    assert!(
        bv.last() < b.len().max(1) || av.cols == 0,
        "gemm: B out of bounds"
    );
    assert!(cv.last() < c.len(), "gemm: C out of bounds");
    if av.cols == 0 {
        for i in 0..cv.rows {
            for j in 0..cv.cols {
                let x = &mut c[cv.offset + i * cv.rs + j * cv.cs];
                *x = if beta == 0.0 { 0.0 } else { beta * *x };
            }
        }
        return;
    }
    let t0 = Instant::now();
    // SAFETY: every index the kernel touches lies within the views, whose last elements were
    // bounds-checked above; A and B are only read, C is borrowed mutably and does not alias them.
    unsafe {
        matrixmultiply::sgemm(
            av.rows,
            av.cols,
            bv.cols,
            alpha,
            a.as_ptr().add(av.offset),
            av.rs as isize,
            av.cs as isize,
            b.as_ptr().add(bv.offset),
            bv.rs as isize,
            bv.cs as isize,
            beta,
            c.as_mut_ptr().add(cv.offset),
            cv.rs as isize,
            cv.cs as isize,
        );
    }
    let dt = t0.elapsed().as_secs_f64();
    counter.add(2.0 * (av.rows * av.cols * bv.cols) as f64, dt);
}

/// Y[n, o] = X[n, i] . W[o, i]^T (a linear layer's forward).
pub fn linear_fwd(
    counter: &GemmCounter,
    x: &[f32],
    w: &[f32],
    (n, i, o): (usize, usize, usize),
    y: &mut [f32],
) {
    gemm(
        counter,
        1.0,
        (x, View::rm(n, i)),
        (w, View::rm(o, i).t()),
        0.0,
        (y, View::rm(n, o)),
    );
}

/// dX[n, i] (+)= dY[n, o] . W[o, i].
pub fn linear_dgrad(
    counter: &GemmCounter,
    dy: &[f32],
    w: &[f32],
    (n, i, o): (usize, usize, usize),
    dx: &mut [f32],
    acc: bool,
) {
    gemm(
        counter,
        1.0,
        (dy, View::rm(n, o)),
        (w, View::rm(o, i)),
        if acc { 1.0 } else { 0.0 },
        (dx, View::rm(n, i)),
    );
}

/// dW[o, i] += dY[n, o]^T . X[n, i].
pub fn linear_wgrad(
    counter: &GemmCounter,
    dy: &[f32],
    x: &[f32],
    (n, i, o): (usize, usize, usize),
    dw: &mut [f32],
) {
    gemm(
        counter,
        1.0,
        (dy, View::rm(n, o).t()),
        (x, View::rm(n, i)),
        1.0,
        (dw, View::rm(o, i)),
    );
}

impl LinearOps<Cpu> for CpuOps {
    fn linear_fwd(
        &self,
        x: &Tensor,
        w: crate::backend::View<'_, Tensor>,
        dims: (usize, usize, usize),
        y: &mut Tensor,
    ) -> Result<(), ExecError> {
        linear_fwd(self.gemm_counter(), x.data(), src(&w), dims, y.data_mut());
        store_all(y);
        Ok(())
    }

    fn linear_dgrad(
        &self,
        dy: &Tensor,
        w: crate::backend::View<'_, Tensor>,
        dims: (usize, usize, usize),
        dx: &mut Tensor,
        acc: bool,
    ) -> Result<(), ExecError> {
        let g = self.gemm_counter();
        linear_dgrad(g, dy.data(), src(&w), dims, dx.data_mut(), acc);
        store_all(dx);
        Ok(())
    }

    fn linear_wgrad(
        &self,
        dy: &Tensor,
        x: &Tensor,
        dims: (usize, usize, usize),
        mut dw: ViewMut<'_, Tensor>,
    ) -> Result<(), ExecError> {
        linear_wgrad(self.gemm_counter(), dy.data(), x.data(), dims, dst(&mut dw));
        store_view(&mut dw);
        Ok(())
    }
}
