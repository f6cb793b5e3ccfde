//! Every CUDA kernel compiles with NVRTC, no GPU needed; its own binary, as it needs the `cuda` feature.
//!
//! Every backend/cuda/ops/*/*.cu file compiles with NVRTC for sm_80 and sm_90 with register spills as
//! errors, and ptxas reports every kernel the source declares. Needs NVRTC (no GPU): skips
//! with the reason where it is absent (fails under `PARSIM_REQUIRE_GPU=1`).

use parsim_executor::backend::cuda::compile::kernels::{compile_file, FILES};
use parsim_executor::backend::cuda::probe::{self, Library};

#[test]
fn every_kernel_compiles_for_sm80_and_sm90_without_spills() {
    if let Err(e) = probe::require(Library::Nvrtc) {
        parsim_executor::backend::cuda::diag::gpu_test::skip_gpu_test(&e);
        return;
    }
    // A fresh cache folder, so this run compiles rather than reads old entries.
    let dir = std::env::temp_dir().join(format!("parsim-kernels-test-{}", std::process::id()));
    std::env::set_var("PARSIM_KERNEL_CACHE", &dir);
    for arch in ["sm_80", "sm_90"] {
        for file in FILES {
            let c = compile_file(file, arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            assert!(!c.cached, "{}: fresh cache reported a hit", file.name);
            let mut want = file.kernel_names();
            let mut got: Vec<String> = c.kernels.iter().map(|k| k.name.clone()).collect();
            want.sort();
            got.sort();
            assert_eq!(got, want, "{arch} {}: ptxas report vs source", file.name);
            for k in &c.kernels {
                assert!(k.registers > 0, "{arch} {}: no registers parsed", k.name);
                assert_eq!(k.spill_store_bytes + k.spill_load_bytes, 0, "{}", k.name);
            }
            // The second compile of the same file and arch is a cache hit with the same cubin.
            let again = compile_file(file, arch).unwrap();
            assert!(again.cached, "{}: not cached", file.name);
            assert_eq!(again.compiled.cubin, c.compiled.cubin);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
