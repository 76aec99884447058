// The text model's training step for large batches (B ≥ 64) as three fused kernels of tiled matrix
// products (gemm_128 in fused/gemm.cuh). Same math as fused/text.cu and the CPU twin src/text/model.rs;
// text.cu suits one or a few samples per step, this file suits many: there a step is three products of
// B·V·H multiply-adds each (8.6 G at B = 4096, V = 8192, H = 256), logits = H·W2ᵀ, ∂W2 = Gᵀ·H and
// ∂H = G·W2 with G = (softmax − onehot)/B, and the work is kept to those three at the FMA pipe's pace.
//
//   1. text_batch_forward   block (vocabulary group, sample tile), about one block per SM: x and
//                           h = ReLU(z1) of its 128 samples, formed once and kept in shared memory (the
//                           first group also writes them out: h stands in for z1 downstream, as ReLU′(z1)
//                           = [h > 0]), then the 128×128 logits tiles of its group of vocabulary tiles,
//                           each written out from registers and folded into the thread's running softmax
//                           partials of its rows; the last block of a sample tile (ticket) combines the
//                           groups' partials into each sample's normaliser and adds the loss. It also
//                           clears the buffers kernel 2 accumulates into.
//   2. text_batch_backward  regions of SLICE samples × SLICE vocabulary rows; per region, blocks of two
//                           kinds with the same work (128×128 outputs, K = SLICE), summed with atomics:
//                           ∂W2 tiles (vocabulary tile × hidden tile over the region's samples, and ∂b2)
//                           and ∂H tiles (sample tile × hidden tile over the region's vocabulary rows).
//                           Blocks run region by region, so the region's logits are read from memory once
//                           and then from L2. G is formed from the logits and each sample's record (max,
//                           scale, target; read once per block) as the operands are staged, never stored.
//                           W2 is only read here.
//   3. text_batch_update    ∂x = (∂H ⊙ ReLU′)·W1 scattered into the context rows of E, ∂W1 and ∂b1 into
//                           gradient buffers, W2 −= lr·∂W2; the last block (ticket) applies W1 and b1
//                           once every block has read the old W1, and clears the gradient buffers.
//   4. text_batch_optimize  only for --optim momentum or adam: kernel 3 then leaves every gradient (∂E
//                           dense, rows summed with atomics) in memory, and this pass applies optim.cuh's
//                           update to every parameter.
#include "common.cuh"
#include "losses.cuh"
#include "gemm.cuh"
#include "gemm_wgmma.cuh"
#include "optim.cuh"
#include "text_shape.cuh"
#include "text_buffers.cuh"

constexpr int TILE = G128;  // samples × vocabulary rows per block tile
constexpr int LD = G128_LD;
constexpr int H_TILES = (H + TILE - 1) / TILE;
constexpr int H8 = (H + G128_BK - 1) / G128_BK * G128_BK;  // hT rows: H, zero-padded to whole chunks
constexpr int D8 = (D + G128_BK - 1) / G128_BK * G128_BK;
// K of each text_batch_backward block: samples of a ∂W2 tile, vocabulary rows of a ∂H tile.
constexpr int SLICE = 1024;
// Samples each ∂W1 block sums over.
constexpr int B_SLICE = 128;

__device__ __forceinline__ unsigned sample_position(const unsigned* positions, const unsigned* cursor, unsigned offset,
                                                    int s) {
    return __ldg(&positions[__ldg(cursor) + offset + s]);
}

// dst[j] += v[j] for j < min(4, count): one 16-byte atomic where rows of H floats keep it aligned.
__device__ __forceinline__ void add_row4(float* dst, float4 v, int count) {
    if constexpr (H % 4 == 0) {
        atomic_add4(dst, v);
    } else {
        const float a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (j < count) atomicAdd(dst + j, a[j]);
    }
}

// x (the mean of the context embeddings) of samples s0 … s0 + sb − 1 into xT [D8][LD] (k-major, zero
// past D), and into x_out's rows when given.
__device__ __forceinline__ void gather_inputs(const float* E, const unsigned* tokens, const unsigned* positions,
                                              const unsigned* cursor, unsigned offset, int N, int s0, int sb,
                                              float* xT, float* x_out) {
    const float inv_n = 1.0f / N;
    for (int i = threadIdx.x; i < sb * D; i += THREADS) {
        const int m = i / D, d = i % D;
        const unsigned pos = sample_position(positions, cursor, offset, s0 + m);
        float sum = 0.0f;
        for (int n = 0; n < N; ++n) sum += __ldg(&E[(size_t)__ldg(&tokens[pos - N + n]) * D + d]);
        const float x = sum * inv_n;
        xT[d * LD + m] = x;
        if (x_out) x_out[(size_t)s0 * D + i] = x;
    }
    for (int i = threadIdx.x; i < (D8 - D) * LD; i += THREADS) xT[D * LD + i] = 0.0f;
}

// h = ReLU(x·W1ᵀ + b1) of the tile's sb samples (xT as gather_inputs leaves it, after a barrier) for hidden
// units n0 … n0 + TILE − 1: out(m, n, h) once per sample m < sb and unit n < H.
template <class Out>
__device__ __forceinline__ void hidden_tile(const float* W1, const float* b1, const float* xT, int sb, int n0,
                                            float* stage, Out out) {
    auto w1 = staged<true>([=](int h, int d) { return W1[(size_t)h * D + d]; }, H, n0, D, stage);
    Resident x{xT};
    gemm_128(sb, H, D, 0, n0, x, w1, [&](int m, int n, float4 acc) {
        const float z[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (n + j < H) out(m, n + j, fmaxf(z[j] + b1[n + j], 0.0f));
    });
}

// dynamic shared memory: hT [H8][LD], then xT [D8][LD], then one staged operand. W1 and b1 are restrict
// parameters, not read through __ldg: see fused/text_buffers.cuh.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
text_batch_forward(const TextBuffers buf, unsigned offset, int V, int N, int B, const float* __restrict__ W1,
                   const float* __restrict__ b1) {
    const float* __restrict__ E = buf.embedding;
    const float* __restrict__ W2 = buf.w2;
    const float* __restrict__ b2 = buf.b2;
    const unsigned* __restrict__ tokens = buf.tokens;
    const unsigned* __restrict__ positions = buf.positions;
    const unsigned* __restrict__ cursor = buf.cursor;
    float* __restrict__ x_out = buf.x;
    float* __restrict__ hidden_out = buf.z1;
    float* __restrict__ dh_out = buf.dh;
    float* __restrict__ logits = buf.logits;
    SoftmaxStat* __restrict__ stats = reinterpret_cast<SoftmaxStat*>(buf.stats);
    float* __restrict__ norm = buf.norm;
    unsigned* __restrict__ tickets = buf.tile_tickets;
    double* __restrict__ loss_sum = buf.loss_sum;
    float* __restrict__ grad_w2 = buf.grad_w2;
    float* __restrict__ grad_b2 = buf.grad_b2;
    extern __shared__ __align__(16) float smem[];
    float* hT = smem;  // ReLU(z1) of the tile's samples, k-major: hT[h][m]
    float* xT = hT + H8 * LD;
    float* stage = xT + D8 * LD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int s0 = blockIdx.y * TILE, sb = min(TILE, B - s0);
    const int v_tiles = (V + TILE - 1) / TILE;
    const bool writes_hidden = blockIdx.x == 0;

    // Clear what text_batch_backward sums into: ∂H of this tile's samples, ∂W2 and ∂b2 across the grid.
    if (writes_hidden)
        for (int i = threadIdx.x; i < sb * H; i += THREADS) dh_out[(size_t)s0 * H + i] = 0.0f;
    {
        const size_t block = (size_t)blockIdx.y * gridDim.x + blockIdx.x, stride = (size_t)gridDim.x * gridDim.y * THREADS;
        for (size_t i = block * THREADS + threadIdx.x; i < (size_t)V * H; i += stride) grad_w2[i] = 0.0f;
        for (size_t i = block * THREADS + threadIdx.x; i < (size_t)V; i += stride) grad_b2[i] = 0.0f;
    }

    gather_inputs(E, tokens, positions, cursor, offset, N, s0, sb, xT, writes_hidden ? x_out : nullptr);
    for (int i = threadIdx.x; i < (H8 - H) * LD; i += THREADS) hT[H * LD + i] = 0.0f;
    __syncthreads();
    for (int n0 = 0; n0 < H; n0 += TILE)
        hidden_tile(W1, b1, xT, sb, n0, stage, [&](int m, int n, float h) {
            hT[n * LD + m] = h;
            if (writes_hidden) hidden_out[(size_t)(s0 + m) * H + n] = h;
        });

    // The group's vocabulary tiles, straight from the register tiles: logits out (each warp store fills
    // four 128-byte rows) and the running softmax partials of the thread's 8 rows over its 8 columns.
    const G128Thread t;
    SoftmaxStat run[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) run[i] = softmax_stat_empty();
    Resident h_op{hT};
    for (int vt = blockIdx.x; vt < v_tiles; vt += gridDim.x) {
        const int v0 = vt * TILE;
        auto w2 = staged<true>([=](int v, int h) { return __ldg(&W2[(size_t)v * H + h]); }, V, v0, H, stage);
        float bias[8];  // −∞ past V, which leaves those columns out of the partials; loaded before the product
#pragma unroll
        for (int j = 0; j < 8; ++j) bias[j] = v0 + t.col(j) < V ? __ldg(&b2[v0 + t.col(j)]) : NEG_INF;
        float acc[8][8];
        gemm_128_acc(H, h_op, w2, acc);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int m = t.row(i);
            if (m >= sb) continue;
            float l[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) l[j] = acc[i][j] + bias[j];
            float* out = logits + (size_t)(s0 + m) * V + v0;
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int n = t.col(4 * half);
                const float* q = l + 4 * half;
                if (V % 4 == 0 && v0 + n + 3 < V)  // 16-byte aligned: rows of V floats, n a multiple of 4
                    *reinterpret_cast<float4*>(out + n) = make_float4(q[0], q[1], q[2], q[3]);
                else
#pragma unroll
                    for (int j = 0; j < 4; ++j)
                        if (v0 + n + j < V) out[n + j] = q[j];
            }
            float max = l[0];
#pragma unroll
            for (int j = 1; j < 8; ++j) max = fmaxf(max, l[j]);
            if (max == NEG_INF) continue;  // every column past V
            max = fmaxf(max, run[i].max);
            float sum = run[i].sum * expf(run[i].max - max);
#pragma unroll
            for (int j = 0; j < 8; ++j) sum += expf(l[j] - max);
            run[i] = {max, sum};
        }
    }

    // A row's 16 partials: 8 lanes of a warp (lane mod 8), then the warp pair (warp mod 2) in shared memory.
    SoftmaxStat* pair = reinterpret_cast<SoftmaxStat*>(stage);  // [2][TILE], over the staged operand
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) {
            const SoftmaxStat other = {__shfl_xor_sync(FULL_MASK, run[i].max, o), __shfl_xor_sync(FULL_MASK, run[i].sum, o)};
            run[i] = softmax_merge(run[i], other);
        }
        if (lane % 8 == 0) pair[warp % 2 * TILE + t.row(i)] = run[i];
    }
    __syncthreads();
    for (int m = threadIdx.x; m < sb; m += THREADS)
        stats[(size_t)(s0 + m) * gridDim.x + blockIdx.x] = softmax_merge(pair[m], pair[TILE + m]);

    if (!last_block_to_finish(&tickets[blockIdx.y])) return;
    for (int m = warp; m < sb; m += WARPS) {
        SoftmaxStat st = softmax_stat_empty();
        for (int g = lane; g < (int)gridDim.x; g += 32) {
            const float2 partial = __ldcg(reinterpret_cast<const float2*>(&stats[(size_t)(s0 + m) * gridDim.x + g]));
            st = softmax_merge(st, {partial.x, partial.y});
        }
        st = warp_softmax_merge(st);
        if (lane == 0) {
            const int s = s0 + m;
            norm[2 * s] = st.max;
            norm[2 * s + 1] = 1.0f / st.sum;
            const unsigned target = __ldg(&tokens[sample_position(positions, cursor, offset, s)]);
            atomicAdd(loss_sum, (double)(st.max + logf(st.sum) - __ldcg(&logits[(size_t)s * V + target])));
        }
    }
    if (threadIdx.x == 0) tickets[blockIdx.y] = 0;
}

// G[s][v] = (softmax − onehot(target)) / B = exp(logit − max)·scale − [v = target]/B, scale = 1/(Σexp·B),
// from a sample's record {max, scale, target as int bits}. The empty record {0, 0, −1} with logit −∞
// (padding past B, V or the slice) gives 0.
__device__ __forceinline__ float4 sample_record(const float* norm, const unsigned* tokens, const unsigned* positions,
                                                const unsigned* cursor, unsigned offset, int s, float inv_b) {
    const unsigned target = __ldg(&tokens[sample_position(positions, cursor, offset, s)]);
    return make_float4(__ldg(&norm[2 * s]), __ldg(&norm[2 * s + 1]) * inv_b, __int_as_float((int)target), 0.0f);
}

__device__ __forceinline__ float4 empty_record() { return make_float4(0.0f, 0.0f, __int_as_float(-1), 0.0f); }

__device__ __forceinline__ float dlogit(float logit, float4 record, int v, float inv_b) {
    const float g = expf(logit - record.x) * record.y;
    return v == __float_as_int(record.z) ? g - inv_b : g;
}

// The G operands of text_batch_backward, in gemm_128's operand interface. fetch only loads logits;
// commit forms G from them after the chunk's FFMAs, so a warp never waits for its loads before them.

// A ∂W2 tile's G: rows vocabulary v0 + (t mod 32) + 32r, k the region's samples, one per warp and chunk
// (a warp loads 32 adjacent logits of one sample), whose records wait in shared memory. With `sums`
// set, commit also adds each G into the thread's own slots of sums [WARPS][TILE] (rows summed over the
// block's samples, for ∂b2; the warps' slots are added at the end), in shared memory rather than the
// registers the product needs.
struct DlogitsByVocab {
    const float* logits;    // the region's first sample's row
    const float4* records;  // [SLICE], the region's samples, empty from K on
    float* smem;            // G128_STAGED_FLOATS
    float* sums;
    int V, v0, K;
    float inv_b;
    float l[4];
    int k;

    __device__ __forceinline__ static int row(int r) { return threadIdx.x % 32 + 32 * r; }

    __device__ __forceinline__ void fetch(int k0) {
        k = k0 + threadIdx.x / 32;
        const float* p = logits + (size_t)k * V + v0;
        if (k < K && v0 + TILE <= V) {
#pragma unroll
            for (int r = 0; r < 4; ++r) l[r] = __ldg(&p[row(r)]);
        } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) l[r] = k < K && v0 + row(r) < V ? __ldg(&p[row(r)]) : NEG_INF;
        }
    }
    __device__ __forceinline__ void commit(int buf) {
        const float4 record = records[k];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const float g = dlogit(l[r], record, v0 + row(r), inv_b);
            smem[buf * G128_CHUNK + threadIdx.x / 32 * LD + row(r)] = g;
            if (sums) sums[threadIdx.x / 32 * TILE + row(r)] += g;
        }
    }
    __device__ __forceinline__ const float* chunk(int buf, int) const { return smem + buf * G128_CHUNK; }
};

// A ∂H tile's G: rows samples, k the region's vocabulary rows. Thread t stages row t/2 at k 4·(t mod 2)
// … +3 (as Staged<true>), so its sample's record stays in registers and its four logits are adjacent: one
// 16-byte load where V is a multiple of 4.
struct DlogitsBySample {
    const float* logits;  // the thread's sample's row, at the region's first vocabulary row
    float4 record;        // target counted from the region's first row, −1 outside the region
    float* smem;          // G128_STAGED_FLOATS
    int K;                // the region's rows; 0 for a row past B
    bool aligned;
    float inv_b;
    float l[4];
    int k;

    __device__ __forceinline__ void fetch(int k0) {
        k = k0 + threadIdx.x % 2 * 4;
        if (aligned && k + 4 <= K) {
            const float4 q = __ldg(reinterpret_cast<const float4*>(logits + k));
            l[0] = q.x, l[1] = q.y, l[2] = q.z, l[3] = q.w;
        } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) l[r] = k + r < K ? __ldg(&logits[k + r]) : NEG_INF;
        }
    }
    __device__ __forceinline__ void commit(int buf) {
#pragma unroll
        for (int r = 0; r < 4; ++r)
            smem[buf * G128_CHUNK + (threadIdx.x % 2 * 4 + r) * LD + threadIdx.x / 2] = dlogit(l[r], record, k + r, inv_b);
    }
    __device__ __forceinline__ const float* chunk(int buf, int) const { return smem + buf * G128_CHUNK; }
};

// Blocks: regions of SLICE samples × SLICE vocabulary rows in (sample slice, vocabulary slice) order; in
// each, SLICE/TILE × H_TILES ∂W2 blocks then as many ∂H blocks (those past V or B return at once).
// dynamic shared memory: two staged operands, then the ∂W2 blocks' sample records [SLICE] (float4) and
// ∂b2 sums [WARPS][TILE].
extern "C" __global__ void __launch_bounds__(THREADS, 2)
text_batch_backward(const TextBuffers buf, unsigned offset, int V, int B) {
    const float* __restrict__ W2 = buf.w2;
    const float* __restrict__ logits = buf.logits;
    const float* __restrict__ norm = buf.norm;
    const float* __restrict__ hidden = buf.z1;
    const unsigned* __restrict__ tokens = buf.tokens;
    const unsigned* __restrict__ positions = buf.positions;
    const unsigned* __restrict__ cursor = buf.cursor;
    float* __restrict__ grad_w2 = buf.grad_w2;
    float* __restrict__ grad_b2 = buf.grad_b2;
    float* __restrict__ dh = buf.dh;
    extern __shared__ __align__(16) float smem[];
    float* a_stage = smem;
    float* b_stage = smem + G128_STAGED_FLOATS;
    const float inv_b = 1.0f / B;
    constexpr int KIND_BLOCKS = SLICE / TILE * H_TILES;
    const int v_slices = (V + SLICE - 1) / SLICE;
    const int region = blockIdx.x / (2 * KIND_BLOCKS), r = blockIdx.x % KIND_BLOCKS;
    const int ss = region / v_slices * SLICE, vs = region % v_slices * SLICE;  // the region's first sample, row
    const int tile = r / H_TILES * TILE, n0 = r % H_TILES * TILE;

    if (blockIdx.x % (2 * KIND_BLOCKS) < KIND_BLOCKS) {
        // ∂W2[v][h] += Σ_s G[s][v]·hidden[s][h] over the region's samples; ∂b2[v] += Σ_s G[s][v].
        const int v0 = vs + tile, sn = min(SLICE, B - ss);
        if (v0 >= V) return;
        float4* records = reinterpret_cast<float4*>(smem + 2 * G128_STAGED_FLOATS);
        float* sums = n0 == 0 ? smem + 2 * G128_STAGED_FLOATS + 4 * SLICE : nullptr;
        for (int k = threadIdx.x; k < SLICE; k += THREADS)
            records[k] = k < sn ? sample_record(norm, tokens, positions, cursor, offset, ss + k, inv_b) : empty_record();
        if (sums)
            for (int i = threadIdx.x; i < WARPS * TILE; i += THREADS) sums[i] = 0.0f;
        __syncthreads();
        DlogitsByVocab g{logits + (size_t)ss * V, records, a_stage, sums, V, v0, sn, inv_b, {}, 0};
        auto hs = staged<false>([=](int n, int k) { return __ldg(&hidden[(size_t)(ss + k) * H + n]); }, H, n0, sn, b_stage);
        gemm_128(V, H, sn, v0, n0, g, hs, [&](int v, int n, float4 acc) {
            add_row4(&grad_w2[(size_t)v * H + n], acc, H - n);
        });
        if (sums && threadIdx.x < TILE && v0 + threadIdx.x < V) {
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) sum += sums[w * TILE + threadIdx.x];
            atomicAdd(&grad_b2[v0 + threadIdx.x], sum);
        }
    } else {
        // ∂H[s][h] += Σ_v G[s][v]·W2[v][h] over the region's vocabulary rows.
        const int s0 = ss + tile, vn = min(SLICE, V - vs);
        if (s0 >= B) return;
        const int s = s0 + threadIdx.x / 2;
        DlogitsBySample g{logits, empty_record(), a_stage, 0, V % 4 == 0, inv_b, {}, 0};
        if (s < B) {
            g.logits = logits + (size_t)s * V + vs;
            g.record = sample_record(norm, tokens, positions, cursor, offset, s, inv_b);
            const int target = __float_as_int(g.record.z) - vs;
            g.record.z = __int_as_float(target < vn ? target : -1);  // −1 (none) outside the region
            g.K = vn;
        }
        auto w2 = staged<false>([=](int n, int k) { return __ldg(&W2[(size_t)(vs + k) * H + n]); }, H, n0, vn, b_stage);
        gemm_128(B, H, vn, s0, n0, g, w2, [&](int s, int n, float4 acc) {
            add_row4(&dh[(size_t)s * H + n], acc, H - n);
        });
    }
}

// Blocks: [∂x tiles (sample tile × embedding tile)] [∂W1 tiles (hidden tile × (D+1) tile × sample slice)]
// [W2 rows]. dynamic shared memory: two staged operands.
extern "C" __global__ void __launch_bounds__(THREADS, 2)
text_batch_update(const TextBuffers buf, unsigned offset, int V, int N, int B, float lr, int w2_blocks, int dh_parts) {
    float* __restrict__ E = buf.embedding;
    float* __restrict__ W1 = buf.w1;
    float* __restrict__ b1 = buf.b1;
    float* __restrict__ W2 = buf.w2;
    float* __restrict__ b2 = buf.b2;
    const float* __restrict__ x = buf.x;
    const float* __restrict__ hidden = buf.z1;
    const float* __restrict__ dh = buf.dh_parts ? buf.dh_parts : buf.dh;
    const float* __restrict__ grad_w2 = buf.grad_w2;
    const float* __restrict__ grad_b2 = buf.grad_b2;
    float* __restrict__ grad_w1 = buf.grad_w1;
    float* __restrict__ grad_b1 = buf.grad_b1;
    const unsigned* __restrict__ tokens = buf.tokens;
    const unsigned* __restrict__ positions = buf.positions;
    const unsigned* __restrict__ cursor = buf.cursor;
    unsigned* __restrict__ ticket = buf.ticket;
    float* __restrict__ grad_E = buf.grad_embedding;
    bf16* __restrict__ w2_bf16 = buf.w2_bf16;
    extern __shared__ __align__(16) float smem[];
    // With grad_E, every gradient is left for text_batch_optimize: ∂E rows go there, W2 and W1 stay.
    const bool fused_sgd = grad_E == nullptr;
    float* a_stage = smem;
    float* b_stage = smem + G128_STAGED_FLOATS;
    constexpr int D_TILES = (D + TILE - 1) / TILE;
    constexpr int D1_TILES = (D + 1 + TILE - 1) / TILE;
    const int s_tiles = (B + TILE - 1) / TILE;
    const int b_slices = (B + B_SLICE - 1) / B_SLICE;
    const int dx_blocks = s_tiles * D_TILES, dw1_blocks = H_TILES * D1_TILES * b_slices;
    // dz1 = ∂H ⊙ ReLU′(z1), where z1 > 0 exactly where hidden = ReLU(z1) > 0; ∂H summed over its dh_parts
    // parts ([dh_parts][B][H]) in order
    const auto dz1 = [=](int s, int h) {
        const size_t i = (size_t)s * H + h;
        if (__ldg(&hidden[i]) <= 0.0f) return 0.0f;
        float sum = __ldg(&dh[i]);
        for (int part = 1; part < dh_parts; ++part) sum += __ldg(&dh[(size_t)part * B * H + i]);
        return sum;
    };
    int b = blockIdx.x;
    if (b < dx_blocks) {
        const int s0 = (b / D_TILES) * TILE, n0 = (b % D_TILES) * TILE;
        const float scale = fused_sgd ? -lr / N : 1.0f / N;
        float* target = fused_sgd ? E : grad_E;
        auto a = staged<true>(dz1, B, s0, H, a_stage);
        auto w1 = staged<false>([=](int d, int h) { return W1[(size_t)h * D + d]; }, D, n0, H, b_stage);
        gemm_128(B, D, H, s0, n0, a, w1, [&](int s, int d, float4 acc) {
            const float dx[4] = {acc.x, acc.y, acc.z, acc.w};
            const unsigned pos = sample_position(positions, cursor, offset, s);
            for (int n = 0; n < N; ++n) {
                float* row = target + (size_t)__ldg(&tokens[pos - N + n]) * D;
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (d + j < D) atomicAdd(&row[d + j], scale * dx[j]);
            }
        });
    } else if ((b -= dx_blocks) < dw1_blocks) {
        const int slice = b % b_slices;
        b /= b_slices;
        const int m0 = (b / D1_TILES) * TILE, n0 = (b % D1_TILES) * TILE;
        const int ss = slice * B_SLICE, sn = min(B_SLICE, B - ss);
        // [∂W1 | ∂b1] = dz1ᵀ·[x | 1]
        auto a = staged<false>([=](int h, int k) { return dz1(ss + k, h); }, H, m0, sn, a_stage);
        auto xs = staged<false>([=](int d, int k) { return d < D ? __ldg(&x[(size_t)(ss + k) * D + d]) : 1.0f; }, D + 1, n0,
                                sn, b_stage);
        gemm_128(H, D + 1, sn, m0, n0, a, xs, [&](int h, int d, float4 acc) {
            const float g[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (d + j < D) atomicAdd(&grad_w1[(size_t)h * D + d + j], g[j]);
                else if (d + j == D) atomicAdd(&grad_b1[h], g[j]);
            }
        });
    } else if (fused_sgd) {
        b -= dw1_blocks;
        const size_t n = (size_t)V * H;
        for (size_t i = (size_t)b * THREADS + threadIdx.x; i < n; i += (size_t)w2_blocks * THREADS) {
            W2[i] -= lr * __ldg(&grad_w2[i]);
            if (w2_bf16) w2_bf16[i] = to_bf16(W2[i]);
        }
        for (int v = b * THREADS + threadIdx.x; v < V; v += w2_blocks * THREADS) b2[v] -= lr * __ldg(&grad_b2[v]);
    }

    if (!last_block_to_finish(ticket)) return;
    if (threadIdx.x == 0) *ticket = 0;
    if (!fused_sgd) return;
    for (int i = threadIdx.x; i < H * D; i += THREADS) {
        W1[i] -= lr * __ldcg(&grad_w1[i]);
        grad_w1[i] = 0.0f;
    }
    for (int j = threadIdx.x; j < H; j += THREADS) {
        b1[j] -= lr * __ldcg(&grad_b1[j]);
        grad_b1[j] = 0.0f;
    }
}

// The optimizer step (optim.cuh) of --optim momentum and adam, after text_batch_update left every
// gradient in memory: a grid-stride pass over the parameters as one vector E, W1, b1, W2, b2 (m and v
// laid out the same), clearing the gradients text_batch_update accumulates into (text_batch_forward
// clears ∂W2 and ∂b2). step: optimizer steps taken, advanced by the last block; ticket zero between launches.
// ∂W2 and ∂b2 are restrict parameters, not read through __ldg: see fused/text_buffers.cuh.
extern "C" __global__ void __launch_bounds__(THREADS)
text_batch_optimize(const TextBuffers buf, const OptimSettings optim, int V, float lr,
                    const float* __restrict__ grad_w2, const float* __restrict__ grad_b2) {
    float* __restrict__ E = buf.embedding;
    float* __restrict__ W1 = buf.w1;
    float* __restrict__ b1 = buf.b1;
    float* __restrict__ W2 = buf.w2;
    float* __restrict__ b2 = buf.b2;
    float* __restrict__ grad_E = buf.grad_embedding;
    float* __restrict__ grad_w1 = buf.grad_w1;
    float* __restrict__ grad_b1 = buf.grad_b1;
    float* __restrict__ m = buf.m;
    float* __restrict__ v = buf.v;
    unsigned* __restrict__ step = buf.step;
    unsigned* __restrict__ ticket = buf.optimizer_ticket;
    bf16* __restrict__ w2_bf16 = buf.w2_bf16;
    const unsigned t = *step + 1;
    OptimStep s = optim_step(optim, lr);
    optim_bias_corrections(s, t);
    float* params[5] = {E, W1, b1, W2, b2};
    float* grads[5] = {grad_E, grad_w1, grad_b1, const_cast<float*>(grad_w2), const_cast<float*>(grad_b2)};
    const size_t sizes[5] = {(size_t)V * D, (size_t)H * D, (size_t)H, (size_t)V * H, (size_t)V};
    size_t base = 0;
    for (int k = 0; k < 5; ++k) {
        for (size_t i = (size_t)blockIdx.x * THREADS + threadIdx.x; i < sizes[k]; i += (size_t)gridDim.x * THREADS) {
            const float g = grads[k][i];
            params[k][i] = optim_update(s, params[k][i], g, m[base + i], v[base + i]);
            if (k < 3) grads[k][i] = 0.0f;
            if (k == 3 && w2_bf16) w2_bf16[i] = to_bf16(params[k][i]);
        }
        base += sizes[k];
    }
    if (last_block_to_finish(ticket) && threadIdx.x == 0) {
        *step = t;
        *ticket = 0;
    }
}

// ---- bf16 (--precision bf16) ----
// The same step with its three V×H products on the bf16 tensor cores (Bf16Tile: `wgmma` on sm_90a,
// mma.sync before), fp32 sums, as PyTorch's bf16 autocast runs Linear(H, V): the products read bf16
// copies of h and W2 and a bf16 G; the logits, the softmax statistics, the loss, every gradient and every
// update stay fp32, and so does the small embedding → hidden product (B·H·D, 1/128 of a product at
// V = 8192, D = 64). Kernels, in order:
//   text_batch_hidden_bf16    x and h of a 128-sample × 128-unit tile (gather_inputs, hidden_tile): x and
//                             h in fp32 for text_batch_update, h's bf16 copy for the products.
//   text_batch_logits_bf16    logits = h·W2ᵀ + b2, one 128×128 tile a block, fp32 out.
//   text_batch_dlogits_bf16   one block a sample: the softmax normaliser of its logits row, its loss, and
//                             G = (softmax − onehot)/B as bf16 rows of ldg (V rounded up to 8, so that
//                             rows are whole 16-byte copies; the padding is zero).
//   text_batch_backward_bf16  ∂W2 = Gᵀ·h tiles (whole K = B, stored, no atomics; the first column of tiles
//                             also sums G's columns as the product streams them, ∂b2), then ∂H = G·W2
//                             tiles split over `splits` ranges of V into [splits][B][H] parts, so that
//                             both kinds fill the GPU and every sum has a fixed order.
// text_batch_update then sums ∂H's parts (dh_parts) and refreshes W2's bf16 copy as it updates W2 (or
// text_batch_optimize does).

// grid (ceil(H / TILE), ceil(B / TILE)); dynamic shared memory: xT [D8][LD], then one staged operand.
extern "C" __global__ void __launch_bounds__(THREADS)
text_batch_hidden_bf16(const TextBuffers buf, unsigned offset, int N, int B, const float* __restrict__ W1,
                       const float* __restrict__ b1) {
    const float* __restrict__ E = buf.embedding;
    const unsigned* __restrict__ tokens = buf.tokens;
    const unsigned* __restrict__ positions = buf.positions;
    const unsigned* __restrict__ cursor = buf.cursor;
    float* __restrict__ x_out = buf.x;
    float* __restrict__ hidden_out = buf.z1;
    bf16* __restrict__ hidden_bf16 = buf.hidden_bf16;
    extern __shared__ __align__(16) float smem[];
    float* xT = smem;
    float* stage = xT + D8 * LD;
    const int s0 = blockIdx.y * TILE, sb = min(TILE, B - s0);
    gather_inputs(E, tokens, positions, cursor, offset, N, s0, sb, xT, blockIdx.x == 0 ? x_out : nullptr);
    __syncthreads();
    hidden_tile(W1, b1, xT, sb, blockIdx.x * TILE, stage, [&](int m, int n, float h) {
        const size_t i = (size_t)(s0 + m) * H + n;
        hidden_out[i] = h;
        hidden_bf16[i] = to_bf16(h);
    });
}

// grid (ceil(V / 128), ceil(B / 128)); dynamic shared memory: Bf16Tile::SHARED_FLOATS.
extern "C" __global__ void __launch_bounds__(THREADS, 2)
text_batch_logits_bf16(const bf16* __restrict__ hidden_bf16, const bf16* __restrict__ w2_bf16,
                       const float* __restrict__ b2, float* __restrict__ logits, int V, int B) {
    extern __shared__ __align__(16) float smem[];
    gemm_tile_bf16_fast<false, true>(B, V, H, blockIdx.y * Bf16Tile::BM, blockIdx.x * Bf16Tile::BN, hidden_bf16, H,
                                     w2_bf16, H, [&](int m, int n, float v0, float v1) {
                                         float* row = logits + (size_t)m * V;
                                         if (V % 2 == 0) {  // n even: an 8-byte aligned pair
                                             *reinterpret_cast<float2*>(row + n) = make_float2(v0 + b2[n], v1 + b2[n + 1]);
                                         } else {
                                             row[n] = v0 + b2[n];
                                             if (n + 1 < V) row[n + 1] = v1 + b2[n + 1];
                                         }
                                     },
                                     smem);
}

// grid (B); block s: the softmax normaliser of logits row s (norm[2s], norm[2s + 1] = max, 1/Σexp, as
// text_batch_forward leaves them), its loss into loss_sum, and row s of G (ldg bf16, zero from V on).
extern "C" __global__ void __launch_bounds__(THREADS)
text_batch_dlogits_bf16(const TextBuffers buf, unsigned offset, int V, int ldg, int B) {
    const float* __restrict__ logits = buf.logits;
    const unsigned* __restrict__ tokens = buf.tokens;
    const unsigned* __restrict__ positions = buf.positions;
    const unsigned* __restrict__ cursor = buf.cursor;
    float* __restrict__ norm = buf.norm;
    double* __restrict__ loss_sum = buf.loss_sum;
    bf16* __restrict__ dlogits = buf.dlogits;
    __shared__ SoftmaxStat scratch[WARPS];
    const int s = blockIdx.x;
    const float* row = logits + (size_t)s * V;
    SoftmaxStat st = softmax_stat_empty();
    for (int v = threadIdx.x; v < V; v += THREADS) st = softmax_push(st, __ldg(&row[v]));
    st = block_softmax_merge(st, scratch);
    const float inv_b = 1.0f / B;
    const unsigned target = __ldg(&tokens[sample_position(positions, cursor, offset, s)]);
    const float4 record = make_float4(st.max, inv_b / st.sum, __int_as_float((int)target), 0.0f);
    if (threadIdx.x == 0) {
        norm[2 * s] = st.max;
        norm[2 * s + 1] = 1.0f / st.sum;
        atomicAdd(loss_sum, (double)(st.max + logf(st.sum) - __ldg(&row[target])));
    }
    unsigned* out = reinterpret_cast<unsigned*>(dlogits + (size_t)s * ldg);  // pairs: ldg is even
    for (int v = 2 * threadIdx.x; v < ldg; v += 2 * THREADS) {
        const float g0 = v < V ? dlogit(__ldg(&row[v]), record, v, inv_b) : 0.0f;
        const float g1 = v + 1 < V ? dlogit(__ldg(&row[v + 1]), record, v + 1, inv_b) : 0.0f;
        out[v / 2] = bf16x2(g0, g1);
    }
}

// grid (v_tiles·h_tiles + splits·s_tiles·h_tiles): first the ∂W2 tiles (vocabulary tile, hidden tile),
// then the ∂H tiles (sample tile, hidden tile, split), each split over split_k vocabulary rows (a multiple
// of the tile's k). Dynamic shared memory: Bf16Tile::SHARED_FLOATS.
extern "C" __global__ void __launch_bounds__(THREADS, 2)
text_batch_backward_bf16(const TextBuffers buf, int ldg, int V, int B, int split_k) {
    const bf16* __restrict__ dlogits = buf.dlogits;
    const bf16* __restrict__ hidden_bf16 = buf.hidden_bf16;
    const bf16* __restrict__ w2_bf16 = buf.w2_bf16;
    float* __restrict__ grad_w2 = buf.grad_w2;
    float* __restrict__ grad_b2 = buf.grad_b2;
    float* __restrict__ dh_parts = buf.dh_parts;
    extern __shared__ __align__(16) float smem[];
    using T = Bf16Tile;
    constexpr int H_TILES_BF16 = (H + T::BN - 1) / T::BN;
    const int v_tiles = (V + T::BM - 1) / T::BM;
    int b = blockIdx.x;
    if (b < v_tiles * H_TILES_BF16) {
        // ∂W2[v][h] = Σ_s G[s][v]·h[s][h]; the tiles at h 0 also ∂b2[v] = Σ_s G[s][v]: thread t sums row
        // t/2 of each chunk of Gᵀ over the chunk's half t mod 2, then the pair adds up.
        const int v0 = b / H_TILES_BF16 * T::BM, n0 = b % H_TILES_BF16 * T::BN;
        float row_sum = 0.0f;
        const auto sum_rows = [&](const auto& at) {
            if (n0 != 0) return;
            const int o = threadIdx.x / 2, k0 = threadIdx.x % 2 * (T::BK / 2);
#pragma unroll 8
            for (int k = 0; k < T::BK / 2; ++k) row_sum += bf16_value(at(o, k0 + k));
        };
        gemm_tile_bf16_fast<true, false>(V, H, B, v0, n0, dlogits, ldg, hidden_bf16, H,
                                         [&](int m, int n, float g0, float g1) {
                                             float* out = grad_w2 + (size_t)m * H + n;
                                             out[0] = g0;
                                             if (n + 1 < H) out[1] = g1;
                                         },
                                         smem, sum_rows);
        row_sum += __shfl_xor_sync(FULL_MASK, row_sum, 1);
        const int v = v0 + threadIdx.x / 2;
        if (n0 == 0 && threadIdx.x % 2 == 0 && v < V) grad_b2[v] = row_sum;
    } else {
        // ∂H[s][h] = Σ_v G[s][v]·W2[v][h] over the split's rows v.
        b -= v_tiles * H_TILES_BF16;
        const int splits = (V + split_k - 1) / split_k;
        const int split = b % splits, tile = b / splits;
        const int s0 = tile / H_TILES_BF16 * T::BM, n0 = tile % H_TILES_BF16 * T::BN;
        const int k0 = split * split_k, kn = min(split_k, V - k0);
        float* part = dh_parts + (size_t)split * B * H;
        gemm_tile_bf16_fast<false, false>(B, H, kn, s0, n0, dlogits + k0, ldg, w2_bf16 + (size_t)k0 * H, H,
                                          [&](int m, int n, float d0, float d1) {
                                              float* out = part + (size_t)m * H + n;
                                              out[0] = d0;
                                              if (n + 1 < H) out[1] = d1;
                                          },
                                          smem);
    }
}

// W2's bf16 copy, made once when a trainer turns to bf16 (the updates keep it from then on).
extern "C" __global__ void __launch_bounds__(THREADS)
text_batch_round_w2(const float* __restrict__ W2, bf16* __restrict__ w2_bf16, int count) {
    for (int i = blockIdx.x * THREADS + threadIdx.x; i < count; i += gridDim.x * THREADS) w2_bf16[i] = to_bf16(W2[i]);
}
