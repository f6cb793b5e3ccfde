// Multi-head latent attention's head layout (DeepSeek-V2, section 2.1.3): the CPU twin is
// executor/src/backend/cpu/ops/heads.rs (heads_concat, heads_split). Each output head is a's
// head (da wide) then b's (db wide; b is per head, or one vector shared by every head). The
// split is the concat's backward: a shared part's gradient sums its heads in head order, as the
// CPU does. Launch: 1-D grid-stride, 256 threads.
#include "common.cuh"

// out [n, heads, da + db] from a [n, heads, da] and b [n, heads or 1, db].
template <typename T>
__device__ void heads_concat(const T* a, const T* b, T* out, u64 n, u32 heads, u32 da, u32 db,
                             int shared) {
    u64 w = (u64)da + db;
    GRID_STRIDE(i, n * heads * w) {
        u64 rh = i / w, c = i % w, r = rh / heads, h = rh % heads;
        if (c < da) {
            out[i] = a[rh * da + c];
        } else {
            u64 bo = shared ? r * db : (r * heads + h) * db;
            out[i] = b[bo + c - da];
        }
    }
}

// da [n, heads, wa] and db [n, heads or 1, wb] from dout [n, heads, wa + wb]: one thread per
// element of da then of db.
template <typename T>
__device__ void heads_split(const T* dout, T* da, T* db, u64 n, u32 heads, u32 wa, u32 wb,
                            int shared) {
    u64 w = (u64)wa + wb, na = n * heads * wa, hb = shared ? 1 : heads;
    GRID_STRIDE(i, na + n * hb * wb) {
        if (i < na) {
            u64 rh = i / wa;
            da[i] = dout[rh * w + i % wa];
        } else {
            u64 j = i - na, c = j % wb, rb = j / wb;
            if (shared) {
                float s = 0.0f;
                for (u32 h = 0; h < heads; ++h) s += load_f(dout, (rb * heads + h) * w + wa + c);
                store_f(db, j, s);
            } else {
                db[j] = dout[rb * w + wa + c];
            }
        }
    }
}

#define HEADS(T, S)                                                                               \
    extern "C" __global__ void heads_concat_##S(const T* a, const T* b, T* out, u64 n, u32 heads, \
                                                u32 da, u32 db, int shared) {                    \
        heads_concat(a, b, out, n, heads, da, db, shared);                                        \
    }                                                                                             \
    extern "C" __global__ void heads_split_##S(const T* dout, T* da, T* db, u64 n, u32 heads,    \
                                               u32 wa, u32 wb, int shared) {                     \
        heads_split(dout, da, db, n, heads, wa, wb, shared);                                      \
    }
HEADS(float, f32)
HEADS(__nv_bfloat16, bf16)
