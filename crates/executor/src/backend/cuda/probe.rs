//! Which CUDA libraries can be loaded, and where the loader looked. cudarc's dynamic
//! loading panics at the first call into a missing library, so every entry point of the
//! backend asks [`require`] first and turns absence into a [`CudaError::LibraryMissing`].

use super::error::CudaError;
use std::fmt;

/// A shared library the backend loads at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Library {
    /// The CUDA driver (`libcuda.so.1`), installed with the NVIDIA driver.
    Driver,
    /// The run-time compiler (`libnvrtc.so.13`).
    Nvrtc,
    /// cuBLAS (`libcublas.so.13`).
    Cublas,
    /// cuBLASLt (`libcublasLt.so.13`).
    CublasLt,
    /// NCCL (`libnccl.so.2`; cudarc loads it as `libnccl.so`).
    Nccl,
}

impl Library {
    /// Every library, in the order `parsim doctor` reports them.
    pub const ALL: [Library; 5] = [
        Library::Driver,
        Library::Nvrtc,
        Library::Cublas,
        Library::CublasLt,
        Library::Nccl,
    ];

    /// The library's usual file name on Linux.
    pub fn file(self) -> &'static str {
        match self {
            Library::Driver => "libcuda.so.1",
            Library::Nvrtc => "libnvrtc.so.13",
            Library::Cublas => "libcublas.so.13",
            Library::CublasLt => "libcublasLt.so.13",
            Library::Nccl => "libnccl.so.2",
        }
    }

    /// The stem cudarc builds its candidate file names from.
    pub fn stem(self) -> &'static str {
        match self {
            Library::Driver => "cuda",
            Library::Nvrtc => "nvrtc",
            Library::Cublas => "cublas",
            Library::CublasLt => "cublasLt",
            Library::Nccl => "nccl",
        }
    }

    /// What to do when the library is missing.
    pub fn hint(self) -> &'static str {
        match self {
            Library::Driver => "install the NVIDIA driver (it ships libcuda.so.1); a machine without a GPU cannot run --backend cuda",
            Library::Nvrtc => "install NVRTC 13 (pip install nvidia-cuda-nvrtc==13.0.88, or the CUDA toolkit) and put its lib folder on LD_LIBRARY_PATH",
            Library::Cublas | Library::CublasLt => "install cuBLAS 13 (pip install nvidia-cublas, or the CUDA toolkit) and put its lib folder on LD_LIBRARY_PATH",
            Library::Nccl => "install NCCL 2 (pip install nvidia-nccl-cu13, or apt libnccl2) and put its lib folder on LD_LIBRARY_PATH; `parsim execute --nproc-per-node` links libnccl.so to libnccl.so.2 for its workers, a process started otherwise (torchrun, srun) needs a libnccl.so link to it in a folder on LD_LIBRARY_PATH",
        }
    }

    /// The file names cudarc tries, in order.
    pub fn candidates(self) -> Vec<String> {
        cudarc::get_lib_name_candidates(self.stem())
    }

    /// Whether cudarc can load the library (never panics).
    pub fn present(self) -> bool {
        // SAFETY: each probe only tries `dlopen` on cudarc's candidate names and drops the
        // handle; no symbol is resolved or called.
        unsafe {
            match self {
                Library::Driver => cudarc::driver::sys::is_culib_present(),
                Library::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Library::Cublas => cudarc::cublas::sys::is_culib_present(),
                Library::CublasLt => cudarc::cublaslt::sys::is_culib_present(),
                Library::Nccl => cudarc::nccl::sys::is_culib_present(),
            }
        }
    }
}

impl fmt::Display for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Library::Driver => "CUDA driver",
            Library::Nvrtc => "NVRTC",
            Library::Cublas => "cuBLAS",
            Library::CublasLt => "cuBLASLt",
            Library::Nccl => "NCCL",
        })
    }
}

/// The directories the dynamic loader searches: LD_LIBRARY_PATH's, then the system's.
pub fn search_path() -> Vec<String> {
    let mut dirs: Vec<String> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .collect();
    dirs.push("the ld.so cache (/etc/ld.so.conf)".to_string());
    dirs.extend(["/lib", "/usr/lib"].map(str::to_string));
    dirs
}

/// `Ok` when `library` loads; otherwise an error naming it and where the loader looked.
pub fn require(library: Library) -> Result<(), CudaError> {
    if library.present() {
        return Ok(());
    }
    Err(CudaError::LibraryMissing {
        library,
        file: library.file(),
        tried: library.candidates().join(", "),
        searched: search_path().join(":"),
        hint: library.hint(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_error_names_library_and_search_path() {
        // A library is either present (Ok) or the error names it, its file and the path.
        for lib in Library::ALL {
            match require(lib) {
                Ok(()) => assert!(lib.present()),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains(&lib.to_string()), "{msg}");
                    assert!(msg.contains(lib.file()), "{msg}");
                    assert!(msg.contains("/usr/lib"), "{msg}");
                }
            }
        }
    }

    #[test]
    fn candidates_include_the_linux_sonames() {
        assert!(Library::Driver
            .candidates()
            .contains(&"libcuda.so.1".to_string()));
        assert!(Library::Nvrtc
            .candidates()
            .contains(&"libnvrtc.so.13".to_string()));
    }
}
