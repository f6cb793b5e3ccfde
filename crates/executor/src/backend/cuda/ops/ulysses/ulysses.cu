// DeepSpeed-Ulysses all-to-all layouts (Jacobs et al. 2023): the CPU twin is
// executor/src/backend/cpu/ops/ulysses.rs (pack, unpack). One launch moves one part (a tensor
// of `heads` heads of width e) between its side (layout 0 = sequence shard [b, s_loc, H, e],
// 1 = head shard [b, s_loc*cp, H/cp, e]) and the chunk buffer: chunk j holds, for each part in
// order, that part's rows for head group j (seq side) or rank j's rows (head side). `part_off`
// is the part's offset inside a chunk, `chunk` the chunk's length. unpack = 1 copies buffer ->
// tensor. Launch: 1-D grid-stride over cp * b * s_loc * (heads/cp) * e.
#include "common.cuh"

template <typename T>
__device__ void ulysses_copy(T* x, T* buf, u64 b, u64 s_loc, u64 cp, u64 heads, u64 e, u64 part_off,
                             u64 chunk, int layout, int unpack) {
    u64 w = heads / cp * e, rows = b * s_loc;
    GRID_STRIDE(i, cp * rows * w) {
        u64 t = i % w, row = (i / w) % rows, j = i / (w * rows);
        u64 c = j * chunk + part_off + row * w + t;
        u64 xo;
        if (layout == 0) {
            xo = row * heads * e + j * w + t;
        } else {
            u64 bi = row / s_loc, il = row % s_loc;
            xo = (bi * s_loc * cp + j * s_loc + il) * w + t;
        }
        if (unpack) x[xo] = buf[c]; else buf[c] = x[xo];
    }
}

extern "C" __global__ void ulysses_copy_f32(float* x, float* buf, u64 b, u64 s_loc, u64 cp, u64 heads,
                                            u64 e, u64 part_off, u64 chunk, int layout, int unpack) {
    ulysses_copy(x, buf, b, s_loc, cp, heads, e, part_off, chunk, layout, unpack);
}
extern "C" __global__ void ulysses_copy_bf16(__nv_bfloat16* x, __nv_bfloat16* buf, u64 b, u64 s_loc,
                                             u64 cp, u64 heads, u64 e, u64 part_off, u64 chunk,
                                             int layout, int unpack) {
    ulysses_copy(x, buf, b, s_loc, cp, heads, e, part_off, chunk, layout, unpack);
}
