// Plain fp32 matrix products C = A·B, A M×K, B K×N, C M×N, all row-major (CPU twin: src/matmul/mod.rs),
// for `textnet bench matmul`: how the tiled products of fused/gemm.cuh, which the training kernels use,
// compare with a naive kernel and with cuBLAS on one large product. The tiled kernels are thin wrappers
// over gemm_128 and gemm_tile, so what the bench measures is the code the pipelines run.
//
//   matmul_naive     grid (⌈N/256⌉, M): one thread per element of C, a loop over k; a warp reads 32
//                    adjacent B elements (coalesced) and one A element (broadcast) per k.
//   matmul_tile128   grid (⌈N/128⌉, ⌈M/128⌉), gemm_128; dynamic shared memory 2·G128_STAGED_FLOATS floats.
//   matmul_tile128_split2  grid (2·⌈N/128⌉, ⌈M/128⌉): gemm_128 over one half of K per block (the two
//                    halves of a tile are adjacent blocks), added into C with float atomics: twice the blocks
//                    of matmul_tile128, so 1024² fills 128 of the 132 SMs. Two addends onto a zeroed C give
//                    the same sum in either order (0 + a = a, and a + b = b + a), so the result repeats to the
//                    bit. C must be zero first (the launch layer clears it).
//   matmul_tile64    grid (⌈N/64⌉, ⌈M/64⌉), gemm_tile<64, 64, 16, 4, 4>: four times the blocks of the
//                    128² tile, for products too small to fill the GPU with 128² tiles (1024² is 64
//                    blocks); dynamic shared memory GemmTile<64, 64, 16, 4, 4>::SHARED_FLOATS floats.
//
// And the bf16 tensor-core products (operands rounded to bf16, fp32 sums; CPU twin: the reference on
// bf16-rounded operands), C fp32:
//
//   matmul_bf16      A, B bf16 (row-major), grid (⌈N/128⌉, ⌈M/128⌉), gemm_tile_bf16<128, 128, 32>
//                    through functors, as the Transformer calls it; GemmBf16<128, 128, 32>::SHARED_FLOATS.
//   matmul_bf16_async  gemm_tile_bf16's chunk products (gemm_bf16_chunk) on 128×128 tiles fed by
//                    cp.async instead of through registers: A [m][k] and B [k][n] go to shared memory as
//                    they lie, ASYNC_STAGES chunks of ASYNC_BK k in flight; for operands that are bf16 in
//                    memory already. K and N multiples of 8 (whole 16-byte rows); dynamic shared memory
//                    ASYNC_STAGES · GemmBf16<128, 128, ASYNC_BK>::SHARED_FLOATS / 2 floats.
//   gemm_bf16_{nn,nt,tn,tt}_{128,64}  gemm_tile_bf16<T, T, 32> on fp32 operands (A M×K, or K×M when the
//                    first letter is t; B K×N, or N×K when the second is t), as the Transformer's linear
//                    layers read them: forward in·Wᵀ is nt, dx = dy·W nn, dW = dyᵀ·x tn. K is cut into
//                    `slices` row slices, slice s's product written to C + s·M·N (the Transformer's weight
//                    gradients, summed afterwards). Grid (slices·⌈N/T⌉, ⌈M/T⌉); GemmBf16<T, T, 32>::SHARED_FLOATS.
//   gemm_bf16_cp_{nn,nt,tn,tt}  gemm_tile_bf16_cp<CP_TILE, CP_TILE, CP_BK, CP_STAGES> as the Transformer's
//                    linear layers run it: A and B with leading dimensions lda, ldb, column ones_col of B
//                    read as 1 (none when negative). Grid (⌈N/CP_TILE⌉, ⌈M/CP_TILE⌉);
//                    GemmBf16Cp<CP_TILE, CP_TILE, CP_BK, CP_STAGES>::SHARED_FLOATS.
#include "common.cuh"
#include "gemm.cuh"

extern "C" __global__ void __launch_bounds__(THREADS)
matmul_naive(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
    const int n = blockIdx.x * THREADS + threadIdx.x, m = blockIdx.y;
    if (m >= M || n >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc = fmaf(A[(size_t)m * K + k], B[(size_t)k * N + n], acc);
    C[(size_t)m * N + n] = acc;
}

extern "C" __global__ void __launch_bounds__(THREADS)
matmul_tile128(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
    extern __shared__ float smem[];
    const int m0 = blockIdx.y * G128, n0 = blockIdx.x * G128;
    auto a = staged<true>([=](int m, int k) { return A[(size_t)m * K + k]; }, M, m0, K, smem);
    auto b = staged<false>([=](int n, int k) { return B[(size_t)k * N + n]; }, N, n0, K, smem + G128_STAGED_FLOATS);
    const bool aligned = N % 4 == 0;
    gemm_128(M, N, K, m0, n0, a, b, [&](int m, int n, float4 v) {
        float* c = C + (size_t)m * N + n;
        if (aligned && n + 4 <= N) {
            *reinterpret_cast<float4*>(c) = v;
        } else {
            const float e[4] = {v.x, v.y, v.z, v.w};
            for (int j = 0; j < 4 && n + j < N; ++j) c[j] = e[j];
        }
    });
}

extern "C" __global__ void __launch_bounds__(THREADS)
matmul_tile64(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
    extern __shared__ float smem[];
    gemm_tile<64, 64, 16, 4, 4, false, false>(
        M, N, K, blockIdx.y * 64, blockIdx.x * 64,
        [=](int m, int k) { return A[(size_t)m * K + k]; },
        [=](int k, int n) { return B[(size_t)k * N + n]; },
        [=](int m, int n, float v) { C[(size_t)m * N + n] = v; }, smem);
}

extern "C" __global__ void __launch_bounds__(THREADS)
matmul_tile128_split2(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int M, int N,
                      int K) {
    extern __shared__ float smem[];
    const int half = blockIdx.x & 1;
    const int m0 = blockIdx.y * G128, n0 = (blockIdx.x >> 1) * G128;
    const int k0 = half ? K / 2 : 0, kn = half ? K - K / 2 : K / 2;
    auto a = staged<true>([=](int m, int k) { return A[(size_t)m * K + k0 + k]; }, M, m0, kn, smem);
    auto b = staged<false>([=](int n, int k) { return B[(size_t)(k0 + k) * N + n]; }, N, n0, kn,
                           smem + G128_STAGED_FLOATS);
    const bool aligned = N % 4 == 0;
    gemm_128(M, N, kn, m0, n0, a, b, [&](int m, int n, float4 v) {
        float* c = C + (size_t)m * N + n;
        if (aligned && n + 4 <= N) {
            atomic_add4(c, v);
        } else {
            const float e[4] = {v.x, v.y, v.z, v.w};
            for (int j = 0; j < 4 && n + j < N; ++j) atomicAdd(c + j, e[j]);
        }
    });
}

// ---- bf16 ----

__device__ __forceinline__ float bf16_value(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

extern "C" __global__ void __launch_bounds__(THREADS)
matmul_bf16(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B, float* __restrict__ C, int M,
            int N, int K) {
    extern __shared__ float smem[];
    gemm_tile_bf16<128, 128, 32, false, false>(
        M, N, K, blockIdx.y * 128, blockIdx.x * 128,
        [=](int m, int k) { return bf16_value(A[(size_t)m * K + k]); },
        [=](int k, int n) { return bf16_value(B[(size_t)k * N + n]); },
        [=](int m, int n, float v) { C[(size_t)m * N + n] = v; }, smem);
}

constexpr int ASYNC_STAGES = 3;
constexpr int ASYNC_BK = 64;

extern "C" __global__ void __launch_bounds__(THREADS)
matmul_bf16_async(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B, float* __restrict__ C,
                  int M, int N, int K) {
    constexpr int BM = 128, BN = 128, BK = ASYNC_BK;
    using G = GemmBf16<BM, BN, BK>;
    using LA = Bf16Layout<BM, BK, true>;
    using LB = Bf16Layout<BN, BK, false>;
    constexpr int A_COPIES = BM * BK / 8 / THREADS, B_COPIES = BN * BK / 8 / THREADS;  // 16-byte copies per thread
    static_assert(BM * BK % (8 * THREADS) == 0 && BN * BK % (8 * THREADS) == 0, "whole copies per thread");
    extern __shared__ float smem[];
    unsigned short* buffers = reinterpret_cast<unsigned short*>(smem);  // [ASYNC_STAGES][A_SLOT + B_SLOT]
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const auto issue = [&](int stage, int k0) {
        unsigned short* As = buffers + stage * G::BUFFER;
        unsigned short* Bs = As + G::A_SLOT;
#pragma unroll
        for (int r = 0; r < A_COPIES; ++r) {
            const int v = threadIdx.x + r * THREADS;
            const int am = v / (BK / 8), ak = v % (BK / 8) * 8;  // A: a row of BK is BK/8 copies
            const bool a_in = m0 + am < M && k0 + ak < K;
            cp_async16_or_zero(As + am * LA::LD + ak, a_in ? A + (size_t)(m0 + am) * K + k0 + ak : A, a_in);
        }
#pragma unroll
        for (int r = 0; r < B_COPIES; ++r) {
            const int v = threadIdx.x + r * THREADS;
            const int bk = v / (BN / 8), bn = v % (BN / 8) * 8;  // B: a row of BN is BN/8 copies
            const bool b_in = k0 + bk < K && n0 + bn < N;
            cp_async16_or_zero(Bs + bk * LB::LD + bn, b_in ? B + (size_t)(k0 + bk) * N + n0 + bn : B, b_in);
        }
    };
    const Bf16Warp<BM, BN, BK> warp;
    float acc[G::MT][G::NT][4];
    zero_accumulators(acc);

    // Group g holds chunk g (empty past K), so waiting until ASYNC_STAGES − 2 groups are pending leaves
    // chunk c complete; the barrier then also ends every warp's reads of the buffer refilled next.
#pragma unroll
    for (int s = 0; s < ASYNC_STAGES - 1; ++s) {
        if (s * BK < K) issue(s, s * BK);
        cp_async_commit();
    }
    for (int c = 0; c * BK < K; ++c) {
        cp_async_wait_pending<ASYNC_STAGES - 2>();
        __syncthreads();
        const int next = c + ASYNC_STAGES - 1;
        if (next * BK < K) issue(next % ASYNC_STAGES, next * BK);
        cp_async_commit();
        const unsigned short* As = buffers + c % ASYNC_STAGES * G::BUFFER;
        gemm_bf16_chunk<BM, BN, BK, true, false>(As, As + G::A_SLOT, min(BK, K - c * BK), warp.wm, warp.wn, acc);
    }
    cp_async_wait_pending<0>();
    warp.store(M, N, m0, n0, acc, [&](int m, int n, float v) { C[(size_t)m * N + n] = v; });
}

template <int TILE, bool A_TRANS, bool B_TRANS>
__device__ __forceinline__ void gemm_bf16_sliced(const float* __restrict__ A, const float* __restrict__ B,
                                                 float* __restrict__ C, int M, int N, int K, int slices, float* smem) {
    const int columns = ceil_div(N, TILE), slice = blockIdx.x / columns;
    const int rows = ceil_div(K, slices), k0 = slice * rows, count = max(0, min(K, k0 + rows) - k0);
    float* out = C + (size_t)slice * M * N;
    gemm_tile_bf16<TILE, TILE, 32, A_TRANS, B_TRANS>(
        M, N, count, blockIdx.y * TILE, blockIdx.x % columns * TILE,
        [=](int m, int k) { return A_TRANS ? A[(size_t)(k0 + k) * M + m] : A[(size_t)m * K + k0 + k]; },
        [=](int k, int n) { return B_TRANS ? B[(size_t)n * K + k0 + k] : B[(size_t)(k0 + k) * N + n]; },
        [=](int m, int n, float v) { out[(size_t)m * N + n] = v; }, smem);
}

// 64×64 tiles take under 128 registers, so two blocks share an SM.
#define GEMM_BF16_SLICED(LAYOUT, A_TRANS, B_TRANS, TILE)                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS, TILE == 64 ? 2 : 1)                                  \
        gemm_bf16_##LAYOUT##_##TILE(const float* __restrict__ A, const float* __restrict__ B,                  \
                                    float* __restrict__ C, int M, int N, int K, int slices) {                  \
        extern __shared__ float smem[];                                                                         \
        gemm_bf16_sliced<TILE, A_TRANS, B_TRANS>(A, B, C, M, N, K, slices, smem);                               \
    }
#define GEMM_BF16_LAYOUTS(TILE)                      \
    GEMM_BF16_SLICED(nn, false, false, TILE)         \
    GEMM_BF16_SLICED(nt, false, true, TILE)          \
    GEMM_BF16_SLICED(tn, true, false, TILE)          \
    GEMM_BF16_SLICED(tt, true, true, TILE)
GEMM_BF16_LAYOUTS(128)
GEMM_BF16_LAYOUTS(64)

// gemm_tile_bf16_cp with the Transformer's linear tiles, C = A·B (M×N, row-major) with leading dimensions.
constexpr int CP_TILE = 128, CP_BK = 32, CP_STAGES = 3;
#define GEMM_BF16_CP(LAYOUT, A_TRANS, B_TRANS)                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                     \
        gemm_bf16_cp_##LAYOUT(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, \
                              int M, int N, int K, int lda, int ldb, int ones_col) {                           \
        extern __shared__ __align__(16) float smem[];                                                          \
        gemm_tile_bf16_cp<CP_TILE, CP_TILE, CP_BK, CP_STAGES, A_TRANS, B_TRANS>(                               \
            M, N, K, blockIdx.y * CP_TILE, blockIdx.x * CP_TILE, A, lda, B, ldb, ones_col,                     \
            [=](int m, int n, float v) { C[(size_t)m * N + n] = v; }, smem);                                   \
    }
GEMM_BF16_CP(nn, false, false)
GEMM_BF16_CP(nt, false, true)
GEMM_BF16_CP(tn, true, false)
GEMM_BF16_CP(tt, true, true)
