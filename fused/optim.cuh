// The optimizer update, shared by every fused pipeline (CPU twin: src/ops/optim.rs `update`, same order of
// operations as PyTorch's): per parameter, with g the gradient of the mean batch loss,
//
//   clip          g ← grad_scale·g      (grad_scale = min(1, clip / ‖g‖₂), computed by the caller)
//   weight decay  g ← g + wd·θ          (L2 added to the gradient; all but adamw)
//   sgd           θ ← θ − lr·g
//   momentum      m ← μ·m + g;  θ ← θ − lr·m
//   adam          m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;  θ ← θ − lr·(m/bias1) / (√(v/bias2) + ε)
//   adamw         θ ← θ·(1 − lr·wd), then adam's update with the clipped g (decoupled weight decay)
//
// It is one element's update so a pipeline can fuse it where its gradient is formed (the sales step keeps
// gradient, parameters and moments in one block's registers) or run it as its own grid-stride pass
// (`optim_update_range`, the MNIST update kernel). The step's scalars — kind, clip factor, Adam's bias
// corrections 1 − βᵗ — are computed once per step by the caller.
#pragma once
#include "common.cuh"

constexpr int OPTIM_SGD = 0, OPTIM_MOMENTUM = 1, OPTIM_ADAM = 2, OPTIM_ADAMW = 3;

struct OptimStep {
    int kind;  // OPTIM_*
    float lr, momentum, beta1, beta2, eps, weight_decay;
    float grad_scale;    // clip factor, 1 when not clipping
    float bias1, bias2;  // 1 − β1ᵗ, 1 − β2ᵗ
};

// The optimizer's settings as a kernel takes them, a struct passed by value (mirrored by `OptimSettings`
// in src/device/kernel_struct.rs). Not the rate: a schedule changes it every step, so a kernel reads it
// from a buffer or takes it beside these.
struct OptimSettings {
    int kind;  // OPTIM_*
    float momentum;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
    float clip_norm;  // the largest gradient norm a step applies, 0 for no clipping
};

// A step at rate lr, before its clip factor and bias corrections.
__device__ __forceinline__ OptimStep optim_step(const OptimSettings& o, float lr) {
    return OptimStep{o.kind, lr, o.momentum, o.beta1, o.beta2, o.eps, o.weight_decay, 1.0f, 1.0f, 1.0f};
}

// Adam's bias corrections at step t (1-based), in double as the CPU twin computes them.
__device__ __forceinline__ void optim_bias_corrections(OptimStep& s, unsigned t) {
    s.bias1 = (float)(1.0 - pow((double)s.beta1, (double)t));
    s.bias2 = (float)(1.0 - pow((double)s.beta2, (double)t));
}

// θ after one step from gradient g; m and v are the element's optimizer state (unused ones untouched).
__device__ __forceinline__ float optim_update(const OptimStep& s, float theta, float g, float& m, float& v) {
    if (s.kind == OPTIM_ADAMW) {
        g = s.grad_scale * g;
        theta *= 1.0f - s.lr * s.weight_decay;
    } else {
        g = s.grad_scale * g + s.weight_decay * theta;
    }
    switch (s.kind) {
        case OPTIM_SGD: return theta - s.lr * g;
        case OPTIM_MOMENTUM:
            m = s.momentum * m + g;
            return theta - s.lr * m;
        case OPTIM_ADAM:
        case OPTIM_ADAMW:
        default:
            m = s.beta1 * m + (1.0f - s.beta1) * g;
            v = s.beta2 * v + (1.0f - s.beta2) * g * g;
            return theta - s.lr * (m / s.bias1) / (sqrtf(v / s.bias2) + s.eps);
    }
}

// Elements [begin, end) with stride `stride` (a grid- or block-stride loop over flat vectors). m and v may
// be null for an optimizer that does not read them; params_bf16, when given, receives each new parameter
// rounded to bf16 (the copy a bf16 forward pass reads).
__device__ __forceinline__ void optim_update_range(const OptimStep& s, float* __restrict__ params,
                                                   const float* __restrict__ grad, float* __restrict__ m,
                                                   float* __restrict__ v, int begin, int end, int stride,
                                                   bf16* __restrict__ params_bf16 = nullptr) {
    float unused_m = 0.0f, unused_v = 0.0f;
    for (int i = begin; i < end; i += stride) {
        float& mi = m ? m[i] : unused_m;
        float& vi = v ? v[i] : unused_v;
        const float theta = optim_update(s, params[i], grad[i], mi, vi);
        params[i] = theta;
        if (params_bf16) params_bf16[i] = to_bf16(theta);
    }
}
