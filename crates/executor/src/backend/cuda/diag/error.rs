//! Errors of the CUDA backend: a library that is not there (naming where it was looked for)
//! and a call that failed (naming the library and the call).

use crate::backend::cuda::diag::library::Library;

/// Why the CUDA backend could not do something.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A shared library could not be loaded.
    #[error("{library} ({file}) not found: tried {tried} on the loader path ({searched}); {hint}")]
    LibraryMissing {
        library: Library,
        /// The library's usual file name, e.g. `libcuda.so.1`.
        file: &'static str,
        /// The file names tried, comma-separated.
        tried: String,
        /// The directories the loader searches (LD_LIBRARY_PATH, then the system's).
        searched: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// A call into a CUDA library returned an error.
    #[error("{library} call {call} failed: {detail}")]
    Call {
        library: Library,
        call: &'static str,
        detail: String,
    },
    /// No GPU is visible although the driver loaded.
    #[error("the CUDA driver found no GPU (CUDA_VISIBLE_DEVICES={visible})")]
    NoDevice { visible: String },
    /// The Plan's ranks cannot be placed on the GPUs at hand.
    #[error("placing the ranks on GPUs: {0}")]
    Placement(#[from] crate::backend::cuda::comm::groups::PlacementError),
}

impl CudaError {
    /// A failed call of `library`'s function `call`, with the library's own message.
    pub fn call(library: Library, call: &'static str, detail: impl std::fmt::Display) -> Self {
        CudaError::Call {
            library,
            call,
            detail: detail.to_string(),
        }
    }
}
