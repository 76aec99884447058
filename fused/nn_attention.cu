// `nn`'s causal self-attention on packed [q | k | v] rows (nn::causal_self_attention; CPU twin:
// src/ops/attention.rs through src/nn/attention.rs; launch layer: src/nn/cuda/attention.rs): the
// Transformer's attention kernels (attention.cuh in fp32, flash_attention.cuh in bf16) over nn's tensors,
// so a model written with nn attends as fast as the hand-written Transformer, without splitting q, k, v
// into heads and back (six copies a layer) or keeping the T×T probabilities.
//
//   nn_attention_forward, nn_attention_backward   fp32 on the CUDA cores (attention.cuh)
//   nn_flash_forward, nn_flash_backward           bf16 on the tensor cores (flash_attention.cuh), for
//                                                 Precision::Bf16 and head sizes that are a multiple of 16
//
// qkv is [B, T, 3C] (head h's q at columns h·HS of the first third, k and v of the others), y and dy
// [B, T, C] with the heads side by side (PyTorch's y.transpose(1, 2).view(B, T, C)), dqkv like qkv. lse
// keeps one float per (sequence, head, position) for the backward. Dropout on the probabilities
// (nanoGPT's attn_dropout) by the site's seed and a step word in device memory; threshold 0: none.
// Sizes compiled in: NN_T (the sequence length) and NN_HS (the head size); C is an argument.
#include "attention.cuh"
#include "common.cuh"
#include "dependent_launch.cuh"
#include "dropout.cuh"
#include "flash_attention.cuh"

#ifndef NN_T
#define NN_T 64
#endif
#ifndef NN_HS
#define NN_HS 16
#endif
constexpr int T = NN_T, HS = NN_HS;

// Grid B·heads: block (b, h) over the rows of sequence b. Shared memory: AttentionSizes' forward floats.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_attention_forward(const DropoutArgs dropout,
                     const float* __restrict__ qkv, float* __restrict__ y, float* __restrict__ lse, int heads, int C) {
    begin_after_previous_grid();
    extern __shared__ float smem[];
    const int b = blockIdx.x / heads, h = blockIdx.x % heads;
    const SiteDropout drop(dropout);
    attention_forward<T, HS>(qkv + (size_t)b * T * 3 * C, C, h, T, y + (size_t)b * T * C,
                             lse + ((size_t)b * heads + h) * T, smem, drop.key, drop.threshold, drop.scale,
                             (unsigned)blockIdx.x * T * T);
}

// Grid B·heads·CHUNKS: block (b, h, key chunk); the last chunk of (b, h) to finish adds the chunks' dq
// shares in order. dq_part: CHUNKS·B·T·C floats; tickets: one zeroed word per (b, h), zeroed again after.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_attention_backward(const DropoutArgs dropout,
                      const float* __restrict__ qkv, const float* __restrict__ y, const float* __restrict__ dy,
                      const float* __restrict__ lse, float* __restrict__ dqkv, int heads, int C, int rows,
                      float* __restrict__ dq_part, unsigned* __restrict__ tickets) {
    begin_after_previous_grid();
    extern __shared__ float smem[];
    constexpr int CHUNKS = AttentionSizes<T, HS>::CHUNKS;
    const int chunk = blockIdx.x % CHUNKS, bh = blockIdx.x / CHUNKS, b = bh / heads, h = bh % heads;
    const size_t first = (size_t)b * T, part_stride = (size_t)rows * C;
    float* part = dq_part + ((size_t)bh * T) * HS;
    const SiteDropout drop(dropout);
    attention_backward_keys<T, HS>(qkv + first * 3 * C, y + first * C, dy + first * C, lse + (size_t)bh * T, C, h, T,
                                   chunk, dqkv + first * 3 * C, part + chunk * part_stride, smem, drop.key,
                                   drop.threshold, drop.scale, (unsigned)bh * T * T);
    if (!last_block_to_finish(&tickets[bh], CHUNKS)) return;
    attention_backward_dq<T, HS>(part, part_stride, C, h, T, dqkv + first * 3 * C);
    if (threadIdx.x == 0) tickets[bh] = 0;
}

// Grid (B·heads, FlashSizes<T, HS>::BLOCKS), FORWARD_BYTES of shared memory: block (b·heads + h, i) takes
// query block BLOCKS − 1 − i (the longest first).
extern "C" __global__ void __launch_bounds__(THREADS, 2)
nn_flash_forward(const DropoutArgs dropout,
                 const float* __restrict__ qkv, float* __restrict__ y, float* __restrict__ lse, int heads, int C) {
    begin_after_previous_grid();
    using S = FlashSizes<T, HS>;
    extern __shared__ __align__(16) float flash_smem[];
    if constexpr (S::SUPPORTED) {
        const int bh = blockIdx.x, b = bh / heads, h = bh % heads;
        const SiteDropout drop(dropout);
        flash_attention_forward<T, HS>(qkv + (size_t)b * T * 3 * C, C, h, bh, S::BLOCKS - 1 - blockIdx.y, T,
                                       y + (size_t)b * T * C, (bf16*)nullptr, lse + (size_t)bh * T, drop.key,
                                       drop.threshold, drop.scale, flash_smem);
    } else {
        __trap();  // the launch layer takes the fp32 kernels for head sizes that are not a multiple of 16
    }
}

// Grid (B·heads, 2·FlashSizes<T, HS>::BLOCKS), BACKWARD_BYTES of shared memory: block (b·heads + h, i)
// writes dk, dv of key block i / 2 when i is even, dq of query block BLOCKS − 1 − i / 2 when odd.
extern "C" __global__ void __launch_bounds__(THREADS)
nn_flash_backward(const DropoutArgs dropout,
                  const float* __restrict__ qkv, const float* __restrict__ y, const float* __restrict__ dy,
                  const float* __restrict__ lse, float* __restrict__ dqkv, int heads, int C) {
    begin_after_previous_grid();
    using S = FlashSizes<T, HS>;
    extern __shared__ __align__(16) float flash_smem[];
    if constexpr (S::SUPPORTED) {
        const int bh = blockIdx.x, b = bh / heads, h = bh % heads, i = blockIdx.y;
        const size_t rows = (size_t)b * T;
        const SiteDropout drop(dropout);
        if (i % 2 == 0)
            flash_attention_backward_keys<T, HS>(qkv + rows * 3 * C, y + rows * C, dy + rows * C, lse + (size_t)bh * T,
                                                 C, h, bh, i / 2, T, dqkv + rows * 3 * C, (bf16*)nullptr, drop.key,
                                                 drop.threshold, drop.scale, flash_smem);
        else
            flash_attention_backward_queries<T, HS>(qkv + rows * 3 * C, y + rows * C, dy + rows * C,
                                                    lse + (size_t)bh * T, C, h, bh, S::BLOCKS - 1 - i / 2, T,
                                                    dqkv + rows * 3 * C, (bf16*)nullptr, drop.key, drop.threshold,
                                                    drop.scale, flash_smem);
    } else {
        __trap();
    }
}
