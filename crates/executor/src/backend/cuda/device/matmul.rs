//! The linear layers' matrix multiplications on cuBLASLt: bf16 (or fp32) inputs, fp32
//! accumulation and scale (`CUBLAS_COMPUTE_32F`), the CPU backend's `linear_fwd`, `_dgrad`
//! and `_wgrad` semantics. cuBLASLt is column-major: a row-major [r, c] matrix is its
//! column-major transpose [c, r] with leading dimension c, so each row-major product is
//! computed as the transposed product ([`GemmDesc::of`]), which the host tests check against
//! the row-major definitions.

use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::diag::probe::Library;
use cudarc::cublaslt::{result as lt, sys};
use parsim_plan::DType;
use std::ffi::c_void;

/// Which linear-layer product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearOp {
    /// y[n, o] = x[n, i] . w[o, i]^T.
    Fwd,
    /// dx[n, i] (+)= dy[n, o] . w[o, i].
    Dgrad,
    /// dw[o, i] += dy[n, o]^T . x[n, i].
    Wgrad,
}

/// One column-major GEMM D = alpha op(A) op(B) + beta C (C = D), as cuBLASLt takes it: A is
/// `a_rows` x `a_cols` stored with leading dimension `lda` (before `trans_a`), and so on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmDesc {
    pub trans_a: bool,
    pub trans_b: bool,
    /// Rows of op(A) and of D.
    pub m: usize,
    /// Columns of op(B) and of D.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    pub lda: usize,
    pub ldb: usize,
    pub ldc: usize,
}

impl GemmDesc {
    /// The column-major GEMM of `op` on row-major operands of `dims` = (n, i, o); A is the
    /// first operand passed to cuBLASLt, B the second (see [`operands`]).
    pub fn of(op: LinearOp, (n, i, o): (usize, usize, usize)) -> GemmDesc {
        match op {
            // Y^T [o, n] = W [o, i] . X^T [i, n]: A = W (stored as W^T, col-major [i, o]).
            LinearOp::Fwd => GemmDesc {
                trans_a: true,
                trans_b: false,
                m: o,
                n,
                k: i,
                lda: i,
                ldb: i,
                ldc: o,
            },
            // dX^T [i, n] = W^T [i, o] . dY^T [o, n]: A = W, B = dY.
            LinearOp::Dgrad => GemmDesc {
                trans_a: false,
                trans_b: false,
                m: i,
                n,
                k: o,
                lda: i,
                ldb: o,
                ldc: i,
            },
            // dW^T [i, o] = X^T [i, n] . dY [n, o]: A = X, B = dY (stored as dY^T [o, n]).
            LinearOp::Wgrad => GemmDesc {
                trans_a: false,
                trans_b: true,
                m: i,
                n: o,
                k: n,
                lda: i,
                ldb: o,
                ldc: i,
            },
        }
    }

    /// Rows and columns of the stored A (before the transpose).
    pub fn a_stored(&self) -> (usize, usize) {
        if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        }
    }

    /// Rows and columns of the stored B.
    pub fn b_stored(&self) -> (usize, usize) {
        if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        }
    }

    /// 2 m n k.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// The device operands of one of a linear layer's products: the input `x`, the weight `w` and
/// the output gradient `dy` (each product reads two of them; the third may be 0), of `dtype`.
#[derive(Debug, Clone, Copy)]
pub struct LinearInputs {
    pub x: u64,
    pub w: u64,
    pub dy: u64,
    pub dtype: DType,
}

/// Which of the op's tensors is cuBLASLt's A and which its B: (x, w, dy) -> (A, B).
pub fn operands<T>(op: LinearOp, x: T, w: T, dy: T) -> (T, T) {
    match op {
        LinearOp::Fwd => (w, x),
        LinearOp::Dgrad => (w, dy),
        LinearOp::Wgrad => (x, dy),
    }
}

/// cuBLASLt's data type for a tensor dtype.
pub fn data_type(d: DType) -> sys::cudaDataType {
    match d {
        DType::F32 => sys::cudaDataType::CUDA_R_32F,
        DType::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        DType::U8 => sys::cudaDataType::CUDA_R_8U,
    }
}

/// Device addresses and dtypes of one GEMM.
#[derive(Debug, Clone, Copy)]
pub struct GemmArgs {
    pub a: u64,
    pub a_dtype: DType,
    pub b: u64,
    pub b_dtype: DType,
    /// D (and C, read when `beta` is 1).
    pub d: u64,
    pub d_dtype: DType,
    pub beta: f32,
}

/// Bytes of cuBLASLt workspace each rank keeps (the 32 MiB that PyTorch gives Hopper).
pub const WORKSPACE_BYTES: u64 = 32 << 20;

fn lt_err(call: &'static str) -> impl Fn(cudarc::cublaslt::result::CublasError) -> CudaError {
    move |e| CudaError::call(Library::CublasLt, call, format!("{e:?}"))
}

/// A cuBLASLt handle and its workspace, on one rank's compute stream.
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: u64,
}

// SAFETY: the handle is used by one rank's thread at a time (the `Device` is not shared).
unsafe impl Send for Lt {}

impl Lt {
    /// A handle (cuBLASLt must be loadable: [`crate::backend::cuda::diag::probe::require`] first)
    /// using the `workspace` device buffer of [`WORKSPACE_BYTES`].
    pub fn new(workspace: u64) -> Result<Lt, CudaError> {
        crate::backend::cuda::diag::probe::require(Library::CublasLt)?;
        let handle = lt::create_handle().map_err(lt_err("cublasLtCreate"))?;
        Ok(Lt { handle, workspace })
    }

    /// D = op(A) op(B) + beta D on `stream`, fp32 accumulation.
    pub fn gemm(
        &self,
        g: &GemmDesc,
        args: &GemmArgs,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<(), CudaError> {
        if g.m == 0 || g.n == 0 {
            return Ok(());
        }
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(lt_err("cublasLtMatmulDescCreate"))?;
        let mut guard = Guard {
            desc,
            layouts: [std::ptr::null_mut(); 3],
            pref: std::ptr::null_mut(),
        };
        for (attr, t) in [
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                g.trans_a,
            ),
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                g.trans_b,
            ),
        ] {
            let v = t as i32;
            // SAFETY: the attribute is an i32 (cublasOperation_t) read during the call.
            unsafe {
                lt::set_matmul_desc_attribute(desc, attr, (&v as *const i32).cast::<c_void>(), 4)
            }
            .map_err(lt_err("cublasLtMatmulDescSetAttribute"))?;
        }
        let (ar, ac) = g.a_stored();
        let (br, bc) = g.b_stored();
        let mk = |d: DType, r: usize, c: usize, ld: usize| {
            lt::create_matrix_layout(data_type(d), r as u64, c as u64, ld as i64)
                .map_err(lt_err("cublasLtMatrixLayoutCreate"))
        };
        guard.layouts[0] = mk(args.a_dtype, ar, ac, g.lda)?;
        guard.layouts[1] = mk(args.b_dtype, br, bc, g.ldb)?;
        guard.layouts[2] = mk(args.d_dtype, g.m, g.n, g.ldc)?;
        guard.pref = lt::create_matmul_pref().map_err(lt_err("cublasLtMatmulPreferenceCreate"))?;
        let ws = WORKSPACE_BYTES as usize;
        // SAFETY: the attribute is a usize read during the call.
        unsafe {
            lt::set_matmul_pref_attribute(
                guard.pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const usize).cast::<c_void>(),
                std::mem::size_of::<usize>(),
            )
        }
        .map_err(lt_err("cublasLtMatmulPreferenceSetAttribute"))?;
        let [la, lb, ld] = guard.layouts;
        // SAFETY: every handle was created above and lives until `guard` drops.
        let heur =
            unsafe { lt::get_matmul_algo_heuristic(self.handle, desc, la, lb, ld, ld, guard.pref) }
                .map_err(lt_err("cublasLtMatmulAlgoGetHeuristic"))?;
        let (alpha, beta) = (1.0f32, args.beta);
        // SAFETY: the addresses are live device buffers of the sizes the layouts describe
        // (the caller's tensors), the scalars are host f32 (scale type 32F), and the
        // workspace holds WORKSPACE_BYTES.
        unsafe {
            lt::matmul(
                self.handle,
                desc,
                (&alpha as *const f32).cast::<c_void>(),
                (&beta as *const f32).cast::<c_void>(),
                args.a as *const c_void,
                la,
                args.b as *const c_void,
                lb,
                args.d as *const c_void,
                ld,
                args.d as *mut c_void,
                ld,
                &heur.algo,
                self.workspace as *mut c_void,
                ws,
                stream.cast(),
            )
        }
        .map_err(lt_err("cublasLtMatmul"))
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; a failure at teardown has no one to tell.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// Destroys the descriptors of one GEMM on every path out of [`Lt::gemm`].
struct Guard {
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    pref: sys::cublasLtMatmulPreference_t,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: each handle is null or was created by the matching create call.
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            if !self.pref.is_null() {
                let _ = lt::destroy_matmul_pref(self.pref);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The column-major GEMM as cuBLAS defines it, on host slices (a second method).
    fn colmajor(g: &GemmDesc, a: &[f32], b: &[f32], d: &mut [f32], beta: f32) {
        let at = |r: usize, c: usize| {
            if g.trans_a {
                a[c + r * g.lda]
            } else {
                a[r + c * g.lda]
            }
        };
        let bt = |r: usize, c: usize| {
            if g.trans_b {
                b[c + r * g.ldb]
            } else {
                b[r + c * g.ldb]
            }
        };
        for col in 0..g.n {
            for row in 0..g.m {
                let s: f32 = (0..g.k).map(|p| at(row, p) * bt(p, col)).sum();
                let x = &mut d[row + col * g.ldc];
                *x = s + beta * *x;
            }
        }
    }

    fn rand(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }

    #[test]
    fn column_major_descs_compute_the_row_major_linear_products() {
        let (n, i, o) = (5, 3, 4);
        let x = rand(n * i, 1);
        let w = rand(o * i, 2);
        let dy = rand(n * o, 3);
        // The row-major definitions of the CPU backend's linear_fwd, _dgrad and _wgrad.
        let mut y = vec![0.0; n * o];
        let mut dx = rand(n * i, 4);
        let dx0 = dx.clone();
        let mut dw = rand(o * i, 5);
        let dw0 = dw.clone();
        for r in 0..n {
            for c in 0..o {
                y[r * o + c] = (0..i).map(|p| x[r * i + p] * w[c * i + p]).sum();
            }
            for c in 0..i {
                dx[r * i + c] += (0..o).map(|p| dy[r * o + p] * w[p * i + c]).sum::<f32>();
            }
        }
        for r in 0..o {
            for c in 0..i {
                dw[r * i + c] += (0..n).map(|p| dy[p * o + r] * x[p * i + c]).sum::<f32>();
            }
        }
        let run = |op, beta: f32, d0: Vec<f32>| {
            let g = GemmDesc::of(op, (n, i, o));
            let (a, b) = operands(op, &x, &w, &dy);
            assert_eq!(a.len(), g.a_stored().0 * g.a_stored().1);
            assert_eq!(b.len(), g.b_stored().0 * g.b_stored().1);
            let mut d = d0;
            colmajor(&g, a, b, &mut d, beta);
            d
        };
        close(&run(LinearOp::Fwd, 0.0, vec![7.0; n * o]), &y);
        close(&run(LinearOp::Dgrad, 1.0, dx0), &dx);
        close(&run(LinearOp::Wgrad, 1.0, dw0), &dw);
        assert_eq!(
            GemmDesc::of(LinearOp::Fwd, (n, i, o)).flops(),
            (2 * n * i * o) as f64
        );
    }

    #[test]
    fn bf16_and_fp32_map_to_cublas_types() {
        assert_eq!(data_type(DType::Bf16), sys::cudaDataType::CUDA_R_16BF);
        assert_eq!(data_type(DType::F32), sys::cudaDataType::CUDA_R_32F);
    }
}
