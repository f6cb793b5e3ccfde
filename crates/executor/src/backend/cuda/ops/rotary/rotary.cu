// Rotary position embedding (Su et al. 2021, RoFormer), positions-aware for the context-
// parallel layouts: the CPU twin is executor/src/backend/cpu/ops/rotary.rs (rotary). x is
// [rows, heads, d] in place; row r sits at position positions[r % npos]; `inverse` rotates
// back (the backward). Launch: 1-D grid-stride over rows*heads*(d/2), 256 threads.
#include "common.cuh"

template <typename T>
__device__ void rotary(T* x, u64 rows, u32 heads, u32 d, const u32* positions, u64 npos,
                       float theta, int inverse) {
    u32 half = d / 2;
    GRID_STRIDE(i, rows * heads * half) {
        u32 j = (u32)(i % half);
        u64 rh = i / half, r = rh / heads;
        float inv_freq = 1.0f / powf(theta, 2.0f * (float)j / (float)d);
        float s, c;
        sincosf((float)positions[r % npos] * inv_freq, &s, &c);
        if (inverse) s = -s;
        u64 base = rh * d;
        float x1 = load_f(x, base + j), x2 = load_f(x, base + j + half);
        store_f(x, base + j, x1 * c - x2 * s);
        store_f(x, base + j + half, x1 * s + x2 * c);
    }
}

extern "C" __global__ void rotary_f32(float* x, u64 rows, u32 heads, u32 d, const u32* pos, u64 npos,
                                      float theta, int inverse) {
    rotary(x, rows, heads, d, pos, npos, theta, inverse);
}
extern "C" __global__ void rotary_bf16(__nv_bfloat16* x, u64 rows, u32 heads, u32 d, const u32* pos,
                                       u64 npos, float theta, int inverse) {
    rotary(x, rows, heads, d, pos, npos, theta, inverse);
}
