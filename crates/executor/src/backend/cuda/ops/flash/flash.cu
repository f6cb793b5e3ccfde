// Causal block attention with the online softmax (Milakov & Gimelshein 2018; Dao 2023
// FlashAttention-2; Liu et al. 2023 Ring Attention): the CPU twin is
// executor/src/backend/cpu/ops/flash.rs (forward_block, finish, delta, backward_block).
// q [b, sq, hq, d], k [b, sk, hk, d], v [b, sk, hk, dv] and the output [b, sq, hq, dv] (MLA's
// value heads may be narrower than its query/key heads; GQA: query head h reads key head
// h / (hq/hk));
// every row carries its sequence position (qpos [sq], kpos [sk]) and key c is visible to query
// r iff kpos[c] <= qpos[r], so the contiguous, zigzag and gathered context-parallel layouts
// and the ring's block merge all run on it. Statistics max, sum and lse are [b, hq, sq];
// delta is [b, sq, hq]. Scores are never materialised beyond one tile of FLASH_TILE keys (or
// queries) in shared memory. One warp per query row (forward, dQ) or key row (dK, dV), lane
// l holding elements l, l+32, ... of the row (d, dv <= 256).
// Attention dropout (AttnDrop, threshold 0 = none) multiplies each probability by its Philox
// mask (philox.h attn_dropout_keep, keyed by global head, query token and key position exactly
// as rng/attention.rs), after the running sum, which stays the undropped softmax's; backward
// regenerates the mask: dS = P (Z dP - D) and dV += (P Z)^T dO.
// Launch: block FLASH_WARPS*32 threads, grid (ceil(rows / FLASH_WARPS), b * heads), dynamic
// shared memory from the host's geometry (tile rows x (d + dv) floats plus the warps' scores).
#include "common.cuh"
#include "philox.h"

#define FLASH_WARPS 4
#define FLASH_PER_LANE 8  // d <= 32 * 8

// One call's attention dropout (rng/attention.rs AttnDropout, filled by the host): head `h`
// of the call is global head head0 + h, sequence `b` is global sample sample0 + b.
struct AttnDrop {
    u64 seed;
    u64 sample0;
    u64 seq;
    u64 threshold;  // round(p 2^32); 0: no dropout
    u32 step;
    u32 layer;
    u32 head0;
    float scale;  // 1 / (1 - p)
};

// The mask (0 or 1 / (1 - p)) of sequence `bi`, head `h` of the call, query at position `qp`
// and key at position `kp`.
__device__ __forceinline__ float drop_mask(const AttnDrop& dr, u64 bi, u32 h, u32 qp, u32 kp) {
    if (dr.threshold == 0) return 1.0f;
    u64 qtok = (dr.sample0 + bi) * dr.seq + qp;
    return attn_dropout_keep(dr.seed, dr.step, dr.layer, dr.head0 + h, qtok, kp, dr.threshold)
               ? dr.scale
               : 0.0f;
}

// Loads a row's lane elements into r[] (zero past d).
template <typename T> __device__ __forceinline__ void load_row(const T* p, u32 d, float* r) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < FLASH_PER_LANE; ++i) {
        u32 j = lane + 32 * i;
        r[i] = j < d ? load_f(p, j) : 0.0f;
    }
}

// Dot product of the lane elements with a shared row (all lanes get it).
__device__ __forceinline__ float dot_shared(const float* r, const float* s, u32 d) {
    int lane = threadIdx.x & 31;
    float x = 0.0f;
#pragma unroll
    for (int i = 0; i < FLASH_PER_LANE; ++i) {
        u32 j = lane + 32 * i;
        if (j < d) x += r[i] * s[j];
    }
    return warp_sum(x);
}

// Copies rows [c0, c0 + n) of head `head` of a [b, rows, heads, d] tensor into shared [n, d].
template <typename T>
__device__ void load_tile(const T* x, u64 bi, u64 rows, u32 heads, u32 head, u32 d, u64 c0, u32 n,
                          float* s) {
    for (u32 i = threadIdx.x; i < n * d; i += blockDim.x) {
        u32 c = i / d, j = i % d;
        s[i] = load_f(x, ((bi * rows + c0 + c) * heads + head) * d + j);
    }
}

// Merges the keys [0, sk) into the running output acc [b, sq, hq, dv] (unnormalised) and the
// running max and sum (caller initialises them to -inf, 0 and acc to 0).
template <typename T>
__device__ void fwd_block(const T* q, const u32* qpos, u64 sq, const T* k, const T* v,
                          const u32* kpos, u64 sk, u32 hq, u32 hk, u32 d, u32 dv, u32 tile,
                          float scale, AttnDrop dr, float* acc, float* max, float* sum) {
    extern __shared__ float smem[];
    float* ks = smem;
    float* vs = ks + tile * d;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* sc = vs + tile * dv + warp * tile;
    u64 bi = blockIdx.y / hq;
    u32 h = blockIdx.y % hq, kh = h / (hq / hk);
    u64 r = (u64)blockIdx.x * FLASH_WARPS + warp;
    bool live = r < sq;
    u32 qp = live ? qpos[r] : 0;
    float qr[FLASH_PER_LANE], ar[FLASH_PER_LANE];
    if (live) load_row(q + ((bi * sq + r) * hq + h) * d, d, qr);
    else load_row(q, 0, qr);
    u64 si = (bi * hq + h) * sq + r;
    u64 ao = ((bi * sq + r) * hq + h) * dv;
    float m = live ? max[si] : -INFINITY, l = live ? sum[si] : 0.0f;
#pragma unroll
    for (int i = 0; i < FLASH_PER_LANE; ++i) {
        u32 j = lane + 32 * i;
        ar[i] = (live && j < dv) ? acc[ao + j] : 0.0f;
    }
    for (u64 c0 = 0; c0 < sk; c0 += tile) {
        u32 n = (u32)min((u64)tile, sk - c0);
        __syncthreads();
        // Skip a tile that lies wholly in the future of every query of the block (each warp
        // checks every key of the tile against its own row).
        int any = 0;
        for (u32 c = threadIdx.x & 31; c < n; c += 32) any |= kpos[c0 + c] <= qp && live;
        if (!__syncthreads_or(any)) continue;
        load_tile(k, bi, sk, hk, kh, d, c0, n, ks);
        load_tile(v, bi, sk, hk, kh, dv, c0, n, vs);
        __syncthreads();
        if (!live) continue;
        float mt = m;
        for (u32 c = 0; c < n; ++c) {
            float s = kpos[c0 + c] <= qp ? scale * dot_shared(qr, ks + c * d, d) : -INFINITY;
            if (lane == 0) sc[c] = s;
            mt = fmaxf(mt, s);
        }
        __syncwarp();
        if (mt == -INFINITY) continue;
        float alpha = m == -INFINITY ? 0.0f : expf(m - mt), ls = 0.0f;
#pragma unroll
        for (int i = 0; i < FLASH_PER_LANE; ++i) ar[i] *= alpha;
        for (u32 c = 0; c < n; ++c) {
            float s = sc[c];
            if (s == -INFINITY) continue;
            float p = expf(s - mt);
            ls += p;
            p *= drop_mask(dr, bi, h, qp, kpos[c0 + c]);
#pragma unroll
            for (int i = 0; i < FLASH_PER_LANE; ++i) {
                u32 j = lane + 32 * i;
                if (j < dv) ar[i] += p * vs[c * dv + j];
            }
        }
        __syncwarp();
        m = mt;
        l = l * alpha + ls;
    }
    if (!live) return;
#pragma unroll
    for (int i = 0; i < FLASH_PER_LANE; ++i) {
        u32 j = lane + 32 * i;
        if (j < dv) acc[ao + j] = ar[i];
    }
    if (lane == 0) {
        max[si] = m;
        sum[si] = l;
    }
}

// dQ += scale * sum_c P (Z dP - D) K over the visible keys, P rebuilt from lse and the mask
// Z regenerated. One warp per query row.
template <typename T>
__device__ void bwd_dq(const T* q, const u32* qpos, u64 sq, const T* k, const T* v, const u32* kpos,
                       u64 sk, u32 hq, u32 hk, u32 d, u32 dv, u32 tile, float scale, AttnDrop dr,
                       const T* dout, const float* lse, const float* delta, float* dq) {
    extern __shared__ float smem[];
    float* ks = smem;
    float* vs = ks + tile * d;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u64 bi = blockIdx.y / hq;
    u32 h = blockIdx.y % hq, kh = h / (hq / hk);
    u64 r = (u64)blockIdx.x * FLASH_WARPS + warp;
    bool live = r < sq;
    u64 ro = ((bi * sq + r) * hq + h) * d;
    u64 rov = ((bi * sq + r) * hq + h) * dv;
    float qr[FLASH_PER_LANE], dor[FLASH_PER_LANE], g[FLASH_PER_LANE];
    load_row(q + (live ? ro : 0), live ? d : 0, qr);
    load_row(dout + (live ? rov : 0), live ? dv : 0, dor);
    u32 qp = live ? qpos[r] : 0;
    float lr = live ? lse[(bi * hq + h) * sq + r] : 0.0f;
    float dl = live ? delta[(bi * sq + r) * hq + h] : 0.0f;
#pragma unroll
    for (int i = 0; i < FLASH_PER_LANE; ++i) g[i] = 0.0f;
    for (u64 c0 = 0; c0 < sk; c0 += tile) {
        u32 n = (u32)min((u64)tile, sk - c0);
        __syncthreads();
        int any = 0;
        for (u32 c = threadIdx.x & 31; c < n; c += 32) any |= kpos[c0 + c] <= qp && live;
        if (!__syncthreads_or(any)) continue;
        load_tile(k, bi, sk, hk, kh, d, c0, n, ks);
        load_tile(v, bi, sk, hk, kh, dv, c0, n, vs);
        __syncthreads();
        if (!live) continue;
        for (u32 c = 0; c < n; ++c) {
            if (kpos[c0 + c] > qp) continue;
            float p = expf(scale * dot_shared(qr, ks + c * d, d) - lr);
            float z = drop_mask(dr, bi, h, qp, kpos[c0 + c]);
            float ds = p * (z * dot_shared(dor, vs + c * dv, dv) - dl);
#pragma unroll
            for (int i = 0; i < FLASH_PER_LANE; ++i) {
                u32 j = lane + 32 * i;
                if (j < d) g[i] += scale * ds * ks[c * d + j];
            }
        }
    }
    if (!live) return;
#pragma unroll
    for (int i = 0; i < FLASH_PER_LANE; ++i) {
        u32 j = lane + 32 * i;
        if (j < d) dq[ro + j] += g[i];
    }
}

// dK += scale * sum_r dS^T Q and dV += sum_r (P Z)^T dO over the query rows that see the
// key, for every query head of the key head's group. One warp per key row; shared holds a
// tile of queries and output gradients.
template <typename T>
__device__ void bwd_dkdv(const T* q, const u32* qpos, u64 sq, const T* k, const T* v,
                         const u32* kpos, u64 sk, u32 hq, u32 hk, u32 d, u32 dv, u32 tile,
                         float scale, AttnDrop dr, const T* dout, const float* lse,
                         const float* delta, float* dk, float* dvg) {
    extern __shared__ float smem[];
    float* qs = smem;
    float* dos = qs + tile * d;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u64 bi = blockIdx.y / hk;
    u32 kh = blockIdx.y % hk, group = hq / hk;
    u64 c = (u64)blockIdx.x * FLASH_WARPS + warp;
    bool live = c < sk;
    u64 co = ((bi * sk + c) * hk + kh) * d;
    u64 cov = ((bi * sk + c) * hk + kh) * dv;
    float kr[FLASH_PER_LANE], vr[FLASH_PER_LANE], gk[FLASH_PER_LANE], gv[FLASH_PER_LANE];
    load_row(k + (live ? co : 0), live ? d : 0, kr);
    load_row(v + (live ? cov : 0), live ? dv : 0, vr);
    u32 kp = live ? kpos[c] : 0xffffffffu;
#pragma unroll
    for (int i = 0; i < FLASH_PER_LANE; ++i) gk[i] = gv[i] = 0.0f;
    for (u32 h = kh * group; h < (kh + 1) * group; ++h) {
        for (u64 r0 = 0; r0 < sq; r0 += tile) {
            u32 n = (u32)min((u64)tile, sq - r0);
            __syncthreads();
            int any = 0;
            for (u32 r = threadIdx.x & 31; r < n; r += 32) any |= qpos[r0 + r] >= kp && live;
            if (!__syncthreads_or(any)) continue;
            load_tile(q, bi, sq, hq, h, d, r0, n, qs);
            load_tile(dout, bi, sq, hq, h, dv, r0, n, dos);
            __syncthreads();
            if (!live) continue;
            for (u32 r = 0; r < n; ++r) {
                if (qpos[r0 + r] < kp) continue;
                float lr = lse[(bi * hq + h) * sq + r0 + r];
                float dl = delta[(bi * sq + r0 + r) * hq + h];
                float p = expf(scale * dot_shared(kr, qs + r * d, d) - lr);
                float z = drop_mask(dr, bi, h, qpos[r0 + r], kp);
                float ds = p * (z * dot_shared(vr, dos + r * dv, dv) - dl);
                float pz = p * z;
#pragma unroll
                for (int i = 0; i < FLASH_PER_LANE; ++i) {
                    u32 j = lane + 32 * i;
                    if (j < dv) gv[i] += pz * dos[r * dv + j];
                    if (j < d) gk[i] += scale * ds * qs[r * d + j];
                }
            }
        }
    }
    if (!live) return;
#pragma unroll
    for (int i = 0; i < FLASH_PER_LANE; ++i) {
        u32 j = lane + 32 * i;
        if (j < d) dk[co + j] += gk[i];
        if (j < dv) dvg[cov + j] += gv[i];
    }
}

// o = acc / sum in place and lse = max + log(sum); one thread per (sequence, head, row); `d`
// is the output's (value) head width.
extern "C" __global__ void flash_finish_f32(float* o, const float* max, const float* sum, u64 b,
                                            u64 rows, u32 hq, u32 d, float* lse) {
    GRID_STRIDE(si, b * hq * rows) {
        u64 i = si % rows, h = (si / rows) % hq, bi = si / (rows * hq);
        float m = max[si], l = sum[si];
        lse[si] = m + logf(l);
        float* row = o + ((bi * rows + i) * hq + h) * d;
        for (u32 j = 0; j < d; ++j) row[j] /= l;
    }
}

// delta[b, rows, hq] = rowsum(dO * O) per head; one thread per (sequence, row, head); `d` is
// the output's (value) head width.
template <typename T>
__device__ void flash_delta(const T* dout, const float* o, u64 n, u32 d, float* out) {
    GRID_STRIDE(x, n) {
        float s = 0.0f;
        for (u32 j = 0; j < d; ++j) s += load_f(dout, x * d + j) * o[x * d + j];
        out[x] = s;
    }
}

#define FLASH_INST(S, T)                                                                          \
    extern "C" __global__ void flash_fwd_block_##S(                                               \
        const T* q, const u32* qpos, u64 sq, const T* k, const T* v, const u32* kpos, u64 sk,     \
        u32 hq, u32 hk, u32 d, u32 dv, u32 tile, float scale, AttnDrop dr, float* acc,            \
        float* max, float* sum) {                                                                 \
        fwd_block(q, qpos, sq, k, v, kpos, sk, hq, hk, d, dv, tile, scale, dr, acc, max, sum);    \
    }                                                                                             \
    extern "C" __global__ void flash_bwd_dq_##S(                                                  \
        const T* q, const u32* qpos, u64 sq, const T* k, const T* v, const u32* kpos, u64 sk,     \
        u32 hq, u32 hk, u32 d, u32 dv, u32 tile, float scale, AttnDrop dr, const T* dout,         \
        const float* lse, const float* delta, float* dq) {                                        \
        bwd_dq(q, qpos, sq, k, v, kpos, sk, hq, hk, d, dv, tile, scale, dr, dout, lse, delta,     \
               dq);                                                                               \
    }                                                                                             \
    extern "C" __global__ void flash_bwd_dkdv_##S(                                                \
        const T* q, const u32* qpos, u64 sq, const T* k, const T* v, const u32* kpos, u64 sk,     \
        u32 hq, u32 hk, u32 d, u32 dv, u32 tile, float scale, AttnDrop dr, const T* dout,         \
        const float* lse, const float* delta, float* dk, float* dvg) {                            \
        bwd_dkdv(q, qpos, sq, k, v, kpos, sk, hq, hk, d, dv, tile, scale, dr, dout, lse, delta,   \
                 dk, dvg);                                                                        \
    }                                                                                             \
    extern "C" __global__ void flash_delta_##S(const T* dout, const float* o, u64 n, u32 d,       \
                                               float* out) {                                      \
        flash_delta(dout, o, n, d, out);                                                          \
    }
FLASH_INST(f32, float)
FLASH_INST(bf16, __nv_bfloat16)
