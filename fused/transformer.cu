// The character-level Transformer's training step (CPU twin: src/transformer/model.rs, src/ops/optim.rs):
//
//   x = tok_emb[token] + pos_emb[t]
//   per block:  x += proj(attention(LN1(x)));  x += mproj(gelu(fc(LN2(x))))
//   logits = head(LN_f(x)), mean softmax cross-entropy over the B·T positions
//
// as a chain of fused kernels over the N = B·T rows of a step, llm.c's layout: each op family is one
// kernel that does all of its work, with what follows it fused in where it is elementwise.
//
//   tf_embed_layernorm     x = tok_emb + pos_emb, then block 0's LN1 (a warp per row; layernorm.cuh)
//   tf_residual_layernorm  x = x + delta (the sublayer's output), then the next LayerNorm
//   tf_linear_forward      out = in·Wᵀ + b, and with `pre` the FFN's GELU in the epilogue (gemm.cuh; with
//                          `tf32` every product of the linear layers runs on the tensor cores)
//   tf_attention_forward   a block per (sequence, head), scores in shared memory (attention.cuh)
//   tf_classifier          softmax + cross-entropy over a row's V logits, leaving dlogits in place, and
//                          the step's loss summed over the rows in row order by the last block
//   tf_linear_backward     dW, db = Σ_rows dy·[x | 1] (each tile over row slices, the slices added in
//                          order by the tile's last block) and dx = dy·W (× GELU′ of `pre`), one launch
//   tf_layernorm_backward  dx added into the residual gradient; dw, db from per-block partials
//   tf_attention_backward  dq, dk, dv of a (sequence, head) a chunk of keys per block, p rebuilt from the
//                          saved log-sum-exp
//   tf_embedding_backward  tok_emb and pos_emb gradients, each element one thread's sum in row order
//   tf_adamw               every parameter in one launch (optim.cuh), the step count advanced once
//
// No float atomics anywhere: a run repeats to the bit. Row r of a step is position t = r % T of sequence
// b = r / T, whose tokens are data[offsets[b] + t] and targets data[offsets[b] + t + 1]; a CUDA graph of
// many steps bakes in each step's offsets pointer and loss slot.
//
// Sizes compiled in: TF_C (embedding, a multiple of 32), TF_HS (head size), TF_T (block, the longest
// sequence). THREADS (256) per block everywhere.
#include "common.cuh"
#include "gemm.cuh"
#include "activations.cuh"
#include "layernorm.cuh"
#include "attention.cuh"
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

// Linear layers through gemm_tile: forward and dx tiles 32 rows × 64 columns, weight-gradient tiles
// 32 × 32 over a slice of LIN_SLICE_ROWS rows.
constexpr int LIN_BM = 32, LIN_BN = 64, LIN_BK = 32, LIN_TM = 2, LIN_TN = 4;
constexpr int WG_BM = 32, WG_BN = 32, WG_BK = 32, WG_TM = 2, WG_TN = 2;
constexpr int LIN_SHARED_FLOATS = GemmTile<LIN_BM, LIN_BN, LIN_BK, LIN_TM, LIN_TN>::SHARED_FLOATS >
                                          GemmTile<WG_BM, WG_BN, WG_BK, WG_TM, WG_TN>::SHARED_FLOATS
                                      ? GemmTile<LIN_BM, LIN_BN, LIN_BK, LIN_TM, LIN_TN>::SHARED_FLOATS
                                      : GemmTile<WG_BM, WG_BN, WG_BK, WG_TM, WG_TN>::SHARED_FLOATS;
// LayerNorm backward: rows per warp (a block covers WARPS × LN_ROWS_PER_WARP rows).
constexpr int LN_ROWS_PER_WARP = 4;

__device__ __forceinline__ unsigned token_at(const unsigned* data, const unsigned* offsets, int row, int shift) {
    return data[offsets[row / T] + row % T + shift];
}

// Grid ceil(N / WARPS): a warp per row.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_embed_layernorm(const unsigned* __restrict__ data, const unsigned* __restrict__ offsets, int N,
                   const float* __restrict__ tok_emb, const float* __restrict__ pos_emb, float* __restrict__ x,
                   const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ out,
                   float* __restrict__ mean, float* __restrict__ rstd) {
    const int row = blockIdx.x * WARPS + threadIdx.x / 32;
    if (row >= N) return;
    const unsigned token = token_at(data, offsets, row, 0);
    layernorm_row_forward<C>(tok_emb + (size_t)token * C, pos_emb + (size_t)(row % T) * C, x + (size_t)row * C, w, b,
                             out + (size_t)row * C, mean + row, rstd + row);
}

// Grid ceil(N / WARPS): x_out = x_in + delta, out = LayerNorm(x_out).
extern "C" __global__ void __launch_bounds__(THREADS)
tf_residual_layernorm(const float* __restrict__ x_in, const float* __restrict__ delta, float* __restrict__ x_out, int N,
                      const float* __restrict__ w, const float* __restrict__ b, float* __restrict__ out,
                      float* __restrict__ mean, float* __restrict__ rstd) {
    const int row = blockIdx.x * WARPS + threadIdx.x / 32;
    if (row >= N) return;
    const size_t at = (size_t)row * C;
    layernorm_row_forward<C>(x_in + at, delta + at, x_out + at, w, b, out + at, mean + row, rstd + row);
}

// Grid (ceil(out_features / LIN_BN), ceil(N / LIN_BM)). out = in·Wᵀ + bias (W: out_features × in_features).
// With `pre`: pre = in·Wᵀ + bias and out = gelu(pre). tf32: the product on the tensor cores.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_linear_forward(const float* __restrict__ in, const float* __restrict__ W, const float* __restrict__ bias,
                  float* __restrict__ out, float* __restrict__ pre, int N, int out_features, int in_features, int tf32) {
    extern __shared__ float smem[];
    const int K = in_features, O = out_features;
    const auto a_at = [&](int m, int k) { return in[(size_t)m * K + k]; };
    const auto b_at = [&](int k, int n) { return W[(size_t)n * K + k]; };
    const auto store = [&](int m, int n, float z) {
        z += bias[n];
        if (pre) {
            pre[(size_t)m * O + n] = z;
            z = gelu(z);
        }
        out[(size_t)m * O + n] = z;
    };
    const int m0 = blockIdx.y * LIN_BM, n0 = blockIdx.x * LIN_BN;
    if (tf32) gemm_tile_tf32<LIN_BM, LIN_BN, LIN_BK, false, true>(N, O, K, m0, n0, a_at, b_at, store, smem);
    else gemm_tile<LIN_BM, LIN_BN, LIN_BK, LIN_TM, LIN_TN, false, true>(N, O, K, m0, n0, a_at, b_at, store, smem);
}

// Grid B·heads: block (b, h) over rows b·T … of the step.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_attention_forward(const float* __restrict__ qkv, float* __restrict__ y, float* __restrict__ lse, int heads) {
    extern __shared__ float smem[];
    const int b = blockIdx.x / heads, h = blockIdx.x % heads;
    attention_forward<T, HS>(qkv + (size_t)b * T * 3 * C, C, h, T, y + (size_t)b * T * C, lse + ((size_t)b * heads + h) * T,
                             smem);
}

// Grid ceil(N / WARPS): row r's loss −log softmax(logits_r)[target] into row_loss[r], logits_r ←
// (softmax − onehot)·scale. The last block adds the losses of rows [0, counted) in row order to
// *loss_sum (a padded evaluation batch counts its real windows only).
extern "C" __global__ void __launch_bounds__(THREADS)
tf_classifier(float* __restrict__ logits, const unsigned* __restrict__ data, const unsigned* __restrict__ offsets, int N,
              int V, float scale, float* __restrict__ row_loss, int counted, unsigned* __restrict__ ticket,
              double* __restrict__ loss_sum) {
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
        for (int v = lane; v < V; v += 32) z[v] = (expf(z[v] - max) * inv - (v == (int)target ? 1.0f : 0.0f)) * scale;
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

// The weight-gradient tiles: (out_features × (in_features + 1)) in WG tiles, each over `slices` slices of
// the N rows. Then ceil(in_features / LIN_BN) × ceil(N / LIN_BM) dx tiles (none when dx is null).
__device__ __forceinline__ int wgrad_tiles(int out_features, int in_features) {
    return ceil_div(out_features, WG_BM) * ceil_div(in_features + 1, WG_BN);
}

// Grid wgrad_tiles·slices + (dx ? dx tiles : 0). dy: N × out_features, x: N × in_features (the layer's
// input), W: out_features × in_features. grad_W, grad_b: the gradient (written, not added). dx = dy·W,
// times gelu′(pre) when pre is given; tf32: the products on the tensor cores. partials:
// wgrad_tiles·slices·WG_BM·WG_BN floats; tickets: one per tile.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_linear_backward(const float* __restrict__ dy, const float* __restrict__ x, const float* __restrict__ W, int N,
                   int out_features, int in_features, int slices, float* __restrict__ grad_W, float* __restrict__ grad_b,
                   float* __restrict__ partials, unsigned* __restrict__ tickets, float* __restrict__ dx,
                   const float* __restrict__ pre, int tf32) {
    extern __shared__ float smem[];
    const int O = out_features, K = in_features;
    const int tiles = wgrad_tiles(O, K), columns = ceil_div(K + 1, WG_BN);
    int block = blockIdx.x;
    if (block < tiles * slices) {
        const int tile = block / slices, slice = block % slices;
        const int rows = ceil_div(N, slices), r0 = slice * rows, count = max(0, min(N, r0 + rows) - r0);
        const int m0 = tile / columns * WG_BM, n0 = tile % columns * WG_BN;
        float* mine = partials + (size_t)block * WG_BM * WG_BN;
        const auto a_at = [&](int o, int r) { return dy[(size_t)(r0 + r) * O + o]; };
        const auto b_at = [&](int r, int k) { return k < K ? x[(size_t)(r0 + r) * K + k] : 1.0f; };
        const auto store = [&](int o, int k, float g) { mine[(o - m0) * WG_BN + k - n0] = g; };
        if (tf32) gemm_tile_tf32<WG_BM, WG_BN, WG_BK, true, false>(O, K + 1, count, m0, n0, a_at, b_at, store, smem);
        else gemm_tile<WG_BM, WG_BN, WG_BK, WG_TM, WG_TN, true, false>(O, K + 1, count, m0, n0, a_at, b_at, store, smem);
        if (!last_block_to_finish(&tickets[tile], slices)) return;
        for (int i = threadIdx.x; i < WG_BM * WG_BN; i += THREADS) {
            const int o = m0 + i / WG_BN, k = n0 + i % WG_BN;
            if (o >= O || k > K) continue;
            float g = 0.0f;
            for (int s = 0; s < slices; ++s) g += __ldcg(&partials[((size_t)tile * slices + s) * WG_BM * WG_BN + i]);
            if (k < K) grad_W[(size_t)o * K + k] = g;
            else grad_b[o] = g;
        }
        if (threadIdx.x == 0) tickets[tile] = 0;
        return;
    }
    block -= tiles * slices;
    const int dx_columns = ceil_div(K, LIN_BN);
    const int m0 = block / dx_columns * LIN_BM, n0 = block % dx_columns * LIN_BN;
    const auto a_at = [&](int m, int o) { return dy[(size_t)m * O + o]; };
    const auto b_at = [&](int o, int k) { return W[(size_t)o * K + k]; };
    const auto store = [&](int m, int k, float g) { dx[(size_t)m * K + k] = pre ? g * gelu_slope(pre[(size_t)m * K + k]) : g; };
    if (tf32) gemm_tile_tf32<LIN_BM, LIN_BN, LIN_BK, false, false>(N, K, O, m0, n0, a_at, b_at, store, smem);
    else gemm_tile<LIN_BM, LIN_BN, LIN_BK, LIN_TM, LIN_TN, false, false>(N, K, O, m0, n0, a_at, b_at, store, smem);
}

// Grid ceil(N / (WARPS·LN_ROWS_PER_WARP)). dres (+)= LayerNorm′ᵀ·dout for each row (x the LayerNorm's
// input); dw, db = Σ_rows, from per-block partials (2C floats per block) added in block order by the last.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_layernorm_backward(const float* __restrict__ x, const float* __restrict__ mean, const float* __restrict__ rstd,
                      const float* __restrict__ w, const float* __restrict__ dout, float* __restrict__ dres, int accumulate,
                      int N, float* __restrict__ grad_w, float* __restrict__ grad_b, float* __restrict__ partials,
                      unsigned* __restrict__ ticket) {
    __shared__ float warp_sums[WARPS][2 * C];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float dw[PER_LANE] = {}, db[PER_LANE] = {};
    const int first = (blockIdx.x * WARPS + warp) * LN_ROWS_PER_WARP;
    for (int row = first; row < min(N, first + LN_ROWS_PER_WARP); ++row) {
        const size_t at = (size_t)row * C;
        layernorm_row_backward<C>(x + at, mean[row], rstd[row], w, dout + at, dres + at, accumulate != 0, dw, db);
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
    for (int c = threadIdx.x; c < 2 * C; c += THREADS) {
        float s = 0.0f;
        for (unsigned k = 0; k < gridDim.x; ++k) s += __ldcg(&partials[(size_t)k * 2 * C + c]);
        if (c < C) grad_w[c] = s;
        else grad_b[c - C] = s;
    }
    if (threadIdx.x == 0) *ticket = 0;
}

// Grid B·heads·CHUNKS (AttentionSizes): block (b, h, key chunk). dq_part: CHUNKS·N·C floats; tickets: one
// per (b, h).
extern "C" __global__ void __launch_bounds__(THREADS)
tf_attention_backward(const float* __restrict__ qkv, const float* __restrict__ y, const float* __restrict__ dy,
                      const float* __restrict__ lse, float* __restrict__ dqkv, int heads, int N,
                      float* __restrict__ dq_part, unsigned* __restrict__ tickets) {
    extern __shared__ float smem[];
    constexpr int CHUNKS = AttentionSizes<T, HS>::CHUNKS;
    const int chunk = blockIdx.x % CHUNKS, bh = blockIdx.x / CHUNKS, b = bh / heads, h = bh % heads;
    const size_t rows = (size_t)b * T, part_stride = (size_t)N * C;
    float* part = dq_part + ((size_t)bh * T) * HS;  // [chunk][B·heads][T][HS] as N·C floats per chunk
    attention_backward_keys<T, HS>(qkv + rows * 3 * C, y + rows * C, dy + rows * C, lse + (size_t)bh * T, C, h, T, chunk,
                                   dqkv + rows * 3 * C, part + chunk * part_stride, smem);
    if (!last_block_to_finish(&tickets[bh], CHUNKS)) return;
    attention_backward_dq<T, HS>(part, part_stride, C, h, T, dqkv + rows * 3 * C);
    if (threadIdx.x == 0) tickets[bh] = 0;
}

// Grid V + T: block v < V sums the rows whose token is v into grad_tok[v]; block V + t sums position t's
// rows into grad_pos[t]. THREADS / C (at least 1) row groups per column, added in group order. Dynamic
// shared memory: the step's N tokens.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_embedding_backward(const float* __restrict__ dres, const unsigned* __restrict__ data,
                      const unsigned* __restrict__ offsets, int N, int V, float* __restrict__ grad_tok,
                      float* __restrict__ grad_pos) {
    constexpr int GROUPS = THREADS / C > 0 ? THREADS / C : 1;
    __shared__ float group_sums[GROUPS][C];
    extern __shared__ unsigned tokens[];
    for (int r = threadIdx.x; r < N; r += THREADS) tokens[r] = token_at(data, offsets, r, 0);
    __syncthreads();
    const bool token_row = (int)blockIdx.x < V;
    const int which = token_row ? blockIdx.x : blockIdx.x - V;
    const int group = THREADS >= C ? threadIdx.x / C : 0;
    const int per = ceil_div(N, GROUPS), r0 = group * per, r1 = min(N, r0 + per);
    if (group < GROUPS) {
        for (int c = THREADS >= C ? threadIdx.x % C : threadIdx.x; c < C; c += THREADS >= C ? C : THREADS) {
            float s = 0.0f;
            for (int r = r0; r < r1; ++r) {
                const bool mine = token_row ? tokens[r] == (unsigned)which : r % T == which;
                if (mine) s += dres[(size_t)r * C + c];
            }
            group_sums[group][c] = s;
        }
    }
    __syncthreads();
    float* out = token_row ? grad_tok + (size_t)which * C : grad_pos + (size_t)which * C;
    for (int c = threadIdx.x; c < C; c += THREADS) {
        float s = 0.0f;
        for (int g = 0; g < GROUPS; ++g) s += group_sums[g][c];
        out[c] = s;
    }
}

// Grid any: AdamW over all n parameters; the step count (Adam's t) advanced by the last block.
extern "C" __global__ void __launch_bounds__(THREADS)
tf_adamw(float* __restrict__ params, const float* __restrict__ grad, float* __restrict__ m, float* __restrict__ v, int n,
         float lr, float beta1, float beta2, float eps, float weight_decay, unsigned* __restrict__ step,
         unsigned* __restrict__ ticket) {
    OptimStep s{OPTIM_ADAMW, lr, 0.0f, beta1, beta2, eps, weight_decay, 1.0f, 1.0f, 1.0f};
    const unsigned t = *step + 1;
    optim_bias_corrections(s, t);
    optim_update_range(s, params, grad, m, v, blockIdx.x * THREADS + threadIdx.x, n, gridDim.x * THREADS);
    if (!last_block_to_finish(ticket)) return;
    if (threadIdx.x == 0) {
        *step = t;
        *ticket = 0;
    }
}
