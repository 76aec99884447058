// Causal self-attention of one (sequence, head) in fp32 on the CUDA cores, flash-style: the scores live
// only in registers and shared memory, a 64×64 tile at a time, never in global memory (CPU twin:
// src/ops/attention.rs; the tensor-core version in bf16: flash_attention.cuh).
//
//   tiles     every product is a 64×64 tile over k in shared memory, each thread holding a 4×4 share in
//             registers (attention_micro_product): rows tr + 16i, columns tc + 16j, so a warp reads 2 rows
//             of one operand (a broadcast) and 16 consecutive rows of the other, whose padded stride (odd)
//             puts them on 16 banks: 8 shared loads feed 16 FMAs, where a dot product per thread took 2 a FMA.
//   forward   a block per (sequence, head): for each chunk of KC query rows, the key chunks up to the
//             diagonal: s = q·kᵀ/√hs, the online softmax (running max m and sum l of each row over its 16
//             threads, y rescaled by exp(m_old − m_new)), then y += (p ⊙ mask)·v through shared memory.
//             Saves only lse_t = m + log l, from which the backward pass rebuilds p.
//   backward  a block per (sequence, head, chunk of KC keys): over the query rows t ≥ the chunk's first
//             key, KC at a time, p_tu = exp(s_tu − lse_t), dp_tu = dy_t·v_u, D_t = dy_t·y_t, ds_tu =
//             p_tu·(dp_tu − D_t); dk_u = Σ_t ds_tu·q_t/√hs and dv_u = Σ_t p_tu·dy_t in registers, and the
//             chunk's share of dq_t = Σ_u ds_tu·k_u/√hs to global memory; the last chunk of the (sequence,
//             head) to finish adds the shares in chunk order. Each output is a sum in a fixed order, so no
//             atomics.
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
    static constexpr int LD = HS + 1;  // q, k, v, dy rows, padded to an odd stride against bank conflicts
    // Queries and keys are taken KC at a time; a tile of probabilities has rows of LDC.
    static constexpr int KC = T < 64 ? T : 64;
    static constexpr int LDC = KC + 1;
    static constexpr int CHUNKS = (T + KC - 1) / KC;
    static constexpr int FORWARD_FLOATS = 3 * KC * LD + KC * LDC;
    static constexpr int BACKWARD_FLOATS = 4 * KC * LD + 2 * KC * LDC + 2 * KC;
    // Column blocks of 64 over a head's dims (y, dq, dk, dv tiles).
    static constexpr int DIM_BLOCKS = (HS + 63) / 64;
};

// acc[i][j] += Σ_{k < K} a(r_i, k)·b(c_j, k) for the thread's rows r_i = min(tr + 16i, M − 1) and columns
// c_j = min(tc + 16j, N − 1) (tr = thread / 16, tc = thread mod 16; clamped so every read stays inside
// the operands, the caller ignores the rows and columns past M and N).
template <class A, class B>
__device__ __forceinline__ void attention_micro_product(int M, int N, int K, A a, B b, float (&acc)[4][4]) {
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
    int r[4], c[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        r[i] = min(tr + 16 * i, M - 1);
        c[i] = min(tc + 16 * i, N - 1);
    }
#pragma unroll 4
    for (int k = 0; k < K; ++k) {
        float av[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            av[i] = a(r[i], k);
            bv[i] = b(c[i], k);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
}

__device__ __forceinline__ void attention_zero(float (&acc)[4][4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
}

// Over the 16 threads of a row (tc): combine(v, other) down to one value every one of them holds.
template <class Combine>
__device__ __forceinline__ float attention_row_reduce(float v, Combine combine) {
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) v = combine(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Stages rows [r0, r0 + n) of one head's HS columns from `src` (row stride ld) into dst [KC][LD].
template <int HS, int LD>
__device__ __forceinline__ void attention_stage_rows(const float* src, size_t ld, int r0, int n, float* dst) {
    for (int i = threadIdx.x; i < n * HS; i += THREADS) {
        const int r = i / HS, d = i % HS;
        dst[r * LD + d] = src[(size_t)(r0 + r) * ld + d];
    }
}

template <int T, int HS>
__device__ __forceinline__ void attention_forward(const float* qkv, int C, int h, int len, float* y, float* lse,
                                                  float* smem, unsigned drop_key, unsigned drop_threshold,
                                                  float drop_scale, unsigned first) {
    using S = AttentionSizes<T, HS>;
    constexpr int LD = S::LD, KC = S::KC, LDC = S::LDC, NB = S::DIM_BLOCKS;
    float *qs = smem, *ks = qs + KC * LD, *vs = ks + KC * LD, *p = vs + KC * LD;
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
    const float scale = 1.0f / sqrtf((float)HS);
    const float* q_src = qkv + h * HS;
    for (int t0 = 0; t0 < len; t0 += KC) {
        const int nq = min(KC, len - t0);
        __syncthreads();  // the previous chunk's readers of qs are done
        attention_stage_rows<HS, LD>(q_src, 3 * C, t0, nq, qs);
        float m[4], l[4], acc[NB][4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) m[i] = NEG_INF, l[i] = 0.0f;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) attention_zero(acc[nb]);
        for (int u0 = 0; u0 <= t0 + nq - 1; u0 += KC) {
            const int nk = min(KC, len - u0);
            __syncthreads();  // ks, vs and p free
            attention_stage_rows<HS, LD>(q_src + C, 3 * C, u0, nk, ks);
            attention_stage_rows<HS, LD>(q_src + 2 * C, 3 * C, u0, nk, vs);
            __syncthreads();
            float s[4][4];
            attention_zero(s);
            attention_micro_product(nq, nk, HS, [&](int r, int d) { return qs[r * LD + d]; },
                                    [&](int u, int d) { return ks[u * LD + d]; }, s);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = tr + 16 * i, t = t0 + r;
                float row_max = NEG_INF;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int u = u0 + tc + 16 * j;
                    s[i][j] = r < nq && u - u0 < nk && u <= t ? s[i][j] * scale : NEG_INF;
                    row_max = fmaxf(row_max, s[i][j]);
                }
                row_max = attention_row_reduce(row_max, [](float a, float b) { return fmaxf(a, b); });
                // Every real row has key u0 ≤ t0 ≤ t; a row past nq has none (NaN there is never stored).
                const float m_new = fmaxf(m[i], row_max), alpha = expf(m[i] - m_new);
                float row_sum = 0.0f;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int u = u0 + tc + 16 * j;
                    const float e = s[i][j] == NEG_INF ? 0.0f : expf(s[i][j] - m_new);
                    row_sum += e;
                    float keep = 1.0f;
                    if (drop_threshold && r < nq && u - u0 < nk)
                        keep = dropout_factor(drop_key, first + (unsigned)(t * T + u), drop_threshold, drop_scale);
                    if (r < nq && u - u0 < nk) p[r * LDC + u - u0] = e * keep;
                }
                row_sum = attention_row_reduce(row_sum, [](float a, float b) { return a + b; });
                l[i] = l[i] * alpha + row_sum;
                m[i] = m_new;
#pragma unroll
                for (int nb = 0; nb < NB; ++nb)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[nb][i][j] *= alpha;
            }
            __syncthreads();
#pragma unroll
            for (int nb = 0; nb < NB; ++nb)
                attention_micro_product(nq, HS - 64 * nb, nk, [&](int r, int u) { return p[r * LDC + u]; },
                                        [&](int d, int u) { return vs[u * LD + 64 * nb + d]; }, acc[nb]);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = tr + 16 * i;
            if (r >= nq) continue;
            const float inv = 1.0f / l[i];
#pragma unroll
            for (int nb = 0; nb < NB; ++nb)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int d = 64 * nb + tc + 16 * j;
                    if (d < HS) y[(size_t)(t0 + r) * C + h * HS + d] = acc[nb][i][j] * inv;
                }
            if (tc == 0) lse[t0 + r] = m[i] + logf(l[i]);
        }
    }
}

// The backward pass of keys [u0, u0 + KC) (chunk `chunk`) of one (sequence, head), over query rows in
// chunks of KC: dk, dv of those keys in registers, and this chunk's share of dq for every query row
// t ≥ u0 into dq_part (rows × HS, unscaled). y is the forward output (for D_t = dy_t·y_t).
template <int T, int HS>
__device__ __forceinline__ void attention_backward_keys(const float* qkv, const float* y, const float* dy,
                                                        const float* lse, int C, int h, int len, int chunk,
                                                        float* dqkv, float* dq_part, float* smem, unsigned drop_key,
                                                        unsigned drop_threshold, float drop_scale, unsigned first) {
    using S = AttentionSizes<T, HS>;
    constexpr int LD = S::LD, KC = S::KC, LDC = S::LDC, NB = S::DIM_BLOCKS;
    float *ks = smem, *vs = ks + KC * LD, *qs = vs + KC * LD, *dys = qs + KC * LD;
    float *p = dys + KC * LD, *ds = p + KC * LDC, *D = ds + KC * LDC, *lse_s = D + KC;
    const int u0 = chunk * KC, nk = min(KC, len - u0);
    const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
    const float scale = 1.0f / sqrtf((float)HS);
    attention_stage_rows<HS, LD>(qkv + C + h * HS, 3 * C, u0, nk, ks);
    attention_stage_rows<HS, LD>(qkv + 2 * C + h * HS, 3 * C, u0, nk, vs);
    float dk[NB][4][4], dv[NB][4][4];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        attention_zero(dk[nb]);
        attention_zero(dv[nb]);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int t0 = u0; t0 < len; t0 += KC) {
        const int nq = min(KC, len - t0);
        __syncthreads();  // the previous chunk's readers are done
        attention_stage_rows<HS, LD>(qkv + h * HS, 3 * C, t0, nq, qs);
        attention_stage_rows<HS, LD>(dy + h * HS, C, t0, nq, dys);
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
        float s[4][4], dp[4][4];
        attention_zero(s);
        attention_zero(dp);
        attention_micro_product(nq, nk, HS, [&](int r, int d) { return qs[r * LD + d]; },
                                [&](int j, int d) { return ks[j * LD + d]; }, s);
        attention_micro_product(nq, nk, HS, [&](int r, int d) { return dys[r * LD + d]; },
                                [&](int j, int d) { return vs[j * LD + d]; }, dp);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = tr + 16 * i;
            if (r >= nq) continue;
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int j = tc + 16 * jj;
                float pt = 0.0f, dst = 0.0f;
                if (j < nk && u0 + j <= t0 + r) {
                    const float p_tu = expf(s[i][jj] * scale - lse_s[r]);
                    float keep = 1.0f;
                    if (drop_threshold)
                        keep = dropout_factor(drop_key, first + (unsigned)((t0 + r) * T + u0 + j), drop_threshold, drop_scale);
                    pt = p_tu * keep;
                    dst = p_tu * (keep * dp[i][jj] - D[r]);
                }
                if (j < nk) {
                    p[r * LDC + j] = pt;
                    ds[r * LDC + j] = dst;
                }
            }
        }
        __syncthreads();
        // dv_u += Σ_t p_tu·dy_t, dk_u += Σ_t ds_tu·q_t: rows are keys, k the chunk's query rows.
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
            attention_micro_product(nk, HS - 64 * nb, nq, [&](int j, int r) { return p[r * LDC + j]; },
                                    [&](int d, int r) { return dys[r * LD + 64 * nb + d]; }, dv[nb]);
            attention_micro_product(nk, HS - 64 * nb, nq, [&](int j, int r) { return ds[r * LDC + j]; },
                                    [&](int d, int r) { return qs[r * LD + 64 * nb + d]; }, dk[nb]);
        }
        // This chunk's share of dq_t = Σ_u ds_tu·k_u.
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
            float dq[4][4];
            attention_zero(dq);
            attention_micro_product(nq, HS - 64 * nb, nk, [&](int r, int j) { return ds[r * LDC + j]; },
                                    [&](int d, int j) { return ks[j * LD + 64 * nb + d]; }, dq);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) {
                    const int r = tr + 16 * i, d = 64 * nb + tc + 16 * jj;
                    if (r < nq && d < HS) dq_part[(size_t)(t0 + r) * HS + d] = dq[i][jj];
                }
        }
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int j = tr + 16 * i, d = 64 * nb + tc + 16 * jj;
                if (j >= nk || d >= HS) continue;
                float* row = dqkv + (size_t)(u0 + j) * 3 * C + h * HS + d;
                row[C] = dk[nb][i][jj] * scale;
                row[2 * C] = dv[nb][i][jj];
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
