//! The op trait of whole-sequence and block attention for `CudaRank`: each op stages its operands
//! on the rank and launches its kernels.

use super::attn::Running;
use super::{attn, kernel};
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::ops::launch::F32;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::*;
use crate::backend::{DeviceTensor, View, ViewMut};
use crate::error::ExecError;
use parsim_plan::plan::AttnSpan;

/// The CUDA kernels mask causally only: a sliding window or chunk is refused by name (the
/// run refuses it before it starts, `runner::cuda`; this guards direct calls).
fn full_span(span: AttnSpan) -> Result<(), ExecError> {
    match span {
        AttnSpan::Full => Ok(()),
        AttnSpan::Window(_) => Err(ExecError::Unsupported {
            field: "model.attention.window",
            message: "the CUDA attention kernels do not run sliding-window attention yet; use the CPU backend",
        }),
        AttnSpan::Chunk(_) => Err(ExecError::Unsupported {
            field: "model.attention.chunk",
            message: "the CUDA attention kernels do not run chunked attention yet; use the CPU backend",
        }),
    }
}

/// Attention sinks have no CUDA kernel yet.
fn no_sinks() -> ExecError {
    ExecError::Unsupported {
        field: "model.attention.sinks",
        message: "the CUDA backend does not run attention sinks yet; use the CPU backend",
    }
}

impl CudaRank {
    /// An f32 working copy of `t` when it is not f32 (else an empty marker: `t` is used
    /// directly, see [`CudaRank::addr`]).
    fn take_f32(&self, t: &CudaTensor) -> Result<CudaTensor, CudaError> {
        if t.dtype() == F32 {
            return self.temp(F32, 0);
        }
        let w = self.temp(F32, t.len())?;
        self.convert(t.ptr_at(0), t.dtype(), w.ptr_at(0), F32, t.len())?;
        Ok(w)
    }

    /// The address the kernel writes: the working copy, or `t` itself when it is f32.
    fn addr(&self, work: &CudaTensor, t: &CudaTensor) -> u64 {
        if t.dtype() == F32 {
            t.ptr_at(0)
        } else {
            work.ptr_at(0)
        }
    }

    /// Converts a working copy back into `t` (nothing when `t` was used directly).
    fn give_back(&self, work: CudaTensor, t: &CudaTensor) -> Result<(), CudaError> {
        if t.dtype() != F32 {
            self.convert(work.ptr_at(0), F32, t.ptr_at(0), t.dtype(), t.len())?;
        }
        Ok(())
    }
}

impl AttentionOps<Cuda> for CudaRank {
    fn attn_fwd(
        &self,
        sh: &AttnShape,
        x: Qkv<'_, CudaTensor>,
        o: &mut CudaTensor,
        keep: Keep,
    ) -> Result<AttnSaved<CudaTensor>, ExecError> {
        let (cr, Qkv { q, k, v }) = (self, x);
        full_span(sh.span)?;
        Ok(attn::attn_fwd(cr, sh, q, k, v, o, keep)?)
    }

    fn attn_bwd(
        &self,
        sh: &AttnShape,
        x: Qkv<'_, CudaTensor>,
        _saved: &AttnSaved<CudaTensor>,
        dout: &CudaTensor,
        grads: QkvGrads<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        full_span(sh.span)?;
        Ok(attn::attn_bwd(self, sh, x, dout, grads)?)
    }
}

impl FlashOps<Cuda> for CudaRank {
    fn flash_fwd_block(
        &self,
        sh: &BlockShape,
        query: BlockQuery<'_, CudaTensor>,
        kv: BlockKv<'_, CudaTensor>,
        run: BlockAcc<'_, CudaTensor>,
        _tile: &mut CudaTensor,
    ) -> Result<u64, ExecError> {
        let (cr, BlockQuery { q, side: qs }) = (self, query);
        let (BlockKv { k, v, side: ks }, BlockAcc { acc, max, sum }) = (kv, run);
        full_span(sh.span)?;
        let dt = q.dtype();
        let (kk, vv) = (cr.input_view(&k, dt)?, cr.input_view(&v, dt)?);
        let run = Running {
            acc: cr.take_f32(acc)?,
            max: cr.take_f32(max)?,
            sum: cr.take_f32(sum)?,
        };
        let work = attn::forward_block(
            cr,
            dt,
            sh,
            q.ptr_at(0),
            qs.pos,
            kk.ptr,
            vv.ptr,
            ks.pos,
            cr.addr(&run.acc, acc),
            cr.addr(&run.max, max),
            cr.addr(&run.sum, sum),
        )?;
        cr.give_back(run.acc, acc)?;
        cr.give_back(run.max, max)?;
        cr.give_back(run.sum, sum)?;
        Ok(work)
    }

    fn flash_finish(
        &self,
        sh: &BlockShape,
        rows: usize,
        acc: &mut CudaTensor,
        max: &CudaTensor,
        sum: &CudaTensor,
        lse: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let a = cr.output_at(acc, 0..acc.len(), F32, true)?;
        let (m, s) = (cr.input(max, F32)?, cr.input(sum, F32)?);
        let l = cr.output_at(lse, 0..lse.len(), F32, false)?;
        // SAFETY: acc b x rows x hq x d, the statistics b x hq x rows, f32.
        unsafe { kernel::finish(cr.s(), cr.k(), sh, rows, a.ptr, m.ptr, s.ptr, l.ptr) }?;
        cr.store(a, acc, 0..acc.len())?;
        Ok(cr.store(l, lse, 0..lse.len())?)
    }

    fn flash_delta(
        &self,
        sh: &BlockShape,
        rows: usize,
        dout: &CudaTensor,
        o: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let os = cr.input(o, F32)?;
        let d = cr.output_at(out, 0..out.len(), F32, false)?;
        // SAFETY: dout b x rows x hq x d of its dtype, o the same in f32, out b x rows x hq.
        unsafe {
            kernel::delta(
                cr.s(),
                cr.k(),
                dout.dtype(),
                sh,
                rows,
                dout.ptr_at(0),
                os.ptr,
                d.ptr,
            )
        }?;
        Ok(cr.store(d, out, 0..out.len())?)
    }

    fn attn_sink_fwd(
        &self,
        _sh: &BlockShape,
        _rows: usize,
        _o: &mut CudaTensor,
        _lse: &mut CudaTensor,
        _sinks: View<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        Err(no_sinks())
    }

    fn attn_sink_grad(
        &self,
        _sh: &BlockShape,
        _rows: usize,
        _lse: &CudaTensor,
        _delta: &CudaTensor,
        _sinks: View<'_, CudaTensor>,
        _dsinks: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        Err(no_sinks())
    }

    fn flash_bwd_block(
        &self,
        sh: &BlockShape,
        query: BlockQuery<'_, CudaTensor>,
        kv: BlockKv<'_, CudaTensor>,
        stats: BlockStats<'_, CudaTensor>,
        grads: BlockGrads<'_, CudaTensor>,
        _tiles: (&mut CudaTensor, &mut CudaTensor),
    ) -> Result<u64, ExecError> {
        let (cr, BlockQuery { q, side: qs }) = (self, query);
        let (BlockKv { k, v, side: ks }, BlockStats { dout, lse, delta }) = (kv, stats);
        let BlockGrads { dq, dk, dv } = grads;
        full_span(sh.span)?;
        let dt = q.dtype();
        let (kk, vv) = (cr.input_view(&k, dt)?, cr.input_view(&v, dt)?);
        let ds = cr.input(dout, dt)?;
        let (ls, de) = (cr.input(lse, F32)?, cr.input(delta, F32)?);
        let (rk, rv) = (dk.range.clone(), dv.range.clone());
        let gq = cr.output_at(dq, 0..dq.len(), F32, true)?;
        let gk = cr.output_at(dk.tensor, rk.clone(), F32, true)?;
        let gv = cr.output_at(dv.tensor, rv.clone(), F32, true)?;
        let bufs = attn::BwdBuffers {
            q: q.ptr_at(0),
            k: kk.ptr,
            v: vv.ptr,
            dout: ds.ptr,
            lse: ls.ptr,
            delta: de.ptr,
            dq: gq.ptr,
            dk: gk.ptr,
            dv: gv.ptr,
        };
        let work = attn::backward_block(cr, dt, sh, qs.pos, ks.pos, &bufs)?;
        cr.store(gq, dq, 0..dq.len())?;
        cr.store(gk, dk.tensor, rk)?;
        cr.store(gv, dv.tensor, rv)?;
        Ok(work)
    }
}
