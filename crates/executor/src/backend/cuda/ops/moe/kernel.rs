//! Launches of backend/cuda/ops/moe/moe.cu: router softmax and top-k, token permutation and its
//! inverse, and the backward of the combine and of the router (CPU twin: cpu/ops/moe.rs). Row
//! indices are u32 on the device.

use crate::backend::cuda::ops::launch::*;
use parsim_plan::DType;

/// Row-wise softmax of x [n, e] in place.
///
/// # Safety
/// `x`: n*e f32.
pub unsafe fn softmax_rows(
    s: &CudaStream,
    k: &Kernels,
    x: CUdeviceptr,
    n: usize,
    e: usize,
) -> Result<(), CudaError> {
    let kn = "moe_softmax_rows_f32";
    launch!(kn, s, k, maybe grid_stride(u(n)); x, u(n), u32_arg(kn, "e", e)?)
}

/// experts [n, topk] (u32) and gates [n, topk] (f32): each row's top-k, lower expert first on
/// ties.
///
/// # Safety
/// `probs`: n*e f32; `experts`: n*topk u32; `gates`: n*topk f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn topk(
    s: &CudaStream,
    k: &Kernels,
    probs: CUdeviceptr,
    n: usize,
    e: usize,
    topk: usize,
    experts: CUdeviceptr,
    gates: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = "moe_topk_f32";
    if topk == 0 || topk > e {
        return Err(shape_error(
            kn,
            format!("top_k = {topk} must be in 1..=experts ({e})"),
        ));
    }
    launch!(
        kn, s, k, maybe grid_stride(u(n));
        probs, u(n), u32_arg(kn, "e", e)?, u32_arg(kn, "top_k", topk)?, experts, gates
    )
}

/// out[i] = src[rows[i]] for m rows of h.
///
/// # Safety
/// `src`: rows of h of `dtype` covering every index in `rows` (m u32); `out`: m*h.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gather_rows(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    src: CUdeviceptr,
    rows: CUdeviceptr,
    m: usize,
    h: usize,
    out: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = name("gather_rows", dtype);
    launch!(&kn, s, k, maybe grid_stride(u(m) * u(h)); src, rows, u(m), u(h), out)
}

/// out[rows[i]] += w_i src[i] (out f32; `weights` 0 for none).
///
/// # Safety
/// `src`: m*h of `dtype`; `rows`: m u32; `weights`: 0 or m f32; `out` covers every row index.
#[allow(clippy::too_many_arguments)]
pub unsafe fn scatter_add_rows(
    s: &CudaStream,
    k: &Kernels,
    dtype: DType,
    src: CUdeviceptr,
    rows: CUdeviceptr,
    weights: CUdeviceptr,
    m: usize,
    h: usize,
    out: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = name("scatter_add_rows", dtype);
    launch!(&kn, s, k, maybe grid_stride(u(m) * u(h)); src, rows, weights, u(m), u(h), out)
}

/// Backward of the combine over m routes (token, expert, gate as three device arrays).
///
/// # Safety
/// `dy`: tokens*h f32; `y`, `dsend`: m*h f32; `tokens`, `experts`: m u32; `gates`: m f32;
/// `dprobs`: tokens*e f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn combine_bwd(
    s: &CudaStream,
    k: &Kernels,
    dy: CUdeviceptr,
    y: CUdeviceptr,
    tokens: CUdeviceptr,
    experts: CUdeviceptr,
    gates: CUdeviceptr,
    m: usize,
    h: usize,
    e: usize,
    dprobs: CUdeviceptr,
    dsend: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = "moe_combine_bwd_f32";
    launch!(
        kn, s, k, maybe per_row(kn, u(m))?;
        dy, y, tokens, experts, gates, u(h), u32_arg(kn, "e", e)?, dprobs, dsend
    )
}

/// The router's backward in place on d [n, e] (`fraction`: e f32 slot fractions).
///
/// # Safety
/// `d`, `probs`: n*e f32; `fraction`: e f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn router_bwd(
    s: &CudaStream,
    k: &Kernels,
    d: CUdeviceptr,
    probs: CUdeviceptr,
    fraction: CUdeviceptr,
    n: usize,
    e: usize,
    aux_scale: f32,
) -> Result<(), CudaError> {
    let kn = "moe_router_bwd_f32";
    let has_aux = i32::from(aux_scale != 0.0);
    launch!(
        kn, s, k, maybe grid_stride(u(n));
        d, probs, fraction, u(n), u32_arg(kn, "e", e)?, aux_scale, has_aux
    )
}

/// Elementwise sigmoid of x [n] in place (the scored router's sigmoid score function).
///
/// # Safety
/// `x`: n f32.
pub unsafe fn sigmoid(
    s: &CudaStream,
    k: &Kernels,
    x: CUdeviceptr,
    n: usize,
) -> Result<(), CudaError> {
    let kn = "moe_sigmoid_f32";
    launch!(kn, s, k, maybe grid_stride(u(n)); x, u(n))
}

/// The most groups the scored top-k takes (its allowed-group mask is 64 bits).
pub const MAX_ROUTER_GROUPS: usize = 64;

/// The scored router's choice: top-k of score + bias within the best groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoredTopk {
    pub experts: usize,
    pub top_k: usize,
    /// 0 for no group limit.
    pub groups: usize,
    pub group_topk: usize,
    pub renormalize: bool,
}

impl ScoredTopk {
    /// Checks what the kernel relies on, naming the rule (the plan's own checks come first).
    pub fn check(&self, kernel: &str) -> Result<(), CudaError> {
        let (e, k, g, gk) = (self.experts, self.top_k, self.groups, self.group_topk);
        if k == 0 || k > e {
            return Err(shape_error(
                kernel,
                format!("top_k = {k} must be in 1..=experts ({e})"),
            ));
        }
        if g > MAX_ROUTER_GROUPS {
            return Err(shape_error(
                kernel,
                format!("groups = {g} exceeds {MAX_ROUTER_GROUPS}"),
            ));
        }
        if g > 0 && (e % g != 0 || gk == 0 || gk > g || k > gk * (e / g)) {
            return Err(shape_error(
                kernel,
                format!(
                    "groups = {g}, group_topk = {gk}: experts ({e}) must split into the groups \
                     and the top_k ({k}) fit in group_topk groups"
                ),
            ));
        }
        Ok(())
    }
}

/// experts [n, top_k] (u32, selection order) and gates [n, top_k] (f32) of scores [n, e] with
/// the selection-only `bias` (0 for none).
///
/// # Safety
/// `scores`: n*e f32; `bias`: 0 or e f32; `experts`: n*top_k u32; `gates`: n*top_k f32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn topk_scored(
    s: &CudaStream,
    k: &Kernels,
    t: &ScoredTopk,
    scores: CUdeviceptr,
    bias: CUdeviceptr,
    n: usize,
    experts: CUdeviceptr,
    gates: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = "moe_topk_scored_f32";
    t.check(kn)?;
    launch!(kn, s, k, maybe grid_stride(u(n)); scores, bias, u(n), u32_arg(kn, "experts", t.experts)?,
        u32_arg(kn, "top_k", t.top_k)?, u32_arg(kn, "groups", t.groups)?,
        u32_arg(kn, "group_topk", t.group_topk)?, i32::from(t.renormalize), experts, gates)
}

/// Column sums out [e] of scores [n, e] (the load-balancing loss's score mass per expert).
///
/// # Safety
/// `scores`: n*e f32; `out`: e f32.
pub unsafe fn score_colsum(
    s: &CudaStream,
    k: &Kernels,
    scores: CUdeviceptr,
    n: usize,
    e: usize,
    out: CUdeviceptr,
) -> Result<(), CudaError> {
    let kn = "moe_score_colsum_f32";
    launch!(kn, s, k, maybe grid_stride(u(e)); scores, u(n), u32_arg(kn, "e", e)?, out)
}

/// The scored router's backward in place on d [n, e], through the renormalisation over the
/// chosen [n, top_k] (u32) and the sigmoid (softmax scores continue with [`router_bwd`]).
///
/// # Safety
/// `d`, `scores`: n*e f32; `chosen`: n*top_k u32.
#[allow(clippy::too_many_arguments)]
pub unsafe fn scored_bwd(
    s: &CudaStream,
    k: &Kernels,
    d: CUdeviceptr,
    scores: CUdeviceptr,
    chosen: CUdeviceptr,
    n: usize,
    e: usize,
    top_k: usize,
    renormalize: bool,
    sigmoid: bool,
) -> Result<(), CudaError> {
    let kn = "moe_scored_bwd_f32";
    launch!(kn, s, k, maybe grid_stride(u(n)); d, scores, chosen, u(n), u32_arg(kn, "e", e)?,
        u32_arg(kn, "top_k", top_k)?, i32::from(renormalize), i32::from(sigmoid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scored_topk_refuses_what_the_kernel_cannot_take() {
        let ok = ScoredTopk {
            experts: 256,
            top_k: 8,
            groups: 8,
            group_topk: 4,
            renormalize: true,
        };
        assert!(ok.check("k").is_ok());
        assert!(ScoredTopk {
            groups: 0,
            group_topk: 0,
            ..ok
        }
        .check("k")
        .is_ok());
        for (bad, rule) in [
            (ScoredTopk { top_k: 0, ..ok }, "top_k"),
            (ScoredTopk { top_k: 257, ..ok }, "top_k"),
            (ScoredTopk { groups: 128, ..ok }, "exceeds 64"),
            (ScoredTopk { groups: 7, ..ok }, "split"),
            (
                ScoredTopk {
                    group_topk: 9,
                    ..ok
                },
                "split",
            ),
            // 8 groups of 32, 1 group allowed: 33 experts do not fit.
            (
                ScoredTopk {
                    top_k: 33,
                    group_topk: 1,
                    ..ok
                },
                "fit",
            ),
        ] {
            let e = bad.check("moe_topk_scored_f32").unwrap_err().to_string();
            assert!(e.contains("moe_topk_scored_f32") && e.contains(rule), "{e}");
        }
    }
}
