//! The CUDA libraries the backend loads at run time: their names, file names, the hint
//! given when one is missing, and whether cudarc can load each (without panicking).

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
