//! Launches of backend/cuda/ops/ulysses/ulysses.cu: DeepSpeed-Ulysses pack and unpack (CPU twin:
//! cpu/ops/ulysses.rs), one launch per part at the part's offset inside each chunk.

use crate::backend::cuda::ops::launch::*;
use crate::backend::ops::*;

use parsim_plan::DType;

/// Offsets of each part inside a chunk, and the chunk's length (the CPU's `chunk`).
pub fn part_offsets(g: &UlyssesGeo, parts: &[UlyssesPart]) -> (Vec<usize>, usize) {
    g.part_offsets(parts)
}

#[allow(clippy::too_many_arguments)]
unsafe fn copy(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    g: &UlyssesGeo,
    layout: UlyssesLayout,
    xs: &[(CUdeviceptr, UlyssesPart)],
    buf: CUdeviceptr,
    unpack: bool,
) -> Result<(), CudaError> {
    let kn = name("ulysses_copy", dtype);
    let parts: Vec<UlyssesPart> = xs.iter().map(|x| x.1).collect();
    if g.cp == 0 || parts.iter().any(|p| p.heads % g.cp != 0) {
        return Err(shape_error(
            &kn,
            format!("every part's heads must be a multiple of cp = {}", g.cp),
        ));
    }
    let (offs, chunk) = part_offsets(g, &parts);
    let lay = i32::from(layout == UlyssesLayout::Head);
    let un = i32::from(unpack);
    for ((x, p), off) in xs.iter().zip(offs) {
        let Some(cfg) = grid_stride(u(g.cp) * u(g.b) * u(g.s_loc) * u(p.heads / g.cp) * u(p.e))
        else {
            continue;
        };
        let (bb, sl, cp, hh, e, po, ch) = (
            u(g.b),
            u(g.s_loc),
            u(g.cp),
            u(p.heads),
            u(p.e),
            u(off),
            u(chunk),
        );
        launch!(&kn, s, k, cfg; *x, buf, bb, sl, cp, hh, e, po, ch, lay, un)?;
    }
    Ok(())
}

/// Tensors on side `from` -> the send chunks in `buf`.
///
/// # Safety
/// Each tensor holds its part's elements on that side, `buf` the whole chunk buffer, in `dtype`.
pub unsafe fn pack(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    g: &UlyssesGeo,
    from: UlyssesLayout,
    xs: &[(CUdeviceptr, UlyssesPart)],
    buf: CUdeviceptr,
) -> Result<(), CudaError> {
    // SAFETY: forwarded from this function's own contract.
    unsafe { copy(s, k, dtype, g, from, xs, buf, false) }
}

/// The received chunks in `buf` -> tensors on side `to`.
///
/// # Safety
/// As [`pack`].
pub unsafe fn unpack(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    g: &UlyssesGeo,
    to: UlyssesLayout,
    buf: CUdeviceptr,
    outs: &[(CUdeviceptr, UlyssesPart)],
) -> Result<(), CudaError> {
    // SAFETY: forwarded from this function's own contract.
    unsafe { copy(s, k, dtype, g, to, outs, buf, true) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_offsets_tile_the_chunk_like_the_cpu_walk() {
        // CPU: chunk = sum_p b * s_loc * heads_p / cp * e_p.
        let g = UlyssesGeo {
            b: 2,
            s_loc: 3,
            cp: 2,
        };
        let parts = [
            UlyssesPart { heads: 4, e: 2 },
            UlyssesPart { heads: 2, e: 1 },
        ];
        let (offs, chunk) = part_offsets(&g, &parts);
        assert_eq!(offs, vec![0, 2 * 3 * 2 * 2]);
        assert_eq!(chunk, 24 + 2 * 3);
        // cp chunks hold every element of every part exactly once.
        assert_eq!(chunk * g.cp, 2 * 3 * 4 * 2 + 2 * 3 * 2);
    }
}
