//! Launches of backend/cuda/ops/heads/heads.cu: MLA's per-head concat of the no-rotary and rotary
//! parts and its backward (CPU twin: cpu/ops/heads.rs).

use crate::backend::cuda::ops::launch::*;
use parsim_plan::DType;

/// The per-head widths (a, b) of `[n, heads, a + b]` from `[n, heads, a]` and `b` holding
/// `b_len` elements (per head, or shared by the heads: `[n, b]`), and whether b is shared;
/// an error naming the rule where the lengths fit neither.
pub fn widths(
    kernel: &str,
    n: usize,
    heads: usize,
    a_len: usize,
    b_len: usize,
    out_len: usize,
) -> Result<(usize, usize, bool), CudaError> {
    let per = n * heads;
    if per == 0 {
        return Ok((0, 0, false));
    }
    let bad = || {
        shape_error(
            kernel,
            format!(
                "lengths a {a_len}, b {b_len}, out {out_len} are not [{n}, {heads}, da], \
                 [{n}, {heads} or 1, db], [{n}, {heads}, da + db]"
            ),
        )
    };
    if a_len % per != 0 || out_len % per != 0 || out_len < a_len {
        return Err(bad());
    }
    let (wa, wb) = (a_len / per, (out_len - a_len) / per);
    if b_len == per * wb {
        Ok((wa, wb, false))
    } else if b_len == n * wb {
        Ok((wa, wb, true))
    } else {
        Err(bad())
    }
}

/// out [n, heads, da + db] from a [n, heads, da] and b ([n, heads, db] or shared [n, db]).
///
/// # Safety
/// `a`, `b`, `out`: the lengths given, of `dtype`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn concat(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    a: (CUdeviceptr, usize),
    b: (CUdeviceptr, usize),
    out: (CUdeviceptr, usize),
    n: usize,
    heads: usize,
) -> Result<(), CudaError> {
    let kn = name("heads_concat", dtype);
    let (da, db, shared) = widths(&kn, n, heads, a.1, b.1, out.1)?;
    launch!(&kn, s, k, maybe grid_stride(u(out.1)); a.0, b.0, out.0, u(n), u32_arg(&kn, "heads", heads)?,
        u32_arg(&kn, "da", da)?, u32_arg(&kn, "db", db)?, i32::from(shared))
}

/// The backward of [`concat`]: da and db from dout (a shared db sums its heads).
///
/// # Safety
/// `dout`, `da`, `db`: the lengths given, of `dtype`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn split(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    dout: (CUdeviceptr, usize),
    da: (CUdeviceptr, usize),
    db: (CUdeviceptr, usize),
    n: usize,
    heads: usize,
) -> Result<(), CudaError> {
    let kn = name("heads_split", dtype);
    let (wa, wb, shared) = widths(&kn, n, heads, da.1, db.1, dout.1)?;
    launch!(&kn, s, k, maybe grid_stride(u(da.1) + u(db.1)); dout.0, da.0, db.0, u(n), u32_arg(&kn, "heads", heads)?,
        u32_arg(&kn, "wa", wa)?, u32_arg(&kn, "wb", wb)?, i32::from(shared))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_tell_per_head_from_shared_and_refuse_the_rest() {
        // n 3, heads 4: a 3*4*2, out 3*4*5 -> db 3 per head (36) or shared (9).
        assert_eq!(widths("k", 3, 4, 24, 36, 60).unwrap(), (2, 3, false));
        assert_eq!(widths("k", 3, 4, 24, 9, 60).unwrap(), (2, 3, true));
        let e = widths("heads_concat_f32", 3, 4, 24, 10, 60).unwrap_err();
        assert!(e.to_string().contains("heads_concat_f32"), "{e}");
        assert!(widths("k", 3, 4, 25, 36, 60).is_err());
        assert!(widths("k", 3, 4, 60, 0, 24).is_err());
        assert_eq!(widths("k", 0, 4, 0, 0, 0).unwrap(), (0, 0, false));
    }
}
