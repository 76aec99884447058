// The character-level Transformer's training step (CPU twin: src/transformer/model.rs, src/ops/optim.rs):
//
//   x = tok_emb[token] + pos_emb[t]
//   per block:  x += proj(attention(LN1(x)));  x += mproj(gelu(fc(LN2(x))))
//   logits = head(LN_f(x)), mean softmax cross-entropy over the B·T positions
//
// as a chain of fused kernels over the N = B·T rows of a step, llm.c's layout: each op family is one
// kernel that does all of its work, with what follows it fused in where it is elementwise.
//
//   tf_embed_layernorm     x = dropout(tok_emb + pos_emb), then block 0's LN1 (a warp per row; layernorm.cuh)
//   tf_residual_layernorm  x = x + dropout(delta) (the sublayer's output), then the next LayerNorm
//   tf_linear_forward      out = in·Wᵀ + b, and with `pre` the FFN's GELU in the epilogue (gemm.cuh; with
//                          `tf32` every product of the linear layers runs on the tensor cores in TF32;
//                          the _bf16 twins of both linear kernels run them in bf16 with fp32 sums, on
//                          `wgmma` their forward and dx tiles staged and written by whole rows)
//   tf_attention_forward   a block per (sequence, head), scores in shared memory (attention.cuh)
//   tf_classifier          softmax + cross-entropy over a row's V logits, leaving dlogits in place, and
//                          the step's loss summed over the rows in row order by the last block
//   tf_linear_backward     dW, db = Σ_rows dy·[x | 1] (each tile over row slices, the slices added in
//                          order by the tile's last block) and dx = dy·W (× GELU′ of `pre`), one launch
//   tf_linear_forward_tma_*  on Hopper, the bf16 forward products on gemm_tma.cuh's TMA pipeline with the
//                          same epilogue, by rows
//   tf_layernorm_backward  dx added into the residual gradient; dw, db from per-block partials
//   tf_attention_backward  dq, dk, dv of a (sequence, head) a chunk of keys per block, p rebuilt from the
//                          saved log-sum-exp
//   tf_flash_attention_forward, tf_flash_attention_backward
//                          the same in bf16 on the tensor cores, with dropout (flash_attention.cuh)
//   tf_dropout_backward    a residual branch's gradient: d_branch = mask ⊙ d_residual (fp32; in bf16 the
//                          LayerNorm backward pass writes the branch's bf16 gradient itself)
//   tf_embedding_backward  tok_emb and pos_emb gradients (through the embedding dropout's mask): a
//                          token's rows found a slice of rows per block, the slices added in order
//   tf_grad_norm           the gradient's global L2 norm in a fixed order, and clipping's factor from it
//   tf_clip_scale          that factor from the squared norms of every ZeRO-1 shard, summed over the ranks
//   tf_adamw               every parameter in one launch (optim.cuh) at the step's scheduled rate, the
//                          step count advanced once, and in bf16 the weights' bf16 copy
//   tf_round_bf16          the parameters' bf16 copy, before the first bf16 step
//   tf_accumulate          a step over several micro-batches (--grad-accum): their gradients summed in order
//
// bf16 (--precision bf16), as PyTorch autocast: the linear layers' products read bf16 copies of their
// operands, each rounded once where it is computed (the LayerNorms' outputs, attention's y, the GELU
// output, the logits' gradient, the residual branches' gradients, dqkv and the MLP's dx; the weights'
// copy by AdamW), so no product reads fp32 operands from memory. Everything else stays fp32: the
// residual stream and its gradient, LayerNorm and softmax statistics, master weights and AdamW's state.
//
// No float atomics anywhere: a run repeats to the bit. Row r of a step is position t = r % T of sequence
// b = r / T, whose tokens are data[offsets[b] + t] and targets data[offsets[b] + t + 1]; a CUDA graph of
// many steps bakes in each step's offsets pointer, learning-rate slot and loss slot.
//
// Dropout (dropout.cuh) in training, nanoGPT's four places: the embeddings' sum, the attention
// probabilities, and the attention and MLP branches before their residual adds. Each place is a site
// whose per-run seed the host passes with the threshold and scale (threshold 0: off, as in evaluation);
// the step number comes from the device's step counter, so a graph's steps draw fresh masks. Element
// (row, c) of a row-wise site is row·C + c; attention's are ((b·heads + h)·T + t)·T + u.
//
// Sizes compiled in: TF_C (embedding, a multiple of 32), TF_HS (head size), TF_T (block, the longest
// sequence). THREADS (256) per block everywhere.
#include "common.cuh"
#include "gemm.cuh"
#include "gemm_wgmma.cuh"
#include "gemm_tma.cuh"
#include "activations.cuh"
#include "dropout.cuh"
#include "layernorm.cuh"
#include "attention.cuh"
#include "flash_attention.cuh"
#include "optim.cuh"

#ifndef TF_C
#define TF_C 64
#endif
#ifndef TF_HS
#define TF_HS 16
#endif
#ifndef TF_T
#define TF_T 64
#endif
constexpr int C = TF_C, HS = TF_HS, T = TF_T;
static_assert(C % 32 == 0, "the embedding must be a multiple of 32");
constexpr int PER_LANE = C / 32;

// The linear layers' tile products, by precision (the launch layer mirrors these in LinearTiles): forward
// and dx tiles BM × BN, weight-gradient tiles WG_BM × WG_BN over a slice of the rows, k in chunks of BK,
// STAGES chunks in flight where the tile has stages, and the dynamic shared memory of either kernel:
//   fp32        gemm_128 (8×8 register tiles a thread) on StagedMatrix operands: all three tiles
//               128 × 128, the bias gradient summed from dy's staged chunks, the MLP projection's forward
//               product in halves of k (linear_forward_halves);
//   fp32, small gemm_tile with tf32's tile sizes, for steps too small to fill the GPU with 128 × 128
//               tiles (the default model's 2048 rows make 16 to 32 of them: 0.76 ms a step against 0.43);
//   tf32        gemm_tile_tf32: forward and dx tiles 32 × 64, weight-gradient tiles 32 × 32;
//   bf16        on bf16 copies of the operands, all three tiles 128 × 128: gemm_tile_bf16_wgmma in 3 stages
//               of 64 k (two blocks an SM) where the compile has `wgmma` (sm_90a), else
//               gemm_tile_bf16_async in 4 stages of 32 k. (256-row dx tiles in 4 stages, one block an
//               SM, made the backward pass 9 % slower.)
// (FP32_SMALL is fp32 arithmetic on the small tiles: Precision here says both what a product computes
// and on which tiles; the launch layer picks it by the step's rows.)
enum Precision { FP32 = 0, TF32 = 1, BF16 = 2, FP32_SMALL = 3 };

template <int P>
struct LinearTiles;
template <>
struct LinearTiles<FP32> {
    static constexpr int BM = G128, BN = G128, BK = G128_BK, WG_BM = BM, WG_BN = BN;
    static constexpr int STAGES = 1;  // unused: gemm_128 stages two chunks
    static constexpr int SHARED_FLOATS = 2 * G128_STAGED_FLOATS;
};
template <>
struct LinearTiles<TF32> {
    static constexpr int BM = 32, BN = 64, BK = 32, WG_BM = 32, WG_BN = 32;
    static constexpr int STAGES = 1;  // unused: gemm_tile_tf32 stages two chunks
    static constexpr int SHARED_FLOATS = GemmTile<BM, BN, BK, 2, 4>::SHARED_FLOATS > GemmTile<WG_BM, WG_BN, BK, 2, 2>::SHARED_FLOATS
                                             ? GemmTile<BM, BN, BK, 2, 4>::SHARED_FLOATS
                                             : GemmTile<WG_BM, WG_BN, BK, 2, 2>::SHARED_FLOATS;
};
template <>
struct LinearTiles<FP32_SMALL> : LinearTiles<TF32> {};
template <>
struct LinearTiles<BF16> {
    static constexpr int BM = Bf16Tile::BM, BN = Bf16Tile::BN, BK = Bf16Tile::BK, WG_BM = BM, WG_BN = BN;
    static constexpr int STAGES = Bf16Tile::STAGES;
    static constexpr int SHARED_FLOATS = Bf16Tile::SHARED_FLOATS;
};

// What the linear layers' products read at precision P: fp32 activations and weights, or their bf16
// copies (written where each activation is computed, and the weights' by AdamW).
template <int P>
struct OperandOf {
    typedef float type;
};
template <>
struct OperandOf<BF16> {
    typedef bf16 type;
};

// One tile product of precision P of A (leading dimension lda, K×M when A_TRANS) and B (ldb, N×K when
// B_TRANS), with ONES_COLUMN B's last column (N − 1) read as 1. Results go to store(m, n, v0, v1, both):
// C[m][n] = v0 and, when `both`, C[m][n + 1] = v1, once per element inside C (TF32 tiles hand out single
// elements, fp32 and bf16 tiles adjacent pairs). With a_sums (fp32, A_TRANS), the calling thread's share
// of A's row sums over K lands there (StagedMatrix::sums: rows m0 + 4·(t mod 32) + i). ONES_COLUMN is
// compile-time because the small tiles' loads slow down under a runtime test of n (the default
// Transformer's step: 0.391 ms with the test in every product, 0.356 ms without).
template <int P, int BM, int BN, int BK, int STAGES, bool A_TRANS, bool B_TRANS, bool ONES_COLUMN = false, class Store>
__device__ __forceinline__ void tile_product(int M, int N, int K, int m0, int n0, const float* A, int lda,
                                             const float* B, int ldb, Store store, float* smem,
                                             float4* a_sums = nullptr) {
    static_assert(P != BF16, "bf16 products read bf16 operands");
    const int ones_col = ONES_COLUMN ? N - 1 : -1;
    const auto a_at = [&](int m, int k) { return A_TRANS ? A[(size_t)k * lda + m] : A[(size_t)m * lda + k]; };
    const auto b_at = [&](int k, int n) {
        return ONES_COLUMN && n == ones_col ? 1.0f : B_TRANS ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n];
    };
    if constexpr (P == TF32) {
        const auto one = [&](int m, int n, float v) { store(m, n, v, 0.0f, false); };
        gemm_tile_tf32<BM, BN, BK, A_TRANS, B_TRANS>(M, N, K, m0, n0, a_at, b_at, one, smem);
    } else if constexpr (P == FP32_SMALL) {
        const auto one = [&](int m, int n, float v) { store(m, n, v, 0.0f, false); };
        gemm_tile<BM, BN, BK, 2, BN / 16, A_TRANS, B_TRANS>(M, N, K, m0, n0, a_at, b_at, one, smem);
    } else {
        static_assert(BM == G128 && BN == G128, "fp32 products are gemm_128 tiles");
        auto a = staged_matrix<!A_TRANS>(A, lda, M, m0, K, smem, -1, a_sums != nullptr);
        auto b = staged_matrix<B_TRANS>(B, ldb, N, n0, K, smem + G128_STAGED_FLOATS, ones_col);
        gemm_128(M, N, K, m0, n0, a, b, [&](int m, int n, float4 v) {
            store(m, n, v.x, v.y, n + 1 < N);
            if (n + 2 < N) store(m, n + 2, v.z, v.w, n + 3 < N);
        });
        if (a_sums) *a_sums = a.sums;
    }
}

template <int P, int BM, int BN, int BK, int STAGES, bool A_TRANS, bool B_TRANS, class Store, class OnChunk = NoChunkHook>
__device__ __forceinline__ void tile_product(int M, int N, int K, int m0, int n0, const bf16* A, int lda,
                                             const bf16* B, int ldb, Store store, float* smem,
                                             OnChunk on_chunk = {}) {
    static_assert(P == BF16, "only bf16 products read bf16 operands");
    static_assert(BM == Bf16Tile::BM && BN == Bf16Tile::BN && BK == Bf16Tile::BK && STAGES == Bf16Tile::STAGES,
                  "bf16 products are Bf16Tile's");
    // No ones column at bf16 (Wgrad<BF16>::ONES_COLUMN is off: ∂bias comes through on_chunk).
    const auto pairs = [&](int m, int n, float v0, float v1) { store(m, n, v0, v1, n + 1 < N); };
    gemm_tile_bf16_fast<A_TRANS, B_TRANS>(M, N, K, m0, n0, A, lda, B, ldb, pairs, smem, on_chunk);
}


__device__ __forceinline__ unsigned token_at(const unsigned* data, const unsigned* offsets, int row, int shift) {
    return data[offsets[row / T] + row % T + shift];
}

// Grid ceil(N / WARPS): a warp per row. x = dropout(tok_emb + pos_emb), out = LayerNorm(x) in fp32, in
// bf16 (out_bf16), or both (a null pointer skips one).
extern "C" __global__ void __launch_bounds__(THREADS)
tf_embed_layernorm(const DropoutArgs dropout,
                   const unsigned* __restrict__ data, const unsigned* __restrict__ offsets, int N,
                   const float* __restrict__ tok_emb, const float* __restrict__ pos_emb, float* __restrict__ x,
                   const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ out,
                   bf16* __restrict__ out_bf16, float* __restrict__ mean, float* __restrict__ rstd) {
    const int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const SiteDropout drop(dropout);
    const float *tok = tok_emb + (size_t)token_at(data, offsets, row, 0) * C, *pos = pos_emb + (size_t)(row % T) * C;
    const size_t at = (size_t)row * C;
    float v[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int c = i * 32 + lane;
        v[i] = (tok[c] + pos[c]) * drop.factor(at + c);
        x[at + c] = v[i];
    }
    layernorm_row_normalize<C>(v, w, b, offset_or_null(out, at), offset_or_null(out_bf16, at), mean + row, rstd + row);
}

// Grid ceil(N / WARPS): x_out = x_in + dropout(delta), out = LayerNorm(x_out) (fp32, bf16 or both, as
// tf_embed_layernorm's).
extern "C" __global__ void __launch_bounds__(THREADS)
tf_residual_layernorm(const DropoutArgs dropout,
                      const float* __restrict__ x_in, const float* __restrict__ delta, float* __restrict__ x_out, int N,
                      const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ out,
                      bf16* __restrict__ out_bf16, float* __restrict__ mean, float* __restrict__ rstd) {
    const int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N) return;
    const SiteDropout drop(dropout);
    const size_t at = (size_t)row * C;
    float v[PER_LANE];
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        const int c = i * 32 + lane;
        v[i] = x_in[at + c] + delta[at + c] * drop.factor(at + c);
        x_out[at + c] = v[i];
    }
    layernorm_row_normalize<C>(v, w, b, offset_or_null(out, at), offset_or_null(out_bf16, at), mean + row, rstd + row);
}

// Grid any: d_branch = mask ⊙ d_res over the n = N·C elements (a residual branch's dropout, backward).
extern "C" __global__ void __launch_bounds__(THREADS)
tf_dropout_backward(const DropoutArgs dropout, const float* __restrict__ d_res, float* __restrict__ d_branch, int n) {
    const SiteDropout drop(dropout);
    for (int e = blockIdx.x * THREADS + threadIdx.x; e < n; e += gridDim.x * THREADS)
        d_branch[e] = d_res[e] * drop.factor(e);
}

// The forward product's epilogue, store(m, n, z0, z1, both) as tile_product's: z + bias into out (fp32),
// out_bf16 or both (a null pointer skips one); with `pre`, z + bias into pre and its GELU into out.
__device__ __forceinline__ auto forward_epilogue(const float* __restrict__ bias, float* __restrict__ out,
                                                 bf16* __restrict__ out_bf16, float* __restrict__ pre, int O) {
    return [=](int m, int n, float z0, float z1, bool both) {
        const size_t at = (size_t)m * O + n;
        z0 += __ldg(bias + n);
        if (both) z1 += __ldg(bias + n + 1);
        if (pre) {
            store_pair(pre + at, z0, z1, both);
            z0 = gelu(z0);
            z1 = gelu(z1);
        }
        if (out) store_pair(out + at, z0, z1, both);
        if (out_bf16) store_pair(out_bf16 + at, z0, z1, both);
    };
}

// The dx product's epilogue (dx = dy·W, N × K), store as tile_product's: times gelu′(pre) when pre is
// given, into dx (fp32), dx_bf16 or both.
__device__ __forceinline__ auto dx_epilogue(float* __restrict__ dx, bf16* __restrict__ dx_bf16,
                                            const float* __restrict__ pre, int K) {
    return [=](int m, int k, float g0, float g1, bool both) {
        const size_t at = (size_t)m * K + k;
        // A pair's two inputs in one 8-byte load where aligned.
        if (pre && both && at % 2 == 0) {
            const float2 z = __ldg(reinterpret_cast<const float2*>(pre + at));
            g0 *= gelu_slope(z.x);
            g1 *= gelu_slope(z.y);
        } else if (pre) {
            g0 *= gelu_slope(__ldg(pre + at));
            if (both) g1 *= gelu_slope(__ldg(pre + at + 1));
        }
        if (dx) store_pair(dx + at, g0, g1, both);
        if (dx_bf16) store_pair(dx_bf16 + at, g0, g1, both);
    };
}

// The two epilogues above by rows, for the bf16 products (gemm_tile_bf16_by_rows, and the TMA products'
// gemm_bf16_tma_tiles_by_rows): four adjacent results at a time, out(m, n, v, count, whole), each result
// through the same operations in the same order as a pair's, operands and results moved 16 bytes at a
// time (8 in bf16) where `whole` and every pointer allows it. (Pair by pair, 8 rows apart, the wgmma
// tile's epilogue loads and stores bounded it.)
__device__ __forceinline__ auto forward_epilogue_by_rows(const float* __restrict__ bias, float* __restrict__ out,
                                                         bf16* __restrict__ out_bf16, float* __restrict__ pre, int O) {
    const bool vector = aligned16(bias) && (!out || aligned16(out)) && (!pre || aligned16(pre)) &&
                        reinterpret_cast<size_t>(out_bf16) % 8 == 0;
    return [=](int m, int n, float4 v, int count, bool whole) {
        const size_t at = (size_t)m * O + n;
        float z[4] = {v.x, v.y, v.z, v.w};
        if (whole && vector) {
            const float4 b = __ldg(reinterpret_cast<const float4*>(bias + n));
            z[0] += b.x, z[1] += b.y, z[2] += b.z, z[3] += b.w;
            if (pre) {
                *reinterpret_cast<float4*>(pre + at) = make_float4(z[0], z[1], z[2], z[3]);
#pragma unroll
                for (int j = 0; j < 4; ++j) z[j] = gelu(z[j]);
            }
            if (out) *reinterpret_cast<float4*>(out + at) = make_float4(z[0], z[1], z[2], z[3]);
            if (out_bf16) *reinterpret_cast<uint2*>(out_bf16 + at) = {bf16x2(z[0], z[1]), bf16x2(z[2], z[3])};
        } else {
            for (int j = 0; j < count; ++j) {
                float zj = z[j] + __ldg(bias + n + j);
                if (pre) {
                    pre[at + j] = zj;
                    zj = gelu(zj);
                }
                if (out) out[at + j] = zj;
                if (out_bf16) out_bf16[at + j] = to_bf16(zj);
            }
        }
    };
}

__device__ __forceinline__ auto dx_epilogue_by_rows(float* __restrict__ dx, bf16* __restrict__ dx_bf16,
                                                    const float* __restrict__ pre, int K) {
    const bool vector = (!dx || aligned16(dx)) && (!pre || aligned16(pre)) && reinterpret_cast<size_t>(dx_bf16) % 8 == 0;
    return [=](int m, int k, float4 v, int count, bool whole) {
        const size_t at = (size_t)m * K + k;
        float g[4] = {v.x, v.y, v.z, v.w};
        if (whole && vector) {
            if (pre) {
                const float4 z = __ldg(reinterpret_cast<const float4*>(pre + at));
                g[0] *= gelu_slope(z.x), g[1] *= gelu_slope(z.y), g[2] *= gelu_slope(z.z), g[3] *= gelu_slope(z.w);
            }
            if (dx) *reinterpret_cast<float4*>(dx + at) = make_float4(g[0], g[1], g[2], g[3]);
            if (dx_bf16) *reinterpret_cast<uint2*>(dx_bf16 + at) = {bf16x2(g[0], g[1]), bf16x2(g[2], g[3])};
        } else {
            for (int j = 0; j < count; ++j) {
                if (pre) g[j] *= gelu_slope(__ldg(pre + at + j));
                if (dx) dx[at + j] = g[j];
                if (dx_bf16) dx_bf16[at + j] = to_bf16(g[j]);
            }
        }
    };
}

// Grid (ceil(out_features / BN), ceil(N / BM)) of LinearTiles<P>. out = in·Wᵀ + bias (W: out_features ×
// in_features), in fp32, bf16 (out_bf16) or both (a null pointer skips one). With `pre`: pre = in·Wᵀ + bias
// and out = gelu(pre).
template <int P>
__device__ __forceinline__ void linear_forward(const typename OperandOf<P>::type* __restrict__ in,
                                               const typename OperandOf<P>::type* __restrict__ W,
                                               const float* __restrict__ bias, float* __restrict__ out,
                                               bf16* __restrict__ out_bf16, float* __restrict__ pre, int N,
                                               int out_features, int in_features, float* smem) {
    using L = LinearTiles<P>;
    const int K = in_features, O = out_features;
    const int m0 = blockIdx.y * L::BM, n0 = blockIdx.x * L::BN;
    if constexpr (P == BF16) {
        gemm_tile_bf16_by_rows<false, true>(N, O, K, m0, n0, in, K, W, K, smem,
                                            forward_epilogue_by_rows(bias, out, out_bf16, pre, O));
    } else {
        const auto store = forward_epilogue(bias, out, out_bf16, pre, O);
        tile_product<P, L::BM, L::BN, L::BK, L::STAGES, false, true>(N, O, K, m0, n0, in, K, W, K, store, smem);
    }
}

// fp32 with k split in two halves, for layers whose tiles fill under two waves of two blocks an SM and
// whose k is long (the launch layer's rule; at nanoGPT's shape the MLP projection: 384 tiles on 132 SMs,
// the second wave under half full, k 1536). Grid
// (ceil(out_features / 128), 2·ceil(N / 128)): block y is half y mod 2 of row tile y / 2. Each half keeps
// its tile in registers and writes it, half 0 into out and half 1 into `other` (N × out_features floats);
// the later of the two to finish adds the other's to its own, which gives the same bits whichever that is
// (a + b = b + a), then the bias, into out. tickets: one per tile, zero between launches.
__device__ __forceinline__ void linear_forward_halves(const float* __restrict__ in, const float* __restrict__ W,
                                                      const float* __restrict__ bias, float* __restrict__ out,
                                                      float* __restrict__ other, unsigned* __restrict__ tickets, int N,
                                                      int O, int K, float* smem) {
    const int half = blockIdx.y % 2, m0 = blockIdx.y / 2 * G128, n0 = blockIdx.x * G128;
    const int k_half = ceil_div(ceil_div(K, 2), G128_BK) * G128_BK, k0 = half * k_half;
    const int kn = max(0, min(K, k0 + k_half) - k0);
    auto a = staged_matrix<true>(in + k0, K, N, m0, kn, smem);
    auto b = staged_matrix<true>(W + k0, K, O, n0, kn, smem + G128_STAGED_FLOATS);
    float acc[8][8];
    gemm_128_acc(kn, a, b, acc);
    const G128Thread t;
    // f(acc[i][j], row m's start in a matrix like out, column n) for each element inside C.
    const auto each = [&](auto f) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int m = m0 + t.row(i);
            if (m >= N) continue;
#pragma unroll
            for (int j = 0; j < 8; ++j)
                if (n0 + t.col(j) < O) f(acc[i][j], (size_t)m * O, n0 + t.col(j));
        }
    };
    float* mine = half ? other : out;
    each([&](float v, size_t row, int n) { mine[row + n] = v; });
    const int tile = blockIdx.y / 2 * gridDim.x + blockIdx.x;
    if (!last_block_to_finish(&tickets[tile], 2)) return;
    const float* theirs = half ? out : other;
    each([&](float v, size_t row, int n) { out[row + n] = (v + __ldcg(theirs + row + n)) + __ldg(bias + n); });
    if (threadIdx.x == 0) tickets[tile] = 0;
}

// fp32 on gemm_128.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_linear_forward(const float* __restrict__ in, const float* __restrict__ W, const float* __restrict__ bias,
                  float* __restrict__ out, float* __restrict__ pre, int N, int out_features, int in_features) {
    extern __shared__ float smem[];
    linear_forward<FP32>(in, W, bias, out, nullptr, pre, N, out_features, in_features, smem);
}

// On the small tiles: fp32, or TF32 on the tensor cores when `tf32`.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_linear_forward_small(const float* __restrict__ in, const float* __restrict__ W, const float* __restrict__ bias,
                        float* __restrict__ out, float* __restrict__ pre, int N, int out_features, int in_features,
                        int tf32) {
    extern __shared__ float smem[];
    if (tf32) linear_forward<TF32>(in, W, bias, out, nullptr, pre, N, out_features, in_features, smem);
    else linear_forward<FP32_SMALL>(in, W, bias, out, nullptr, pre, N, out_features, in_features, smem);
}

// fp32 in halves of k (linear_forward_halves); no GELU. Two blocks an SM.
extern "C" __global__ void __launch_bounds__(THREADS, 2)
tf_linear_forward_halves(const float* __restrict__ in, const float* __restrict__ W, const float* __restrict__ bias,
                         float* __restrict__ out, float* __restrict__ other, unsigned* __restrict__ tickets, int N,
                         int out_features, int in_features) {
    extern __shared__ float smem[];
    linear_forward_halves(in, W, bias, out, other, tickets, N, out_features, in_features, smem);
}

// The bf16 copies of `in` and of W.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_linear_forward_bf16(const bf16* __restrict__ in, const bf16* __restrict__ W, const float* __restrict__ bias,
                       float* __restrict__ out, bf16* __restrict__ out_bf16, float* __restrict__ pre, int N,
                       int out_features, int in_features) {
    extern __shared__ __align__(16) float smem[];
    linear_forward<BF16>(in, W, bias, out, out_bf16, pre, N, out_features, in_features, smem);
}

// Grid B·heads: block (b, h) over rows b·T … of the step.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_attention_forward(const DropoutArgs dropout,
                     const float* __restrict__ qkv, float* __restrict__ y, float* __restrict__ lse, int heads) {
    extern __shared__ float smem[];
    const int b = blockIdx.x / heads, h = blockIdx.x % heads;
    const SiteDropout drop(dropout);
    attention_forward<T, HS>(qkv + (size_t)b * T * 3 * C, C, h, T, y + (size_t)b * T * C, lse + ((size_t)b * heads + h) * T,
                             smem, drop.key, drop.threshold, drop.scale, (unsigned)blockIdx.x * T * T);
}

// Grid ceil(N / WARPS): row r's loss −log softmax(logits_r)[target] into row_loss[r], logits_r ←
// (softmax − onehot)·scale, and that rounded to bf16 into row r of dlogits_bf16 (row stride ld_bf16; none
// when null). The last block adds the losses of rows [0, counted) in row order to *loss_sum (a padded
// evaluation batch counts its real windows only).
extern "C" __global__ void __launch_bounds__(THREADS)
tf_classifier(float* __restrict__ logits, const unsigned* __restrict__ data, const unsigned* __restrict__ offsets, int N,
              int V, float scale, float* __restrict__ row_loss, int counted, unsigned* __restrict__ ticket,
              double* __restrict__ loss_sum, bf16* __restrict__ dlogits_bf16, int ld_bf16) {
    const int row = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row < N) {
        float* z = logits + (size_t)row * V;
        const unsigned target = token_at(data, offsets, row, 1);
        float max = NEG_INF;
        for (int v = lane; v < V; v += 32) max = fmaxf(max, z[v]);
        max = warp_max(max);
        float sum = 0.0f;
        for (int v = lane; v < V; v += 32) sum += expf(z[v] - max);
        sum = warp_sum(sum);
        const float target_logit = z[target];
        __syncwarp();
        const float inv = 1.0f / sum;
        for (int v = lane; v < V; v += 32) {
            z[v] = (expf(z[v] - max) * inv - (v == (int)target ? 1.0f : 0.0f)) * scale;
            if (dlogits_bf16) dlogits_bf16[(size_t)row * ld_bf16 + v] = to_bf16(z[v]);
        }
        if (lane == 0) row_loss[row] = max + logf(sum) - target_logit;
    }
    if (!last_block_to_finish(ticket)) return;
    // Each thread adds a run of rows, then the runs are added pairwise in a fixed tree.
    __shared__ double partial[THREADS];
    const int per = ceil_div(counted, THREADS), r0 = threadIdx.x * per;
    double total = 0.0;
    for (int r = r0; r < min(counted, r0 + per); ++r) total += __ldcg(&row_loss[r]);
    partial[threadIdx.x] = total;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        *loss_sum += partial[0];
        *ticket = 0;
    }
}

// The weight-gradient tiles of LinearTiles<P>: out_features × (in_features + 1) in WG_BM × WG_BN tiles,
// the bias gradient from a column of ones after x's (TF32), or out_features × in_features with the bias
// gradient summed from dy's chunks as the first column of tiles reads them (fp32, bf16: at 128 columns a
// ones column would take a tile of its own, a quarter of the weight gradient's work at in_features 384);
// each tile over `slices` slices of the N rows. Then ceil(in_features / BN) × ceil(N / BM) dx tiles (none
// when dx is null).
template <int P>
struct Wgrad {
    static constexpr bool ONES_COLUMN = P == TF32 || P == FP32_SMALL;
    __device__ __forceinline__ static int columns(int in_features) {
        return ceil_div(in_features + ONES_COLUMN, LinearTiles<P>::WG_BN);
    }
    __device__ __forceinline__ static int tiles(int out_features, int in_features) {
        return ceil_div(out_features, LinearTiles<P>::WG_BM) * columns(in_features);
    }
};

// Grid Wgrad::tiles·slices + (dx or dx_bf16 ? dx tiles : 0). dy: N × out_features (row stride dy_ld), x:
// N × in_features (the layer's input), W: out_features × in_features. grad_W, grad_b: the gradient
// (written, not added). dx = dy·W, times gelu′(pre) when pre is given, into dx (fp32), dx_bf16 or both.
// partials: Wgrad::tiles·slices·WG_BM·WG_BN floats, then (without the ones column) a bias sum of WG_BM
// floats per block; tickets: one per tile.
template <int P>
__device__ __forceinline__ void linear_backward(const typename OperandOf<P>::type* __restrict__ dy, int dy_ld,
                                                const typename OperandOf<P>::type* __restrict__ x,
                                                const typename OperandOf<P>::type* __restrict__ W, int N,
                                                int out_features, int in_features, int slices,
                                                float* __restrict__ grad_W, float* __restrict__ grad_b,
                                                float* __restrict__ partials, unsigned* __restrict__ tickets,
                                                float* __restrict__ dx, bf16* __restrict__ dx_bf16,
                                                const float* __restrict__ pre, float* smem) {
    using L = LinearTiles<P>;
    constexpr int WG_BM = L::WG_BM, WG_BN = L::WG_BN;
    const int O = out_features, K = in_features;
    using G = Wgrad<P>;
    const int tiles = G::tiles(O, K), columns = G::columns(K);
    int block = blockIdx.x;
    if (block < tiles * slices) {
        const int tile = block / slices, slice = block % slices;
        const int rows = ceil_div(N, slices), r0 = slice * rows, count = max(0, min(N, r0 + rows) - r0);
        const int m0 = tile / columns * WG_BM, n0 = tile % columns * WG_BN;
        float* mine = partials + (size_t)block * WG_BM * WG_BN;
        const auto store = [&](int o, int k, float g0, float g1, bool both) {
            store_pair(mine + (o - m0) * WG_BN + k - n0, g0, g1, both);
        };
        const auto dy_rows = dy + (size_t)r0 * dy_ld;
        const auto x_rows = x + (size_t)r0 * K;
        // The bias sums of a tile of the first column: one per (output o = m0 + t mod WG_BM, and each
        // thread's share of a chunk's rows), over the slice's rows; the shares added in order below.
        float* bias_partials = partials + (size_t)tiles * slices * WG_BM * WG_BN;
        if constexpr (G::ONES_COLUMN) {
            tile_product<P, WG_BM, WG_BN, L::BK, L::STAGES, true, false, true>(O, K + 1, count, m0, n0, dy_rows, dy_ld,
                                                                       x_rows, K, store, smem);
        } else {
            // The first column's bias sums: shares of the outputs' sums over the slice's rows, left by the
            // tile product in smem[share·WG_BM + o] (the tile ended with a barrier), added in share order.
            const auto add_bias_shares = [&](int shares) {
                __syncthreads();
                if (threadIdx.x < WG_BM) {
                    float b = 0.0f;
                    for (int s = 0; s < shares; ++s) b += smem[s * WG_BM + threadIdx.x];
                    bias_partials[((size_t)(m0 / WG_BM) * slices + slice) * WG_BM + threadIdx.x] = b;
                }
            };
            if constexpr (P == FP32) {
                // A thread stages outputs m0 + 4·(t mod 32) + i over share t/32 of each chunk's rows.
                float4 sums;
                tile_product<P, WG_BM, WG_BN, L::BK, L::STAGES, true, false>(O, K, count, m0, n0, dy_rows, dy_ld, x_rows,
                                                                     K, store, smem, n0 == 0 ? &sums : nullptr);
                if (n0 == 0) {
                    *reinterpret_cast<float4*>(smem + threadIdx.x / 32 * WG_BM + threadIdx.x % 32 * 4) = sums;
                    add_bias_shares(WARPS);
                }
            } else {
                constexpr int SHARES = THREADS / WG_BM;
                static_assert(THREADS % WG_BM == 0, "whole shares of a chunk's rows");
                float bias_sum = 0.0f;
                const auto sum_bias = [&](const auto& dy_chunk) {  // dy_chunk(o, row): a chunk of dyᵀ
                    if (n0 != 0) return;
                    for (int r = threadIdx.x / WG_BM; r < L::BK; r += SHARES)
                        bias_sum += bf16_value(dy_chunk(threadIdx.x % WG_BM, r));
                };
                tile_product<P, WG_BM, WG_BN, L::BK, L::STAGES, true, false>(O, K, count, m0, n0, dy_rows, dy_ld, x_rows,
                                                                     K, store, smem, sum_bias);
                if (n0 == 0) {
                    smem[threadIdx.x] = bias_sum;  // share t / WG_BM of output t mod WG_BM
                    add_bias_shares(SHARES);
                }
            }
        }
        if (!last_block_to_finish(&tickets[tile], slices)) return;
        const float* tile_partials = partials + (size_t)tile * slices * WG_BM * WG_BN;
        sum_partials<WG_BM * WG_BN>(tile_partials, WG_BM * WG_BN, slices, [&](int i, float g) {
            const int o = m0 + i / WG_BN, k = n0 + i % WG_BN;
            if (o >= O || k >= K + G::ONES_COLUMN) return;
            if (k < K) grad_W[(size_t)o * K + k] = g;
            else grad_b[o] = g;
        });
        if (!G::ONES_COLUMN && n0 == 0) {
            sum_partials<WG_BM>(bias_partials + (size_t)(m0 / WG_BM) * slices * WG_BM, WG_BM, slices,
                                [&](int i, float g) {
                                    if (m0 + i < O) grad_b[m0 + i] = g;
                                });
        }
        if (threadIdx.x == 0) tickets[tile] = 0;
        return;
    }
    block -= tiles * slices;
    const int dx_columns = ceil_div(K, L::BN);
    const int m0 = block / dx_columns * L::BM, n0 = block % dx_columns * L::BN;
    if constexpr (P == BF16) {
        gemm_tile_bf16_by_rows<false, false>(N, K, O, m0, n0, dy, dy_ld, W, K, smem,
                                             dx_epilogue_by_rows(dx, dx_bf16, pre, K));
    } else {
        const auto store = dx_epilogue(dx, dx_bf16, pre, K);
        tile_product<P, L::BM, L::BN, L::BK, L::STAGES, false, false>(N, K, O, m0, n0, dy, dy_ld, W, K, store, smem);
    }
}

// fp32 on gemm_128. Two blocks an SM (128 registers a thread, no spills).
extern "C" __global__ void __launch_bounds__(THREADS, 2)
tf_linear_backward(const float* __restrict__ dy, const float* __restrict__ x, const float* __restrict__ W, int N,
                   int out_features, int in_features, int slices, float* __restrict__ grad_W, float* __restrict__ grad_b,
                   float* __restrict__ partials, unsigned* __restrict__ tickets, float* __restrict__ dx,
                   const float* __restrict__ pre) {
    extern __shared__ float smem[];
    linear_backward<FP32>(dy, out_features, x, W, N, out_features, in_features, slices, grad_W, grad_b, partials,
                          tickets, dx, nullptr, pre, smem);
}

// On the small tiles: fp32, or TF32 on the tensor cores when `tf32`.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_linear_backward_small(const float* __restrict__ dy, const float* __restrict__ x, const float* __restrict__ W, int N,
                         int out_features, int in_features, int slices, float* __restrict__ grad_W,
                         float* __restrict__ grad_b, float* __restrict__ partials, unsigned* __restrict__ tickets,
                         float* __restrict__ dx, const float* __restrict__ pre, int tf32) {
    extern __shared__ float smem[];
    if (tf32)
        linear_backward<TF32>(dy, out_features, x, W, N, out_features, in_features, slices, grad_W, grad_b, partials,
                              tickets, dx, nullptr, pre, smem);
    else
        linear_backward<FP32_SMALL>(dy, out_features, x, W, N, out_features, in_features, slices, grad_W, grad_b,
                                    partials, tickets, dx, nullptr, pre, smem);
}

// The bf16 copies of dy (row stride dy_ld), x and W. Two blocks an SM, as the tiles' shared memory
// allows: unbounded, the compiler took 229 registers a thread (the last block's sum of partial tiles), which
// left room for one.
extern "C" __global__ void __launch_bounds__(THREADS, 2)
tf_linear_backward_bf16(const bf16* __restrict__ dy, int dy_ld, const bf16* __restrict__ x, const bf16* __restrict__ W,
                        int N, int out_features, int in_features, int slices, float* __restrict__ grad_W,
                        float* __restrict__ grad_b, float* __restrict__ partials, unsigned* __restrict__ tickets,
                        float* __restrict__ dx, bf16* __restrict__ dx_bf16, const float* __restrict__ pre) {
    extern __shared__ __align__(16) float smem[];
    linear_backward<BF16>(dy, dy_ld, x, W, N, out_features, in_features, slices, grad_W, grad_b, partials, tickets, dx,
                          dx_bf16, pre, smem);
}

// The bf16 forward products on Hopper's TMA pipeline (gemm_tma.cuh: persistent blocks of 384 threads, grid
// min(tiles, SMs)), out = in·Wᵀ + bias (GELU with `pre`) with tf_linear_forward_bf16's epilogue by rows
// (each consumer's rows staged after the stages, TmaByRows, which leaves room for TF_TMA_STAGES stages of
// 128×128): A = in (N × in_features), B = W stored out_features × in_features (K-contiguous). Launched
// where the GPU has `wgmma` and TMA can copy the operands (leading dimensions multiples of 8), unless
// TEXTNET_TMA=0 (src/transformer/gpu/mod.rs `TMA_TILE` says why this tile); elsewhere it compiles to
// nothing. maps: the operands' tensor maps, encoded once per buffer by the launch layer.
// (The dx products stay in tf_linear_backward_bf16, whose dx tiles run beside its weight gradient's.)
constexpr int TF_TMA_STAGES = 4;
#define TF_LINEAR_TMA(BM, BN)                                                                                  \
    extern "C" __global__ void __launch_bounds__(GemmTma<BM, BN, TF_TMA_STAGES>::BLOCK_THREADS, 1)             \
        tf_linear_forward_tma_##BM##x##BN(const __grid_constant__ TmaOperands maps, const float* __restrict__ bias, \
                                          float* __restrict__ out, bf16* __restrict__ out_bf16,               \
                                          float* __restrict__ pre, int N, int out_features, int in_features) { \
        extern __shared__ __align__(16) char tma_smem[];                                                       \
        gemm_bf16_tma_tiles_by_rows<GemmTma<BM, BN, TF_TMA_STAGES>, false, true>(                              \
            maps, N, out_features, in_features, forward_epilogue_by_rows(bias, out, out_bf16, pre, out_features), \
            tma_smem);                                                                                         \
    }
TF_LINEAR_TMA(128, 128)

// Grid ceil(N / (WARPS·rows_per_warp)). dres (+)= LayerNorm′ᵀ·dout for each row (x the LayerNorm's
// input); dw, db = Σ_rows, from per-block partials (2C floats per block) added in block order by the last.
// With d_branch_bf16, the residual branch before this LayerNorm gets its gradient there in bf16 (the
// operand of its projection's backward product): dropout's mask of that branch's site ⊙ the new dres.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_layernorm_backward(const DropoutArgs dropout,
                      const float* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd,
                      const float* __restrict__ w, const float* __restrict__ dout, float* __restrict__ dres, int accumulate,
                      int N, float* __restrict__ grad_w, float* __restrict__ grad_b, float* __restrict__ partials,
                      unsigned* __restrict__ ticket, bf16* __restrict__ d_branch_bf16, int rows_per_warp) {
    __shared__ float warp_sums[WARPS][2 * C];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const SiteDropout drop(dropout);
    float dw[PER_LANE] = {}, db[PER_LANE] = {};
    const int first = (blockIdx.x * WARPS + warp) * rows_per_warp;
    for (int row = first; row < min(N, first + rows_per_warp); ++row) {
        const size_t at = (size_t)row * C;
        layernorm_row_backward<C>(x + at, mean[row], rstd[row], w, dout + at, dres + at, accumulate != 0, dw, db);
        if (d_branch_bf16) {
#pragma unroll
            for (int i = 0; i < PER_LANE; ++i) {
                const size_t e = at + i * 32 + lane;  // written by this lane just now
                d_branch_bf16[e] = to_bf16(dres[e] * drop.factor(e));
            }
        }
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
        warp_sums[warp][i * 32 + lane] = dw[i];
        warp_sums[warp][C + i * 32 + lane] = db[i];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < 2 * C; c += THREADS) {
        float s = 0.0f;
        for (int k = 0; k < WARPS; ++k) s += warp_sums[k][c];
        partials[(size_t)blockIdx.x * 2 * C + c] = s;
    }
    if (!last_block_to_finish(ticket)) return;
    sum_partials<2 * C>(partials, 2 * C, gridDim.x, [&](int c, float s) {
        if (c < C) grad_w[c] = s;
        else grad_b[c - C] = s;
    });
    if (threadIdx.x == 0) *ticket = 0;
}

// Grid B·heads·CHUNKS (AttentionSizes): block (b, h, key chunk). dq_part: CHUNKS·N·C floats; tickets: one
// per (b, h).
extern "C" __global__ void __launch_bounds__(THREADS)
tf_attention_backward(const DropoutArgs dropout,
                      const float* __restrict__ qkv, const float* __restrict__ y, const float* __restrict__ dy,
                      const float* __restrict__ lse, float* __restrict__ dqkv, int heads, int N,
                      float* __restrict__ dq_part, unsigned* __restrict__ tickets) {
    extern __shared__ float smem[];
    constexpr int CHUNKS = AttentionSizes<T, HS>::CHUNKS;
    const int chunk = blockIdx.x % CHUNKS, bh = blockIdx.x / CHUNKS, b = bh / heads, h = bh % heads;
    const size_t rows = (size_t)b * T, part_stride = (size_t)N * C;
    float* part = dq_part + ((size_t)bh * T) * HS;  // [chunk][B·heads][T][HS] as N·C floats per chunk
    const SiteDropout drop(dropout);
    attention_backward_keys<T, HS>(qkv + rows * 3 * C, y + rows * C, dy + rows * C, lse + (size_t)bh * T, C, h, T, chunk,
                                   dqkv + rows * 3 * C, part + chunk * part_stride, smem, drop.key, drop.threshold,
                                   drop.scale, (unsigned)bh * T * T);
    if (!last_block_to_finish(&tickets[bh], CHUNKS)) return;
    attention_backward_dq<T, HS>(part, part_stride, C, h, T, dqkv + rows * 3 * C);
    if (threadIdx.x == 0) tickets[bh] = 0;
}

// Rows of a step per slice of tf_embedding_backward's token sums.
constexpr int EMB_SLICE_ROWS = 512;

// Grid (V + T, ceil(N / EMB_SLICE_ROWS)). Block (v < V, s) sums the rows of slice s whose token is v,
// each row's gradient through the embedding dropout's mask, into its partial (partials: V × slices × C
// floats); the last of v's slices to finish adds the partials in slice order into grad_tok[v], then, with a
// tied head, its share head_grad[v] (the head's weight gradient). Block (V + t, 0) sums position t's rows
// t, t + T, … in row order into grad_pos[t] (its other slices have nothing to do). tickets: one per token.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_embedding_backward(const DropoutArgs dropout, const float* __restrict__ dres, const unsigned* __restrict__ data,
                      const unsigned* __restrict__ offsets, int N, int V, float* __restrict__ grad_tok,
                      float* __restrict__ grad_pos, const float* __restrict__ head_grad,
                      float* __restrict__ partials, unsigned* __restrict__ tickets) {
    const SiteDropout drop(dropout);
    const int slice = blockIdx.y, slices = gridDim.y;
    if ((int)blockIdx.x >= V) {
        if (slice != 0) return;
        const int t = blockIdx.x - V;
        for (int c = threadIdx.x; c < C; c += THREADS) {
            float s = 0.0f;
            for (int r = t; r < N; r += T) s += dres[(size_t)r * C + c] * drop.factor((size_t)r * C + c);
            grad_pos[(size_t)t * C + c] = s;
        }
        return;
    }
    const int v = blockIdx.x, r0 = slice * EMB_SLICE_ROWS, r1 = min(N, r0 + EMB_SLICE_ROWS);
    __shared__ int rows[EMB_SLICE_ROWS];
    __shared__ int count;
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    // The slice's rows of token v, in row order: each warp's matches placed by a ballot, the warps' runs
    // one after another.
    for (int base = r0; base < r1; base += THREADS) {
        const int r = base + threadIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const bool mine = r < r1 && token_at(data, offsets, r, 0) == (unsigned)v;
        const unsigned ballot = __ballot_sync(0xffffffffu, mine);
        __shared__ int warp_counts[WARPS];
        if (lane == 0) warp_counts[warp] = __popc(ballot);
        __syncthreads();
        int at = count;
        for (int w = 0; w < warp; ++w) at += warp_counts[w];
        if (mine) rows[at + __popc(ballot & ((1u << lane) - 1))] = r;
        __syncthreads();
        if (threadIdx.x == 0)
            for (int w = 0; w < WARPS; ++w) count += warp_counts[w];
        __syncthreads();
    }
    float* mine = partials + ((size_t)v * slices + slice) * C;
    for (int c = threadIdx.x; c < C; c += THREADS) {
        float s = 0.0f;
        for (int i = 0; i < count; ++i) {
            const size_t e = (size_t)rows[i] * C + c;
            s += dres[e] * drop.factor(e);
        }
        mine[c] = s;
    }
    if (!last_block_to_finish(&tickets[v], slices)) return;
    for (int c = threadIdx.x; c < C; c += THREADS) {
        float s = 0.0f;
        for (int k = 0; k < slices; ++k) s += __ldcg(&partials[((size_t)v * slices + k) * C + c]);
        if (head_grad) s += head_grad[(size_t)v * C + c];
        grad_tok[(size_t)v * C + c] = s;
    }
    if (threadIdx.x == 0) tickets[v] = 0;
}

// Clipping's factor min(1, clip / ‖g‖₂) from ‖g‖₂² (clip 0: off).
__device__ __forceinline__ float clip_factor(double sum_sq, float clip) {
    const float norm = (float)sqrt(sum_sq);
    return clip > 0.0f && norm > clip ? clip / norm : 1.0f;
}

// Grid G (the host's choice, fixed for a run): clipping's factor min(1, clip / ‖grad‖₂) into *grad_scale,
// and ‖grad‖₂² into *sum_sq when not null. Block k sums the squares of its contiguous share of the n
// elements (each thread a strided run, then a fixed tree) into partials[k] in double; the last block adds
// the G partials in a fixed tree.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_grad_norm(const float* __restrict__ grad, int n, float clip, double* __restrict__ partials,
             unsigned* __restrict__ ticket, float* __restrict__ grad_scale, double* __restrict__ sum_sq) {
    __shared__ double sums[THREADS];
    const int per = ceil_div(n, (int)gridDim.x), begin = blockIdx.x * per, end = min(n, begin + per);
    double s = 0.0;
    for (int i = begin + threadIdx.x; i < end; i += THREADS) s += (double)grad[i] * grad[i];
    sums[threadIdx.x] = s;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
    if (!last_block_to_finish(ticket)) return;
    s = 0.0;
    for (unsigned k = threadIdx.x; k < gridDim.x; k += THREADS) s += __ldcg(&partials[k]);
    sums[threadIdx.x] = s;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) sums[threadIdx.x] += sums[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        *grad_scale = clip_factor(sums[0], clip);
        if (sum_sq) *sum_sq = sums[0];
        *ticket = 0;
    }
}

// One thread: clipping's factor into *grad_scale from ‖grad‖₂², the sum of every ZeRO-1 rank's
// tf_grad_norm over its shard.
extern "C" __global__ void tf_clip_scale(const double* __restrict__ sum_sq, float clip, float* __restrict__ grad_scale) {
    *grad_scale = clip_factor(sum_sq[0], clip);
}

// Grid any: AdamW over all n parameters at rate *lr, the gradient times *grad_scale (clipping's factor;
// null: 1), and the new parameters rounded to bf16 into params_bf16 (when not null); the step count
// (Adam's t) advanced by the last block.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_adamw(float* __restrict__ params, const float* __restrict__ grad, float* __restrict__ m, float* __restrict__ v, int n,
         const float* __restrict__ lr, float beta1, float beta2, float eps, float weight_decay,
         const float* __restrict__ grad_scale, unsigned* __restrict__ step, unsigned* __restrict__ ticket,
         bf16* __restrict__ params_bf16) {
    OptimStep s{OPTIM_ADAMW, *lr, 0.0f, beta1, beta2, eps, weight_decay, grad_scale ? *grad_scale : 1.0f, 1.0f, 1.0f};
    const unsigned t = *step + 1;
    optim_bias_corrections(s, t);
    optim_update_range(s, params, grad, m, v, blockIdx.x * THREADS + threadIdx.x, n, gridDim.x * THREADS, params_bf16);
    if (!last_block_to_finish(ticket)) return;
    if (threadIdx.x == 0) {
        *step = t;
        *ticket = 0;
    }
}

// Grid any: out = x rounded to bf16, over n elements (the parameters' bf16 copy, before AdamW keeps it).
extern "C" __global__ void __launch_bounds__(THREADS)
tf_round_bf16(const float* __restrict__ x, bf16* __restrict__ out, int n) {
    for (int i = blockIdx.x * THREADS + threadIdx.x; i < n; i += gridDim.x * THREADS) out[i] = to_bf16(x[i]);
}

// Grid any: over n elements, sum = g when `first`, else sum += g. A step of k micro-batches (--grad-accum)
// keeps the sum of the first k − 1 micro-batches' gradients in its own buffer and adds it into the last's,
// so the step's gradient is ((g0 + g1) + g2) + … whatever k is, and no micro-batch's kernels change.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_accumulate(float* __restrict__ sum, const float* __restrict__ g, int n, int first) {
    for (int i = blockIdx.x * THREADS + threadIdx.x; i < n; i += gridDim.x * THREADS) sum[i] = first ? g[i] : sum[i] + g[i];
}

// bf16 attention on the tensor cores (flash_attention.cuh), for --precision bf16; the launch layer:
// src/transformer/gpu/flash.rs. Grid (B·heads, FlashSizes<T, HS>::BLOCKS), FORWARD_BYTES of dynamic shared
// memory: block (b·heads + h, i) takes query block BLOCKS − 1 − i (the longest first) of sequence b's rows
// [b·T, b·T + len). Dropout on the probabilities as tf_attention_forward's (threshold 0: off). Two blocks
// per SM (128 registers a thread, a few spilled): 12% faster at nanoGPT's shape than one block of 166.
extern "C" __global__ void __launch_bounds__(THREADS, 2)
tf_flash_attention_forward(const DropoutArgs dropout,
                           const float* __restrict__ qkv, float* __restrict__ y, bf16* __restrict__ y_bf16,
                           float* __restrict__ lse, int heads, int len) {
    using S = FlashSizes<T, HS>;
    extern __shared__ __align__(16) float flash_smem[];
    if constexpr (S::SUPPORTED) {
        const int bh = blockIdx.x, b = bh / heads, h = bh % heads;
        const SiteDropout drop(dropout);
        flash_attention_forward<T, HS>(qkv + (size_t)b * T * 3 * C, C, h, bh, S::BLOCKS - 1 - blockIdx.y, len,
                                       y + (size_t)b * T * C, offset_or_null(y_bf16, (size_t)b * T * C),
                                       lse + (size_t)bh * T, drop.key, drop.threshold, drop.scale, flash_smem);
    } else {
        __trap();  // the launch layer refuses head sizes that are not a multiple of 16
    }
}

// Grid (B·heads, 2·FlashSizes<T, HS>::BLOCKS), BACKWARD_BYTES of dynamic shared memory: block
// (b·heads + h, i) writes dk, dv of key block i / 2 when i is even, dq of query block BLOCKS − 1 − i / 2
// when odd (the longest of each kind first), from dy (stride C), y and lse of the forward pass.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_flash_attention_backward(const DropoutArgs dropout,
                            const float* __restrict__ qkv, const float* __restrict__ y, const float* __restrict__ dy,
                            const float* __restrict__ lse, float* __restrict__ dqkv, bf16* __restrict__ dqkv_bf16,
                            int heads, int len) {
    using S = FlashSizes<T, HS>;
    extern __shared__ __align__(16) float flash_smem[];
    if constexpr (S::SUPPORTED) {
        const int bh = blockIdx.x, b = bh / heads, h = bh % heads, i = blockIdx.y;
        const size_t rows = (size_t)b * T;
        const SiteDropout drop(dropout);
        if (i % 2 == 0)
            flash_attention_backward_keys<T, HS>(qkv + rows * 3 * C, y + rows * C, dy + rows * C, lse + (size_t)bh * T,
                                                 C, h, bh, i / 2, len, offset_or_null(dqkv, rows * 3 * C),
                                                 offset_or_null(dqkv_bf16, rows * 3 * C), drop.key, drop.threshold,
                                                 drop.scale, flash_smem);
        else
            flash_attention_backward_queries<T, HS>(qkv + rows * 3 * C, y + rows * C, dy + rows * C,
                                                    lse + (size_t)bh * T, C, h, bh, S::BLOCKS - 1 - i / 2, len,
                                                    offset_or_null(dqkv, rows * 3 * C),
                                                    offset_or_null(dqkv_bf16, rows * 3 * C), drop.key, drop.threshold,
                                                    drop.scale, flash_smem);
    } else {
        __trap();
    }
}
