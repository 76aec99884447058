// gemm_tile: one thread block's BM×BN tile of an fp32 matrix product C = op(A)·op(B), op(A) M×K and
// op(B) K×N, staged through shared memory. Pipelines use it for their batch×hidden products.
//
// Operands are read through the caller's functors a_at(m, k) and b_at(k, n), called only for indices
// inside the matrices, so a caller can gather rows (a shuffled batch), append a column of ones (a bias
// gradient from the same tile), or apply an activation as it loads. Each result goes to the caller's
// store(m, n, value), called exactly once per element inside C, which is where epilogues fuse.
//
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

    __device__ __forceinline__ static int row_of(int idx) { return K_CONTIGUOUS ? idx / BK : idx % EXTENT; }
    __device__ __forceinline__ static int k_of(int idx) { return K_CONTIGUOUS ? idx % BK : idx / EXTENT; }

    // at(o, k) for o < extent, k < K; zero outside.
    template <class At>
    __device__ __forceinline__ void load(At at, int extent, int o0, int K, int k0) {
#pragma unroll
        for (int r = 0; r < PER_THREAD; ++r) {
            const int idx = threadIdx.x + r * THREADS;
            const int o = o0 + row_of(idx), k = k0 + k_of(idx);
            v[r] = (idx < COUNT && o < extent && k < K) ? at(o, k) : 0.0f;
        }
    }

    __device__ __forceinline__ void store(float* s) const {
#pragma unroll
        for (int r = 0; r < PER_THREAD; ++r) {
            const int idx = threadIdx.x + r * THREADS;
            if (idx < COUNT) s[k_of(idx) * LD + row_of(idx)] = v[r];
        }
    }
};

template <int BM, int BN, int BK, int TM, int TN, bool A_TRANS, bool B_TRANS, class AAt, class BAt, class Store>
__device__ __forceinline__ void gemm_tile(int M, int N, int K, int m0, int n0, AAt a_at, BAt b_at, Store store,
                                          float* smem) {
    using T = GemmTile<BM, BN, BK, TM, TN>;
    float* As = smem;
    float* Bs = smem + BK * T::LDA;
    GemmStage<BM, BK, T::LDA, !A_TRANS> a_stage;
    GemmStage<BN, BK, T::LDB, B_TRANS> b_stage;
    const auto b_by_row = [&](int n, int k) { return b_at(k, n); };

    const int group = threadIdx.x / T::GROUP;
    const int tm = threadIdx.x % T::GROUP / T::THREADS_N;
    const int tn = threadIdx.x % T::THREADS_N;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

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
        const int k_count = min(BK, K - k0);
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
        __syncthreads();
    }

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
