// Vocab-parallel softmax cross-entropy (Megatron-LM) in pieces, so that the three small
// all-reduces over TP run between them: the CPU twin is
// executor/src/backend/cpu/ops/cross_entropy.rs (row_max, exp_rows, target_logit, loss, grad).
// Each rank holds the logits [n, v] of its vocabulary columns lo..lo+v. Row kernels: one block
// per row (256 threads); target_logit: 1-D grid-stride over n.
#include "common.cuh"

// The three readers of the logits take them in the run's activation dtype (f32, or bf16 in
// the mixed-precision recipe: read straight from the bf16 tensor, never staged as an f32 copy
// of the whole [n, v] block); everything they write is f32.
template <typename T> __device__ void row_max(const T* logits, u64 v, float* max) {
    __shared__ float scratch[32];
    const T* row = logits + (u64)blockIdx.x * v;
    float m = -INFINITY;
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, load_f(row, j));
    m = block_max(m, scratch);
    if (threadIdx.x == 0) max[blockIdx.x] = m;
}

template <typename T>
__device__ void exp_rows(const T* logits, u64 v, const float* max, float* probs, float* sum) {
    __shared__ float scratch[32];
    u64 off = (u64)blockIdx.x * v;
    float m = max[blockIdx.x], s = 0.0f;
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) {
        float e = expf(load_f(logits, off + j) - m);
        probs[off + j] = e;
        s += e;
    }
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) sum[blockIdx.x] = s;
}

template <typename T>
__device__ void target_logit(const T* logits, u64 n, u64 v, const u32* targets, u64 lo, float* out) {
    GRID_STRIDE(r, n) {
        u64 t = targets[r];
        out[r] = (t >= lo && t < lo + v) ? load_f(logits, r * v + t - lo) : 0.0f;
    }
}

#define CE_INST(S, T)                                                                             \
    extern "C" __global__ void ce_row_max_##S(const T* logits, u64 v, float* max) {               \
        row_max(logits, v, max);                                                                  \
    }                                                                                             \
    extern "C" __global__ void ce_exp_rows_##S(const T* logits, u64 v, const float* max,          \
                                               float* probs, float* sum) {                        \
        exp_rows(logits, v, max, probs, sum);                                                     \
    }                                                                                             \
    extern "C" __global__ void ce_target_logit_##S(const T* logits, u64 n, u64 v,                 \
                                                   const u32* targets, u64 lo, float* out) {      \
        target_logit(logits, n, v, targets, lo, out);                                             \
    }
CE_INST(f32, float)
CE_INST(bf16, __nv_bfloat16)

// Normalises probs by the global row sums; row_loss[r] = log(sum) + max - target logit (the
// host or a sum kernel adds the rows; the CPU returns that sum).
extern "C" __global__ void ce_loss_f32(float* probs, u64 v, const float* sum, const float* max,
                                       const float* target_logit, float* row_loss) {
    u64 r = blockIdx.x, off = r * v;
    float s = sum[r];
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) probs[off + j] /= s;
    if (threadIdx.x == 0) row_loss[r] = logf(s) + max[r] - target_logit[r];
}

// In place: probs = scale * (probs - onehot(target)).
extern "C" __global__ void ce_grad_f32(float* probs, u64 v, const u32* targets, u64 lo, float scale) {
    u64 r = blockIdx.x, off = r * v, t = targets[r];
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) {
        float p = probs[off + j];
        if (t >= lo && t - lo == j) p -= 1.0f;
        probs[off + j] = p * scale;
    }
}
