// The sales regressor (CPU twin: src/sales/model.rs, data.rs `Stats`, optim.rs): standardised features
// x (n) and target t,
//
//   z = W1·x + b1 (H)   a = relu(z)   y = w2·a + b2   loss = (1/B) Σ (y − t)²   over a batch of B rows
//
// with shuffled mini-batches and any optimizer of optim.cuh. The roadmap's run is 50 epochs of ~4,600
// steps of 64 rows: ~230K steps of ~0.16 MFLOP each. A kernel boundary costs more than a step's math
// (a CUDA-graph node ~0.9 µs, three a step ~0.6 s in all), and a grid-wide barrier ~1 µs, so one block
// runs a whole epoch: parameters, optimizer state and the batch live in its shared memory, and a step
// is two block barriers. The next batch is copied in with cp.async while the current one computes.
//
//   sales_column_partials / sales_column_stats  mean and population std of every feature column and of
//                 the target over the training rows, two passes (mean, then squared deviations), summed
//                 in double in a fixed order: grid (row chunks × columns) partial sums, then one block per
//                 column. A std of 0 becomes 1, as on the CPU.
//   sales_normalize  (v − mean) / std over a split, in place.
//   sales_gather     an epoch's rows in its shuffled order, so the training kernel reads each batch as one
//                    contiguous range (~23 MB copied at full-GPU bandwidth, ~15 µs an epoch).
//   sales_train_epoch  grid 1: every step of one epoch. The block's threads form row groups of GROUP
//                 lanes (a warp for H ≥ 32); a lane owns hidden units j ≡ lane (mod GROUP) and keeps their
//                 W1 rows in registers. A group takes every GROUPS-th row of the batch and, per row:
//                   forward   z = W1[j]·x + b1[j], a = relu(z), y = Σ_j w2[j]·a_j by shuffles in the group;
//                   backward  dy = 2(y − t)/B, dz = dy·w2[j]·[z > 0], the group's gradient in registers;
//                 then writes its gradient to shared memory; after one barrier every parameter's gradient
//                 is the groups' summed in group order (no atomics: the same bits every run) and
//                 optim_update applies it. Two barriers a step (three with clipping), no shared-memory
//                 round trip for activations. The summed squared error (each row's before its step) goes
//                 to `loss_sum`. N and H are compiled in (-DSALES_N, -DSALES_H), so the register arrays
//                 have fixed sizes; the batch is an argument.
//   sales_evaluate  a thread per row of a split: squared and absolute error sums (double), per-block
//                 partials combined in block order by the last block to finish.
//
// The flat parameter vector is W1 (H×n, row-major), b1 (H), w2 (H), b2 (1), as in the model file.
#include "common.cuh"
#include "losses.cuh"
#include "optim.cuh"

#ifndef SALES_N
#define SALES_N 19
#endif
#ifndef SALES_H
#define SALES_H 32
#endif

constexpr int N = SALES_N, H = SALES_H;          // features, hidden units
constexpr int W1_SIZE = H * N;
constexpr int P = W1_SIZE + 2 * H + 1;            // parameters
constexpr int NP = (N + 3) / 4 * 4;               // a staged row's stride (float4 reads)
constexpr int pow2_at_least(int v) { return v <= 1 ? 1 : 2 * pow2_at_least((v + 1) / 2); }
// A row group: the lanes that share one row's hidden units (a warp, or part of one for H < 32); a thread
// owns UNITS of them. The block's GROUPS groups take interleaved rows of a batch.
constexpr int GROUP = H >= 32 ? 32 : pow2_at_least(H);
constexpr int GROUPS = THREADS / GROUP;
constexpr int UNITS = (H + GROUP - 1) / GROUP;
constexpr int PARTIAL_END = (3 * P + GROUPS * P + 3) / 4 * 4;  // floats before the staged batches

// Block-wide sum in double, the same on every thread; `scratch` holds WARPS doubles.
__device__ __forceinline__ double block_sum_double(double v, double* scratch) {
    return block_combine(v, scratch, 0.0, [](double x) {
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(FULL_MASK, x, offset);
        return x;
    });
}

// Column c of the training split: feature c for c < n, the target for c = n.
__device__ __forceinline__ float column_value(const float* x, const float* y, int n, int row, int c) {
    return c < n ? x[(size_t)row * n + c] : y[row];
}

// Grid (chunks, n + 1). Pass 1 (mean == nullptr): Σ v over the block's rows; pass 2: Σ (v − mean[c])².
extern "C" __global__ void __launch_bounds__(THREADS)
sales_column_partials(const float* __restrict__ x, const float* __restrict__ y, int rows, int n,
                      const double* __restrict__ mean, double* __restrict__ partials) {
    __shared__ double scratch[WARPS];
    const int c = blockIdx.y, chunks = gridDim.x;
    const int per_chunk = (rows + chunks - 1) / chunks;
    const int begin = blockIdx.x * per_chunk, end = min(rows, begin + per_chunk);
    const double centre = mean ? mean[c] : 0.0;
    double sum = 0.0;
    for (int r = begin + threadIdx.x; r < end; r += THREADS) {
        const double d = (double)column_value(x, y, n, r, c) - centre;
        sum += mean ? d * d : d;
    }
    sum = block_sum_double(sum, scratch);
    if (threadIdx.x == 0) partials[(size_t)c * chunks + blockIdx.x] = sum;
}

// Grid n + 1, after each pass: pass 1 writes mean (double, for pass 2) and mean_out; pass 2 std_out.
extern "C" __global__ void __launch_bounds__(THREADS)
sales_column_stats(const double* __restrict__ partials, int chunks, int rows, int pass, double* __restrict__ mean,
                   float* __restrict__ mean_out, float* __restrict__ std_out) {
    if (threadIdx.x != 0) return;
    const int c = blockIdx.x;
    double sum = 0.0;
    for (int k = 0; k < chunks; ++k) sum += partials[(size_t)c * chunks + k];
    const double value = sum / (double)max(rows, 1);
    if (pass == 1) {
        mean[c] = value;
        mean_out[c] = (float)value;
    } else {
        const float std = (float)sqrt(value);
        std_out[c] = std > 0.0f ? std : 1.0f;
    }
}

// x (rows × n) and y in place, with the statistics' layout: column n is the target.
extern "C" __global__ void __launch_bounds__(THREADS)
sales_normalize(float* __restrict__ x, float* __restrict__ y, int rows, int n, const float* __restrict__ mean,
                const float* __restrict__ std) {
    const size_t count = (size_t)rows * n;
    for (size_t k = (size_t)blockIdx.x * THREADS + threadIdx.x; k < count + rows; k += (size_t)gridDim.x * THREADS) {
        if (k < count) {
            const int c = (int)(k % n);
            x[k] = (x[k] - mean[c]) / std[c];
        } else {
            y[k - count] = (y[k - count] - mean[n]) / std[n];
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
sales_gather(const float* __restrict__ x, const float* __restrict__ y, const unsigned* __restrict__ order, int rows,
             int n, float* __restrict__ x_out, float* __restrict__ y_out) {
    const size_t count = (size_t)rows * n;
    for (size_t k = (size_t)blockIdx.x * THREADS + threadIdx.x; k < count; k += (size_t)gridDim.x * THREADS) {
        const size_t r = k / n;
        x_out[k] = x[(size_t)order[r] * n + (k - r * n)];
        if (k - r * n == 0) y_out[r] = y[order[r]];
    }
}

// Queues the copy of batch rows [begin, begin + count) into shared memory, rows NP floats apart.
__device__ __forceinline__ void copy_batch_async(const float* x, const float* y, int begin, int count, float* xs,
                                                 float* ys) {
    const float* src = x + (size_t)begin * N;
    for (int k = threadIdx.x; k < count * N; k += THREADS) cp_async4(xs + (k / N) * NP + k % N, src + k);
    for (int k = threadIdx.x; k < count; k += THREADS) cp_async4(ys + k, y + begin + k);
    cp_async_commit();
}

// Σ over the GROUP lanes of a row group (aligned lanes of one warp), in every lane of it.
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int offset = GROUP / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

// Grid 1, dynamic shared memory PARTIAL_END + 2·B·(NP + 1) floats (src/sales/gpu.rs mirrors it, tested against this file). x, y: the epoch's rows in order
// (sales_gather). step: optimizer steps taken so far (advanced). m, v: optimizer state, read and written
// back. clip_norm 0: no clipping. loss_sum: the epoch's summed squared error.
extern "C" __global__ void __launch_bounds__(THREADS)
sales_train_epoch(const float* __restrict__ x, const float* __restrict__ y, int rows, int B,
                  float* __restrict__ params, float* __restrict__ m, float* __restrict__ v,
                  unsigned* __restrict__ step, int kind, float lr, float momentum, float beta1, float beta2, float eps,
                  float weight_decay, float clip_norm, double* __restrict__ loss_sum) {
    extern __shared__ float4 shared4[];
    __shared__ double scratch[WARPS];
    float* w = reinterpret_cast<float*>(shared4);  // W1, b1, w2, b2
    float* ms = w + P;
    float* vs = ms + P;
    float* partial = vs + P;                      // GROUPS × P: each row group's gradient
    float* xs = w + PARTIAL_END;                  // 2 batches of B rows, NP apart (16-byte aligned)
    float* ys = xs + 2 * B * NP;                  // 2 batches of B
    const int tid = threadIdx.x, lane = tid % GROUP, group = tid / GROUP;

    for (int p = tid; p < P; p += THREADS) {
        w[p] = params[p];
        ms[p] = m[p];
        vs[p] = v[p];
    }
    unsigned t = *step;
    OptimStep s{kind, lr, momentum, beta1, beta2, eps, weight_decay, 1.0f, 1.0f, 1.0f};
    double beta1_t = pow((double)beta1, (double)t), beta2_t = pow((double)beta2, (double)t);
    double loss = 0.0;  // lane 0 of each group: its rows' squared errors

    const int steps = (rows + B - 1) / B;
    copy_batch_async(x, y, 0, min(B, rows), xs, ys);
    for (int k = 0; k < steps; ++k) {
        const int begin = k * B, count = min(B, rows - begin);
        const float* xb = xs + (k & 1) * B * NP;
        const float* yb = ys + (k & 1) * B;
        if (k + 1 < steps) {
            const int next = begin + B;
            copy_batch_async(x, y, next, min(B, rows - next), xs + ((k + 1) & 1) * B * NP, ys + ((k + 1) & 1) * B);
            asm volatile("cp.async.wait_group 1;" ::: "memory");
        } else {
            cp_async_wait_all();
        }
        __syncthreads();  // the batch is in; the previous step's updates are done

        // This thread's hidden units j = lane + u·GROUP: their parameters, and their gradient over the
        // group's rows b = group + r·GROUPS.
        float w1r[UNITS][N], b1r[UNITS], w2r[UNITS], g1[UNITS][N], gb1[UNITS], gw2[UNITS], gb2 = 0.0f;
#pragma unroll
        for (int u = 0; u < UNITS; ++u) {
            const int j = lane + u * GROUP;
            const bool unit = j < H;
#pragma unroll
            for (int i = 0; i < N; ++i) {
                w1r[u][i] = unit ? w[j * N + i] : 0.0f;
                g1[u][i] = 0.0f;
            }
            b1r[u] = unit ? w[W1_SIZE + j] : 0.0f;
            w2r[u] = unit ? w[W1_SIZE + H + j] : 0.0f;  // a padding unit adds nothing to y
            gb1[u] = gw2[u] = 0.0f;
        }
        const float b2 = w[P - 1], scale = 2.0f / (float)count;
        const int rounds = (count + GROUPS - 1) / GROUPS;  // the same in every group: group_sum needs whole warps
        for (int r = 0; r < rounds; ++r) {
            const int b = group + r * GROUPS;
            const bool row = b < count;
            float xv[N];
            const float4* xr = reinterpret_cast<const float4*>(xb + (row ? b : 0) * NP);
#pragma unroll
            for (int q = 0; q < NP / 4; ++q) {
                const float4 four = xr[q];
                const float parts[4] = {four.x, four.y, four.z, four.w};
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (4 * q + e < N) xv[4 * q + e] = parts[e];
            }
            float a[UNITS], out = 0.0f;
#pragma unroll
            for (int u = 0; u < UNITS; ++u) {
                float z = 0.0f;
#pragma unroll
                for (int i = 0; i < N; ++i) z = fmaf(w1r[u][i], xv[i], z);
                a[u] = fmaxf(z + b1r[u], 0.0f);
                out = fmaf(w2r[u], a[u], out);
            }
            float dy;
            const float square = squared_error(group_sum(out) + b2, row ? yb[b] : 0.0f, scale, dy);
            if (!row) dy = 0.0f;
            if (row && lane == 0) loss += (double)square;
            gb2 += dy;
#pragma unroll
            for (int u = 0; u < UNITS; ++u) {
                gw2[u] = fmaf(dy, a[u], gw2[u]);
                const float dz = a[u] > 0.0f ? dy * w2r[u] : 0.0f;
                gb1[u] += dz;
#pragma unroll
                for (int i = 0; i < N; ++i) g1[u][i] = fmaf(dz, xv[i], g1[u][i]);
            }
        }
        float* mine = partial + group * P;
#pragma unroll
        for (int u = 0; u < UNITS; ++u) {
            const int j = lane + u * GROUP;
            if (j < H) {
#pragma unroll
                for (int i = 0; i < N; ++i) mine[j * N + i] = g1[u][i];
                mine[W1_SIZE + j] = gb1[u];
                mine[W1_SIZE + H + j] = gw2[u];
            }
        }
        if (lane == 0) mine[P - 1] = gb2;
        __syncthreads();

        // The groups' gradients summed in group order, then the update (into group 0's slot first when
        // the clip factor needs the whole gradient).
        ++t;
        beta1_t *= beta1;
        beta2_t *= beta2;
        s.bias1 = (float)(1.0 - beta1_t);
        s.bias2 = (float)(1.0 - beta2_t);
        float square = 0.0f;
        for (int p = tid; p < P; p += THREADS) {
            float g = partial[p];
            for (int q = 1; q < GROUPS; ++q) g += partial[q * P + p];
            if (clip_norm > 0.0f) {
                partial[p] = g;
                square = fmaf(g, g, square);
            } else {
                w[p] = optim_update(s, w[p], g, ms[p], vs[p]);
            }
        }
        if (clip_norm > 0.0f) {  // uniform: every thread takes block_sum_double's barriers
            const float norm = (float)sqrt(block_sum_double(square, scratch));
            s.grad_scale = norm > clip_norm ? clip_norm / norm : 1.0f;
            for (int p = tid; p < P; p += THREADS) w[p] = optim_update(s, w[p], partial[p], ms[p], vs[p]);
        }
        // The next step's barrier orders these writes before its reads.
    }
    __syncthreads();
    for (int p = tid; p < P; p += THREADS) {
        params[p] = w[p];
        m[p] = ms[p];
        v[p] = vs[p];
    }
    loss = block_sum_double(loss, scratch);
    if (tid == 0) {
        *loss_sum = loss;
        *step = t;
    }
}

// Grid any, dynamic shared memory P floats. result[0] = Σ (y − t)², result[1] = Σ |y − t|
// (standardised); partials: 2 doubles per block; ticket zero between launches.
extern "C" __global__ void __launch_bounds__(THREADS)
sales_evaluate(const float* __restrict__ x, const float* __restrict__ y, int rows, const float* __restrict__ params,
               double* __restrict__ partials, unsigned* __restrict__ ticket, double* __restrict__ result) {
    extern __shared__ float w[];
    __shared__ double scratch[WARPS];
    for (int p = threadIdx.x; p < P; p += THREADS) w[p] = params[p];
    __syncthreads();
    const float* b1 = w + W1_SIZE;
    const float* w2 = b1 + H;
    double se = 0.0, ae = 0.0;
    for (int r = blockIdx.x * THREADS + threadIdx.x; r < rows; r += gridDim.x * THREADS) {
        float xv[N];
#pragma unroll
        for (int i = 0; i < N; ++i) xv[i] = x[(size_t)r * N + i];
        float out = 0.0f;
        for (int j = 0; j < H; ++j) {
            float z = 0.0f;
#pragma unroll
            for (int i = 0; i < N; ++i) z = fmaf(w[j * N + i], xv[i], z);
            out = fmaf(w2[j], fmaxf(z + b1[j], 0.0f), out);
        }
        const double err = (double)(out + w[P - 1] - y[r]);
        se += err * err;
        ae += fabs(err);
    }
    se = block_sum_double(se, scratch);
    ae = block_sum_double(ae, scratch);
    if (threadIdx.x == 0) {
        partials[2 * blockIdx.x] = se;
        partials[2 * blockIdx.x + 1] = ae;
    }
    if (last_block_to_finish(ticket) && threadIdx.x == 0) {
        double total_se = 0.0, total_ae = 0.0;
        for (int k = 0; k < (int)gridDim.x; ++k) {
            total_se += partials[2 * k];
            total_ae += partials[2 * k + 1];
        }
        result[0] = total_se;
        result[1] = total_ae;
        *ticket = 0;
    }
}
