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
//     applied by step t+1's sample_forward to the rows it has just staged, before its dependency wait.
//     Each block keeps what that needs for its own rows (a PendingStep record, h, the step's logits), so
//     it needs nothing from the kernels after it, and sample_update lets the next sample_forward launch
//     at once: the W2 pass overlaps sample_backward's tail and sample_update. sample_flush applies a
//     pending update where no sample_forward follows (end of training, evaluation, other batch sizes).
// The rest of the step is small and split so that each kernel needs one round trip to L2 after its wait:
//   1. sample_forward   pending W2/b2 update (before the wait), logits of the block's rows, softmax
//                       partial (max, Σexp) and U_b.
//   2. sample_backward  blocks own HS hidden units: normaliser, loss, dh and dz1 = dh·ReLU′(z1) of their
//                       units, W1/b1 update of their rows, their share of dx = W1ᵀ·dz1, and
//                       (last block, before its wait) a copy of the next sample's embedding rows.
//   3. sample_update    dx from the blocks' shares, added in a fixed order (no atomics: a run repeats to
//                       the bit); the context rows of E get −lr/N·dx; every block forms the next sample's
//                       x from that copy plus this step's update and z1 of its hidden rows from the
//                       updated W1 (one warp per row).
// Every kernel waits (grid_dependency_wait) before it touches what the kernel before it writes. Each
// prologue says what it reads before its wait and why no running kernel writes that.
#include "common.cuh"
#include "losses.cuh"
#include "text_shape.cuh"

static_assert(H % 4 == 0, "the single-sample kernels read W2 rows as float4s");
constexpr int H4 = H / 4;
// Row stride of the staged W2 rows, ≡ 16 (mod 32) floats: the two rows that a quarter-warp's float4 loads
// touch in sample_forward's logits fall in different banks.
constexpr int LD = (H + 31) / 32 * 32 + 16;
constexpr int QUAD = 4;                  // threads per W2 row in the logits
constexpr int HS = 16;                   // hidden units per sample_backward block
constexpr int GROUPS = THREADS / HS;     // sample_backward: threads summing the partials of one unit
constexpr int SHARES = (H + HS - 1) / HS; // sample_backward's blocks: the shares of dx sample_update adds
constexpr int PARTIALS_IN_FLIGHT = 16;   // partials per thread loaded together (grids up to 256 blocks)

// The step whose W2/b2 update is still to be applied, one record per sample_forward block: each block
// writes its own after its wait and reads it before the next step's wait, so no block can overwrite a
// record that another block has yet to read. The step's softmax partials alternate between the two halves
// of a [2][G] array for the same reason.
struct PendingStep {
    unsigned pending;  // 0: this block's W2 and b2 rows are up to date
    unsigned target;
    float lr;
    unsigned parity;   // the half of the softmax partials that holds the step's
};

__device__ __forceinline__ SoftmaxStat load_stat(const SoftmaxStat* p) {
    const float2 v = __ldcg(reinterpret_cast<const float2*>(p));
    return {v.x, v.y};
}

// The softmax normaliser of a step, (max, Σ exp(logit − max)), from its G block partials, in every thread.
// `own` is partial threadIdx.x (empty past G), which the caller loads together with its other loads;
// grids wider than a block read the rest here. sample_forward, sample_backward and sample_flush all
// merge in this order, so they agree to the last bit.
__device__ __forceinline__ SoftmaxStat step_normaliser(SoftmaxStat own, const SoftmaxStat* stats, int G,
                                                       SoftmaxStat* scratch) {
    for (int b = threadIdx.x + THREADS; b < G; b += THREADS) own = softmax_merge(own, load_stat(stats + b));
    return block_softmax_merge(own, scratch);
}

// ∂loss/∂logit_v of the pending step: softmax_v − onehot_v, with norm = (max, 1/Σexp).
__device__ __forceinline__ float pending_dlogit(float2 norm, unsigned target, float logit, int v) {
    return expf(logit - norm.x) * norm.y - (v == (int)target ? 1.0f : 0.0f);
}

// Kernel 1. Block b owns vocabulary rows [b·R, b·R + R).
// dynamic shared memory: hs[H] (this step's h), hp[H] (the pending step's h), ws[R][LD], bs, ls, es [RP], with RP
// = R rounded up to 4: the compiled code may read es in 8-byte pairs that reach one float past the last row
// (compute-sanitizer memcheck saw this at R = 1; the extra value is never used).
extern "C" __global__ void __launch_bounds__(THREADS)
sample_forward(float* __restrict__ W2, float* __restrict__ b2, const float* __restrict__ z1,
               const unsigned* __restrict__ tokens, const unsigned* __restrict__ positions,
               const unsigned* __restrict__ cursor, unsigned offset, float lr, int V, int rows_per_block,
               PendingStep* __restrict__ records, float* __restrict__ h_pending, float* __restrict__ logits,
               SoftmaxStat* __restrict__ stats, float* __restrict__ partials, float* __restrict__ w2_target) {
    extern __shared__ float4 smem4[];
    const int R = rows_per_block, G = gridDim.x;
    float* hs = reinterpret_cast<float*>(smem4);
    float* hp = hs + H;
    float* ws = hp + H;
    float* bs = ws + (size_t)R * LD;
    const int RP = (R + 3) / 4 * 4;
    float* ls = bs + RP;
    float* es = ls + RP;
    __shared__ float scratch[WARPS], sum_scratch[WARPS];
    __shared__ SoftmaxStat stat_scratch[WARPS];
    const int row0 = blockIdx.x * R;
    const int rows = min(R, V - row0);

    // Prologue. This block's W2 and b2 rows, logits, pending record and h_pending row were last written by
    // the previous step's sample_forward (this block), the softmax partials by all of its blocks; it
    // finished before sample_backward, two kernels back, passed its wait. Neither sample_backward nor
    // sample_update, which may still run, touches W2 or b2.
    for (int i = threadIdx.x; i < rows * H4; i += THREADS) {
        const int r = i / H4, c = i % H4;
        cp_async16(ws + r * LD + 4 * c, W2 + (size_t)(row0 + r) * H + 4 * c);
    }
    for (int i = 4 * threadIdx.x; i < H; i += 4 * THREADS) cp_async16(hp + i, h_pending + (size_t)blockIdx.x * H + i);
    cp_async_commit();
    // One round trip: the record, both halves of the softmax partials (which one is the pending step's
    // comes with the record), and the block's rows of the pending step's logits and of b2.
    const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(records) + blockIdx.x);
    SoftmaxStat half[2] = {softmax_stat_empty(), softmax_stat_empty()};
    if ((int)threadIdx.x < G)
        for (int k = 0; k < 2; ++k) half[k] = load_stat(stats + k * G + threadIdx.x);
    const bool has_row = (int)threadIdx.x < rows;
    const float old_logit = has_row ? __ldcg(&logits[row0 + threadIdx.x]) : 0.0f;
    const float old_bias = has_row ? __ldcg(&b2[row0 + threadIdx.x]) : 0.0f;
    // The step's target (three dependent loads). Walking the chain here also holds the W2 update below
    // back by three round trips, which keeps the grid's 8 MB of W2 stores off sample_backward's critical
    // loads: with the target loaded after the wait instead, the step measured 10.08 µs, not 9.76.
    const unsigned target = tokens[positions[*cursor + offset]];
    const PendingStep rec = {raw.x, raw.y, __uint_as_float(raw.z), raw.w};
    if (rec.pending) {
        const SoftmaxStat total = step_normaliser(rec.parity ? half[1] : half[0], stats + rec.parity * G, G, stat_scratch);
        const float2 norm = make_float2(total.max, 1.0f / total.sum);
        for (int r = threadIdx.x; r < rows; r += THREADS) {
            const int v = row0 + r;
            const float g = pending_dlogit(norm, rec.target, r == (int)threadIdx.x ? old_logit : __ldcg(&logits[v]), v);
            es[r] = g;
            bs[r] = (r == (int)threadIdx.x ? old_bias : __ldcg(&b2[v])) - rec.lr * g;
            b2[v] = bs[r];
        }
    } else {
        for (int r = threadIdx.x; r < rows; r += THREADS) bs[r] = r == (int)threadIdx.x ? old_bias : __ldcg(&b2[row0 + r]);
    }
    cp_async_wait_all();
    __syncthreads();
    if (rec.pending) {
        for (int i = threadIdx.x; i < rows * H4; i += THREADS) {
            const int r = i / H4, c = i % H4;
            float4* w = reinterpret_cast<float4*>(ws + r * LD + 4 * c);
            const float4 h = *reinterpret_cast<const float4*>(hp + 4 * c);
            const float g = es[r];
            float4 u = *w;
            u.x -= rec.lr * (g * h.x);
            u.y -= rec.lr * (g * h.y);
            u.z -= rec.lr * (g * h.z);
            u.w -= rec.lr * (g * h.w);
            *w = u;
            reinterpret_cast<float4*>(W2 + (size_t)(row0 + r) * H)[c] = u;
        }
    }
    grid_dependency_wait();
    allow_dependent_launch();

    // One round trip: h (a warp stalls at its first use of a load, so when H fits the block all loads are
    // issued before any store).
    if (H <= THREADS) {
        const float z = (int)threadIdx.x < H ? __ldcg(&z1[threadIdx.x]) : 0.0f;
        if ((int)threadIdx.x < H) hs[threadIdx.x] = fmaxf(z, 0.0f);
    } else {
        for (int i = threadIdx.x; i < H; i += THREADS) hs[i] = fmaxf(__ldcg(&z1[i]), 0.0f);
    }
    __syncthreads();

    // Logits: QUAD threads per row, each summing every QUAD-th float4 of it; then the block's max.
    const int q = threadIdx.x % QUAD, warp = threadIdx.x / 32;
    float m = NEG_INF;
    for (int base = 0; base < rows; base += THREADS / QUAD) {
        const int r = base + threadIdx.x / QUAD;
        float acc = 0.0f;
        if (r < rows) {
            const float4* w = reinterpret_cast<const float4*>(ws + r * LD);
            const float4* h = reinterpret_cast<const float4*>(hs);
            float a[2] = {0.0f, 0.0f};
#pragma unroll 4
            for (int i = 0; q + QUAD * i < H4; ++i) {
                const float4 wv = w[q + QUAD * i], hv = h[q + QUAD * i];
                a[i % 2] += wv.x * hv.x + wv.y * hv.y + wv.z * hv.z + wv.w * hv.w;
            }
            acc = a[0] + a[1];
        }
        acc += __shfl_xor_sync(FULL_MASK, acc, 1);
        acc += __shfl_xor_sync(FULL_MASK, acc, 2);
        if (r < rows && q == 0) {
            const float logit = acc + bs[r];
            ls[r] = logit;
            logits[row0 + r] = logit;
            m = fmaxf(m, logit);
        }
    }
    m = warp_max(m);
    if (threadIdx.x % 32 == 0) scratch[warp] = m;
    __syncthreads();
    m = scratch[0];
    for (int w = 1; w < WARPS; ++w) m = fmaxf(m, scratch[w]);

    // The block's softmax partial, and U_b = Σ_r exp(logit_r − max_b)·W2[r].
    float s = 0.0f;
    for (int r = threadIdx.x; r < rows; r += THREADS) {
        es[r] = expf(ls[r] - m);
        s += es[r];
    }
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) sum_scratch[warp] = s;
    __syncthreads();  // also publishes es
    s = 0.0f;
    for (int w = 0; w < WARPS; ++w) s += sum_scratch[w];
    for (int k = threadIdx.x; k < H; k += THREADS) {
        float a[8] = {};
        int r = 0;
        for (; r + 8 <= rows; r += 8)
#pragma unroll
            for (int i = 0; i < 8; ++i) a[i] += es[r + i] * ws[(r + i) * LD + k];
        for (; r < rows; ++r) a[0] += es[r] * ws[r * LD + k];
        partials[(size_t)blockIdx.x * H + k] = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
        h_pending[(size_t)blockIdx.x * H + k] = hs[k];
    }
    const int target_row = (int)target - row0;
    if (target_row >= 0 && target_row < rows)  // sample_backward's copy: W2 may change before it reads
        for (int k = threadIdx.x; k < H; k += THREADS) w2_target[k] = ws[target_row * LD + k];
    const unsigned parity = rec.parity ^ 1u;
    if (threadIdx.x == 0) {
        stats[parity * G + blockIdx.x] = {m, s};
        records[blockIdx.x] = {1u, target, lr, parity};
    }
}

// Kernel 2. Block k owns hidden units [k·HS, k·HS + HS); G is sample_forward's grid.
// dynamic shared memory: w1s[HS][D] (the units' W1 rows), xs[D], scale[G], sums[GROUPS][HS], dz[HS]
extern "C" __global__ void __launch_bounds__(THREADS)
sample_backward(float* __restrict__ W1, float* __restrict__ b1, const float* __restrict__ x,
                const float* __restrict__ z1, const float* __restrict__ logits,
                const PendingStep* __restrict__ records, const SoftmaxStat* __restrict__ stats,
                const float* __restrict__ partials, const float* __restrict__ w2_target, int G,
                const unsigned* __restrict__ tokens, const unsigned* __restrict__ positions,
                const unsigned* __restrict__ cursor, unsigned offset, unsigned positions_len, int N,
                const float* __restrict__ E, float lr, float* __restrict__ dh, float* __restrict__ dx_shares,
                double* __restrict__ loss_sum, float* __restrict__ next_rows) {
    extern __shared__ float4 smem4[];
    float* w1s = reinterpret_cast<float*>(smem4);
    float* xs = w1s + HS * D;
    float* scale = xs + D;
    float* sums = scale + G;
    float* dz = sums + GROUPS * HS;
    __shared__ SoftmaxStat stat_scratch[WARPS];
    const int k0 = blockIdx.x * HS;
    const int units = min(HS, H - k0);

    // Prologue: W1, b1 were last written by the previous step's sample_backward, x and z1 by its
    // sample_update; both finished before sample_forward, the kernel before this one, passed its wait.
    for (int i = threadIdx.x; i < units * D; i += THREADS) cp_async4(w1s + i, W1 + (size_t)k0 * D + i);
    for (int i = threadIdx.x; i < D; i += THREADS) cp_async4(xs + i, x + i);
    cp_async_commit();
    const int unit = threadIdx.x % HS, group = threadIdx.x / HS;
    const bool owns_unit = threadIdx.x < HS && unit < units;
    const float z = owns_unit ? __ldcg(&z1[k0 + unit]) : 0.0f;
    const float bias = owns_unit ? __ldcg(&b1[k0 + unit]) : 0.0f;
    const unsigned target = threadIdx.x == 0 ? tokens[positions[*cursor + offset]] : 0u;  // thread 0 uses it
    // The last block copies the next sample's embedding rows for sample_update, whose block 0 adds this
    // step's update to E while its other blocks form the next x: from this copy, all of them see the rows
    // as the step found them. E, like W1, was last written by the previous step's sample_update.
    const unsigned next = *cursor + offset + 1;
    if (blockIdx.x == gridDim.x - 1 && next < positions_len)
        for (int i = threadIdx.x; i < N * D; i += THREADS)
            next_rows[i] = __ldcg(&E[(size_t)tokens[positions[next] - N + i / D] * D + i % D]);
    grid_dependency_wait();
    allow_dependent_launch();

    // One round trip: the softmax partials (both halves: which one is the step's comes with them), the G
    // partial sums U_b of this thread's unit, W2[target] and the target's logit.
    const unsigned parity = __ldcg(&records[0].parity);
    SoftmaxStat own[2] = {softmax_stat_empty(), softmax_stat_empty()};
    if ((int)threadIdx.x < G)
        for (int half = 0; half < 2; ++half) own[half] = load_stat(stats + half * G + threadIdx.x);
    float u[PARTIALS_IN_FLIGHT];
#pragma unroll
    for (int i = 0; i < PARTIALS_IN_FLIGHT; ++i) {
        const int b = group + GROUPS * i;
        u[i] = (b < G && unit < units) ? __ldcg(&partials[(size_t)b * H + k0 + unit]) : 0.0f;
    }
    const float w2_t = owns_unit ? __ldcg(&w2_target[k0 + unit]) : 0.0f;
    const float target_logit = threadIdx.x == 0 ? __ldcg(&logits[target]) : 0.0f;

    const SoftmaxStat* step_stats = stats + parity * G;
    const SoftmaxStat mine = parity ? own[1] : own[0];
    const SoftmaxStat st = step_normaliser(mine, step_stats, G, stat_scratch);
    const float max = st.max, inv_sum = 1.0f / st.sum;
    for (int b = threadIdx.x; b < G; b += THREADS)
        scale[b] = expf((b == (int)threadIdx.x ? mine : load_stat(step_stats + b)).max - max);
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
    cp_async_wait_all();
    __syncthreads();

    if (owns_unit) {
        float sum = 0.0f;
        for (int g = 0; g < GROUPS; ++g) sum += sums[g * HS + unit];
        const int j = k0 + unit;
        const float dh_j = sum * inv_sum - w2_t;
        const float dz_j = z > 0.0f ? dh_j : 0.0f;
        dh[j] = dh_j;
        dz[unit] = dz_j;
        b1[j] = bias - lr * dz_j;
    }
    __syncthreads();
    // The block's share of dx = W1ᵀ·dz1 (its units, the old W1; sample_update adds the shares), then the
    // units' W1 rows' update.
    for (int d = threadIdx.x; d < D; d += THREADS) {
        float sum = 0.0f;
        for (int k = 0; k < units; ++k) sum += dz[k] * w1s[k * D + d];
        dx_shares[(size_t)blockIdx.x * D + d] = sum;
    }
    for (int i = threadIdx.x; i < units * D; i += THREADS)
        W1[(size_t)k0 * D + i] = w1s[i] - lr * (dz[i / D] * xs[i % D]);
    if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(loss_sum, (double)(max + logf(st.sum) - target_logit));
}

// Kernel 3. One warp per hidden row j, WARPS rows per block.
// dynamic shared memory: context[N], next_context[N], rows[N][D] (the next sample's), delta[D] (−lr/N·dx), xn[D]
extern "C" __global__ void __launch_bounds__(THREADS)
sample_update(float* __restrict__ E, const float* __restrict__ W1, const float* __restrict__ b1,
              float* __restrict__ x, float* __restrict__ z1, const float* __restrict__ dx_shares,
              const float* __restrict__ next_rows, const unsigned* __restrict__ tokens,
              const unsigned* __restrict__ positions, unsigned positions_len, const unsigned* __restrict__ cursor,
              unsigned offset, int N, float lr) {
    extern __shared__ float4 smem4[];
    unsigned* context = reinterpret_cast<unsigned*>(smem4);
    unsigned* next_context = context + N;
    float* rows = reinterpret_cast<float*>(next_context + N);
    float* delta = rows + N * D;
    float* xn = delta + D;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int j = blockIdx.x * WARPS + warp;
    const unsigned first = *cursor + offset, next = first + 1;
    const bool has_next = next < positions_len;

    // The next step's sample_forward may launch now: before its wait it touches only W2, b2 and its own
    // records, which this kernel and sample_backward leave alone (see sample_forward).
    allow_dependent_launch();
    // Prologue: only the token chain. The next sample's embedding rows come from sample_backward's copy,
    // not from E: block 0 adds this step's update to E, and a block that read E itself could see it.
    for (int i = threadIdx.x; i < N; i += THREADS) {
        context[i] = tokens[positions[first] - N + i];
        if (has_next) next_context[i] = tokens[positions[next] - N + i];
    }
    grid_dependency_wait();

    // One round trip: the dx shares, the next sample's rows, and this warp's W1 row and b1 as
    // sample_backward left them (all loads issued before any is used).
    float w[DP];
#pragma unroll
    for (int i = 0; i < DP; ++i) w[i] = (j < H && lane + 32 * i < D) ? __ldcg(&W1[(size_t)j * D + lane + 32 * i]) : 0.0f;
    const float bias = j < H ? __ldcg(&b1[j]) : 0.0f;
    const bool has_row_value = has_next && (int)threadIdx.x < N * D;
    const float row_value = has_row_value ? __ldcg(&next_rows[threadIdx.x]) : 0.0f;
    // dx in a fixed order, so that a run repeats to the bit: with D ≤ THREADS / 4, the four lanes 4d … 4d + 3
    // sum the shares ≡ 0, 1, 2, 3 (mod 4) of element d, then combine by shuffles; else a thread per element.
    if (4 * D <= THREADS) {
        constexpr int IN_FLIGHT = 8;
        const int d = threadIdx.x / 4, part = threadIdx.x % 4;
        float g = 0.0f;
        for (int b0 = part; b0 < SHARES; b0 += 4 * IN_FLIGHT) {
            float v[IN_FLIGHT];
#pragma unroll
            for (int i = 0; i < IN_FLIGHT; ++i) {
                const int b = b0 + 4 * i;
                v[i] = d < D && b < SHARES ? __ldcg(&dx_shares[(size_t)b * D + d]) : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < IN_FLIGHT; ++i) g += v[i];
        }
        g += __shfl_xor_sync(FULL_MASK, g, 1);
        g += __shfl_xor_sync(FULL_MASK, g, 2);
        if (d < D && part == 0) delta[d] = -lr / N * g;
    } else {
        for (int d = threadIdx.x; d < D; d += THREADS) {
            float g = 0.0f;
            for (int b = 0; b < SHARES; ++b) g += __ldcg(&dx_shares[(size_t)b * D + d]);
            delta[d] = -lr / N * g;
        }
    }
    if (has_row_value) rows[threadIdx.x] = row_value;
    if (has_next)
        for (int i = threadIdx.x + THREADS; i < N * D; i += THREADS) rows[i] = __ldcg(&next_rows[i]);
    __syncthreads();

    if (has_next) {
        // x of the next sample from its rows as this step leaves them.
        for (int d = threadIdx.x; d < D; d += THREADS) {
            float sum = 0.0f;
            for (int n = 0; n < N; ++n) {
                float e = rows[n * D + d];
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

// Applies each block's pending W2/b2 update (see the top of this file) where no sample_forward follows;
// the caller then zeroes the records. Same grid as sample_forward.
extern "C" __global__ void __launch_bounds__(THREADS)
sample_flush(float* __restrict__ W2, float* __restrict__ b2, const PendingStep* __restrict__ records,
             const float* __restrict__ h_pending, const SoftmaxStat* __restrict__ stats,
             const float* __restrict__ logits, int V, int rows_per_block) {
    __shared__ SoftmaxStat stat_scratch[WARPS];
    const PendingStep rec = records[blockIdx.x];
    if (!rec.pending) return;
    const int G = gridDim.x;
    const SoftmaxStat* step_stats = stats + rec.parity * G;
    const SoftmaxStat own = (int)threadIdx.x < G ? load_stat(step_stats + threadIdx.x) : softmax_stat_empty();
    const SoftmaxStat total = step_normaliser(own, step_stats, G, stat_scratch);
    const float2 norm = make_float2(total.max, 1.0f / total.sum);
    const int row0 = blockIdx.x * rows_per_block;
    const int rows = min(rows_per_block, V - row0);
    const float* h = h_pending + (size_t)blockIdx.x * H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = warp; r < rows; r += WARPS) {  // a warp per row: its dlogit once
        const int v = row0 + r;
        const float g = pending_dlogit(norm, rec.target, logits[v], v);
        for (int k = lane; k < H; k += 32) W2[(size_t)v * H + k] -= rec.lr * (g * h[k]);
        if (lane == 0) b2[v] -= rec.lr * g;
    }
}
