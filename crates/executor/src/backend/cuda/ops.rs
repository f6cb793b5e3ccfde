//! [`TensorOps`] on the CUDA backend: every op is one or more launches of the typed wrappers
//! of `launch/` (or cuBLASLt for the linear layers) on the rank's compute stream, with the
//! operands staged to the kernel's dtype by [`CudaRank`]'s helpers. Host metadata (tokens,
//! positions, routes) is uploaded as small index arrays; the only host reads are the loss
//! rows of `ce_loss` and the routers' n x k chosen experts and gates (routing.rs: the
//! capacity's drops are host metadata, as the split sizes of the dispatch all-to-all are on
//! the host for NCCL too).

use super::attn::{self, Running};
use super::error::CudaError;
use super::launch::{
    activation, adam, cross_entropy as ce, elementwise, embedding, flash, moe, norm, rotary,
    ulysses,
};
use super::matmul::LinearOp;
use super::mla_dropout;
use super::rank::{Cuda, CudaRank};
use super::routing;
use super::tensor::CudaTensor;
use crate::backend::{
    AttnSaved, AttnShape, BlockShape, DType, DeviceTensor, Keep, Route, Routing, Side, TensorOps,
    UlyssesGeo, UlyssesLayout, UlyssesPart, View, ViewMut,
};
use crate::error::ExecError;
use crate::plan::{Activation, AdamConfig, MoeShape, Norm};
use cudarc::driver::sys;

const F32: DType = DType::F32;

impl CudaRank {
    /// One GEMM of the linear layer: operands at `od` (the activation's dtype), the output
    /// staged to f32 where the operands are f32 and the output bf16 (cuBLASLt takes bf16
    /// output only from bf16 inputs).
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        op: LinearOp,
        dims: (usize, usize, usize),
        od: DType,
        x: u64,
        w: u64,
        dy: u64,
        out: &CudaTensor,
        range: std::ops::Range<usize>,
        acc: bool,
    ) -> Result<(), CudaError> {
        let want = if od == F32 { F32 } else { out.dtype() };
        let o = self.output_at(out, range.clone(), want, acc)?;
        let ev = self.gemm_begin()?;
        self.dev.linear(op, dims, x, w, dy, od, o.ptr, want, acc)?;
        self.gemm_end(ev)?;
        self.store(o, out, range)
    }

    /// Column blocks of rows: dst[:, dst_col..+width] = src[:, src_col..+width] over `n` rows
    /// of one dtype (`cuMemcpy2DAsync`, the fused projection's split and merge).
    #[allow(clippy::too_many_arguments)]
    fn copy_cols(
        &self,
        src: u64,
        src_cols: usize,
        src_col: usize,
        dst: u64,
        dst_cols: usize,
        dst_col: usize,
        width: usize,
        n: usize,
        dt: DType,
    ) -> Result<(), CudaError> {
        if width == 0 || n == 0 {
            return Ok(());
        }
        let es = dt.size_bytes() as usize;
        let p = memcpy_2d(
            src,
            src_cols * es,
            src_col * es,
            dst,
            dst_cols * es,
            dst_col * es,
            width * es,
            n,
        );
        // SAFETY: both buffers hold n rows of their pitch.
        unsafe { sys::cuMemcpy2DAsync_v2(&p, self.s().cu_stream()) }
            .result()
            .map_err(super::context::drv("cuMemcpy2DAsync"))
    }
}

/// The descriptor of a device-to-device 2-D copy: `height` rows of `width_bytes` from column
/// byte `src_x` of rows `src_pitch` apart to column byte `dst_x` of rows `dst_pitch` apart.
/// Built field by field: `CUmemorytype` has no zero value, so a zeroed descriptor is invalid.
#[allow(clippy::too_many_arguments)]
fn memcpy_2d(
    src: u64,
    src_pitch: usize,
    src_x: usize,
    dst: u64,
    dst_pitch: usize,
    dst_x: usize,
    width_bytes: usize,
    height: usize,
) -> sys::CUDA_MEMCPY2D {
    sys::CUDA_MEMCPY2D {
        srcXInBytes: src_x,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: dst_x,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width_bytes,
        Height: height,
    }
}

impl TensorOps<Cuda> for CudaRank {
    fn linear_fwd(
        &self,
        x: &CudaTensor,
        w: View<'_, CudaTensor>,
        dims: (usize, usize, usize),
        y: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let od = x.dtype();
        let ws = self.input_view(&w, od)?;
        let r = 0..y.len();
        Ok(self.gemm(LinearOp::Fwd, dims, od, x.ptr_at(0), ws.ptr, 0, y, r, false)?)
    }

    fn linear_dgrad(
        &self,
        dy: &CudaTensor,
        w: View<'_, CudaTensor>,
        dims: (usize, usize, usize),
        dx: &mut CudaTensor,
        acc: bool,
    ) -> Result<(), ExecError> {
        let od = dy.dtype();
        let ws = self.input_view(&w, od)?;
        let r = 0..dx.len();
        Ok(self.gemm(
            LinearOp::Dgrad,
            dims,
            od,
            0,
            ws.ptr,
            dy.ptr_at(0),
            dx,
            r,
            acc,
        )?)
    }

    fn linear_wgrad(
        &self,
        dy: &CudaTensor,
        x: &CudaTensor,
        dims: (usize, usize, usize),
        dw: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let od = dy.dtype();
        let xs = self.input(x, od)?;
        let r = dw.range.clone();
        Ok(self.gemm(
            LinearOp::Wgrad,
            dims,
            od,
            xs.ptr,
            0,
            dy.ptr_at(0),
            dw.tensor,
            r,
            true,
        )?)
    }

    fn norm_fwd(
        &self,
        kind: Norm,
        x: &CudaTensor,
        p: View<'_, CudaTensor>,
        eps: f32,
        y: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let dt = x.dtype();
        let ps = self.input_view(&p, F32)?;
        let ys = self.output_at(y, 0..y.len(), dt, false)?;
        let ln = kind == Norm::LayerNorm;
        // SAFETY: x and y hold rows x cols of dt, p the gain (and bias) in f32.
        unsafe {
            norm::norm_fwd(
                self.s(),
                self.k(),
                dt,
                ln,
                x.ptr_at(0),
                ps.ptr,
                ys.ptr,
                x.rows(),
                x.cols(),
                eps,
            )
        }?;
        Ok(self.store(ys, y, 0..y.len())?)
    }

    fn norm_dgrad(
        &self,
        kind: Norm,
        x: &CudaTensor,
        p: View<'_, CudaTensor>,
        dy: &CudaTensor,
        eps: f32,
        dx: &mut CudaTensor,
        acc: bool,
    ) -> Result<(), ExecError> {
        let dt = x.dtype();
        let ps = self.input_view(&p, F32)?;
        let dys = self.input(dy, dt)?;
        let dxs = self.output_at(dx, 0..dx.len(), dt, acc)?;
        let ln = kind == Norm::LayerNorm;
        // SAFETY: as norm_fwd, dy and dx like x.
        unsafe {
            norm::norm_dgrad(
                self.s(),
                self.k(),
                dt,
                ln,
                x.ptr_at(0),
                ps.ptr,
                dys.ptr,
                dxs.ptr,
                x.rows(),
                x.cols(),
                eps,
                acc,
            )
        }?;
        Ok(self.store(dxs, dx, 0..dx.len())?)
    }

    fn norm_wgrad(
        &self,
        kind: Norm,
        x: &CudaTensor,
        dy: &CudaTensor,
        eps: f32,
        dp: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let dt = x.dtype();
        let dys = self.input(dy, dt)?;
        let r = dp.range.clone();
        let dps = self.output_at(dp.tensor, r.clone(), F32, true)?;
        let ln = kind == Norm::LayerNorm;
        // SAFETY: x, dy rows x cols of dt; dp the parameter gradient in f32 (added to).
        unsafe {
            norm::norm_wgrad(
                self.s(),
                self.k(),
                dt,
                ln,
                x.ptr_at(0),
                dys.ptr,
                dps.ptr,
                x.rows(),
                x.cols(),
                eps,
            )
        }?;
        Ok(self.store(dps, dp.tensor, r)?)
    }

    fn rotary(
        &self,
        x: &mut CudaTensor,
        heads: usize,
        positions: &[u32],
        theta: f32,
        inverse: bool,
    ) -> Result<(), ExecError> {
        let (rows, d) = (x.rows(), x.cols() / heads.max(1));
        let pos = self.upload_u32(positions)?;
        // SAFETY: x holds rows x heads x d of its dtype; pos positions.len() u32.
        Ok(unsafe {
            rotary::rotary(
                self.s(),
                self.k(),
                x.dtype(),
                x.ptr_at(0),
                rows,
                heads,
                d,
                pos.ptr_at(0),
                positions.len(),
                theta,
                inverse,
            )
        }?)
    }

    fn act_fwd(
        &self,
        kind: Activation,
        u: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let dt = out.dtype();
        let us = self.input(u, dt)?;
        let (n, f) = (out.rows(), out.cols());
        // SAFETY: u holds n x (f or 2f), out n x f, of dt.
        Ok(unsafe {
            activation::act_fwd(self.s(), self.k(), dt, kind, us.ptr, out.ptr_at(0), n, f)
        }?)
    }

    fn act_bwd_inplace(
        &self,
        kind: Activation,
        u: &mut CudaTensor,
        dout: &CudaTensor,
    ) -> Result<(), ExecError> {
        let dt = u.dtype();
        let ds = self.input(dout, dt)?;
        let du = self.temp(dt, u.len())?;
        let (n, f) = (dout.rows(), dout.cols());
        // SAFETY: u and du hold n x (f or 2f), dout n x f, of dt.
        unsafe {
            activation::act_bwd(
                self.s(),
                self.k(),
                dt,
                kind,
                u.ptr_at(0),
                ds.ptr,
                du.ptr_at(0),
                n,
                f,
            )
        }?;
        Ok(self.convert(du.ptr_at(0), dt, u.ptr_at(0), dt, u.len())?)
    }

    fn add(&self, a: &CudaTensor, b: &CudaTensor, out: &mut CudaTensor) -> Result<(), ExecError> {
        let dt = out.dtype();
        let (sa, sb) = (self.input(a, dt)?, self.input(b, dt)?);
        // SAFETY: three buffers of out.len() elements of dt.
        Ok(unsafe {
            elementwise::add(
                self.s(),
                self.k(),
                dt,
                sa.ptr,
                sb.ptr,
                out.ptr_at(0),
                out.len(),
            )
        }?)
    }

    /// y[n, o] += ones[n, 1] . b[1, o]: a rank-1 GEMM through cuBLASLt (no kernel of its own).
    fn bias_add(&self, y: &mut CudaTensor, b: View<'_, CudaTensor>) -> Result<(), ExecError> {
        let o = b.range.len();
        let n = y.len() / o.max(1);
        let ones = crate::backend::Device::upload(
            self,
            crate::tracker::Category::Buffers,
            y.dtype(),
            &[n, 1],
            &vec![1.0; n],
        )?;
        self.linear_dgrad(&ones, b, (n, o, 1), y, true)
    }

    /// db[o, 1] += dy[n, o]^T . ones[n, 1]: the column sums as a GEMM through cuBLASLt.
    fn bias_grad(&self, dy: &CudaTensor, db: ViewMut<'_, CudaTensor>) -> Result<(), ExecError> {
        let o = db.range.len();
        let n = dy.len() / o.max(1);
        let ones = crate::backend::Device::upload(
            self,
            crate::tracker::Category::Buffers,
            dy.dtype(),
            &[n, 1],
            &vec![1.0; n],
        )?;
        self.linear_wgrad(dy, &ones, (n, 1, o), db)
    }

    fn axpy(
        &self,
        alpha: f32,
        x: View<'_, CudaTensor>,
        y: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let dt = y.tensor.dtype();
        let xs = self.input_view(&x, dt)?;
        // SAFETY: both views hold y.len() elements of dt.
        Ok(unsafe {
            elementwise::axpy(
                self.s(),
                self.k(),
                dt,
                alpha,
                xs.ptr,
                y.tensor.ptr_at(y.range.start),
                y.len(),
            )
        }?)
    }

    fn copy(
        &self,
        src: View<'_, CudaTensor>,
        dst: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        crate::backend::check_copy(src.len(), dst.len())?;
        Ok(self.convert(
            src.tensor.ptr_at(src.range.start),
            src.tensor.dtype(),
            dst.tensor.ptr_at(dst.range.start),
            dst.tensor.dtype(),
            src.len(),
        )?)
    }

    fn qkv_split(
        &self,
        qkv: &CudaTensor,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        v: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let (n, c) = (qkv.rows(), qkv.cols());
        let mut col = 0;
        for t in [q, k, v] {
            let src = self.input(qkv, t.dtype())?;
            let w = t.cols();
            self.copy_cols(src.ptr, c, col, t.ptr_at(0), w, 0, w, n, t.dtype())?;
            col += w;
        }
        Ok(())
    }

    fn qkv_merge(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        qkv: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let (n, c, dt) = (qkv.rows(), qkv.cols(), qkv.dtype());
        let mut col = 0;
        for t in [q, k, v] {
            let src = self.input(t, dt)?;
            let w = t.cols();
            self.copy_cols(src.ptr, w, 0, qkv.ptr_at(0), c, col, w, n, dt)?;
            col += w;
        }
        Ok(())
    }

    fn embedding_gather(
        &self,
        table: View<'_, CudaTensor>,
        tokens: &[u32],
        lo: usize,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let (dt, h) = (out.dtype(), out.cols());
        let ts = self.input_view(&table, dt)?;
        let tok = self.upload_u32(tokens)?;
        let rows = table.len() / h.max(1);
        // SAFETY: the table holds rows x h, out tokens.len() x h, of dt.
        Ok(unsafe {
            embedding::embedding_gather(
                self.s(),
                self.k(),
                dt,
                ts.ptr,
                rows,
                tok.ptr_at(0),
                tokens.len(),
                lo,
                h,
                out.ptr_at(0),
            )
        }?)
    }

    fn embedding_scatter_add(
        &self,
        dy: &CudaTensor,
        tokens: &[u32],
        lo: usize,
        grad: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        let h = dy.cols();
        let tok = self.upload_u32(tokens)?;
        let r = grad.range.clone();
        let gs = self.output_at(grad.tensor, r.clone(), F32, true)?;
        // SAFETY: dy holds tokens.len() x h of its dtype, the gradient rows x h f32.
        unsafe {
            embedding::embedding_scatter_add(
                self.s(),
                self.k(),
                dy.dtype(),
                dy.ptr_at(0),
                tok.ptr_at(0),
                tokens.len(),
                lo,
                h,
                gs.ptr,
                r.len() / h.max(1),
            )
        }?;
        Ok(self.store(gs, grad.tensor, r)?)
    }

    fn ce_row_max(&self, logits: &CudaTensor, max: &mut CudaTensor) -> Result<(), ExecError> {
        let ms = self.output_at(max, 0..max.len(), F32, false)?;
        // SAFETY: logits n x v of their dtype, max n f32.
        unsafe {
            ce::ce_row_max(
                self.s(),
                self.k(),
                logits.dtype(),
                logits.ptr_at(0),
                logits.rows(),
                logits.cols(),
                ms.ptr,
            )
        }?;
        Ok(self.store(ms, max, 0..max.len())?)
    }

    fn ce_exp(
        &self,
        logits: &CudaTensor,
        max: &CudaTensor,
        probs: &mut CudaTensor,
        sum: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let ms = self.input(max, F32)?;
        let ps = self.output_at(probs, 0..probs.len(), F32, false)?;
        let ss = self.output_at(sum, 0..sum.len(), F32, false)?;
        // SAFETY: logits n x v of their dtype; probs n x v, max and sum n, f32.
        unsafe {
            ce::ce_exp_rows(
                self.s(),
                self.k(),
                logits.dtype(),
                logits.ptr_at(0),
                logits.rows(),
                logits.cols(),
                ms.ptr,
                ps.ptr,
                ss.ptr,
            )
        }?;
        self.store(ps, probs, 0..probs.len())?;
        Ok(self.store(ss, sum, 0..sum.len())?)
    }

    fn ce_target_logit(
        &self,
        logits: &CudaTensor,
        targets: &[u32],
        lo: usize,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let t = self.upload_u32(targets)?;
        let os = self.output_at(out, 0..out.len(), F32, false)?;
        // SAFETY: logits n x v of their dtype, targets n u32, out n f32.
        unsafe {
            ce::ce_target_logit(
                self.s(),
                self.k(),
                logits.dtype(),
                logits.ptr_at(0),
                logits.rows(),
                logits.cols(),
                t.ptr_at(0),
                lo,
                os.ptr,
            )
        }?;
        Ok(self.store(os, out, 0..out.len())?)
    }

    fn ce_loss(
        &self,
        probs: &mut CudaTensor,
        sum: &CudaTensor,
        max: &CudaTensor,
        target_logit: &CudaTensor,
    ) -> Result<f64, ExecError> {
        let n = probs.rows();
        let ps = self.output_at(probs, 0..probs.len(), F32, true)?;
        let (ss, ms, ts) = (
            self.input(sum, F32)?,
            self.input(max, F32)?,
            self.input(target_logit, F32)?,
        );
        let rows = self.temp(F32, n)?;
        // SAFETY: probs n x v, the others n, f32.
        unsafe {
            ce::ce_loss(
                self.s(),
                self.k(),
                ps.ptr,
                n,
                probs.cols(),
                ss.ptr,
                ms.ptr,
                ts.ptr,
                rows.ptr_at(0),
            )
        }?;
        self.store(ps, probs, 0..probs.len())?;
        let host = self.dev.download(View::all(&rows))?;
        Ok(host.iter().map(|&x| x as f64).sum())
    }

    fn ce_grad(
        &self,
        probs: &mut CudaTensor,
        targets: &[u32],
        lo: usize,
        scale: f32,
    ) -> Result<(), ExecError> {
        let t = self.upload_u32(targets)?;
        let ps = self.output_at(probs, 0..probs.len(), F32, true)?;
        // SAFETY: probs n x v f32, targets n u32.
        unsafe {
            ce::ce_grad(
                self.s(),
                self.k(),
                ps.ptr,
                probs.rows(),
                probs.cols(),
                t.ptr_at(0),
                lo,
                scale,
            )
        }?;
        Ok(self.store(ps, probs, 0..probs.len())?)
    }

    fn attn_fwd(
        &self,
        sh: &AttnShape,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        o: &mut CudaTensor,
        keep: Keep,
    ) -> Result<AttnSaved<CudaTensor>, ExecError> {
        Ok(attn::attn_fwd(self, sh, q, k, v, o, keep)?)
    }

    fn attn_bwd(
        &self,
        sh: &AttnShape,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        _saved: &AttnSaved<CudaTensor>,
        dout: &CudaTensor,
        dq: &mut CudaTensor,
        dk: &mut CudaTensor,
        dv: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        Ok(attn::attn_bwd(self, sh, q, k, v, dout, dq, dk, dv)?)
    }

    fn moe_route(
        &self,
        logits: &mut CudaTensor,
        moe: &MoeShape,
    ) -> Result<(Routing, f64), ExecError> {
        Ok(routing::route(self, logits, moe)?)
    }

    fn gather_rows(
        &self,
        src: &CudaTensor,
        rows: &[usize],
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let dt = out.dtype();
        let ss = self.input(src, dt)?;
        let idx = self.upload_index("gather_rows", rows)?;
        // SAFETY: src covers every row index, out rows.len() x h, of dt.
        Ok(unsafe {
            moe::gather_rows(
                self.s(),
                self.k(),
                dt,
                ss.ptr,
                idx.ptr_at(0),
                rows.len(),
                src.cols(),
                out.ptr_at(0),
            )
        }?)
    }

    fn scatter_add_rows(
        &self,
        src: &CudaTensor,
        rows: &[usize],
        weights: Option<&[f32]>,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let idx = self.upload_index("scatter_add_rows", rows)?;
        let w = weights.map(|w| self.upload_f32(w)).transpose()?;
        let os = self.output_at(out, 0..out.len(), F32, true)?;
        // SAFETY: src rows.len() x h of its dtype, out covers every index (f32), weights
        // rows.len() f32 or none.
        unsafe {
            moe::scatter_add_rows(
                self.s(),
                self.k(),
                src.dtype(),
                src.ptr_at(0),
                idx.ptr_at(0),
                w.as_ref().map_or(0, |t| t.ptr_at(0)),
                rows.len(),
                out.cols(),
                os.ptr,
            )
        }?;
        Ok(self.store(os, out, 0..out.len())?)
    }

    fn moe_combine_bwd(
        &self,
        dy: &CudaTensor,
        y: &CudaTensor,
        routes: &[Route],
        dprobs: &mut CudaTensor,
        dsend: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let tokens: Vec<usize> = routes.iter().map(|r| r.token).collect();
        let experts: Vec<usize> = routes.iter().map(|r| r.expert).collect();
        let gates: Vec<f32> = routes.iter().map(|r| r.gate).collect();
        let (t, x) = (
            self.upload_index("moe_combine_bwd", &tokens)?,
            self.upload_index("moe_combine_bwd", &experts)?,
        );
        let g = self.upload_f32(&gates)?;
        let (dys, ys) = (self.input(dy, F32)?, self.input(y, F32)?);
        let dp = self.output_at(dprobs, 0..dprobs.len(), F32, true)?;
        let ds = self.output_at(dsend, 0..dsend.len(), F32, false)?;
        // SAFETY: shapes as the wrapper names, every one f32 or u32.
        unsafe {
            moe::combine_bwd(
                self.s(),
                self.k(),
                dys.ptr,
                ys.ptr,
                t.ptr_at(0),
                x.ptr_at(0),
                g.ptr_at(0),
                routes.len(),
                dy.cols(),
                dprobs.cols(),
                dp.ptr,
                ds.ptr,
            )
        }?;
        self.store(dp, dprobs, 0..dprobs.len())?;
        Ok(self.store(ds, dsend, 0..dsend.len())?)
    }

    fn moe_router_bwd(
        &self,
        d: &mut CudaTensor,
        probs: &CudaTensor,
        fraction: &[f64],
        aux_scale: f64,
    ) -> Result<(), ExecError> {
        let f: Vec<f32> = fraction.iter().map(|&x| x as f32).collect();
        let fr = self.upload_f32(&f)?;
        let ps = self.input(probs, F32)?;
        let ds = self.output_at(d, 0..d.len(), F32, true)?;
        // SAFETY: d and probs n x E, fraction E, f32.
        unsafe {
            moe::router_bwd(
                self.s(),
                self.k(),
                ds.ptr,
                ps.ptr,
                fr.ptr_at(0),
                d.rows(),
                d.cols(),
                aux_scale as f32,
            )
        }?;
        Ok(self.store(ds, d, 0..d.len())?)
    }

    fn fill(&self, t: &mut CudaTensor, value: f32) -> Result<(), ExecError> {
        Ok(attn::fill(self, t, value)?)
    }

    fn flash_fwd_block(
        &self,
        sh: &BlockShape,
        q: &CudaTensor,
        qs: Side<'_>,
        k: View<'_, CudaTensor>,
        v: View<'_, CudaTensor>,
        ks: Side<'_>,
        acc: &mut CudaTensor,
        max: &mut CudaTensor,
        sum: &mut CudaTensor,
        _tile: &mut CudaTensor,
    ) -> Result<u64, ExecError> {
        let dt = q.dtype();
        let (kk, vv) = (self.input_view(&k, dt)?, self.input_view(&v, dt)?);
        let run = Running {
            acc: self.take_f32(acc)?,
            max: self.take_f32(max)?,
            sum: self.take_f32(sum)?,
        };
        let work = attn::forward_block(
            self,
            dt,
            sh,
            q.ptr_at(0),
            qs.pos,
            kk.ptr,
            vv.ptr,
            ks.pos,
            self.addr(&run.acc, acc),
            self.addr(&run.max, max),
            self.addr(&run.sum, sum),
        )?;
        self.give_back(run.acc, acc)?;
        self.give_back(run.max, max)?;
        self.give_back(run.sum, sum)?;
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
        let a = self.output_at(acc, 0..acc.len(), F32, true)?;
        let (m, s) = (self.input(max, F32)?, self.input(sum, F32)?);
        let l = self.output_at(lse, 0..lse.len(), F32, false)?;
        // SAFETY: acc b x rows x hq x d, the statistics b x hq x rows, f32.
        unsafe { flash::finish(self.s(), self.k(), sh, rows, a.ptr, m.ptr, s.ptr, l.ptr) }?;
        self.store(a, acc, 0..acc.len())?;
        Ok(self.store(l, lse, 0..lse.len())?)
    }

    fn flash_delta(
        &self,
        sh: &BlockShape,
        rows: usize,
        dout: &CudaTensor,
        o: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let os = self.input(o, F32)?;
        let d = self.output_at(out, 0..out.len(), F32, false)?;
        // SAFETY: dout b x rows x hq x d of its dtype, o the same in f32, out b x rows x hq.
        unsafe {
            flash::delta(
                self.s(),
                self.k(),
                dout.dtype(),
                sh,
                rows,
                dout.ptr_at(0),
                os.ptr,
                d.ptr,
            )
        }?;
        Ok(self.store(d, out, 0..out.len())?)
    }

    fn flash_bwd_block(
        &self,
        sh: &BlockShape,
        q: &CudaTensor,
        qs: Side<'_>,
        k: View<'_, CudaTensor>,
        v: View<'_, CudaTensor>,
        ks: Side<'_>,
        dout: &CudaTensor,
        lse: &CudaTensor,
        delta: &CudaTensor,
        dq: &mut CudaTensor,
        dk: ViewMut<'_, CudaTensor>,
        dv: ViewMut<'_, CudaTensor>,
        _p_tile: &mut CudaTensor,
        _dp_tile: &mut CudaTensor,
    ) -> Result<u64, ExecError> {
        let dt = q.dtype();
        let (kk, vv) = (self.input_view(&k, dt)?, self.input_view(&v, dt)?);
        let ds = self.input(dout, dt)?;
        let (ls, de) = (self.input(lse, F32)?, self.input(delta, F32)?);
        let (rk, rv) = (dk.range.clone(), dv.range.clone());
        let gq = self.output_at(dq, 0..dq.len(), F32, true)?;
        let gk = self.output_at(dk.tensor, rk.clone(), F32, true)?;
        let gv = self.output_at(dv.tensor, rv.clone(), F32, true)?;
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
        let work = attn::backward_block(self, dt, sh, qs.pos, ks.pos, &bufs)?;
        self.store(gq, dq, 0..dq.len())?;
        self.store(gk, dk.tensor, rk)?;
        self.store(gv, dv.tensor, rv)?;
        Ok(work)
    }

    fn ulysses_pack(
        &self,
        geo: &UlyssesGeo,
        from: UlyssesLayout,
        xs: &[(&CudaTensor, UlyssesPart)],
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let dt = out.dtype();
        let staged = xs
            .iter()
            .map(|(t, p)| self.input(t, dt).map(|s| (s, *p)))
            .collect::<Result<Vec<_>, _>>()?;
        let parts: Vec<_> = staged.iter().map(|(s, p)| (s.ptr, *p)).collect();
        // SAFETY: each tensor holds its part on side `from`, out the chunk buffer, of dt.
        Ok(unsafe { ulysses::pack(self.s(), self.k(), dt, geo, from, &parts, out.ptr_at(0)) }?)
    }

    fn ulysses_unpack(
        &self,
        geo: &UlyssesGeo,
        to: UlyssesLayout,
        recv: &CudaTensor,
        parts: &[UlyssesPart],
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), ExecError> {
        let dt = recv.dtype();
        let staged = outs
            .iter()
            .map(|t| self.output_at(t, 0..t.len(), dt, false))
            .collect::<Result<Vec<_>, _>>()?;
        let ptrs: Vec<_> = staged.iter().zip(parts).map(|(s, p)| (s.ptr, *p)).collect();
        // SAFETY: recv holds the chunk buffer, each output its part on side `to`, of dt.
        unsafe { ulysses::unpack(self.s(), self.k(), dt, geo, to, recv.ptr_at(0), &ptrs) }?;
        for (s, t) in staged.into_iter().zip(outs.iter()) {
            self.store(s, t, 0..t.len())?;
        }
        Ok(())
    }

    fn adam(
        &self,
        c: &AdamConfig,
        t: u32,
        p: ViewMut<'_, CudaTensor>,
        g: View<'_, CudaTensor>,
        m: &mut CudaTensor,
        v: &mut CudaTensor,
        weight_copy: Option<ViewMut<'_, CudaTensor>>,
    ) -> Result<(), ExecError> {
        let n = p.len();
        let rp = p.range.clone();
        let ps = self.output_at(p.tensor, rp.clone(), F32, true)?;
        let gs = self.input_view(&g, F32)?;
        let ms = self.output_at(m, 0..m.len(), F32, true)?;
        let vs = self.output_at(v, 0..v.len(), F32, true)?;
        // The fused bf16 copy where the copy is bf16; an fp32 copy is a plain copy after.
        let fused = weight_copy
            .as_ref()
            .filter(|w| w.tensor.dtype() == DType::Bf16)
            .map_or(0, |w| w.tensor.ptr_at(w.range.start));
        // SAFETY: p, g, m, v hold n f32; the copy n bf16 or is null.
        unsafe {
            adam::adam_step(
                self.s(),
                self.k(),
                c,
                t,
                ps.ptr,
                gs.ptr,
                ms.ptr,
                vs.ptr,
                n,
                fused,
            )
        }?;
        if let Some(w) = weight_copy.filter(|w| w.tensor.dtype() != DType::Bf16) {
            self.convert(ps.ptr, F32, w.tensor.ptr_at(w.range.start), F32, n)?;
        }
        self.store(ms, m, 0..m.len())?;
        self.store(vs, v, 0..v.len())?;
        Ok(self.store(ps, p.tensor, rp)?)
    }

    fn heads_concat(
        &self,
        a: &CudaTensor,
        b: &CudaTensor,
        heads: usize,
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        Ok(mla_dropout::heads_concat(self, a, b, heads, out)?)
    }

    fn heads_split(
        &self,
        dout: &CudaTensor,
        heads: usize,
        da: &mut CudaTensor,
        db: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        Ok(mla_dropout::heads_split(self, dout, heads, da, db)?)
    }

    fn moe_route_scored(
        &self,
        logits: &mut CudaTensor,
        bias: Option<&[f32]>,
        moe: &MoeShape,
    ) -> Result<(Routing, f64, Vec<usize>), ExecError> {
        Ok(routing::route_scored(self, logits, bias, moe)?)
    }

    fn moe_router_scored_bwd(
        &self,
        d: &mut CudaTensor,
        scores: &CudaTensor,
        chosen: &[usize],
        moe: &MoeShape,
        fraction: &[f64],
        aux_scale: f64,
    ) -> Result<(), ExecError> {
        Ok(routing::scored_bwd(
            self, d, scores, chosen, moe, fraction, aux_scale,
        )?)
    }

    fn dropout_inplace(
        &self,
        key: &crate::rng::DropoutKey,
        tokens: &[u64],
        col_offset: u64,
        x: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        mla_dropout::dropout_inplace(self, key, tokens, col_offset, x)
    }

    /// The dropout on the device (`kernels/dropout.cu`); the 1-byte mask Megatron keeps is drawn
    /// on the host from the same key and uploaded (no mask-writing kernel yet).
    fn dropout_save(
        &self,
        key: &crate::rng::DropoutKey,
        tokens: &[u64],
        col_offset: u64,
        x: ViewMut<'_, CudaTensor>,
    ) -> Result<CudaTensor, ExecError> {
        let n = x.range.len();
        mla_dropout::dropout_inplace(self, key, tokens, col_offset, x)?;
        let mut keep = vec![0.0; n];
        key.fill_mask(tokens, col_offset, &mut keep);
        keep.iter_mut()
            .for_each(|m| *m = f32::from(u8::from(*m != 0.0)));
        crate::backend::Device::upload(
            self,
            crate::tracker::Category::Activations,
            DType::U8,
            &[n],
            &keep,
        )
    }

    /// A host round trip (no kernel yet): the mask and the view downloaded, multiplied, written
    /// back.
    fn dropout_apply(
        &self,
        mask: &CudaTensor,
        scale: f32,
        x: ViewMut<'_, CudaTensor>,
    ) -> Result<(), ExecError> {
        use crate::backend::Device;
        let keep = self.download(View::all(mask))?;
        let mut xh = self.download(View {
            tensor: &*x.tensor,
            range: x.range.clone(),
        })?;
        xh.iter_mut().zip(&keep).for_each(|(v, k)| *v *= k * scale);
        let tmp = self.upload(
            crate::tracker::Category::Buffers,
            x.tensor.dtype(),
            &[xh.len()],
            &xh,
        )?;
        self.copy(View::all(&tmp), x)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The 2-D copy descriptor is built without a GPU: device to device, the pitches, column
    /// offsets and extent as given (a zeroed descriptor aborted the first GPU run: its memory
    /// type enum has no zero value).
    #[test]
    fn memcpy_2d_descriptor_names_device_memory_and_the_extent() {
        let p = memcpy_2d(0x1000, 96, 32, 0x2000, 64, 0, 32, 7);
        assert_eq!(p.srcMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(p.dstMemoryType, sys::CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(
            (p.srcDevice, p.srcPitch, p.srcXInBytes, p.srcY),
            (0x1000, 96, 32, 0)
        );
        assert_eq!(
            (p.dstDevice, p.dstPitch, p.dstXInBytes, p.dstY),
            (0x2000, 64, 0, 0)
        );
        assert_eq!((p.WidthInBytes, p.Height), (32, 7));
        assert!(p.srcHost.is_null() && p.dstHost.is_null());
    }
}
