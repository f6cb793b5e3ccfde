//! The kernel files (`ops/<family>/*.cu`, compiled into the binary as text), their compilation for
//! one architecture through the disk cache, and [`Kernels`], the loaded functions the launch
//! wrappers take.

use crate::backend::cuda::compile::cache;
use crate::backend::cuda::compile::nvrtc::{self, Compiled};
use crate::backend::cuda::compile::ptxas::{self, KernelResources};
use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::diag::probe::Library;
use cudarc::driver::{CudaContext, CudaFunction};
use std::collections::HashMap;
use std::sync::Arc;

/// One kernel file, `ops/<family>/<name>`.
#[derive(Debug, Clone, Copy)]
pub struct KernelFile {
    /// The file name, e.g. `norm.cu`.
    pub name: &'static str,
    pub source: &'static str,
}

/// The header every file includes, given to NVRTC by name.
pub const HEADER: (&str, &str) = ("common.cuh", include_str!("common.cuh"));

/// The Philox 4x32-10 generator of the dropout masks (plain C as well as CUDA C: the test
/// executor/tests/numerics/philox_c.rs compiles it with the system C compiler against rng.rs).
pub const PHILOX: (&str, &str) = ("philox.h", include_str!("philox.h"));

/// Every header a kernel file may include.
pub const HEADERS: [(&str, &str); 2] = [HEADER, PHILOX];

/// `(family, file)` pairs: the file `ops/<family>/<file>`, named by its file name.
macro_rules! kernel_files {
    ($(($d:literal, $f:literal)),*) => {
        &[$(KernelFile { name: $f, source: include_str!(concat!("../ops/", $d, "/", $f)) }),*]
    };
}

/// Every kernel file, one op family each.
pub const FILES: &[KernelFile] = kernel_files!(
    ("elementwise", "elementwise.cu"),
    ("norm", "norm.cu"),
    ("activation", "activation.cu"),
    ("rotary", "rotary.cu"),
    ("embedding", "embedding.cu"),
    ("cross_entropy", "cross_entropy.cu"),
    ("adam", "adam.cu"),
    ("moe", "moe.cu"),
    ("ulysses", "ulysses.cu"),
    ("flash", "flash.cu"),
    ("flash", "flash_mma.cu"),
    ("dropout", "dropout.cu"),
    ("heads", "heads.cu")
);

impl KernelFile {
    /// The names of its `extern "C" __global__` kernels, read from the source (instantiation
    /// macros expanded for the _f32 and _bf16 suffixes).
    pub fn kernel_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for line in self.source.lines() {
            let Some(rest) = line.split("__global__ void ").nth(1) else {
                continue;
            };
            let name = rest.split('(').next().unwrap_or_default().trim();
            if let Some(stem) = name.strip_suffix("##S") {
                names.push(format!("{stem}f32"));
                names.push(format!("{stem}bf16"));
            } else if !name.is_empty() {
                names.push(name.to_string());
            }
        }
        names
    }

    /// Source and headers together: what the cache key hashes.
    fn keyed_source(&self) -> String {
        format!("{}\n{}\n{}", HEADER.1, PHILOX.1, self.source)
    }
}

/// The result of compiling one file: cubin, and ptxas's report per kernel.
#[derive(Debug, Clone)]
pub struct CompiledFile {
    pub file: &'static str,
    pub compiled: Compiled,
    pub kernels: Vec<KernelResources>,
    /// Whether the cubin came from the disk cache.
    pub cached: bool,
}

/// Compiles `file` for `arch` (e.g. `sm_90`), through the disk cache when one is available.
pub fn compile_file(file: &KernelFile, arch: &str) -> Result<CompiledFile, CudaError> {
    let version = nvrtc::version()?;
    let options = nvrtc::options(arch, &nvrtc::include_dirs());
    let key = cache::key(&file.keyed_source(), arch, version, &options);
    let dir = cache::dir();
    if let Some(c) = dir.as_deref().and_then(|d| cache::load(d, &key)) {
        let kernels = ptxas::parse(&c.log);
        return Ok(CompiledFile {
            file: file.name,
            compiled: c,
            kernels,
            cached: true,
        });
    }
    let compiled = nvrtc::compile(file.name, file.source, &HEADERS, &options)?;
    if let Some(d) = &dir {
        // A cache that cannot be written costs a recompile next time, nothing more.
        if let Err(e) = cache::store(d, &key, &compiled) {
            eprintln!("warning: kernel cache {} not written: {e}", d.display());
        }
    }
    let kernels = ptxas::parse(&compiled.log);
    Ok(CompiledFile {
        file: file.name,
        compiled,
        kernels,
        cached: false,
    })
}

/// The architecture name of a compute capability, e.g. (9, 0) -> `sm_90`.
pub fn arch_name(major: i32, minor: i32) -> String {
    format!("sm_{major}{minor}")
}

/// Whether `arch` is a real architecture name NVRTC accepts the form of (`sm_` and digits).
pub fn valid_arch(arch: &str) -> bool {
    arch.strip_prefix("sm_").is_some_and(|d| {
        d.len() >= 2
            && d.chars().take(d.len() - 1).all(|c| c.is_ascii_digit())
            && d.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
    })
}

/// Every kernel of every file, loaded into one context.
pub struct Kernels {
    funcs: HashMap<String, CudaFunction>,
}

impl Kernels {
    /// Compiles (or reads from the cache) every file for the context's device and loads it.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels, CudaError> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| CudaError::call(Library::Driver, "cuDeviceGetAttribute", e))?;
        let arch = arch_name(major, minor);
        let mut funcs = HashMap::new();
        for file in FILES {
            let c = compile_file(file, &arch)?;
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_binary(c.compiled.cubin))
                .map_err(|e| CudaError::call(Library::Driver, "cuModuleLoadData", e))?;
            for name in file.kernel_names() {
                let f = module
                    .load_function(&name)
                    .map_err(|e| CudaError::call(Library::Driver, "cuModuleGetFunction", e))?;
                funcs.insert(name, f);
            }
        }
        Ok(Kernels { funcs })
    }

    /// The loaded kernel `name` (e.g. `norm_fwd_bf16`).
    pub fn get(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.funcs.get(name).ok_or_else(|| {
            CudaError::call(
                Library::Driver,
                "cuModuleGetFunction",
                format!("no kernel named {name} in the kernel files"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_are_read_from_every_file_with_both_suffixes() {
        let all: Vec<String> = FILES.iter().flat_map(|f| f.kernel_names()).collect();
        for name in [
            "cast_f32_to_bf16",
            "norm_fwd_f32",
            "norm_wgrad_bf16",
            "swiglu_bwd_bf16",
            "flash_fwd_block_f32",
            "flash_bwd_dkdv_bf16",
            "flash_mma_fwd_d128",
            "flash_mma_dkdv_d64",
            "flash_finish_f32",
            "ce_grad_f32",
            "adam_step_f32",
            "moe_topk_f32",
            "ulysses_copy_bf16",
            "dropout_bf16",
            "heads_split_bf16",
            "moe_topk_scored_f32",
        ] {
            assert!(all.iter().any(|n| n == name), "{name} missing");
        }
        let mut uniq = all.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), all.len(), "a kernel name repeats");
        // Each file names its CPU twin in its header comment, a file that exists.
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("crates/");
        for f in FILES {
            let at = f.source.find("executor/src/backend/cpu/ops/");
            let Some(at) = at else {
                panic!("{} names no CPU twin", f.name)
            };
            let twin: String = f.source[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '_' | '.'))
                .collect();
            let twin = twin.trim_end_matches('.');
            assert!(
                crates.join(twin).is_file(),
                "{}: its CPU twin {twin} is not a file",
                f.name
            );
        }
    }

    #[test]
    fn arch_names() {
        assert_eq!(arch_name(9, 0), "sm_90");
        assert!(valid_arch("sm_80") && valid_arch("sm_90a") && valid_arch("sm_100"));
        for bad in ["sm80", "compute_90", "sm_", "sm_x0", "sm_9"] {
            assert!(!valid_arch(bad), "{bad}");
        }
    }
}
