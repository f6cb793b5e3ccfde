//! Attention on the CUDA backend: the block kernels of `backend/cuda/ops/flash/flash.cu`
//! (FlashAttention-2's tiled online softmax, Dao 2023) for the trait's block ops and for
//! whole-sequence attention, which is one block of every position against every position. bf16 at
//! head dims 64 and 128 runs on the tensor-core kernels of `backend/cuda/ops/flash/flash_mma.cu`
//! instead ([`flash_mma::supports`] picks). The causal work each block call reports is counted on
//! the host from the row positions, as the CPU twin counts it.

use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::ops::flash::kernel::{self as flash, Rows};
use crate::backend::cuda::ops::flash::mma::{self as flash_mma, MmaRows};
use crate::backend::cuda::rank::CudaRank;
use crate::backend::ops::*;
use crate::backend::DeviceTensor;
use crate::tracker::Category;
use parsim_plan::DType;

/// Unmasked score elements of a block: per (sequence, query head), the (query, key) pairs
/// with the key's position at or before the query's.
pub fn causal_work(sh: &BlockShape, qpos: &[u32], kpos: &[u32]) -> u64 {
    let mut sorted = kpos.to_vec();
    sorted.sort_unstable();
    let pairs: u64 = qpos
        .iter()
        .map(|&p| sorted.partition_point(|&k| k <= p) as u64)
        .sum();
    pairs * sh.b as u64 * sh.hq as u64
}

/// The block shape of a whole-sequence attention.
pub fn block_shape(sh: &AttnShape) -> BlockShape {
    sh.block()
}

/// Running statistics of one forward: acc [b, rows, hq, dv], max and sum [b, hq, rows], f32.
pub struct Running {
    pub acc: CudaTensor,
    pub max: CudaTensor,
    pub sum: CudaTensor,
}

impl Running {
    /// Fresh statistics (acc 0, max -inf, sum 0).
    pub fn new(r: &CudaRank, sh: &BlockShape, rows: usize) -> Result<Running, CudaError> {
        let stats = sh.b * sh.hq * rows;
        let acc = r.temp(DType::F32, stats * sh.dv)?;
        let mut max = r.temp(DType::F32, stats)?;
        let sum = r.temp(DType::F32, stats)?;
        fill(r, &mut max, f32::NEG_INFINITY)?;
        Ok(Running { acc, max, sum })
    }
}

/// Every element of `t` set to `value`.
pub fn fill(r: &CudaRank, t: &mut CudaTensor, value: f32) -> Result<(), CudaError> {
    // SAFETY: `t` holds t.len() elements of its dtype.
    unsafe {
        crate::backend::cuda::ops::elementwise::kernel::fill(
            r.s(),
            r.k(),
            t.dtype(),
            t.ptr_at(0),
            value,
            t.len(),
        )
    }
}

/// Positions and their group ranges of one side on the device (the tensor-core kernels'
/// rows); the two temporaries must outlive the launch.
fn mma_rows(r: &CudaRank, pos: &[u32]) -> Result<(MmaRows, [CudaTensor; 2]), CudaError> {
    let (p, g) = (r.upload_u32(pos)?, r.upload_u32(&flash_mma::ranges(pos))?);
    let rows = MmaRows {
        pos: p.ptr_at(0),
        ranges: g.ptr_at(0),
        len: pos.len(),
    };
    Ok((rows, [p, g]))
}

/// One forward block on device addresses of dtype `dt` (q, k, v) into `run`.
#[allow(clippy::too_many_arguments)]
pub fn forward_block(
    r: &CudaRank,
    dt: DType,
    sh: &BlockShape,
    q: u64,
    qpos: &[u32],
    k: u64,
    v: u64,
    kpos: &[u32],
    acc: u64,
    max: u64,
    sum: u64,
) -> Result<u64, CudaError> {
    if flash_mma::supports(dt, sh, &[q, k, v], &[acc]) {
        let ((qs, _qt), (ks, _kt)) = (mma_rows(r, qpos)?, mma_rows(r, kpos)?);
        // SAFETY: as below; the alignments were checked by `supports`.
        unsafe { flash_mma::forward_block(r.s(), r.k(), sh, q, qs, k, v, ks, acc, max, sum) }?;
        return Ok(causal_work(sh, qpos, kpos));
    }
    let (qp, kp) = (r.upload_u32(qpos)?, r.upload_u32(kpos)?);
    let qs = Rows {
        pos: qp.ptr_at(0),
        len: qpos.len(),
    };
    let ks = Rows {
        pos: kp.ptr_at(0),
        len: kpos.len(),
    };
    // SAFETY: the callers pass tensors of the shapes the wrapper names, of dtype `dt`
    // (q, k, v) and f32 (acc, max, sum).
    unsafe { flash::forward_block(r.s(), r.k(), dt, sh, q, qs, k, v, ks, acc, max, sum) }?;
    Ok(causal_work(sh, qpos, kpos))
}

/// Device addresses of one backward block: inputs of dtype `dt` (q, k, v, dout), f32 lse
/// [b, hq, sq] and delta [b, sq, hq], f32 gradients added to.
pub struct BwdBuffers {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub dout: u64,
    pub lse: u64,
    pub delta: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
}

/// One backward block (queries at `qpos` against keys at `kpos`) on the tensor-core kernels
/// where they apply, else on backend/cuda/ops/flash/flash.cu; returns the causal work.
pub fn backward_block(
    r: &CudaRank,
    dt: DType,
    sh: &BlockShape,
    qpos: &[u32],
    kpos: &[u32],
    b: &BwdBuffers,
) -> Result<u64, CudaError> {
    let bf16 = [b.q, b.k, b.v, b.dout];
    if flash_mma::supports(dt, sh, &bf16, &[b.dq, b.dk, b.dv]) {
        let ((qs, _qt), (ks, _kt)) = (mma_rows(r, qpos)?, mma_rows(r, kpos)?);
        // SAFETY: the callers pass buffers of the shapes BwdBuffers names; alignments checked.
        unsafe {
            flash_mma::backward_block(
                r.s(),
                r.k(),
                sh,
                b.q,
                qs,
                b.k,
                b.v,
                ks,
                b.dout,
                b.lse,
                b.delta,
                b.dq,
                b.dk,
                b.dv,
            )
        }?;
        return Ok(causal_work(sh, qpos, kpos));
    }
    let (qp, kp) = (r.upload_u32(qpos)?, r.upload_u32(kpos)?);
    let rows = |t: &CudaTensor, len| Rows {
        pos: t.ptr_at(0),
        len,
    };
    // SAFETY: the callers pass buffers of the shapes BwdBuffers names.
    unsafe {
        flash::backward_block(
            r.s(),
            r.k(),
            dt,
            sh,
            b.q,
            rows(&qp, qpos.len()),
            b.k,
            b.v,
            rows(&kp, kpos.len()),
            b.dout,
            b.lse,
            b.delta,
            b.dq,
            b.dk,
            b.dv,
        )
    }?;
    Ok(causal_work(sh, qpos, kpos))
}

/// Whole-sequence forward: o (f32, normalised) and lse, from q, k, v of dtype `dt`.
fn forward_whole(
    r: &CudaRank,
    sh: &AttnShape,
    dt: DType,
    q: u64,
    k: u64,
    v: u64,
) -> Result<(CudaTensor, CudaTensor), CudaError> {
    let bs = block_shape(sh);
    let pos: Vec<u32> = (0..sh.s as u32).collect();
    let run = Running::new(r, &bs, sh.s)?;
    let (acc, max, sum) = (run.acc.ptr_at(0), run.max.ptr_at(0), run.sum.ptr_at(0));
    forward_block(r, dt, &bs, q, &pos, k, v, &pos, acc, max, sum)?;
    let lse = r.temp(DType::F32, sh.b * sh.heads * sh.s)?;
    // SAFETY: shapes as allocated above.
    unsafe { flash::finish(r.s(), r.k(), &bs, sh.s, acc, max, sum, lse.ptr_at(0)) }?;
    Ok((run.acc, lse))
}

/// Causal attention forward over whole sequences; keeps the log-sum-exp for `Probs` too
/// (the GPU never materialises the s x s softmax; backward recomputes from the LSE).
pub fn attn_fwd(
    r: &CudaRank,
    sh: &AttnShape,
    q: &CudaTensor,
    k: &CudaTensor,
    v: &CudaTensor,
    o: &mut CudaTensor,
    keep: Keep,
) -> Result<AttnSaved<CudaTensor>, CudaError> {
    let dt = q.dtype();
    let (ks, vs) = (r.input(k, dt)?, r.input(v, dt)?);
    let (acc, lse) = forward_whole(r, sh, dt, q.ptr_at(0), ks.ptr, vs.ptr)?;
    r.convert(acc.ptr_at(0), DType::F32, o.ptr_at(0), o.dtype(), o.len())?;
    Ok(match keep {
        Keep::Nothing => AttnSaved::None,
        Keep::Lse | Keep::Probs => AttnSaved::Lse(lse.recat(Category::Activations)),
    })
}

/// Gradient buffers of a backward: dq [b, s, hq, d], dk [b, s, hk, d], dv [b, s, hk, dv], f32.
struct Grads {
    dq: CudaTensor,
    dk: CudaTensor,
    dv: CudaTensor,
}

/// Causal attention backward (FlashAttention-2): the forward output is recomputed (the trait
/// passes no o), then D = rowsum(dO * O) and the block backward; dq, dk, dv are written.
pub fn attn_bwd(
    r: &CudaRank,
    sh: &AttnShape,
    Qkv { q, k, v }: Qkv<'_, CudaTensor>,
    dout: &CudaTensor,
    QkvGrads { dq, dk, dv }: QkvGrads<'_, CudaTensor>,
) -> Result<(), CudaError> {
    let dt = q.dtype();
    let bs = block_shape(sh);
    let (ks, vs, ds) = (r.input(k, dt)?, r.input(v, dt)?, r.input(dout, dt)?);
    let (o, lse) = forward_whole(r, sh, dt, q.ptr_at(0), ks.ptr, vs.ptr)?;
    let delta = r.temp(DType::F32, sh.b * sh.s * sh.heads)?;
    // SAFETY: shapes as allocated.
    unsafe {
        flash::delta(
            r.s(),
            r.k(),
            dt,
            &bs,
            sh.s,
            ds.ptr,
            o.ptr_at(0),
            delta.ptr_at(0),
        )
    }?;
    let g = Grads {
        dq: r.temp(DType::F32, q.len())?,
        dk: r.temp(DType::F32, k.len())?,
        dv: r.temp(DType::F32, v.len())?,
    };
    let pos: Vec<u32> = (0..sh.s as u32).collect();
    let bufs = BwdBuffers {
        q: q.ptr_at(0),
        k: ks.ptr,
        v: vs.ptr,
        dout: ds.ptr,
        lse: lse.ptr_at(0),
        delta: delta.ptr_at(0),
        dq: g.dq.ptr_at(0),
        dk: g.dk.ptr_at(0),
        dv: g.dv.ptr_at(0),
    };
    backward_block(r, dt, &bs, &pos, &pos, &bufs)?;
    for (src, dst) in [(&g.dq, dq), (&g.dk, dk), (&g.dv, dv)] {
        r.convert(
            src.ptr_at(0),
            DType::F32,
            dst.ptr_at(0),
            dst.dtype(),
            dst.len(),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::ops::flash as cpu_flash;

    #[test]
    fn causal_work_of_a_whole_sequence_is_the_triangle() {
        // Every position against every position: s(s+1)/2 pairs per (sequence, head).
        let sh = BlockShape {
            b: 2,
            hq: 3,
            hk: 1,
            d: 4,
            dv: 4,
            dropout: None,
            span: parsim_plan::plan::AttnSpan::Full,
        };
        let pos: Vec<u32> = (0..7).collect();
        assert_eq!(causal_work(&sh, &pos, &pos), 2 * 3 * 7 * 8 / 2);
        // A later key block is invisible, an earlier one wholly visible.
        assert_eq!(causal_work(&sh, &[0, 1], &[5, 6]), 0);
        assert_eq!(causal_work(&sh, &[5, 6], &[0, 1]), 2 * 3 * 4);
    }

    #[test]
    fn causal_work_matches_the_cpu_twins_count_on_zigzag_positions() {
        // The zigzag layout of context parallelism: rows 0..2 and 6..8 against keys 2..6.
        let sh = BlockShape {
            b: 1,
            hq: 2,
            hk: 1,
            d: 2,
            dv: 2,
            dropout: None,
            span: parsim_plan::plan::AttnSpan::Full,
        };
        let (qpos, kpos) = ([0u32, 1, 6, 7], [2u32, 3, 4, 5]);
        let (sq, sk) = (qpos.len(), kpos.len());
        let q = vec![0.1f32; sq * sh.hq * sh.d];
        let k = vec![0.2f32; sk * sh.hk * sh.d];
        let mut acc = vec![0.0f32; sq * sh.hq * sh.d];
        let mut max = vec![f32::NEG_INFINITY; sq * sh.hq];
        let mut sum = vec![0.0f32; sq * sh.hq];
        let mut tile = vec![0.0f32; 64];
        let g = crate::backend::cpu::gemm_counter::GemmCounter::default();
        let cpu = cpu_flash::forward_block(
            &g,
            &sh,
            BlockQuery {
                q: &q,
                side: Side {
                    pos: &qpos,
                    tile: 2,
                },
            },
            (
                &k,
                &k,
                Side {
                    pos: &kpos,
                    tile: 2,
                },
            ),
            &mut acc,
            &mut cpu_flash::Online {
                max: &mut max,
                sum: &mut sum,
            },
            &mut tile,
        );
        assert_eq!(causal_work(&sh, &qpos, &kpos), cpu);
        assert_eq!(cpu, 2 * 2 * 4);
    }
}
