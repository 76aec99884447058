// The MNIST classifier's training step as three fused kernels (CPU twin: src/mnist/model.rs and src/ops/optim.rs).
//
//   z1 = X·W1ᵀ + b1   a = act(z1)   logits = a·W2ᵀ + b2   loss = −log softmax(logits)[y]
//   X: B×I (a shuffled batch of images), W1: H×I, W2: C×H
//
// A step is a few µs of work spread over the whole GPU, so what counts is the number of round trips to
// memory and of kernel boundaries, not FLOPs (about 26 MFLOP per step at B=64, H=128).
//
//   1. mnist_forward   blocks tile a (B×H) FWD_BM samples × FWD_BN hidden units, the whole K = I staged at
//                      once (gemm.cuh), bias and activation in the epilogue. The output layer needs all H
//                      of a sample: the last block to finish a sample tile (atomic ticket) forms that tile's
//                      logits, softmax, loss, dlogits = (p − onehot)/B and dz1 = (dlogits·W2) ⊙ act′(z1),
//                      one warp per sample. No grid-wide barrier, and kernel 2 is left with plain products.
//   2. mnist_backward  the two weight gradients as products over the batch, tiled over ~100 blocks:
//                      [∂W1 | ∂b1] = dz1ᵀ·[X | 1] and [∂W2 | ∂b2] = dlogitsᵀ·[a | 1]; the column of ones
//                      makes the bias gradients fall out of the same tiles. Every gradient element is
//                      written by one block (no atomics, deterministic). With clipping on, each block also
//                      writes the Σg² of its elements.
//   3. mnist_update    the optimizer over the flat parameter vector (optim.cuh, twin of src/ops/optim.rs `update`).
//                      Every block sums the Σg² partials itself for the clip factor and derives Adam's bias
//                      corrections from the step count, which lives on the device: the last block to finish
//                      advances it, so a CUDA graph of many steps replays unchanged.
//
// A step's samples are order[*cursor + offset ..][..B]: a graph bakes in each step's offset, mnist_advance
// moves the cursor after it. mnist_evaluate runs kernel 1's body over test samples in order, keeping only
// the loss and the predicted classes.
//
// Parameters, gradient and optimizer state are flat vectors: W1 (H×I), b1 (H), W2 (C×H), b2 (C). I and C
// are compiled in (-DMNIST_I, -DMNIST_C); H, the batch and the activation are arguments.
#include "activations.cuh"
#include "common.cuh"
#include "gemm.cuh"
#include "losses.cuh"
#include "optim.cuh"

#ifndef MNIST_I
#define MNIST_I 784
#endif
#ifndef MNIST_C
#define MNIST_C 10
#endif

constexpr int I = MNIST_I;
constexpr int C = MNIST_C;

// Kernel 1: a tile is one sample per warp (for the output layer) × 8 hidden units, K = I in one stage.
// The launch layer (src/mnist/gpu.rs) mirrors these sizes for grids and shared memory.
constexpr int FWD_BM = WARPS, FWD_BN = 8, FWD_TM = 2, FWD_TN = 2;
using ForwardTile = GemmTile<FWD_BM, FWD_BN, I, FWD_TM, FWD_TN>;
// Kernel 2: 16 rows (hidden units or classes) × 64 columns (pixels or hidden units), 64 samples per stage.
constexpr int BWD_BM = 16, BWD_BN = 64, BWD_BK = 64, BWD_TM = 4, BWD_TN = 4;



// Kernel 1's body. Grid: (⌈H/FWD_BN⌉ hidden tiles, ⌈B/FWD_BM⌉ sample tiles). Sample s of the batch is image
// order[*cursor + offset + s] when training, image offset + s when evaluating (order == nullptr).
// Dynamic shared memory: max(ForwardTile::SHARED_FLOATS, (FWD_BM + C)·H + FWD_BM·C) floats.
template <bool TRAIN>
__device__ __forceinline__ void forward_body(const float* __restrict__ images, const unsigned char* __restrict__ labels,
                                             const unsigned* __restrict__ order, const unsigned* __restrict__ cursor,
                                             unsigned offset, int B, int H, int activation,
                                             const float* __restrict__ params, float* act,
                                             float* __restrict__ dlogits, float* __restrict__ dz1,
                                             unsigned char* __restrict__ predicted, double* __restrict__ loss_sum,
                                             unsigned* __restrict__ tickets, float* smem) {
    __shared__ unsigned rows[FWD_BM];
    const float* W1 = params;
    const float* b1 = W1 + (size_t)H * I;
    const float* W2 = b1 + H;
    const float* b2 = W2 + (size_t)C * H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n0 = blockIdx.x * FWD_BN, m0 = blockIdx.y * FWD_BM;
    const int bm = min(FWD_BM, B - m0);

    if (threadIdx.x < bm) {
        const unsigned s = offset + m0 + threadIdx.x;
        if constexpr (TRAIN) rows[threadIdx.x] = order[*cursor + s];
        else rows[threadIdx.x] = s;
    }
    __syncthreads();
    gemm_tile<FWD_BM, FWD_BN, I, FWD_TM, FWD_TN, false, true>(
        B, H, I, m0, n0,
        [&](int m, int k) { return images[(size_t)rows[m - m0] * I + k]; },
        [&](int k, int n) { return W1[(size_t)n * I + k]; },
        [&](int m, int n, float z) { act[(size_t)m * H + n] = activate(activation, z + b1[n]); }, smem);

    // The last block of this sample tile sees every block's activations.
    if (!last_block_to_finish(&tickets[blockIdx.y])) return;

    float* a_tile = smem;             // [FWD_BM][H]
    float* w2 = a_tile + FWD_BM * H;  // [C][H]
    float* dl = w2 + C * H;           // [FWD_BM][C]
    for (int i = threadIdx.x; i < bm * H; i += THREADS) a_tile[i] = __ldcg(&act[(size_t)m0 * H + i]);
    for (int i = threadIdx.x; i < C * H; i += THREADS) w2[i] = W2[i];
    __syncthreads();

    if (warp < bm) {
        float logit[C];
#pragma unroll
        for (int c = 0; c < C; ++c) logit[c] = 0.0f;
        for (int j = lane; j < H; j += 32) {
            const float a = a_tile[warp * H + j];
#pragma unroll
            for (int c = 0; c < C; ++c) logit[c] = fmaf(a, w2[c * H + j], logit[c]);
        }
        const int y = labels[rows[warp]];
#pragma unroll
        for (int c = 0; c < C; ++c) logit[c] = warp_sum(logit[c]) + b2[c];
        int best;
        const float loss = softmax_xent(logit, y, 1.0f / B, best);  // logit now holds dlogits
        if (lane == 0) {
            atomicAdd(loss_sum, (double)loss);
            if (!TRAIN) predicted[rows[warp]] = (unsigned char)best;
        }
        if (TRAIN) {
            const int s = m0 + warp;
#pragma unroll
            for (int c = 0; c < C; ++c) {
                const float d = logit[c];
                if (lane == c % 32) {
                    dlogits[(size_t)s * C + c] = d;
                    dl[warp * C + c] = d;
                }
            }
        }
    }
    if (TRAIN) {
        __syncthreads();
        for (int i = threadIdx.x; i < bm * H; i += THREADS) {
            const int s = i / H, j = i % H;
            float da = 0.0f;
#pragma unroll
            for (int c = 0; c < C; ++c) da += dl[s * C + c] * w2[c * H + j];
            dz1[(size_t)(m0 + s) * H + j] = da * activation_slope(activation, a_tile[i]);
        }
    }
    if (threadIdx.x == 0) tickets[blockIdx.y] = 0;
}

// Kernel 1 (training): activations a, dlogits and dz1 of the batch; adds the batch's summed loss to loss_sum.
extern "C" __global__ void __launch_bounds__(THREADS)
mnist_forward(const float* __restrict__ images, const unsigned char* __restrict__ labels,
              const unsigned* __restrict__ order, const unsigned* __restrict__ cursor, unsigned offset, int B, int H,
              int activation, const float* __restrict__ params, float* act, float* __restrict__ dlogits,
              float* __restrict__ dz1, double* __restrict__ loss_sum, unsigned* __restrict__ tickets) {
    extern __shared__ float smem[];
    forward_body<true>(images, labels, order, cursor, offset, B, H, activation, params, act, dlogits, dz1, nullptr,
                       loss_sum, tickets, smem);
}

// Evaluation: samples first .. first + B of a split in order; predicted class (argmax, first on ties) of
// each into predicted[first + s], the summed loss into loss_sum.
extern "C" __global__ void __launch_bounds__(THREADS)
mnist_evaluate(const float* __restrict__ images, const unsigned char* __restrict__ labels, unsigned first, int B,
               int H, int activation, const float* __restrict__ params, float* act,
               unsigned char* __restrict__ predicted, double* __restrict__ loss_sum, unsigned* __restrict__ tickets) {
    extern __shared__ float smem[];
    forward_body<false>(images, labels, nullptr, nullptr, first, B, H, activation, params, act, nullptr, nullptr,
                        predicted, loss_sum, tickets, smem);
}

// Kernel 2. Grid: ⌈H/BWD_BM⌉·⌈(I+1)/BWD_BN⌉ blocks for [∂W1 | ∂b1], then ⌈C/BWD_BM⌉·⌈(H+1)/BWD_BN⌉ for
// [∂W2 | ∂b2]. With want_norm, block b writes the Σg² of its elements to norm_partials[b].
// Dynamic shared memory: GemmTile<BWD_BM, BWD_BN, BWD_BK, BWD_TM, BWD_TN>::SHARED_FLOATS floats.
extern "C" __global__ void __launch_bounds__(THREADS)
mnist_backward(const float* __restrict__ images, const unsigned* __restrict__ order,
               const unsigned* __restrict__ cursor, unsigned offset, int B, int H, const float* __restrict__ act,
               const float* __restrict__ dlogits, const float* __restrict__ dz1, float* __restrict__ grad,
               int want_norm, float* __restrict__ norm_partials) {
    extern __shared__ float smem[];
    __shared__ float scratch[WARPS];
    float* gW1 = grad;
    float* gb1 = gW1 + (size_t)H * I;
    float* gW2 = gb1 + H;
    float* gb2 = gW2 + (size_t)C * H;
    const unsigned* rows = order + *cursor + offset;
    const int w1_columns = ceil_div(I + 1, BWD_BN);
    const int w1_tiles = ceil_div(H, BWD_BM) * w1_columns;
    float sq = 0.0f;
    if ((int)blockIdx.x < w1_tiles) {
        const int m0 = blockIdx.x / w1_columns * BWD_BM, n0 = blockIdx.x % w1_columns * BWD_BN;
        gemm_tile<BWD_BM, BWD_BN, BWD_BK, BWD_TM, BWD_TN, true, false>(
            H, I + 1, B, m0, n0,
            [&](int j, int s) { return dz1[(size_t)s * H + j]; },
            [&](int s, int p) { return p < I ? images[(size_t)rows[s] * I + p] : 1.0f; },
            [&](int j, int p, float g) {
                if (p < I) gW1[(size_t)j * I + p] = g;
                else gb1[j] = g;
                sq += g * g;
            },
            smem);
    } else {
        const int tile = blockIdx.x - w1_tiles, w2_columns = ceil_div(H + 1, BWD_BN);
        const int m0 = tile / w2_columns * BWD_BM, n0 = tile % w2_columns * BWD_BN;
        gemm_tile<BWD_BM, BWD_BN, BWD_BK, BWD_TM, BWD_TN, true, false>(
            C, H + 1, B, m0, n0,
            [&](int c, int s) { return dlogits[(size_t)s * C + c]; },
            [&](int s, int j) { return j < H ? act[(size_t)s * H + j] : 1.0f; },
            [&](int c, int j, float g) {
                if (j < H) gW2[(size_t)c * H + j] = g;
                else gb2[c] = g;
                sq += g * g;
            },
            smem);
    }
    if (want_norm) {
        sq = block_sum(sq, scratch);
        if (threadIdx.x == 0) norm_partials[blockIdx.x] = sq;
    }
}

// Kernel 3, a grid-stride pass over the n parameters. kind: OPTIM_*. clip_norm 0 turns clipping off; then
// norm_partials is not read. step: optimizer steps taken (t − 1); ticket: zero between launches.
extern "C" __global__ void __launch_bounds__(THREADS)
mnist_update(float* __restrict__ params, const float* __restrict__ grad, float* __restrict__ m,
             float* __restrict__ v, int n, int kind, float lr, float momentum, float beta1, float beta2, float eps,
             float weight_decay, float clip_norm, const float* __restrict__ norm_partials, int partial_count,
             unsigned* __restrict__ step, unsigned* __restrict__ ticket) {
    __shared__ float grad_scale;
    const unsigned t = *step + 1;
    if (threadIdx.x < 32) {
        float scale = 1.0f;
        if (clip_norm > 0.0f) {
            double sum = 0.0;
            for (int i = threadIdx.x; i < partial_count; i += 32) sum += norm_partials[i];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o);
            const float norm = (float)sqrt(sum);
            if (norm > clip_norm) scale = clip_norm / norm;
        }
        if (threadIdx.x == 0) grad_scale = scale;
    }
    __syncthreads();
    OptimStep s{kind, lr, momentum, beta1, beta2, eps, weight_decay, grad_scale, 1.0f, 1.0f};
    optim_bias_corrections(s, t);
    optim_update_range(s, params, grad, m, v, blockIdx.x * THREADS + threadIdx.x, n, gridDim.x * THREADS);
    // Every block read the step count before taking its ticket, so the last one may advance it.
    if (last_block_to_finish(ticket) && threadIdx.x == 0) {
        *step = t;
        *ticket = 0;
    }
}

// Moves the device-side sample cursor past the steps just run.
extern "C" __global__ void mnist_advance(unsigned* cursor, unsigned samples) { *cursor += samples; }
