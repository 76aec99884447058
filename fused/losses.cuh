// Losses and their gradients, shared by every fused pipeline (CPU twin: src/ops/losses.rs).
//
//   squared_error   (y − t)² and ∂/∂y scaled by the caller (2/B for a batch mean): xor, sales.
//   softmax_xent    −log softmax(logits)[y] over C logits held in registers, leaving (p − onehot)·scale
//                   in place and the first argmax: the MNIST classifier's output layer.
//   SoftmaxStat     the softmax normaliser of a set of logits as (max, Σ exp(x − max)), so partial sets
//                   computed by different warps or blocks combine exactly without a second pass over
//                   the logits: the text model's output layer, whose V logits are spread over the GPU.
#pragma once
#include "common.cuh"

// Returns (y − t)²; dy = scale·(y − t).
__device__ __forceinline__ float squared_error(float y, float t, float scale, float& dy) {
    const float err = y - t;
    dy = scale * err;
    return err * err;
}

// Softmax cross-entropy of logit[0..C) against class y. Returns max + log Σexp − logit[y]; logit becomes
// (softmax − onehot(y))·scale; best is the first maximum, as on the CPU.
template <int C>
__device__ __forceinline__ float softmax_xent(float (&logit)[C], int y, float scale, int& best) {
    float max = NEG_INF, target = 0.0f;
    best = 0;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        if (logit[c] > max) {
            max = logit[c];
            best = c;
        }
        if (c == y) target = logit[c];
    }
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        logit[c] = expf(logit[c] - max);
        sum += logit[c];
    }
    const float inv_sum = 1.0f / sum;
#pragma unroll
    for (int c = 0; c < C; ++c) logit[c] = (logit[c] * inv_sum - (c == y ? 1.0f : 0.0f)) * scale;
    return max + logf(sum) - target;
}

// Softmax normaliser of a set of logits kept as (max, Σ exp(x − max)), so partial sets computed by
// different warps or blocks combine exactly without a second pass over the logits.
struct SoftmaxStat {
    float max;
    float sum;
};

__device__ __forceinline__ SoftmaxStat softmax_stat_empty() { return {NEG_INF, 0.0f}; }

__device__ __forceinline__ SoftmaxStat softmax_merge(SoftmaxStat a, SoftmaxStat b) {
    const float m = fmaxf(a.max, b.max);
    if (m == NEG_INF) return a;
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ __forceinline__ SoftmaxStat softmax_push(SoftmaxStat a, float logit) {
    return softmax_merge(a, {logit, 1.0f});
}

__device__ __forceinline__ SoftmaxStat warp_softmax_merge(SoftmaxStat s) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        SoftmaxStat o = {__shfl_xor_sync(FULL_MASK, s.max, offset), __shfl_xor_sync(FULL_MASK, s.sum, offset)};
        s = softmax_merge(s, o);
    }
    return s;
}

__device__ __forceinline__ SoftmaxStat block_softmax_merge(SoftmaxStat s, SoftmaxStat* scratch) {
    return block_combine(s, scratch, softmax_stat_empty(), [](SoftmaxStat x) { return warp_softmax_merge(x); });
}
