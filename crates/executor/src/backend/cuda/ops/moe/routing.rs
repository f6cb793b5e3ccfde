//! MoE routing on the device: scores (softmax, or DeepSeek-V3's sigmoid), the top-k choice
//! (backend/cuda/ops/moe/moe.cu's `moe_topk_f32` for the plain router, `moe_topk_scored_f32` with
//! the selection bias, renormalisation and group limit for the scored one) and the per-expert score
//! mass of the load-balancing loss all run as kernels; only the n x k chosen experts and gates (and
//! e score sums) come back to the host. The capacity's drops and the per-expert route order stay
//! host metadata (CPU twin: cpu/ops/moe.rs `finish`), as the split sizes of the dispatch all-to-all
//! are on the host for NCCL too. Forced load balancing chooses by token index, not by score: the
//! scores come back and the CPU twin routes them.

use crate::backend::cpu::ops::router as host_router;
use crate::backend::cpu::ops::routes as host_routes;
use crate::backend::cuda::device::tensor::CudaTensor;
use crate::backend::cuda::diag::error::CudaError;
use crate::backend::cuda::ops::launch::shape_error;
use crate::backend::cuda::ops::moe::kernel::{self as moe, ScoredTopk};
use crate::backend::cuda::rank::CudaRank;
use crate::backend::ops::*;
use crate::backend::{DeviceTensor, View};
use parsim_plan::plan::{MoeShape, ScoreFunction};
use parsim_plan::DType;

const F32: DType = DType::F32;

/// The routing of `n` tokens from the kernel's experts and gates [n, k] (selection order):
/// each expert's (token, gate) list in token order, then the capacity's drops. Also returns
/// the chosen experts as the backward takes them. An expert index out of range (a kernel fault)
/// is an error, not a panic.
pub fn routing_from(
    experts: &[u32],
    gates: &[f32],
    n: usize,
    moe: &MoeShape,
) -> Result<(Routing, Vec<usize>), CudaError> {
    let (e, k) = (moe.num_experts, moe.top_k);
    let mut per_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
    let mut chosen = Vec::with_capacity(n * k);
    for (i, (&x, &g)) in experts.iter().zip(gates).take(n * k).enumerate() {
        let x = x as usize;
        let list = per_expert.get_mut(x).ok_or_else(|| {
            shape_error(
                "moe_topk",
                format!("returned expert {x} for token {} (experts: {e})", i / k),
            )
        })?;
        list.push((i / k, g));
        chosen.push(x);
    }
    Ok((host_routes::finish(per_expert, n, moe), chosen))
}

/// The load-balancing loss from the device's per-expert score sums of scores [n, e] at `ptr`.
fn aux_loss(
    r: &CudaRank,
    ptr: u64,
    n: usize,
    moe: &MoeShape,
    fraction: &[f64],
) -> Result<f64, CudaError> {
    if moe.aux_loss_coeff == 0.0 {
        return Ok(0.0);
    }
    let e = moe.num_experts;
    let sums = r.temp(F32, e)?;
    // SAFETY: scores n x e f32 at ptr, sums e f32.
    unsafe { moe::score_colsum(r.s(), r.k(), ptr, n, e, sums.ptr_at(0)) }?;
    let colsum = r.dev.download(View::all(&sums))?;
    // One "row" of column sums: aux_loss's mean over rows is then the sum itself.
    Ok(host_routes::aux_loss(
        moe.aux_loss_coeff,
        &colsum,
        n,
        fraction,
    ))
}

/// Downloads the chosen experts and gates [n, k] of two device temporaries.
fn download_choice(
    r: &CudaRank,
    experts: &CudaTensor,
    gates: &CudaTensor,
) -> Result<(Vec<u32>, Vec<f32>), CudaError> {
    Ok((r.download_u32(experts)?, r.dev.download(View::all(gates))?))
}

/// The plain router: softmax in place, top-k on the device, the routing on the host.
pub fn route(
    r: &CudaRank,
    logits: &mut CudaTensor,
    moe: &MoeShape,
) -> Result<(Routing, f64), CudaError> {
    let (n, e, k) = (logits.rows(), logits.cols(), moe.top_k);
    let ls = r.output_at(logits, 0..logits.len(), F32, true)?;
    let (xs, gs) = (r.temp(F32, n * k)?, r.temp(F32, n * k)?);
    // SAFETY: logits n x e f32; experts n x k u32 slots, gates n x k f32.
    unsafe {
        moe::softmax_rows(r.s(), r.k(), ls.ptr, n, e)?;
        moe::topk(r.s(), r.k(), ls.ptr, n, e, k, xs.ptr_at(0), gs.ptr_at(0))?;
    }
    let (experts, gates) = download_choice(r, &xs, &gs)?;
    let (routing, _) = routing_from(&experts, &gates, n, moe)?;
    let aux = aux_loss(r, ls.ptr, n, moe, &routing.fraction)?;
    r.store(ls, logits, 0..logits.len())?;
    Ok((routing, aux))
}

/// Forced load balancing (Megatron's `--moe-router-force-load-balancing`): token t takes
/// experts (t k + j) mod E whatever its scores, so the choice needs no kernel; the device's
/// scores [n, e] at `ptr` come back for the gates and the routing is the CPU twin's own
/// (`cpu/ops/router.rs` `route`), host metadata as every routing here.
fn forced(
    r: &CudaRank,
    ptr: u64,
    n: usize,
    e: usize,
    moe: &MoeShape,
) -> Result<(Routing, Vec<usize>), CudaError> {
    let scores = r.temp(F32, n * e)?;
    r.convert(ptr, F32, scores.ptr_at(0), F32, n * e)?;
    let s = r.dev.download(View::all(&scores))?;
    // The bias only selects, and forced balancing does not select.
    Ok(host_router::route(&s, n, None, moe))
}

/// The scored router: scores in place, the scored top-k on the device (from the f32 scores,
/// before any bf16 store, as the CPU twin routes), the routing on the host.
pub fn route_scored(
    r: &CudaRank,
    logits: &mut CudaTensor,
    bias: Option<&[f32]>,
    moe: &MoeShape,
) -> Result<(Routing, f64, Vec<usize>), CudaError> {
    let (n, e, k) = (logits.rows(), logits.cols(), moe.top_k);
    let t = ScoredTopk {
        experts: e,
        top_k: k,
        groups: moe.router.groups,
        group_topk: moe.router.group_topk,
        renormalize: moe.router.renormalize,
    };
    t.check("moe_topk_scored_f32")?;
    if let Some(b) = bias.filter(|b| b.len() != e) {
        return Err(shape_error(
            "moe_topk_scored_f32",
            format!("expert bias has {} entries, experts {e}", b.len()),
        ));
    }
    let ls = r.output_at(logits, 0..logits.len(), F32, true)?;
    // SAFETY: logits n x e f32.
    unsafe {
        match moe.router.score {
            ScoreFunction::Softmax => moe::softmax_rows(r.s(), r.k(), ls.ptr, n, e)?,
            ScoreFunction::Sigmoid => moe::sigmoid(r.s(), r.k(), ls.ptr, n * e)?,
        }
    }
    let (routing, chosen) = if moe.router.force_balance {
        forced(r, ls.ptr, n, e, moe)?
    } else {
        let bias_t = bias.map(|b| r.upload_f32(b)).transpose()?;
        let (xs, gs) = (r.temp(F32, n * k)?, r.temp(F32, n * k)?);
        let b = bias_t.as_ref().map_or(0, |b| b.ptr_at(0));
        // SAFETY: scores n x e f32; bias e f32 or none; experts n x k u32 slots, gates
        // n x k f32.
        unsafe { moe::topk_scored(r.s(), r.k(), &t, ls.ptr, b, n, xs.ptr_at(0), gs.ptr_at(0)) }?;
        let (experts, gates) = download_choice(r, &xs, &gs)?;
        routing_from(&experts, &gates, n, moe)?
    };
    let aux = aux_loss(r, ls.ptr, n, moe, &routing.fraction)?;
    r.store(ls, logits, 0..logits.len())?;
    Ok((routing, aux, chosen))
}

/// The scored router's backward in place on `d` [n, e]: renormalisation and sigmoid in one
/// kernel, then (softmax scores) the plain router's backward with the load-balancing term.
pub fn scored_bwd(
    r: &CudaRank,
    d: &mut CudaTensor,
    scores: &CudaTensor,
    chosen: &[usize],
    moe: &MoeShape,
    fraction: &[f64],
    aux_scale: f64,
) -> Result<(), CudaError> {
    let (n, e, k) = (d.rows(), d.cols(), moe.top_k);
    if chosen.len() != n * k {
        return Err(shape_error(
            "moe_scored_bwd_f32",
            format!("{} chosen experts for {n} tokens x top_k {k}", chosen.len()),
        ));
    }
    let idx = r.upload_index("moe_scored_bwd_f32", chosen)?;
    let ss = r.input(scores, F32)?;
    let ds = r.output_at(d, 0..d.len(), F32, true)?;
    let sigmoid = moe.router.score == ScoreFunction::Sigmoid;
    // SAFETY: d and scores n x e f32, chosen n x k u32.
    unsafe {
        moe::scored_bwd(
            r.s(),
            r.k(),
            ds.ptr,
            ss.ptr,
            idx.ptr_at(0),
            n,
            e,
            k,
            moe.router.renormalize,
            sigmoid,
        )
    }?;
    if !sigmoid {
        let f: Vec<f32> = fraction.iter().map(|&x| x as f32).collect();
        let fr = r.upload_f32(&f)?;
        // SAFETY: d and scores n x e, fraction e, f32.
        unsafe {
            moe::router_bwd(
                r.s(),
                r.k(),
                ds.ptr,
                ss.ptr,
                fr.ptr_at(0),
                n,
                e,
                aux_scale as f32,
            )
        }?;
    }
    r.store(ds, d, 0..d.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::ops::router;
    use parsim_plan::plan::RouterShape;

    /// The host half of the device routing equals the CPU twin's routing when the kernel's
    /// choice is the CPU's own (per-token choice order, gates renormalised), capacity drops
    /// included.
    #[test]
    fn routing_from_the_kernels_choice_equals_the_cpu_route() {
        let m = MoeShape {
            num_experts: 8,
            top_k: 2,
            ffn: 4,
            capacity_factor: 1.0,
            router: RouterShape {
                score: ScoreFunction::Sigmoid,
                renormalize: true,
                groups: 4,
                group_topk: 2,
                ..RouterShape::default()
            },
            ..MoeShape::default()
        };
        let n = 6;
        let s: Vec<f32> = (0..n * 8)
            .map(|i| (i * 37 % 23) as f32 / 23.0 * 0.9 + 0.05)
            .collect();
        let bias: Vec<f32> = (0..8).map(|i| i as f32 * 0.01).collect();
        let (want, want_chosen) = router::route(&s, n, Some(&bias), &m);
        // The kernel's output, built from the CPU's choice: experts in choice order, gates the
        // renormalised scores.
        let experts: Vec<u32> = want_chosen.iter().map(|&x| x as u32).collect();
        let gates: Vec<f32> = want_chosen
            .chunks(2)
            .enumerate()
            .flat_map(|(t, p)| {
                let row = &s[t * 8..(t + 1) * 8];
                let sum: f32 = p.iter().map(|&x| row[x]).sum();
                p.iter().map(|&x| row[x] / sum).collect::<Vec<_>>()
            })
            .collect();
        let (got, chosen) = routing_from(&experts, &gates, n, &m).unwrap();
        assert_eq!(chosen, want_chosen);
        assert_eq!(got.fraction, want.fraction);
        assert_eq!(got.dropped, want.dropped);
        assert_eq!(got.routes.len(), want.routes.len());
        for (a, b) in got.routes.iter().zip(&want.routes) {
            assert_eq!((a.token, a.expert, a.gate), (b.token, b.expert, b.gate));
        }
        // 6 tokens x 2 over 8 experts at capacity ceil(12 / 8) = 2: some expert overflows
        // (the check exercises the drops) or every expert holds at most 2.
        assert_eq!(
            got.dropped,
            want.fraction
                .iter()
                .map(|f| ((f * 12.0).round() as usize).saturating_sub(2))
                .sum::<usize>()
        );
    }

    #[test]
    fn an_expert_out_of_range_is_an_error_naming_the_token() {
        let m = MoeShape {
            num_experts: 4,
            top_k: 1,
            ffn: 4,
            ..MoeShape::default()
        };
        let e = routing_from(&[1, 7], &[0.5, 0.5], 2, &m).unwrap_err();
        assert!(e.to_string().contains("expert 7 for token 1"), "{e}");
    }
}
