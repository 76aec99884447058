// The text model's training step for large batches (B ≥ 64) as three fused kernels of tiled matrix
// products (gemm_128 in fused/gemm.cuh). Same math as fused/text.cu and the CPU twin src/text/model.rs;
// text.cu suits one or a few samples per step, this file suits many: there a step is three products of
// B·V·H multiply-adds each (8.6 G at B = 4096, V = 8192, H = 256), logits = H·W2ᵀ, ∂W2 = Gᵀ·H and
// ∂H = G·W2 with G = (softmax − onehot)/B, and the work is kept to those three at the FMA pipe's pace.
//
//   1. text_batch_forward   block (vocabulary group, sample tile), about one block per SM: x and
//                           h = ReLU(z1) of its 128 samples, formed once and kept in shared memory, then
//                           the 128×128 logits tiles of its group of vocabulary tiles, each written out
//                           and folded into per-sample softmax partials; the last block of a sample tile
//                           (ticket) combines the groups' partials into each sample's normaliser and adds
//                           the loss. It also clears the buffers kernel 2 accumulates into.
//   2. text_batch_backward  regions of SLICE samples × SLICE vocabulary rows; per region, blocks of two
//                           kinds with the same work (128×128 outputs, K = SLICE), summed with atomics:
//                           ∂W2 tiles (vocabulary tile × hidden tile over the region's samples, and ∂b2)
//                           and ∂H tiles (sample tile × hidden tile over the region's vocabulary rows).
//                           Blocks run region by region, so the region's logits are read from memory once
//                           and then from L2. G is formed from the logits and the normaliser as the
//                           operands are staged, never stored. W2 is only read here.
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
constexpr int TILE = G128;  // samples × vocabulary rows per block tile
constexpr int LD = G128_LD;
constexpr int H_TILES = (H + TILE - 1) / TILE;
constexpr int H8 = (H + G128_BK - 1) / G128_BK * G128_BK;  // hT rows: H, zero-padded to whole chunks
constexpr int D8 = (D + G128_BK - 1) / G128_BK * G128_BK;
// K of each text_batch_backward block: samples of a ∂W2 tile, vocabulary rows of a ∂H tile.
constexpr int SLICE = 1024;
// Samples each ∂W1 block sums over.
constexpr int B_SLICE = 128;

__device__ __forceinline__ unsigned sample_position(const unsigned* positions, const unsigned* cursor, unsigned offset,
                                                    int s) {
    return positions[*cursor + offset + s];
}

// dst[j] += v[j] for j < min(4, count): one 16-byte atomic where rows of H floats keep it aligned (sm_90).
__device__ __forceinline__ void atomic_add4(float* dst, float4 v, int count) {
#if __CUDA_ARCH__ >= 900
    if constexpr (H % 4 == 0) {
        atomicAdd(reinterpret_cast<float4*>(dst), v);
        return;
    }
#endif
    const float a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
        if (j < count) atomicAdd(dst + j, a[j]);
}

// dynamic shared memory: hT [H8][LD], then xT [D8][LD] or logits tile ls [TILE][LD] (ls over xT once h is
// formed), then one staged operand, then the running softmax partials [TILE].
extern "C" __global__ void __launch_bounds__(THREADS, 1)
text_batch_forward(const float* __restrict__ E, const float* __restrict__ W1, const float* __restrict__ b1,
                   const float* __restrict__ W2, const float* __restrict__ b2, const unsigned* __restrict__ tokens,
                   const unsigned* __restrict__ positions, const unsigned* __restrict__ cursor, unsigned offset,
                   int V, int N, int B, float* __restrict__ x_out, float* __restrict__ z1_out,
                   float* __restrict__ dh_out, float* __restrict__ logits, SoftmaxStat* __restrict__ stats,
                   float* __restrict__ norm, unsigned* __restrict__ tickets, double* __restrict__ loss_sum,
                   float* __restrict__ grad_w2, float* __restrict__ grad_b2) {
    extern __shared__ __align__(16) float smem[];
    float* hT = smem;  // ReLU(z1) of the tile's samples, k-major: hT[h][m]
    float* xT = hT + H8 * LD;
    float* ls = xT;
    float* stage = xT + (D8 > TILE ? D8 : TILE) * LD;
    SoftmaxStat* run = reinterpret_cast<SoftmaxStat*>(stage + G128_STAGED_FLOATS);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int s0 = blockIdx.y * TILE, sb = min(TILE, B - s0);
    const int v_tiles = (V + TILE - 1) / TILE;
    const bool writes_hidden = blockIdx.x == 0;

    // Clear what text_batch_backward sums into: ∂H of this tile's samples, ∂W2 and ∂b2 across the grid.
    if (writes_hidden)
        for (int i = threadIdx.x; i < sb * H; i += THREADS) dh_out[(size_t)s0 * H + i] = 0.0f;
    {
        const size_t block = (size_t)blockIdx.y * gridDim.x + blockIdx.x, stride = (size_t)gridDim.x * gridDim.y * THREADS;
        for (size_t i = block * THREADS + threadIdx.x; i < (size_t)V * H; i += stride) grad_w2[i] = 0.0f;
        for (size_t i = block * THREADS + threadIdx.x; i < (size_t)V; i += stride) grad_b2[i] = 0.0f;
    }

    const float inv_n = 1.0f / N;
    for (int i = threadIdx.x; i < sb * D; i += THREADS) {
        const int m = i / D, d = i % D;
        const unsigned pos = sample_position(positions, cursor, offset, s0 + m);
        float sum = 0.0f;
        for (int n = 0; n < N; ++n) sum += E[(size_t)tokens[pos - N + n] * D + d];
        const float x = sum * inv_n;
        xT[d * LD + m] = x;
        if (writes_hidden) x_out[(size_t)s0 * D + i] = x;
    }
    for (int i = threadIdx.x; i < (D8 - D) * LD; i += THREADS) xT[D * LD + i] = 0.0f;
    for (int i = threadIdx.x; i < (H8 - H) * LD; i += THREADS) hT[H * LD + i] = 0.0f;
    for (int m = warp; m < sb; m += WARPS)
        if (lane == 0) run[m] = softmax_stat_empty();
    __syncthreads();

    Resident x_op{xT};
    for (int n0 = 0; n0 < H; n0 += TILE) {
        auto w1 = staged<true>([=](int h, int d) { return W1[(size_t)h * D + d]; }, H, n0, D, stage);
        gemm_128(sb, H, D, 0, n0, x_op, w1, [&](int m, int n, float4 acc) {
            const float z[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (n + j >= H) break;
                const float zj = z[j] + b1[n + j];
                hT[(n + j) * LD + m] = fmaxf(zj, 0.0f);
                if (writes_hidden) z1_out[(size_t)(s0 + m) * H + n + j] = zj;
            }
        });
    }

    // The group's vocabulary tiles: logits out (coalesced, through ls) and each sample's softmax partials.
    Resident h_op{hT};
    for (int vt = blockIdx.x; vt < v_tiles; vt += gridDim.x) {
        const int v0 = vt * TILE, vb = min(TILE, V - v0);
        auto w2 = staged<true>([=](int v, int h) { return W2[(size_t)v * H + h]; }, V, v0, H, stage);
        gemm_128(sb, V, H, 0, v0, h_op, w2, [&](int m, int v, float4 acc) {
            const float4 bias = v + 3 < V ? *reinterpret_cast<const float4*>(b2 + v)  // v is a multiple of 4
                                          : make_float4(b2[v], v + 1 < V ? b2[v + 1] : 0.0f,
                                                        v + 2 < V ? b2[v + 2] : 0.0f, 0.0f);
            *reinterpret_cast<float4*>(ls + m * LD + v - v0) =
                make_float4(acc.x + bias.x, acc.y + bias.y, acc.z + bias.z, acc.w + bias.w);
        });
        __syncthreads();
        for (int m = warp; m < sb; m += WARPS) {
            const float* row = ls + m * LD;
            float* out = logits + (size_t)(s0 + m) * V + v0;
            float max = NEG_INF;
            for (int n = lane; n < vb; n += 32) {
                out[n] = row[n];
                max = fmaxf(max, row[n]);
            }
            max = warp_max(max);
            float sum = 0.0f;
            for (int n = lane; n < vb; n += 32) sum += expf(row[n] - max);
            sum = warp_sum(sum);
            if (lane == 0) run[m] = softmax_merge(run[m], {max, sum});
        }
    }
    for (int m = warp; m < sb; m += WARPS)
        if (lane == 0) stats[(size_t)(s0 + m) * gridDim.x + blockIdx.x] = run[m];

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

// A ∂W2 tile's G operand (rows: vocabulary, k: samples) that also sums each row over the block's samples,
// for ∂b2, when `sums` is set. A warp stages one sample per chunk, so each thread adds its staged values
// into its own slots of sums [WARPS][TILE] and the warps' slots are added at the end. In shared memory
// rather than registers, which the product needs.
template <class At>
struct RowSummed : Staged<false, At> {
    float* sums;
    __device__ __forceinline__ void commit(int buf) {
        Staged<false, At>::commit(buf);
        if (sums)
#pragma unroll
            for (int r = 0; r < 4; ++r) sums[threadIdx.x / 32 * TILE + this->row_of(r)] += this->v[r];
    }
};

template <class At>
__device__ __forceinline__ RowSummed<At> row_summed(At at, int extent, int o0, int K, float* smem, float* sums) {
    return {{at, extent, o0, K, smem, {}}, sums};
}

// Blocks: regions of SLICE samples × SLICE vocabulary rows in (sample slice, vocabulary slice) order; in
// each, SLICE/TILE × H_TILES ∂W2 blocks then as many ∂H blocks (those past V or B return at once).
// dynamic shared memory: two staged operands, then the ∂b2 sums [WARPS][TILE].
extern "C" __global__ void __launch_bounds__(THREADS, 2)
text_batch_backward(const float* __restrict__ W2, const float* __restrict__ logits, const float* __restrict__ norm,
                    const float* __restrict__ z1, const unsigned* __restrict__ tokens,
                    const unsigned* __restrict__ positions, const unsigned* __restrict__ cursor, unsigned offset,
                    int V, int B, float* __restrict__ grad_w2, float* __restrict__ grad_b2, float* __restrict__ dh) {
    extern __shared__ __align__(16) float smem[];
    float* a_stage = smem;
    float* b_stage = smem + G128_STAGED_FLOATS;
    const Dlogits G{logits, norm, tokens, positions, cursor, offset, V, 1.0f / B};
    constexpr int KIND_BLOCKS = SLICE / TILE * H_TILES;
    const int v_slices = (V + SLICE - 1) / SLICE;
    const int region = blockIdx.x / (2 * KIND_BLOCKS), r = blockIdx.x % KIND_BLOCKS;
    const int ss = region / v_slices * SLICE, vs = region % v_slices * SLICE;  // the region's first sample, row
    const int tile = r / H_TILES * TILE, n0 = r % H_TILES * TILE;

    if (blockIdx.x % (2 * KIND_BLOCKS) < KIND_BLOCKS) {
        // ∂W2[v][h] += Σ_s G[s][v]·ReLU(z1[s][h]) over the region's samples; ∂b2[v] += Σ_s G[s][v].
        const int v0 = vs + tile, sn = min(SLICE, B - ss);
        if (v0 >= V) return;
        float* sums = n0 == 0 ? smem + 2 * G128_STAGED_FLOATS : nullptr;
        if (sums)
            for (int i = threadIdx.x % 32; i < TILE; i += 32) sums[threadIdx.x / 32 * TILE + i] = 0.0f;
        auto g = row_summed([=](int v, int k) { return G(ss + k, v); }, V, v0, sn, a_stage, sums);
        auto hs = staged<false>([=](int h, int k) { return fmaxf(z1[(size_t)(ss + k) * H + h], 0.0f); }, H, n0, sn,
                                b_stage);
        gemm_128(V, H, sn, v0, n0, g, hs, [&](int v, int h, float4 acc) {
            atomic_add4(&grad_w2[(size_t)v * H + h], acc, H - h);
        });
        if (sums && threadIdx.x < TILE && v0 + threadIdx.x < V) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) sum += sums[w * TILE + threadIdx.x];
            atomicAdd(&grad_b2[v0 + threadIdx.x], sum);
        }
    } else {
        // ∂H[s][h] += Σ_v G[s][v]·W2[v][h] over the region's vocabulary rows.
        const int s0 = ss + tile, vn = min(SLICE, V - vs);
        if (s0 >= B) return;
        auto g = staged<true>([=](int s, int k) { return G(s, vs + k); }, B, s0, vn, a_stage);
        auto w2 = staged<false>([=](int h, int k) { return W2[(size_t)(vs + k) * H + h]; }, H, n0, vn, b_stage);
        gemm_128(B, H, vn, s0, n0, g, w2, [&](int s, int h, float4 acc) {
            atomic_add4(&dh[(size_t)s * H + h], acc, H - h);
        });
    }
}

// Blocks: [∂x tiles (sample tile × embedding tile)] [∂W1 tiles (hidden tile × (D+1) tile × sample slice)]
// [W2 rows]. dynamic shared memory: two staged operands.
extern "C" __global__ void __launch_bounds__(THREADS, 2)
text_batch_update(float* __restrict__ E, float* __restrict__ W1, float* __restrict__ b1, float* __restrict__ W2,
                  float* __restrict__ b2, const float* __restrict__ x, const float* __restrict__ z1,
                  const float* __restrict__ dh, const float* __restrict__ grad_w2, const float* __restrict__ grad_b2,
                  float* __restrict__ grad_w1, float* __restrict__ grad_b1, const unsigned* __restrict__ tokens,
                  const unsigned* __restrict__ positions, const unsigned* __restrict__ cursor, unsigned offset,
                  int V, int N, int B, float lr, int w2_blocks, unsigned* __restrict__ ticket) {
    extern __shared__ __align__(16) float smem[];
    float* a_stage = smem;
    float* b_stage = smem + G128_STAGED_FLOATS;
    constexpr int D_TILES = (D + TILE - 1) / TILE;
    constexpr int D1_TILES = (D + 1 + TILE - 1) / TILE;
    const int s_tiles = (B + TILE - 1) / TILE;
    const int b_slices = (B + B_SLICE - 1) / B_SLICE;
    const int dx_blocks = s_tiles * D_TILES, dw1_blocks = H_TILES * D1_TILES * b_slices;
    // dz1 = ∂H ⊙ ReLU′(z1)
    const auto dz1 = [=](int s, int h) {
        const size_t i = (size_t)s * H + h;
        return z1[i] > 0.0f ? dh[i] : 0.0f;
    };
    int b = blockIdx.x;
    if (b < dx_blocks) {
        const int s0 = (b / D_TILES) * TILE, n0 = (b % D_TILES) * TILE;
        const float scale = -lr / N;
        auto a = staged<true>(dz1, B, s0, H, a_stage);
        auto w1 = staged<false>([=](int d, int h) { return W1[(size_t)h * D + d]; }, D, n0, H, b_stage);
        gemm_128(B, D, H, s0, n0, a, w1, [&](int s, int d, float4 acc) {
            const float dx[4] = {acc.x, acc.y, acc.z, acc.w};
            const unsigned pos = sample_position(positions, cursor, offset, s);
            for (int n = 0; n < N; ++n) {
                float* row = E + (size_t)tokens[pos - N + n] * D;
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (d + j < D) atomicAdd(&row[d + j], scale * dx[j]);
            }
        });
    } else if ((b -= dx_blocks) < dw1_blocks) {
        const int slice = b % b_slices;
        b /= b_slices;
        const int m0 = (b / D1_TILES) * TILE, n0 = (b % D1_TILES) * TILE;
        const int ss = slice * B_SLICE, sn = min(B_SLICE, B - ss);
        // [∂W1 | ∂b1] = dz1ᵀ·[x | 1]
        auto a = staged<false>([=](int h, int k) { return dz1(ss + k, h); }, H, m0, sn, a_stage);
        auto xs = staged<false>([=](int d, int k) { return d < D ? x[(size_t)(ss + k) * D + d] : 1.0f; }, D + 1, n0,
                                sn, b_stage);
        gemm_128(H, D + 1, sn, m0, n0, a, xs, [&](int h, int d, float4 acc) {
            const float g[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (d + j < D) atomicAdd(&grad_w1[(size_t)h * D + d + j], g[j]);
                else if (d + j == D) atomicAdd(&grad_b1[h], g[j]);
            }
        });
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
