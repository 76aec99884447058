// Hidden-layer activations and their slopes, shared by every fused pipeline (CPU twin:
// src/cpu.rs `Activation`). The activation is a kernel argument, not a template: the pipelines pick it
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
