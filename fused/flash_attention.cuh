// Causal self-attention on the tensor cores in bf16, FlashAttention-2 style, forward and backward, with
// dropout on the attention probabilities (CPU twin: src/ops/attention.rs; the fp32 kernels: attention.cuh).
//
//   operands  q, k, v, dy are read in fp32 and rounded to bf16 (to nearest even) as they are staged into
//             shared memory, or into registers for the rows a warp keeps as A fragments (q forward, q and
//             dy for dq); every product is mma.sync m16n8k16 bf16 with fp32 accumulation; the softmax
//             statistics (running max, sum, lse) and D_t = dy_t·y_t stay in fp32. No T×T matrix leaves the
//             SM: each warp holds 16 rows of a 64-wide tile of scores in registers.
//   forward   a block per (sequence, head, 128 queries), a warp per 16 query rows, their q fragments in
//             registers (loaded while the first tile is copied). Keys and values stream through shared
//             memory in tiles of 64, double-buffered: the next tile's fp32 rows are copied asynchronously
//             (cp.async) while this one is used, then rounded into the other buffer. Per tile s = q·kᵀ/√hs,
//             the online softmax (running max m, sum l, y rescaled by exp(m_old − m_new)), then
//             y += (p ⊙ mask)·v with p in registers as the A operand. A warp skips the tiles past its
//             diagonal. Saves lse = m + log l per row.
//   backward  two kinds of block per (sequence, head), each output written by one block as a sum in a fixed
//             order, so no atomics:
//             - 128 keys, a warp per 16: over the query tiles of 64 from the diagonal on, sᵀ = k·qᵀ, pᵀ
//               rebuilt from lse, dpᵀ = v·dyᵀ, dsᵀ = pᵀ ⊙ (mask ⊙ dpᵀ − D), dv += (p ⊙ mask)ᵀ·dy,
//               dk += dsᵀ·q/√hs (D of each query tile from its staged fp32 dy and y);
//             - 128 queries, a warp per 16: over the key tiles of 64 up to the diagonal, s, p, dp = dy·vᵀ,
//               ds, dq += ds·k/√hs (D of the warp's rows as its dy fragments load).
//             s, p and dp are computed in both kinds: 7 products where an atomic dq would take 5.
//   dropout   element (b, h, t, u) is kept when dropout_keeps(key, ((b·heads + h)·T + t)·T + u, threshold)
//             and then scaled by drop_scale: y_t = Σ_u p_tu·mask_tu·v_u. Threshold 0 keeps everything.
//
// q, k and v of head h are columns h·HS … of the row's [q | k | v] (row stride 3C); y, dy have stride C;
// lse has one float per (sequence, head, row). The outputs y and dqkv are written in fp32, in bf16 (y_bf16,
// dqkv_bf16: the operands of the next linear layer's bf16 product), or both; a null pointer skips one.
// Rows at or past `len` are neither read nor written.
// HS must be a multiple of 16. Shared memory: FlashSizes (src/transformer/gpu/flash.rs mirrors it).
#pragma once
#include "common.cuh"
#include "dropout.cuh"
#include "gemm.cuh"  // mma_bf16, ldmatrix_x4, ldmatrix_x4_trans

template <int T, int HS>
struct FlashSizes {
    static constexpr bool SUPPORTED = HS % 16 == 0;
    static constexpr int ROWS = 16 * WARPS;  // queries of a forward block; keys or queries of a backward one
    static constexpr int TILE = 64;          // the streamed keys (forward, dq) or queries (dk, dv)
    static constexpr int LD = HS + 8;        // bf16 per staged row: 16 bytes of padding against bank conflicts
    static constexpr int BLOCKS = (T + ROWS - 1) / ROWS;  // blocks of one kind per (sequence, head)
    // Forward and dq: k and v tiles in two buffers, and their fp32 rows as copied.
    static constexpr int FORWARD_BYTES = 4 * TILE * LD * 2 + 2 * TILE * HS * 4;
    // dk, dv (the larger kind): k and v of the block, two buffers of the streamed q and dy tiles, their
    // fp32 rows as copied (q, dy, y), and lse, D per query of both buffers.
    static constexpr int BACKWARD_BYTES = (2 * ROWS + 4 * TILE) * LD * 2 + 3 * TILE * HS * 4 + 4 * TILE * 4;
};

// Four floats rounded to bf16 (to nearest even), in order.
__device__ __forceinline__ uint2 bf16x4(float4 v) { return make_uint2(bf16x2(v.x, v.y), bf16x2(v.z, v.w)); }

// Staging: rows [row0, row0 + N) of one head's HS columns of an fp32 matrix, THREADS / N threads per row,
// the thread `part` of a row taking its float4s part, part + PER_ROW, … (a row's threads are adjacent lanes).
template <int N, int HS>
struct FlashRows {
    static constexpr int PER_ROW = THREADS / N, F4 = HS / 4 / PER_ROW;
    static_assert(THREADS % N == 0 && F4 * 4 * PER_ROW == HS, "rows must split evenly over the threads");
    static __device__ __forceinline__ int row() { return threadIdx.x / PER_ROW; }
    static __device__ __forceinline__ int col(int i) { return 4 * (threadIdx.x % PER_ROW + i * PER_ROW); }

    // Copies the rows into raw ([N][HS] floats) asynchronously; rows at or past len become zeros.
    static __device__ __forceinline__ void fetch(const float* src, size_t stride, int row0, int len, float* raw) {
        const int r = row();
#pragma unroll
        for (int i = 0; i < F4; ++i) {
            float* dst = raw + r * HS + col(i);
            if (row0 + r < len) cp_async16(dst, src + (size_t)(row0 + r) * stride + col(i));
            else *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }

    // Copies the rows of a and of b to bf16 in a_dst and b_dst ([N][LD]) through registers, every load
    // issued before the first store; rows at or past len become zeros.
    template <int LD>
    static __device__ __forceinline__ void copy2(const float* a, const float* b, size_t stride, int row0, int len,
                                                 bf16* a_dst, bf16* b_dst) {
        const int r = row();
        float4 va[F4], vb[F4];
#pragma unroll
        for (int i = 0; i < F4; ++i) {
            va[i] = vb[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (row0 + r < len) {
                va[i] = *reinterpret_cast<const float4*>(a + (size_t)(row0 + r) * stride + col(i));
                vb[i] = *reinterpret_cast<const float4*>(b + (size_t)(row0 + r) * stride + col(i));
            }
        }
#pragma unroll
        for (int i = 0; i < F4; ++i) {
            *reinterpret_cast<uint2*>(a_dst + r * LD + col(i)) = bf16x4(va[i]);
            *reinterpret_cast<uint2*>(b_dst + r * LD + col(i)) = bf16x4(vb[i]);
        }
    }

    // Rounds the thread's own fetched floats (so only its own copies need to have landed) to bf16 in dst
    // ([N][LD]).
    template <int LD>
    static __device__ __forceinline__ void round(const float* raw, bf16* dst) {
        const int r = row();
#pragma unroll
        for (int i = 0; i < F4; ++i) {
            const float4 v = *reinterpret_cast<const float4*>(raw + r * HS + col(i));
            *reinterpret_cast<uint2*>(dst + r * LD + col(i)) = bf16x4(v);
        }
    }

    // The dot product of row row() of a and b (the thread's own fetched floats), in every thread of the row.
    static __device__ __forceinline__ float dot(const float* a, const float* b) {
        const int r = row();
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < F4; ++i) {
            const float4 x = *reinterpret_cast<const float4*>(a + r * HS + col(i));
            const float4 y = *reinterpret_cast<const float4*>(b + r * HS + col(i));
            s = fmaf(x.x, y.x, fmaf(x.y, y.y, fmaf(x.z, y.z, fmaf(x.w, y.w, s))));
        }
#pragma unroll
        for (int offset = 1; offset < PER_ROW; offset <<= 1) s += __shfl_xor_sync(FULL_MASK, s, offset);
        return s;
    }
};

// A operand fragments of 16 rows × HS of a staged [rows][LD] matrix (rows at `rows`).
template <int HS, int LD>
__device__ __forceinline__ void flash_load_a(unsigned (&a)[HS / 16][4], const bf16* rows) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) ldmatrix_x4(a[kk], rows + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
}

// A operand fragments of a warp's 16 rows [row0, row0 + 16) × HS straight from an fp32 matrix in global
// memory (row stride `stride`), rounded to bf16 (to nearest even) as they are loaded; rows at or past len
// are zeros. With `other`, also the dot product of each of the thread's two rows (row0 + flash_row(0) and
// row0 + flash_row(2)) with the same row of `other` (same stride), in fp32 from the unrounded values.
template <int HS>
__device__ __forceinline__ void flash_load_a_global(unsigned (&a)[HS / 16][4], const float* src, size_t stride,
                                                    int row0, int len, const float* other, float (&dot)[2]) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int t = row0 + lane / 4 + 8 * half;
        const size_t at = (size_t)t * stride + 2 * (lane % 4);
        float d = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; ++kk)
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                float2 v = make_float2(0.0f, 0.0f);
                if (t < len) {
                    v = *reinterpret_cast<const float2*>(src + at + kk * 16 + hi * 8);
                    if (other) {
                        const float2 w = *reinterpret_cast<const float2*>(other + at + kk * 16 + hi * 8);
                        d = fmaf(v.x, w.x, fmaf(v.y, w.y, d));
                    }
                }
                a[kk][half + 2 * hi] = bf16x2(v.x, v.y);
            }
        d += __shfl_xor_sync(FULL_MASK, d, 1);
        dot[half] = d + __shfl_xor_sync(FULL_MASK, d, 2);
    }
}

// s (16 × 64, accumulator layout) = a · bᵀ: a as A fragments (16 × HS), b the 64 staged rows [64][LD].
template <int HS, int LD>
__device__ __forceinline__ void flash_scores(float (&s)[8][4], const unsigned (&a)[HS / 16][4], const bf16* b) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int n = 0; n < 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            unsigned f[4];
            ldmatrix_x4(f, b + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 + ((lane >> 3) & 1) * 8);
            mma_bf16(s[2 * np], a[kk], f[0], f[1]);
            mma_bf16(s[2 * np + 1], a[kk], f[2], f[3]);
        }
    }
}

// o (16 × HS, accumulator layout) += p · b: p (16 × 64, accumulator layout) rounded to bf16 as the A
// operand, b the 64 staged rows [64][LD].
template <int HS, int LD>
__device__ __forceinline__ void flash_accumulate(float (&o)[HS / 8][4], const float (&p)[8][4], const bf16* b) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const unsigned a[4] = {bf16x2(p[2 * kk][0], p[2 * kk][1]), bf16x2(p[2 * kk][2], p[2 * kk][3]),
                               bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                               bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < HS / 16; ++dp) {
            unsigned f[4];
            ldmatrix_x4_trans(f, b + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 + (lane >> 4) * 8);
            mma_bf16(o[2 * dp], a, f[0], f[1]);
            mma_bf16(o[2 * dp + 1], a, f[2], f[3]);
        }
    }
}

// Element i of accumulator tile n of a warp: row (within the 16) and column (within the 64 or HS).
__device__ __forceinline__ int flash_row(int i) { return (threadIdx.x % 32) / 4 + (i >> 1) * 8; }
__device__ __forceinline__ int flash_col(int n, int i) { return n * 8 + 2 * (threadIdx.x % 4) + (i & 1); }

// Writes a warp's 16 × HS accumulator o, times `scale`, to rows row0 + r < len of out (stride `stride`),
// and rounded to bf16 to the same place of out_bf16 (either may be null).
template <int HS>
__device__ __forceinline__ void flash_store(const float (&o)[HS / 8][4], float scale, float* out, bf16* out_bf16,
                                            size_t stride, int row0, int len) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int t = row0 + flash_row(2 * half);
        if (t >= len) continue;
#pragma unroll
        for (int n = 0; n < HS / 8; ++n) {
            const size_t at = (size_t)t * stride + flash_col(n, 0);
            const float a = o[n][2 * half] * scale, b = o[n][2 * half + 1] * scale;
            if (out) *reinterpret_cast<float2*>(out + at) = make_float2(a, b);
            if (out_bf16) *reinterpret_cast<unsigned*>(out_bf16 + at) = bf16x2(a, b);
        }
    }
}

constexpr float FLASH_LOG2E = 1.4426950408889634f;

// Forward of query block `block` (rows block·ROWS …) of head h of one sequence. qkv, y: the sequence's
// first row; lse: its (sequence, head)'s T floats; bh = b·heads + h numbers the dropout elements.
template <int T, int HS>
__device__ __forceinline__ void flash_attention_forward(const float* qkv, int C, int h, int bh, int block, int len,
                                                        float* y, bf16* y_bf16, float* lse, unsigned drop_key,
                                                        unsigned drop_threshold, float drop_scale, float* smem) {
    using S = FlashSizes<T, HS>;
    constexpr int LD = S::LD, TILE = S::TILE;
    using Tile = FlashRows<TILE, HS>;
    const int q0 = block * S::ROWS;
    if (q0 >= len) return;
    bf16* kv = reinterpret_cast<bf16*>(smem);  // [buffer][k, v][TILE][LD]
    float* raw = reinterpret_cast<float*>(kv + 4 * TILE * LD);
    const float* k_src = qkv + C + h * HS;
    const float* v_src = qkv + 2 * C + h * HS;
    const size_t stride = 3 * (size_t)C;

    Tile::fetch(k_src, stride, 0, len, raw);
    Tile::fetch(v_src, stride, 0, len, raw + TILE * HS);
    cp_async_commit();
    const int warp = threadIdx.x / 32, r0 = q0 + 16 * warp;
    unsigned qf[HS / 16][4];
    float unused[2];
    flash_load_a_global<HS>(qf, qkv + h * HS, stride, r0, len, nullptr, unused);
    cp_async_wait_all();
    Tile::template round<LD>(raw, kv);
    Tile::template round<LD>(raw + TILE * HS, kv + TILE * LD);
    __syncthreads();

    const float scale_log2 = FLASH_LOG2E / sqrtf((float)HS);
    float o[HS / 8][4] = {}, m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    const int tiles = ceil_div(min(len, q0 + S::ROWS), TILE);
    for (int j = 0; j < tiles; ++j) {
        const int k0 = j * TILE;
        if (j + 1 < tiles) {
            Tile::fetch(k_src, stride, k0 + TILE, len, raw);
            Tile::fetch(v_src, stride, k0 + TILE, len, raw + TILE * HS);
            cp_async_commit();
        }
        const bf16* ks = kv + (j & 1) * 2 * TILE * LD;
        if (k0 <= r0 + 15 && r0 < len) {
            float s[8][4];
            flash_scores<HS, LD>(s, qf, ks);
            const bool inside = k0 + TILE - 1 <= r0 && k0 + TILE <= len;
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int n = 0; n < 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int t = r0 + flash_row(i), u = k0 + flash_col(n, i);
                    s[n][i] = inside || (u <= t && u < len) ? s[n][i] * scale_log2 : NEG_INF;
                    mx[i >> 1] = fmaxf(mx[i >> 1], s[n][i]);
                }
            float alpha[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL_MASK, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL_MASK, mx[r], 2));
                alpha[r] = exp2f(m[r] - mx[r]);  // tile 0 holds key 0 of every row, so mx is finite
                m[r] = mx[r];
            }
#pragma unroll
            for (int n = 0; n < 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    s[n][i] = exp2f(s[n][i] - m[i >> 1]);
                    sum[i >> 1] += s[n][i];
                }
            if (drop_threshold) {
#pragma unroll
                for (int n = 0; n < 8; ++n)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const unsigned e = ((unsigned)bh * T + r0 + flash_row(i)) * T + k0 + flash_col(n, i);
                        s[n][i] = dropout_keeps(drop_key, e, drop_threshold) ? s[n][i] * drop_scale : 0.0f;
                    }
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + sum[r];
#pragma unroll
            for (int n = 0; n < HS / 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) o[n][i] *= alpha[i >> 1];
            flash_accumulate<HS, LD>(o, s, ks + TILE * LD);
        }
        if (j + 1 < tiles) {
            bf16* next = kv + ((j + 1) & 1) * 2 * TILE * LD;
            cp_async_wait_all();
            Tile::template round<LD>(raw, next);
            Tile::template round<LD>(raw + TILE * HS, next + TILE * LD);
        }
        __syncthreads();
    }
    if (r0 >= len) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 1);
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 2);
    }
#pragma unroll
    for (int n = 0; n < HS / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[n][i] /= l[i >> 1];
    flash_store<HS>(o, 1.0f, offset_or_null(y, h * HS), offset_or_null(y_bf16, h * HS), C, r0, len);
    if (threadIdx.x % 4 == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int t = r0 + flash_row(2 * r);
            if (t < len) lse[t] = m[r] / FLASH_LOG2E + logf(l[r]);
        }
    }
}

// dk, dv of key block `block` (keys block·ROWS …) of head h of one sequence, over the query tiles from
// the diagonal on. Pointers as in the forward pass; dqkv like qkv.
template <int T, int HS>
__device__ __forceinline__ void flash_attention_backward_keys(const float* qkv, const float* y, const float* dy,
                                                              const float* lse, int C, int h, int bh, int block,
                                                              int len, float* dqkv, bf16* dqkv_bf16,
                                                              unsigned drop_key,
                                                              unsigned drop_threshold, float drop_scale, float* smem) {
    using S = FlashSizes<T, HS>;
    constexpr int LD = S::LD, TILE = S::TILE;
    using Tile = FlashRows<TILE, HS>;
    using Block = FlashRows<S::ROWS, HS>;
    const int k0 = block * S::ROWS;
    if (k0 >= len) return;
    bf16* ks = reinterpret_cast<bf16*>(smem);
    bf16* vs = ks + S::ROWS * LD;
    bf16* qdy = vs + S::ROWS * LD;  // [buffer][q, dy][TILE][LD]
    float* raw = reinterpret_cast<float*>(qdy + 4 * TILE * LD);  // q, dy, y: [3][TILE][HS]
    float* stats = raw + 3 * TILE * HS;                          // [buffer][lse·log2 e, D][TILE]
    const size_t stride = 3 * (size_t)C;
    const float* q_src = qkv + h * HS;
    const float* dy_src = dy + h * HS;
    const float* y_src = y + h * HS;

    // Stages the query tile at t0 into buffer `buf` (its fp32 rows copied by fetch_queries before).
    const auto fetch_queries = [&](int t0) {
        Tile::fetch(q_src, stride, t0, len, raw);
        Tile::fetch(dy_src, C, t0, len, raw + TILE * HS);
        Tile::fetch(y_src, C, t0, len, raw + 2 * TILE * HS);
        cp_async_commit();
    };
    const auto round_queries = [&](int t0, int buf) {
        const int r = Tile::row(), t = t0 + r;
        const float lse_t = t < len ? lse[t] * FLASH_LOG2E : 0.0f;
        cp_async_wait_all();
        bf16* dst = qdy + buf * 2 * TILE * LD;
        Tile::template round<LD>(raw, dst);
        Tile::template round<LD>(raw + TILE * HS, dst + TILE * LD);
        const float D = Tile::dot(raw + TILE * HS, raw + 2 * TILE * HS);
        if (threadIdx.x % Tile::PER_ROW == 0) {
            stats[buf * 2 * TILE + r] = lse_t;
            stats[buf * 2 * TILE + TILE + r] = D;
        }
    };

    const int first = k0 / TILE, tiles = ceil_div(len, TILE) - first;
    fetch_queries(first * TILE);
    Block::template copy2<LD>(qkv + C + h * HS, qkv + 2 * C + h * HS, stride, k0, len, ks, vs);
    round_queries(first * TILE, 0);
    __syncthreads();

    const int warp = threadIdx.x / 32, u0 = k0 + 16 * warp;
    const float scale = 1.0f / sqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    for (int j = 0; j < tiles; ++j) {
        const int t0 = (first + j) * TILE;
        if (j + 1 < tiles) fetch_queries(t0 + TILE);
        const bf16* qt = qdy + (j & 1) * 2 * TILE * LD;
        const bf16* dyt = qt + TILE * LD;
        const float* lse_t = stats + (j & 1) * 2 * TILE;
        const float* D = lse_t + TILE;
        if (t0 + TILE - 1 >= u0 && u0 < len) {
            float p[8][4], dp[8][4];
            {
                unsigned kf[HS / 16][4];
                flash_load_a<HS, LD>(kf, ks + 16 * warp * LD);
                flash_scores<HS, LD>(p, kf, qt);
            }
            const bool inside = t0 >= u0 + 15 && t0 + TILE <= len;
#pragma unroll
            for (int n = 0; n < 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int u = u0 + flash_row(i), c = flash_col(n, i), t = t0 + c;
                    p[n][i] = inside || (u <= t && t < len) ? exp2f(p[n][i] * scale_log2 - lse_t[c]) : 0.0f;
                }
            {
                unsigned vf[HS / 16][4];
                flash_load_a<HS, LD>(vf, vs + 16 * warp * LD);
                flash_scores<HS, LD>(dp, vf, dyt);
            }
#pragma unroll
            for (int n = 0; n < 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int c = flash_col(n, i);
                    float keep = 1.0f;
                    if (drop_threshold) {
                        const unsigned e = ((unsigned)bh * T + t0 + c) * T + u0 + flash_row(i);
                        keep = dropout_keeps(drop_key, e, drop_threshold) ? drop_scale : 0.0f;
                    }
                    dp[n][i] = p[n][i] * (dp[n][i] * keep - D[c]);  // ds
                    p[n][i] *= keep;
                }
            flash_accumulate<HS, LD>(dv, p, dyt);
            flash_accumulate<HS, LD>(dk, dp, qt);
        }
        if (j + 1 < tiles) round_queries(t0 + TILE, (j + 1) & 1);
        __syncthreads();
    }
    if (u0 >= len) return;
    flash_store<HS>(dk, scale, offset_or_null(dqkv, C + h * HS), offset_or_null(dqkv_bf16, C + h * HS), stride, u0, len);
    flash_store<HS>(dv, 1.0f, offset_or_null(dqkv, 2 * C + h * HS), offset_or_null(dqkv_bf16, 2 * C + h * HS), stride, u0, len);
}

// dq of query block `block` (rows block·ROWS …) of head h of one sequence, over the key tiles up to the
// diagonal. Pointers as in the forward pass.
template <int T, int HS>
__device__ __forceinline__ void flash_attention_backward_queries(const float* qkv, const float* y, const float* dy,
                                                                 const float* lse, int C, int h, int bh, int block,
                                                                 int len, float* dqkv, bf16* dqkv_bf16,
                                                              unsigned drop_key,
                                                                 unsigned drop_threshold, float drop_scale,
                                                                 float* smem) {
    using S = FlashSizes<T, HS>;
    constexpr int LD = S::LD, TILE = S::TILE;
    using Tile = FlashRows<TILE, HS>;
    const int q0 = block * S::ROWS;
    if (q0 >= len) return;
    bf16* kv = reinterpret_cast<bf16*>(smem);  // [buffer][k, v][TILE][LD]
    float* raw = reinterpret_cast<float*>(kv + 4 * TILE * LD);
    const size_t stride = 3 * (size_t)C;
    const float* k_src = qkv + C + h * HS;
    const float* v_src = qkv + 2 * C + h * HS;

    Tile::fetch(k_src, stride, 0, len, raw);
    Tile::fetch(v_src, stride, 0, len, raw + TILE * HS);
    cp_async_commit();
    const int warp = threadIdx.x / 32, r0 = q0 + 16 * warp;
    unsigned qf[HS / 16][4], dyf[HS / 16][4];
    float D_r[2], lse_r[2], unused[2];  // of the thread's rows r0 + flash_row(0), r0 + flash_row(2)
    flash_load_a_global<HS>(qf, qkv + h * HS, stride, r0, len, nullptr, unused);
    flash_load_a_global<HS>(dyf, dy + h * HS, C, r0, len, y + h * HS, D_r);  // D_t = dy_t·y_t
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int t = r0 + flash_row(2 * r);
        lse_r[r] = t < len ? lse[t] * FLASH_LOG2E : 0.0f;
    }
    cp_async_wait_all();
    Tile::template round<LD>(raw, kv);
    Tile::template round<LD>(raw + TILE * HS, kv + TILE * LD);
    __syncthreads();

    const float scale = 1.0f / sqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    float dq[HS / 8][4] = {};
    const int tiles = ceil_div(min(len, q0 + S::ROWS), TILE);
    for (int j = 0; j < tiles; ++j) {
        const int k0 = j * TILE;
        if (j + 1 < tiles) {
            Tile::fetch(k_src, stride, k0 + TILE, len, raw);
            Tile::fetch(v_src, stride, k0 + TILE, len, raw + TILE * HS);
            cp_async_commit();
        }
        const bf16* kt = kv + (j & 1) * 2 * TILE * LD;
        const bf16* vt = kt + TILE * LD;
        if (k0 <= r0 + 15 && r0 < len) {
            float p[8][4], ds[8][4];
            flash_scores<HS, LD>(p, qf, kt);
            const bool inside = k0 + TILE - 1 <= r0 && k0 + TILE <= len;
#pragma unroll
            for (int n = 0; n < 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int t = r0 + flash_row(i), u = k0 + flash_col(n, i);
                    p[n][i] = inside || (u <= t && u < len) ? exp2f(p[n][i] * scale_log2 - lse_r[i >> 1]) : 0.0f;
                }
            flash_scores<HS, LD>(ds, dyf, vt);
#pragma unroll
            for (int n = 0; n < 8; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    float keep = 1.0f;
                    if (drop_threshold) {
                        const unsigned e = ((unsigned)bh * T + r0 + flash_row(i)) * T + k0 + flash_col(n, i);
                        keep = dropout_keeps(drop_key, e, drop_threshold) ? drop_scale : 0.0f;
                    }
                    ds[n][i] = p[n][i] * (ds[n][i] * keep - D_r[i >> 1]);
                }
            flash_accumulate<HS, LD>(dq, ds, kt);
        }
        if (j + 1 < tiles) {
            bf16* next = kv + ((j + 1) & 1) * 2 * TILE * LD;
            cp_async_wait_all();
            Tile::template round<LD>(raw, next);
            Tile::template round<LD>(raw + TILE * HS, next + TILE * LD);
        }
        __syncthreads();
    }
    if (r0 >= len) return;
    flash_store<HS>(dq, scale, offset_or_null(dqkv, h * HS), offset_or_null(dqkv_bf16, h * HS), stride, r0, len);
}
