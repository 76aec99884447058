// The kernels of `textnet fit`: a model the user writes (`--layers`), compiled per layer for its shapes.
// CPU twin: src/nn/stack/model.rs; launch layer: src/nn/stack/gpu.rs.
//
// The launch layer cuts the spec into layer groups and compiles this file once per distinct group,
// FIT_OP choosing which family of kernels and the other -D defines giving the group's fixed sizes, so
// every loop bound and index below is a compile-time constant (what torch.compile does for a PyTorch
// model, here done by NVRTC at run time and cached by content hash):
//
//   FIT_OP 1  dense   Linear(IN, OUT) [+ activation ACT] [+ Dropout]: forward with bias, activation and
//                     dropout in the gemm epilogue; backward as one grid of [∂W | ∂b] tiles and ∂x tiles,
//                     both reading dz = dy·mask·act′(z) on the fly from the operand functors. A plain last
//                     Linear of ≤ 64 outputs also forms the loss, ∂y and ∂x in its forward (FIT_LOSS).
//   FIT_OP 2  conv    Conv2d [+ activation]: forward one thread per output; ∂W and ∂b per run of samples
//                     and channel, then summed over the runs; ∂x one thread per input (a gather).
//   FIT_OP 3  pool    MaxPool2d(K): forward keeps each window's winner; backward hands each input its
//                     window's gradient when it was the winner.
//   FIT_OP 4  pointwise  an activation or Dropout not fused into a layer before it.
//   FIT_OP 5  loss    softmax cross-entropy or squared error over the outputs, one warp per sample, where it
//                     does not fuse into the last layer.
//   FIT_OP 6  update  the optimizer over the flat parameter vector (optim.cuh), clipped by the Σg² partials
//                     the backward grids wrote, at the learning rate the step's schedule entry gives.
//   FIT_OP 7  whole epoch  a chain of up to four Linear layers small enough for a warp's registers: every
//                     step of an epoch in one block (`dense_train_epoch`), in place of families 1, 5 and 6.
//   FIT_OP 8  generic dense  family 1's kernels with the sizes as their first argument (DenseDims), one
//                     module for every dense group, built into the binary: what a new spec trains on while
//                     its own modules compile, to the same bits.
//
// No float atomics: every gradient element and every per-sample loss is written by one thread in a fixed
// order, so a run repeats to the bit. Dropout's mask is the hash of dropout.cuh (one site per layer); the
// step count it mixes in lives on the device (the update advances it), so a CUDA graph of an epoch
// replays unchanged. Training batches gather their rows through `rows` (the epoch's order); evaluation
// passes rows = nullptr and reads the split in order.
#ifndef FIT_OP
#define FIT_OP 6  // the update, the one family without sizes
#endif
#include "activations.cuh"
#include "common.cuh"
#include "dropout.cuh"
#include "gemm.cuh"
#include "optim.cuh"

// Activation codes of the group (ACT_RELU, ACT_SIGMOID, ACT_TANH from activations.cuh).
constexpr int ACT_NONE = -1, ACT_GELU = 3;

__device__ __forceinline__ float fit_activate(int act, float z) {
    if (act == ACT_NONE) return z;
    if (act == ACT_GELU) return gelu(z);
    return activate(act, z);
}

// act′(z), from z alone (as the CPU twin's `slope`, with a = act(z) recomputed).
__device__ __forceinline__ float fit_slope(int act, float z) {
    if (act == ACT_NONE) return 1.0f;
    if (act == ACT_GELU) return gelu_slope(z);
    if (act == ACT_RELU) return z > 0.0f ? 1.0f : 0.0f;
    return activation_slope(act, activate(act, z));
}

// Row s of a batch: rows[s] when gathering a shuffled batch, s otherwise.
__device__ __forceinline__ size_t row_of(const unsigned* rows, int s) { return rows ? rows[s] : (size_t)s; }

// Σg² of one block's gradient elements into partials[blockIdx.x] (clipping's norm, summed by the update).
__device__ __forceinline__ void write_norm_partial(float sq, float* partials) {
    __shared__ float scratch[WARPS];
    sq = block_sum(sq, scratch);
    if (partials && threadIdx.x == 0) partials[blockIdx.x] = sq;
}

// One warp: the loss of one sample from its OUT outputs `out` (LOSS 0: cross-entropy against class
// `cls`; 1: the mean over the outputs of (out − target)²) into *loss (lane 0) and, unless dy is null,
// ∂(mean batch loss)/∂out into dy[0..OUT). OUT and LOSS are constants where the caller's are.
__device__ __forceinline__ void warp_sample_loss(int OUT, int LOSS, const float* out, unsigned cls,
                                                 const float* target, int B, float* loss, float* dy) {
    const int lane = threadIdx.x % 32;
    if (LOSS == 0) {
        float m = NEG_INF;
        for (int j = lane; j < OUT; j += 32) m = fmaxf(m, out[j]);
        m = warp_max(m);
        float sum = 0.0f;
        for (int j = lane; j < OUT; j += 32) sum += expf(out[j] - m);
        sum = warp_sum(sum);
        if (dy)
            for (int j = lane; j < OUT; j += 32) dy[j] = (expf(out[j] - m) / sum - (j == (int)cls ? 1.0f : 0.0f)) / B;
        if (lane == 0) *loss = m + logf(sum) - out[cls];
    } else {
        float sq = 0.0f;
        for (int j = lane; j < OUT; j += 32) {
            const float err = out[j] - target[j];
            sq += err * err;
            if (dy) dy[j] = 2.0f / ((float)B * OUT) * err;
        }
        sq = warp_sum(sq);
        if (lane == 0) *loss = sq * (1.0f / OUT);
    }
}

#if FIT_OP == 1 || FIT_OP == 8
// ---- dense: y = drop(act(x·Wᵀ + b)), x: B×IN, W: OUT×IN ----
// Forward tile: 8 samples × 8 outputs, K staged up to FWD_BK at a time. Backward tiles: 16 × 64, 64 deep.
// The loss-fused forward's: LOSS_BM samples × every output, K staged up to LOSS_BK at a time.
constexpr int FWD_BM = 8, FWD_BN = 8, FWD_BK = 256, FWD_TM = 2, FWD_TN = 2;
constexpr int BWD_BM = 16, BWD_BN = 64, BWD_BK = 64, BWD_TM = 4, BWD_TN = 4;
constexpr int LOSS_BK = 128;
// The loss-fused forward's tile width for OUT outputs, and its register tile's.
constexpr int loss_bn(int out) { return out <= 8 ? 8 : out <= 16 ? 16 : out <= 32 ? 32 : 64; }
constexpr int loss_tn(int bn) { return bn == 64 ? 2 : 1; }
// The group's sizes. FIT_OP 1 fixes them at compile time, so every loop bound is a constant; FIT_OP 8, the
// generic family, takes them as the kernels' first argument, so one module (compiled into the binary)
// serves every dense group: a new spec trains on it at once while its own module compiles, and the
// launch layer swaps that in between epochs. Both sum in the same order, to the bit: gemm_tile's KSPLIT
// groups take k ≡ g (mod KSPLIT) in increasing order for any depth staged at once that KSPLIT divides,
// and the generic depths (256, 128) are the fixed ones' for wide layers.
#if FIT_OP == 1
#ifndef FIT_LOSS
#define FIT_LOSS -1  // no loss fused
#endif
struct DenseDims {
    static constexpr int inputs = FIT_IN, outputs = FIT_OUT, act = FIT_ACT, bias = FIT_BIAS, drop = FIT_DROP;
    static constexpr int loss = FIT_LOSS;
    static constexpr int forward_depth = FIT_IN < FWD_BK ? FIT_IN : FWD_BK;
    static constexpr int loss_depth = FIT_IN < LOSS_BK ? FIT_IN : LOSS_BK;
};
#define DENSE_DIMS_ARG                            // the sizes are the defines
#define DENSE_DIMS_LOCAL constexpr DenseDims d{};
#else
struct DenseDims {
    int inputs, outputs, act, bias, drop, loss;  // loss: the fused loss's code (FIT_LOSS), or -1
    static constexpr int forward_depth = FWD_BK, loss_depth = LOSS_BK;
};
#define DENSE_DIMS_ARG const DenseDims d,
#define DENSE_DIMS_LOCAL
#endif

// [∂W | ∂b]'s columns.
__device__ __forceinline__ int weight_columns(const DenseDims& d) { return d.bias ? d.inputs + 1 : d.inputs; }

// Grid: (⌈OUT/FWD_BN⌉, ⌈B/FWD_BM⌉). z (pre-activation) is written when ACT != ACT_NONE.
// threshold 0 and scale 1 turn dropout off (evaluation).
extern "C" __global__ void __launch_bounds__(THREADS)
dense_forward(DENSE_DIMS_ARG const float* __restrict__ x, const unsigned* __restrict__ rows, int B,
              const float* __restrict__ W, const float* __restrict__ bias, float* __restrict__ z,
              float* __restrict__ y, unsigned layer_seed, const unsigned* __restrict__ step, unsigned threshold,
              float scale) {
    DENSE_DIMS_LOCAL
    extern __shared__ float smem[];
    const unsigned key = d.drop ? dropout_key(layer_seed, step) : 0u;
    gemm_tile<FWD_BM, FWD_BN, DenseDims::forward_depth, FWD_TM, FWD_TN, false, true>(
        B, d.outputs, d.inputs, blockIdx.y * FWD_BM, blockIdx.x * FWD_BN,
        [&](int s, int k) { return x[row_of(rows, s) * d.inputs + k]; },
        [&](int k, int o) { return W[(size_t)o * d.inputs + k]; },
        [&](int s, int o, float acc) {
            const size_t e = (size_t)s * d.outputs + o;
            const float pre = d.bias ? acc + bias[o] : acc;
            if (d.act != ACT_NONE) z[e] = pre;
            float v = fit_activate(d.act, pre);
            if (d.drop) v *= dropout_factor(key, (unsigned)e, threshold, scale);
            y[e] = v;
        },
        smem);
}

// dz = dy · dropout factor · act′(z) of element (s, o).
struct DenseDz {
    DenseDims d;
    const float* dy;
    const float* z;
    unsigned key, threshold;
    float scale;
    __device__ __forceinline__ float operator()(int s, int o) const {
        const size_t e = (size_t)s * d.outputs + o;
        float g = dy[e];
        if (d.drop) g *= dropout_factor(key, (unsigned)e, threshold, scale);
        if (d.act != ACT_NONE) g *= fit_slope(d.act, z[e]);
        return g;
    }
};

// Grid: ⌈OUT/BWD_BM⌉·⌈(IN + bias)/BWD_BN⌉ blocks of [∂W | ∂b] = dzᵀ·[x | 1] (OUT × IN+1 over the batch),
// then, when dx is not null, ⌈B/BWD_BM⌉·⌈IN/BWD_BN⌉ blocks of ∂x = dz·W. Weight block b writes its Σg² to
// partials[b] (unless partials is null), so their number does not depend on the batch.
extern "C" __global__ void __launch_bounds__(THREADS)
dense_backward(DENSE_DIMS_ARG const float* __restrict__ x, const unsigned* __restrict__ rows, int B,
               const float* __restrict__ W, const float* __restrict__ z, const float* __restrict__ dy,
               float* __restrict__ gW, float* __restrict__ gb, float* __restrict__ dx, unsigned layer_seed,
               const unsigned* __restrict__ step, unsigned threshold, float scale, float* __restrict__ partials) {
    DENSE_DIMS_LOCAL
    extern __shared__ float smem[];
    const DenseDz dz{d, dy, z, d.drop ? dropout_key(layer_seed, step) : 0u, threshold, scale};
    const int columns = (weight_columns(d) + BWD_BN - 1) / BWD_BN;
    const int weight_tiles = (d.outputs + BWD_BM - 1) / BWD_BM * columns;
    if ((int)blockIdx.x < weight_tiles) {
        const int m0 = blockIdx.x / columns * BWD_BM, n0 = blockIdx.x % columns * BWD_BN;
        float sq = 0.0f;
        gemm_tile<BWD_BM, BWD_BN, BWD_BK, BWD_TM, BWD_TN, true, false>(
            d.outputs, weight_columns(d), B, m0, n0, [&](int o, int s) { return dz(s, o); },
            [&](int s, int k) { return k < d.inputs ? x[row_of(rows, s) * d.inputs + k] : 1.0f; },
            [&](int o, int k, float g) {
                if (k < d.inputs) gW[(size_t)o * d.inputs + k] = g;
                else gb[o] = g;
                sq += g * g;
            },
            smem);
        write_norm_partial(sq, partials);
    } else {
        const int tile = blockIdx.x - weight_tiles, input_columns = (d.inputs + BWD_BN - 1) / BWD_BN;
        const int m0 = tile / input_columns * BWD_BM, n0 = tile % input_columns * BWD_BN;
        gemm_tile<BWD_BM, BWD_BN, BWD_BK, BWD_TM, BWD_TN, false, false>(
            B, d.inputs, d.outputs, m0, n0, [&](int s, int o) { return dz(s, o); },
            [&](int o, int k) { return W[(size_t)o * d.inputs + k]; },
            [&](int s, int k, float g) { dx[(size_t)s * d.inputs + k] = g; }, smem);
    }
}

// ---- the last layer with the loss fused (LOSS 0 cross-entropy, 1 squared error; no activation or
// dropout after it, OUT ≤ 64): one block holds every output of LOSS_BM samples, so it forms their losses
// and ∂loss/∂y itself, and ∂x = ∂y·W for the layer before (the products are tiny: LOSS_BM·OUT·IN). The
// loss kernel and this layer's ∂x tiles drop out of the step. BN: loss_bn(OUT), TN: loss_tn(BN). ----
#if FIT_OP == 8 || FIT_LOSS >= 0
constexpr int LOSS_BM = 8;

// Grid: ⌈B/LOSS_BM⌉. x is gathered through x_rows, the targets through target_rows (the first layer reads
// both through the batch's order; a later one reads x in batch order). y: the outputs; loss[s]: each
// sample's loss; dy, dx: written unless null (evaluation passes both null; the first layer with
// parameters passes dx null).
template <int BN, int TN>
__device__ __forceinline__ void dense_forward_loss(const DenseDims d, const float* __restrict__ x,
                                                   const unsigned* __restrict__ x_rows,
                                                   const unsigned* __restrict__ target_rows, int B,
                                                   const float* __restrict__ W, const float* __restrict__ bias,
                                                   const unsigned* __restrict__ classes,
                                                   const float* __restrict__ values, float* __restrict__ y,
                                                   float* __restrict__ loss, float* __restrict__ dy,
                                                   float* __restrict__ dx) {
    extern __shared__ float loss_smem[];
    __shared__ float out[LOSS_BM][BN], grad[LOSS_BM][BN];
    const int m0 = blockIdx.x * LOSS_BM, bm = min(LOSS_BM, B - m0);
    gemm_tile<LOSS_BM, BN, DenseDims::loss_depth, 1, TN, false, true>(
        B, d.outputs, d.inputs, m0, 0, [&](int s, int k) { return x[row_of(x_rows, s) * d.inputs + k]; },
        [&](int k, int o) { return W[(size_t)o * d.inputs + k]; },
        [&](int s, int o, float acc) {
            const float v = d.bias ? acc + bias[o] : acc;
            out[s - m0][o] = v;
            y[(size_t)s * d.outputs + o] = v;
        },
        loss_smem);
    __syncthreads();
    const int warp = threadIdx.x / 32;
    if (warp < bm) {
        const size_t row = row_of(target_rows, m0 + warp);
        warp_sample_loss(d.outputs, d.loss, out[warp], d.loss == 0 ? classes[row] : 0u,
                         d.loss == 0 ? nullptr : values + row * d.outputs, B, loss + m0 + warp, grad[warp]);
    }
    if (!dy) return;
    __syncthreads();
    for (int i = threadIdx.x; i < bm * d.outputs; i += THREADS) dy[(size_t)m0 * d.outputs + i] = grad[i / d.outputs][i % d.outputs];
    if (dx)
        for (int i = threadIdx.x; i < bm * d.inputs; i += THREADS) {
            const int s = i / d.inputs, k = i % d.inputs;
            float acc = 0.0f;
#pragma unroll
            for (int o = 0; o < d.outputs; ++o) acc = fmaf(grad[s][o], W[(size_t)o * d.inputs + k], acc);
            dx[(size_t)(m0 + s) * d.inputs + k] = acc;
        }
}

#define DENSE_FORWARD_LOSS_PARAMS                                                                                 \
    const float *__restrict__ x, const unsigned *__restrict__ x_rows, const unsigned *__restrict__ target_rows,  \
        int B, const float *__restrict__ W, const float *__restrict__ bias, const unsigned *__restrict__ classes, \
        const float *__restrict__ values, float *__restrict__ y, float *__restrict__ loss, float *__restrict__ dy, \
        float *__restrict__ dx
#define DENSE_FORWARD_LOSS_ARGS x, x_rows, target_rows, B, W, bias, classes, values, y, loss, dy, dx
#if FIT_OP == 1 && FIT_LOSS >= 0
static_assert(FIT_OUT <= 64 && FIT_ACT == ACT_NONE && !FIT_DROP,
              "the loss fuses only into a plain last Linear of ≤ 64 outputs");
constexpr int LOSS_BN = loss_bn(FIT_OUT), LOSS_TN = loss_tn(LOSS_BN);
extern "C" __global__ void __launch_bounds__(THREADS) dense_forward_loss(DENSE_FORWARD_LOSS_PARAMS) {
    dense_forward_loss<LOSS_BN, LOSS_TN>(DenseDims{}, DENSE_FORWARD_LOSS_ARGS);
}
#elif FIT_OP == 8
// dense_forward_loss_{BN}(dims, …): the generic family's, one kernel a width of the outputs' tile.
#define DENSE_FORWARD_LOSS_GENERIC(BN)                                                                \
    extern "C" __global__ void __launch_bounds__(THREADS)                                            \
        dense_forward_loss_##BN(const DenseDims d, DENSE_FORWARD_LOSS_PARAMS) {                       \
        dense_forward_loss<BN, loss_tn(BN)>(d, DENSE_FORWARD_LOSS_ARGS);                             \
    }
DENSE_FORWARD_LOSS_GENERIC(8)
DENSE_FORWARD_LOSS_GENERIC(16)
DENSE_FORWARD_LOSS_GENERIC(32)
DENSE_FORWARD_LOSS_GENERIC(64)
#endif
#endif
#endif

#if FIT_OP == 2
// ---- conv: [CIN][H][W] → [COUT][OH][OW], K×K kernel, stride S, padding P, then activation ACT ----
constexpr int CIN = FIT_CIN, H = FIT_H, W = FIT_W, COUT = FIT_COUT, K = FIT_K, S = FIT_S, P = FIT_P, ACT = FIT_ACT;
constexpr int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
constexpr int IN_SIZE = CIN * H * W, OUT_SIZE = COUT * OH * OW, WEIGHTS = COUT * CIN * K * K;

// Grid: ⌈B·OUT_SIZE/THREADS⌉ blocks, one thread per output value.
extern "C" __global__ void __launch_bounds__(THREADS)
conv_forward(const float* __restrict__ x, const unsigned* __restrict__ rows, int B, const float* __restrict__ Wt,
             const float* __restrict__ bias, float* __restrict__ z, float* __restrict__ y) {
    const size_t e = (size_t)blockIdx.x * THREADS + threadIdx.x;
    if (e >= (size_t)B * OUT_SIZE) return;
    const int s = e / OUT_SIZE, o = e % OUT_SIZE;
    const int co = o / (OH * OW), oy = o / OW % OH, ox = o % OW;
    const float* in = x + row_of(rows, s) * IN_SIZE;
    float acc = bias[co];
    for (int ci = 0; ci < CIN; ++ci)
#pragma unroll
        for (int ky = 0; ky < K; ++ky) {
            const int iy = oy * S + ky - P;
            if (iy < 0 || iy >= H) continue;
#pragma unroll
            for (int kx = 0; kx < K; ++kx) {
                const int ix = ox * S + kx - P;
                if (ix < 0 || ix >= W) continue;
                acc += Wt[((co * CIN + ci) * K + ky) * K + kx] * in[(ci * H + iy) * W + ix];
            }
        }
    if (ACT != ACT_NONE) z[e] = acc;
    y[e] = fit_activate(ACT, acc);
}

__device__ __forceinline__ float conv_dz(const float* dy, const float* z, size_t e) {
    return ACT == ACT_NONE ? dy[e] : dy[e] * fit_slope(ACT, z[e]);
}

// The weight gradient in two passes, both spread over the whole GPU and summed in a fixed order:
// conv_weight_partials forms the contribution of a run of SAMPLES samples to one output channel's CIN·K·K
// weights and bias (a block per run and channel, threads over the runs' output positions, at least ~1024
// of them so each thread has several), conv_weight_sum adds the runs.
constexpr int PER_CHANNEL = CIN * K * K + 1;  // a channel's weights, then its bias
constexpr int CHUNK = PER_CHANNEL < 32 ? PER_CHANNEL : 32;  // accumulators a thread holds at once
constexpr int SAMPLES = (1024 + OH * OW - 1) / (OH * OW);

// Grid: ⌈B/SAMPLES⌉·COUT blocks (run r, channel co). partial[(r·COUT + co)·PER_CHANNEL + w].
extern "C" __global__ void __launch_bounds__(THREADS)
conv_weight_partials(const float* __restrict__ x, const unsigned* __restrict__ rows, int B,
                     const float* __restrict__ z, const float* __restrict__ dy, float* __restrict__ partial) {
    __shared__ float warp_sums[CHUNK][WARPS];
    const int run = blockIdx.x / COUT, co = blockIdx.x % COUT;
    const int s0 = run * SAMPLES, positions = min(SAMPLES, B - s0) * OH * OW;
    for (int w0 = 0; w0 < PER_CHANNEL; w0 += CHUNK) {
        float acc[CHUNK];
#pragma unroll
        for (int c = 0; c < CHUNK; ++c) acc[c] = 0.0f;
        for (int p = threadIdx.x; p < positions; p += THREADS) {
            const int s = s0 + p / (OH * OW), oy = p / OW % OH, ox = p % OW;
            const float d = conv_dz(dy, z, (size_t)s * OUT_SIZE + (co * OH + oy) * OW + ox);
            const float* in = x + row_of(rows, s) * IN_SIZE;
#pragma unroll
            for (int c = 0; c < CHUNK; ++c) {
                const int w = w0 + c;
                if (w >= PER_CHANNEL) break;
                if (w == PER_CHANNEL - 1) {
                    acc[c] += d;
                } else {
                    const int ci = w / (K * K), ky = w / K % K, kx = w % K;
                    const int iy = oy * S + ky - P, ix = ox * S + kx - P;
                    if (iy >= 0 && iy < H && ix >= 0 && ix < W) acc[c] += d * in[(ci * H + iy) * W + ix];
                }
            }
        }
#pragma unroll
        for (int c = 0; c < CHUNK; ++c) {
            const float v = warp_sum(acc[c]);
            if (threadIdx.x % 32 == 0) warp_sums[c][threadIdx.x / 32] = v;
        }
        __syncthreads();
        if (threadIdx.x < CHUNK && w0 + threadIdx.x < PER_CHANNEL) {
            float total = 0.0f;
#pragma unroll
            for (int q = 0; q < WARPS; ++q) total += warp_sums[threadIdx.x][q];
            partial[(size_t)blockIdx.x * PER_CHANNEL + w0 + threadIdx.x] = total;
        }
        __syncthreads();
    }
}

// Grid: ⌈(WEIGHTS + COUT)/WARPS⌉, one warp per weight (then bias) element: the sum over the ⌈B/SAMPLES⌉
// runs, lane l taking runs l, l + 32, … and the lanes added in a fixed order; its square into partials[e]
// for clipping's norm (unless null).
extern "C" __global__ void __launch_bounds__(THREADS)
conv_weight_sum(int B, const float* __restrict__ partial, float* __restrict__ gW, float* __restrict__ gb,
                float* __restrict__ partials) {
    const int runs = (B + SAMPLES - 1) / SAMPLES;
    const int e = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (e >= WEIGHTS + COUT) return;
    const bool is_bias = e >= WEIGHTS;
    const int co = is_bias ? e - WEIGHTS : e / (PER_CHANNEL - 1), w = is_bias ? PER_CHANNEL - 1 : e % (PER_CHANNEL - 1);
    float g = 0.0f;
    for (int r = lane; r < runs; r += 32) g += partial[((size_t)r * COUT + co) * PER_CHANNEL + w];
    g = warp_sum(g);
    if (lane != 0) return;
    if (is_bias) gb[co] = g;
    else gW[e] = g;
    if (partials) partials[e] = g * g;
}

// Grid: ⌈B·IN_SIZE/THREADS⌉ blocks, one thread per input value: Σ over the outputs its window feeds.
extern "C" __global__ void __launch_bounds__(THREADS)
conv_backward_input(int B, const float* __restrict__ Wt, const float* __restrict__ z, const float* __restrict__ dy,
                    float* __restrict__ dx) {
    const size_t e = (size_t)blockIdx.x * THREADS + threadIdx.x;
    if (e >= (size_t)B * IN_SIZE) return;
    const int s = e / IN_SIZE, i = e % IN_SIZE;
    const int ci = i / (H * W), iy = i / W % H, ix = i % W;
    float acc = 0.0f;
    for (int co = 0; co < COUT; ++co)
#pragma unroll
        for (int ky = 0; ky < K; ++ky) {
            const int ty = iy + P - ky;
            if (ty < 0 || ty % S != 0 || ty / S >= OH) continue;
#pragma unroll
            for (int kx = 0; kx < K; ++kx) {
                const int tx = ix + P - kx;
                if (tx < 0 || tx % S != 0 || tx / S >= OW) continue;
                acc += Wt[((co * CIN + ci) * K + ky) * K + kx] *
                       conv_dz(dy, z, (size_t)s * OUT_SIZE + (co * OH + ty / S) * OW + tx / S);
            }
        }
    dx[e] = acc;
}
#endif

#if FIT_OP == 3
// ---- max pool: [C][H][W] → [C][H/K][W/K], windows K×K not overlapping ----
constexpr int C = FIT_C, H = FIT_H, W = FIT_W, K = FIT_K;
constexpr int OH = H / K, OW = W / K, IN_SIZE = C * H * W, OUT_SIZE = C * OH * OW;

// Grid: ⌈B·OUT_SIZE/THREADS⌉. winner: the input index (within the sample) each output came from; the
// first largest in row-major window order, as the CPU twin.
extern "C" __global__ void __launch_bounds__(THREADS)
pool_forward(const float* __restrict__ x, const unsigned* __restrict__ rows, int B, float* __restrict__ y,
             unsigned* __restrict__ winner) {
    const size_t e = (size_t)blockIdx.x * THREADS + threadIdx.x;
    if (e >= (size_t)B * OUT_SIZE) return;
    const int s = e / OUT_SIZE, o = e % OUT_SIZE;
    const int c = o / (OH * OW), oy = o / OW % OH, ox = o % OW;
    const float* in = x + row_of(rows, s) * IN_SIZE;
    float best = NEG_INF;
    int at = 0;
#pragma unroll
    for (int dy = 0; dy < K; ++dy)
#pragma unroll
        for (int dx = 0; dx < K; ++dx) {
            const int i = (c * H + oy * K + dy) * W + ox * K + dx;
            if (in[i] > best) {
                best = in[i];
                at = i;
            }
        }
    y[e] = best;
    winner[e] = at;
}

// Grid: ⌈B·IN_SIZE/THREADS⌉, one thread per input value.
extern "C" __global__ void __launch_bounds__(THREADS)
pool_backward(int B, const unsigned* __restrict__ winner, const float* __restrict__ dy, float* __restrict__ dx) {
    const size_t e = (size_t)blockIdx.x * THREADS + threadIdx.x;
    if (e >= (size_t)B * IN_SIZE) return;
    const int s = e / IN_SIZE, i = e % IN_SIZE;
    const int c = i / (H * W), iy = i / W % H, ix = i % W;
    float d = 0.0f;
    if (iy / K < OH && ix / K < OW) {
        const size_t o = (size_t)s * OUT_SIZE + (c * OH + iy / K) * OW + ix / K;
        if (winner[o] == (unsigned)i) d = dy[o];
    }
    dx[e] = d;
}
#endif

#if FIT_OP == 4
// ---- pointwise: an activation ACT, or (ACT == ACT_NONE) Dropout, over SIZE values per sample ----
constexpr int SIZE = FIT_SIZE, ACT = FIT_ACT;
// Grid: ⌈B·SIZE/THREADS⌉. threshold 0 and scale 1 turn dropout off.
extern "C" __global__ void __launch_bounds__(THREADS)
pointwise_forward(const float* __restrict__ x, const unsigned* __restrict__ rows, int B, float* __restrict__ y,
                  unsigned layer_seed, const unsigned* __restrict__ step, unsigned threshold, float scale) {
    const size_t e = (size_t)blockIdx.x * THREADS + threadIdx.x;
    if (e >= (size_t)B * SIZE) return;
    const float v = x[row_of(rows, e / SIZE) * SIZE + e % SIZE];
    y[e] = ACT == ACT_NONE ? v * dropout_factor(dropout_key(layer_seed, step), (unsigned)e, threshold, scale)
                           : fit_activate(ACT, v);
}

// x: the forward input (for act′), not read for dropout.
extern "C" __global__ void __launch_bounds__(THREADS)
pointwise_backward(const float* __restrict__ x, int B, const float* __restrict__ dy, float* __restrict__ dx,
                   unsigned layer_seed, const unsigned* __restrict__ step, unsigned threshold, float scale) {
    const size_t e = (size_t)blockIdx.x * THREADS + threadIdx.x;
    if (e >= (size_t)B * SIZE) return;
    dx[e] = ACT == ACT_NONE ? dy[e] * dropout_factor(dropout_key(layer_seed, step), (unsigned)e, threshold, scale)
                            : dy[e] * fit_slope(ACT, x[e]);
}
#endif

#if FIT_OP == 5
// ---- loss over OUT outputs per sample: LOSS 0 cross-entropy (classes), 1 squared error (values) ----
constexpr int OUT = FIT_OUT, LOSS = FIT_LOSS;
// Grid: ⌈B/WARPS⌉, one warp per sample. loss[s]: the sample's loss; dy (unless null): ∂(mean loss)/∂y.
extern "C" __global__ void __launch_bounds__(THREADS)
loss_forward(const float* __restrict__ y, const unsigned* __restrict__ rows, int B,
             const unsigned* __restrict__ classes, const float* __restrict__ values, float* __restrict__ loss,
             float* __restrict__ dy) {
    const int s = blockIdx.x * WARPS + threadIdx.x / 32;
    if (s >= B) return;
    const size_t row = row_of(rows, s);
    warp_sample_loss(OUT, LOSS, y + (size_t)s * OUT, LOSS == 0 ? classes[row] : 0u,
                     LOSS == 0 ? nullptr : values + row * OUT, B, loss + s, dy ? dy + (size_t)s * OUT : nullptr);
}
#endif

#if FIT_OP == 7
// ---- the whole epoch in one block, for a small chain of Linear layers (each with its activation and
// dropout) whose weights fit in registers: the sales-table shape, `Linear(32), ReLU, Linear(1)`. A step
// of such a model is a few µs of work; as separate kernels it would pay a graph node (~0.9 µs) per
// kernel and a grid-wide round trip per layer, so this kernel runs every step of an epoch as the sales
// pipeline's does. Every warp holds a copy of the weights in registers and takes samples warp, warp +
// WARPS, … of the batch through the whole network, forward and backward, adding its gradient in
// registers; the warps' gradients meet in shared memory after one barrier, are summed in warp order (no
// atomics: the same bits every run), and the optimizer updates the parameters, kept in shared memory
// with their moments. Two barriers a step (four with clipping). The next batch is copied in with
// cp.async while the current one computes.
//
// Within a warp a layer is laid out one of two ways (chosen at compile time by the layer's shape):
//   ROWS  lane l owns outputs l, l + 32, … and their rows of W: the input comes whole to every lane (the
//         staged batch row, read from shared memory), the output stays spread over the lanes. Only the
//         first layer can be ROWS (its ∂x is never needed).
//   COLS  lane l owns inputs l, l + 32, … and their columns of W: each lane forms a partial product of
//         every output, a butterfly of shuffles sums them (every lane gets the same bits), so the output
//         is whole in every lane and ∂x = W·dz lands spread over the lanes as the input was.
// FIT_LAYERn packs layer n: inputs | outputs << 16 | (act + 1) << 32 | bias << 35 | dropout << 36 (the
// launch layer's `whole_epoch_plan`); FIT_BATCH is the batch, FIT_LOSS the loss. With FIT_PAIR 2 a warp takes
// two samples at a time (s and s + WARPS), so the two samples' chains of dependent FMAs and shuffles
// interleave; the gradient still adds the samples in the same order.
#ifndef FIT_LAYER1
#define FIT_LAYER1 0
#endif
#ifndef FIT_LAYER2
#define FIT_LAYER2 0
#endif
#ifndef FIT_LAYER3
#define FIT_LAYER3 0
#endif
constexpr long long LAYER_CODES[4] = {FIT_LAYER0, FIT_LAYER1, FIT_LAYER2, FIT_LAYER3};
constexpr int layer_count() {
    int n = 0;
    while (n < 4 && LAYER_CODES[n] != 0) ++n;
    return n;
}
#ifndef FIT_PAIR
#define FIT_PAIR 1
#endif
constexpr int LAYERS = layer_count(), BATCH = FIT_BATCH, LOSS = FIT_LOSS, PAIR = FIT_PAIR;
static_assert(LAYERS >= 1 && BATCH >= 1 && BATCH <= THREADS, "1–4 layers, a batch of at most THREADS");
static_assert(PAIR == 1 || PAIR == 2, "one or two samples a warp at a time");

// The samples a warp takes at once: s[q] = first + q·WARPS, those past the batch marked not ok (their
// input reads as 0 and their output gradient is 0, so they add nothing).
struct Samples {
    int s[PAIR];
    bool ok[PAIR];
};

struct DenseShape {
    int in, out, act;
    bool bias, drop;
    int weight, bias_at, end;  // offsets in the flat parameter vector (`Network`'s layout)
};
constexpr DenseShape dense_shape(int l) {
    DenseShape s{0, 0, ACT_NONE, false, false, 0, 0, 0};
    for (int i = 0; i <= l && i < 4; ++i) {
        const long long c = LAYER_CODES[i];
        const int start = s.end;
        s = DenseShape{(int)(c & 0xffff), (int)((c >> 16) & 0xffff), (int)((c >> 32) & 7) - 1, ((c >> 35) & 1) != 0,
                       ((c >> 36) & 1) != 0, start, 0, 0};
        s.bias_at = s.weight + s.in * s.out;
        s.end = s.bias_at + (s.bias ? s.out : 0);
    }
    return s;
}
constexpr int P = dense_shape(LAYERS - 1).end;  // parameters
constexpr int IN0 = dense_shape(0).in, OUTS = dense_shape(LAYERS - 1).out;
constexpr int TARGET = LOSS == 0 ? 1 : OUTS;   // a staged target: a class, or OUTS values
constexpr int PS = (P + 3) / 4 * 4;           // a parameter vector's stride in shared memory
constexpr int XS = (IN0 + 3) / 4 * 4;         // a staged row's stride (float4 reads)

template <int L>
struct Dense {
    static constexpr DenseShape S = dense_shape(L);
    static constexpr int IN = S.in, OUT = S.out;
    static constexpr bool ROWS = L == 0 && LAYERS > 1 && IN < 5 * OUT;
    static constexpr int OWN = ROWS ? (OUT + 31) / 32 : (IN + 31) / 32;  // rows or columns a lane owns
    static constexpr int SPAN = ROWS ? IN : OUT;                          // weights in each
    static constexpr int VALS = ROWS ? OWN : OUT;                         // outputs a lane holds
    float w[OWN][SPAN], g[OWN][SPAN];
    float b[VALS], gb[VALS];
    float z[PAIR][VALS], y[PAIR][VALS], dy[PAIR][VALS];
    float in[PAIR][ROWS ? IN : OWN];  // the inputs kept for the weight gradient: the whole row (ROWS) or the lane's
    unsigned key, threshold;   // dropout's key this step, and its threshold
    float scale;

    // Flat index of weight (own i, span j) for lane `lane`, or −1 where the lane owns nothing.
    __device__ __forceinline__ static int weight_index(int lane, int i, int j) {
        const int unit = lane + 32 * i;
        if (ROWS) return unit < OUT ? S.weight + unit * IN + j : -1;
        return unit < IN ? S.weight + j * IN + unit : -1;
    }
    __device__ __forceinline__ static int bias_index(int lane, int v) {
        if (!S.bias) return -1;
        if (ROWS) return lane + 32 * v < OUT ? S.bias_at + lane + 32 * v : -1;
        return S.bias_at + v;
    }
    // Output value v of this lane: its index among the layer's outputs.
    __device__ __forceinline__ static int output_index(int lane, int v) { return ROWS ? lane + 32 * v : v; }

    __device__ __forceinline__ void load(const float* params, int lane, unsigned step, const unsigned* drop) {
#pragma unroll
        for (int i = 0; i < OWN; ++i)
#pragma unroll
            for (int j = 0; j < SPAN; ++j) {
                const int at = weight_index(lane, i, j);
                w[i][j] = at >= 0 ? params[at] : 0.0f;
                g[i][j] = 0.0f;
            }
#pragma unroll
        for (int v = 0; v < VALS; ++v) {
            const int at = bias_index(lane, v);
            b[v] = at >= 0 ? params[at] : 0.0f;
            gb[v] = 0.0f;
        }
        if constexpr (S.drop) {
            key = mix32(drop[3 * L] + step);
            threshold = drop[3 * L + 1];
            scale = __uint_as_float(drop[3 * L + 2]);
        }
    }

    __device__ __forceinline__ float dropout(int s, int v) const {
        return dropout_factor(key, (unsigned)(s * OUT + output_index(threadIdx.x % 32, v)), threshold, scale);
    }

    __device__ __forceinline__ void finish_output(const Samples& p) {
#pragma unroll
        for (int q = 0; q < PAIR; ++q)
#pragma unroll
            for (int v = 0; v < VALS; ++v) {
                y[q][v] = fit_activate(S.act, z[q][v]);
                if constexpr (S.drop) y[q][v] *= dropout(p.s[q], v);
            }
    }

    // Layer 0: the input is the staged batch xs, rows XS apart (16-byte aligned; every lane reads a row
    // whole for ROWS).
    __device__ __forceinline__ void forward_from_rows(const float* xs, const Samples& p) {
        const int lane = threadIdx.x % 32;
        if constexpr (ROWS) {
#pragma unroll
            for (int q = 0; q < PAIR; ++q)
#pragma unroll
                for (int f = 0; f < XS / 4; ++f) {
                    const float4 four =
                        p.ok[q] ? reinterpret_cast<const float4*>(xs + p.s[q] * XS)[f] : make_float4(0, 0, 0, 0);
                    const float parts[4] = {four.x, four.y, four.z, four.w};
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (4 * f + e < IN) in[q][4 * f + e] = parts[e];
                }
#pragma unroll
            for (int q = 0; q < PAIR; ++q)
#pragma unroll
                for (int i = 0; i < OWN; ++i) z[q][i] = b[i];
#pragma unroll
            for (int k = 0; k < IN; ++k)
#pragma unroll
                for (int q = 0; q < PAIR; ++q)
#pragma unroll
                    for (int i = 0; i < OWN; ++i) z[q][i] = fmaf(w[i][k], in[q][k], z[q][i]);
        } else {
#pragma unroll
            for (int q = 0; q < PAIR; ++q)
#pragma unroll
                for (int c = 0; c < OWN; ++c)
                    in[q][c] = p.ok[q] && lane + 32 * c < IN ? xs[p.s[q] * XS + lane + 32 * c] : 0.0f;
            columns_forward();
        }
        finish_output(p);
    }

    // A later layer: its input is the layer before's output (spread over the lanes or whole in each).
    template <class Before>
    __device__ __forceinline__ void forward_from(const Before& before, const Samples& p) {
        static_assert(!ROWS, "only the first layer is ROWS");
        const int lane = threadIdx.x % 32;
#pragma unroll
        for (int q = 0; q < PAIR; ++q)
#pragma unroll
            for (int c = 0; c < OWN; ++c) {
                if constexpr (Before::ROWS) {
                    in[q][c] = before.y[q][c];
                } else {  // pick the lane's own inputs out of the whole output
                    float v = 0.0f;
#pragma unroll
                    for (int k = 0; k < IN; ++k)
                        if (k == lane + 32 * c) v = before.y[q][k];
                    in[q][c] = v;
                }
            }
        columns_forward();
        finish_output(p);
    }

    __device__ __forceinline__ void columns_forward() {
#pragma unroll
        for (int o = 0; o < OUT; ++o) {
            float part[PAIR];
#pragma unroll
            for (int q = 0; q < PAIR; ++q) {
                part[q] = 0.0f;
#pragma unroll
                for (int c = 0; c < OWN; ++c) part[q] = fmaf(w[c][o], in[q][c], part[q]);
            }
#pragma unroll
            for (int q = 0; q < PAIR; ++q) z[q][o] = warp_sum(part[q]) + b[o];
        }
    }

    // dy → dz in place, then the gradient: this layer's into g, gb; ∂x (COLS only) into dx[OWN], spread
    // over the lanes as the input was.
    __device__ __forceinline__ void backward(const Samples& p, float (&dx)[PAIR][OWN]) {
#pragma unroll
        for (int q = 0; q < PAIR; ++q)
#pragma unroll
            for (int v = 0; v < VALS; ++v) {
                float d = dy[q][v];
                if constexpr (S.drop) d *= dropout(p.s[q], v);
                if (S.act != ACT_NONE) d *= fit_slope(S.act, z[q][v]);
                dy[q][v] = d;
                gb[v] += d;
            }
        if constexpr (ROWS) {
#pragma unroll
            for (int k = 0; k < IN; ++k)
#pragma unroll
                for (int i = 0; i < OWN; ++i)
#pragma unroll
                    for (int q = 0; q < PAIR; ++q) g[i][k] = fmaf(dy[q][i], in[q][k], g[i][k]);
        } else {
#pragma unroll
            for (int c = 0; c < OWN; ++c) {
                float acc[PAIR];
#pragma unroll
                for (int q = 0; q < PAIR; ++q) acc[q] = 0.0f;
#pragma unroll
                for (int o = 0; o < OUT; ++o)
#pragma unroll
                    for (int q = 0; q < PAIR; ++q) {
                        g[c][o] = fmaf(dy[q][o], in[q][c], g[c][o]);
                        acc[q] = fmaf(dy[q][o], w[c][o], acc[q]);
                    }
#pragma unroll
                for (int q = 0; q < PAIR; ++q) dx[q][c] = acc[q];
            }
        }
    }

    // The output gradient from the layer after's ∂x (spread over the lanes as this layer's output feeds it).
    template <int N>
    __device__ __forceinline__ void take_gradient(const float (&dx)[PAIR][N]) {
#pragma unroll
        for (int q = 0; q < PAIR; ++q) {
            if constexpr (ROWS) {
#pragma unroll
                for (int i = 0; i < OWN; ++i) dy[q][i] = dx[q][i];
            } else {  // whole in every lane again
#pragma unroll
                for (int o = 0; o < OUT; ++o) dy[q][o] = __shfl_sync(FULL_MASK, dx[q][o / 32], o % 32);
            }
        }
    }

    // The warp's gradient into its row of shared memory (every parameter written by exactly one lane).
    __device__ __forceinline__ void store(float* partial, int lane) const {
#pragma unroll
        for (int i = 0; i < OWN; ++i)
#pragma unroll
            for (int j = 0; j < SPAN; ++j) {
                const int at = weight_index(lane, i, j);
                if (at >= 0) partial[at] = g[i][j];
            }
#pragma unroll
        for (int v = 0; v < VALS; ++v) {
            const int at = bias_index(lane, v);
            if (at >= 0 && (ROWS || lane == 0)) partial[at] = gb[v];
        }
    }
};

// Layers L.. of the network, each with the ones after it.
template <int L, bool LAST = (L + 1 == LAYERS)>
struct Chain;

template <int L>
struct Chain<L, true> {
    Dense<L> d;
    __device__ __forceinline__ Dense<L>& last() { return d; }
    __device__ __forceinline__ void load(const float* p, int lane, unsigned step, const unsigned* drop) {
        d.load(p, lane, step, drop);
    }
    template <class Before>
    __device__ __forceinline__ void forward(const Before& before, const Samples& p) {
        d.forward_from(before, p);
    }
    __device__ __forceinline__ void forward_rest(const Samples&) {}
    __device__ __forceinline__ void store(float* partial, int lane) const { d.store(partial, lane); }
};

template <int L>
struct Chain<L, false> {
    Dense<L> d;
    Chain<L + 1> rest;
    __device__ __forceinline__ Dense<LAYERS - 1>& last() { return rest.last(); }
    __device__ __forceinline__ void load(const float* p, int lane, unsigned step, const unsigned* drop) {
        d.load(p, lane, step, drop);
        rest.load(p, lane, step, drop);
    }
    template <class Before>
    __device__ __forceinline__ void forward(const Before& before, const Samples& p) {
        d.forward_from(before, p);
        rest.forward(d, p);
    }
    __device__ __forceinline__ void forward_rest(const Samples& p) { rest.forward(d, p); }
    __device__ __forceinline__ void store(float* partial, int lane) const {
        d.store(partial, lane);
        rest.store(partial, lane);
    }
};

// Backward through layers L.. given the last layer's dy: each layer hands ∂x to the one before.
template <int L>
__device__ __forceinline__ void chain_backward(Chain<L, true>& c, const Samples& p, float (&dx)[PAIR][Dense<L>::OWN]) {
    c.d.backward(p, dx);
}
template <int L>
__device__ __forceinline__ void chain_backward(Chain<L, false>& c, const Samples& p, float (&dx)[PAIR][Dense<L>::OWN]) {
    float after[PAIR][Dense<L + 1>::OWN];
    chain_backward(c.rest, p, after);
    c.d.take_gradient(after);
    c.d.backward(p, dx);
}

// Forward for the samples p (of the staged batch xs, targets ts), their losses into loss[s] (lane 0) and
// the last layer's dy, then backward, adding their gradient to the chain's.
__device__ __forceinline__ void sample_step(Chain<0>& net, const Samples& p, const float* xs, const float* ts, int b,
                                            float* loss) {
    net.d.forward_from_rows(xs, p);
    net.forward_rest(p);
    Dense<LAYERS - 1>& out = net.last();
    static_assert(!Dense<LAYERS - 1>::ROWS, "the last layer holds its outputs whole");
#pragma unroll
    for (int q = 0; q < PAIR; ++q) {
        const float* target = ts + (p.ok[q] ? p.s[q] : 0) * TARGET;
        const float* y = out.y[q];
        float* dy = out.dy[q];
        float l;
        if (LOSS == 0) {
            const int cls = (int)__float_as_uint(target[0]);
            float m = NEG_INF, picked = 0.0f;
#pragma unroll
            for (int o = 0; o < OUTS; ++o) {
                m = fmaxf(m, y[o]);
                if (o == cls) picked = y[o];
            }
            float sum = 0.0f;
#pragma unroll
            for (int o = 0; o < OUTS; ++o) sum += expf(y[o] - m);
#pragma unroll
            for (int o = 0; o < OUTS; ++o)
                dy[o] = p.ok[q] ? (expf(y[o] - m) / sum - (o == cls ? 1.0f : 0.0f)) / b : 0.0f;
            l = m + logf(sum) - picked;
        } else {
            float sq = 0.0f;
#pragma unroll
            for (int o = 0; o < OUTS; ++o) {
                const float err = y[o] - target[o];
                sq += err * err;
                dy[o] = p.ok[q] ? 2.0f / ((float)b * OUTS) * err : 0.0f;
            }
            l = sq * (1.0f / OUTS);
        }
        if (p.ok[q] && threadIdx.x % 32 == 0) loss[p.s[q]] = l;
    }
    float unused[PAIR][Dense<0>::OWN];
    chain_backward(net, p, unused);
}

// Dynamic shared memory, in floats: parameters, m, v (PS each), a gradient row per warp (PS each), two
// staged batches (BATCH rows XS apart), two staged targets (BATCH·TARGET), two batches of row indices.
constexpr int SMEM_PARAMS = 0, SMEM_M = PS, SMEM_V = 2 * PS, SMEM_PARTIAL = 3 * PS;
constexpr int SMEM_X = SMEM_PARTIAL + WARPS * PS, SMEM_T = SMEM_X + 2 * BATCH * XS;
constexpr int SMEM_ROWS = SMEM_T + 2 * BATCH * TARGET, SMEM_FLOATS = SMEM_ROWS + 2 * BATCH;

// Copies the rows of one batch (indices in `rows`) and their targets into shared memory, asynchronously.
__device__ __forceinline__ void stage_batch(float* xs, float* ts, const unsigned* rows, int b, const float* x,
                                            const unsigned* classes, const float* values) {
    for (int e = threadIdx.x; e < b * IN0; e += THREADS) {
        const int s = e / IN0, k = e % IN0;
        cp_async4(xs + s * XS + k, x + (size_t)rows[s] * IN0 + k);
    }
    for (int e = threadIdx.x; e < b * TARGET; e += THREADS) {
        const int s = e / TARGET, o = e % TARGET;
        if (LOSS == 0) cp_async4(ts + e, classes + rows[s]);
        else cp_async4(ts + e, values + (size_t)rows[s] * OUTS + o);
    }
    cp_async_commit();
}

// Grid 1. The epoch's n samples are x rows order[0..n), BATCH a step (the last step may be shorter),
// step k at rate lr[k] with the optimizer `settings`; per-sample losses (each before its step) into
// loss[0..n). params, m, v: the flat vectors, read at the start and written back at the end; grad: the last
// step's gradient (unclipped). step: steps taken before (advanced by the epoch's). drop: per layer (seed,
// threshold, scale bits). shared_floats: the dynamic shared memory given, checked against SMEM_FLOATS.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
dense_train_epoch(OptimSettings settings, const float* __restrict__ x, const unsigned* __restrict__ classes,
                  const float* __restrict__ values, const unsigned* __restrict__ order, int n,
                  const float* __restrict__ lr, float* __restrict__ params, float* __restrict__ grad,
                  float* __restrict__ m, float* __restrict__ v, unsigned* __restrict__ step,
                  float* __restrict__ loss, const unsigned* __restrict__ drop, int shared_floats) {
    extern __shared__ float smem[];
    __shared__ float scratch[WARPS];
    if (shared_floats < SMEM_FLOATS) __trap();
    float *p_s = smem + SMEM_PARAMS, *m_s = smem + SMEM_M, *v_s = smem + SMEM_V;
    unsigned* rows_s = reinterpret_cast<unsigned*>(smem + SMEM_ROWS);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, steps = (n + BATCH - 1) / BATCH;
    const unsigned t0 = *step;
    // Adam's βᵗ, advanced a step at a time (as the sales kernel does) rather than a pow per step.
    const float beta1 = settings.beta1, beta2 = settings.beta2, clip_norm = settings.clip_norm;
    double beta1_t = pow((double)beta1, (double)t0), beta2_t = pow((double)beta2, (double)t0);
    for (int i = threadIdx.x; i < PS; i += THREADS) {
        p_s[i] = i < P ? params[i] : 0.0f;
        m_s[i] = i < P ? m[i] : 0.0f;
        v_s[i] = i < P ? v[i] : 0.0f;
    }
    for (int s = threadIdx.x; s < 2 * BATCH; s += THREADS) rows_s[s] = s < n ? order[s] : 0u;
    __syncthreads();
    stage_batch(smem + SMEM_X, smem + SMEM_T, rows_s, min(BATCH, n), x, classes, values);

    for (int k = 0; k < steps; ++k) {
        const int first = k * BATCH, b = min(BATCH, n - first), cur = k & 1;
        cp_async_wait_all();
        __syncthreads();  // batch k staged, the last update done, the next batch's row indices written
        if (k + 1 < steps)
            stage_batch(smem + SMEM_X + (cur ^ 1) * BATCH * XS, smem + SMEM_T + (cur ^ 1) * BATCH * TARGET,
                        rows_s + (cur ^ 1) * BATCH, min(BATCH, n - first - BATCH), x, classes, values);
        // Row indices two steps ahead, stored into this step's slot once the loads have landed.
        const int ahead = first + 2 * BATCH + threadIdx.x;
        const unsigned ahead_row = threadIdx.x < BATCH && ahead < n ? order[ahead] : 0u;
        const float rate = lr[k];

        Chain<0> net;
        net.load(p_s, lane, t0 + k, drop);
        const float* xs = smem + SMEM_X + cur * BATCH * XS;
        const float* ts = smem + SMEM_T + cur * BATCH * TARGET;
        for (int s = warp; s < b; s += PAIR * WARPS) {
            Samples p;
#pragma unroll
            for (int q = 0; q < PAIR; ++q) {
                p.s[q] = s + q * WARPS;
                p.ok[q] = p.s[q] < b;
            }
            sample_step(net, p, xs, ts, b, loss + first);
        }
        float* partial = smem + SMEM_PARTIAL + warp * PS;
        net.store(partial, lane);
        if (threadIdx.x < BATCH) rows_s[cur * BATCH + threadIdx.x] = ahead_row;
        __syncthreads();  // every warp's gradient stored

        beta1_t *= beta1;
        beta2_t *= beta2;
        OptimStep o = optim_step(settings, rate);
        o.bias1 = (float)(1.0 - beta1_t);
        o.bias2 = (float)(1.0 - beta2_t);
        float* summed = smem + SMEM_PARTIAL;  // row 0 takes the sums when clipping needs them all first
        float sq = 0.0f;
        for (int i = threadIdx.x; i < P; i += THREADS) {
            float g = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) g += smem[SMEM_PARTIAL + w * PS + i];
            if (k + 1 == steps) grad[i] = g;
            if (clip_norm > 0.0f) {
                summed[i] = g;
                sq = fmaf(g, g, sq);
            } else {
                p_s[i] = optim_update(o, p_s[i], g, m_s[i], v_s[i]);
            }
        }
        if (clip_norm > 0.0f) {  // uniform: every thread takes block_sum's barriers
            const float norm = sqrtf(block_sum(sq, scratch));
            if (norm > clip_norm) o.grad_scale = clip_norm / norm;
            for (int i = threadIdx.x; i < P; i += THREADS) p_s[i] = optim_update(o, p_s[i], summed[i], m_s[i], v_s[i]);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < P; i += THREADS) {
        params[i] = p_s[i];
        m[i] = m_s[i];
        v[i] = v_s[i];
    }
    if (threadIdx.x == 0) *step = t0 + steps;
}
#endif

#if FIT_OP == 6
// ---- the optimizer step over n parameters ----
// A grid-stride pass with the optimizer `settings`. lr: this step's entry of the epoch's schedule.
// settings.clip_norm 0 turns clipping off (then partials is not read). step: steps taken, advanced by the
// last block to finish (ticket zero between launches).
extern "C" __global__ void __launch_bounds__(THREADS)
fit_update(OptimSettings settings, float* __restrict__ params, const float* __restrict__ grad, float* __restrict__ m,
           float* __restrict__ v, int n, const float* __restrict__ lr, const float* __restrict__ partials,
           int partial_count, unsigned* __restrict__ step, unsigned* __restrict__ ticket) {
    __shared__ float grad_scale;
    const unsigned t = *step + 1;
    if (threadIdx.x < 32) {
        float scale = 1.0f;
        if (settings.clip_norm > 0.0f) {
            double sum = 0.0;
            for (int i = threadIdx.x; i < partial_count; i += 32) sum += partials[i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o);
            const float norm = (float)sqrt(sum);
            if (norm > settings.clip_norm) scale = settings.clip_norm / norm;
        }
        if (threadIdx.x == 0) grad_scale = scale;
    }
    __syncthreads();
    OptimStep s = optim_step(settings, *lr);
    s.grad_scale = grad_scale;
    optim_bias_corrections(s, t);
    optim_update_range(s, params, grad, m, v, blockIdx.x * THREADS + threadIdx.x, n, gridDim.x * THREADS);
    if (last_block_to_finish(ticket) && threadIdx.x == 0) {
        *step = t;
        *ticket = 0;
    }
}
#endif
