//! The pipeline's ends: the vocab-parallel embedding (first stage) and the final norm, output
//! layer and vocab-parallel cross-entropy (last stage), as Megatron-LM shards them.

use super::params::BlockLayout;
use super::{Ctx, Sink, WTask};
use crate::backend::cpu::{Category, Tensor};
use crate::backend::{Collectives, ReduceOp, TensorOps};
use crate::error::ExecError;

/// Embedding forward: each TP rank looks up its vocabulary rows (zeros elsewhere) and the
/// partial sums are all-reduced, or reduce-scattered into the sequence shard with SP.
pub fn embedding_fwd(
    ctx: &mut Ctx,
    l: &BlockLayout,
    p: &[f32],
    tokens: &[u32],
) -> Result<Tensor, ExecError> {
    let (h, v_r) = (ctx.rd.h, ctx.rd.v_r);
    let lo = ctx.rd.tp_rank * v_r;
    let e = &p[l.tensors[0].range()];
    let mut partial = ctx.ops.zeros(Category::Buffers, &[ctx.n, h]);
    for (row, &id) in tokens.iter().enumerate() {
        let id = id as usize;
        if id >= lo && id < lo + v_r {
            partial.data_mut()[row * h..(row + 1) * h]
                .copy_from_slice(&e[(id - lo) * h..(id - lo + 1) * h]);
        }
    }
    ctx.reduce_to_region(partial, Category::Activations)
}

/// Embedding backward: only the weight-gradient task (the tokens have no gradient).
pub fn embedding_bwd(
    ctx: &mut Ctx,
    tokens: Vec<u32>,
    dy: Tensor,
    sink: &mut Sink,
) -> Result<(), ExecError> {
    let dyg = ctx.expand_grad(&dy)?;
    drop(dy);
    sink(
        ctx,
        WTask::Embedding {
            tokens,
            dy: dyg,
            dy_shard: false,
        },
    )
}

/// What the output block keeps: the final norm's input, the output layer's input (sequence
/// shard with SP) and the fp32 softmax of the vocab-parallel cross-entropy.
pub struct OutputSaved {
    pub x: Tensor,
    pub lnf: Tensor,
    pub probs: Tensor,
    pub targets: Vec<u32>,
}

/// Final norm, output layer, vocab-parallel cross-entropy (three small TP all-reduces: the row
/// maximum, the sum of exponentials, the target logit). Returns the sum of token losses.
pub fn output_fwd(
    ctx: &mut Ctx,
    l: &BlockLayout,
    p: &[f32],
    x: Tensor,
    targets: Vec<u32>,
) -> Result<(f64, OutputSaved), ExecError> {
    let m = &ctx.plan.model;
    let (h, v_r, n, n_sp) = (ctx.rd.h, ctx.rd.v_r, ctx.n, ctx.n_sp);
    let mut lnf = ctx.ops.zeros(Category::Activations, &[n_sp, h]);
    ctx.ops.norm_fwd(
        m.norm,
        x.data(),
        &p[l.tensors[0].range()],
        h,
        m.norm_eps,
        lnf.data_mut(),
    );
    let mut logits = ctx.ops.zeros(Category::Buffers, &[n, v_r]);
    let w = &p[l.tensors[1].range()];
    ctx.with_gathered(lnf.data(), |c, xg| {
        c.ops.linear_fwd(xg, w, n, h, v_r, logits.data_mut())
    })?;
    let lo = ctx.rd.tp_rank * v_r;
    let lg = logits.data();
    let mut max: Vec<f32> = lg
        .chunks_exact(v_r)
        .map(|r| r.iter().copied().fold(f32::NEG_INFINITY, f32::max))
        .collect();
    ctx.comm.all_reduce(&ctx.tp, &mut max, ReduceOp::Max)?;
    let mut probs = ctx.ops.zeros(Category::Activations, &[n, v_r]);
    let mut sum = vec![0.0f32; n];
    for r in 0..n {
        let (src, dst) = (
            &lg[r * v_r..(r + 1) * v_r],
            &mut probs.data_mut()[r * v_r..(r + 1) * v_r],
        );
        let mut s = 0.0;
        for (o, &z) in dst.iter_mut().zip(src) {
            *o = (z - max[r]).exp();
            s += *o;
        }
        sum[r] = s;
    }
    ctx.comm.all_reduce(&ctx.tp, &mut sum, ReduceOp::Sum)?;
    let mut target_logit: Vec<f32> = targets
        .iter()
        .enumerate()
        .map(|(r, &t)| {
            let t = t as usize;
            if t >= lo && t < lo + v_r {
                lg[r * v_r + t - lo]
            } else {
                0.0
            }
        })
        .collect();
    ctx.comm
        .all_reduce(&ctx.tp, &mut target_logit, ReduceOp::Sum)?;
    drop(logits);
    let mut loss = 0.0f64;
    for r in 0..n {
        for o in &mut probs.data_mut()[r * v_r..(r + 1) * v_r] {
            *o /= sum[r];
        }
        loss += (sum[r].ln() + max[r] - target_logit[r]) as f64;
    }
    Ok((
        loss,
        OutputSaved {
            x,
            lnf,
            probs,
            targets,
        },
    ))
}

/// Backward of the loss `scale * sum of token losses`: dx [n_sp, h]; weight tasks to `sink`.
pub fn output_bwd(
    ctx: &mut Ctx,
    l: &BlockLayout,
    p: &[f32],
    s: OutputSaved,
    scale: f32,
    sink: &mut Sink,
) -> Result<Tensor, ExecError> {
    let m = &ctx.plan.model;
    let (h, v_r, n, n_sp) = (ctx.rd.h, ctx.rd.v_r, ctx.n, ctx.n_sp);
    let OutputSaved {
        x,
        lnf,
        probs,
        targets,
    } = s;
    let lo = ctx.rd.tp_rank * v_r;
    let mut dlogits = probs.recat(Category::Buffers);
    {
        let g = dlogits.data_mut();
        for (r, &t) in targets.iter().enumerate() {
            let t = t as usize;
            if t >= lo && t < lo + v_r {
                g[r * v_r + t - lo] -= 1.0;
            }
        }
        g.iter_mut().for_each(|x| *x *= scale);
    }
    let mut part = ctx.ops.zeros(Category::Buffers, &[n, h]);
    ctx.ops.linear_dgrad(
        dlogits.data(),
        &p[l.tensors[1].range()],
        n,
        h,
        v_r,
        part.data_mut(),
        false,
    );
    let d_lnf = ctx.reduce_to_region(part, Category::Buffers)?;
    let sp = ctx.sp;
    sink(
        ctx,
        WTask::Linear {
            tensor: 1,
            x: lnf,
            dy: dlogits,
            i: h,
            o: v_r,
            gather_x: sp,
            dy_gathered: false,
            dy_shard: false,
        },
    )?;
    let mut dx = ctx.ops.zeros(Category::Buffers, &[n_sp, h]);
    ctx.ops.norm_dgrad(
        m.norm,
        x.data(),
        &p[l.tensors[0].range()],
        d_lnf.data(),
        h,
        m.norm_eps,
        dx.data_mut(),
    );
    sink(
        ctx,
        WTask::Norm {
            tensor: 0,
            x,
            dy: d_lnf,
        },
    )?;
    Ok(dx)
}
