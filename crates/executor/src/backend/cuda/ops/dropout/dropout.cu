// Inverted dropout in place from the counter-based Philox mask of philox.h: the CPU twin is
// executor/src/backend/cpu/ops/dropout.rs (with executor/src/rng.rs's mask). Forward and
// backward are the same launch: the mask is a function of the element's coordinates (seed,
// step, layer and site, global token, element), so the backward redraws it. Launch: 1-D
// grid-stride over rows x cols, 256 threads.
#include "common.cuh"
#include "philox.h"

// x[i, j] *= keep(tokens[i], col_offset + j) ? scale : 0 over rows x cols.
template <typename T>
__device__ void dropout(T* x, const u64* tokens, u64 rows, u64 cols, u64 col_offset, u64 seed,
                        u32 step, u32 layer_site, u64 threshold, float scale) {
    GRID_STRIDE(i, rows * cols) {
        u64 r = i / cols, e = col_offset + i % cols;
        float m = dropout_keep(seed, step, layer_site, tokens[r], e, threshold) ? scale : 0.0f;
        store_f(x, i, load_f(x, i) * m);
    }
}

extern "C" __global__ void dropout_f32(float* x, const u64* tokens, u64 rows, u64 cols, u64 col_offset,
                                       u64 seed, u32 step, u32 layer_site, u64 threshold, float scale) {
    dropout(x, tokens, rows, cols, col_offset, seed, step, layer_site, threshold, scale);
}
extern "C" __global__ void dropout_bf16(__nv_bfloat16* x, const u64* tokens, u64 rows, u64 cols,
                                        u64 col_offset, u64 seed, u32 step, u32 layer_site,
                                        u64 threshold, float scale) {
    dropout(x, tokens, rows, cols, col_offset, seed, step, layer_site, threshold, scale);
}
