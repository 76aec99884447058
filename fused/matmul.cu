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
