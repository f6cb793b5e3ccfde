//! Typed launch wrappers, one file per kernel family of `kernels/`. Each takes raw device
//! addresses (`CUdeviceptr`), shapes as `usize`, a [`DType`] where the kernel has f32 and bf16
//! variants, the stream and the loaded [`Kernels`]; the caller owns the buffers and orders the
//! streams. The launch geometry (grid, block, shared memory) is computed here by pure functions
//! that the unit tests check at edge shapes; an empty shape launches nothing.

pub use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::diag::library::Library;
pub use cudarc::driver::LaunchConfig;
use parsim_plan::DType;

pub use crate::backend::cuda::compile::kernels::Kernels;
pub use cudarc::driver::sys::CUdeviceptr;
pub use cudarc::driver::{CudaStream, PushKernelArg};

/// The one way a kernel is launched: `launch!(name, stream, kernels, cfg; a, b, ...)` looks
/// `name` up in the loaded kernels, binds the arguments in order by reference (each lives
/// until the launch), launches on the stream (cudarc's `launch_builder`) and turns a failure
/// into an error naming the kernel. It evaluates to `Result<(), CudaError>`. With
/// `maybe cfg` the configuration is an `Option` and `None` (an empty shape) launches nothing.
macro_rules! launch {
    (@go $b:ident, $cfg:expr, $kn:expr;) => {
        // SAFETY: the caller guarantees the buffers (see the function's Safety).
        unsafe { $b.launch($cfg) }.map(|_| ()).map_err(|e| launch_error($kn, e))
    };
    (@go $b:ident, $cfg:expr, $kn:expr; $a:expr $(, $rest:expr)*) => {{
        let a = &$a;
        $b.arg(a);
        launch!(@go $b, $cfg, $kn; $($rest),*)
    }};
    // `maybe cfg`: an `Option<LaunchConfig>`, where `None` (an empty shape) launches nothing.
    ($kn:expr, $s:expr, $k:expr, maybe $cfg:expr; $($a:expr),+) => {
        match $cfg {
            None => Ok(()),
            Some(cfg) => launch!($kn, $s, $k, cfg; $($a),+),
        }
    };
    ($kn:expr, $s:expr, $k:expr, $cfg:expr; $($a:expr),+) => {{
        let f = $k.get($kn)?;
        let mut b = $s.launch_builder(f);
        launch!(@go b, $cfg, $kn; $($a),+)
    }};
}
pub(crate) use launch;

/// The dtype most kernels keep their statistics and gradients in.
pub const F32: DType = DType::F32;

/// Threads per block of the 1-D and per-row kernels.
pub const THREADS: u32 = 256;
/// Upper bound on the blocks of a grid-stride launch (the kernels loop over the rest).
pub const MAX_GRID_STRIDE_BLOCKS: u64 = 65_536;
/// The driver's limits on grid.x and grid.y.
pub const MAX_GRID_X: u64 = (1 << 31) - 1;
pub const MAX_GRID_Y: u64 = 65_535;

/// The kernel-name suffix of a dtype.
pub fn suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::Bf16 => "bf16",
        DType::U8 => "u8",
    }
}

/// `{stem}_{f32|bf16}`.
pub fn name(stem: &str, dtype: DType) -> String {
    format!("{stem}_{}", suffix(dtype))
}

/// An error for a shape a kernel cannot take, naming the kernel and the rule.
pub fn shape_error(kernel: &str, rule: impl std::fmt::Display) -> CudaError {
    CudaError::call(
        Library::Driver,
        "cuLaunchKernel",
        format!("{kernel}: {rule}"),
    )
}

/// The error of a failed launch of `kernel`.
pub fn launch_error(kernel: &str, e: impl std::fmt::Display) -> CudaError {
    CudaError::call(Library::Driver, "cuLaunchKernel", format!("{kernel}: {e}"))
}

/// 1-D grid-stride geometry over `n` elements: `None` when `n` is 0.
pub fn grid_stride(n: u64) -> Option<LaunchConfig> {
    (n > 0).then(|| LaunchConfig {
        grid_dim: (
            n.div_ceil(u64::from(THREADS)).min(MAX_GRID_STRIDE_BLOCKS) as u32,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// One block per row over `rows` rows (`blocks` = rows, or row groups): `None` for 0.
pub fn per_row(kernel: &str, blocks: u64) -> Result<Option<LaunchConfig>, CudaError> {
    if blocks > MAX_GRID_X {
        return Err(shape_error(
            kernel,
            format!("{blocks} row blocks exceed the grid limit {MAX_GRID_X}"),
        ));
    }
    Ok((blocks > 0).then_some(LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }))
}

/// `usize` -> `u64` for a kernel argument (lossless on every supported target).
pub fn u(x: usize) -> u64 {
    x as u64
}

/// `usize` -> `u32` for a kernel argument that the kernel holds in 32 bits.
pub fn u32_arg(kernel: &str, what: &str, x: usize) -> Result<u32, CudaError> {
    u32::try_from(x).map_err(|_| shape_error(kernel, format!("{what} = {x} exceeds u32")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_stride_covers_small_sizes_exactly_and_caps_large_ones() {
        assert!(grid_stride(0).is_none());
        let one = grid_stride(1).unwrap();
        assert_eq!((one.grid_dim, one.block_dim), ((1, 1, 1), (256, 1, 1)));
        // 257 elements: two blocks, the second with one live thread.
        assert_eq!(grid_stride(257).unwrap().grid_dim.0, 2);
        // 2^40 elements: capped; the grid-stride loop covers the rest.
        let big = grid_stride(1 << 40).unwrap();
        assert_eq!(big.grid_dim.0 as u64, MAX_GRID_STRIDE_BLOCKS);
        // Any n: blocks x threads >= n or the cap is reached.
        for n in [1u64, 255, 256, 1000, 1 << 24] {
            let g = grid_stride(n).unwrap().grid_dim.0 as u64;
            assert!(g * 256 >= n || g == MAX_GRID_STRIDE_BLOCKS, "{n}");
            assert!((g - 1) * 256 < n, "{n}: a whole block idle");
        }
    }

    #[test]
    fn per_row_has_one_block_per_row_and_refuses_too_many() {
        assert!(per_row("k", 0).unwrap().is_none());
        assert_eq!(per_row("k", 1).unwrap().unwrap().grid_dim, (1, 1, 1));
        assert_eq!(per_row("k", 1 << 30).unwrap().unwrap().grid_dim.0, 1 << 30);
        let e = per_row("norm_fwd_f32", 1 << 32).unwrap_err().to_string();
        assert!(
            e.contains("norm_fwd_f32") && e.contains("grid limit"),
            "{e}"
        );
    }
}
