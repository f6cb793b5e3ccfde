// Causal block attention for bf16 on tensor cores: FlashAttention-2 (Dao 2023) tiled with
// mma.sync m16n8k16 (bf16 in, f32 accumulate), ldmatrix and cp.async, for head dims 64 and
// 128 (d = dv). Same semantics and buffers as backend/cuda/ops/flash/flash.cu (whose CPU twin is
// executor/src/backend/cpu/ops/flash.rs): q [b, sq, hq, d], k and v [b, sk, hk, d] (GQA), row
// positions qpos [sq] and kpos [sk] (key c visible to query r iff kpos[c] <= qpos[r]), running
// f32 acc [b, sq, hq, d] and max, sum [b, hq, sq] merged across calls; backward from the final
// lse [b, hq, sq] and delta [b, sq, hq], adding into f32 dq, dk, dv.
// Every side also passes `rng`, the (min, max) position of each group of 32 rows (computed on
// the host): a tile whose keys all lie in the future of every query of the block is skipped
// without being loaded (causal: about half the tiles), and a tile wholly in the past runs
// without the per-element mask.
// Tiles: forward 64 queries (4 warps x 16 rows) against 64-key tiles, K and V in swizzled
// shared memory (V's load overlaps Q K^T, the next K's overlaps P V); dQ 64 queries against
// 32-key tiles (the next V's load overlaps S and dQ, the next K's the next dP); dK dV 64 keys
// (4 warps x 16) against 32-query tiles over the group's query heads (the next Q's load
// overlaps dV, the next dO's the next S). The backward is one kernel by key blocks with dQ
// added by atomics (FlashAttention-2's five products per tile), or, deterministic, two (dQ by
// query blocks, then dK dV), no atomics. Shared memory 6 x 64 x d bytes (48 KiB at d 128), the
// fused backward 4 KiB more.
// Launch: block 128 threads, grid (ceil(rows / 64), b * heads); rows are queries (forward,
// dQ) or keys (dK dV); the heaviest causal blocks are started first.
#include "common.cuh"

#define MMA_THREADS 128
#define RG 32  // rows per position-range group
#define LOG2E 1.4426950408889634f

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// 16-byte asynchronous copy global -> shared; zero-fills when `ok` is false.
__device__ __forceinline__ void cp16(void* dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
__device__ __forceinline__ void cp_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

__device__ __forceinline__ void ldsm4(u32 a, u32* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm4t(u32 a, u32* r) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// c += a b: a 16x16 (row), b 16x8 (col), bf16 in, f32 accumulate.
__device__ __forceinline__ void mma(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<u32*>(&v);
}

// Shared tiles are [rows][D] bf16 with the 16-byte chunk c of row r stored at chunk
// c ^ (r & 7), so ldmatrix's eight rows hit eight different banks.
template <int D> __device__ __forceinline__ u32 sw(const bf16* base, int r, int chunk) {
    return smem_addr(base + r * D + ((chunk ^ (r & 7)) << 3));
}

// Rows [r0, r0 + ROWS) of head `head` of a [b, n, heads, D] tensor into a swizzled tile
// (rows past n zero-filled).
template <int ROWS, int D>
__device__ __forceinline__ void load_tile(bf16* s, const bf16* x, u64 bi, u64 n, u32 heads,
                                          u32 head, u64 r0) {
    constexpr int CH = D / 8;
    for (int i = threadIdx.x; i < ROWS * CH; i += MMA_THREADS) {
        int r = i / CH, c = i % CH;
        bool ok = r0 + r < n;
        const bf16* src = ok ? x + ((bi * n + r0 + r) * heads + head) * D + c * 8 : x;
        cp16(s + r * D + ((c ^ (r & 7)) << 3), src, ok);
    }
}

// A fragment (16x16) at rows r0.., columns k0.. of a swizzled tile.
template <int D> __device__ __forceinline__ void frag_a(const bf16* s, int r0, int k0, u32* a) {
    int lane = threadIdx.x & 31;
    ldsm4(sw<D>(s, r0 + (lane & 15), (k0 >> 3) + (lane >> 4)), a);
}

// B fragments of two n8 tiles (n0.., n0 + 8..) for k0..k0+15 from a tile stored [n][k].
template <int D> __device__ __forceinline__ void frag_b(const bf16* s, int n0, int k0, u32* b) {
    int lane = threadIdx.x & 31, m = lane >> 3;
    ldsm4(sw<D>(s, n0 + ((m >> 1) << 3) + (lane & 7), (k0 >> 3) + (m & 1)), b);
}

// The same from a tile stored [k][n] (transposed on load).
template <int D> __device__ __forceinline__ void frag_bt(const bf16* s, int n0, int k0, u32* b) {
    int lane = threadIdx.x & 31, m = lane >> 3;
    ldsm4t(sw<D>(s, k0 + ((m & 1) << 3) + (lane & 7), (n0 >> 3) + (m >> 1)), b);
}

// c[NT][4] (NT n8 tiles of a 16-row strip) += A(16 x K, swizzled tile at row a0) B, with B's
// rows n0 + 0..8*NT from a tile stored [n][k].
template <int D, int NT, int K>
__device__ __forceinline__ void gemm_nt(float (*c)[4], const bf16* as, int a0, const bf16* bs) {
#pragma unroll 2
    for (int k0 = 0; k0 < K; k0 += 16) {
        u32 a[4];
        frag_a<D>(as, a0, k0, a);
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            u32 b[4];
            frag_b<D>(bs, j * 8, k0, b);
            mma(c[j], a, b[0], b[1]);
            mma(c[j + 1], a, b[2], b[3]);
        }
    }
}

// o[D/8][4] += P B where P (16 x KT*16) sits in registers as accumulator tiles p[2*KT][4] and
// B [k][n] is a tile stored [k][D].
template <int D, int KT>
__device__ __forceinline__ void gemm_pv(float (*o)[4], float (*p)[4], const bf16* bs) {
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
        u32 a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                    pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                    pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int j = 0; j < D / 8; j += 2) {
            u32 b[4];
            frag_bt<D>(bs, j * 8, kk * 16, b);
            mma(o[j], a, b[0], b[1]);
            mma(o[j + 1], a, b[2], b[3]);
        }
    }
}

// (min, max) position over the groups [g0, g0 + n) of `rng` (only groups < ng exist).
__device__ __forceinline__ void range_of(const u32* rng, u64 g0, int n, u64 ng, u32& lo, u32& hi) {
    lo = 0xffffffffu;
    hi = 0;
    for (int i = 0; i < n; ++i)
        if (g0 + i < ng) {
            lo = min(lo, rng[2 * (g0 + i)]);
            hi = max(hi, rng[2 * (g0 + i) + 1]);
        }
}

// Whether group g may hold a visible pair: on the keys side its minimum position is at or
// before `bound` (the block's last query); on the queries side its maximum is at or after
// `bound` (the block's first key). Groups past ng are not live.
template <bool KEYS>
__device__ __forceinline__ bool group_live(const u32* rng, u64 g, u64 ng, u32 bound) {
    if (g >= ng) return false;
    return KEYS ? rng[2 * g] <= bound : rng[2 * g + 1] >= bound;
}

// The first live tile (of STEP groups, group-aligned at `from`) at or after group `from`, or
// ng. `first` is lane i's group_live for group from + i, loaded ahead so that its latency
// overlaps the tile's matrix products; further groups are scanned 32 at a time.
template <int STEP, bool KEYS>
__device__ u64 next_tile(const u32* rng, u64 from, u64 ng, u32 bound, bool first) {
    int lane = threadIdx.x & 31;
    unsigned m = __ballot_sync(0xffffffffu, first);
    for (u64 g = from; g < ng; g += 32) {
        if (g != from) m = __ballot_sync(0xffffffffu, group_live<KEYS>(rng, g + lane, ng, bound));
        if (m) return g + (((u64)(__ffs(m) - 1)) / STEP) * STEP;
    }
    return ng;
}

template <int STEP, bool KEYS>
__device__ __forceinline__ u64 next_tile_now(const u32* rng, u64 from, u64 ng, u32 bound) {
    int lane = threadIdx.x & 31;
    return next_tile<STEP, KEYS>(rng, from, ng, bound, group_live<KEYS>(rng, from + lane, ng, bound));
}

// The row block of this CTA, heaviest first: for causal queries the last rows see the most
// keys, for keys the first rows are seen by the most queries.
__device__ __forceinline__ u64 row_block(bool last_first) {
    return last_first ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
}

// Forward: merges the keys [0, sk) into the running acc, max and sum of 64 query rows.
template <int D>
__device__ void mma_fwd(const bf16* q, const u32* qpos, const u32* qrng, u64 sq, const bf16* k,
                        const bf16* v, const u32* kpos, const u32* krng, u64 sk, u32 hq, u32 hk,
                        float scale, float* acc, float* mx, float* sm) {
    constexpr int BR = 64, BC = 64, NT = BC / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* qs = reinterpret_cast<bf16*>(smem_raw);
    bf16* ks = qs + BR * D;
    bf16* vs = ks + BC * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    u64 bi = blockIdx.y / hq;
    u32 h = blockIdx.y % hq, kh = h / (hq / hk);
    u64 r0 = row_block(true) * BR;
    u64 nqg = (sq + RG - 1) / RG, nkg = (sk + RG - 1) / RG;
    u32 qlo, qhi;
    range_of(qrng, r0 / RG, BR / RG, nqg, qlo, qhi);
    bool rows_full = r0 + BR <= sq;
    u64 ra = r0 + warp * 16 + g, rb = ra + 8;
    bool va = ra < sq, vb = rb < sq;
    u32 pa = va ? qpos[ra] : 0xffffffffu, pb = vb ? qpos[rb] : 0xffffffffu;
    u64 c0 = next_tile_now<BC / RG, true>(krng, 0, nkg, qhi) * RG;
    if (c0 >= sk) return;  // nothing visible: the running state stays as it is
    load_tile<BR, D>(qs, q, bi, sq, hq, h, r0);
    load_tile<BC, D>(ks, k, bi, sk, hk, kh, c0);
    cp_commit();
    // Running state of rows a and b: the sum is kept per thread and summed over the quad
    // at the end (the initial sum sits in thread t == 0).
    u64 sa = (bi * hq + h) * sq + ra, sb = sa + 8;
    float ma = va ? mx[sa] : -INFINITY, mb = vb ? mx[sb] : -INFINITY;
    float la = (va && t == 0) ? sm[sa] : 0.0f, lb = (vb && t == 0) ? sm[sb] : 0.0f;
    float o[DT][4];
    u64 oa = ((bi * sq + ra) * hq + h) * D + 2 * t, ob = ((bi * sq + rb) * hq + h) * D + 2 * t;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
        float2 xa = va ? *reinterpret_cast<const float2*>(acc + oa + j * 8) : make_float2(0, 0);
        float2 xb = vb ? *reinterpret_cast<const float2*>(acc + ob + j * 8) : make_float2(0, 0);
        o[j][0] = xa.x;
        o[j][1] = xa.y;
        o[j][2] = xb.x;
        o[j][3] = xb.y;
    }
    cp_wait_all();
    __syncthreads();
    u32 qf[D / 16][4];
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) frag_a<D>(qs, warp * 16, kc * 16, qf[kc]);
    const float sl2 = scale * LOG2E;
    while (c0 < sk) {
        cp_wait_all();
        __syncthreads();  // K(c0) landed; every warp is done with the previous V
        load_tile<BC, D>(vs, v, bi, sk, hk, kh, c0);
        cp_commit();
        // Loaded ahead: this tile's position range and the next tiles' liveness.
        u32 klo, khi;
        range_of(krng, c0 / RG, BC / RG, nkg, klo, khi);
        u64 gn = c0 / RG + BC / RG;
        bool live_n = group_live<true>(krng, gn + lane, nkg, qhi);
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < D / 16; ++kc)
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                u32 b[4];
                frag_b<D>(ks, j * 8, kc * 16, b);
                mma(s[j], qf[kc], b[0], b[1]);
                mma(s[j + 1], qf[kc], b[2], b[3]);
            }
        bool full = rows_full && c0 + BC <= sk && khi <= qlo;
        // Raw scores, masked to -inf; the row maxima (scale > 0 commutes with max).
        float ta = -INFINITY, tb = -INFINITY;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (!full) {
                    u64 c = c0 + j * 8 + 2 * t + e;
                    u32 kp = c < sk ? kpos[c] : 0xffffffffu;
                    bool ok = c < sk;
                    if (!(ok && kp <= pa)) s[j][e] = -INFINITY;
                    if (!(ok && kp <= pb)) s[j][2 + e] = -INFINITY;
                }
                ta = fmaxf(ta, s[j][e]);
                tb = fmaxf(tb, s[j][2 + e]);
            }
        ta = fmaxf(ta, __shfl_xor_sync(0xffffffffu, ta, 1));
        ta = fmaxf(ta, __shfl_xor_sync(0xffffffffu, ta, 2));
        tb = fmaxf(tb, __shfl_xor_sync(0xffffffffu, tb, 1));
        tb = fmaxf(tb, __shfl_xor_sync(0xffffffffu, tb, 2));
        float na = fmaxf(ma, ta * scale), nb = fmaxf(mb, tb * scale);
        float ua = na == -INFINITY ? 0.0f : na, ub = nb == -INFINITY ? 0.0f : nb;
        float aa = exp2f((ma - ua) * LOG2E), ab = exp2f((mb - ub) * LOG2E);
        float ea = ua * LOG2E, eb = ub * LOG2E;
        float psa = 0.0f, psb = 0.0f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            s[j][0] = exp2f(fmaf(s[j][0], sl2, -ea));
            s[j][1] = exp2f(fmaf(s[j][1], sl2, -ea));
            s[j][2] = exp2f(fmaf(s[j][2], sl2, -eb));
            s[j][3] = exp2f(fmaf(s[j][3], sl2, -eb));
            psa += s[j][0] + s[j][1];
            psb += s[j][2] + s[j][3];
        }
        la = la * aa + psa;
        lb = lb * ab + psb;
        ma = na;
        mb = nb;
#pragma unroll
        for (int j = 0; j < DT; ++j) {
            o[j][0] *= aa;
            o[j][1] *= aa;
            o[j][2] *= ab;
            o[j][3] *= ab;
        }
        u64 cn = next_tile<BC / RG, true>(krng, gn, nkg, qhi, live_n) * RG;
        cp_wait_all();
        __syncthreads();  // V(c0) landed; every warp is done with K(c0)
        if (cn < sk) load_tile<BC, D>(ks, k, bi, sk, hk, kh, cn);
        cp_commit();
        gemm_pv<D, BC / 16>(o, s, vs);
        c0 = cn;
    }
    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
#pragma unroll
    for (int j = 0; j < DT; ++j) {
        if (va) *reinterpret_cast<float2*>(acc + oa + j * 8) = make_float2(o[j][0], o[j][1]);
        if (vb) *reinterpret_cast<float2*>(acc + ob + j * 8) = make_float2(o[j][2], o[j][3]);
    }
    if (t == 0) {
        if (va) {
            mx[sa] = ma;
            sm[sa] = la;
        }
        if (vb) {
            mx[sb] = mb;
            sm[sb] = lb;
        }
    }
}

// P and dS of one 16 x (8*NT) strip in place of the scores s and dP dp: p = exp(s*scale -
// lse), ds = p (dp - delta), entries whose bit of `vis` (j*4 + e) is clear 0. The statistics
// `l2` (lse * log2 e) and `dl` (delta) are per row {a, b} or, with COLS, per column j*2 + e%2.
template <int NT, bool COLS>
__device__ __forceinline__ void softmax_grad(float (*s)[4], float (*dp)[4], float sl2,
                                             const float* l2, const float* dl, u32 vis) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int i = COLS ? j * 2 + (e & 1) : (e >> 1);
            bool on = (vis >> (j * 4 + e)) & 1;
            float p = on ? exp2f(s[j][e] * sl2 - l2[i]) : 0.0f;
            s[j][e] = p;
            dp[j][e] = on ? p * (dp[j][e] - dl[i]) : 0.0f;
        }
}

// dQ += scale * dS K over the visible keys, for 64 query rows against 32-key tiles.
template <int D>
__device__ void mma_dq(const bf16* q, const u32* qpos, const u32* qrng, u64 sq, const bf16* k,
                       const bf16* v, const u32* kpos, const u32* krng, u64 sk, u32 hq, u32 hk,
                       float scale, const bf16* dout, const float* lse, const float* delta,
                       float* dq) {
    constexpr int BR = 64, BC = 32, NT = BC / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* qs = reinterpret_cast<bf16*>(smem_raw);
    bf16* dos = qs + BR * D;
    bf16* ks = dos + BR * D;
    bf16* vs = ks + BC * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    u64 bi = blockIdx.y / hq;
    u32 h = blockIdx.y % hq, kh = h / (hq / hk);
    u64 r0 = row_block(true) * BR;
    u64 nqg = (sq + RG - 1) / RG, nkg = (sk + RG - 1) / RG;
    u32 qlo, qhi;
    range_of(qrng, r0 / RG, BR / RG, nqg, qlo, qhi);
    bool rows_full = r0 + BR <= sq;
    u64 ra = r0 + warp * 16 + g, rb = ra + 8;
    bool va = ra < sq, vb = rb < sq;
    u32 pa = va ? qpos[ra] : 0xffffffffu, pb = vb ? qpos[rb] : 0xffffffffu;
    float la = va ? lse[(bi * hq + h) * sq + ra] * LOG2E : 0.0f;
    float lb = vb ? lse[(bi * hq + h) * sq + rb] * LOG2E : 0.0f;
    float da = va ? delta[(bi * sq + ra) * hq + h] : 0.0f;
    float db = vb ? delta[(bi * sq + rb) * hq + h] : 0.0f;
    u64 c0 = next_tile_now<BC / RG, true>(krng, 0, nkg, qhi) * RG;
    if (c0 >= sk) return;
    // Three copy groups in flight at the loop's head: (Q, dO), V(c0), K(c0). V is used first
    // (dP), so its successor is loaded while S and dQ run; K's successor while the next dP
    // runs.
    load_tile<BR, D>(qs, q, bi, sq, hq, h, r0);
    load_tile<BR, D>(dos, dout, bi, sq, hq, h, r0);
    cp_commit();
    load_tile<BC, D>(vs, v, bi, sk, hk, kh, c0);
    cp_commit();
    load_tile<BC, D>(ks, k, bi, sk, hk, kh, c0);
    cp_commit();
    float acc[DT][4];
#pragma unroll
    for (int j = 0; j < DT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const float sl2 = scale * LOG2E;
    while (c0 < sk) {
        u32 klo, khi;
        range_of(krng, c0 / RG, BC / RG, nkg, klo, khi);
        u64 gn = c0 / RG + BC / RG;
        bool live_n = group_live<true>(krng, gn + lane, nkg, qhi);
        cp_wait_one();
        __syncthreads();  // Q, dO and V(c0) landed
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.0f;
        gemm_nt<D, NT, D>(dp, dos, warp * 16, vs);
        u64 cn = next_tile<BC / RG, true>(krng, gn, nkg, qhi, live_n) * RG;
        cp_wait_all();
        __syncthreads();  // K(c0) landed; every warp is done with V(c0)
        if (cn < sk) load_tile<BC, D>(vs, v, bi, sk, hk, kh, cn);
        cp_commit();
        gemm_nt<D, NT, D>(s, qs, warp * 16, ks);
        bool full = rows_full && c0 + BC <= sk && khi <= qlo;
        u32 vis = 0;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                u64 c = c0 + j * 8 + 2 * t + e;
                u32 kp = full ? 0 : (c < sk ? kpos[c] : 0xffffffffu);
                bool ok = full || c < sk;
                vis |= (u32)(ok && kp <= pa) << (j * 4 + e);
                vis |= (u32)(ok && kp <= pb) << (j * 4 + 2 + e);
            }
        const float l2[2] = {la, lb}, dl[2] = {da, db};
        softmax_grad<NT, false>(s, dp, sl2, l2, dl, vis);
        // dQ += dS K: dS (in dp) as the A operand, K [key][d] as B [k][n].
        gemm_pv<D, BC / 16>(acc, dp, ks);
        __syncthreads();  // every warp is done with K(c0)
        if (cn < sk) load_tile<BC, D>(ks, k, bi, sk, hk, kh, cn);
        cp_commit();
        c0 = cn;
    }
    u64 oa = ((bi * sq + ra) * hq + h) * D + 2 * t, ob = ((bi * sq + rb) * hq + h) * D + 2 * t;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
        if (va) {
            float2* p = reinterpret_cast<float2*>(dq + oa + j * 8);
            float2 x = *p;
            *p = make_float2(x.x + scale * acc[j][0], x.y + scale * acc[j][1]);
        }
        if (vb) {
            float2* p = reinterpret_cast<float2*>(dq + ob + j * 8);
            float2 x = *p;
            *p = make_float2(x.x + scale * acc[j][2], x.y + scale * acc[j][3]);
        }
    }
}

// p[0..2] += (x, y): one paired store, or two atomic adds where other blocks add to the
// same elements.
template <bool ATOMIC> __device__ __forceinline__ void add2(float* p, float x, float y) {
    if (ATOMIC) {
        atomicAdd(p, x);
        atomicAdd(p + 1, y);
    } else {
        float2* q = reinterpret_cast<float2*>(p);
        float2 v = *q;
        *q = make_float2(v.x + x, v.y + y);
    }
}

// dQ of the 16 rows qr0.. of the query tile at r0 (head h), d/2 columns from n0: scale * dS
// K summed over a block's 64 keys, from dS [query][key] and K [key][d] (swizzled tiles in
// shared memory), added to the f32 dq with atomics (other key blocks add to the same rows).
template <int D>
__device__ __forceinline__ void dq_tile(const bf16* dss, const bf16* ks, float* dq, u64 bi,
                                        u64 sq, u32 hq, u32 h, u64 r0, int qr0, int n0,
                                        float scale) {
    constexpr int BK = 64, QT = D / 16;
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float a[QT][4];
#pragma unroll
    for (int j = 0; j < QT; ++j) a[j][0] = a[j][1] = a[j][2] = a[j][3] = 0.0f;
#pragma unroll
    for (int k0 = 0; k0 < BK; k0 += 16) {
        u32 af[4];
        frag_a<BK>(dss, qr0, k0, af);
#pragma unroll
        for (int j = 0; j < QT; j += 2) {
            u32 b[4];
            frag_bt<D>(ks, n0 + j * 8, k0, b);
            mma(a[j], af, b[0], b[1]);
            mma(a[j + 1], af, b[2], b[3]);
        }
    }
    u64 ra = r0 + qr0 + g, rb = ra + 8;
    float* pa = dq + ((bi * sq + ra) * hq + h) * D + n0 + 2 * t;
    float* pb = dq + ((bi * sq + rb) * hq + h) * D + n0 + 2 * t;
#pragma unroll
    for (int j = 0; j < QT; ++j) {
        if (ra < sq) {
            atomicAdd(pa + j * 8, scale * a[j][0]);
            atomicAdd(pa + j * 8 + 1, scale * a[j][1]);
        }
        if (rb < sq) {
            atomicAdd(pb + j * 8, scale * a[j][2]);
            atomicAdd(pb + j * 8 + 1, scale * a[j][3]);
        }
    }
}

// dK += scale * dS^T Q and dV += P^T dO for 64 key rows, over 32-query tiles of every query
// head of the key head's group (transposed scores: rows are keys, columns queries). With DQ
// this is the backward as FlashAttention-2 runs it (Dao 2023, "FlashAttention-2", Algorithm
// 2): dS also goes through shared memory for dQ += scale * dS K, added to the f32 dq with
// atomics, five matrix products per tile where the two-kernel path (mma_dq, then this without
// DQ) runs seven; a block then takes one query head, so GQA's dK and dV are added with atomics
// too, and the order of the adds makes the gradients nondeterministic in their last bits.
// Shared memory: K and V (64 x d), Q and dO (32 x d), with DQ dS (32 x 64): 384 d bytes, or
// 384 d + 4096 (52 KiB at d 128, opted in by the host).
template <int D, bool DQ>
__device__ void mma_bwd(const bf16* q, const u32* qpos, const u32* qrng, u64 sq, const bf16* k,
                        const bf16* v, const u32* kpos, const u32* krng, u64 sk, u32 hq, u32 hk,
                        float scale, const bf16* dout, const float* lse, const float* delta,
                        float* dq, float* dk, float* dv) {
    constexpr int BK = 64, BQ = 32, NT = BQ / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* ks = reinterpret_cast<bf16*>(smem_raw);
    bf16* vs = ks + BK * D;
    bf16* qs = vs + BK * D;
    bf16* dos = qs + BQ * D;
    bf16* dss = dos + BQ * D;  // dS [query][key], swizzled as the other tiles
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    // Without DQ a block takes every query head of its key head's group (grid y = b x hk)
    // and owns its dK, dV rows; with DQ one query head (grid y = b x hq, four times the
    // blocks under GQA 4:1), the group's blocks adding their dK, dV with atomics.
    u32 group = hq / hk;
    u64 bi = blockIdx.y / (DQ ? hq : hk);
    u32 h = DQ ? blockIdx.y % hq : (blockIdx.y % hk) * group;
    u32 kh = h / group;
    const u32 hend = DQ ? h + 1 : h + group;
    u64 c0 = row_block(false) * BK;
    u64 nqg = (sq + RG - 1) / RG, nkg = (sk + RG - 1) / RG;
    u32 klo, khi;
    range_of(krng, c0 / RG, BK / RG, nkg, klo, khi);
    bool keys_full = c0 + BK <= sk;
    u64 ca = c0 + warp * 16 + g, cb = ca + 8;
    bool va = ca < sk, vb = cb < sk;
    u32 pa = va ? kpos[ca] : 0xffffffffu, pb = vb ? kpos[cb] : 0xffffffffu;
    const u64 first = next_tile_now<BQ / RG, false>(qrng, 0, nqg, klo) * RG;
    if (first >= sq) return;
    u64 r0 = first;
    load_tile<BK, D>(ks, k, bi, sk, hk, kh, c0);
    load_tile<BK, D>(vs, v, bi, sk, hk, kh, c0);
    load_tile<BQ, D>(qs, q, bi, sq, hq, h, r0);
    cp_commit();
    load_tile<BQ, D>(dos, dout, bi, sq, hq, h, r0);
    cp_commit();
    float gk[DT][4], gv[DT][4];
#pragma unroll
    for (int j = 0; j < DT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) gk[j][e] = gv[j][e] = 0.0f;
    const float sl2 = scale * LOG2E;
    // dQ's share of this warp: query rows qr0.. of the tile, columns n0.. (half of d).
    const int qr0 = (warp & 1) * 16, n0 = (warp >> 1) * (D / 2);
    while (h < hend) {
        u64 gn = r0 / RG + BQ / RG;
        bool live_n = group_live<false>(qrng, gn + lane, nqg, klo);
        cp_wait_one();
        __syncthreads();  // K, V and Q(h, r0) landed; every warp is done with the last dS
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.0f;
        gemm_nt<D, NT, D>(s, ks, warp * 16, qs);
        u64 rn = next_tile<BQ / RG, false>(qrng, gn, nqg, klo, live_n) * RG;
        u32 hn = h;
        if (rn >= sq) {
            hn = h + 1;
            rn = first;
        }
        u32 qlo, qhi;
        range_of(qrng, r0 / RG, BQ / RG, nqg, qlo, qhi);
        bool full = keys_full && r0 + BQ <= sq && qlo >= khi;
        float l2[NT * 2], dl[NT * 2];
        u32 vis = 0;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                u64 r = r0 + j * 8 + 2 * t + e;
                bool ok = r < sq;
                u32 qp = (full || !ok) ? 0xffffffffu : qpos[r];
                l2[j * 2 + e] = ok ? lse[(bi * hq + h) * sq + r] * LOG2E : 0.0f;
                dl[j * 2 + e] = ok ? delta[(bi * sq + r) * hq + h] : 0.0f;
                vis |= (u32)(ok && (full || pa <= qp)) << (j * 4 + e);
                vis |= (u32)(ok && (full || pb <= qp)) << (j * 4 + 2 + e);
            }
        cp_wait_all();
        __syncthreads();  // dO(h, r0) landed
        gemm_nt<D, NT, D>(dp, vs, warp * 16, dos);
        softmax_grad<NT, true>(s, dp, sl2, l2, dl, vis);
        // dS^T (this warp's 16 keys x 32 queries) into dss as [query][key].
        const int ka = warp * 16 + g, kb = ka + 8;
#pragma unroll
        for (int j = 0; j < (DQ ? NT : 0); ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                int qc = j * 8 + 2 * t + e;
                bf16* row = dss + qc * BK;
                row[((ka >> 3) ^ (qc & 7)) * 8 + (ka & 7)] = __float2bfloat16_rn(dp[j][e]);
                row[((kb >> 3) ^ (qc & 7)) * 8 + (kb & 7)] = __float2bfloat16_rn(dp[j][2 + e]);
            }
        gemm_pv<D, BQ / 16>(gk, dp, qs);
        __syncthreads();  // every warp is done with Q(h, r0); dS is whole
        if (hn < hend) load_tile<BQ, D>(qs, q, bi, sq, hq, hn, rn);
        cp_commit();
        gemm_pv<D, BQ / 16>(gv, s, dos);
        if (DQ) dq_tile<D>(dss, ks, dq, bi, sq, hq, h, r0, qr0, n0, scale);
        __syncthreads();  // every warp is done with dO(h, r0) and dS
        if (hn < hend) load_tile<BQ, D>(dos, dout, bi, sq, hq, hn, rn);
        cp_commit();
        h = hn;
        r0 = rn;
    }
    u64 oa = ((bi * sk + ca) * hk + kh) * D + 2 * t, ob = ((bi * sk + cb) * hk + kh) * D + 2 * t;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
        if (va) add2<DQ>(dk + oa + j * 8, scale * gk[j][0], scale * gk[j][1]);
        if (va) add2<DQ>(dv + oa + j * 8, gv[j][0], gv[j][1]);
        if (vb) add2<DQ>(dk + ob + j * 8, scale * gk[j][2], scale * gk[j][3]);
        if (vb) add2<DQ>(dv + ob + j * 8, gv[j][2], gv[j][3]);
    }
}

#define MMA_FWD_ARGS                                                                               \
    const bf16 *q, const u32 *qpos, const u32 *qrng, u64 sq, const bf16 *k, const bf16 *v,         \
        const u32 *kpos, const u32 *krng, u64 sk, u32 hq, u32 hk, float scale
#define MMA_FWD_PASS q, qpos, qrng, sq, k, v, kpos, krng, sk, hq, hk, scale
#define MMA_BWD_ARGS MMA_FWD_ARGS, const bf16 *dout, const float *lse, const float *delta
#define MMA_BWD_PASS MMA_FWD_PASS, dout, lse, delta

extern "C" __global__ void flash_mma_fwd_d64(MMA_FWD_ARGS, float* acc, float* mx, float* sm) { mma_fwd<64>(MMA_FWD_PASS, acc, mx, sm); }
extern "C" __global__ void flash_mma_fwd_d128(MMA_FWD_ARGS, float* acc, float* mx, float* sm) { mma_fwd<128>(MMA_FWD_PASS, acc, mx, sm); }
extern "C" __global__ void flash_mma_dq_d64(MMA_BWD_ARGS, float* dq) { mma_dq<64>(MMA_BWD_PASS, dq); }
extern "C" __global__ void flash_mma_dq_d128(MMA_BWD_ARGS, float* dq) { mma_dq<128>(MMA_BWD_PASS, dq); }
extern "C" __global__ void flash_mma_dkdv_d64(MMA_BWD_ARGS, float* dk, float* dv) { mma_bwd<64, false>(MMA_BWD_PASS, nullptr, dk, dv); }
extern "C" __global__ void flash_mma_dkdv_d128(MMA_BWD_ARGS, float* dk, float* dv) { mma_bwd<128, false>(MMA_BWD_PASS, nullptr, dk, dv); }
extern "C" __global__ void flash_mma_bwd_d64(MMA_BWD_ARGS, float* dq, float* dk, float* dv) { mma_bwd<64, true>(MMA_BWD_PASS, dq, dk, dv); }
extern "C" __global__ void flash_mma_bwd_d128(MMA_BWD_ARGS, float* dq, float* dk, float* dv) { mma_bwd<128, true>(MMA_BWD_PASS, dq, dk, dv); }
