// The text model's single-sample training step (B = 1), built for latency (CPU twin: src/text/model.rs).
//
//   x = mean E[context]   z1 = W1·x + b1   h = ReLU(z1)   logits = W2·h + b2   loss = −log softmax[target]
//
// fused/text.cu reads the output layer W2 (V×H, 8 MB at the bench shape) twice a step: text_forward for
// the logits and text_backward for dh = W2ᵀ·dlogits and W2's update, and text_backward's pass sits on the
// step's critical path. Here W2 is read once, in sample_forward, where block b holds its rows in shared
// memory anyway:
//   - dh needs no second pass. With e_v = exp(logit_v − max_b) over block b's rows, the block also forms
//     U_b = Σ_v e_v·W2[v] (an H-vector). Then Σ_v softmax_v·W2[v] = Σ_b exp(max_b − max)·U_b / Σexp, and
//     dh = that − W2[target]: sample_backward combines the G partials, not the V rows.
//   - W2's update waits one step. dlogits_v = softmax_v − onehot_v needs the global normaliser, known
//     only after every block has run; so step t's update W2[v] −= lr·dlogits_v·h, b2[v] −= lr·dlogits_v is
//     applied by step t+1's sample_forward to the rows it has just staged, before its dependency wait, so
//     it overlaps the step before. The step's normaliser, target, lr and h wait in a PendingStep record
//     (plus the step's logits, which each block keeps for its own rows); sample_flush applies it where the
//     next kernel is not a sample_forward (end of training, evaluation, other batch sizes).
// The rest of the step is small and split so that each kernel needs one round trip to L2 after its wait:
//   1. sample_forward   pending W2/b2 update (before the wait), logits of the block's rows, softmax
//                       partial (max, Σexp) and U_b.
//   2. sample_backward  blocks own HS hidden units: normaliser, loss, dh and dz1 = dh·ReLU′(z1) of their
//                       units, W1/b1 update of their rows, and their share of dx = W1ᵀ·dz1 (atomics).
//   3. sample_update    the context rows of E get −lr/N·dx; every block forms the next sample's x from
//                       the updated E and z1 of its hidden rows from the updated W1 (one warp per row).
// Every kernel waits (grid_dependency_wait) before it touches what the kernel before it writes, and lets
// its dependant launch only after that wait, so a kernel never overlaps the one two places before it.
#include "common.cuh"

#ifndef TEXT_D
#define TEXT_D 64
#endif
#ifndef TEXT_H
#define TEXT_H 256
#endif

constexpr int D = TEXT_D;
constexpr int H = TEXT_H;
static_assert(H % 4 == 0, "the single-sample kernels read W2 rows as float4s");
constexpr int H4 = H / 4;
constexpr int DP = (D + 31) / 32;  // elements of a D-vector per lane
// Row stride of the staged W2 rows, ≡ 16 (mod 32) floats: the two rows that a quarter-warp's float4 loads
// touch in sample_forward's logits fall in different banks.
constexpr int LD = (H + 31) / 32 * 32 + 16;
constexpr int QUAD = 4;                  // threads per W2 row in the logits
constexpr int HS = 16;                   // hidden units per sample_backward block
constexpr int GROUPS = THREADS / HS;     // sample_backward: threads summing the partials of one unit
constexpr int PARTIALS_IN_FLIGHT = 16;   // partials per thread loaded together (grids up to 256 blocks)

// The step whose W2/b2 update is still to be applied. Written by sample_backward's block 0.
struct PendingStep {
    unsigned pending;  // 0: W2 and b2 are up to date
    unsigned target;
    float lr;
    float max;      // the step's softmax normaliser: max and 1/Σ exp(logit − max)
    float inv_sum;
};

// ∂loss/∂logit_v of the pending step: softmax_v − onehot_v.
__device__ __forceinline__ float pending_dlogit(const PendingStep& p, float logit, int v) {
    return expf(logit - p.max) * p.inv_sum - (v == (int)p.target ? 1.0f : 0.0f);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < WARPS ? scratch[lane] : NEG_INF;
    return warp_max(v);
}

// Kernel 1. Block b owns vocabulary rows [b·R, b·R + R).
// dynamic shared memory: hs[H] (this step's h), hp[H] (the pending step's h), ws[R][LD], bs[R], ls[R], es[R]
extern "C" __global__ void __launch_bounds__(THREADS)
sample_forward(float* __restrict__ W2, float* __restrict__ b2, const float* __restrict__ z1,
               const PendingStep* __restrict__ pending, const float* __restrict__ h_pending, int V,
               int rows_per_block, float* __restrict__ logits, SoftmaxStat* __restrict__ stats,
               float* __restrict__ partials, float* __restrict__ dx) {
    extern __shared__ float4 smem4[];
    const int R = rows_per_block;
    float* hs = reinterpret_cast<float*>(smem4);
    float* hp = hs + H;
    float* ws = hp + H;
    float* bs = ws + (size_t)R * LD;
    float* ls = bs + R;
    float* es = ls + R;
    __shared__ float scratch[WARPS];
    const int row0 = blockIdx.x * R;
    const int rows = min(R, V - row0);

    // Prologue. W2, b2, this block's logits and the pending record were last written by the previous
    // step's sample_forward and sample_backward, which finished before the kernel before this one let it
    // launch; that kernel (sample_update or text_hidden) touches none of them.
    for (int i = threadIdx.x; i < rows * H4; i += THREADS) {
        const int r = i / H4, c = i % H4;
        cp_async16(ws + r * LD + 4 * c, W2 + (size_t)(row0 + r) * H + 4 * c);
    }
    cp_async_commit();
    const PendingStep p = *pending;
    if (p.pending) {
        for (int i = threadIdx.x; i < H; i += THREADS) hp[i] = h_pending[i];
        for (int r = threadIdx.x; r < rows; r += THREADS) {
            const int v = row0 + r;
            const float g = pending_dlogit(p, logits[v], v);
            es[r] = g;
            bs[r] = b2[v] - p.lr * g;
            b2[v] = bs[r];
        }
    } else {
        for (int r = threadIdx.x; r < rows; r += THREADS) bs[r] = b2[row0 + r];
    }
    cp_async_wait_all();
    __syncthreads();
    if (p.pending) {
        for (int i = threadIdx.x; i < rows * H4; i += THREADS) {
            const int r = i / H4, c = i % H4;
            float4* w = reinterpret_cast<float4*>(ws + r * LD + 4 * c);
            const float4 h = *reinterpret_cast<const float4*>(hp + 4 * c);
            const float g = es[r];
            float4 u = *w;
            u.x -= p.lr * (g * h.x);
            u.y -= p.lr * (g * h.y);
            u.z -= p.lr * (g * h.z);
            u.w -= p.lr * (g * h.w);
            *w = u;
            reinterpret_cast<float4*>(W2 + (size_t)(row0 + r) * H)[c] = u;
        }
    }
    grid_dependency_wait();
    allow_dependent_launch();

    for (int i = threadIdx.x; i < H; i += THREADS) hs[i] = fmaxf(__ldcg(&z1[i]), 0.0f);
    if (blockIdx.x == 0)  // sample_backward sums this step's dx here
        for (int i = threadIdx.x; i < D; i += THREADS) dx[i] = 0.0f;
    __syncthreads();

    // Logits: QUAD threads per row, each summing every QUAD-th float4 of it.
    const int q = threadIdx.x % QUAD;
    for (int base = 0; base < rows; base += THREADS / QUAD) {
        const int r = base + threadIdx.x / QUAD;
        float acc = 0.0f;
        if (r < rows) {
            const float4* w = reinterpret_cast<const float4*>(ws + r * LD);
            const float4* h = reinterpret_cast<const float4*>(hs);
            float a[2] = {0.0f, 0.0f};
#pragma unroll 4
            for (int c = q; c < H4; c += QUAD) {
                const float4 wv = w[c], hv = h[c];
                a[(c / QUAD) & 1] += wv.x * hv.x + wv.y * hv.y + wv.z * hv.z + wv.w * hv.w;
            }
            acc = a[0] + a[1];
        }
        acc += __shfl_xor_sync(FULL_MASK, acc, 1);
        acc += __shfl_xor_sync(FULL_MASK, acc, 2);
        if (r < rows && q == 0) {
            const float logit = acc + bs[r];
            ls[r] = logit;
            logits[row0 + r] = logit;
        }
    }
    __syncthreads();

    // The block's softmax partial, and U_b = Σ_r exp(logit_r − max_b)·W2[r].
    float m = NEG_INF;
    for (int r = threadIdx.x; r < rows; r += THREADS) m = fmaxf(m, ls[r]);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (int r = threadIdx.x; r < rows; r += THREADS) {
        es[r] = expf(ls[r] - m);
        s += es[r];
    }
    s = block_sum(s, scratch);  // its barriers also publish es
    for (int k = threadIdx.x; k < H; k += THREADS) {
        float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int r = 0;
        for (; r + 4 <= rows; r += 4)
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] += es[r + i] * ws[(r + i) * LD + k];
        for (; r < rows; ++r) a[0] += es[r] * ws[r * LD + k];
        partials[(size_t)blockIdx.x * H + k] = (a[0] + a[1]) + (a[2] + a[3]);
    }
    if (threadIdx.x == 0) stats[blockIdx.x] = {m, s};
}

// Kernel 2. Block k owns hidden units [k·HS, k·HS + HS); G is sample_forward's grid.
// dynamic shared memory: w1s[HS][D] (the units' W1 rows), xs[D], scale[G], sums[GROUPS][HS], dz[HS]
extern "C" __global__ void __launch_bounds__(THREADS)
sample_backward(const float* __restrict__ W2, float* __restrict__ W1, float* __restrict__ b1,
                const float* __restrict__ x, const float* __restrict__ z1, const float* __restrict__ logits,
                const SoftmaxStat* __restrict__ stats, const float* __restrict__ partials, int G,
                const unsigned* __restrict__ tokens, const unsigned* __restrict__ positions,
                const unsigned* __restrict__ cursor, unsigned offset, float lr, float* __restrict__ dh,
                float* __restrict__ dx, PendingStep* __restrict__ pending, float* __restrict__ h_pending,
                double* __restrict__ loss_sum) {
    extern __shared__ float4 smem4[];
    float* w1s = reinterpret_cast<float*>(smem4);
    float* xs = w1s + HS * D;
    float* scale = xs + D;
    float* sums = scale + G;
    float* dz = sums + GROUPS * HS;
    __shared__ SoftmaxStat warp_stat[WARPS];
    __shared__ float norm[2];  // max, Σexp
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int k0 = blockIdx.x * HS;
    const int units = min(HS, H - k0);

    // Prologue: W1, b1 were last written by the previous step's sample_backward, x and z1 by its
    // sample_update; both finished before sample_forward, the kernel before this one, passed its wait.
    for (int i = threadIdx.x; i < units * D; i += THREADS) w1s[i] = __ldcg(&W1[(size_t)k0 * D + i]);
    for (int i = threadIdx.x; i < D; i += THREADS) xs[i] = __ldcg(&x[i]);
    const int unit = threadIdx.x % HS, group = threadIdx.x / HS;
    const bool owns_unit = threadIdx.x < HS && unit < units;
    const float z = owns_unit ? __ldcg(&z1[k0 + unit]) : 0.0f;
    const float bias = owns_unit ? __ldcg(&b1[k0 + unit]) : 0.0f;
    const unsigned target = tokens[positions[*cursor + offset]];
    grid_dependency_wait();
    allow_dependent_launch();

    // One round trip: the G softmax partials, the G partial sums U_b of this thread's unit, W2[target]
    // and the target's logit.
    SoftmaxStat own = (int)threadIdx.x < G ? stats[threadIdx.x] : softmax_stat_empty();
    float u[PARTIALS_IN_FLIGHT];
#pragma unroll
    for (int i = 0; i < PARTIALS_IN_FLIGHT; ++i) {
        const int b = group + GROUPS * i;
        u[i] = (b < G && unit < units) ? partials[(size_t)b * H + k0 + unit] : 0.0f;
    }
    const float w2_target = owns_unit ? W2[(size_t)target * H + k0 + unit] : 0.0f;
    const float target_logit = threadIdx.x == 0 ? logits[target] : 0.0f;

    SoftmaxStat st = own;
    for (int b = threadIdx.x + THREADS; b < G; b += THREADS) st = softmax_merge(st, stats[b]);  // wide grids
    st = warp_softmax_merge(st);
    if (lane == 0) warp_stat[warp] = st;
    __syncthreads();
    if (threadIdx.x == 0) {
        SoftmaxStat total = softmax_stat_empty();
        for (int w = 0; w < WARPS; ++w) total = softmax_merge(total, warp_stat[w]);
        norm[0] = total.max;
        norm[1] = total.sum;
    }
    __syncthreads();
    const float max = norm[0], inv_sum = 1.0f / norm[1];
    for (int b = threadIdx.x; b < G; b += THREADS)
        scale[b] = expf((b == (int)threadIdx.x ? own : stats[b]).max - max);
    __syncthreads();

    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < PARTIALS_IN_FLIGHT; ++i) {
        const int b = group + GROUPS * i;
        if (b < G) acc += scale[b] * u[i];
    }
    for (int b = group + GROUPS * PARTIALS_IN_FLIGHT; b < G; b += GROUPS)
        if (unit < units) acc += scale[b] * partials[(size_t)b * H + k0 + unit];
    sums[group * HS + unit] = acc;
    __syncthreads();

    if (owns_unit) {
        float sum = 0.0f;
        for (int g = 0; g < GROUPS; ++g) sum += sums[g * HS + unit];
        const int j = k0 + unit;
        const float dh_j = sum * inv_sum - w2_target;
        const float dz_j = z > 0.0f ? dh_j : 0.0f;
        dh[j] = dh_j;
        dz[unit] = dz_j;
        h_pending[j] = fmaxf(z, 0.0f);
        b1[j] = bias - lr * dz_j;
    }
    __syncthreads();
    // dx += W1ᵀ·dz1 over this block's units, with the old W1; then their W1 rows' update.
    for (int d = threadIdx.x; d < D; d += THREADS) {
        float sum = 0.0f;
        for (int k = 0; k < units; ++k) sum += dz[k] * w1s[k * D + d];
        atomicAdd(&dx[d], sum);
    }
    for (int i = threadIdx.x; i < units * D; i += THREADS)
        W1[(size_t)k0 * D + i] = w1s[i] - lr * (dz[i / D] * xs[i % D]);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *pending = {1u, target, lr, max, inv_sum};
        atomicAdd(loss_sum, (double)(max + logf(norm[1]) - target_logit));
    }
}

// Kernel 3. One warp per hidden row j, WARPS rows per block.
// dynamic shared memory: context[N], next_context[N], next_rows[N][D], delta[D] (−lr/N·dx), xn[D]
extern "C" __global__ void __launch_bounds__(THREADS)
sample_update(float* __restrict__ E, const float* __restrict__ W1, const float* __restrict__ b1,
              float* __restrict__ x, float* __restrict__ z1, const float* __restrict__ dx,
              const unsigned* __restrict__ tokens, const unsigned* __restrict__ positions,
              unsigned positions_len, const unsigned* __restrict__ cursor, unsigned offset, int N, float lr) {
    extern __shared__ float4 smem4[];
    unsigned* context = reinterpret_cast<unsigned*>(smem4);
    unsigned* next_context = context + N;
    float* next_rows = reinterpret_cast<float*>(next_context + N);
    float* delta = next_rows + N * D;
    float* xn = delta + D;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int j = blockIdx.x * WARPS + warp;
    const unsigned first = *cursor + offset, next = first + 1;
    const bool has_next = next < positions_len;

    // Prologue: E was last written by the previous step's sample_update. The next sample's embedding rows
    // go to shared memory now; this step's update is added to them after the wait.
    for (int i = threadIdx.x; i < N; i += THREADS) {
        context[i] = tokens[positions[first] - N + i];
        if (has_next) next_context[i] = tokens[positions[next] - N + i];
    }
    __syncthreads();
    if (has_next)
        for (int i = threadIdx.x; i < N * D; i += THREADS) next_rows[i] = __ldcg(&E[(size_t)next_context[i / D] * D + i % D]);
    grid_dependency_wait();
    allow_dependent_launch();

    // One round trip: dx, and this warp's W1 row and b1 as sample_backward left them.
    for (int i = threadIdx.x; i < D; i += THREADS) delta[i] = -lr / N * __ldcg(&dx[i]);
    float w[DP];
#pragma unroll
    for (int i = 0; i < DP; ++i) w[i] = (j < H && lane + 32 * i < D) ? __ldcg(&W1[(size_t)j * D + lane + 32 * i]) : 0.0f;
    const float bias = j < H ? __ldcg(&b1[j]) : 0.0f;
    __syncthreads();

    if (has_next) {
        // x of the next sample from its rows as this step leaves them.
        for (int d = threadIdx.x; d < D; d += THREADS) {
            float sum = 0.0f;
            for (int n = 0; n < N; ++n) {
                float e = next_rows[n * D + d];
                for (int c = 0; c < N; ++c)
                    if (context[c] == next_context[n]) e += delta[d];
                sum += e;
            }
            xn[d] = sum * (1.0f / N);
            if (blockIdx.x == 0) x[d] = xn[d];
        }
        __syncthreads();
        if (j < H) {
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < DP; ++i)
                if (lane + 32 * i < D) acc += w[i] * xn[lane + 32 * i];
            acc = warp_sum(acc);
            if (lane == 0) z1[j] = acc + bias;
        }
    }
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < N * D; i += THREADS) atomicAdd(&E[(size_t)context[i / D] * D + i % D], delta[i % D]);
}

// Applies the pending step's W2/b2 update (see the top of this file) where no sample_forward follows.
// The caller then clears PendingStep::pending. Same grid as sample_forward.
extern "C" __global__ void __launch_bounds__(THREADS)
sample_flush(float* __restrict__ W2, float* __restrict__ b2, const PendingStep* __restrict__ pending,
             const float* __restrict__ h_pending, const float* __restrict__ logits, int V, int rows_per_block) {
    const PendingStep p = *pending;
    if (!p.pending) return;
    const int row0 = blockIdx.x * rows_per_block;
    const int rows = min(rows_per_block, V - row0);
    for (int i = threadIdx.x; i < rows * H; i += THREADS) {
        const int v = row0 + i / H, k = i % H;
        W2[(size_t)v * H + k] -= p.lr * (pending_dlogit(p, logits[v], v) * h_pending[k]);
    }
    for (int r = threadIdx.x; r < rows; r += THREADS) {
        const int v = row0 + r;
        b2[v] -= p.lr * pending_dlogit(p, logits[v], v);
    }
}
