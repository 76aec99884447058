// The text model's training step as three fused kernels (CPU twin: src/text/model.rs).
//
//   x = mean E[context]   z1 = W1·x + b1   h = ReLU(z1)   logits = W2·h + b2   loss = −log softmax[target]
//
// The output layer (V×H, 8 MB at V=8192, H=256) is the cost; it is split over the whole GPU: block b owns
// vocabulary rows [b·R, b·R+R) and stages them in shared memory. Each step is
//   1. text_forward   reads the step's z1 (formed by the step before, see 3), forms its rows' logits and
//                     their softmax partial (max, Σexp) per sample.
//   2. text_backward  every block combines the G partials into the global normaliser, forms
//                     dlogits = (p − onehot)/B for its rows and uses each old W2 row twice: for its share
//                     of dh = W2ᵀ·dlogits (added to dh with atomics) and for the row's SGD update (W2 and
//                     b2 are updated here, in place). The block owning the target adds the sample's loss to
//                     a running double.
//   3. text_update    blocks own hidden rows: ReLU mask on dh, update W1 and b1, and sum their share of
//                     dx = W1ᵀ·dz1; then the embedding rows of the context tokens get −lr/N·dx (atomics: a
//                     token may recur within a batch), and x and z1 of the next step's samples are formed
//                     from the updated E, W1 and b1 (two ways, see text_update).
// Forming the next step's hidden layer at the end of step t, rather than in every block of text_forward,
// takes 131 redundant reads of W1 (8 MB of L2 traffic) and two dependent round trips off the start of
// text_forward. text_hidden forms x and z1 where no step came before (the first step of a run, evaluation).
//
// A step is latency-bound, not bandwidth-bound, so each kernel is launched with programmatic dependent
// launch: before grid_dependency_wait() it loads what the previous kernels do not write (sample tokens,
// its own weight rows), overlapping the previous kernel's tail. The W2 rows go to shared memory by
// cp.async, not to registers, so a kernel's blocks leave room on their SM for the next kernel's blocks
// (all four kernels ask for the same shared-memory carveout, see src/device/mod.rs). Every kernel waits
// before it touches anything the step before it writes, and allows its dependant to launch only after
// that wait, so a kernel never overlaps the one two places before it. After the wait, each kernel issues
// all its loads before it uses any, so it pays one round trip to L2, not one per loop iteration.
//
// A step's samples are positions[*cursor + offset .. + B): the cursor lives on the device, so a CUDA graph
// of many steps replays unchanged and text_advance moves the cursor after it. B samples go through each
// kernel SB at a time (SB is compiled in: per-sample accumulators stay in registers); when B > SB, the W2
// gradient of a block's rows is summed in shared memory and applied at the end.
#include "common.cuh"
#include "losses.cuh"
#include "text_shape.cuh"
#include "text_buffers.cuh"

#ifndef TEXT_SB
#define TEXT_SB 8
#endif

constexpr int SB = TEXT_SB;
constexpr int HP = (H + 31) / 32;  // elements of an H-vector per lane
constexpr int UPDATE_ROWS = WARPS; // hidden rows per text_update block: one per warp
constexpr int D_CHUNK = D < 64 ? D : 64; // W1 weights a thread loads at once in hidden_layer
// Logits per thread that text_backward loads together with the softmax partials (the rest: one more trip).
constexpr int DL_SLOTS = 4;
// W2 rows a warp takes together from shared memory: their reductions overlap.
constexpr int ROW_GROUP = HP <= 8 ? 8 : (HP <= 16 ? 4 : (HP <= 32 ? 2 : 1));

// W2 rows [first, first + count) and their b2 entries into shared memory (ws [count][H], bs [count]) with
// asynchronous copies, so the rows cost no registers while they wait: a kernel holding them leaves room
// on the SM for the next kernel's blocks to launch early and stage theirs. The caller waits with
// cp_async_wait_all() and a barrier.
__device__ __forceinline__ void stage_rows(float* ws, float* bs, const float* W2, const float* b2, int first, int count) {
    const float* src = W2 + (size_t)first * H;
    const int n = count * H;
    if constexpr (H % 4 == 0) {
        for (int i = 4 * threadIdx.x; i < n; i += 4 * THREADS) cp_async16(ws + i, src + i);
    } else {
        for (int i = threadIdx.x; i < n; i += THREADS) cp_async4(ws + i, src + i);
    }
    for (int i = threadIdx.x; i < count; i += THREADS) cp_async4(bs + i, b2 + first + i);
    cp_async_commit();
}

// Walks the block's W2 rows [row0, row0 + rows) of chunk c0 tile by tile through shared memory and calls
// row(r, w, bias) for each, r counted from row0, w[i] = W2[row0 + r][lane + 32·i] (zero past H), bias =
// b2[row0 + r]; each warp takes ROW_GROUP rows at a time. Every tile is staged here except the prologue's
// first, which stays for later chunks when it holds all the block's rows. All threads must call it.
template <class Row>
__device__ __forceinline__ void for_each_staged_row(float* ws, float* bs, const float* W2, const float* b2, int row0,
                                                    int rows, int tile_rows, int c0, Row row) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int t0 = 0; t0 < rows; t0 += tile_rows) {
        const int tr = min(tile_rows, rows - t0);
        if (t0 > 0 || (c0 > 0 && rows > tile_rows)) {
            __syncthreads();
            stage_rows(ws, bs, W2, b2, row0 + t0, tr);
        }
        cp_async_wait_all();
        __syncthreads();
        for (int r0 = warp * ROW_GROUP; r0 < tr; r0 += WARPS * ROW_GROUP) {
#pragma unroll
            for (int q = 0; q < ROW_GROUP; ++q) {
                const int tile_r = r0 + q;
                if (tile_r < tr) {
                    float w[HP];
#pragma unroll
                    for (int i = 0; i < HP; ++i) w[i] = lane + 32 * i < H ? ws[tile_r * H + lane + 32 * i] : 0.0f;
                    row(t0 + tile_r, w, bs[tile_r]);
                }
            }
        }
    }
}

// Targets of the step's samples c0 .. c0+sb, into shared memory. Read-only data: safe before the grid
// dependency wait (only text_advance, never a step kernel, moves the cursor).
__device__ __forceinline__ void load_targets(unsigned* target, const unsigned* tokens, const unsigned* positions,
                                             const unsigned* cursor, unsigned offset, int c0, int sb) {
    if (threadIdx.x < sb)
        target[threadIdx.x] = __ldg(&tokens[__ldg(&positions[__ldg(cursor) + offset + c0 + threadIdx.x])]);
}

// z1_out[s][j] = W1[j]·xs[s] + b1[j] for the sb samples. W1 and b1 are read through L2 (__ldcg): in
// text_update other blocks of the same launch have just written them.
// With D a multiple of 4 and D/4 dividing 32, ROW_LANES = D/4 consecutive lanes hold one W1 row as
// float4s (coalesced, all loads in flight) and reduce with ROW_LANES-wide shuffles; otherwise one
// thread per row reads D_CHUNK weights at a time.
constexpr int ROW_LANES = D >= 4 ? D / 4 : 1;
constexpr bool HIDDEN_VECTORISED = D >= 4 && D % 4 == 0 && ROW_LANES <= 32 && 32 % ROW_LANES == 0;

__device__ __forceinline__ void hidden_layer(const float* xs, const float* W1, const float* b1, float* z1_out, int sb) {
    if constexpr (HIDDEN_VECTORISED) {
        constexpr int ROWS_PER_PASS = THREADS / ROW_LANES;
        constexpr int PASSES = (H + ROWS_PER_PASS - 1) / ROWS_PER_PASS;
        const int part = threadIdx.x % ROW_LANES;  // which float4 of the row
        const float4* W1v = reinterpret_cast<const float4*>(W1);
        float4 w[PASSES];
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
            const int j = p * ROWS_PER_PASS + threadIdx.x / ROW_LANES;
            w[p] = j < H ? __ldcg(&W1v[(size_t)j * ROW_LANES + part]) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int p = 0; p < PASSES; ++p) {
            const int j = p * ROWS_PER_PASS + threadIdx.x / ROW_LANES;
#pragma unroll
            for (int s = 0; s < SB; ++s) {
                if (s >= sb) break;
                const float* x = xs + s * D + 4 * part;
                float acc = w[p].x * x[0] + w[p].y * x[1] + w[p].z * x[2] + w[p].w * x[3];
#pragma unroll
                for (int offset = ROW_LANES / 2; offset > 0; offset >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, offset);
                if (part == 0 && j < H) z1_out[(size_t)s * H + j] = acc + __ldcg(&b1[j]);
            }
        }
    } else {
        for (int j = threadIdx.x; j < H; j += THREADS) {
            float acc[SB];
#pragma unroll
            for (int s = 0; s < SB; ++s) acc[s] = 0.0f;
            for (int k0 = 0; k0 < D; k0 += D_CHUNK) {
                float w[D_CHUNK];
#pragma unroll
                for (int k = 0; k < D_CHUNK; ++k) w[k] = (k0 + k < D) ? __ldcg(&W1[(size_t)j * D + k0 + k]) : 0.0f;
#pragma unroll
                for (int s = 0; s < SB; ++s) {
                    if (s >= sb) break;
#pragma unroll
                    for (int k = 0; k < D_CHUNK; ++k)
                        if (k0 + k < D) acc[s] += w[k] * xs[s * D + k0 + k];
                }
            }
            const float bias = __ldcg(&b1[j]);
#pragma unroll
            for (int s = 0; s < SB; ++s) {
                if (s >= sb) break;
                z1_out[(size_t)s * H + j] = acc[s] + bias;
            }
        }
    }
}

// x and z1 of the samples at positions[first .. first + count): x_out[s] = mean E[context], z1_out[s] =
// W1·x + b1. One block, SB samples at a time; xs holds SB·D floats, context SB·N tokens (shared memory).
// E is read through L2: in text_update this block has just updated it with atomics.
__device__ __forceinline__ void samples_hidden(const float* E, const float* W1, const float* b1,
                                               const unsigned* __restrict__ tokens, const unsigned* positions,
                                               unsigned first, int count, int N, float* x_out, float* z1_out,
                                               float* xs, unsigned* context) {
    const float inv_n = 1.0f / N;
    for (int c0 = 0; c0 < count; c0 += SB) {
        const int sb = min(SB, count - c0);
        __syncthreads();
        for (int i = threadIdx.x; i < sb * N; i += THREADS) {
            const unsigned p = __ldg(&positions[first + c0 + i / N]);
            context[i] = __ldg(&tokens[p - N + i % N]);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < sb * D; i += THREADS) {
            const int s = i / D, d = i % D;
            float sum = 0.0f;
            for (int n = 0; n < N; ++n) sum += __ldcg(&E[(size_t)context[s * N + n] * D + d]);
            xs[i] = sum * inv_n;
            x_out[(size_t)c0 * D + i] = xs[i];
        }
        __syncthreads();
        hidden_layer(xs, W1, b1, z1_out + (size_t)c0 * H, sb);
    }
}

// x and z1 of a step's B samples, where no text_update formed them (the first step of a run, evaluation).
// Block b takes samples [b·SB, b·SB + SB). dynamic shared memory: xs[SB][D], context tokens [SB][N]
extern "C" __global__ void __launch_bounds__(THREADS)
text_hidden(const TextBuffers buf, unsigned offset, int N, int B) {
    const float* __restrict__ E = buf.embedding;
    const float* __restrict__ W1 = buf.w1;
    const float* __restrict__ b1 = buf.b1;
    const unsigned* __restrict__ tokens = buf.tokens;
    const unsigned* __restrict__ positions = buf.positions;
    const unsigned* __restrict__ cursor = buf.cursor;
    float* __restrict__ x_out = buf.x;
    float* __restrict__ z1_out = buf.z1;
    extern __shared__ float smem[];
    float* xs = smem;
    unsigned* context = (unsigned*)(xs + SB * D);
    const int s0 = blockIdx.x * SB;
    samples_hidden(E, W1, b1, tokens, positions, __ldg(cursor) + offset + s0, min(SB, B - s0), N,
                   x_out + (size_t)s0 * D, z1_out + (size_t)s0 * H, xs, context);
}

// dynamic shared memory: ws[tile_rows][H], hs[SB][H], bs[tile_rows]
extern "C" __global__ void __launch_bounds__(THREADS, 2)
text_forward(const TextBuffers buf, int V, int B, int rows_per_block, int tile_rows) {
    const float* W2 = buf.w2;
    const float* b2 = buf.b2;
    const float* __restrict__ z1 = buf.z1;
    float* __restrict__ logits = buf.logits;
    SoftmaxStat* __restrict__ stats = reinterpret_cast<SoftmaxStat*>(buf.stats);
    float* __restrict__ dh = buf.dh;
    float* __restrict__ dx_sum = buf.dx_sum;
    extern __shared__ float4 smem4[];
    float* ws = reinterpret_cast<float*>(smem4);
    float* hs = ws + (size_t)tile_rows * H;
    float* bs = hs + SB * H;
    __shared__ SoftmaxStat warp_stats[WARPS][SB];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blockIdx.x * rows_per_block;
    const int rows = min(rows_per_block, V - row0);

    // Prologue: W2 and b2 were last written by text_backward, which finished before the step's
    // previous kernel let this one launch.
    stage_rows(ws, bs, W2, b2, row0, min(rows, tile_rows));
    grid_dependency_wait();
    allow_dependent_launch();
    if (blockIdx.x == 0) {  // text_backward sums this step's dh here, text_update its dx
        for (int i = threadIdx.x; i < B * H; i += THREADS) dh[i] = 0.0f;
        for (int i = threadIdx.x; i < B * D; i += THREADS) dx_sum[i] = 0.0f;
    }

    for (int c0 = 0; c0 < B; c0 += SB) {
        const int sb = min(SB, B - c0);
        if (c0 > 0) __syncthreads();
        for (int i = threadIdx.x; i < sb * H; i += THREADS) hs[i] = fmaxf(__ldcg(&z1[(size_t)c0 * H + i]), 0.0f);

        SoftmaxStat st[SB];
#pragma unroll
        for (int s = 0; s < SB; ++s) st[s] = softmax_stat_empty();
        for_each_staged_row(ws, bs, W2, b2, row0, rows, tile_rows, c0, [&](int r, const float (&w)[HP], float bias) {
#pragma unroll
            for (int s = 0; s < SB; ++s) {
                if (s >= sb) break;
                float acc = 0.0f;
#pragma unroll
                for (int i = 0; i < HP; ++i)
                    if (lane + 32 * i < H) acc += w[i] * hs[s * H + lane + 32 * i];
                const float logit = warp_sum(acc) + bias;
                if (lane == 0) logits[(size_t)(c0 + s) * V + row0 + r] = logit;
                st[s] = softmax_push(st[s], logit);
            }
        });
        if (lane == 0)
#pragma unroll
            for (int s = 0; s < SB; ++s) warp_stats[warp][s] = st[s];
        __syncthreads();
        if (threadIdx.x < sb) {
            SoftmaxStat total = softmax_stat_empty();
            for (int w = 0; w < WARPS; ++w) total = softmax_merge(total, warp_stats[w][threadIdx.x]);
            stats[(size_t)(c0 + threadIdx.x) * gridDim.x + blockIdx.x] = total;
        }
    }
}

// A softmax partial that the kernel only reads, through the read-only path.
__device__ __forceinline__ SoftmaxStat ldg_stat(const SoftmaxStat* p) { return {__ldg(&p->max), __ldg(&p->sum)}; }

// Global softmax normaliser of sample s from the G block partials: one warp. Returns (max, sum).
__device__ __forceinline__ SoftmaxStat combine_partials(const SoftmaxStat* stats, int s, int G) {
    const int lane = threadIdx.x % 32;
    SoftmaxStat st = softmax_stat_empty();
    for (int g = lane; g < G; g += 32) st = softmax_merge(st, ldg_stat(&stats[(size_t)s * G + g]));
    return warp_softmax_merge(st);
}

// dynamic shared memory: ws[tile_rows][H], bs[tile_rows], hs[SB][H], dh_warp[WARPS][SB][H], dl[SB][R],
// and when B > SB: gw2[R][H], gb2[R]
extern "C" __global__ void __launch_bounds__(THREADS, 2)
text_backward(const TextBuffers buf, unsigned offset, int V, int B, int rows_per_block, int tile_rows, float lr) {
    float* W2 = buf.w2;
    float* b2 = buf.b2;
    const float* __restrict__ logits = buf.logits;
    const SoftmaxStat* __restrict__ stats = reinterpret_cast<const SoftmaxStat*>(buf.stats);
    const float* __restrict__ z1 = buf.z1;
    const unsigned* __restrict__ tokens = buf.tokens;
    const unsigned* __restrict__ positions = buf.positions;
    const unsigned* __restrict__ cursor = buf.cursor;
    float* __restrict__ dh = buf.dh;
    double* __restrict__ loss_sum = buf.loss_sum;
    extern __shared__ float4 smem4[];
    const int R = rows_per_block;
    float* ws = reinterpret_cast<float*>(smem4);
    float* bs = ws + (size_t)tile_rows * H;
    float* hs = bs + tile_rows;
    float* dh_warp = hs + SB * H;  // each warp's dh partial, summed without atomics
    float* dl = dh_warp + WARPS * SB * H;
    float* gw2 = dl + SB * R;
    float* gb2 = gw2 + (size_t)R * H;
    __shared__ float norm_max[SB], norm_inv_sum[SB], norm_lse[SB];
    __shared__ SoftmaxStat warp_stat[WARPS][SB];
    __shared__ unsigned target[SB];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int G = gridDim.x;
    const int row0 = blockIdx.x * R;
    const int rows = min(R, V - row0);
    const bool one_chunk = B <= SB;
    const float inv_b = 1.0f / B;

    // Prologue: this block's W2 rows were last written by the previous step's text_backward.
    stage_rows(ws, bs, W2, b2, row0, min(rows, tile_rows));
    load_targets(target, tokens, positions, cursor, offset, 0, min(SB, B));
    if (!one_chunk) {
        for (int i = threadIdx.x; i < rows * H; i += THREADS) gw2[i] = 0.0f;
        for (int i = threadIdx.x; i < rows; i += THREADS) gb2[i] = 0.0f;
    }
    grid_dependency_wait();
    allow_dependent_launch();

    for (int c0 = 0; c0 < B; c0 += SB) {
        const int sb = min(SB, B - c0);
        if (c0 > 0) {
            __syncthreads();
            load_targets(target, tokens, positions, cursor, offset, c0, sb);
        }
        // One round trip: every load of the chunk (softmax partials, z1, this block's logits) is issued
        // before any is used.
        SoftmaxStat st[SB];
#pragma unroll
        for (int s = 0; s < SB; ++s)
            st[s] = (s < sb && (int)threadIdx.x < G) ? ldg_stat(&stats[(size_t)(c0 + s) * G + threadIdx.x])
                                                      : softmax_stat_empty();
        float lg[DL_SLOTS];
#pragma unroll
        for (int k = 0; k < DL_SLOTS; ++k) {
            const int i = threadIdx.x + k * THREADS;
            lg[k] = i < sb * rows ? __ldg(&logits[(size_t)(c0 + i / rows) * V + row0 + i % rows]) : 0.0f;
        }
        for (int i = threadIdx.x; i < sb * H; i += THREADS) hs[i] = fmaxf(__ldg(&z1[(size_t)c0 * H + i]), 0.0f);
        for (int g = threadIdx.x + THREADS; g < G; g += THREADS)  // grids wider than a block
            for (int s = 0; s < sb; ++s) st[s] = softmax_merge(st[s], ldg_stat(&stats[(size_t)(c0 + s) * G + g]));
#pragma unroll
        for (int s = 0; s < SB; ++s) {
            st[s] = warp_softmax_merge(st[s]);
            if (lane == 0) warp_stat[warp][s] = st[s];
        }
        __syncthreads();
        if (threadIdx.x < sb) {
            SoftmaxStat total = softmax_stat_empty();
            for (int w = 0; w < WARPS; ++w) total = softmax_merge(total, warp_stat[w][threadIdx.x]);
            norm_max[threadIdx.x] = total.max;
            norm_inv_sum[threadIdx.x] = 1.0f / total.sum;
            norm_lse[threadIdx.x] = total.max + logf(total.sum);
        }
        __syncthreads();
        // dl = (softmax − onehot)/B for this block's rows; the block owning a target adds the sample's loss.
        const auto set_dl = [&](int i, float logit) {
            const int s = i / rows, r = i % rows;
            const bool is_target = target[s] == (unsigned)(row0 + r);
            const float p = expf(logit - norm_max[s]) * norm_inv_sum[s];
            dl[s * R + r] = (p - (is_target ? 1.0f : 0.0f)) * inv_b;
            if (is_target) atomicAdd(loss_sum, (double)(norm_lse[s] - logit));
        };
#pragma unroll
        for (int k = 0; k < DL_SLOTS; ++k) {
            const int i = threadIdx.x + k * THREADS;
            if (i < sb * rows) set_dl(i, lg[k]);
        }
        for (int i = threadIdx.x + DL_SLOTS * THREADS; i < sb * rows; i += THREADS)
            set_dl(i, __ldg(&logits[(size_t)(c0 + i / rows) * V + row0 + i % rows]));
        __syncthreads();

        float dh_acc[SB][HP];
#pragma unroll
        for (int s = 0; s < SB; ++s)
#pragma unroll
            for (int i = 0; i < HP; ++i) dh_acc[s][i] = 0.0f;
        for_each_staged_row(ws, bs, W2, b2, row0, rows, tile_rows, c0, [&](int r, const float (&w)[HP], float bias) {
            const int v = row0 + r;
            float gw[HP];
#pragma unroll
            for (int i = 0; i < HP; ++i) gw[i] = 0.0f;
            float gb = 0.0f;
#pragma unroll
            for (int s = 0; s < SB; ++s) {
                if (s >= sb) break;
                const float g = dl[s * R + r];
                gb += g;
#pragma unroll
                for (int i = 0; i < HP; ++i) {
                    dh_acc[s][i] += g * w[i];
                    if (lane + 32 * i < H) gw[i] += g * hs[s * H + lane + 32 * i];
                }
            }
            if (one_chunk) {
#pragma unroll
                for (int i = 0; i < HP; ++i)
                    if (lane + 32 * i < H) W2[(size_t)v * H + lane + 32 * i] = w[i] - lr * gw[i];
                if (lane == 0) b2[v] = bias - lr * gb;
            } else {
#pragma unroll
                for (int i = 0; i < HP; ++i)
                    if (lane + 32 * i < H) gw2[(size_t)r * H + lane + 32 * i] += gw[i];
                if (lane == 0) gb2[r] += gb;
            }
        });
#pragma unroll
        for (int s = 0; s < SB; ++s) {
            if (s >= sb) break;
#pragma unroll
            for (int i = 0; i < HP; ++i)
                if (lane + 32 * i < H) dh_warp[(warp * SB + s) * H + lane + 32 * i] = dh_acc[s][i];
        }
        __syncthreads();
        // dh += this block's share, four hidden units per atomic (sm_90) when rows of H keep them aligned.
        constexpr int VEC = H % 4 == 0 ? 4 : 1;
        for (int i = VEC * threadIdx.x; i < sb * H; i += VEC * THREADS) {
            const int s = i / H, k = i % H;
            float sum[VEC] = {};
#pragma unroll
            for (int w = 0; w < WARPS; ++w)
#pragma unroll
                for (int e = 0; e < VEC; ++e) sum[e] += dh_warp[(w * SB + s) * H + k + e];
            float* dst = &dh[(size_t)(c0 + s) * H + k];
            if constexpr (VEC == 4)
                atomic_add4(dst, make_float4(sum[0], sum[1], sum[2], sum[3]));
            else
                atomicAdd(dst, sum[0]);
        }
    }
    if (!one_chunk) {
        __syncthreads();
        for (int i = threadIdx.x; i < rows * H; i += THREADS) W2[(size_t)row0 * H + i] -= lr * gw2[i];
        for (int i = threadIdx.x; i < rows; i += THREADS) b2[row0 + i] -= lr * gb2[i];
    }
}

// One block per UPDATE_ROWS hidden rows. dynamic shared memory: xs[SB][D], dx_warp[WARPS][SB][D],
// dz[SB][UPDATE_ROWS], context tokens [SB][N], next step's context tokens [SB][N]; with `whole_dx` also
// the next step's embedding rows [SB][N][D], dz of every hidden row [SB][H] and W1 [H][D].
//
// The next step's x and z1 are formed in one of two ways. When the step fits one chunk (B ≤ SB) and W1 fits
// in shared memory (`whole_dx`), every block stages all of W1 and the next samples' embedding rows before
// its dependency wait, forms the whole dx = W1ᵀ·dz1 itself (16K multiply-adds at the benchmark shape, less
// than one grid-wide reduction costs), adds this step's embedding update to any next-step row that is also a
// context row now, and forms z1 of its own hidden rows from the W1 rows it has just updated; block 0 writes
// x, and the last block to finish applies the embedding update, so that no block reads a next-step row that
// already holds it. Otherwise the blocks sum dx with atomics and the last block to finish applies the
// embedding update and forms x and z1 of every next sample.
extern "C" __global__ void __launch_bounds__(THREADS)
text_update(const TextBuffers buf, unsigned positions_len, unsigned offset, int N, int B, float lr, int whole_dx) {
    float* __restrict__ E = buf.embedding;
    float* __restrict__ W1 = buf.w1;
    float* __restrict__ b1 = buf.b1;
    float* __restrict__ x = buf.x;
    float* __restrict__ z1 = buf.z1;
    const float* __restrict__ dh = buf.dh;
    const unsigned* __restrict__ tokens = buf.tokens;
    const unsigned* __restrict__ positions = buf.positions;
    const unsigned* __restrict__ cursor = buf.cursor;
    float* __restrict__ dx_sum = buf.dx_sum;
    unsigned* __restrict__ ticket = buf.ticket;
    extern __shared__ float4 smem4[];
    float* w1s = reinterpret_cast<float*>(smem4);          // [H][D] when whole_dx
    float* xs = w1s + (whole_dx ? H * D : 0);
    float* dx_warp = xs + SB * D;  // each warp's (hidden row's) share of dx; whole_dx: −lr/N·dx
    float* dz = dx_warp + WARPS * SB * D;
    unsigned* context = (unsigned*)(dz + SB * UPDATE_ROWS);
    unsigned* next_context = context + SB * N;
    float* next_rows = (float*)(next_context + SB * N);
    float* dz_all = next_rows + SB * N * D;                 // [SB][H] when whole_dx
    __shared__ float dx_part[THREADS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int j0 = blockIdx.x * UPDATE_ROWS;
    const int j = j0 + warp;  // this warp's hidden row
    const bool has_row = j < H;
    const unsigned first = __ldg(cursor) + offset, next = first + B;
    const int next_count = next < positions_len ? min(B, (int)(positions_len - next)) : 0;
    const bool local = whole_dx && B <= SB;
    const float embed_scale = -lr / N;

    // Prologue: W1, b1 and E were last written by the previous step's text_update; tokens and positions are
    // never written by a step.
    float w[DP], gw[DP];
#pragma unroll
    for (int i = 0; i < DP; ++i) {
        w[i] = (has_row && lane + 32 * i < D) ? __ldcg(&W1[(size_t)j * D + lane + 32 * i]) : 0.0f;
        gw[i] = 0.0f;
    }
    const float bias = has_row ? __ldcg(&b1[j]) : 0.0f;
    float gb = 0.0f;
    for (int i = threadIdx.x; i < min(SB, B) * N; i += THREADS)
        context[i] = __ldg(&tokens[__ldg(&positions[first + i / N]) - N + i % N]);
    if (local) {
        if constexpr (D % 4 == 0) {
            for (int i = 4 * threadIdx.x; i < H * D; i += 4 * THREADS) cp_async16(w1s + i, W1 + i);
        } else {
            for (int i = threadIdx.x; i < H * D; i += THREADS) cp_async4(w1s + i, W1 + i);
        }
        cp_async_commit();
        for (int i = threadIdx.x; i < next_count * N; i += THREADS)
            next_context[i] = __ldg(&tokens[__ldg(&positions[next + i / N]) - N + i % N]);
        __syncthreads();
        for (int i = threadIdx.x; i < next_count * N * D; i += THREADS)
            next_rows[i] = __ldcg(&E[(size_t)next_context[i / D] * D + i % D]);
    }
    grid_dependency_wait();
    allow_dependent_launch();

    if (local) {
        // One round trip: x, and dz1 = dh ⊙ ReLU′(z1) of every hidden row.
        for (int i = threadIdx.x; i < B * D; i += THREADS) xs[i] = x[i];
        for (int i = threadIdx.x; i < B * H; i += THREADS) dz_all[i] = z1[i] > 0.0f ? __ldcg(&dh[i]) : 0.0f;
        cp_async_wait_all();
        __syncthreads();
        // The whole dx, as the embedding update of each sample's context rows: thread (s, d, part) walks a
        // part of the hidden rows, so that every thread has work when B·D < THREADS.
        float* delta = dx_warp;
        {
            const int outputs = B * D;
            const int parts = outputs >= THREADS ? 1 : THREADS / outputs;
            const int per = (H + parts - 1) / parts;
            for (int t = threadIdx.x; t < outputs * parts; t += THREADS) {
                const int o = t % outputs, part = t / outputs, smp = o / D, d = o % D;
                const int lo = part * per, hi = min(H, lo + per);
                float sum = 0.0f;
                for (int jj = lo; jj < hi; ++jj) sum += dz_all[smp * H + jj] * w1s[jj * D + d];
                if (parts == 1)
                    delta[o] = embed_scale * sum;
                else
                    dx_part[t] = sum;
            }
            if (parts > 1) {
                __syncthreads();
                for (int o = threadIdx.x; o < outputs; o += THREADS) {
                    float sum = 0.0f;
                    for (int p = 0; p < parts; ++p) sum += dx_part[p * outputs + o];
                    delta[o] = embed_scale * sum;
                }
            }
        }
        // This warp's row of W1 and b1.
        for (int smp = 0; smp < B; ++smp) {
            const float g = has_row ? dz_all[smp * H + j] : 0.0f;
            gb += g;
#pragma unroll
            for (int i = 0; i < DP; ++i)
                if (lane + 32 * i < D) gw[i] += g * xs[smp * D + lane + 32 * i];
        }
        const float bias_new = bias - lr * gb;
#pragma unroll
        for (int i = 0; i < DP; ++i) w[i] -= lr * gw[i];
        if (has_row) {
#pragma unroll
            for (int i = 0; i < DP; ++i)
                if (lane + 32 * i < D) W1[(size_t)j * D + lane + 32 * i] = w[i];
            if (lane == 0) b1[j] = bias_new;
        }
        __syncthreads();
        // x of the next samples from their rows as this step leaves them.
        const float inv_n = 1.0f / N;
        for (int i = threadIdx.x; i < next_count * D; i += THREADS) {
            const int smp = i / D, d = i % D;
            float sum = 0.0f;
            for (int n = 0; n < N; ++n) {
                const unsigned token = next_context[smp * N + n];
                float e = next_rows[(smp * N + n) * D + d];
                for (int c = 0; c < B * N; ++c)
                    if (context[c] == token) e += delta[(c / N) * D + d];
                sum += e;
            }
            xs[i] = sum * inv_n;
            if (blockIdx.x == 0) x[i] = xs[i];
        }
        __syncthreads();
        if (has_row)
            for (int smp = 0; smp < next_count; ++smp) {
                float acc = 0.0f;
#pragma unroll
                for (int i = 0; i < DP; ++i)
                    if (lane + 32 * i < D) acc += w[i] * xs[smp * D + lane + 32 * i];
                acc = warp_sum(acc);
                if (lane == 0) z1[(size_t)smp * H + j] = acc + bias_new;
            }
        // Every block has its next rows by the time it arrives here.
        if (!last_block_to_finish(ticket)) return;
        for (int i = threadIdx.x; i < B * D; i += THREADS) {
            const int smp = i / D, d = i % D;
            for (int n = 0; n < N; ++n) atomicAdd(&E[(size_t)context[smp * N + n] * D + d], delta[i]);
        }
        if (threadIdx.x == 0) *ticket = 0;
        return;
    }

    for (int c0 = 0; c0 < B; c0 += SB) {
        const int sb = min(SB, B - c0);
        for (int i = threadIdx.x; i < sb * D; i += THREADS) xs[i] = x[(size_t)c0 * D + i];
        // dz = dh masked by ReLU'(z1), for this block's rows.
        for (int i = threadIdx.x; i < sb * UPDATE_ROWS; i += THREADS) {
            const int smp = i / UPDATE_ROWS, jj = j0 + i % UPDATE_ROWS;
            const size_t at = (size_t)(c0 + smp) * H + jj;
            dz[i] = (jj < H && z1[at] > 0.0f) ? __ldcg(&dh[at]) : 0.0f;
        }
        __syncthreads();
        for (int s = 0; s < sb; ++s) {
            const float g = has_row ? dz[s * UPDATE_ROWS + warp] : 0.0f;
            gb += g;
#pragma unroll
            for (int i = 0; i < DP; ++i) {
                const int k = lane + 32 * i;
                if (k < D) {
                    gw[i] += g * xs[s * D + k];
                    dx_warp[(warp * SB + s) * D + k] = g * w[i];
                }
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < sb * D; i += THREADS) {
            const int s = i / D, k = i % D;
            float sum = 0.0f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) sum += dx_warp[(w * SB + s) * D + k];
            atomicAdd(&dx_sum[(size_t)c0 * D + i], sum);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < DP; ++i) w[i] -= lr * gw[i];  // W1's new row
    if (has_row) {
#pragma unroll
        for (int i = 0; i < DP; ++i)
            if (lane + 32 * i < D) W1[(size_t)j * D + lane + 32 * i] = w[i];
        if (lane == 0) b1[j] = bias - lr * gb;
    }

    // The last block to finish owns the complete dx of every sample: it adds −lr/N·dx to each context
    // row once (one rounding per row, as on the CPU), leaves the ticket zeroed and forms the next step's
    // x and z1 from the parameters just updated.
    if (!last_block_to_finish(ticket)) return;
    for (int c0 = 0; c0 < B; c0 += SB) {
        const int sb = min(SB, B - c0);
        if (c0 > 0) {
            __syncthreads();
            for (int i = threadIdx.x; i < sb * N; i += THREADS)
                context[i] = __ldg(&tokens[__ldg(&positions[first + c0 + i / N]) - N + i % N]);
            __syncthreads();
        }
        for (int i = threadIdx.x; i < sb * D; i += THREADS) {
            const int s = i / D, d = i % D;
            const float delta = embed_scale * __ldcg(&dx_sum[(size_t)c0 * D + i]);
            for (int n = 0; n < N; ++n) atomicAdd(&E[(size_t)context[s * N + n] * D + d], delta);
        }
    }
    if (threadIdx.x == 0) *ticket = 0;
    if (next_count > 0) {
        __syncthreads();
        samples_hidden(E, W1, b1, tokens, positions, next, next_count, N, x, z1, xs, context);
    }
}

// Moves the device-side sample cursor past the steps just run.
extern "C" __global__ void text_advance(unsigned* cursor, unsigned samples) { *cursor += samples; }

// Evaluation: after text_forward, counts per sample how many logits beat the target's (its rank).
extern "C" __global__ void __launch_bounds__(THREADS)
text_eval_rank(const TextBuffers buf, unsigned offset, int V, int B, int rows_per_block) {
    const float* __restrict__ logits = buf.logits;
    const unsigned* __restrict__ tokens = buf.tokens;
    const unsigned* __restrict__ positions = buf.positions;
    const unsigned* __restrict__ cursor = buf.cursor;
    unsigned* __restrict__ rank = buf.rank;
    const int row0 = blockIdx.x * rows_per_block;
    const int rows = min(rows_per_block, V - row0);
    const unsigned first = __ldg(cursor) + offset;
    for (int i = threadIdx.x; i < B * rows; i += THREADS) {
        const int s = i / rows, v = row0 + i % rows;
        const unsigned target = __ldg(&tokens[__ldg(&positions[first + s])]);
        const float* row = logits + (size_t)s * V;
        if (__ldg(&row[v]) > __ldg(&row[target])) atomicAdd(&rank[s], 1u);
    }
}

// Evaluation: loss and top-1/top-5 hits of the B samples into running sums; resets the ranks. One block.
// counts: [0] top-1 hits, [1] top-5 hits.
extern "C" __global__ void __launch_bounds__(THREADS)
text_eval_finish(const TextBuffers buf, unsigned offset, int V, int B, int G) {
    const float* __restrict__ logits = buf.logits;
    const SoftmaxStat* __restrict__ stats = reinterpret_cast<const SoftmaxStat*>(buf.stats);
    const unsigned* __restrict__ tokens = buf.tokens;
    const unsigned* __restrict__ positions = buf.positions;
    const unsigned* __restrict__ cursor = buf.cursor;
    unsigned* __restrict__ rank = buf.rank;
    double* __restrict__ loss_sum = buf.loss_sum;
    unsigned long long* __restrict__ counts = buf.hit_counts;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int s = warp; s < B; s += WARPS) {
        const SoftmaxStat st = combine_partials(stats, s, G);
        if (lane == 0) {
            const unsigned target = __ldg(&tokens[__ldg(&positions[__ldg(cursor) + offset + s])]);
            atomicAdd(loss_sum, (double)(st.max + logf(st.sum) - __ldg(&logits[(size_t)s * V + target])));
            if (rank[s] == 0) atomicAdd(&counts[0], 1ull);
            if (rank[s] < 5) atomicAdd(&counts[1], 1ull);
            rank[s] = 0;
        }
    }
}
