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
