// Mixture-of-experts routing and token permutation: the CPU twin is
// executor/src/backend/cpu/ops/moe.rs (softmax_rows, route's top-k, gather_rows,
// scatter_add_rows, combine_bwd, router_bwd). The top-k choice runs here ([n, k] experts and
// gates, ties to the lower expert as on the CPU); the capacity's drops and the per-expert
// route order are then built on the host from those n*k entries, as the CPU's route does.
// Row indices are u32 (the CPU's usize rows, narrowed by the caller).
#include "common.cuh"

// Row-wise softmax of x [n, e] in place; one thread per row (e is the expert count).
extern "C" __global__ void moe_softmax_rows_f32(float* x, u64 n, u32 e) {
    GRID_STRIDE(r, n) {
        float* row = x + r * e;
        float m = -INFINITY, s = 0.0f;
        for (u32 j = 0; j < e; ++j) m = fmaxf(m, row[j]);
        for (u32 j = 0; j < e; ++j) {
            float v = expf(row[j] - m);
            row[j] = v;
            s += v;
        }
        for (u32 j = 0; j < e; ++j) row[j] /= s;
    }
}

// Top-k of each row of probs [n, e]: experts[n, k] in descending probability (lower expert
// first on ties) and their gates.
extern "C" __global__ void moe_topk_f32(const float* probs, u64 n, u32 e, u32 k, u32* experts,
                                        float* gates) {
    GRID_STRIDE(r, n) {
        const float* row = probs + r * e;
        for (u32 s = 0; s < k; ++s) {
            int best = -1;
            float bv = -INFINITY;
            for (u32 x = 0; x < e; ++x) {
                bool taken = false;
                for (u32 q = 0; q < s; ++q) taken |= experts[r * k + q] == x;
                if (taken) continue;
                if (best < 0 || row[x] > bv) {
                    best = (int)x;
                    bv = row[x];
                }
            }
            experts[r * k + s] = (u32)best;
            gates[r * k + s] = bv;
        }
    }
}

// out[i] = src[rows[i]] (rows of h): tokens permuted into route order.
template <typename T> __device__ void gather_rows(const T* src, const u32* rows, u64 m, u64 h, T* out) {
    GRID_STRIDE(i, m * h) out[i] = src[(u64)rows[i / h] * h + i % h];
}

// out[rows[i]] += w_i src[i] (w_i = 1 where weights is null); atomics, as a token has k routes.
template <typename T>
__device__ void scatter_add_rows(const T* src, const u32* rows, const float* weights, u64 m, u64 h,
                                 float* out) {
    GRID_STRIDE(i, m * h) {
        u64 ri = i / h;
        float w = weights ? weights[ri] : 1.0f;
        atomicAdd(out + (u64)rows[ri] * h + i % h, w * load_f(src, i));
    }
}

extern "C" __global__ void gather_rows_f32(const float* s, const u32* rows, u64 m, u64 h, float* o) {
    gather_rows(s, rows, m, h, o);
}
extern "C" __global__ void gather_rows_bf16(const __nv_bfloat16* s, const u32* rows, u64 m, u64 h,
                                            __nv_bfloat16* o) {
    gather_rows(s, rows, m, h, o);
}
extern "C" __global__ void scatter_add_rows_f32(const float* s, const u32* rows, const float* w, u64 m,
                                                u64 h, float* o) {
    scatter_add_rows(s, rows, w, m, h, o);
}
extern "C" __global__ void scatter_add_rows_bf16(const __nv_bfloat16* s, const u32* rows, const float* w,
                                                 u64 m, u64 h, float* o) {
    scatter_add_rows(s, rows, w, m, h, o);
}

// Backward of the combine out[t] = sum_r gate_r y_r, one block per route i (token tokens[i],
// expert experts[i]): dprobs[t, expert] = dy[t] . y_i and dsend[i] = gate_i dy[t].
extern "C" __global__ void moe_combine_bwd_f32(const float* dy, const float* y, const u32* tokens,
                                               const u32* experts, const float* gates, u64 h, u32 e,
                                               float* dprobs, float* dsend) {
    __shared__ float scratch[32];
    u64 i = blockIdx.x, t = tokens[i];
    float dot = 0.0f, g = gates[i];
    for (u64 j = threadIdx.x; j < h; j += blockDim.x) {
        float d = dy[t * h + j];
        dot += d * y[i * h + j];
        dsend[i * h + j] = g * d;
    }
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) dprobs[t * e + experts[i]] = dot;
}

// The router's backward in place on d [n, e]: d += aux_scale * fraction (per expert), then the
// softmax's backward d = p * (d - d.p). One thread per row.
extern "C" __global__ void moe_router_bwd_f32(float* d, const float* probs, const float* fraction,
                                              u64 n, u32 e, float aux_scale, int has_aux) {
    GRID_STRIDE(r, n) {
        float* dl = d + r * e;
        const float* pr = probs + r * e;
        float dot = 0.0f;
        for (u32 j = 0; j < e; ++j) {
            if (has_aux) dl[j] += aux_scale * fraction[j];
            dot += dl[j] * pr[j];
        }
        for (u32 j = 0; j < e; ++j) dl[j] = pr[j] * (dl[j] - dot);
    }
}

// ---- DeepSeek-V3's scored router: the CPU twin is executor/src/backend/cpu/ops/router.rs
// (scores, choose, route, router_bwd). Selection keys are score + bias (the bias for selection
// only); with groups, the best `group_topk` groups by the sum of their top `take` keys, then the
// top k of the experts in those groups; gates are the unbiased scores, optionally renormalised
// over the k chosen. One thread per token row; the expert count is small (<= a few hundred).

// Elementwise sigmoid of x [n] in place (the sigmoid score function).
extern "C" __global__ void moe_sigmoid_f32(float* x, u64 n) {
    GRID_STRIDE(i, n) x[i] = 1.0f / (1.0f + expf(-x[i]));
}

// Whether (va, ia) precedes (vb, ib) in the CPU's selection order: larger key first, lower
// index first on ties.
__device__ __forceinline__ bool moe_before(float va, u32 ia, float vb, u32 ib) {
    return va > vb || (va == vb && ia < ib);
}

// The selection key of expert x of a row: score + bias (bias may be null).
__device__ __forceinline__ float moe_key(const float* row, const float* bias, u32 x) {
    return bias ? row[x] + bias[x] : row[x];
}

// The best expert of [lo, hi) strictly after (pv, pi) in selection order (pi = ~0u: none yet)
// and, where `groups` is nonzero, inside an allowed group (bit g of `allowed`, groups of `per`).
__device__ u32 moe_next(const float* row, const float* bias, u32 lo, u32 hi, float pv, u32 pi,
                        u32 per, unsigned long long allowed, float* value) {
    u32 best = ~0u;
    float bv = -INFINITY;
    for (u32 x = lo; x < hi; ++x) {
        if (per && !((allowed >> (x / per)) & 1ull)) continue;
        float v = moe_key(row, bias, x);
        if (pi != ~0u && !moe_before(pv, pi, v, x)) continue;
        if (best == ~0u || moe_before(v, x, bv, best)) {
            best = x;
            bv = v;
        }
    }
    *value = bv;
    return best;
}

// The allowed-group mask of one row: the best `group_topk` of `groups` groups of `per` experts,
// a group's key the sum of its top `take` selection keys (Megatron's group_limited_topk).
__device__ unsigned long long moe_groups(const float* row, const float* bias, u32 groups, u32 per,
                                         u32 group_topk, u32 take) {
    unsigned long long chosen = 0;
    float pv = 0.0f;
    u32 pi = ~0u;
    for (u32 s = 0; s < group_topk; ++s) {
        // The next group in (group key desc, group index asc) order after (pv, pi).
        u32 best = ~0u;
        float bv = -INFINITY;
        for (u32 g = 0; g < groups; ++g) {
            float gv = 0.0f, v = 0.0f;
            u32 q = ~0u;
            for (u32 t = 0; t < take; ++t) {
                float nv;
                u32 nq = moe_next(row, bias, g * per, (g + 1) * per, v, q, 0, 0ull, &nv);
                if (nq == ~0u) break;  // a group smaller than `take`: its whole sum
                q = nq;
                v = nv;
                gv += v;
            }
            if (pi != ~0u && !moe_before(pv, pi, gv, g)) continue;
            if (best == ~0u || moe_before(gv, g, bv, best)) {
                best = g;
                bv = gv;
            }
        }
        chosen |= 1ull << best;
        pv = bv;
        pi = best;
    }
    return chosen;
}

// experts [n, k] in selection order and gates [n, k] of scores s [n, e] with the optional
// selection bias [e]; `groups` 0 for no group limit (else at most 64 groups).
extern "C" __global__ void moe_topk_scored_f32(const float* s, const float* bias, u64 n, u32 e,
                                               u32 k, u32 groups, u32 group_topk, int renormalize,
                                               u32* experts, float* gates) {
    GRID_STRIDE(r, n) {
        const float* row = s + r * e;
        u32 per = groups ? e / groups : 0;
        unsigned long long allowed =
            groups ? moe_groups(row, bias, groups, per, group_topk, max(1u, k / group_topk)) : 0ull;
        float v = 0.0f, sum = 0.0f;
        u32 x = ~0u;
        for (u32 j = 0; j < k; ++j) {
            x = moe_next(row, bias, 0, e, v, x, per, allowed, &v);
            experts[r * k + j] = x;
            sum += row[x];
        }
        for (u32 j = 0; j < k; ++j) {
            float g = row[experts[r * k + j]];
            gates[r * k + j] = renormalize ? g / sum : g;
        }
    }
}

// Column sums of s [n, e] (accumulated in double, as the CPU's aux_loss does): the
// load-balancing loss's per-expert score mass. One thread per expert.
extern "C" __global__ void moe_score_colsum_f32(const float* s, u64 n, u32 e, float* out) {
    GRID_STRIDE(x, e) {
        double acc = 0.0;
        for (u64 r = 0; r < n; ++r) acc += (double)s[r * e + x];
        out[x] = (float)acc;
    }
}

// The scored router's backward in place on d [n, e] before the score function's: through the
// renormalisation g_j = s_j / S over the k chosen [n, k] (ds_j = (dg_j - sum_i dg_i g_i) / S)
// when `renormalize`, then, for sigmoid scores, d *= s (1 - s). (Softmax scores continue with
// moe_router_bwd_f32.) One thread per row.
extern "C" __global__ void moe_scored_bwd_f32(float* d, const float* s, const u32* chosen, u64 n,
                                              u32 e, u32 k, int renormalize, int sigmoid) {
    GRID_STRIDE(r, n) {
        float* dr = d + r * e;
        const float* sr = s + r * e;
        const u32* pick = chosen + r * k;
        if (renormalize) {
            float sum = 0.0f, dot = 0.0f;
            for (u32 j = 0; j < k; ++j) sum += sr[pick[j]];
            for (u32 j = 0; j < k; ++j) dot += dr[pick[j]] * sr[pick[j]] / sum;
            for (u32 j = 0; j < k; ++j) dr[pick[j]] = (dr[pick[j]] - dot) / sum;
        }
        if (sigmoid)
            for (u32 j = 0; j < e; ++j) dr[j] *= sr[j] * (1.0f - sr[j]);
    }
}
