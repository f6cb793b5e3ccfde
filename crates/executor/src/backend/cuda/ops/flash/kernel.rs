//! Launches of backend/cuda/ops/flash/flash.cu: causal block attention with row positions (CPU
//! twin: cpu/ops/flash.rs forward_block / finish / delta / backward_block). q [b, sq, hq, d], k [b,
//! sk, hk, d] and v [b, sk, hk, dv] of `dtype` (MLA: dv < d); acc, statistics and gradients f32;
//! attention dropout drawn in the kernels from the shape's [`AttnDropout`].

use crate::backend::cuda::ops::launch::*;
use crate::backend::ops::*;
use crate::rng::AttnDropout;
use parsim_plan::DType;

/// backend/cuda/ops/flash/flash.cu's `AttnDrop`: one call's attention dropout by value (threshold
/// 0: none).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttnDropArgs {
    pub seed: u64,
    pub sample0: u64,
    pub seq: u64,
    /// round(p 2^32), as rng/attention.rs compares the Philox word with.
    pub threshold: u64,
    pub step: u32,
    pub layer: u32,
    pub head0: u32,
    /// 1 / (1 - p).
    pub scale: f32,
}

// SAFETY: plain-old-data with the C layout of `AttnDrop` (four u64, three u32, one f32).
unsafe impl cudarc::driver::DeviceRepr for AttnDropArgs {}

impl AttnDropArgs {
    /// The kernel's arguments for `d` (none: threshold 0).
    pub fn of(d: &Option<AttnDropout>) -> AttnDropArgs {
        match d {
            None => AttnDropArgs::default(),
            Some(d) => AttnDropArgs {
                seed: d.seed,
                sample0: d.sample0,
                seq: d.seq,
                threshold: d.threshold(),
                step: d.step,
                layer: d.layer,
                head0: d.head0,
                scale: d.keep_scale(),
            },
        }
    }
}

/// Query (or key) rows per block: one warp each (FLASH_WARPS in flash.cu).
pub const WARPS: u32 = 4;
/// The largest head dimension (32 lanes x FLASH_PER_LANE).
pub const MAX_D: usize = 256;

/// Geometry of a block kernel over `rows` rows (queries for the forward and dQ, keys for dK
/// and dV) and `bh` (sequence, head) pairs; the shared-memory tile is `tile` rows of the other
/// side ([tile, d] and [tile, dv] f32 arrays and one score row per warp), kept within 48 KiB.
/// Returns the config and the tile.
pub fn geometry(
    kernel: &str,
    rows: usize,
    bh: usize,
    d: usize,
    dv: usize,
) -> Result<Option<(LaunchConfig, u32)>, CudaError> {
    for (name, w) in [("d", d), ("dv", dv)] {
        if w == 0 || w > MAX_D {
            return Err(shape_error(
                kernel,
                format!("head dim {name} = {w} must be in 1..={MAX_D}"),
            ));
        }
    }
    if u(bh) > MAX_GRID_Y {
        return Err(shape_error(
            kernel,
            format!("b x heads = {bh} exceeds the grid limit {MAX_GRID_Y}"),
        ));
    }
    let blocks = u(rows).div_ceil(u64::from(WARPS));
    if blocks > MAX_GRID_X {
        return Err(shape_error(
            kernel,
            format!("{rows} rows exceed the grid limit"),
        ));
    }
    if rows == 0 || bh == 0 {
        return Ok(None);
    }
    let tile: u32 = if d.max(dv) <= 128 { 32 } else { 16 };
    let shared = (tile as usize * (d + dv) + WARPS as usize * tile as usize) * 4;
    Ok(Some((
        LaunchConfig {
            grid_dim: (blocks as u32, bh as u32, 1),
            block_dim: (WARPS * 32, 1, 1),
            shared_mem_bytes: shared as u32,
        },
        tile,
    )))
}

/// Device arrays of one attention side: the rows' tensor(s) and positions (u32, one per row).
#[derive(Debug, Clone, Copy)]
pub struct Rows {
    pub pos: CUdeviceptr,
    pub len: usize,
}

fn check_heads(kernel: &str, sh: &BlockShape) -> Result<(), CudaError> {
    if sh.hk == 0 || sh.hq % sh.hk != 0 {
        return Err(shape_error(
            kernel,
            format!("hq = {} must be a multiple of hk = {}", sh.hq, sh.hk),
        ));
    }
    Ok(())
}

fn scale(sh: &BlockShape) -> f32 {
    1.0 / (sh.d as f32).sqrt()
}

/// Merges the key block (k, v at rows `ks`) into the running output `acc` [b, sq, hq, dv] and
/// running `max`, `sum` [b, hq, sq] (initialised by the caller to -inf, 0 and 0).
///
/// # Safety
/// Every pointer must hold the shape named above in its type (`q`, `k`, `v` of `dtype`).
#[allow(clippy::too_many_arguments)]
pub unsafe fn forward_block(
    s: &CudaStream,
    kr: &Kernels,
    dtype: DType,
    sh: &BlockShape,
    q: CUdeviceptr,
    qs: Rows,
    k: CUdeviceptr,
    v: CUdeviceptr,
    ks: Rows,
    acc: CUdeviceptr,
    max: CUdeviceptr,
    sum: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = name("flash_fwd_block", dtype);
    check_heads(&kn, sh)?;
    let Some((cfg, tile)) = geometry(&kn, qs.len, sh.b * sh.hq, sh.d, sh.dv)? else {
        return Ok(());
    };
    if ks.len == 0 {
        return Ok(());
    }
    let (sq, sk, hq, hk, d, dv, sc) = (
        u(qs.len),
        u(ks.len),
        sh.hq as u32,
        sh.hk as u32,
        sh.d as u32,
        sh.dv as u32,
        scale(sh),
    );
    let dr = AttnDropArgs::of(&sh.dropout);
    launch!(
        &kn, s, kr, cfg;
        q, qs.pos, sq, k, v, ks.pos, sk, hq, hk, d, dv, tile, sc, dr, acc, max, sum
    )
}

/// o = acc / sum in place and lse = max + ln(sum), `rows` query rows.
///
/// # Safety
/// `o`: b*rows*hq*dv f32; `max`, `sum`, `lse`: b*hq*rows f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn finish(
    s: &CudaStream,
    kr: &Kernels,
    sh: &BlockShape,
    rows: usize,
    o: CUdeviceptr,
    max: CUdeviceptr,
    sum: CUdeviceptr,
    lse: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = "flash_finish_f32";
    let (bb, r, hq, d) = (u(sh.b), u(rows), sh.hq as u32, sh.dv as u32);
    launch!(
        kn, s, kr, maybe grid_stride(u(sh.b) * u(sh.hq) * u(rows));
        o, max, sum, bb, r, hq, d, lse
    )
}

/// delta [b, rows, hq] = rowsum(dout * o) per head.
///
/// # Safety
/// `dout`: b*rows*hq*dv of `dtype`; `o`: the same count f32; `out`: b*rows*hq f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn delta(
    s: &CudaStream,
    kr: &Kernels,
    dtype: DType,
    sh: &BlockShape,
    rows: usize,
    dout: CUdeviceptr,
    o: CUdeviceptr,
    out: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = name("flash_delta", dtype);
    let n = u(sh.b) * u(rows) * u(sh.hq);
    let d = sh.dv as u32;
    launch!(&kn, s, kr, maybe grid_stride(n); dout, o, n, d, out)
}

/// The gradients of one key block: dq [b, sq, hq, d] +=, dk [b, sk, hk, d] += and dv
/// [b, sk, hk, dv] += (f32),
/// from the final `lse` [b, hq, sq] and `delta` [b, sq, hq]. Two launches: dQ by query rows,
/// dK and dV by key rows (no atomics).
///
/// # Safety
/// As [`forward_block`], `dout` like q, and the gradients f32 in the shapes above.
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward_block(
    s: &CudaStream,
    kr: &Kernels,
    dtype: DType,
    sh: &BlockShape,
    q: CUdeviceptr,
    qs: Rows,
    k: CUdeviceptr,
    v: CUdeviceptr,
    ks: Rows,
    dout: CUdeviceptr,
    lse: CUdeviceptr,
    delta: CUdeviceptr,
    dq: CUdeviceptr,
    dk: CUdeviceptr,
    dv: CUdeviceptr,
) -> Result<(), CudaError> {
    let dq_name = name("flash_bwd_dq", dtype);
    let dkdv_name = name("flash_bwd_dkdv", dtype);
    check_heads(&dq_name, sh)?;
    let g_dq = geometry(&dq_name, qs.len, sh.b * sh.hq, sh.d, sh.dv)?;
    let g_kv = geometry(&dkdv_name, ks.len, sh.b * sh.hk, sh.d, sh.dv)?;
    let (Some((cfg_q, tile_q)), Some((cfg_k, tile_k))) = (g_dq, g_kv) else {
        return Ok(());
    };
    let (sq, sk, hq, hk, d, dv_w, sc) = (
        u(qs.len),
        u(ks.len),
        sh.hq as u32,
        sh.hk as u32,
        sh.d as u32,
        sh.dv as u32,
        scale(sh),
    );
    let dr = AttnDropArgs::of(&sh.dropout);
    launch!(
        &dq_name, s, kr, cfg_q;
        q, qs.pos, sq, k, v, ks.pos, sk, hq, hk, d, dv_w, tile_q, sc, dr, dout, lse, delta, dq
    )?;
    launch!(
        &dkdv_name, s, kr, cfg_k;
        q, qs.pos, sq, k, v, ks.pos, sk, hq, hk, d, dv_w, tile_k, sc, dr, dout, lse, delta, dk, dv
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_geometry_at_edge_shapes() {
        // One row: one block of 4 warps, one (sequence, head) pair.
        let (c, tile) = geometry("f", 1, 1, 64, 64).unwrap().unwrap();
        assert_eq!(
            (c.grid_dim, c.block_dim, tile),
            ((1, 1, 1), (128, 1, 1), 32)
        );
        // Rows not a multiple of the warps: rounded up.
        assert_eq!(
            geometry("f", 5, 3, 64, 64).unwrap().unwrap().0.grid_dim,
            (2, 3, 1)
        );
        // Shared memory = (tile x (d + dv) + warps x tile) x 4 bytes, under the 48 KiB static
        // limit, for equal widths and MLA's narrower values (DeepSeek-V2: d 192, dv 128).
        for (d, dv) in [
            (1, 1),
            (64, 64),
            (128, 128),
            (129, 129),
            (256, 256),
            (192, 128),
            (24, 16),
        ] {
            let (c, tile) = geometry("f", 1000, 8, d, dv).unwrap().unwrap();
            let want = (tile as usize * (d + dv) + 4 * tile as usize) * 4;
            assert_eq!(c.shared_mem_bytes as usize, want, "d = {d}, dv = {dv}");
            assert!(c.shared_mem_bytes <= 48 * 1024, "d = {d}, dv = {dv}");
            assert_eq!(tile, if d.max(dv) <= 128 { 32 } else { 16 });
        }
        // Very long sequences fit in grid.x.
        assert_eq!(
            geometry("f", 1 << 24, 64, 128, 128)
                .unwrap()
                .unwrap()
                .0
                .grid_dim
                .0,
            1 << 22
        );
        assert!(geometry("f", 0, 8, 64, 64).unwrap().is_none());
        for (d, dv, bh) in [
            (0, 8, 1),
            (257, 8, 1),
            (8, 0, 1),
            (8, 257, 1),
            (64, 64, 70_000),
        ] {
            let e = geometry("flash_fwd_block_f32", 8, bh, d, dv)
                .unwrap_err()
                .to_string();
            assert!(e.contains("flash_fwd_block_f32"), "{e}");
        }
    }
}

#[cfg(test)]
mod drop_tests {
    use super::*;

    /// The kernel's dropout arguments are the host key's: none gives threshold 0 (every
    /// probability kept at scale 1); p = 0.25 gives round(0.25 x 2^32) = 2^30 and 4/3.
    #[test]
    fn dropout_arguments_carry_the_host_key() {
        assert_eq!(AttnDropArgs::of(&None).threshold, 0);
        let d = AttnDropout {
            seed: 0x1234_5678_9abc_def0,
            step: 3,
            layer: 5,
            p: 0.25,
            head0: 6,
            sample0: 7,
            seq: 64,
        };
        let a = AttnDropArgs::of(&Some(d));
        assert_eq!(a.threshold, 1 << 30);
        assert!((a.scale - 4.0 / 3.0).abs() < 1e-7);
        assert_eq!(
            (a.seed, a.step, a.layer, a.head0, a.sample0, a.seq),
            (d.seed, 3, 5, 6, 7, 64)
        );
        // The C struct: 4 u64 then 3 u32 and an f32, 48 bytes.
        assert_eq!(std::mem::size_of::<AttnDropArgs>(), 48);
    }
}
