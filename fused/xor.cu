// XOR trained in one launch (CPU twin: src/xor/model.rs).
//
//   z = W1·x + b1 (H)   a = act(z)   y = w2·a + b2   loss = mean over the four points of (y − t)²
//
// Full-batch SGD on the four XOR points. An epoch is a few dozen FLOPs per hidden unit, so what it costs
// is latency: as three kernels, or three CUDA-graph nodes (~0.9 µs each), 5000 epochs would spend ~13 ms
// launching microseconds of math. So one block runs every epoch of the run. Thread j keeps hidden unit
// j's parameters in registers; the four outputs are block sums (a warp butterfly, which leaves the same
// bits in every lane, then with more than 32 units one pass over the warps' partials in a fixed order,
// so every thread holds identical y and b2); nothing goes to memory but the recorded losses and, at the
// end, the parameters.
//
//   xor_train  grid 1, block 32·⌈H/32⌉ threads, H ≤ 1024. Epoch k steps at rates[k]: the learning-rate
//              schedule, one rate per epoch, computed on the host as the CPU reference's (so both step at
//              the same rates to the bit); it is loaded at the epoch's start and nothing before the update
//              waits for it. Every `report_every` epochs thread 0 writes that epoch's loss, taken before its
//              update, as the CPU reference records it.
#include "activations.cuh"
#include "common.cuh"
#include "losses.cuh"

extern "C" __global__ void __launch_bounds__(1024)
xor_train(float* __restrict__ w1, float* __restrict__ b1, float* __restrict__ w2, float* __restrict__ b2, int H,
          int activation, int epochs, const float* __restrict__ rates, int report_every,
          float* __restrict__ losses) {
    __shared__ float warp_y[32][4];
    const float X0[4] = {0.0f, 0.0f, 1.0f, 1.0f}, X1[4] = {0.0f, 1.0f, 0.0f, 1.0f}, T[4] = {0.0f, 1.0f, 1.0f, 0.0f};
    const int j = threadIdx.x, lane = j % 32, warp = j / 32, warps = blockDim.x / 32;
    const bool unit = j < H;
    // Threads past H hold a unit whose output weight stays 0, so they add nothing to y.
    float u0 = unit ? w1[2 * j] : 0.0f, u1 = unit ? w1[2 * j + 1] : 0.0f, bias = unit ? b1[j] : 0.0f;
    float v = unit ? w2[j] : 0.0f, c = *b2;
    for (int epoch = 0; epoch < epochs; ++epoch) {
        const float lr = rates[epoch];
        float a[4], y[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            a[k] = activate(activation, u0 * X0[k] + u1 * X1[k] + bias);
            y[k] = warp_sum(v * a[k]);
        }
        if (warps > 1) {
            if (lane == 0)
#pragma unroll
                for (int k = 0; k < 4; ++k) warp_y[warp][k] = y[k];
            __syncthreads();
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                float sum = 0.0f;
                for (int w = 0; w < warps; ++w) sum += warp_y[w][k];
                y[k] = sum;
            }
            __syncthreads();  // warp_y is written again next epoch
        }
        // ∂loss/∂y = 2(y − t)/4 per point.
        float dy[4], loss = 0.0f, gc = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            loss += squared_error(y[k] + c, T[k], 0.5f, dy[k]);
            gc += dy[k];
        }
        if (j == 0 && epoch % report_every == 0) losses[epoch / report_every] = 0.25f * loss;
        float g0 = 0.0f, g1 = 0.0f, gb = 0.0f, gv = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            gv += dy[k] * a[k];
            const float dz = dy[k] * v * activation_slope(activation, a[k]);
            g0 += dz * X0[k];
            g1 += dz * X1[k];
            gb += dz;
        }
        // A padding unit's activation need not be 0 (sigmoid(0) = ½): it must keep v = 0 to add nothing.
        if (unit) {
            u0 -= lr * g0;
            u1 -= lr * g1;
            bias -= lr * gb;
            v -= lr * gv;
        }
        c -= lr * gc;
    }
    if (unit) {
        w1[2 * j] = u0;
        w1[2 * j + 1] = u1;
        b1[j] = bias;
        w2[j] = v;
    }
    if (j == 0) *b2 = c;
}
