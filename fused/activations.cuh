// Hidden-layer activations and their slopes, shared by every fused pipeline (CPU twin:
// src/ops/activations.rs). The activation is a kernel argument, not a template: the pipelines pick it
// per run, and the switch costs a uniform branch.
#pragma once

constexpr int ACT_RELU = 0, ACT_SIGMOID = 1, ACT_TANH = 2;

__device__ __forceinline__ float activate(int activation, float z) {
    switch (activation) {
        case ACT_SIGMOID: return 1.0f / (1.0f + expf(-z));
        case ACT_TANH: return tanhf(z);
        case ACT_RELU:
        default: return fmaxf(z, 0.0f);
    }
}

// act′(z) from a = act(z) (for ReLU, a > 0 exactly when z > 0).
__device__ __forceinline__ float activation_slope(int activation, float a) {
    switch (activation) {
        case ACT_SIGMOID: return a * (1.0f - a);
        case ACT_TANH: return 1.0f - a * a;
        case ACT_RELU:
        default: return a > 0.0f ? 1.0f : 0.0f;
    }
}

// GELU in PyTorch's tanh form (nn.GELU(approximate="tanh")): the Transformer's FFN, which keeps the
// pre-activation and takes the slope from it.
constexpr float GELU_K = 0.7978845608028654f;  // √(2/π)
constexpr float GELU_C = 0.044715f;

__device__ __forceinline__ float gelu(float z) {
    return 0.5f * z * (1.0f + tanhf(GELU_K * (z + GELU_C * z * z * z)));
}

__device__ __forceinline__ float gelu_slope(float z) {
    const float z2 = z * z, th = tanhf(GELU_K * (z + GELU_C * z * z2));
    return 0.5f * (1.0f + th) + 0.5f * z * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_C * z2);
}
