//! `parsim doctor`'s report: the driver and its GPUs, the CUDA libraries found (path and version)
//! or where the loader looked, and every kernel file (`ops/<family>/*.cu`) compiled for the GPU's
//! architecture (or a given one without a GPU) with ptxas's registers and shared memory.

use crate::backend::cuda::compile::kernels::{self, arch_name, FILES};
use crate::backend::cuda::compile::nvrtc;
use crate::backend::cuda::diag::probe::{self, Library};
use serde::Serialize;
use std::ffi::c_int;

/// One GPU as the driver sees it.
#[derive(Debug, Clone, Serialize)]
pub struct Gpu {
    pub ordinal: usize,
    pub name: String,
    pub memory_bytes: u64,
    pub compute_capability: String,
    pub arch: String,
}

/// One library: found (path, version) or missing (the loader's error, naming where it looked).
#[derive(Debug, Clone, Serialize)]
pub struct LibraryReport {
    pub library: String,
    pub file: String,
    pub found: bool,
    pub path: Option<String>,
    pub version: Option<String>,
    pub error: Option<String>,
}

/// One kernel compiled for the report's architecture.
#[derive(Debug, Clone, Serialize)]
pub struct KernelReport {
    pub file: String,
    pub kernel: String,
    pub registers: u32,
    pub static_shared_bytes: u64,
    pub stack_bytes: u64,
}

/// A kernel file that did not compile, with the compiler's log.
#[derive(Debug, Clone, Serialize)]
pub struct CompileFailure {
    pub file: String,
    pub error: String,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub driver_version: Option<String>,
    pub gpus: Vec<Gpu>,
    pub libraries: Vec<LibraryReport>,
    /// The architecture the kernels were compiled for (None: no GPU and no --arch).
    pub arch: Option<String>,
    pub kernels: Vec<KernelReport>,
    pub failures: Vec<CompileFailure>,
}

impl Report {
    /// Whether every kernel file compiled.
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// CUDA's integer version (e.g. 13000) as "13.0".
pub fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn driver_version() -> Option<i32> {
    let mut v: c_int = 0;
    // SAFETY: only called after probe::require(Driver) succeeded; `v` is a valid pointer.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    (r == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then_some(v)
}

fn gpus() -> Vec<Gpu> {
    let Ok(n) = cudarc::driver::CudaContext::device_count() else {
        return Vec::new();
    };
    (0..n.max(0) as usize)
        .filter_map(|i| {
            let ctx = cudarc::driver::CudaContext::new(i).ok()?;
            let (major, minor) = ctx.compute_capability().ok()?;
            Some(Gpu {
                ordinal: i,
                name: ctx.name().unwrap_or_default(),
                memory_bytes: ctx.total_mem().map(|m| m as u64).unwrap_or(0),
                compute_capability: format!("{major}.{minor}"),
                arch: arch_name(major, minor),
            })
        })
        .collect()
}

/// The library's version, loading it (so that /proc/self/maps names its path).
fn library_version(lib: Library) -> Option<String> {
    // SAFETY: each call is made only for a library that `present()` found loadable; the
    // out-pointers are valid locals.
    unsafe {
        match lib {
            Library::Driver => driver_version().map(cuda_version),
            Library::Nvrtc => nvrtc::version().ok().map(|(a, b)| format!("{a}.{b}")),
            Library::Cublas => {
                use cudarc::cublas::sys::{cublasGetProperty, libraryPropertyType};
                let (mut a, mut b, mut c): (c_int, c_int, c_int) = (0, 0, 0);
                cublasGetProperty(libraryPropertyType::MAJOR_VERSION, &mut a);
                cublasGetProperty(libraryPropertyType::MINOR_VERSION, &mut b);
                cublasGetProperty(libraryPropertyType::PATCH_LEVEL, &mut c);
                Some(format!("{a}.{b}.{c}"))
            }
            Library::CublasLt => {
                let v = cudarc::cublaslt::sys::cublasLtGetVersion();
                Some(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
            }
            Library::Nccl => {
                let mut v: c_int = 0;
                cudarc::nccl::sys::ncclGetVersion(&mut v);
                Some(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
            }
        }
    }
}

fn libraries() -> Vec<LibraryReport> {
    Library::ALL
        .iter()
        .map(|&lib| match probe::require(lib) {
            Ok(()) => {
                let version = library_version(lib);
                LibraryReport {
                    library: lib.to_string(),
                    file: lib.file().to_string(),
                    found: true,
                    path: nvrtc::loaded_library_path(lib.stem()).map(|p| p.display().to_string()),
                    version,
                    error: None,
                }
            }
            Err(e) => LibraryReport {
                library: lib.to_string(),
                file: lib.file().to_string(),
                found: false,
                path: None,
                version: None,
                error: Some(e.to_string()),
            },
        })
        .collect()
}

/// The libraries alone (found or not), without compiling kernels: for provenance notes.
pub fn report_libraries() -> Vec<LibraryReport> {
    libraries()
}

/// The driver's CUDA version ("13.0"), or None without a driver.
pub fn driver_version_string() -> Option<String> {
    if !Library::Driver.present() {
        return None;
    }
    driver_version().map(cuda_version)
}

/// Builds the report: kernels compiled for `arch`, else for the first GPU's architecture.
pub fn report(arch: Option<&str>) -> Report {
    let driver = Library::Driver.present();
    let gpus = if driver { gpus() } else { Vec::new() };
    let libraries = libraries();
    let arch = arch
        .map(str::to_string)
        .or_else(|| gpus.first().map(|g| g.arch.clone()));
    let (mut kernels_out, mut failures) = (Vec::new(), Vec::new());
    let nvrtc_missing = probe::require(Library::Nvrtc).err();
    if let (Some(_), Some(e)) = (&arch, &nvrtc_missing) {
        failures.push(CompileFailure {
            file: "backend/cuda/ops/*/*.cu".to_string(),
            error: e.to_string(),
        });
    } else if let Some(a) = &arch {
        for file in FILES {
            match kernels::compile_file(file, a) {
                Ok(c) => kernels_out.extend(c.kernels.iter().map(|k| KernelReport {
                    file: file.name.to_string(),
                    kernel: k.name.clone(),
                    registers: k.registers,
                    static_shared_bytes: k.shared_bytes,
                    stack_bytes: k.stack_bytes,
                })),
                Err(e) => failures.push(CompileFailure {
                    file: file.name.to_string(),
                    error: e.to_string(),
                }),
            }
        }
    }
    Report {
        driver_version: if driver {
            driver_version().map(cuda_version)
        } else {
            None
        },
        gpus,
        libraries,
        arch,
        kernels: kernels_out,
        failures,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions_read_as_major_dot_minor() {
        // cuDriverGetVersion returns 1000 x major + 10 x minor (CUDA driver API reference).
        assert_eq!(cuda_version(13000), "13.0");
        assert_eq!(cuda_version(12040), "12.4");
    }
}
