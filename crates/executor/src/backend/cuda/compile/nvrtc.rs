//! Run-time compilation of `backend/cuda/ops/*/*.cu` with NVRTC, called through `nvrtc::sys`
//! directly because cudarc's wrapper drops the program log on success, and the log carries ptxas's
//! registers and shared memory per kernel (`--ptxas-options=-v`). Register spills are errors.

use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::diag::probe::{self, Library};
use cudarc::nvrtc::sys;
use std::ffi::{c_char, c_int, CString};
use std::path::PathBuf;

/// A compiled kernel file: the cubin for one architecture and the compiler's log.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The device code (cubin), loadable without JIT on that architecture.
    pub cubin: Vec<u8>,
    /// NVRTC's program log, ptxas's `-v` lines included.
    pub log: String,
}

/// NVRTC's (major, minor) version.
pub fn version() -> Result<(i32, i32), CudaError> {
    probe::require(Library::Nvrtc)?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); the pointers are valid for the call.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    check(r, "nvrtcVersion")?;
    Ok((major, minor))
}

/// The options every kernel file is compiled with for `arch` (e.g. `sm_90`).
pub fn options(arch: &str, include_dirs: &[PathBuf]) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--ptxas-options=-v".to_string(),
        "--ptxas-options=--warn-on-spills".to_string(),
        "--ptxas-options=--warning-as-error".to_string(),
    ];
    o.extend(include_dirs.iter().map(|d| format!("-I{}", d.display())));
    o
}

/// Where `cuda_bf16.h` is looked for: `PARSIM_CUDA_INCLUDE`, the `include` folder beside the
/// loaded NVRTC's `lib` folder (the PyPI wheels' layout), then the toolkit's usual places.
pub fn include_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("PARSIM_CUDA_INCLUDE") {
        dirs.push(PathBuf::from(d));
    }
    if let Some(lib) = loaded_library_path("nvrtc") {
        if let Some(root) = lib.parent().and_then(|l| l.parent()) {
            dirs.push(root.join("include"));
        }
    }
    dirs.extend(["/usr/local/cuda/include", "/usr/include"].map(PathBuf::from));
    dirs.into_iter()
        .filter(|d| d.join("cuda_bf16.h").exists())
        .collect()
}

/// The path of a loaded shared library whose file name starts with `lib{stem}.so`, read from
/// /proc/self/maps (None where it is not loaded or on a system without procfs).
pub fn loaded_library_path(stem: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let prefix = format!("lib{stem}.so");
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            PathBuf::from(p)
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with(&prefix))
        })
        .map(PathBuf::from)
}

fn check(r: sys::nvrtcResult, call: &'static str) -> Result<(), CudaError> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::call(Library::Nvrtc, call, format!("{r:?}")))
    }
}

fn cstring(s: &str, what: &str) -> Result<CString, CudaError> {
    CString::new(s).map_err(|_| {
        CudaError::call(
            Library::Nvrtc,
            "nvrtcCreateProgram",
            format!("{what} holds a NUL byte"),
        )
    })
}

/// Compiles `src` (file `name`, with in-memory `headers` as (name, text)) with `options`.
/// A compile error returns the file name and the full log.
pub fn compile(
    name: &str,
    src: &str,
    headers: &[(&str, &str)],
    options: &[String],
) -> Result<Compiled, CudaError> {
    probe::require(Library::Nvrtc)?;
    let c_src = cstring(src, name)?;
    let c_name = cstring(name, "the file name")?;
    let h_text: Vec<CString> = headers
        .iter()
        .map(|h| cstring(h.1, h.0))
        .collect::<Result<_, _>>()?;
    let h_name: Vec<CString> = headers
        .iter()
        .map(|h| cstring(h.0, "a header name"))
        .collect::<Result<_, _>>()?;
    let h_text_p: Vec<*const c_char> = h_text.iter().map(|c| c.as_ptr()).collect();
    let h_name_p: Vec<*const c_char> = h_name.iter().map(|c| c.as_ptr()).collect();
    let c_opts: Vec<CString> = options
        .iter()
        .map(|o| cstring(o, "an option"))
        .collect::<Result<_, _>>()?;
    let opt_p: Vec<*const c_char> = c_opts.iter().map(|c| c.as_ptr()).collect();
    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NVRTC is loaded; every pointer refers to a live NUL-terminated string and the
    // header arrays have `headers.len()` entries.
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            c_src.as_ptr(),
            c_name.as_ptr(),
            headers.len() as c_int,
            h_text_p.as_ptr(),
            h_name_p.as_ptr(),
        )
    };
    check(r, "nvrtcCreateProgram")?;
    // SAFETY: `prog` was created above and is destroyed once, below.
    let out = unsafe { compile_program(prog, name, &opt_p) };
    // SAFETY: as above.
    let destroyed = unsafe { sys::nvrtcDestroyProgram(&mut prog) };
    let compiled = out?;
    check(destroyed, "nvrtcDestroyProgram")?;
    Ok(compiled)
}

/// Compiles a created program and reads its log and cubin.
///
/// # Safety
/// `prog` must be a live program from `nvrtcCreateProgram`.
unsafe fn compile_program(
    prog: sys::nvrtcProgram,
    name: &str,
    opts: &[*const c_char],
) -> Result<Compiled, CudaError> {
    // SAFETY: `prog` is live (the caller's contract); the buffers are sized by NVRTC's own
    // size queries.
    unsafe {
        let r = sys::nvrtcCompileProgram(prog, opts.len() as c_int, opts.as_ptr());
        let mut log_len = 0usize;
        check(
            sys::nvrtcGetProgramLogSize(prog, &mut log_len),
            "nvrtcGetProgramLogSize",
        )?;
        let mut log = vec![0u8; log_len.max(1)];
        check(
            sys::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast()),
            "nvrtcGetProgramLog",
        )?;
        let log = String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .to_string();
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(CudaError::call(
                Library::Nvrtc,
                "nvrtcCompileProgram",
                format!("{name} did not compile ({r:?}):\n{log}"),
            ));
        }
        let mut size = 0usize;
        check(sys::nvrtcGetCUBINSize(prog, &mut size), "nvrtcGetCUBINSize")?;
        let mut cubin = vec![0u8; size];
        check(
            sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()),
            "nvrtcGetCUBIN",
        )?;
        Ok(Compiled { cubin, log })
    }
}
