// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the
// dropout masks' counter/key layouts: the CPU twins are executor/src/rng.rs (philox4x32,
// DropoutKey::block, DropoutKey::keep) and executor/src/rng/attention.rs (AttnDropout::keep). Plain C as well as CUDA C: executor/tests/numerics/philox_c.rs
// compiles this header with the system C compiler and compares it with rng.rs bit for bit, the
// second method that proves the device generator draws the CPU's masks.
#pragma once

#ifdef __CUDACC__
#define PHILOX_FN __device__ __forceinline__
typedef unsigned int philox_u32;
typedef unsigned long long philox_u64;
#else
#include <stdint.h>
#define PHILOX_FN static inline
typedef uint32_t philox_u32;
typedef uint64_t philox_u64;
#endif

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
// Dropout sites per layer in the counter word that holds (layer, site): rng.rs's SITES.
#define PHILOX_SITES 3u

PHILOX_FN philox_u32 philox_rotl(philox_u32 x, unsigned r) { return (x << r) | (x >> (32u - r)); }

// Philox 4x32 with `rounds` rounds of ctr[4] under key[2], written to out[4].
PHILOX_FN void philox4x32(unsigned rounds, const philox_u32 ctr[4], const philox_u32 key[2],
                          philox_u32 out[4]) {
    philox_u32 c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    philox_u32 k0 = key[0], k1 = key[1];
    for (unsigned r = 0; r < rounds; ++r) {
        if (r > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        philox_u64 p0 = (philox_u64)PHILOX_M0 * c0, p1 = (philox_u64)PHILOX_M1 * c2;
        philox_u32 hi0 = (philox_u32)(p0 >> 32), lo0 = (philox_u32)p0;
        philox_u32 hi1 = (philox_u32)(p1 >> 32), lo1 = (philox_u32)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

// The 4 uniform words of the dropout block holding elements 4b..4b+3 of global token `token`
// (rng.rs DropoutKey::block): `layer_site` = layer * PHILOX_SITES + site.
PHILOX_FN void dropout_block(philox_u64 seed, philox_u32 step, philox_u32 layer_site,
                             philox_u64 token, philox_u64 b, philox_u32 out[4]) {
    philox_u32 ctr[4], key[2];
    ctr[0] = (philox_u32)token;
    ctr[1] = (philox_u32)(token >> 32) ^ philox_rotl((philox_u32)(b >> 32), 16);
    ctr[2] = (philox_u32)b;
    ctr[3] = layer_site;
    key[0] = (philox_u32)seed ^ philox_rotl(step, 16);
    key[1] = (philox_u32)(seed >> 32) ^ step;
    philox4x32(10u, ctr, key, out);
}

// Whether element `element` of `token` is kept: its uniform word >= `threshold`
// (round(p * 2^32), computed on the host as rng.rs does).
PHILOX_FN int dropout_keep(philox_u64 seed, philox_u32 step, philox_u32 layer_site,
                           philox_u64 token, philox_u64 element, philox_u64 threshold) {
    philox_u32 w[4];
    dropout_block(seed, step, layer_site, token, element / 4, w);
    // Constant indices only, so the block stays in registers (no local-memory stack frame).
    unsigned j = (unsigned)(element % 4);
    philox_u32 v = j == 0 ? w[0] : j == 1 ? w[1] : j == 2 ? w[2] : w[3];
    return (philox_u64)v >= threshold;
}

// Second key word tag of attention dropout (rng/attention.rs ATTN_KEY_TAG): its keys never
// meet the hidden dropout's.
#define PHILOX_ATTN_TAG 0x80000000u

// Whether the attention probability of global query token `qtok` (sample * seq + position),
// global head `head` and key position `kpos` is kept (rng/attention.rs AttnDropout::keep):
// counter = [qtok low, kpos / 4, head ^ rotl(qtok high, 16), layer], key = [seed low ^
// rotl(step, 16), seed high ^ step ^ PHILOX_ATTN_TAG], word kpos % 4 against `threshold`.
PHILOX_FN int attn_dropout_keep(philox_u64 seed, philox_u32 step, philox_u32 layer,
                                philox_u32 head, philox_u64 qtok, philox_u32 kpos,
                                philox_u64 threshold) {
    philox_u32 ctr[4], key[2], w[4];
    ctr[0] = (philox_u32)qtok;
    ctr[1] = kpos / 4u;
    ctr[2] = head ^ philox_rotl((philox_u32)(qtok >> 32), 16);
    ctr[3] = layer;
    key[0] = (philox_u32)seed ^ philox_rotl(step, 16);
    key[1] = (philox_u32)(seed >> 32) ^ step ^ PHILOX_ATTN_TAG;
    philox4x32(10u, ctr, key, w);
    unsigned j = kpos % 4u;
    philox_u32 v = j == 0 ? w[0] : j == 1 ? w[1] : j == 2 ? w[2] : w[3];
    return (philox_u64)v >= threshold;
}
