// Casts, adds, axpy and fill: the CPU twin is executor/src/backend/cpu/ops/elementwise.rs
// (round_bf16 = __float2bfloat16_rn, add, axpy). axpy is also the sum kernel of the
// single-GPU device-copy collectives. Launch: 1-D grid-stride, 256 threads.
#include "common.cuh"

extern "C" __global__ void cast_f32_to_bf16(const float* x, __nv_bfloat16* y, u64 n) {
    GRID_STRIDE(i, n) y[i] = __float2bfloat16_rn(x[i]);
}

extern "C" __global__ void cast_bf16_to_f32(const __nv_bfloat16* x, float* y, u64 n) {
    GRID_STRIDE(i, n) y[i] = __bfloat162float(x[i]);
}

// out = a + b (out may alias a or b).
template <typename T> __device__ void add(const T* a, const T* b, T* out, u64 n) {
    GRID_STRIDE(i, n) store_f(out, i, load_f(a, i) + load_f(b, i));
}

// y += alpha x.
template <typename T> __device__ void axpy(float alpha, const T* x, T* y, u64 n) {
    GRID_STRIDE(i, n) store_f(y, i, load_f(y, i) + alpha * load_f(x, i));
}

template <typename T> __device__ void fill(T* x, float value, u64 n) {
    GRID_STRIDE(i, n) store_f(x, i, value);
}

extern "C" __global__ void add_f32(const float* a, const float* b, float* o, u64 n) { add(a, b, o, n); }
extern "C" __global__ void add_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, __nv_bfloat16* o, u64 n) { add(a, b, o, n); }
extern "C" __global__ void axpy_f32(float alpha, const float* x, float* y, u64 n) { axpy(alpha, x, y, n); }
extern "C" __global__ void axpy_bf16(float alpha, const __nv_bfloat16* x, __nv_bfloat16* y, u64 n) { axpy(alpha, x, y, n); }
extern "C" __global__ void fill_f32(float* x, float value, u64 n) { fill(x, value, n); }
extern "C" __global__ void fill_bf16(__nv_bfloat16* x, float value, u64 n) { fill(x, value, n); }
