//! Which CUDA libraries can be loaded, and where the loader looked. cudarc's dynamic
//! loading panics at the first call into a missing library, so every entry point of the
//! backend asks [`require`] first and turns absence into a [`CudaError::LibraryMissing`].

use crate::backend::cuda::diag::error::CudaError;
pub use crate::backend::cuda::diag::library::Library;

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
