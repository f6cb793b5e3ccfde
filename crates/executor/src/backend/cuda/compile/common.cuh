// Shared helpers of parsim's kernels: bf16 <-> f32 loads and stores, warp and block sums.
// Included by every backend/cuda/ops/*/*.cu file (NVRTC gets it as a named header).
#pragma once
#include <cuda_bf16.h>

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float load_f(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ float load_f(const __nv_bfloat16* p, u64 i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store_f(float* p, u64 i, float x) { p[i] = x; }
__device__ __forceinline__ void store_f(__nv_bfloat16* p, u64 i, float x) { p[i] = __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// `scratch` holds 32 floats of shared memory; the call synchronises the block.
__device__ __forceinline__ float block_sum(float x, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    x = warp_sum(x);
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(t);
}

// Maximum over the block, as block_sum.
__device__ __forceinline__ float block_max(float x, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    float t = lane < warps ? scratch[lane] : -INFINITY;
    return warp_max(t);
}

// Grid-stride loop over [0, n).
#define GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)(n); i += (u64)gridDim.x * blockDim.x)
