// Causal self-attention of one (sequence, head) in one block, flash-style: the T×T scores live only in
// shared memory (T ≤ a few hundred fits), never in global memory (CPU twin: src/transformer/model.rs).
//
//   forward   a warp per query row t: s_u = q_t·k_u/√hs for u ≤ t, p = softmax(s), y_t = Σ_u p_u·v_u.
//             Saves only lse_t = max + log Σ exp, from which the backward pass rebuilds p.
//   backward  p_tu = exp(s_tu − lse_t), dp_tu = dy_t·v_u, D_t = Σ_u p_tu·dp_tu, ds_tu = p_tu·(dp_tu − D_t);
//             dq_t = Σ_u ds_tu·k_u/√hs, dk_u = Σ_t ds_tu·q_t/√hs, dv_u = Σ_t p_tu·dy_t: each output is one
//             thread's sum in a fixed order, so no atomics.
//
// q, k and v of head h are columns h·HS … of the row's [q | k | v] (row stride 3C); y, dy have stride C.
// Shared memory: attention_forward_floats / attention_backward_floats (the launch layer mirrors them).
#pragma once
#include "common.cuh"

template <int T, int HS>
struct AttentionSizes {
    static constexpr int LD = HS + 1;  // q, k, v rows, padded against bank conflicts
    static constexpr int LDP = T + 1;  // score rows
    static constexpr int FORWARD_FLOATS = 3 * T * LD + WARPS * T;
    static constexpr int BACKWARD_FLOATS = 4 * T * LD + 2 * T * LDP + T;
};

// Stages rows [0, len) of q, k, v (and dy when given) for head h into shared memory.
template <int T, int HS>
__device__ __forceinline__ void attention_stage(const float* qkv, const float* dy, int C, int h, int len, float* q,
                                                float* k, float* v, float* dys) {
    constexpr int LD = AttentionSizes<T, HS>::LD;
    for (int i = threadIdx.x; i < len * HS; i += THREADS) {
        const int t = i / HS, d = i % HS;
        const float* row = qkv + (size_t)t * 3 * C + h * HS + d;
        q[t * LD + d] = row[0];
        k[t * LD + d] = row[C];
        v[t * LD + d] = row[2 * C];
        if (dys) dys[t * LD + d] = dy[(size_t)t * C + h * HS + d];
    }
    __syncthreads();
}

template <int T, int HS>
__device__ __forceinline__ void attention_forward(const float* qkv, int C, int h, int len, float* y, float* lse,
                                                  float* smem) {
    using S = AttentionSizes<T, HS>;
    constexpr int LD = S::LD, KEYS = (T + 31) / 32;
    float *q = smem, *k = q + T * LD, *v = k + T * LD;
    attention_stage<T, HS>(qkv, nullptr, C, h, len, q, k, v, nullptr);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* p = v + T * LD + warp * T;
    const float scale = 1.0f / sqrtf((float)HS);
    for (int t = warp; t < len; t += WARPS) {
        float s[KEYS], max = NEG_INF;
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            const int u = lane + 32 * j;
            s[j] = NEG_INF;
            if (u <= t) {
                float dot = 0.0f;
#pragma unroll
                for (int d = 0; d < HS; ++d) dot = fmaf(q[t * LD + d], k[u * LD + d], dot);
                s[j] = dot * scale;
            }
            max = fmaxf(max, s[j]);
        }
        max = warp_max(max);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            s[j] = lane + 32 * j <= t ? expf(s[j] - max) : 0.0f;
            sum += s[j];
        }
        sum = warp_sum(sum);
        const float inv = 1.0f / sum;
#pragma unroll
        for (int j = 0; j < KEYS; ++j)
            if (lane + 32 * j < T) p[lane + 32 * j] = s[j] * inv;
        __syncwarp();
        for (int d = lane; d < HS; d += 32) {
            float acc = 0.0f;
            for (int u = 0; u <= t; ++u) acc = fmaf(p[u], v[u * LD + d], acc);
            y[(size_t)t * C + h * HS + d] = acc;
        }
        if (lane == 0) lse[t] = max + logf(sum);
        __syncwarp();
    }
}

template <int T, int HS>
__device__ __forceinline__ void attention_backward(const float* qkv, const float* dy, const float* lse, int C, int h,
                                                   int len, float* dqkv, float* smem) {
    using S = AttentionSizes<T, HS>;
    constexpr int LD = S::LD, LDP = S::LDP;
    float *q = smem, *k = q + T * LD, *v = k + T * LD, *dys = v + T * LD;
    float *p = dys + T * LD, *ds = p + T * LDP, *D = ds + T * LDP;
    attention_stage<T, HS>(qkv, dy, C, h, len, q, k, v, dys);
    const float scale = 1.0f / sqrtf((float)HS);
    for (int i = threadIdx.x; i < len * len; i += THREADS) {
        const int t = i / len, u = i % len;
        float pt = 0.0f, dp = 0.0f;
        if (u <= t) {
            float dot = 0.0f;
#pragma unroll
            for (int d = 0; d < HS; ++d) {
                dot = fmaf(q[t * LD + d], k[u * LD + d], dot);
                dp = fmaf(dys[t * LD + d], v[u * LD + d], dp);
            }
            pt = expf(dot * scale - lse[t]);
        }
        p[t * LDP + u] = pt;
        ds[t * LDP + u] = dp;
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int t = warp; t < len; t += WARPS) {
        float sum = 0.0f;
        for (int u = lane; u <= t; u += 32) sum = fmaf(p[t * LDP + u], ds[t * LDP + u], sum);
        sum = warp_sum(sum);
        if (lane == 0) D[t] = sum;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < len * len; i += THREADS) {
        const int t = i / len, u = i % len;
        ds[t * LDP + u] = p[t * LDP + u] * (ds[t * LDP + u] - D[t]);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < len * HS; i += THREADS) {
        const int r = i / HS, d = i % HS;
        float dq = 0.0f, dk = 0.0f, dv = 0.0f;
        for (int u = 0; u <= r; ++u) dq = fmaf(ds[r * LDP + u], k[u * LD + d], dq);
        for (int t = r; t < len; ++t) {
            dk = fmaf(ds[t * LDP + r], q[t * LD + d], dk);
            dv = fmaf(p[t * LDP + r], dys[t * LD + d], dv);
        }
        float* row = dqkv + (size_t)r * 3 * C + h * HS + d;
        row[0] = dq * scale;
        row[C] = dk * scale;
        row[2 * C] = dv;
    }
}
