// SwiGLU and GeLU (tanh form), forward and backward: the CPU twin is
// executor/src/backend/cpu/ops/activation.rs (act_fwd, act_bwd, act_bwd_inplace). SwiGLU's
// input u is [n, 2f] (gate half then up half), its output [n, f]; GeLU's are both [n, f].
// The backward may run in place (du == u): each thread reads its inputs before writing.
// Launch: 1-D grid-stride over n*f, 256 threads.
#include "common.cuh"

#define GELU_C 0.7978846f

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

template <typename T> __device__ void swiglu_fwd(const T* u, T* out, u64 n, u64 f) {
    GRID_STRIDE(i, n * f) {
        u64 r = i / f, j = i % f;
        float g = load_f(u, r * 2 * f + j), up = load_f(u, r * 2 * f + f + j);
        store_f(out, i, g * sigmoidf(g) * up);
    }
}

template <typename T> __device__ void swiglu_bwd(const T* u, const T* dout, T* du, u64 n, u64 f) {
    GRID_STRIDE(i, n * f) {
        u64 r = i / f, j = i % f;
        float g = load_f(u, r * 2 * f + j), up = load_f(u, r * 2 * f + f + j);
        float s = sigmoidf(g), d = load_f(dout, i);
        store_f(du, r * 2 * f + f + j, d * g * s);
        store_f(du, r * 2 * f + j, d * up * s * (1.0f + g * (1.0f - s)));
    }
}

template <typename T> __device__ void gelu_fwd(const T* u, T* out, u64 n) {
    GRID_STRIDE(i, n) {
        float x = load_f(u, i);
        float t = tanhf(GELU_C * (x + 0.044715f * x * x * x));
        store_f(out, i, 0.5f * x * (1.0f + t));
    }
}

template <typename T> __device__ void gelu_bwd(const T* u, const T* dout, T* du, u64 n) {
    GRID_STRIDE(i, n) {
        float x = load_f(u, i);
        float t = tanhf(GELU_C * (x + 0.044715f * x * x * x));
        float dinner = GELU_C * (1.0f + 3.0f * 0.044715f * x * x);
        store_f(du, i, load_f(dout, i) * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner));
    }
}

#define ACT_INST(S, T)                                                                            \
    extern "C" __global__ void swiglu_fwd_##S(const T* u, T* o, u64 n, u64 f) { swiglu_fwd(u, o, n, f); } \
    extern "C" __global__ void swiglu_bwd_##S(const T* u, const T* d, T* du, u64 n, u64 f) {     \
        swiglu_bwd(u, d, du, n, f);                                                               \
    }                                                                                             \
    extern "C" __global__ void gelu_fwd_##S(const T* u, T* o, u64 n) { gelu_fwd(u, o, n); }      \
    extern "C" __global__ void gelu_bwd_##S(const T* u, const T* d, T* du, u64 n) { gelu_bwd(u, d, du, n); }
ACT_INST(f32, float)
ACT_INST(bf16, __nv_bfloat16)
