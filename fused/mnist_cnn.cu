// The MNIST CNN's training step as three fused kernels (CPU twin: src/mnist/cnn.rs, src/ops/optim.rs):
//
//   conv3x3(1→C1) → ReLU → maxpool2 → conv3x3(C1→C2) → ReLU → maxpool2 → flatten → FC → ReLU → FC → softmax
//
// A step of B = 64 images is ~22 MFLOP forward and twice that backward: latency, not FLOPs, is the cost,
// so each kernel does one whole phase and keeps what it works on in shared memory.
//
//   1. cnn_forward   a block per image: the image, both pooled feature maps, the flattened features and
//                    the hidden layer stay in shared memory. conv + ReLU + pool are one pass (a thread
//                    forms the four conv outputs of a pooling window, keeps the first largest after ReLU
//                    and its position); then FC1 (a warp per hidden unit, lanes over the inputs), FC2,
//                    softmax and the loss (losses.cuh). Saved for the backward pass: p1, arg1, f, arg2, h
//                    and dlogits = (p − onehot)/B.
//   2. cnn_backward  a block per image: dh, df = Wfᵀ·dh, df routed to the pooling winners (dz2, masked by
//                    ReLU: a winner > 0 had z > 0), dp1 = conv2ᵀ(dz2), routed the same way into dz1.
//   3. cnn_update    blocks own parameters: SLICES blocks per conv channel, each summing the channel's
//                    weight and bias gradients (9 + 1 for conv1, 72 + 1 for conv2) over its share of the
//                    images, the channel's last one to finish adding the shares in slice order; and one
//                    thread per FC weight or bias (a sum over the batch). Every gradient is a sum in a fixed order, with
//                    fixed block-wide reductions: no float atomics, so a run repeats to the bit. Each block
//                    then applies optim.cuh's update to its parameters; with clipping, blocks only write
//                    the gradient and their Σg², and the last block (ticket) scales and updates all.
//                    The last block also advances the step count and adds the batch's losses, in image
//                    order, to the running sum.
//
// cnn_forward, cnn_evaluate and cnn_backward run blocks of CNN_IMAGE_THREADS (1024) threads: with a block
// per image, a step of 64 images fills 64 of the 132 SMs, so each block needs all the threads an SM holds
// to hide the shared-memory latency of the conv loops (at 256 threads a block kept 8 warps per SM busy and
// the forward pass took 47 µs; at 1024, conv2's 784 pooled outputs are one per thread). cnn_update keeps
// THREADS (256).
//
// Sizes are compiled in (-DCNN_SIDE, -DCNN_C1, -DCNN_C2, -DCNN_FC, -DCNN_CLASSES). A step's images are
// order[offset + b], b < B, and its learning rate the step's entry of a rates buffer: a CUDA graph of an
// epoch's steps bakes in each offset and rate address and replays over any order and rates (the learning-
// rate schedule) the host writes into the same buffers.
#include "common.cuh"
#include "losses.cuh"
#include "optim.cuh"

#ifndef CNN_SIDE
#define CNN_SIDE 28
#endif
#ifndef CNN_C1
#define CNN_C1 8
#endif
#ifndef CNN_C2
#define CNN_C2 16
#endif
#ifndef CNN_FC
#define CNN_FC 64
#endif
#ifndef CNN_CLASSES
#define CNN_CLASSES 10
#endif
#ifndef CNN_IMAGE_THREADS
#define CNN_IMAGE_THREADS 1024
#endif
constexpr int IMAGE_THREADS = CNN_IMAGE_THREADS, IMAGE_WARPS = IMAGE_THREADS / 32;

constexpr int S1 = CNN_SIDE, S2 = S1 / 2, S3 = S1 / 4;
constexpr int C1 = CNN_C1, C2 = CNN_C2, FC = CNN_FC, K = CNN_CLASSES;
constexpr int PIX = S1 * S1;
constexpr int P1 = C1 * S2 * S2;   // pooled layer-1 maps
constexpr int Z2 = C2 * S2 * S2;   // layer-2 pre-activations
constexpr int FLAT = C2 * S3 * S3; // flattened features
// Parameter offsets in the flat vector (PyTorch's state_dict order).
constexpr int W1_AT = 0, B1_AT = W1_AT + C1 * 9, W2_AT = B1_AT + C1, B2_AT = W2_AT + C2 * C1 * 9, WF_AT = B2_AT + C2,
              BF_AT = WF_AT + FC * FLAT, WO_AT = BF_AT + FC, BO_AT = WO_AT + K * FC, PARAMS = BO_AT + K;
// cnn_update's blocks: SLICES per conv1 channel and per conv2 channel (each over its share of the batch's
// images), then the FC parameters a thread each.
constexpr int SLICES = 32;
// A conv block stages STAGE images at a time in shared memory (the channel's gradient and its input), so
// the sums read shared memory, not a chain of global loads.
constexpr int STAGE = 2;
constexpr int STAGE_FLOATS = STAGE * (2 * PIX > S2 * S2 + P1 ? 2 * PIX : S2 * S2 + P1);
constexpr int CONV_BLOCKS = (C1 + C2) * SLICES;
constexpr int FC_PARAMS = PARAMS - WF_AT;
constexpr int UPDATE_BLOCKS = CONV_BLOCKS + (FC_PARAMS + THREADS - 1) / THREADS;
// Gradients a conv block sums: conv2's C1·9 weights and bias (conv1's 9 + 1 are fewer, never more).
constexpr int CONV_SUMS = C1 * 9 + 1 > 10 ? C1 * 9 + 1 : 10;

// Saved per image by cnn_forward (floats, then bytes).
struct Saved {
    float* p1;       // [B][P1]
    unsigned char* arg1;
    float* f;        // [B][FLAT]
    unsigned char* arg2;
    float* h;        // [B][FC]
    float* dlogits;  // [B][K]
    float* loss;     // [B]
};

// conv3x3 (pad 1) output (c, y, x) of `in` (channels × side × side), weights w [c][ci][3][3] at `w`.
template <int CHANNELS, int SIDE>
__device__ __forceinline__ float conv_at(const float* in, const float* w, float bias, int c, int y, int x) {
    float z = bias;
#pragma unroll 1
    for (int ci = 0; ci < CHANNELS; ++ci) {
#pragma unroll
        for (int ky = 0; ky < 3; ++ky) {
            const int yy = y + ky - 1;
            if (yy < 0 || yy >= SIDE) continue;
#pragma unroll
            for (int kx = 0; kx < 3; ++kx) {
                const int xx = x + kx - 1;
                if (xx < 0 || xx >= SIDE) continue;
                z = fmaf(w[((c * CHANNELS + ci) * 3 + ky) * 3 + kx], in[(ci * SIDE + yy) * SIDE + xx], z);
            }
        }
    }
    return z;
}

// Every pooled output of conv3x3 + ReLU + maxpool2 of `in`: the first largest of each window after ReLU,
// and its position (0–3 in the order (0,0), (0,1), (1,0), (1,1)).
template <int CIN, int COUT, int SIDE>
__device__ __forceinline__ void conv_relu_pool(const float* in, const float* w, const float* b, float* pooled,
                                               unsigned char* arg) {
    constexpr int HALF = SIDE / 2;
    for (int o = threadIdx.x; o < COUT * HALF * HALF; o += IMAGE_THREADS) {
        const int c = o / (HALF * HALF), i = (o / HALF) % HALF, j = o % HALF;
        float best = NEG_INF;
        int which = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float a = fmaxf(conv_at<CIN, SIDE>(in, w, b[c], c, 2 * i + k / 2, 2 * j + k % 2), 0.0f);
            if (a > best) {
                best = a;
                which = k;
            }
        }
        pooled[o] = best;
        arg[o] = (unsigned char)which;
    }
}

// Dynamic shared memory: x [PIX], w (conv1 and conv2 weights and biases) [W2_AT + C2*C1*9 + C2], p1 [P1],
// f [FLAT], h [FC], then the argmax bytes [P1 + FLAT].
constexpr int FORWARD_SHARED_FLOATS = PIX + B2_AT + C2 + P1 + FLAT + FC + (P1 + FLAT + 3) / 4;

// Grid B (TRAIN) or any (evaluation over images [first, first + count) in order). TRAIN: images
// order[offset + b]; saves what the backward pass needs. Evaluation: loss[b] and predicted[b] only.
template <bool TRAIN>
__device__ void forward_image(const float* __restrict__ params, const float* __restrict__ image, int label,
                              float inv_batch, Saved saved, int b, unsigned char* predicted) {
    extern __shared__ float smem[];
    float* x = smem;
    float* w = x + PIX;  // conv weights and biases, params[0 .. B2_AT + C2)
    float* p1 = w + B2_AT + C2;
    float* f = p1 + P1;
    float* h = f + FLAT;
    unsigned char* arg1 = reinterpret_cast<unsigned char*>(h + FC);
    unsigned char* arg2 = arg1 + P1;
    for (int i = threadIdx.x; i < PIX; i += IMAGE_THREADS) x[i] = image[i];
    for (int i = threadIdx.x; i < B2_AT + C2; i += IMAGE_THREADS) w[i] = params[i];
    __syncthreads();
    conv_relu_pool<1, C1, S1>(x, w + W1_AT, w + B1_AT, p1, arg1);
    __syncthreads();
    conv_relu_pool<C1, C2, S2>(p1, w + W2_AT, w + B2_AT, f, arg2);
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int j = warp; j < FC; j += IMAGE_WARPS) {
        const float* row = params + WF_AT + (size_t)j * FLAT;
        float z = 0.0f;
        for (int i = lane; i < FLAT; i += 32) z = fmaf(row[i], f[i], z);
        z = warp_sum(z) + params[BF_AT + j];
        if (lane == 0) h[j] = fmaxf(z, 0.0f);
    }
    __syncthreads();
    if (warp == 0) {
        float logit[K];
#pragma unroll
        for (int k = 0; k < K; ++k) {
            float z = 0.0f;
            for (int j = lane; j < FC; j += 32) z = fmaf(params[WO_AT + k * FC + j], h[j], z);
            logit[k] = warp_sum(z) + params[BO_AT + k];
        }
        int best;
        const float loss = softmax_xent(logit, label, inv_batch, best);
        if (lane == 0) {
            saved.loss[b] = loss;
            if (!TRAIN) predicted[b] = (unsigned char)best;
        }
        if (TRAIN && lane < K) {
#pragma unroll
            for (int k = 0; k < K; ++k)
                if (k == lane) saved.dlogits[b * K + k] = logit[k];
        }
    }
    if (TRAIN) {
        for (int i = threadIdx.x; i < P1; i += IMAGE_THREADS) {
            saved.p1[(size_t)b * P1 + i] = p1[i];
            saved.arg1[(size_t)b * P1 + i] = arg1[i];
        }
        for (int i = threadIdx.x; i < FLAT; i += IMAGE_THREADS) {
            saved.f[(size_t)b * FLAT + i] = f[i];
            saved.arg2[(size_t)b * FLAT + i] = arg2[i];
        }
        for (int i = threadIdx.x; i < FC; i += IMAGE_THREADS) saved.h[b * FC + i] = h[i];
    }
}

// The arguments of cnn_forward, cnn_evaluate and cnn_backward, one struct passed by value (mirrored by
// `CnnArgs` in src/mnist/cnn_gpu.rs).
struct CnnArgs {
    const float* params;
    const float* images;  // a split: the training split for a step, the test split for cnn_evaluate
    const unsigned char* labels;
    const unsigned* order;  // a step's images are order[offset + b], b < batch
    int offset;             // cnn_evaluate: its first image, in file order
    int batch;
    // What a step keeps per image between its kernels.
    float* p1;
    unsigned char* arg1;
    float* f;
    unsigned char* arg2;
    float* h;
    float* dlogits;
    float* loss;
    float* dh;
    float* dz2;
    float* dz1;
    unsigned char* predicted;
};

// Each kernel below hands its arguments to a function of restrict-qualified parameters, which the compiler
// reads as "no other pointer reaches this memory" (a struct's fields carry no such promise). cnn_update
// keeps its buffers as parameters of its own: only there does a kernel parameter's restrict let its
// read-only loads take the non-coherent path (ld.global.nc), and an inlined function's does not.

__device__ __forceinline__ void forward_step(const float* __restrict__ params, const float* __restrict__ images,
                                             const unsigned char* __restrict__ labels,
                                             const unsigned* __restrict__ order, int offset, int B, Saved saved) {
    const int b = blockIdx.x;
    const unsigned sample = order[offset + b];
    forward_image<true>(params, images + (size_t)sample * PIX, labels[sample], 1.0f / B, saved, b, nullptr);
}

extern "C" __global__ void __launch_bounds__(IMAGE_THREADS) cnn_forward(const CnnArgs a) {
    forward_step(a.params, a.images, a.labels, a.order, a.offset, a.batch,
                 Saved{a.p1, a.arg1, a.f, a.arg2, a.h, a.dlogits, a.loss});
}

__device__ __forceinline__ void evaluate_image(const float* __restrict__ params, const float* __restrict__ images,
                                               const unsigned char* __restrict__ labels, int first, float* loss,
                                               unsigned char* predicted) {
    const int b = blockIdx.x, sample = first + b;
    Saved saved{};
    saved.loss = loss;
    forward_image<false>(params, images + (size_t)sample * PIX, labels[sample], 1.0f, saved, b, predicted);
}

// Images [offset + blockIdx.x] in file order: loss[blockIdx.x] and predicted[blockIdx.x].
extern "C" __global__ void __launch_bounds__(IMAGE_THREADS) cnn_evaluate(const CnnArgs a) {
    evaluate_image(a.params, a.images, a.labels, a.offset, a.loss, a.predicted);
}

// Dynamic shared memory: dh [FC], df [FLAT], dz2 [Z2], w2 [C2*C1*9], the saved f and p1 of the image.
constexpr int BACKWARD_SHARED_FLOATS = FC + FLAT + Z2 + C2 * C1 * 9 + FLAT + P1;

// The activation gradients of image b = blockIdx.x: dh [B][FC], dz2 [B][Z2], dz1 [B][C1·S1·S1].
__device__ __forceinline__ void backward_image(const float* __restrict__ params,
                                               const float* __restrict__ p1_saved,
                                               const unsigned char* __restrict__ arg1,
                                               const float* __restrict__ f_saved,
                                               const unsigned char* __restrict__ arg2, const float* __restrict__ h,
                                               const float* __restrict__ dlogits, float* __restrict__ dh_out,
                                               float* __restrict__ dz2_out, float* __restrict__ dz1_out) {
    extern __shared__ float smem[];
    float* dh = smem;
    float* df = dh + FC;
    float* dz2 = df + FLAT;
    float* w2 = dz2 + Z2;
    float* f = w2 + C2 * C1 * 9;
    float* p1 = f + FLAT;
    const int b = blockIdx.x;
    for (int i = threadIdx.x; i < C2 * C1 * 9; i += IMAGE_THREADS) w2[i] = params[W2_AT + i];
    for (int i = threadIdx.x; i < FLAT; i += IMAGE_THREADS) f[i] = f_saved[(size_t)b * FLAT + i];
    for (int i = threadIdx.x; i < P1; i += IMAGE_THREADS) p1[i] = p1_saved[(size_t)b * P1 + i];
    for (int i = threadIdx.x; i < Z2; i += IMAGE_THREADS) dz2[i] = 0.0f;
    for (int j = threadIdx.x; j < FC; j += IMAGE_THREADS) {
        float g = 0.0f;
#pragma unroll
        for (int k = 0; k < K; ++k) g = fmaf(params[WO_AT + k * FC + j], dlogits[b * K + k], g);
        g = h[b * FC + j] > 0.0f ? g : 0.0f;
        dh[j] = g;
        dh_out[b * FC + j] = g;
    }
    __syncthreads();
    // df[i] = Σ_j Wf[j][i]·dh[j], routed to its pooling winner when that was positive.
    for (int i = threadIdx.x; i < FLAT; i += IMAGE_THREADS) {
        float g = 0.0f;
        for (int j = 0; j < FC; ++j) g = fmaf(params[WF_AT + (size_t)j * FLAT + i], dh[j], g);
        df[i] = g;
        if (f[i] > 0.0f) {
            const int c = i / (S3 * S3), y = (i / S3) % S3, x = i % S3, k = arg2[(size_t)b * FLAT + i];
            dz2[(c * S2 + 2 * y + k / 2) * S2 + 2 * x + k % 2] = g;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < Z2; i += IMAGE_THREADS) dz2_out[(size_t)b * Z2 + i] = dz2[i];
    // dp1 = conv2ᵀ(dz2) at each pooled layer-1 element, routed to its winner in dz1 when that was positive.
    float* dz1 = dz1_out + (size_t)b * C1 * PIX;
    for (int i = threadIdx.x; i < C1 * PIX; i += IMAGE_THREADS) dz1[i] = 0.0f;
    __syncthreads();
    for (int o = threadIdx.x; o < P1; o += IMAGE_THREADS) {
        if (!(p1[o] > 0.0f)) continue;
        const int ci = o / (S2 * S2), y = (o / S2) % S2, x = o % S2;
        float g = 0.0f;
        for (int c = 0; c < C2; ++c) {
#pragma unroll
            for (int ky = 0; ky < 3; ++ky) {
                const int yy = y - ky + 1;  // the output row whose window put this input at ky
                if (yy < 0 || yy >= S2) continue;
#pragma unroll
                for (int kx = 0; kx < 3; ++kx) {
                    const int xx = x - kx + 1;
                    if (xx < 0 || xx >= S2) continue;
                    g = fmaf(w2[((c * C1 + ci) * 3 + ky) * 3 + kx], dz2[(c * S2 + yy) * S2 + xx], g);
                }
            }
        }
        const int k = arg1[(size_t)b * P1 + o];
        dz1[(ci * S1 + 2 * y + k / 2) * S1 + 2 * x + k % 2] = g;
    }
}

// Grid B: image b's activation gradients.
extern "C" __global__ void __launch_bounds__(IMAGE_THREADS) cnn_backward(const CnnArgs a) {
    backward_image(a.params, a.p1, a.arg1, a.f, a.arg2, a.h, a.dlogits, a.dh, a.dz2, a.dz1);
}

// Block-wide sum of each of N per-thread values in a fixed order (warp butterflies, then the warps in
// order); the sums land in out[0..N) of shared memory. scratch: WARPS·N floats.
template <int N>
__device__ __forceinline__ void block_sums(float (&v)[N], float* scratch, float* out) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int n = 0; n < N; ++n) {
        const float s = warp_sum(v[n]);
        if (lane == 0) scratch[warp * N + n] = s;
    }
    __syncthreads();
    for (int n = threadIdx.x; n < N; n += THREADS) {
        float s = 0.0f;
        for (int w = 0; w < WARPS; ++w) s += scratch[w * N + n];
        out[n] = s;
    }
    __syncthreads();
}

// Grid UPDATE_BLOCKS. Writes the gradient of the batch's mean loss into grad (every element, every step)
// and applies the optimizer (see the header). images/order/offset: the step's images (conv1's input). lr:
// this step's entry of the epoch's learning rates (the schedule), which the host writes before each replay.
extern "C" __global__ void __launch_bounds__(THREADS)
cnn_update(const OptimSettings optim, float* __restrict__ params, float* __restrict__ grad, float* __restrict__ m,
           float* __restrict__ v, const float* __restrict__ images, const unsigned* __restrict__ order, int offset,
           int B, const float* __restrict__ p1, const float* __restrict__ f, const float* __restrict__ h,
           const float* __restrict__ dlogits, const float* __restrict__ dh, const float* __restrict__ dz2,
           const float* __restrict__ dz1, const float* __restrict__ loss, const float* __restrict__ lr,
           float* __restrict__ norm_partials, float* __restrict__ conv_partials,
           unsigned* __restrict__ channel_tickets, unsigned* __restrict__ step, unsigned* __restrict__ ticket,
           double* __restrict__ loss_sum) {
    __shared__ float scratch[THREADS * 10];
    __shared__ float staged[STAGE_FLOATS];
    __shared__ float sums[CONV_SUMS];
    __shared__ float square_sum;
    const unsigned t = *step + 1;
    OptimStep s = optim_step(optim, *lr);
    optim_bias_corrections(s, t);
    const float clip_norm = optim.clip_norm;
    const bool clip = clip_norm > 0.0f;
    float square = 0.0f;
    int block = blockIdx.x;
    if (block < CONV_BLOCKS) {
        // Channel `channel` (conv1's first, then conv2's) over the images of slice `slice`; the channel's
        // last slice to finish sums the slices' partials in slice order and updates its parameters.
        const int channel = block / SLICES, slice = block % SLICES;
        const int per = (B + SLICES - 1) / SLICES, first = slice * per, count = max(0, min(B, first + per) - first);
        const bool layer1 = channel < C1;
        // Each thread keeps 10 sums: a 3×3 kernel's weights and the bias. conv1: one kernel per channel,
        // summed over the block (block_sums). conv2: thread t serves input channel t % C1 (the bias from
        // ci = 0 only), and the threads of one ci are added in thread order.
        float acc[10] = {};
        if (layer1) {
            const int c = channel;
            float* gs = staged;              // dz1 of channel c, STAGE images
            float* xs = staged + STAGE * PIX;  // their input images
            for (int b0 = first; b0 < first + count; b0 += STAGE) {
                const int n = min(STAGE, first + count - b0);
                for (int e = threadIdx.x; e < n * PIX; e += THREADS) {
                    const int b = b0 + e / PIX, p = e % PIX;
                    gs[e] = dz1[((size_t)b * C1 + c) * PIX + p];
                    xs[e] = images[(size_t)order[offset + b] * PIX + p];
                }
                __syncthreads();
                for (int e = threadIdx.x; e < n * PIX; e += THREADS) {
                    const float g = gs[e];
                    if (g == 0.0f) continue;
                    const int y = (e / S1) % S1, x = e % S1;
                    const float* image = xs + (e / PIX) * PIX;
#pragma unroll
                    for (int ky = 0; ky < 3; ++ky) {
#pragma unroll
                        for (int kx = 0; kx < 3; ++kx) {
                            const int yy = y + ky - 1, xx = x + kx - 1;
                            if (yy >= 0 && yy < S1 && xx >= 0 && xx < S1) acc[ky * 3 + kx] = fmaf(g, image[yy * S1 + xx], acc[ky * 3 + kx]);
                        }
                    }
                    acc[9] += g;
                }
                __syncthreads();
            }
            block_sums(acc, scratch, sums);
        } else {
            const int c = channel - C1, ci = threadIdx.x % C1, lanes = THREADS / C1;
            float* gs = staged;                   // dz2 of channel c, STAGE images
            float* ins = staged + STAGE * S2 * S2;  // their p1
            for (int b0 = first; b0 < first + count; b0 += STAGE) {
                const int n = min(STAGE, first + count - b0);
                for (int e = threadIdx.x; e < n * S2 * S2; e += THREADS)
                    gs[e] = dz2[((size_t)(b0 + e / (S2 * S2)) * C2 + c) * S2 * S2 + e % (S2 * S2)];
                for (int e = threadIdx.x; e < n * P1; e += THREADS) ins[e] = p1[(size_t)b0 * P1 + e];
                __syncthreads();
                if (threadIdx.x < lanes * C1) {
                    for (int e = threadIdx.x / C1; e < n * S2 * S2; e += lanes) {
                        const float g = gs[e];
                        if (g == 0.0f) continue;
                        const int y = (e / S2) % S2, x = e % S2;
                        const float* in = ins + (e / (S2 * S2)) * P1 + ci * S2 * S2;
#pragma unroll
                        for (int ky = 0; ky < 3; ++ky) {
#pragma unroll
                            for (int kx = 0; kx < 3; ++kx) {
                                const int yy = y + ky - 1, xx = x + kx - 1;
                                if (yy >= 0 && yy < S2 && xx >= 0 && xx < S2) acc[ky * 3 + kx] = fmaf(g, in[yy * S2 + xx], acc[ky * 3 + kx]);
                            }
                        }
                        if (ci == 0) acc[9] += g;
                    }
                }
                __syncthreads();
            }
#pragma unroll
            for (int k = 0; k < 10; ++k) scratch[threadIdx.x * 10 + k] = acc[k];
            __syncthreads();
            for (int k = threadIdx.x; k < C1 * 9 + 1; k += THREADS) {
                const int group = k < C1 * 9 ? k / 9 : 0, at = k < C1 * 9 ? k % 9 : 9;
                float sum = 0.0f;
                for (int l = 0; l < lanes; ++l) sum += scratch[(l * C1 + group) * 10 + at];
                sums[k] = sum;
            }
            __syncthreads();
        }
        const int n = layer1 ? 10 : C1 * 9 + 1;
        float* mine = conv_partials + (size_t)block * CONV_SUMS;
        for (int k = threadIdx.x; k < n; k += THREADS) mine[k] = sums[k];
        if (last_block_to_finish(&channel_tickets[channel], SLICES)) {
            for (int k = threadIdx.x; k < n; k += THREADS) {
                float g = 0.0f;
                for (int q = 0; q < SLICES; ++q) g += conv_partials[(size_t)(channel * SLICES + q) * CONV_SUMS + k];
                const int at = layer1 ? (k < 9 ? W1_AT + channel * 9 + k : B1_AT + channel)
                                      : (k < n - 1 ? W2_AT + (channel - C1) * (n - 1) + k : B2_AT + channel - C1);
                grad[at] = g;
                square = fmaf(g, g, square);
                if (!clip) params[at] = optim_update(s, params[at], g, m[at], v[at]);
            }
            if (threadIdx.x == 0) channel_tickets[channel] = 0;
        }
    } else {
        block -= CONV_BLOCKS;
        const int q = block * THREADS + threadIdx.x;  // index into the FC parameters
        if (q < FC_PARAMS) {
            const int at = WF_AT + q;
            float g = 0.0f;
            if (at < BF_AT) {
                const int j = (at - WF_AT) / FLAT, i = (at - WF_AT) % FLAT;
                for (int b = 0; b < B; ++b) g = fmaf(dh[b * FC + j], f[(size_t)b * FLAT + i], g);
            } else if (at < WO_AT) {
                const int j = at - BF_AT;
                for (int b = 0; b < B; ++b) g += dh[b * FC + j];
            } else if (at < BO_AT) {
                const int k = (at - WO_AT) / FC, j = (at - WO_AT) % FC;
                for (int b = 0; b < B; ++b) g = fmaf(dlogits[b * K + k], h[b * FC + j], g);
            } else {
                const int k = at - BO_AT;
                for (int b = 0; b < B; ++b) g += dlogits[b * K + k];
            }
            grad[at] = g;
            square = g * g;
            if (!clip) params[at] = optim_update(s, params[at], g, m[at], v[at]);
        }
    }
    if (clip) {
        const float total = block_sum(square, scratch);
        if (threadIdx.x == 0) norm_partials[blockIdx.x] = total;
    }
    if (!last_block_to_finish(ticket)) return;
    if (clip) {
        if (threadIdx.x == 0) {
            double sum = 0.0;
            for (int k = 0; k < UPDATE_BLOCKS; ++k) sum += norm_partials[k];
            const float norm = (float)sqrt(sum);
            square_sum = norm > clip_norm ? clip_norm / norm : 1.0f;
        }
        __syncthreads();
        s.grad_scale = square_sum;
        optim_update_range(s, params, grad, m, v, threadIdx.x, PARAMS, THREADS);
    }
    if (threadIdx.x == 0) {
        double sum = 0.0;
        for (int b = 0; b < B; ++b) sum += loss[b];
        *loss_sum += sum;
        *step = t;
        *ticket = 0;
    }
}
