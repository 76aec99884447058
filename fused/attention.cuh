// Causal self-attention of one (sequence, head) in one block, flash-style: the T×T scores live only in
// shared memory (T ≤ a few hundred fits), never in global memory (CPU twin: src/ops/attention.rs).
//
//   forward   a warp per query row t: s_u = q_t·k_u/√hs for u ≤ t, p = softmax(s), y_t = Σ_u p_u·v_u.
//             Saves only lse_t = max + log Σ exp, from which the backward pass rebuilds p.
//   backward  a block per (sequence, head, chunk of 64 keys), so that its shared memory does not grow
//             with T²: over the query rows t ≥ the chunk's first key, 64 at a time, p_tu = exp(s_tu −
//             lse_t), dp_tu = dy_t·v_u, D_t = dy_t·y_t, ds_tu = p_tu·(dp_tu − D_t); dk_u = Σ_t ds_tu·q_t/√hs
//             and dv_u = Σ_t p_tu·dy_t in registers, and the chunk's share of dq_t = Σ_u ds_tu·k_u/√hs to
//             global memory; the last chunk of the (sequence, head) to finish adds the shares in chunk
//             order. Each output is a sum in a fixed order, so no atomics.
//
// Dropout on the probabilities (nanoGPT's attn_dropout): y_t = Σ_u m_tu·p_tu·v_u with m_tu = 0 or
// drop_scale by dropout.cuh's hash of element first + t·T + u under drop_key (first = (b·heads + h)·T·T;
// drop_threshold 0: off). The backward pass redraws m: dv_u = Σ_t m_tu·p_tu·dy_t, ds_tu = p_tu·(m_tu·dp_tu
// − D_t), where D_t = dy_t·y_t still equals Σ_u p_tu·m_tu·dp_tu.
//
// q, k and v of head h are columns h·HS … of the row's [q | k | v] (row stride 3C); y, dy have stride C.
// Shared memory: attention_forward_floats / attention_backward_floats (the launch layer mirrors them).
#pragma once
#include "common.cuh"
#include "dropout.cuh"

template <int T, int HS>
struct AttentionSizes {
    static constexpr int LD = HS + 1;  // q, k, v rows, padded against bank conflicts
    static constexpr int FORWARD_FLOATS = 3 * T * LD + WARPS * T;
    // The backward pass takes keys and queries KC at a time.
    static constexpr int KC = T < 64 ? T : 64;
    static constexpr int CHUNKS = (T + KC - 1) / KC;
    static constexpr int BACKWARD_FLOATS = 4 * KC * LD + 2 * KC * (KC + 1) + 2 * KC;
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
                                                  float* smem, unsigned drop_key, unsigned drop_threshold,
                                                  float drop_scale, unsigned first) {
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
        for (int j = 0; j < KEYS; ++j) {
            const int u = lane + 32 * j;
            if (u >= T) continue;
            float keep = 1.0f;
            if (drop_threshold) keep = dropout_factor(drop_key, first + (unsigned)(t * T + u), drop_threshold, drop_scale);
            p[u] = s[j] * inv * keep;
        }
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

// The backward pass of keys [u0, u0 + KC) (chunk `chunk`) of one (sequence, head), over query rows in
// chunks of QC: dk, dv of those keys in registers, and this chunk's share of dq for every query row
// t ≥ u0 into dq_part (rows × HS, unscaled). y is the forward output (for D_t = dy_t·y_t).
template <int T, int HS>
__device__ __forceinline__ void attention_backward_keys(const float* qkv, const float* y, const float* dy,
                                                        const float* lse, int C, int h, int len, int chunk,
                                                        float* dqkv, float* dq_part, float* smem, unsigned drop_key,
                                                        unsigned drop_threshold, float drop_scale, unsigned first) {
    using S = AttentionSizes<T, HS>;
    constexpr int LD = S::LD, KC = S::KC, QC = S::KC, LDC = KC + 1, PAIRS = (KC * HS + THREADS - 1) / THREADS;
    float *ks = smem, *vs = ks + KC * LD, *qs = vs + KC * LD, *dys = qs + QC * LD;
    float *p = dys + QC * LD, *ds = p + QC * LDC, *D = ds + QC * LDC, *lse_s = D + QC;
    const int u0 = chunk * KC, nk = min(KC, len - u0);
    const float scale = 1.0f / sqrtf((float)HS);
    for (int i = threadIdx.x; i < nk * HS; i += THREADS) {
        const int j = i / HS, d = i % HS;
        const float* row = qkv + (size_t)(u0 + j) * 3 * C + h * HS + d;
        ks[j * LD + d] = row[C];
        vs[j * LD + d] = row[2 * C];
    }
    float dk[PAIRS], dv[PAIRS];
#pragma unroll
    for (int r = 0; r < PAIRS; ++r) dk[r] = dv[r] = 0.0f;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int t0 = u0; t0 < len; t0 += QC) {
        const int nq = min(QC, len - t0);
        __syncthreads();  // the previous chunk's readers are done
        for (int i = threadIdx.x; i < nq * HS; i += THREADS) {
            const int r = i / HS, d = i % HS;
            qs[r * LD + d] = qkv[(size_t)(t0 + r) * 3 * C + h * HS + d];
            dys[r * LD + d] = dy[(size_t)(t0 + r) * C + h * HS + d];
        }
        for (int r = warp; r < nq; r += WARPS) {
            float sum = 0.0f;
            for (int d = lane; d < HS; d += 32) sum = fmaf(dy[(size_t)(t0 + r) * C + h * HS + d], y[(size_t)(t0 + r) * C + h * HS + d], sum);
            sum = warp_sum(sum);
            if (lane == 0) {
                D[r] = sum;
                lse_s[r] = lse[t0 + r];
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < nq * nk; i += THREADS) {
            const int r = i / nk, j = i % nk;
            float pt = 0.0f, dst = 0.0f;
            if (u0 + j <= t0 + r) {
                float dot = 0.0f, dp = 0.0f;
#pragma unroll
                for (int d = 0; d < HS; ++d) {
                    dot = fmaf(qs[r * LD + d], ks[j * LD + d], dot);
                    dp = fmaf(dys[r * LD + d], vs[j * LD + d], dp);
                }
                const float p_tu = expf(dot * scale - lse_s[r]);
                float keep = 1.0f;
                if (drop_threshold)
                    keep = dropout_factor(drop_key, first + (unsigned)((t0 + r) * T + u0 + j), drop_threshold, drop_scale);
                pt = p_tu * keep;
                dst = p_tu * (keep * dp - D[r]);
            }
            p[r * LDC + j] = pt;
            ds[r * LDC + j] = dst;
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < PAIRS; ++q) {
            const int i = threadIdx.x + q * THREADS, j = i / HS, d = i % HS;
            if (j >= nk) continue;
            for (int r = 0; r < nq; ++r) {
                dv[q] = fmaf(p[r * LDC + j], dys[r * LD + d], dv[q]);
                dk[q] = fmaf(ds[r * LDC + j], qs[r * LD + d], dk[q]);
            }
        }
        for (int i = threadIdx.x; i < nq * HS; i += THREADS) {
            const int r = i / HS, d = i % HS;
            float dq = 0.0f;
            for (int j = 0; j < nk; ++j) dq = fmaf(ds[r * LDC + j], ks[j * LD + d], dq);
            dq_part[(size_t)(t0 + r) * HS + d] = dq;
        }
    }
#pragma unroll
    for (int q = 0; q < PAIRS; ++q) {
        const int i = threadIdx.x + q * THREADS, j = i / HS, d = i % HS;
        if (j >= nk) continue;
        float* row = dqkv + (size_t)(u0 + j) * 3 * C + h * HS + d;
        row[C] = dk[q] * scale;
        row[2 * C] = dv[q];
    }
}

// dq of one (sequence, head) from the key chunks' shares, added in chunk order (row t has shares from
// the chunks with u0 ≤ t). part_stride: floats between two chunks' shares.
template <int T, int HS>
__device__ __forceinline__ void attention_backward_dq(const float* dq_part, size_t part_stride, int C, int h, int len,
                                                      float* dqkv) {
    constexpr int KC = AttentionSizes<T, HS>::KC;
    const float scale = 1.0f / sqrtf((float)HS);
    for (int i = threadIdx.x; i < len * HS; i += THREADS) {
        const int t = i / HS, d = i % HS;
        float dq = 0.0f;
        for (int c = 0; c <= t / KC; ++c) dq += __ldcg(&dq_part[c * part_stride + (size_t)t * HS + d]);
        dqkv[(size_t)t * 3 * C + h * HS + d] = dq * scale;
    }
}
