// The text model's training step for large batches (B ≥ 64) as three fused kernels of tiled matrix
// products (fused/gemm.cuh). Same math as fused/text.cu and the CPU twin src/text/model.rs; text.cu
// suits one or a few samples per step, this file suits many: there a step is three products,
// logits = H·W2ᵀ (B×V×H), ∂W2 = Gᵀ·H (V×H×B) and ∂H = G·W2 (B×H×V), with G = (softmax − onehot)/B.
//
//   1. text_batch_forward   block (vocabulary tile, sample tile): x and h of its 128 samples (recomputed
//                           per vocabulary tile: 64 KB of W1 instead of a grid-wide barrier), its 128×128
//                           logits, their softmax partials; the last block of a sample tile (ticket)
//                           combines the partials into each sample's normaliser and adds the loss.
//   2. text_batch_backward  two kinds of block, no dependency between them: ∂W2 tiles (and ∂b2) into a
//                           gradient buffer, and ∂H tiles over a slice of the vocabulary, summed with
//                           atomics. G is formed on the fly from the logits and the normaliser, never
//                           stored. W2 is only read here, so both kinds see the old W2.
//   3. text_batch_update    ∂x = (∂H ⊙ ReLU′)·W1 scattered into the context rows of E, ∂W1 and ∂b1 into
//                           gradient buffers, W2 −= lr·∂W2; the last block (ticket) applies W1 and b1
//                           once every block has read the old W1, and clears the gradient buffers.
#include "common.cuh"
#include "gemm.cuh"

#ifndef TEXT_D
#define TEXT_D 64
#endif
#ifndef TEXT_H
#define TEXT_H 256
#endif

constexpr int D = TEXT_D;
constexpr int H = TEXT_H;
constexpr int TILE = 128;  // samples × vocabulary rows per block tile
using Tile = GemmTile<TILE, TILE, 8, 8, 8>;
constexpr int STAGE = Tile::SHARED_FLOATS;
// Vocabulary rows each ∂H block sums over.
constexpr int V_SLICE = 1024;
// Samples each ∂W1 block sums over.
constexpr int B_SLICE = 512;

__device__ __forceinline__ unsigned sample_position(const unsigned* positions, const unsigned* cursor, unsigned offset,
                                                    int s) {
    return positions[*cursor + offset + s];
}

// dynamic shared memory: hs [TILE][H], then max(xs [TILE][D], ls [TILE][TILE]), then the GEMM stage.
extern "C" __global__ void __launch_bounds__(THREADS)
text_batch_forward(const float* __restrict__ E, const float* __restrict__ W1, const float* __restrict__ b1,
                   const float* __restrict__ W2, const float* __restrict__ b2, const unsigned* __restrict__ tokens,
                   const unsigned* __restrict__ positions, const unsigned* __restrict__ cursor, unsigned offset,
                   int V, int N, int B, float* __restrict__ x_out, float* __restrict__ z1_out,
                   float* __restrict__ dh_out, float* __restrict__ logits, SoftmaxStat* __restrict__ stats,
                   float* __restrict__ norm, unsigned* __restrict__ tickets, double* __restrict__ loss_sum) {
    extern __shared__ float smem[];
    float* hs = smem;
    float* xs = hs + TILE * H;
    float* ls = xs;  // logits tile, over xs once h is formed
    float* stage = xs + (D > TILE ? D : TILE) * TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int v0 = blockIdx.x * TILE, s0 = blockIdx.y * TILE;
    const int sb = min(TILE, B - s0), vb = min(TILE, V - v0);
    const bool writes_hidden = blockIdx.x == 0;

    const float inv_n = 1.0f / N;
    for (int i = threadIdx.x; i < sb * D; i += THREADS) {
        const int m = i / D, d = i % D;
        const unsigned pos = sample_position(positions, cursor, offset, s0 + m);
        float sum = 0.0f;
        for (int n = 0; n < N; ++n) sum += E[(size_t)tokens[pos - N + n] * D + d];
        xs[i] = sum * inv_n;
        if (writes_hidden) x_out[(size_t)s0 * D + i] = xs[i];
    }
    if (writes_hidden)  // ∂H is summed with atomics in text_batch_backward
        for (int i = threadIdx.x; i < sb * H; i += THREADS) dh_out[(size_t)s0 * H + i] = 0.0f;
    __syncthreads();

    for (int n0 = 0; n0 < H; n0 += TILE)
        gemm_tile<TILE, TILE, 8, 8, 8, false, true>(
            sb, H, D, 0, n0, [&](int m, int k) { return xs[m * D + k]; },
            [&](int k, int n) { return W1[(size_t)n * D + k]; },
            [&](int m, int n, float acc) {
                const float z = acc + b1[n];
                hs[m * H + n] = fmaxf(z, 0.0f);
                if (writes_hidden) z1_out[(size_t)(s0 + m) * H + n] = z;
            },
            stage);

    gemm_tile<TILE, TILE, 8, 8, 8, false, true>(
        sb, vb, H, 0, 0, [&](int m, int k) { return hs[m * H + k]; },
        [&](int k, int n) { return W2[(size_t)(v0 + n) * H + k]; },
        [&](int m, int n, float acc) { ls[m * TILE + n] = acc + b2[v0 + n]; }, stage);

    // Softmax partials of each sample over this tile's rows, and the logits out (coalesced).
    for (int m = warp; m < sb; m += WARPS) {
        SoftmaxStat st = softmax_stat_empty();
        for (int n = lane; n < vb; n += 32) {
            const float l = ls[m * TILE + n];
            logits[(size_t)(s0 + m) * V + v0 + n] = l;
            st = softmax_push(st, l);
        }
        st = warp_softmax_merge(st);
        if (lane == 0) stats[(size_t)(s0 + m) * gridDim.x + blockIdx.x] = st;
    }

    if (!last_block_to_finish(&tickets[blockIdx.y])) return;
    for (int m = warp; m < sb; m += WARPS) {
        SoftmaxStat st = softmax_stat_empty();
        for (int g = lane; g < (int)gridDim.x; g += 32) {
            const float2 partial = __ldcg(reinterpret_cast<const float2*>(&stats[(size_t)(s0 + m) * gridDim.x + g]));
            st = softmax_merge(st, {partial.x, partial.y});
        }
        st = warp_softmax_merge(st);
        if (lane == 0) {
            const int s = s0 + m;
            norm[2 * s] = st.max;
            norm[2 * s + 1] = 1.0f / st.sum;
            const unsigned target = tokens[sample_position(positions, cursor, offset, s)];
            atomicAdd(loss_sum, (double)(st.max + logf(st.sum) - __ldcg(&logits[(size_t)s * V + target])));
        }
    }
    if (threadIdx.x == 0) tickets[blockIdx.y] = 0;
}

// G[s][v] = (softmax − onehot(target)) / B, from the logits and the normaliser.
struct Dlogits {
    const float* logits;
    const float* norm;
    const unsigned* tokens;
    const unsigned* positions;
    const unsigned* cursor;
    unsigned offset;
    int V;
    float inv_b;
    __device__ __forceinline__ float operator()(int s, int v) const {
        const float p = expf(logits[(size_t)s * V + v] - norm[2 * s]) * norm[2 * s + 1];
        const unsigned target = tokens[sample_position(positions, cursor, offset, s)];
        return (p - (target == (unsigned)v ? 1.0f : 0.0f)) * inv_b;
    }
};

// Blocks [0, dw2_blocks): ∂W2 tiles (vocabulary tile × hidden tile, over all B); the rest: ∂H tiles
// (sample tile × hidden tile × vocabulary slice). dynamic shared memory: the GEMM stage.
extern "C" __global__ void __launch_bounds__(THREADS)
text_batch_backward(const float* __restrict__ W2, const float* __restrict__ logits, const float* __restrict__ norm,
                    const float* __restrict__ z1, const unsigned* __restrict__ tokens,
                    const unsigned* __restrict__ positions, const unsigned* __restrict__ cursor, unsigned offset,
                    int V, int B, float* __restrict__ grad_w2, float* __restrict__ grad_b2, float* __restrict__ dh) {
    extern __shared__ float stage[];
    const Dlogits G{logits, norm, tokens, positions, cursor, offset, V, 1.0f / B};
    constexpr int H_TILES = (H + TILE - 1) / TILE;
    const int v_tiles = (V + TILE - 1) / TILE;
    const int dw2_blocks = v_tiles * H_TILES;
    int b = blockIdx.x;
    if (b < dw2_blocks) {
        const int v0 = (b / H_TILES) * TILE, n0 = (b % H_TILES) * TILE;
        gemm_tile<TILE, TILE, 8, 8, 8, true, false>(
            V, H, B, v0, n0, [&](int v, int s) { return G(s, v); },
            [&](int s, int h) { return fmaxf(z1[(size_t)s * H + h], 0.0f); },
            [&](int v, int h, float acc) { grad_w2[(size_t)v * H + h] = acc; }, stage);
        if (n0 == 0) {  // ∂b2 of the tile's rows: Σ_s G[s][v], two threads per row
            static_assert(2 * TILE == THREADS, "two threads per vocabulary row");
            const int r = threadIdx.x / 2;
            float sum = 0.0f;
            if (v0 + r < V)
                for (int s = threadIdx.x % 2; s < B; s += 2) sum += G(s, v0 + r);
            sum += __shfl_xor_sync(FULL_MASK, sum, 1);
            if (threadIdx.x % 2 == 0 && v0 + r < V) grad_b2[v0 + r] = sum;
        }
        return;
    }
    b -= dw2_blocks;
    const int v_slices = (V + V_SLICE - 1) / V_SLICE;
    const int slice = b % v_slices;
    b /= v_slices;
    const int n0 = (b % H_TILES) * TILE, s0 = (b / H_TILES) * TILE;
    const int vs = slice * V_SLICE, vn = min(V_SLICE, V - vs);
    gemm_tile<TILE, TILE, 8, 8, 8, false, false>(
        B, H, vn, s0, n0, [&](int s, int k) { return G(s, vs + k); },
        [&](int k, int h) { return W2[(size_t)(vs + k) * H + h]; },
        [&](int s, int h, float acc) { atomicAdd(&dh[(size_t)s * H + h], acc); }, stage);
}

// Blocks: [∂x tiles (sample tile × embedding tile)] [∂W1 tiles (hidden tile × (D+1) tile × sample slice)]
// [W2 rows]. dynamic shared memory: the GEMM stage.
extern "C" __global__ void __launch_bounds__(THREADS)
text_batch_update(float* __restrict__ E, float* __restrict__ W1, float* __restrict__ b1, float* __restrict__ W2,
                  float* __restrict__ b2, const float* __restrict__ x, const float* __restrict__ z1,
                  const float* __restrict__ dh, const float* __restrict__ grad_w2, const float* __restrict__ grad_b2,
                  float* __restrict__ grad_w1, float* __restrict__ grad_b1, const unsigned* __restrict__ tokens,
                  const unsigned* __restrict__ positions, const unsigned* __restrict__ cursor, unsigned offset,
                  int V, int N, int B, float lr, int w2_blocks, unsigned* __restrict__ ticket) {
    extern __shared__ float stage[];
    constexpr int D_TILES = (D + TILE - 1) / TILE;
    constexpr int D1_TILES = (D + 1 + TILE - 1) / TILE;
    constexpr int H_TILES = (H + TILE - 1) / TILE;
    const int s_tiles = (B + TILE - 1) / TILE;
    const int b_slices = (B + B_SLICE - 1) / B_SLICE;
    const int dx_blocks = s_tiles * D_TILES, dw1_blocks = H_TILES * D1_TILES * b_slices;
    // dz1 = ∂H ⊙ ReLU′(z1)
    const auto dz1 = [&](int s, int h) {
        const size_t i = (size_t)s * H + h;
        return z1[i] > 0.0f ? dh[i] : 0.0f;
    };
    int b = blockIdx.x;
    if (b < dx_blocks) {
        const int s0 = (b / D_TILES) * TILE, n0 = (b % D_TILES) * TILE;
        const float scale = -lr / N;
        gemm_tile<TILE, TILE, 8, 8, 8, false, false>(
            B, D, H, s0, n0, dz1, [&](int h, int d) { return W1[(size_t)h * D + d]; },
            [&](int s, int d, float acc) {
                const unsigned pos = sample_position(positions, cursor, offset, s);
                for (int n = 0; n < N; ++n) atomicAdd(&E[(size_t)tokens[pos - N + n] * D + d], scale * acc);
            },
            stage);
    } else if ((b -= dx_blocks) < dw1_blocks) {
        const int slice = b % b_slices;
        b /= b_slices;
        const int m0 = (b / D1_TILES) * TILE, n0 = (b % D1_TILES) * TILE;
        const int ss = slice * B_SLICE, sn = min(B_SLICE, B - ss);
        // [∂W1 | ∂b1] = dz1ᵀ·[x | 1]
        gemm_tile<TILE, TILE, 8, 8, 8, true, false>(
            H, D + 1, sn, m0, n0, [&](int h, int k) { return dz1(ss + k, h); },
            [&](int k, int d) { return d < D ? x[(size_t)(ss + k) * D + d] : 1.0f; },
            [&](int h, int d, float acc) { atomicAdd(d < D ? &grad_w1[(size_t)h * D + d] : &grad_b1[h], acc); },
            stage);
    } else {
        b -= dw1_blocks;
        const size_t n = (size_t)V * H;
        for (size_t i = (size_t)b * THREADS + threadIdx.x; i < n; i += (size_t)w2_blocks * THREADS) W2[i] -= lr * grad_w2[i];
        for (int v = b * THREADS + threadIdx.x; v < V; v += w2_blocks * THREADS) b2[v] -= lr * grad_b2[v];
    }

    if (!last_block_to_finish(ticket)) return;
    for (int i = threadIdx.x; i < H * D; i += THREADS) {
        W1[i] -= lr * __ldcg(&grad_w1[i]);
        grad_w1[i] = 0.0f;
    }
    for (int j = threadIdx.x; j < H; j += THREADS) {
        b1[j] -= lr * __ldcg(&grad_b1[j]);
        grad_b1[j] = 0.0f;
    }
    if (threadIdx.x == 0) *ticket = 0;
}
