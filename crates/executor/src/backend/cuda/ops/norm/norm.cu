// RMSNorm and LayerNorm, forward and backward: the CPU twin is
// executor/src/backend/cpu/ops/norm.rs (norm_fwd, norm_dgrad / norm_dgrad_acc, norm_wgrad).
// params = gamma[h] (RMSNorm) or gamma[h] ++ beta[h] (LayerNorm), f32. `layer` = 1 for
// LayerNorm. Forward and dgrad: one block per row; wgrad: one block per NORM_WGRAD_ROWS rows,
// column sums added into dparams atomically.
#include "common.cuh"

#define NORM_WGRAD_ROWS 32

// (mean, rstd) of row x[0..h) (mean 0 for RMSNorm).
template <typename T>
__device__ float2 row_stats(const T* x, u32 h, float eps, int layer, float* scratch) {
    float mean = 0.0f;
    if (layer) {
        float s = 0.0f;
        for (u32 j = threadIdx.x; j < h; j += blockDim.x) s += load_f(x, j);
        mean = block_sum(s, scratch) / (float)h;
    }
    float q = 0.0f;
    for (u32 j = threadIdx.x; j < h; j += blockDim.x) {
        float c = load_f(x, j) - mean;
        q += c * c;
    }
    float var = block_sum(q, scratch) / (float)h;
    return make_float2(mean, rsqrtf(var + eps));
}

template <typename T>
__device__ void norm_fwd(const T* x, const float* params, T* y, u32 h, float eps, int layer) {
    __shared__ float scratch[32];
    u64 row = blockIdx.x;
    const T* xr = x + row * h;
    float2 st = row_stats(xr, h, eps, layer, scratch);
    for (u32 j = threadIdx.x; j < h; j += blockDim.x) {
        float v = (load_f(xr, j) - st.x) * st.y * params[j];
        if (layer) v += params[h + j];
        store_f(y + row * h, j, v);
    }
}

// dx (=, or += with accumulate) from dy, per row.
template <typename T>
__device__ void norm_dgrad(const T* x, const float* params, const T* dy, T* dx, u32 h, float eps,
                           int layer, int accumulate) {
    __shared__ float scratch[32];
    u64 row = blockIdx.x;
    const T* xr = x + row * h;
    const T* dyr = dy + row * h;
    float2 st = row_stats(xr, h, eps, layer, scratch);
    float sg = 0.0f, sgx = 0.0f;
    for (u32 j = threadIdx.x; j < h; j += blockDim.x) {
        float g = load_f(dyr, j) * params[j];
        sg += g;
        sgx += g * (load_f(xr, j) - st.x) * st.y;
    }
    sg = block_sum(sg, scratch);
    sgx = block_sum(sgx, scratch);
    float hf = (float)h;
    for (u32 j = threadIdx.x; j < h; j += blockDim.x) {
        float g = load_f(dyr, j) * params[j];
        float xhat = (load_f(xr, j) - st.x) * st.y;
        float d = layer ? st.y * (g - sg / hf - xhat * sgx / hf) : st.y * (g - xhat * sgx / hf);
        if (accumulate) d += load_f(dx + row * h, j);
        store_f(dx + row * h, j, d);
    }
}

// dparams += sum over rows of dy * xhat (and dy for beta).
template <typename T>
__device__ void norm_wgrad(const T* x, const T* dy, float* dparams, u64 rows, u32 h, float eps,
                           int layer) {
    __shared__ float scratch[32];
    __shared__ float2 stats[NORM_WGRAD_ROWS];
    u64 r0 = (u64)blockIdx.x * NORM_WGRAD_ROWS;
    u32 nr = (u32)min((u64)NORM_WGRAD_ROWS, rows - r0);
    for (u32 r = 0; r < nr; ++r) {
        float2 st = row_stats(x + (r0 + r) * h, h, eps, layer, scratch);
        if (threadIdx.x == 0) stats[r] = st;
    }
    __syncthreads();
    for (u32 j = threadIdx.x; j < h; j += blockDim.x) {
        float dg = 0.0f, db = 0.0f;
        for (u32 r = 0; r < nr; ++r) {
            u64 o = (r0 + r) * h + j;
            float d = load_f(dy, o);
            dg += d * (load_f(x, o) - stats[r].x) * stats[r].y;
            db += d;
        }
        atomicAdd(dparams + j, dg);
        if (layer) atomicAdd(dparams + h + j, db);
    }
}

#define NORM_INST(S, T)                                                                           \
    extern "C" __global__ void norm_fwd_##S(const T* x, const float* p, T* y, u32 h, float eps,  \
                                            int layer) { norm_fwd(x, p, y, h, eps, layer); }      \
    extern "C" __global__ void norm_dgrad_##S(const T* x, const float* p, const T* dy, T* dx,     \
                                              u32 h, float eps, int layer, int acc) {             \
        norm_dgrad(x, p, dy, dx, h, eps, layer, acc);                                             \
    }                                                                                             \
    extern "C" __global__ void norm_wgrad_##S(const T* x, const T* dy, float* dp, u64 rows, u32 h, \
                                              float eps, int layer) {                             \
        norm_wgrad(x, dy, dp, rows, h, eps, layer);                                               \
    }
NORM_INST(f32, float)
NORM_INST(bf16, __nv_bfloat16)
