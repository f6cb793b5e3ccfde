// Vocab-parallel softmax cross-entropy (Megatron-LM) in pieces, so that the three small
// all-reduces over TP run between them: the CPU twin is
// executor/src/backend/cpu/ops/cross_entropy.rs (row_max, exp_rows, target_logit, loss, grad).
// Each rank holds the logits [n, v] of its vocabulary columns lo..lo+v. Row kernels: one block
// per row (256 threads); target_logit: 1-D grid-stride over n.
#include "common.cuh"

extern "C" __global__ void ce_row_max_f32(const float* logits, u64 v, float* max) {
    __shared__ float scratch[32];
    const float* row = logits + (u64)blockIdx.x * v;
    float m = -INFINITY;
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, row[j]);
    m = block_max(m, scratch);
    if (threadIdx.x == 0) max[blockIdx.x] = m;
}

extern "C" __global__ void ce_exp_rows_f32(const float* logits, u64 v, const float* max, float* probs,
                                           float* sum) {
    __shared__ float scratch[32];
    u64 off = (u64)blockIdx.x * v;
    float m = max[blockIdx.x], s = 0.0f;
    for (u64 j = threadIdx.x; j < v; j += blockDim.x) {
        float e = expf(logits[off + j] - m);
        probs[off + j] = e;
        s += e;
    }
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) sum[blockIdx.x] = s;
}

extern "C" __global__ void ce_target_logit_f32(const float* logits, u64 n, u64 v, const u32* targets,
                                               u64 lo, float* out) {
    GRID_STRIDE(r, n) {
        u64 t = targets[r];
        out[r] = (t >= lo && t < lo + v) ? logits[r * v + t - lo] : 0.0f;
    }
}

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
