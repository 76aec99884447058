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
//                    through functors; GemmBf16<128, 128, 32>::SHARED_FLOATS.
//   matmul_bf16_async  A, B bf16 (row-major), grid (⌈N/128⌉, ⌈M/128⌉), gemm_tile_bf16_async<128, 128,
//                    ASYNC_BK, ASYNC_STAGES> with lda = K, ldb = N: the same mma fed by cp.async from bf16
//                    memory, 16 bytes at a time where K and N are multiples of 8;
//                    GemmBf16Async<128, 128, ASYNC_BK, ASYNC_STAGES>::SHARED_FLOATS.
//   matmul_bf16_wgmma  the same on Hopper's wgmma (gemm_tile_bf16_wgmma<WGMMA_STAGES>, sm_90a only: the
//                    Transformer's bf16 tile there); GemmWgmma<WGMMA_STAGES>::SHARED_FLOATS.
//   matmul_bf16_tma_{128x256,256x128,128x192,128x128}  the same by gemm_bf16_tma (fused/gemm_tma.cuh, sm_90a only):
//                    TMA copies, a producer warp and two consumer warpgroups, persistent blocks of 384
//                    threads over the tiles of the kernel's BM×BN (grid min(tiles, SMs)); A and B through
//                    the tensor maps of `maps` (A's dims {K, M}, box {64, BM}; B's {N, K}, box {64, 64}),
//                    N and K multiples of 8. GemmTma<BM, BN, TMA_STAGES_BMxBN>::SHARED_BYTES.
//   matmul_bf16_tma_{nt,tn,tt}_{128x256,256x128,128x192,128x128}  the same in the other layouts (A K×M when the
//                    first letter is t, B N×K when the second is), through gemm_bf16_tma_tiles' store
//                    hook as the Transformer's products use it: the maps over the operands as they lie,
//                    with leading dimensions multiples of 8; C row-major.
//   gemm_bf16_{nn,nt,tn,tt}_{128,64}  gemm_tile_bf16<T, T, 32> on fp32 operands (A M×K, or K×M when the
//                    first letter is t; B K×N, or N×K when the second is t), rounded as they are staged: forward
//                    in·Wᵀ is nt, dx = dy·W nn, dW = dyᵀ·x tn. K is cut into `slices` row slices, slice s's
//                    product written to C + s·M·N (weight gradients, summed afterwards). Grid
//                    (slices·⌈N/T⌉, ⌈M/T⌉); GemmBf16<T, T, 32>::SHARED_FLOATS.
//   gemm_bf16_async_{nn,nt,tn,tt}  the Transformer's linear-layer tile on bf16 operands,
//                    gemm_tile_bf16_async<LINEAR_TILE, LINEAR_TILE, LINEAR_BK, LINEAR_STAGES>, in the same
//                    layouts: A and B with leading dimensions lda, ldb, column ones_col of B read as 1 (none
//                    when negative; a bias gradient), K in `slices` row slices as above. Grid
//                    (slices·⌈N/LINEAR_TILE⌉, ⌈M/LINEAR_TILE⌉);
//                    GemmBf16Async<LINEAR_TILE, LINEAR_TILE, LINEAR_BK, LINEAR_STAGES>::SHARED_FLOATS.
#include "common.cuh"
#include "gemm.cuh"
#include "gemm_wgmma.cuh"
#include "gemm_tma.cuh"

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

extern "C" __global__ void __launch_bounds__(THREADS)
matmul_bf16(const bf16* __restrict__ A, const bf16* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
    extern __shared__ float smem[];
    gemm_tile_bf16<128, 128, 32, false, false>(
        M, N, K, blockIdx.y * 128, blockIdx.x * 128,
        [=](int m, int k) { return bf16_value(A[(size_t)m * K + k]); },
        [=](int k, int n) { return bf16_value(B[(size_t)k * N + n]); },
        [=](int m, int n, float v) { C[(size_t)m * N + n] = v; }, smem);
}

// gemm_tile_bf16_async's pairs into row-major C (M×N).
__device__ __forceinline__ auto pair_store(float* C, int N) {
    return [=](int m, int n, float v0, float v1) { store_pair(C + (size_t)m * N + n, v0, v1, n + 1 < N); };
}

constexpr int ASYNC_STAGES = 3;
constexpr int ASYNC_BK = 64;

extern "C" __global__ void __launch_bounds__(THREADS)
matmul_bf16_async(const bf16* __restrict__ A, const bf16* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
    extern __shared__ __align__(16) float smem[];
    gemm_tile_bf16_async<128, 128, ASYNC_BK, ASYNC_STAGES, false, false>(
        M, N, K, blockIdx.y * 128, blockIdx.x * 128, A, K, B, N, -1, pair_store(C, N), smem);
}

constexpr int WGMMA_STAGES = 3;

// Launched only where the compile has wgmma (sm_90a); elsewhere it does nothing.
extern "C" __global__ void __launch_bounds__(THREADS)
matmul_bf16_wgmma(const bf16* __restrict__ A, const bf16* __restrict__ B, float* __restrict__ C, int M, int N, int K) {
    extern __shared__ __align__(16) float smem[];
    if constexpr (HAS_WGMMA)
        gemm_tile_bf16_wgmma<WGMMA_STAGES, false, false>(M, N, K, blockIdx.y * 128, blockIdx.x * 128, A, K, B, N,
                                                         pair_store(C, N), smem);
}

// Launched only where the compile has wgmma (sm_90a); elsewhere it does nothing.
#define MATMUL_BF16_TMA(BM, BN)                                                                               \
    extern "C" __global__ void __launch_bounds__(GemmTma<BM, BN, TMA_STAGES_##BM##x##BN>::BLOCK_THREADS, 1)   \
        matmul_bf16_tma_##BM##x##BN(const __grid_constant__ TmaOperands maps, float* __restrict__ C, int M,   \
                                    int N, int K) {                                                           \
        extern __shared__ __align__(16) char tma_smem[];                                                      \
        gemm_bf16_tma<GemmTma<BM, BN, TMA_STAGES_##BM##x##BN>>(maps, C, M, N, K, tma_smem);                   \
    }
MATMUL_BF16_TMA(128, 256)
MATMUL_BF16_TMA(256, 128)
MATMUL_BF16_TMA(128, 192)
MATMUL_BF16_TMA(128, 128)

// The other operand layouts, through the store hook: A K×M (lda) when A_TRANS, B N×K (ldb) when B_TRANS,
// as gemm_bf16_async_*'s; C row-major M×N, pairs cut at N.
#define MATMUL_BF16_TMA_LAYOUT(LAYOUT, A_TRANS, B_TRANS, BM, BN)                                              \
    extern "C" __global__ void __launch_bounds__(GemmTma<BM, BN, TMA_STAGES_##BM##x##BN>::BLOCK_THREADS, 1)   \
        matmul_bf16_tma_##LAYOUT##_##BM##x##BN(const __grid_constant__ TmaOperands maps, float* __restrict__ C, \
                                               int M, int N, int K) {                                         \
        extern __shared__ __align__(16) char tma_smem[];                                                      \
        gemm_bf16_tma_tiles<GemmTma<BM, BN, TMA_STAGES_##BM##x##BN>, A_TRANS, B_TRANS>(maps, M, N, K,          \
                                                                                     pair_store(C, N), tma_smem); \
    }
#define MATMUL_BF16_TMA_LAYOUTS(BM, BN)                    \
    MATMUL_BF16_TMA_LAYOUT(nt, false, true, BM, BN)        \
    MATMUL_BF16_TMA_LAYOUT(tn, true, false, BM, BN)        \
    MATMUL_BF16_TMA_LAYOUT(tt, true, true, BM, BN)
MATMUL_BF16_TMA_LAYOUTS(128, 256)
MATMUL_BF16_TMA_LAYOUTS(256, 128)
MATMUL_BF16_TMA_LAYOUTS(128, 192)
MATMUL_BF16_TMA_LAYOUTS(128, 128)

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

// The Transformer's linear-layer tile, C = A·B (M×N, row-major) of bf16 operands with leading dimensions,
// K in row slices as gemm_bf16_sliced's.
constexpr int LINEAR_TILE = 128, LINEAR_BK = 32, LINEAR_STAGES = 4;

template <bool A_TRANS, bool B_TRANS>
__device__ __forceinline__ void gemm_bf16_async_sliced(const bf16* __restrict__ A, const bf16* __restrict__ B,
                                                       float* __restrict__ C, int M, int N, int K, int lda, int ldb,
                                                       int ones_col, int slices, float* smem) {
    const int columns = ceil_div(N, LINEAR_TILE), slice = blockIdx.x / columns;
    const int rows = ceil_div(K, slices), k0 = slice * rows, count = max(0, min(K, k0 + rows) - k0);
    float* out = C + (size_t)slice * M * N;
    gemm_tile_bf16_async<LINEAR_TILE, LINEAR_TILE, LINEAR_BK, LINEAR_STAGES, A_TRANS, B_TRANS>(
        M, N, count, blockIdx.y * LINEAR_TILE, blockIdx.x % columns * LINEAR_TILE,
        A + (size_t)k0 * (A_TRANS ? lda : 1), lda, B + (size_t)k0 * (B_TRANS ? 1 : ldb), ldb, ones_col,
        pair_store(out, N), smem);
}

#define GEMM_BF16_ASYNC(LAYOUT, A_TRANS, B_TRANS)                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                       \
        gemm_bf16_async_##LAYOUT(const bf16* __restrict__ A, const bf16* __restrict__ B, float* __restrict__ C, \
                                 int M, int N, int K, int lda, int ldb, int ones_col, int slices) {             \
        extern __shared__ __align__(16) float smem[];                                                           \
        gemm_bf16_async_sliced<A_TRANS, B_TRANS>(A, B, C, M, N, K, lda, ldb, ones_col, slices, smem);           \
    }
GEMM_BF16_ASYNC(nn, false, false)
GEMM_BF16_ASYNC(nt, false, true)
GEMM_BF16_ASYNC(tn, true, false)
GEMM_BF16_ASYNC(tt, true, true)
