// LayerNorm over rows of C values, one warp per row, with the residual add it follows fused in (as
// llm.c's fused_residual_forward) (CPU twin: src/ops/layernorm.rs):
//
//   forward   x ← x_in + delta (the caller's sum, with its dropout); μ and σ² by Welford over the row (each lane's C/32 values, then the
//             lanes' partial statistics merged by butterflies); r = 1/√(σ² + 1e-5); out = (x − μ)·r·w + b.
//             μ and r are saved for the backward pass.
//   backward  x̂ = (x − μ)·r, g = dout·w; dx = r·(g − mean(g) − x̂·mean(g·x̂)), written or added into the
//             residual stream's gradient; per lane Σ dout·x̂ and Σ dout over the warp's rows, for dw, db.
//
// Lane l holds elements l, l + 32, … of a row, so a warp's loads and stores coalesce.
#pragma once
#include "common.cuh"

constexpr float LN_EPS = 1e-5f;

// (μ, r) of the row whose C/32 values each lane holds in v.
template <int C>
__device__ __forceinline__ void layernorm_stats(const float (&v)[C / 32], float& mean, float& rstd) {
    constexpr int PER = C / 32;
    float m = 0.0f, m2 = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const float delta = v[i] - m;
        m += delta / (float)(i + 1);
        m2 = fmaf(delta, v[i] - m, m2);
    }
    float n = (float)PER;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float m_other = __shfl_xor_sync(FULL_MASK, m, offset);
        const float m2_other = __shfl_xor_sync(FULL_MASK, m2, offset);
        const float delta = m_other - m;
        m += 0.5f * delta;
        m2 += m2_other + delta * delta * 0.5f * n;
        n *= 2.0f;
    }
    // The butterflies may round differently per lane: every lane takes lane 0's.
    mean = __shfl_sync(FULL_MASK, m, 0);
    rstd = 1.0f / sqrtf(__shfl_sync(FULL_MASK, m2, 0) / (float)C + LN_EPS);
}

// One row whose C/32 values each lane holds in v (lane l: elements l, l + 32, …): out = LayerNorm(v),
// and out_bf16 the same rounded to bf16 (either may be null); lane 0 writes μ and r.
template <int C>
__device__ __forceinline__ void layernorm_row_normalize(const float (&v)[C / 32], const float* w, const float* b,
                                                        float* out, bf16* out_bf16, float* mean_out, float* rstd_out) {
    constexpr int PER = C / 32;
    const int lane = threadIdx.x % 32;
    float mean, rstd;
    layernorm_stats<C>(v, mean, rstd);
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int c = i * 32 + lane;
        const float o = (v[i] - mean) * rstd * w[c] + b[c];
        if (out) out[c] = o;
        if (out_bf16) out_bf16[c] = to_bf16(o);
    }
    if (lane == 0) {
        *mean_out = mean;
        *rstd_out = rstd;
    }
}

// One row's backward: dx into dres (added when accumulate), and the lane's dw, db sums grow. The old dres is
// loaded first, beside x and dout: read after the row's sums, its load waits out a whole second trip to
// memory per row (the default Transformer's step 0.43 → 0.40 ms).
template <int C>
__device__ __forceinline__ void layernorm_row_backward(const float* x, float mean, float rstd, const float* w,
                                                       const float* dout, float* dres, bool accumulate,
                                                       float (&dw)[C / 32], float (&db)[C / 32]) {
    constexpr int PER = C / 32;
    const int lane = threadIdx.x % 32;
    float xhat[PER], g[PER], sum_g = 0.0f, sum_gx = 0.0f, old[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) old[i] = accumulate ? dres[i * 32 + lane] : 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int c = i * 32 + lane;
        const float d = dout[c];
        xhat[i] = (x[c] - mean) * rstd;
        g[i] = d * w[c];
        sum_g += g[i];
        sum_gx = fmaf(g[i], xhat[i], sum_gx);
        dw[i] = fmaf(d, xhat[i], dw[i]);
        db[i] += d;
    }
    sum_g = warp_sum(sum_g) / (float)C;
    sum_gx = warp_sum(sum_gx) / (float)C;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int c = i * 32 + lane;
        const float dx = rstd * (g[i] - sum_g - xhat[i] * sum_gx);
        dres[c] = accumulate ? old[i] + dx : dx;
    }
}
