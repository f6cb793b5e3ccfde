// Adam with decoupled weight decay and the bf16 weight copy: the CPU twin is
// executor/src/backend/cpu/ops/adam.rs (adam_step; Kingma & Ba 2015, Loshchilov & Hutter
// 2019). bc1 = 1 - beta1^t and bc2 = 1 - beta2^t come from the host (f32, as the CPU computes
// them). When `copy` is not null it receives round_bf16(p) (the mixed-precision weight copy).
// Launch: 1-D grid-stride over n, 256 threads.
#include "common.cuh"

extern "C" __global__ void adam_step_f32(float* p, const float* g, float* m, float* v, u64 n,
                                         float beta1, float beta2, float eps, float lr, float wd,
                                         float bc1, float bc2, __nv_bfloat16* copy) {
    GRID_STRIDE(i, n) {
        float gi = g[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float pi = p[i];
        pi -= lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + wd * pi);
        p[i] = pi;
        if (copy) copy[i] = __float2bfloat16_rn(pi);
    }
}
