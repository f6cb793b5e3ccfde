// Embedding gather and scatter-add over a vocabulary shard [lo, lo + table_rows): the CPU twin
// is executor/src/backend/cpu/ops/embedding.rs (embedding_gather, embedding_scatter_add). Rows
// whose token lies outside the shard are left as they are. Launch: 1-D grid-stride over n*h.
#include "common.cuh"

template <typename T>
__device__ void embedding_gather(const T* table, u64 table_rows, const u32* tokens, u64 n, u64 lo,
                                 u64 h, T* out) {
    GRID_STRIDE(i, n * h) {
        u64 r = i / h, j = i % h, id = tokens[r];
        if (id >= lo && id < lo + table_rows) out[i] = table[(id - lo) * h + j];
    }
}

extern "C" __global__ void embedding_gather_f32(const float* t, u64 tr, const u32* tok, u64 n, u64 lo,
                                                u64 h, float* out) {
    embedding_gather(t, tr, tok, n, lo, h, out);
}
extern "C" __global__ void embedding_gather_bf16(const __nv_bfloat16* t, u64 tr, const u32* tok, u64 n,
                                                 u64 lo, u64 h, __nv_bfloat16* out) {
    embedding_gather(t, tr, tok, n, lo, h, out);
}

// grad[tokens[r] - lo] += dy[r] (f32 gradient; atomics, as tokens repeat).
template <typename T>
__device__ void embedding_scatter_add(const T* dy, const u32* tokens, u64 n, u64 lo, u64 h,
                                      float* grad, u64 grad_rows) {
    GRID_STRIDE(i, n * h) {
        u64 r = i / h, j = i % h, id = tokens[r];
        if (id >= lo && id < lo + grad_rows) atomicAdd(grad + (id - lo) * h + j, load_f(dy, i));
    }
}

extern "C" __global__ void embedding_scatter_add_f32(const float* dy, const u32* tok, u64 n, u64 lo,
                                                     u64 h, float* g, u64 gr) {
    embedding_scatter_add(dy, tok, n, lo, h, g, gr);
}
extern "C" __global__ void embedding_scatter_add_bf16(const __nv_bfloat16* dy, const u32* tok, u64 n,
                                                      u64 lo, u64 h, float* g, u64 gr) {
    embedding_scatter_add(dy, tok, n, lo, h, g, gr);
}
