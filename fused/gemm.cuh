// Tiled fp32 matrix products C = op(A)·op(B), op(A) M×K and op(B) K×N, one thread block per output
// tile, staged through shared memory, in two variants:
//
//   gemm_tile   any tile shape (template sizes), small or split-k tiles; the MNIST pipeline's products.
//   gemm_tile_tf32  the same contract on the tensor cores (TF32 mma); the Transformer's --tf32 products.
//   gemm_tile_bf16  the same contract on the bf16 tensor cores (operands rounded to bf16, fp32 sums, as
//               PyTorch autocast's bf16 matmul), 128×128 or 64×64 tiles; the matmul benchmark's products.
//   gemm_tile_bf16_async  gemm_tile_bf16's arithmetic on bf16 operands read from memory (leading
//               dimensions, not functors) through multi-stage cp.async; the Transformer's linear layers.
//   gemm_128    one fixed 128×128 tile tuned for throughput; the text model's large-batch products
//               (fused/text_batch.cu), where a step is ~26 GMAC and the FMA pipe is what counts, and the
//               Transformer's fp32 linear layers (plain matrices read through StagedMatrix, 16 bytes a load).
//
// All but gemm_tile_bf16_async read operands through the caller's functors, called only for indices inside the matrices, so a
// caller can gather rows (a shuffled batch), append a column of ones (a bias gradient from the same
// tile), or apply an activation as it loads; results go to the caller's store functor, which is where
// epilogues fuse (bias, activation, atomics into a gradient, a transposed copy in shared memory).
//
// ---- gemm_tile ----
// Each result goes to store(m, n, value), called exactly once per element inside C.
// A_TRANS / B_TRANS say how the operands lie in memory, BLAS-style: A is M×K row-major unless A_TRANS
// (then K×M), B is K×N row-major unless B_TRANS (then N×K). They only choose which index adjacent threads
// walk when loading, so that global loads coalesce.
//
//   stage   K is walked BK at a time. A chunk of each operand is staged k-major (As[k][m], Bs[k][n]) with
//           one float of padding per row: transposing stores and broadcast reads then hit distinct banks.
//           The next chunk's loads are issued into registers before the current chunk is used, and all
//           loads of a chunk are independent, so with BK = K one round trip to memory covers the product.
//   compute Each thread owns a TM×TN register tile: rows tm + i·BM/TM, columns tn + j·BN/TN. When the
//           tile has fewer than THREADS/(TM·TN) outputs, the KSPLIT thread groups left over take
//           interleaved k (group g: k ≡ g mod KSPLIT), so a small tile still keeps every thread busy.
//   reduce  The groups' partial tiles are summed in shared memory in a fixed order (deterministic).
//
// Dynamic shared memory: GemmTile<...>::SHARED_FLOATS floats (the launch layer mirrors the formula).
// gemm_tile ends with a barrier, so the caller may reuse that memory afterwards.
#pragma once
#include "common.cuh"

template <int BM, int BN, int BK, int TM, int TN>
struct GemmTile {
    static_assert(BM % TM == 0 && BN % TN == 0, "the register tile must divide the block tile");
    static constexpr int THREADS_M = BM / TM;
    static constexpr int THREADS_N = BN / TN;
    static constexpr int GROUP = THREADS_M * THREADS_N;  // threads covering the tile once
    static_assert(THREADS % GROUP == 0, "the block's threads must cover the tile a whole number of times");
    static constexpr int KSPLIT = THREADS / GROUP;
    static constexpr int LDA = BM + 1;
    static constexpr int LDB = BN + 1;
    static constexpr int STAGE_FLOATS = BK * (LDA + LDB);
    static constexpr int PARTIAL_FLOATS = KSPLIT > 1 ? KSPLIT * BM * BN : 0;
    static constexpr int SHARED_FLOATS = STAGE_FLOATS > PARTIAL_FLOATS ? STAGE_FLOATS : PARTIAL_FLOATS;
};

// One operand's chunk, rows [o0, o0 + EXTENT) × k [k0, k0 + BK), held in registers between its load and
// its store to shared memory (k-major, row stride LD). K_CONTIGUOUS: adjacent threads walk k.
template <int EXTENT, int BK, int LD, bool K_CONTIGUOUS>
struct GemmStage {
    static constexpr int COUNT = EXTENT * BK;
    static constexpr int PER_THREAD = (COUNT + THREADS - 1) / THREADS;
    float v[PER_THREAD];

    // Unsigned, so that a power-of-two EXTENT or BK is a mask and a shift, and a thread's row (or k) is seen
    // to be the same in each of its loads.
    __device__ __forceinline__ static int row_of(unsigned idx) { return K_CONTIGUOUS ? idx / BK : idx % EXTENT; }
    __device__ __forceinline__ static int k_of(unsigned idx) { return K_CONTIGUOUS ? idx % BK : idx / EXTENT; }

    // at(o, k) for o < extent, k < K; zero outside.
    template <class At>
    __device__ __forceinline__ void load(At at, int extent, int o0, int K, int k0) {
        __builtin_assume(threadIdx.x < THREADS);  // blocks of THREADS: a full chunk's loads need no bound
#pragma unroll
        for (int r = 0; r < PER_THREAD; ++r) {
            const unsigned idx = threadIdx.x + r * THREADS;
            const int o = o0 + row_of(idx), k = k0 + k_of(idx);
            v[r] = (idx < COUNT && o < extent && k < K) ? at(o, k) : 0.0f;
        }
    }

    __device__ __forceinline__ void store(float* s) const {
#pragma unroll
        for (int r = 0; r < PER_THREAD; ++r) {
            const unsigned idx = threadIdx.x + r * THREADS;
            if (idx < COUNT) s[k_of(idx) * LD + row_of(idx)] = v[r];
        }
    }
};

// Walks K a chunk of BK at a time through shared memory (As[k][m], Bs[k][n], rows padded by one), the next
// chunk's loads in flight while this one is used: chunk(k_count) runs with k [k0, k0 + k_count) staged,
// zero past K, between two barriers.
template <int BM, int BN, int BK, bool A_TRANS, bool B_TRANS, class AAt, class BAt, class Chunk>
__device__ __forceinline__ void gemm_stages(int M, int N, int K, int m0, int n0, AAt a_at, BAt b_at, float* As,
                                            float* Bs, Chunk chunk) {
    GemmStage<BM, BK, BM + 1, !A_TRANS> a_stage;
    GemmStage<BN, BK, BN + 1, B_TRANS> b_stage;
    const auto b_by_row = [&](int n, int k) { return b_at(k, n); };
    a_stage.load(a_at, M, m0, K, 0);
    b_stage.load(b_by_row, N, n0, K, 0);
    for (int k0 = 0; k0 < K; k0 += BK) {
        a_stage.store(As);
        b_stage.store(Bs);
        __syncthreads();
        if (k0 + BK < K) {
            a_stage.load(a_at, M, m0, K, k0 + BK);
            b_stage.load(b_by_row, N, n0, K, k0 + BK);
        }
        chunk(min(BK, K - k0));
        __syncthreads();
    }
}

template <int BM, int BN, int BK, int TM, int TN, bool A_TRANS, bool B_TRANS, class AAt, class BAt, class Store>
__device__ __forceinline__ void gemm_tile(int M, int N, int K, int m0, int n0, AAt a_at, BAt b_at, Store store,
                                          float* smem) {
    using T = GemmTile<BM, BN, BK, TM, TN>;
    float* As = smem;
    float* Bs = smem + BK * T::LDA;
    const int group = threadIdx.x / T::GROUP;
    const int tm = threadIdx.x % T::GROUP / T::THREADS_N;
    const int tn = threadIdx.x % T::THREADS_N;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    gemm_stages<BM, BN, BK, A_TRANS, B_TRANS>(M, N, K, m0, n0, a_at, b_at, As, Bs, [&](int k_count) {
#pragma unroll 4
        for (int k = group; k < k_count; k += T::KSPLIT) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[k * T::LDA + tm + i * T::THREADS_M];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[k * T::LDB + tn + j * T::THREADS_N];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
    });

    if constexpr (T::KSPLIT == 1) {
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) {
                const int m = m0 + tm + i * T::THREADS_M, n = n0 + tn + j * T::THREADS_N;
                if (m < M && n < N) store(m, n, acc[i][j]);
            }
    } else {
        float* partial = smem;  // [KSPLIT][BM][BN], over the stages (dead after the loop's last barrier)
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j)
                partial[(group * BM + tm + i * T::THREADS_M) * BN + tn + j * T::THREADS_N] = acc[i][j];
        __syncthreads();
        for (int o = threadIdx.x; o < BM * BN; o += THREADS) {
            const int m = m0 + o / BN, n = n0 + o % BN;
            if (m >= M || n >= N) continue;
            float sum = partial[o];
#pragma unroll
            for (int g = 1; g < T::KSPLIT; ++g) sum += partial[g * BM * BN + o];
            store(m, n, sum);
        }
    }
    __syncthreads();
}

// d += a·b on the tensor cores: one m16n8k16 bf16 product with fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The m16n8 accumulator tiles of a warp, zeroed.
template <int MT, int NT>
__device__ __forceinline__ void zero_accumulators(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;
}

// ---- gemm_tile_tf32 ----
// gemm_tile's contract (functors, staging, store once per element inside C) on the tensor cores: the
// block's 8 warps as 2 × 4, each owning a (BM/2) × (BN/4) part of the tile as m16n8k8 TF32 `mma`s with
// fp32 accumulators. Operands are rounded to TF32 (10-bit mantissa, cvt.rna) as they leave shared
// memory, so products carry ~1e-3 relative rounding, not fp32's ~1e-7. sm_80 or later.

__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// d += a·b, one m16n8k8 TF32 `mma` (a: 16×8 row-major fragment, b: 8×8 column-major, d: 16×8 fp32).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <int BM, int BN, int BK, bool A_TRANS, bool B_TRANS, class AAt, class BAt, class Store>
__device__ __forceinline__ void gemm_tile_tf32(int M, int N, int K, int m0, int n0, AAt a_at, BAt b_at, Store store,
                                               float* smem) {
    constexpr int LDA = BM + 1, LDB = BN + 1;  // GemmTile's, so its SHARED_FLOATS covers the stages
    constexpr int WN = WARPS / 2, MW = BM / 2, NW = BN / WN, MT = MW / 16, NT = NW / 8;
    static_assert(MW % 16 == 0 && NW % 8 == 0 && BK % 8 == 0, "the warp tiles must be whole m16n8k8 tiles");
    float* As = smem;
    float* Bs = smem + BK * LDA;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
    const int wm = warp / WN * MW, wn = warp % WN * NW;
    float acc[MT][NT][4];
    zero_accumulators(acc);

    gemm_stages<BM, BN, BK, A_TRANS, B_TRANS>(M, N, K, m0, n0, a_at, b_at, As, Bs, [&](int k_count) {
#pragma unroll 2
        for (int k = 0; k < k_count; k += 8) {  // the stage is zero past K
            unsigned a[MT][4], b[NT][2];
#pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int m = wm + i * 16 + gid;
                a[i][0] = to_tf32(As[(k + tig) * LDA + m]);
                a[i][1] = to_tf32(As[(k + tig) * LDA + m + 8]);
                a[i][2] = to_tf32(As[(k + tig + 4) * LDA + m]);
                a[i][3] = to_tf32(As[(k + tig + 4) * LDA + m + 8]);
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int n = wn + j * 8 + gid;
                b[j][0] = to_tf32(Bs[(k + tig) * LDB + n]);
                b[j][1] = to_tf32(Bs[(k + tig + 4) * LDB + n]);
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j) mma_tf32(acc[i][j], a[i], b[j]);
        }
    });
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int m = m0 + wm + i * 16 + gid + (r / 2) * 8, n = n0 + wn + j * 8 + 2 * tig + r % 2;
                if (m < M && n < N) store(m, n, acc[i][j][r]);
            }
    __syncthreads();
}

// ---- gemm_tile_bf16 ----
// gemm_tile's contract (functors, store once per element inside C, A_TRANS / B_TRANS) on the bf16
// tensor cores: the block's 8 warps as 2 × 4, each owning a (BM/2) × (BN/4) part of the tile as
// m16n8k16 bf16 `mma`s with fp32 accumulators. Operands are rounded to bf16 (to nearest even) as they
// are staged; products of bf16 values are exact and summed in fp32, as in PyTorch autocast's bf16
// matmul. sm_80 or later.
//
//   stage    A chunk of BK k of each operand lies in shared memory as bf16 the way it lies in global
//            memory: [o][k] when k is the operand's contiguous index (A row-major, B transposed), else
//            [k][o]. Each thread loads two elements adjacent along the contiguous index (the warp's
//            loads coalesce) and stores them as one bf16 pair. Rows are padded by 16 bytes, so the eight
//            row addresses of each ldmatrix phase fall in distinct bank groups; [k][o] chunks are read
//            with ldmatrix.trans, which hands out the same fragments.
//   pipeline Two chunk buffers: chunk c+1's loads are issued into registers before chunk c's mma and
//            stored to the other buffer after them, one barrier per chunk.
//
// Dynamic shared memory: GemmBf16<BM, BN, BK>::SHARED_FLOATS floats, whatever A_TRANS and B_TRANS (the
// launch layer mirrors the formula). gemm_tile_bf16 ends with a barrier.

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16* p) {
    const unsigned at = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const bf16* p) {
    const unsigned at = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}

// Shared layout of one operand's chunk: EXTENT rows (o) × BK (k) as [o][k] when K_CONTIGUOUS, else
// [k][o], rows padded by 8 bf16. SLOT: bf16 of the larger of the two layouts, so a buffer's size does
// not depend on the layout.
template <int EXTENT, int BK, bool K_CONTIGUOUS>
struct Bf16Layout {
    static constexpr int ROWS = K_CONTIGUOUS ? EXTENT : BK;
    static constexpr int COLS = K_CONTIGUOUS ? BK : EXTENT;
    static constexpr int LD = COLS + 8;
    static constexpr int SLOT = EXTENT * (BK + 8) > BK * (EXTENT + 8) ? EXTENT * (BK + 8) : BK * (EXTENT + 8);
};

template <int BM, int BN, int BK>
struct GemmBf16 {
    static constexpr int MW = BM / 2, NW = BN / (WARPS / 2);  // a warp's part of the tile
    static constexpr int MT = MW / 16, NT = NW / 8;            // its m16n8 accumulator tiles
    static_assert(WARPS == 8 && MW % 16 == 0 && NW % 16 == 0 && BK % 16 == 0,
                  "8 warps as 2 × 4, warp tiles of whole m16n16 parts, k in steps of 16");
    static constexpr int A_SLOT = Bf16Layout<BM, BK, true>::SLOT;
    static constexpr int B_SLOT = Bf16Layout<BN, BK, true>::SLOT;
    static constexpr int BUFFER = A_SLOT + B_SLOT;  // bf16 of one chunk buffer (a multiple of 8)
    static constexpr int SHARED_FLOATS = BUFFER;    // two buffers of bf16, as floats
};

// One operand's chunk, o [o0, o0 + EXTENT) × k [k0, k0 + BK), held as floats in registers between its
// load and its store to shared memory as bf16 pairs. Pair p covers row p / (COLS/2) of the layout,
// columns 2·(p mod COLS/2) + {0, 1}. When a layout row is 16 pairs (BK = 32, [o][k]), a warp's two rows
// are taken 4 apart (rows 0, 4, 1, 5, … of each 8), whose 80-byte strides put them on disjoint banks.
template <int EXTENT, int BK, bool K_CONTIGUOUS>
struct Bf16Stage {
    using L = Bf16Layout<EXTENT, BK, K_CONTIGUOUS>;
    static constexpr int ROW_PAIRS = L::COLS / 2;
    static constexpr int PAIRS = L::ROWS * ROW_PAIRS;
    static constexpr int PER_THREAD = (PAIRS + THREADS - 1) / THREADS;
    static constexpr bool INTERLEAVE = ROW_PAIRS == 16 && L::ROWS % 8 == 0;
    static_assert(L::COLS % 2 == 0, "pairs along the contiguous index");
    float v[PER_THREAD][2];

    __device__ __forceinline__ static bool valid(int r) {
        return PAIRS % THREADS == 0 || (int)threadIdx.x + r * THREADS < PAIRS;
    }
    __device__ __forceinline__ static int row_of(int r) {
        const int q = ((int)threadIdx.x + r * THREADS) / ROW_PAIRS;
        return INTERLEAVE ? (q & ~7) | (q & 1) << 2 | (q >> 1 & 3) : q;
    }
    __device__ __forceinline__ static int col_of(int r) { return ((int)threadIdx.x + r * THREADS) % ROW_PAIRS * 2; }

    // at(o, k) for o < extent, k < K; zero outside. Chunks wholly inside skip the bounds checks.
    template <class At>
    __device__ __forceinline__ void load(At at, int extent, int o0, int K, int k0) {
        const bool inside = o0 + EXTENT <= extent && k0 + BK <= K;
#pragma unroll
        for (int r = 0; r < PER_THREAD; ++r)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int row = row_of(r), col = col_of(r) + j;
                const int o = o0 + (K_CONTIGUOUS ? row : col), k = k0 + (K_CONTIGUOUS ? col : row);
                v[r][j] = valid(r) && (inside || (o < extent && k < K)) ? at(o, k) : 0.0f;
            }
    }

    __device__ __forceinline__ void store(bf16* s) const {
#pragma unroll
        for (int r = 0; r < PER_THREAD; ++r)
            if (valid(r)) *reinterpret_cast<unsigned*>(s + row_of(r) * L::LD + col_of(r)) = bf16x2(v[r][0], v[r][1]);
    }
};

// acc += the chunk's products over k [0, k_count) (the chunk is zero from k_count to the next multiple
// of 16): As, Bs one buffer's chunks in their layouts, (wm, wn) the warp's corner in the tile.
template <int BM, int BN, int BK, bool A_K_CONTIGUOUS, bool B_K_CONTIGUOUS>
__device__ __forceinline__ void gemm_bf16_chunk(const bf16* As, const bf16* Bs, int k_count, int wm,
                                                int wn, float (&acc)[GemmBf16<BM, BN, BK>::MT][GemmBf16<BM, BN, BK>::NT][4]) {
    using G = GemmBf16<BM, BN, BK>;
    constexpr int LDA = Bf16Layout<BM, BK, A_K_CONTIGUOUS>::LD, LDB = Bf16Layout<BN, BK, B_K_CONTIGUOUS>::LD;
    const int lane = threadIdx.x % 32, quad = lane / 8, row8 = lane % 8;
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) {
        if (ks >= k_count) break;
        unsigned a[G::MT][4], b[G::NT][2];
#pragma unroll
        for (int i = 0; i < G::MT; ++i) {
            // Matrices 0…3: (m 0–7, k 0–7), (m 8–15, k 0–7), (m 0–7, k 8–15), (m 8–15, k 8–15).
            if constexpr (A_K_CONTIGUOUS) {
                ldmatrix_x4(a[i], As + (wm + i * 16 + lane % 16) * LDA + ks + lane / 16 * 8);
            } else {
                ldmatrix_x4_trans(a[i], As + (ks + quad / 2 * 8 + row8) * LDA + wm + i * 16 + quad % 2 * 8);
            }
        }
#pragma unroll
        for (int j = 0; j < G::NT; j += 2) {
            // Matrices 0…3: (n 0–7, k 0–7), (n 0–7, k 8–15), (n 8–15, k 0–7), (n 8–15, k 8–15).
            unsigned r[4];
            if constexpr (B_K_CONTIGUOUS) {
                ldmatrix_x4(r, Bs + (wn + j * 8 + quad / 2 * 8 + row8) * LDB + ks + quad % 2 * 8);
            } else {
                ldmatrix_x4_trans(r, Bs + (ks + quad % 2 * 8 + row8) * LDB + wn + j * 8 + quad / 2 * 8);
            }
            b[j][0] = r[0];
            b[j][1] = r[1];
            b[j + 1][0] = r[2];
            b[j + 1][1] = r[3];
        }
#pragma unroll
        for (int i = 0; i < G::MT; ++i)
#pragma unroll
            for (int j = 0; j < G::NT; ++j)
                mma_bf16(acc[i][j], a[i], b[j][0], b[j][1]);
    }
}

// The warp's corner in the tile, and store(m, n, ·) of its accumulators inside C.
template <int BM, int BN, int BK>
struct Bf16Warp {
    using G = GemmBf16<BM, BN, BK>;
    int wm, wn;
    __device__ __forceinline__ Bf16Warp() : wm(threadIdx.x / 32 / (WARPS / 2) * G::MW), wn(threadIdx.x / 32 % (WARPS / 2) * G::NW) {}

    // store(m, n, v0, v1) of its accumulators by pairs of adjacent columns: C[m][n] = v0 and, when
    // n + 1 < N (the caller checks), C[m][n + 1] = v1; n − n0 even, m < M, n < N.
    template <class Store>
    __device__ __forceinline__ void store_pairs(int M, int N, int m0, int n0, const float (&acc)[G::MT][G::NT][4],
                                                Store store) const {
        const int gid = threadIdx.x % 32 / 4, tig = threadIdx.x % 4;
#pragma unroll
        for (int i = 0; i < G::MT; ++i)
#pragma unroll
            for (int j = 0; j < G::NT; ++j)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int m = m0 + wm + i * 16 + gid + half * 8, n = n0 + wn + j * 8 + 2 * tig;
                    if (m < M && n < N) store(m, n, acc[i][j][2 * half], acc[i][j][2 * half + 1]);
                }
    }

    // store(m, n, value) once per element inside C.
    template <class Store>
    __device__ __forceinline__ void store(int M, int N, int m0, int n0, const float (&acc)[G::MT][G::NT][4],
                                          Store store) const {
        store_pairs(M, N, m0, n0, acc, [&](int m, int n, float v0, float v1) {
            store(m, n, v0);
            if (n + 1 < N) store(m, n + 1, v1);
        });
    }
};

template <int BM, int BN, int BK, bool A_TRANS, bool B_TRANS, class AAt, class BAt, class Store>
__device__ __forceinline__ void gemm_tile_bf16(int M, int N, int K, int m0, int n0, AAt a_at, BAt b_at, Store store,
                                               float* smem) {
    using G = GemmBf16<BM, BN, BK>;
    bf16* buffers = reinterpret_cast<bf16*>(smem);  // [2][A_SLOT + B_SLOT] bf16
    const Bf16Warp<BM, BN, BK> warp;
    float acc[G::MT][G::NT][4];
    zero_accumulators(acc);

    Bf16Stage<BM, BK, !A_TRANS> a_stage;
    Bf16Stage<BN, BK, B_TRANS> b_stage;
    const auto b_by_row = [&](int n, int k) { return b_at(k, n); };
    a_stage.load(a_at, M, m0, K, 0);
    b_stage.load(b_by_row, N, n0, K, 0);
    a_stage.store(buffers);
    b_stage.store(buffers + G::A_SLOT);
    __syncthreads();
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += BK) {
        const bool more = k0 + BK < K;
        if (more) {
            a_stage.load(a_at, M, m0, K, k0 + BK);
            b_stage.load(b_by_row, N, n0, K, k0 + BK);
        }
        const bf16* As = buffers + buf * G::BUFFER;
        gemm_bf16_chunk<BM, BN, BK, !A_TRANS, B_TRANS>(As, As + G::A_SLOT, min(BK, K - k0), warp.wm, warp.wn, acc);
        if (more) {
            a_stage.store(buffers + (buf ^ 1) * G::BUFFER);
            b_stage.store(buffers + (buf ^ 1) * G::BUFFER + G::A_SLOT);
        }
        __syncthreads();
        buf ^= 1;
    }
    warp.store(M, N, m0, n0, acc, store);
    __syncthreads();
}

// ---- gemm_tile_bf16_async ----
// gemm_tile_bf16's arithmetic (m16n8k16 `mma`s with fp32 sums, the 8 warps as 2 × 4, ldmatrix fragments
// from padded shared memory: gemm_bf16_chunk, Bf16Warp's corners and store) on operands that are bf16 in
// memory already, read straight from it with leading dimensions rather than through functors: element
// (m, k) of A is A[k·lda + m] if A_TRANS else A[m·lda + k]; (k, n) of B is B[n·ldb + k] if B_TRANS else
// B[k·ldb + n]; column ones_col of B (none when negative) reads 1 (a bias gradient from the same tile);
// outside M, N, K reads 0. Results go by pairs of adjacent columns, as Bf16Warp::store_pairs gives them
// (so that a row's pair leaves as one 8-byte or 4-byte store).
//
//   stage    STAGES chunks of BK k are in flight, copied by cp.async into Bf16Layout, [o][k] when k is the
//            operand's contiguous index, else [k][o], 8 bf16 (16 bytes) at a time where all 8 are inside,
//            none is the ones column and the operand is 16-byte aligned with ld a multiple of 8; any other
//            segment (an edge, the ones column, an odd ld) element by element through registers.
//   why      Reading fp32 operands and rounding them in the SM (what PyTorch autocast avoids by keeping
//            its activations in bf16) doubles the bytes each tile reads from L2, and at the Transformer's
//            shapes those reads, not the tensor cores, set a tile's time. So the trainer keeps bf16
//            copies of what its products read, rounded once where they are written.
//
// Dynamic shared memory: GemmBf16Async<BM, BN, BK, STAGES>::SHARED_FLOATS floats, whatever the layouts
// (the launch layer mirrors the formula); more than 48 KB needs the kernel's opt-in. Ends with a barrier.

// 16 bytes from global to shared memory, or zeros when `inside` is false (src is then not read).
__device__ __forceinline__ void cp_async16_or_zero(void* shared_dst, const void* global_src, bool inside) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(shared_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(global_src), "r"(inside ? 16 : 0)
                 : "memory");
}

// Waits until at most N committed groups of this thread's copies are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait_pending() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

template <int BM, int BN, int BK, int STAGES>
struct GemmBf16Async {
    static_assert(STAGES >= 2, "two stages or more");
    static constexpr int SHARED_FLOATS = STAGES * GemmBf16<BM, BN, BK>::BUFFER / 2;
};

// One operand of gemm_tile_bf16_async: element (o, k) at p[o·ld + k] when K_CONTIGUOUS, else p[k·ld + o],
// for o < extent, k < K; o == ones reads 1.
template <int EXTENT, int BK, bool K_CONTIGUOUS>
struct AsyncOperand {
    using L = Bf16Layout<EXTENT, BK, K_CONTIGUOUS>;
    static constexpr int SEGMENTS = L::ROWS * L::COLS / 8;  // 8 bf16 along the layout's rows
    static_assert(L::COLS % 8 == 0, "whole 16-byte segments");
    const bf16* p;
    int ld, extent, K, o0, ones;
    bool vector;  // 16-byte copies allowed

    __device__ __forceinline__ AsyncOperand(const bf16* p, int ld, int extent, int K, int o0, int ones)
        : p(p), ld(ld), extent(extent), K(K), o0(o0), ones(ones),
          vector(ld % 8 == 0 && reinterpret_cast<size_t>(p) % 16 == 0) {}

    // Copies k [k0, k0 + BK) into the chunk at s.
    __device__ __forceinline__ void issue(bf16* s, int k0) const {
#pragma unroll
        for (int r = 0; r < (SEGMENTS + THREADS - 1) / THREADS; ++r) {
            const int v = threadIdx.x + r * THREADS;
            if (SEGMENTS % THREADS != 0 && v >= SEGMENTS) break;
            const int row = v / (L::COLS / 8), col = v % (L::COLS / 8) * 8;
            const int o = o0 + (K_CONTIGUOUS ? row : col), k = k0 + (K_CONTIGUOUS ? col : row);
            bf16* dst = s + row * L::LD + col;
            const bool whole = K_CONTIGUOUS ? o < extent && o != ones && k + 8 <= K
                                            : k < K && o + 8 <= extent && (unsigned)(ones - o) >= 8u;
            if (vector && whole) {
                cp_async16_or_zero(dst, p + (K_CONTIGUOUS ? (size_t)o * ld + k : (size_t)k * ld + o), true);
                continue;
            }
            bf16 e[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int oi = o + (K_CONTIGUOUS ? 0 : i), ki = k + (K_CONTIGUOUS ? i : 0);
                e[i] = oi >= extent || ki >= K ? (bf16)0
                       : oi == ones            ? BF16_ONE
                                               : p[K_CONTIGUOUS ? (size_t)oi * ld + ki : (size_t)ki * ld + oi];
            }
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(e);
        }
    }
};

// p[0] = a and, when `both`, p[1] = b: one store where the pair is aligned for it.
__device__ __forceinline__ void store_pair(float* p, float a, float b, bool both) {
    if (both && reinterpret_cast<size_t>(p) % 8 == 0) {
        *reinterpret_cast<float2*>(p) = make_float2(a, b);
    } else {
        p[0] = a;
        if (both) p[1] = b;
    }
}

__device__ __forceinline__ void store_pair(bf16* p, float a, float b, bool both) {
    if (both && reinterpret_cast<size_t>(p) % 4 == 0) {
        *reinterpret_cast<unsigned*>(p) = bf16x2(a, b);
    } else {
        p[0] = to_bf16(a);
        if (both) p[1] = to_bf16(b);
    }
}

// An optional look at each of A's chunks in shared memory (gemm_tile_bf16_async, gemm_tile_bf16_wgmma):
// on_chunk(at) once per chunk in k order, by every thread, with at(o, k) the bf16 element (m0 + o, k0 + k)
// of the chunk at k0 (zero outside M and K), so that the caller can sum A's columns or rows as they pass.
struct NoChunkHook {
    template <class At>
    __device__ __forceinline__ void operator()(const At&) const {}
};

template <int BM, int BN, int BK, int STAGES, bool A_TRANS, bool B_TRANS, class Store, class OnChunk = NoChunkHook>
__device__ __forceinline__ void gemm_tile_bf16_async(int M, int N, int K, int m0, int n0, const bf16* A, int lda,
                                                     const bf16* B, int ldb, int ones_col, Store store, float* smem,
                                                     OnChunk on_chunk = {}) {
    using G = GemmBf16<BM, BN, BK>;
    using AOp = AsyncOperand<BM, BK, !A_TRANS>;
    using BOp = AsyncOperand<BN, BK, B_TRANS>;
    const AOp a(A, lda, M, K, m0, -1);
    const BOp b(B, ldb, N, K, n0, ones_col);
    bf16* buffers = reinterpret_cast<bf16*>(smem);  // [STAGES][A_SLOT + B_SLOT]
    const Bf16Warp<BM, BN, BK> warp;
    float acc[G::MT][G::NT][4];
    zero_accumulators(acc);

    // Group c holds chunk c (empty past K), so waiting until STAGES − 2 groups are pending leaves chunk c
    // complete; the barrier then also ends every warp's reads of the stage refilled next.
    const auto issue = [&](int c) {
        if (c * BK < K) {
            bf16* s = buffers + c % STAGES * G::BUFFER;
            a.issue(s, c * BK);
            b.issue(s + G::A_SLOT, c * BK);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int c = 0; c < STAGES - 1; ++c) issue(c);
    for (int c = 0; c * BK < K; ++c) {
        cp_async_wait_pending<STAGES - 2>();
        __syncthreads();
        issue(c + STAGES - 1);
        const bf16* As = buffers + c % STAGES * G::BUFFER;
        gemm_bf16_chunk<BM, BN, BK, !A_TRANS, B_TRANS>(As, As + G::A_SLOT, min(BK, K - c * BK), warp.wm, warp.wn, acc);
        on_chunk([&](int o, int k) {
            return As[A_TRANS ? k * Bf16Layout<BM, BK, false>::LD + o : o * Bf16Layout<BM, BK, true>::LD + k];
        });
    }
    cp_async_wait_pending<0>();
    warp.store_pairs(M, N, m0, n0, acc, store);
    __syncthreads();
}

// ---- gemm_128 ----
// A 128×128 tile of C over the block's 256 threads, each accumulating an 8×8 register tile: rows
// 4·tm + i and 64 + 4·tm + i, columns 4·tn + j and 64 + 4·tn + j (i, j < 4; tm, tn < 16). A warp covers
// 4 tm × 8 tn, so a k step reads a thread's 8 A and 8 B values as four 16-byte shared loads, each served
// in one wavefront (4 distinct A addresses broadcast, 8 adjacent B addresses): 64 FMAs per 4 loads.
//
// Each operand is a k-major tile in shared memory (element [k][o] at k·G128_LD + o, the row stride 128 + 4
// keeping rows 16-byte aligned and transposing stores on distinct banks), walked 8 k (a chunk) at a time:
//   Staged<K_CONTIGUOUS>  read through at(o, k) for o < extent, k < K (zero outside) into registers and
//                         stored to a double-buffered chunk: chunk c+1's loads are issued before chunk c's
//                         FMAs and stored after them, so one barrier per chunk guards both buffers and the
//                         loads' latency hides behind 512 FMAs per thread. K_CONTIGUOUS says which index
//                         adjacent threads walk, so that each warp's loads coalesce.
//   Resident              already in shared memory for the whole K, rows K … up to a multiple of 8 zero.
//   StagedMatrix          a plain matrix (pointer, leading dimension), staged as Staged but 16 bytes a load.
// An operand may be any type with the same fetch(k0) / commit(buf) / chunk(buf, k0) interface: fetch
// issues chunk loads into registers and commit stores them after the FFMAs, so whatever a commit computes
// from the loaded values (the text model's softmax gradient) waits for them there, not before the FFMAs.
// Results go to store(m, n, v) once per 4 adjacent columns inside C: m < M, n < N, n − n0 a multiple of
// 4, v = C[m][n … n+3]; the caller checks n + j < N when N − n0 is not a multiple of 4. gemm_128_acc
// instead leaves the tile in the caller's registers (G128Thread says which elements a thread holds).
// Both end with a barrier, so the caller may reuse the staged buffers afterwards.

constexpr int G128 = 128;
constexpr int G128_BK = 8;
constexpr int G128_LD = G128 + 4;
constexpr int G128_CHUNK = G128_BK * G128_LD;
constexpr int G128_STAGED_FLOATS = 2 * G128_CHUNK;  // shared floats of one staged operand
static_assert(THREADS == 256, "gemm_128 maps 256 threads onto its tile");

template <bool K_CONTIGUOUS, class At>
struct Staged {
    At at;
    int extent, o0, K;
    float* smem;  // G128_STAGED_FLOATS
    float v[4];

    // Thread t's four elements of a chunk. K_CONTIGUOUS: row t/2, k = 4·(t mod 2) + r (a warp reads 16 rows
    // × 8 k, and each thread's elements share a row: one address, one sample's normaliser). Otherwise row
    // t mod 32 + 32r, k = t/32 (a warp reads 32 adjacent rows of one k). Both store conflict-free.
    __device__ __forceinline__ static int row_of(int r) {
        return K_CONTIGUOUS ? threadIdx.x / 2 : threadIdx.x % 32 + 32 * r;
    }
    __device__ __forceinline__ static int k_of(int r) {
        return K_CONTIGUOUS ? threadIdx.x % 2 * 4 + r : threadIdx.x / 32;
    }

    // Inside tiles take the unchecked path, so the four at() calls can share their common work.
    __device__ __forceinline__ void fetch(int k0) {
        if (o0 + G128 <= extent && k0 + G128_BK <= K) {
#pragma unroll
            for (int r = 0; r < 4; ++r) v[r] = at(o0 + row_of(r), k0 + k_of(r));
        } else {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int o = o0 + row_of(r), k = k0 + k_of(r);
                v[r] = (o < extent && k < K) ? at(o, k) : 0.0f;
            }
        }
    }
    __device__ __forceinline__ void commit(int buf) {
#pragma unroll
        for (int r = 0; r < 4; ++r) smem[buf * G128_CHUNK + k_of(r) * G128_LD + row_of(r)] = v[r];
    }
    __device__ __forceinline__ const float* chunk(int buf, int) const { return smem + buf * G128_CHUNK; }
};

template <bool K_CONTIGUOUS, class At>
__device__ __forceinline__ Staged<K_CONTIGUOUS, At> staged(At at, int extent, int o0, int K, float* smem) {
    return {at, extent, o0, K, smem, {}};
}

// A plain matrix as an operand of gemm_128, read 16 bytes a thread where it can: element (o, k) at
// p[o·ld + k] when K_CONTIGUOUS, else p[k·ld + o], for o < extent and k < K, except row `ones` (when not
// negative: a bias gradient's column of ones) which reads 1; zero outside. A thread's four elements of a
// chunk are adjacent in memory, K_CONTIGUOUS: row t/2, k = 4·(t mod 2) + r, as Staged's; otherwise rows
// 4·(t mod 32) + r of k = t/32 (a warp reads 512 contiguous bytes of one k), stored as one 16-byte store.
// Staged's scalar loads, one sector of 32 bytes per 8 useful bytes on the K_CONTIGUOUS side, had kept L1
// at 86 % of its throughput in the Transformer's forward products; four of them become one. With
// sum_rows (not K_CONTIGUOUS), `sums` adds up the thread's four rows over the k it stages (k ≡ t/32 mod 8):
// the eight warps' sums of a row make Σ_k of that row (a bias gradient from the tile that reads dyᵀ).
template <bool K_CONTIGUOUS>
struct StagedMatrix {
    const float* p;
    int ld, extent, o0, K, ones;
    float* smem;  // G128_STAGED_FLOATS
    bool vector;  // 16-byte loads are aligned: p 16-byte aligned, ld a multiple of 4
    bool sum_rows;
    float4 v, sums;

    __device__ __forceinline__ static int first_row() { return K_CONTIGUOUS ? threadIdx.x / 2 : threadIdx.x % 32 * 4; }
    __device__ __forceinline__ static int first_k() { return K_CONTIGUOUS ? threadIdx.x % 2 * 4 : threadIdx.x / 32; }
    __device__ __forceinline__ float element(int o, int k) const {
        if (o >= extent || k >= K) return 0.0f;
        if (o == ones) return 1.0f;
        return p[K_CONTIGUOUS ? (size_t)o * ld + k : (size_t)k * ld + o];
    }
    __device__ __forceinline__ void fetch(int k0) {
        const int o = o0 + first_row(), k = k0 + first_k();
        const int last_o = K_CONTIGUOUS ? o : o + 3, last_k = K_CONTIGUOUS ? k + 3 : k;
        const bool whole = last_o < extent && last_k < K && (ones < o || ones > last_o);
        if (vector && whole) {
            v = __ldg(reinterpret_cast<const float4*>(p + (K_CONTIGUOUS ? (size_t)o * ld + k : (size_t)k * ld + o)));
        } else {
            v.x = element(o, k);
            v.y = K_CONTIGUOUS ? element(o, k + 1) : element(o + 1, k);
            v.z = K_CONTIGUOUS ? element(o, k + 2) : element(o + 2, k);
            v.w = K_CONTIGUOUS ? element(o, k + 3) : element(o + 3, k);
        }
        if (!K_CONTIGUOUS && sum_rows) {
            sums.x += v.x;
            sums.y += v.y;
            sums.z += v.z;
            sums.w += v.w;
        }
    }
    __device__ __forceinline__ void commit(int buf) {
        float* chunk = smem + buf * G128_CHUNK + first_k() * G128_LD + first_row();
        if constexpr (K_CONTIGUOUS) {
            chunk[0] = v.x;
            chunk[G128_LD] = v.y;
            chunk[2 * G128_LD] = v.z;
            chunk[3 * G128_LD] = v.w;
        } else {
            *reinterpret_cast<float4*>(chunk) = v;
        }
    }
    __device__ __forceinline__ const float* chunk(int buf, int) const { return smem + buf * G128_CHUNK; }
};

template <bool K_CONTIGUOUS>
__device__ __forceinline__ StagedMatrix<K_CONTIGUOUS> staged_matrix(const float* p, int ld, int extent, int o0, int K,
                                                                    float* smem, int ones = -1, bool sum_rows = false) {
    const bool vector = ld % 4 == 0 && reinterpret_cast<size_t>(p) % 16 == 0;
    return {p, ld, extent, o0, K, ones, smem, vector, sum_rows, {}, make_float4(0.0f, 0.0f, 0.0f, 0.0f)};
}

struct Resident {
    const float* smem;
    __device__ __forceinline__ void fetch(int) {}
    __device__ __forceinline__ void commit(int) {}
    __device__ __forceinline__ const float* chunk(int, int k0) const { return smem + k0 * G128_LD; }
};

// Where a thread's register tile lies in the 128×128 tile: acc[i][j] is C[m0 + row(i)][n0 + col(j)].
struct G128Thread {
    int tm, tn;
    __device__ __forceinline__ G128Thread() {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        tm = warp / 2 * 4 + lane / 8;
        tn = warp % 2 * 8 + lane % 8;
    }
    __device__ __forceinline__ int row(int i) const { return i / 4 * 64 + 4 * tm + i % 4; }
    __device__ __forceinline__ int col(int j) const { return j / 4 * 64 + 4 * tn + j % 4; }
};

// The product into the calling thread's register tile (overwritten): acc[i][j] = Σ_k A[row(i)][k]·B[k][col(j)].
template <class A, class B>
__device__ __forceinline__ void gemm_128_acc(int K, A& a, B& b, float (&acc)[8][8]) {
    const G128Thread t;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    a.fetch(0);
    b.fetch(0);
    a.commit(0);
    b.commit(0);
    __syncthreads();
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += G128_BK) {
        const bool more = k0 + G128_BK < K;
        if (more) {
            a.fetch(k0 + G128_BK);
            b.fetch(k0 + G128_BK);
        }
        const float* As = a.chunk(buf, k0);
        const float* Bs = b.chunk(buf, k0);
#pragma unroll
        for (int k = 0; k < G128_BK; ++k) {
            const float4 a0 = *reinterpret_cast<const float4*>(As + k * G128_LD + 4 * t.tm);
            const float4 a1 = *reinterpret_cast<const float4*>(As + k * G128_LD + 64 + 4 * t.tm);
            const float4 b0 = *reinterpret_cast<const float4*>(Bs + k * G128_LD + 4 * t.tn);
            const float4 b1 = *reinterpret_cast<const float4*>(Bs + k * G128_LD + 64 + 4 * t.tn);
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if (more) {
            a.commit(buf ^ 1);
            b.commit(buf ^ 1);
        }
        __syncthreads();
        buf ^= 1;
    }
}

template <class A, class B, class Store>
__device__ __forceinline__ void gemm_128(int M, int N, int K, int m0, int n0, A& a, B& b, Store store) {
    const G128Thread t;
    float acc[8][8];
    gemm_128_acc(K, a, b, acc);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int m = m0 + t.row(i);
        if (m >= M) continue;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int n = n0 + t.col(4 * half);
            const float* c = acc[i] + 4 * half;
            if (n < N) store(m, n, make_float4(c[0], c[1], c[2], c[3]));
        }
    }
}
