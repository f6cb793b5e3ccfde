//! The op trait of MoE routing and token permutation for `CudaRank`: each op stages its operands on
//! the rank and launches its kernels.

use super::{kernel, routing};
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::ops::launch::F32;
use crate::backend::cuda::rank::CudaRank;
use crate::backend::cuda::Cuda;
use crate::backend::ops::MoeOps;
use crate::backend::ops::*;
use crate::backend::DeviceTensor;
use crate::error::ExecError;
use parsim_plan::plan::MoeShape;

impl MoeOps<Cuda> for CudaRank {
    fn moe_route(
        &self,
        logits: &mut CudaTensor,
        moe: &MoeShape,
    ) -> Result<(Routing, f64), ExecError> {
        let cr = self;
        Ok(routing::route(cr, logits, moe)?)
    }

    fn moe_route_scored(
        &self,
        logits: &mut CudaTensor,
        bias: Option<&[f32]>,
        moe: &MoeShape,
    ) -> Result<(Routing, f64, Vec<usize>), ExecError> {
        let cr = self;
        Ok(routing::route_scored(cr, logits, bias, moe)?)
    }

    fn moe_router_bwd(
        &self,
        d: &mut CudaTensor,
        probs: &CudaTensor,
        fraction: &[f64],
        aux_scale: f64,
    ) -> Result<(), ExecError> {
        let cr = self;
        let f: Vec<f32> = fraction.iter().map(|&x| x as f32).collect();
        let fr = cr.upload_f32(&f)?;
        let ps = cr.input(probs, F32)?;
        let ds = cr.output_at(d, 0..d.len(), F32, true)?;
        // SAFETY: d and probs n x E, fraction E, f32.
        unsafe {
            kernel::router_bwd(
                cr.s(),
                cr.k(),
                ds.ptr,
                ps.ptr,
                fr.ptr_at(0),
                d.rows(),
                d.cols(),
                aux_scale as f32,
            )
        }?;
        Ok(cr.store(ds, d, 0..d.len())?)
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
        let cr = self;
        Ok(routing::scored_bwd(
            cr, d, scores, chosen, moe, fraction, aux_scale,
        )?)
    }

    fn gather_rows(
        &self,
        src: &CudaTensor,
        rows: &[usize],
        out: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let dt = out.dtype();
        let ss = cr.input(src, dt)?;
        let idx = cr.upload_index("gather_rows", rows)?;
        // SAFETY: src covers every row index, out rows.len() x h, of dt.
        Ok(unsafe {
            kernel::gather_rows(
                cr.s(),
                cr.k(),
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
        let cr = self;
        let idx = cr.upload_index("scatter_add_rows", rows)?;
        let w = weights.map(|w| cr.upload_f32(w)).transpose()?;
        let os = cr.output_at(out, 0..out.len(), F32, true)?;
        // SAFETY: src rows.len() x h of its dtype, out covers every index (f32), weights
        // rows.len() f32 or none.
        unsafe {
            kernel::scatter_add_rows(
                cr.s(),
                cr.k(),
                src.dtype(),
                src.ptr_at(0),
                idx.ptr_at(0),
                w.as_ref().map_or(0, |t| t.ptr_at(0)),
                rows.len(),
                out.cols(),
                os.ptr,
            )
        }?;
        Ok(cr.store(os, out, 0..out.len())?)
    }

    fn moe_combine_bwd(
        &self,
        dy: &CudaTensor,
        y: &CudaTensor,
        routes: &[Route],
        dprobs: &mut CudaTensor,
        dsend: &mut CudaTensor,
    ) -> Result<(), ExecError> {
        let cr = self;
        let tokens: Vec<usize> = routes.iter().map(|r| r.token).collect();
        let experts: Vec<usize> = routes.iter().map(|r| r.expert).collect();
        let gates: Vec<f32> = routes.iter().map(|r| r.gate).collect();
        let (t, x) = (
            cr.upload_index("moe_combine_bwd", &tokens)?,
            cr.upload_index("moe_combine_bwd", &experts)?,
        );
        let g = cr.upload_f32(&gates)?;
        let (dys, ys) = (cr.input(dy, F32)?, cr.input(y, F32)?);
        let dp = cr.output_at(dprobs, 0..dprobs.len(), F32, true)?;
        let ds = cr.output_at(dsend, 0..dsend.len(), F32, false)?;
        // SAFETY: shapes as the wrapper names, every one f32 or u32.
        unsafe {
            kernel::combine_bwd(
                cr.s(),
                cr.k(),
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
        cr.store(dp, dprobs, 0..dprobs.len())?;
        Ok(cr.store(ds, dsend, 0..dsend.len())?)
    }
}
