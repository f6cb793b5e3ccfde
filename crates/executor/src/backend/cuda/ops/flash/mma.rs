//! Launches of backend/cuda/ops/flash/flash_mma.cu: the bf16 block attention on tensor cores
//! (FlashAttention-2, Dao 2023), same buffers and semantics as [`super::kernel`] (CPU twin:
//! cpu/ops/flash.rs) for head dims 64 and 128. Each side also carries the (min, max) position of
//! every 32 rows, from which the kernels skip tiles wholly in the future and leave the mask off
//! tiles wholly in the past.

use crate::backend::cuda::ops::launch::*;
use crate::backend::ops::*;
use parsim_plan::DType;

/// Rows per position-range group (RG in flash_mma.cu).
pub const RANGE_ROWS: usize = 32;
/// Rows of one thread block: queries (forward, dQ) or keys (dK, dV); 4 warps x 16.
pub const BLOCK_ROWS: usize = 64;
/// Threads per block (MMA_THREADS).
pub const THREADS_MMA: u32 = 128;
/// The head dims the kernels are instantiated for.
pub const HEAD_DIMS: [usize; 2] = [64, 128];

/// The (min, max) position of each group of [`RANGE_ROWS`] rows, flattened.
pub fn ranges(pos: &[u32]) -> Vec<u32> {
    pos.chunks(RANGE_ROWS)
        .flat_map(|c| {
            let lo = c.iter().copied().min().unwrap_or(u32::MAX);
            let hi = c.iter().copied().max().unwrap_or(0);
            [lo, hi]
        })
        .collect()
}

/// One side of a call on the device: positions (u32 per row), their [`ranges`], row count.
#[derive(Debug, Clone, Copy)]
pub struct MmaRows {
    pub pos: CUdeviceptr,
    pub ranges: CUdeviceptr,
    pub len: usize,
}

/// Off: every call runs on backend/cuda/ops/flash/flash.cu (for comparing the two on one GPU; the
/// `PARSIM_CUDA_FLASH_SCALAR` environment variable also turns them off for a whole run).
static DISABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns the tensor-core kernels off (`false`) or back on for calls made from now on.
pub fn set_enabled(on: bool) {
    DISABLED.store(!on, std::sync::atomic::Ordering::Relaxed);
}

/// On: the backward runs as two kernels (dQ by query blocks, then dK dV by key blocks) whose
/// sums are in a fixed order, bit for bit the same on every run; off (the default): one
/// kernel by key blocks adding dQ with atomics, FlashAttention-2's five products per tile
/// instead of seven. The `PARSIM_CUDA_FLASH_DETERMINISTIC` environment variable turns it on
/// for a whole run.
static DETERMINISTIC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Chooses the deterministic two-kernel backward (`true`) or the fused one for calls made from
/// now on (see [`DETERMINISTIC`]).
pub fn set_deterministic(on: bool) {
    DETERMINISTIC.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the backward runs the deterministic two-kernel path.
pub fn deterministic() -> bool {
    static ENV_ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    DETERMINISTIC.load(std::sync::atomic::Ordering::Relaxed)
        || *ENV_ON.get_or_init(|| std::env::var_os("PARSIM_CUDA_FLASH_DETERMINISTIC").is_some())
}

/// Shared memory a launch may take without opting in (`cuFuncSetAttribute`).
pub const DEFAULT_SHARED_LIMIT_BYTES: u32 = 48 * 1024;

/// Shared memory of the fused backward: K and V (64 x d), Q and dO (32 x d) bf16 tiles, plus
/// the 32 x 64 bf16 dS tile.
pub fn fused_backward_shared_bytes(d: usize) -> u32 {
    (384 * d + 32 * 64 * 2) as u32
}

fn enabled() -> bool {
    static ENV_OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !DISABLED.load(std::sync::atomic::Ordering::Relaxed)
        && !*ENV_OFF.get_or_init(|| std::env::var_os("PARSIM_CUDA_FLASH_SCALAR").is_some())
}

/// Whether the tensor-core kernels take a call: bf16 inputs, d = dv in [`HEAD_DIMS`], query heads a
/// multiple of the key heads, the bf16 tensors 16-byte aligned (cp.async) and the f32 accumulators
/// 8-byte aligned (paired stores). Anything else runs on backend/cuda/ops/flash/flash.cu.
pub fn supports(dtype: DType, sh: &BlockShape, bf16: &[CUdeviceptr], f32s: &[CUdeviceptr]) -> bool {
    enabled()
        && dtype == DType::Bf16
        && sh.d == sh.dv
        && HEAD_DIMS.contains(&sh.d)
        && sh.hk > 0
        && sh.hq % sh.hk == 0
        && sh.dropout.is_none()
        && bf16.iter().all(|p| p % 16 == 0)
        && f32s.iter().all(|p| p % 8 == 0)
}

/// Geometry of the three kernels over `rows` rows (queries or keys) and `bh` (sequence, head)
/// pairs: 128 threads, one block per 64 rows, shared memory the equivalent of three 64 x d
/// bf16 tiles (384 d bytes: 48 KiB at d 128, within the default dynamic limit).
pub fn geometry(
    kernel: &str,
    rows: usize,
    bh: usize,
    d: usize,
) -> Result<Option<LaunchConfig>, CudaError> {
    if !HEAD_DIMS.contains(&d) {
        return Err(shape_error(
            kernel,
            format!("head dim d = {d} must be one of {HEAD_DIMS:?}"),
        ));
    }
    if u(bh) > MAX_GRID_Y {
        return Err(shape_error(
            kernel,
            format!("b x heads = {bh} exceeds the grid limit {MAX_GRID_Y}"),
        ));
    }
    let blocks = u(rows).div_ceil(BLOCK_ROWS as u64);
    if blocks > MAX_GRID_X {
        return Err(shape_error(
            kernel,
            format!("{rows} rows exceed the grid limit"),
        ));
    }
    if rows == 0 || bh == 0 {
        return Ok(None);
    }
    Ok(Some(LaunchConfig {
        grid_dim: (blocks as u32, bh as u32, 1),
        block_dim: (THREADS_MMA, 1, 1),
        shared_mem_bytes: (384 * d) as u32,
    }))
}

fn kernel_name(stem: &str, d: usize) -> String {
    format!("flash_mma_{stem}_d{d}")
}

fn check(kernel: &str, sh: &BlockShape, qs: &MmaRows, ks: &MmaRows) -> Result<(), CudaError> {
    if sh.hk == 0 || sh.hq % sh.hk != 0 {
        return Err(shape_error(
            kernel,
            format!("hq = {} must be a multiple of hk = {}", sh.hq, sh.hk),
        ));
    }
    if sh.dv != sh.d {
        return Err(shape_error(
            kernel,
            format!("dv = {} must equal d = {}", sh.dv, sh.d),
        ));
    }
    if qs.len > u32::MAX as usize || ks.len > u32::MAX as usize {
        return Err(shape_error(kernel, "rows must fit in u32 positions"));
    }
    Ok(())
}

fn scale(sh: &BlockShape) -> f32 {
    1.0 / (sh.d as f32).sqrt()
}

/// Merges the key block (k, v at rows `ks`) into the running `acc` [b, sq, hq, d] and `max`,
/// `sum` [b, hq, sq] (f32), as [`super::kernel::forward_block`].
///
/// # Safety
/// q [b, sq, hq, d], k and v [b, sk, hk, d] bf16; the rows' positions and ranges u32; acc,
/// max, sum f32 of the shapes above; alignments as [`supports`] checks.
#[allow(clippy::too_many_arguments)]
pub unsafe fn forward_block(
    s: &CudaStream,
    kr: &Kernels,
    sh: &BlockShape,
    q: CUdeviceptr,
    qs: MmaRows,
    k: CUdeviceptr,
    v: CUdeviceptr,
    ks: MmaRows,
    acc: CUdeviceptr,
    max: CUdeviceptr,
    sum: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = kernel_name("fwd", sh.d);
    check(&kn, sh, &qs, &ks)?;
    let Some(cfg) = geometry(&kn, qs.len, sh.b * sh.hq, sh.d)? else {
        return Ok(());
    };
    if ks.len == 0 {
        return Ok(());
    }
    let (hq, hk, sc) = (sh.hq as u32, sh.hk as u32, scale(sh));
    launch!(&kn, s, kr, cfg; q, qs.pos, qs.ranges, u(qs.len), k, v, ks.pos, ks.ranges,
        u(ks.len), hq, hk, sc, acc, max, sum)
}

/// The gradients of one key block, as [`super::kernel::backward_block`]: dq [b, sq, hq, d] +=
/// and dk, dv [b, sk, hk, d] += (f32) from the final `lse` [b, hq, sq] and `delta`
/// [b, sq, hq]. One launch by key blocks and query heads adding dQ (and a GQA group's dK, dV)
/// with atomics, or, [`deterministic`], two:
/// dQ by query blocks and dK dV by key blocks (no atomics).
///
/// # Safety
/// As [`forward_block`], `dout` like q, the gradients f32 in the shapes above.
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward_block(
    s: &CudaStream,
    kr: &Kernels,
    sh: &BlockShape,
    q: CUdeviceptr,
    qs: MmaRows,
    k: CUdeviceptr,
    v: CUdeviceptr,
    ks: MmaRows,
    dout: CUdeviceptr,
    lse: CUdeviceptr,
    delta: CUdeviceptr,
    dq: CUdeviceptr,
    dk: CUdeviceptr,
    dv: CUdeviceptr,
) -> Result<(), CudaError> {
    if !deterministic() {
        let kn = kernel_name("bwd", sh.d);
        check(&kn, sh, &qs, &ks)?;
        // One block per 64 keys and query head (dK, dV of a GQA group added with atomics).
        let Some(mut cfg) = geometry(&kn, ks.len, sh.b * sh.hq, sh.d)? else {
            return Ok(());
        };
        if qs.len == 0 {
            return Ok(());
        }
        cfg.shared_mem_bytes = fused_backward_shared_bytes(sh.d);
        allow_shared(kr, &kn, cfg.shared_mem_bytes)?;
        let (sq, sk, hq, hk, sc) = (u(qs.len), u(ks.len), sh.hq as u32, sh.hk as u32, scale(sh));
        return launch!(&kn, s, kr, cfg; q, qs.pos, qs.ranges, sq, k, v, ks.pos, ks.ranges, sk,
            hq, hk, sc, dout, lse, delta, dq, dk, dv);
    }
    let dq_name = kernel_name("dq", sh.d);
    let kv_name = kernel_name("dkdv", sh.d);
    check(&dq_name, sh, &qs, &ks)?;
    let g_q = geometry(&dq_name, qs.len, sh.b * sh.hq, sh.d)?;
    let g_k = geometry(&kv_name, ks.len, sh.b * sh.hk, sh.d)?;
    let (Some(cfg_q), Some(cfg_k)) = (g_q, g_k) else {
        return Ok(());
    };
    let (sq, sk, hq, hk, sc) = (u(qs.len), u(ks.len), sh.hq as u32, sh.hk as u32, scale(sh));
    launch!(&dq_name, s, kr, cfg_q; q, qs.pos, qs.ranges, sq, k, v, ks.pos, ks.ranges, sk, hq,
        hk, sc, dout, lse, delta, dq)?;
    launch!(&kv_name, s, kr, cfg_k; q, qs.pos, qs.ranges, sq, k, v, ks.pos, ks.ranges, sk, hq,
        hk, sc, dout, lse, delta, dk, dv)
}

/// Lets kernel `name` take `bytes` of dynamic shared memory when that is above the default
/// limit (the driver refuses such a launch otherwise). Cheap enough to repeat per launch.
fn allow_shared(kr: &Kernels, name: &str, bytes: u32) -> Result<(), CudaError> {
    if bytes <= DEFAULT_SHARED_LIMIT_BYTES {
        return Ok(());
    }
    use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_SHARED;
    kr.get(name)?
        .set_attribute(MAX_SHARED, bytes as i32)
        .map_err(|e| {
            CudaError::call(
                crate::backend::cuda::diag::library::Library::Driver,
                "cuFuncSetAttribute",
                format!("{name}: {bytes} bytes of shared memory: {e}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(d: usize, dv: usize, hq: usize, hk: usize) -> BlockShape {
        BlockShape {
            b: 1,
            hq,
            hk,
            d,
            dv,
            dropout: None,
            span: parsim_plan::plan::AttnSpan::Full,
        }
    }

    #[test]
    fn mma_geometry_at_edge_shapes() {
        // One row: one block of 128 threads; 65 rows: two blocks (64 rows each).
        let c = geometry("f", 1, 1, 64).unwrap().unwrap();
        assert_eq!((c.grid_dim, c.block_dim), ((1, 1, 1), (128, 1, 1)));
        assert_eq!(
            geometry("f", 65, 3, 64).unwrap().unwrap().grid_dim,
            (2, 3, 1)
        );
        assert_eq!(
            geometry("f", 64, 3, 64).unwrap().unwrap().grid_dim,
            (1, 3, 1)
        );
        // Shared memory: three 64-row x d bf16 tiles (forward Q, K, V; dQ Q and dO with 32-row K
        // and V; dK dV K and V with 32-row Q and dO), 48 KiB at d 128 (the limit a launch may
        // ask for without opting in).
        for d in HEAD_DIMS {
            let c = geometry("f", 4096, 32, d).unwrap().unwrap();
            assert_eq!(c.shared_mem_bytes as usize, 3 * 64 * d * 2, "d = {d}");
            assert!(c.shared_mem_bytes <= 48 * 1024, "d = {d}");
        }
        // The benchmark's shape: s 4096 over 64-row blocks, 32 query heads.
        assert_eq!(
            geometry("f", 4096, 32, 128).unwrap().unwrap().grid_dim,
            (64, 32, 1)
        );
        assert!(geometry("f", 0, 8, 64).unwrap().is_none());
        for (d, bh) in [(72, 1), (0, 1), (256, 1), (64, 70_000)] {
            let e = geometry("flash_mma_fwd_d64", 8, bh, d)
                .unwrap_err()
                .to_string();
            assert!(e.contains("flash_mma_fwd_d64"), "{e}");
        }
    }

    #[test]
    fn the_fused_backward_needs_4_kib_more_shared_memory_and_opts_in_at_d_128() {
        // K, V 64 x d and Q, dO 32 x d bf16 (384 d bytes, the two-kernel dK dV's), plus dS
        // 32 x 64 bf16 = 4096 bytes: 28 KiB at d 64, 52 KiB at d 128 (above the 48 KiB a launch
        // gets without opting in; sm_80 allows 163 KiB, sm_90 227 KiB).
        assert_eq!(fused_backward_shared_bytes(64), 28 * 1024);
        assert_eq!(fused_backward_shared_bytes(128), 52 * 1024);
        assert!(fused_backward_shared_bytes(64) <= DEFAULT_SHARED_LIMIT_BYTES);
        assert!(fused_backward_shared_bytes(128) > DEFAULT_SHARED_LIMIT_BYTES);
    }

    #[test]
    fn ranges_are_the_min_and_max_of_each_32_rows() {
        // Zigzag shard of 128 positions over cp 2: chunks 0 and 3 (32 rows each), then a
        // partial group of 5.
        let pos: Vec<u32> = (0..32).chain(96..128).chain([7, 3, 200, 9, 1]).collect();
        assert_eq!(ranges(&pos), vec![0, 31, 96, 127, 1, 200]);
        assert!(ranges(&[]).is_empty());
    }

    #[test]
    fn the_tensor_core_path_takes_bf16_at_head_dims_64_and_128_only() {
        let ok = |dt, sh: &BlockShape| supports(dt, sh, &[256, 512], &[1024]);
        assert!(ok(DType::Bf16, &shape(128, 128, 32, 8)));
        assert!(ok(DType::Bf16, &shape(64, 64, 4, 4)));
        assert!(!ok(DType::F32, &shape(128, 128, 32, 8)));
        assert!(!ok(DType::Bf16, &shape(72, 72, 4, 2)));
        assert!(
            !ok(DType::Bf16, &shape(128, 64, 4, 2)),
            "MLA's narrower values"
        );
        assert!(!ok(DType::Bf16, &shape(128, 128, 6, 4)));
        // Misaligned views fall back to the scalar kernels.
        assert!(!supports(
            DType::Bf16,
            &shape(64, 64, 1, 1),
            &[256 + 8],
            &[0]
        ));
        assert!(!supports(DType::Bf16, &shape(64, 64, 1, 1), &[256], &[4]));
    }
}
