//! What the GPU kernel tests share (kernels_gpu/, kernels_gpu_flash/): the GPU or why the
//! test skips, random inputs, NaN-poisoned outputs, and the relative-error check.
#![allow(dead_code)]

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use parsim_executor::backend::cuda::compile::kernels::Kernels;
use parsim_executor::backend::cuda::diag::gpu_test::skip_gpu_test;
use parsim_executor::backend::cuda::probe::{self, Library};
use std::sync::Arc;

/// The first GPU's default stream and the compiled kernels.
pub struct Gpu {
    pub s: Arc<CudaStream>,
    pub k: Kernels,
}

/// The GPU, or None after printing why the test skips (no driver, NVRTC or GPU); under
/// `PARSIM_REQUIRE_GPU=1` the skip fails the test instead.
pub fn gpu() -> Option<Gpu> {
    for lib in [Library::Driver, Library::Nvrtc] {
        if let Err(e) = probe::require(lib) {
            skip_gpu_test(&e);
            return None;
        }
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => {}
        other => {
            skip_gpu_test(&format!("no GPU ({other:?})"));
            return None;
        }
    }
    let ctx = CudaContext::new(0).expect("context on GPU 0");
    let k = Kernels::load(&ctx).expect("kernels compile and load");
    Some(Gpu {
        s: ctx.default_stream(),
        k,
    })
}

/// Uniform in [-1, 1) from an LCG (a different stream per seed).
pub fn rand(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

impl Gpu {
    pub fn up<T: cudarc::driver::DeviceRepr>(&self, x: &[T]) -> CudaSlice<T> {
        self.s.clone_htod(x).unwrap()
    }
    /// A buffer of `n` NaNs: an output the kernel must overwrite.
    pub fn poisoned(&self, n: usize) -> CudaSlice<f32> {
        self.up(&vec![f32::NAN; n])
    }
    pub fn down(&self, x: &CudaSlice<f32>) -> Vec<f32> {
        self.s.synchronize().unwrap();
        self.s.clone_dtoh(x).unwrap()
    }
    /// The device address of `x`.
    pub fn p<T>(&self, x: &CudaSlice<T>) -> u64 {
        x.device_ptr(&self.s).0
    }
}

/// [`Gpu::p`] as a function.
pub fn p<T>(g: &Gpu, x: &CudaSlice<T>) -> u64 {
    g.p(x)
}

/// max |got - want| / max |want|.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff.is_finite(), "non-finite output");
    diff / scale
}

/// Prints and asserts the relative error of `got` against `want` below `tol`.
pub fn check(name: &str, got: &[f32], want: &[f32], tol: f32) {
    // rel_err's max skips NaN: a NaN left in a poisoned output must fail here.
    assert!(
        got.iter().chain(want).all(|x| x.is_finite()),
        "{name}: non-finite value"
    );
    let e = rel_err(got, want);
    eprintln!("{name}: relative error {e:.2e}");
    assert!(e < tol, "{name}: relative error {e} >= {tol}");
}
