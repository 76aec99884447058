// The bf16 tensor-core product of Hopper (sm_90a): `wgmma`, a warpgroup's 64×N×16 matrix multiply-add
// reading both operands from shared memory, asynchronously to the issuing threads.
//
//   gemm_tile_bf16_wgmma  C tile 128×128 at (m0, n0) of op(A)·op(B), bf16 operands in memory with leading
//            dimensions as gemm_tile_bf16_async takes them ((m, k) of A at A[k·lda + m] if A_TRANS else
//            A[m·lda + k]; (k, n) of B at B[n·ldb + k] if B_TRANS else B[k·ldb + n]), fp32 sums. Each of
//            the two warpgroups of the block's 256 threads owns 64 rows of the tile: per 16 k, one
//            m64n128k16 `wgmma`, 64 fp32 accumulators a thread. Either operand may lie with k or with
//            m (n) contiguous: `wgmma` reads both layouts (its transpose flags), so the Transformer's
//            forward, dx and weight-gradient products all run on it without a transposing copy.
//   stage    k in chunks of 64, copied 16 bytes at a time by cp.async into the 128-byte swizzled layout
//            `wgmma` reads through its descriptors (wgmma_chunk_offset): rows of 128 bytes, the 16-byte
//            segment s of row r at slot s ⊕ (r mod 8), so that the 8 rows of a core matrix lie on distinct
//            banks. STAGES chunks rotate: STAGES − 1 copies in flight ahead of the chunk being multiplied
//            (a stage is refilled only after a barrier that follows every warpgroup's wait for the
//            `wgmma`s that read it). Waiting for each chunk's `wgmma`s before the next barrier, rather than
//            keeping one chunk's in flight behind the next, frees a stage for one more copy ahead: at the
//            Transformer's K of 384 (6 chunks a tile) the copies' latency, not the tensor cores, bounded
//            the tile (the bf16 step 9.25 → 8.90 ms; 4096³ 228 → 262 TFLOP/s).
//   edges    rows past M or N and k past K read zero (segments wholly outside are zero-filled by the copy,
//            partial ones element by element); so do operands whose ld or alignment rule out 16-byte
//            copies.
//   store    store(m, n, v0, v1): C[m][n] = v0 and, when n + 1 < N (the caller checks), C[m][n + 1] = v1;
//            once per pair of adjacent columns inside C, m < M, n < N, n − n0 even. on_chunk as
//            gemm_tile_bf16_async's.
//   why      mma.sync (gemm_tile_bf16_async) feeds the tensor cores from registers that each warp loads
//            with ldmatrix; at the Transformer's shapes it reached 117–145 TFLOP/s. `wgmma` reads shared
//            memory itself, with no register traffic per fragment: 165–230 TFLOP/s on those shapes in
//            isolation. The tile is still fed by every thread's cp.async and synchronised by block
//            barriers; cuBLAS (TMA copies, a producer warp, 2-block clusters) reaches 450–600.
//
// `wgmma` exists only on sm_90a: HAS_WGMMA says whether this compile has it; callers keep an mma.sync
// path for other GPUs. Dynamic shared memory: GemmWgmma<STAGES>::SHARED_FLOATS floats (1 KB of it
// aligns the chunks to the swizzle's 1024-byte period); more than 48 KB needs the kernel's opt-in.
#pragma once
#include "gemm.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr bool HAS_WGMMA = true;
#else
constexpr bool HAS_WGMMA = false;
#endif

template <int STAGES>
struct GemmWgmma {
    static_assert(STAGES >= 2, "a chunk being multiplied, at least one being copied");
    static constexpr int BM = 128, BN = 128, BK = 64;
    static constexpr int A_CHUNK = BM * BK, B_CHUNK = BN * BK, STAGE = A_CHUNK + B_CHUNK;  // bf16
    static constexpr int SHARED_FLOATS = (STAGES * STAGE * 2 + 1024) / 4;
};

// Where element (o, k) of a chunk lies (bf16 from the chunk's start), o < 128, k < 64. K-contiguous: row o
// of 64 k. Otherwise two blocks of 64 o, each 64 rows (one per k) of 64 o. Either way a row is 128 bytes
// and its 16-byte segment s sits at slot s ⊕ (row mod 8).
template <bool K_CONTIGUOUS>
__device__ __forceinline__ int wgmma_chunk_offset(int o, int k) {
    return K_CONTIGUOUS ? o * 64 + (k / 8 ^ (o & 7)) * 8 + k % 8
                        : o / 64 * 4096 + k * 64 + (o % 64 / 8 ^ (k & 7)) * 8 + o % 8;
}

// Copies o [o0, o0 + EXTENT) × k [k0, k0 + 64) of an operand, element (o, k) at p[o·ld + k] when
// K_CONTIGUOUS, else p[k·ld + o], into the chunk at s; zero outside `extent` and K.
template <int EXTENT, bool K_CONTIGUOUS>
__device__ __forceinline__ void wgmma_chunk_issue(bf16* s, const bf16* p, int ld, int extent, int K, int o0, int k0,
                                                  bool vector) {
    constexpr int SEGMENTS = EXTENT * 64 / 8;
    static_assert(SEGMENTS % THREADS == 0, "whole segments per thread");
#pragma unroll
    for (int r = 0; r < SEGMENTS / THREADS; ++r) {
        const int v = threadIdx.x + r * THREADS;
        const int ol = K_CONTIGUOUS ? v / 8 : v % (EXTENT / 8) * 8, kl = K_CONTIGUOUS ? v % 8 * 8 : v / (EXTENT / 8);
        const int o = o0 + ol, k = k0 + kl;
        bf16* dst = s + wgmma_chunk_offset<K_CONTIGUOUS>(ol, kl);
        const bool none = o >= extent || k >= K;
        const bool whole = K_CONTIGUOUS ? k + 8 <= K : o + 8 <= extent;
        if (none || (vector && whole)) {
            cp_async16_or_zero(dst, none ? p : p + (K_CONTIGUOUS ? (size_t)o * ld + k : (size_t)k * ld + o), !none);
        } else {
            bf16 e[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int oi = o + (K_CONTIGUOUS ? 0 : i), ki = k + (K_CONTIGUOUS ? i : 0);
                e[i] = oi < extent && ki < K ? p[K_CONTIGUOUS ? (size_t)oi * ld + ki : (size_t)ki * ld + oi] : (bf16)0;
            }
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(e);
        }
    }
}

// The shared-memory descriptor of 64 o × 16 k of a chunk from `start` (wgmma_chunk_offset(o0, k0)):
// 128-byte swizzle, 8-row core matrices 1024 bytes apart; K-contiguous rows need no leading offset, the
// other layout's next 64 o lie 8 KB on (B's second half).
template <bool K_CONTIGUOUS>
__device__ __forceinline__ unsigned long long wgmma_descriptor(const bf16* start) {
    const unsigned long long address = (unsigned)__cvta_generic_to_shared(start);
    const unsigned long long leading = K_CONTIGUOUS ? 16 : 8192;
    return (address & 0x3FFFF) >> 4 | (leading >> 4) << 16 | (1024ull >> 4) << 32 | 1ull << 62;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Orders this thread's ordinary (and cp.async) shared-memory writes before the async proxy's reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// `wgmma.mma_async` m64nNk16 with bf16 operands from shared-memory descriptors and fp32 accumulators d[N/2]
// (the inline PTX lists each accumulator register): d += A·B, or d = A·B where `accumulate` is false; each
// operand K-contiguous or not (its rows of m or n contiguous: the instruction's transpose flags). The
// accumulators lie in the m16n8 fragment order of each warp's 16 rows (d[4j…4j+3]: columns 8j + 2·(lane mod
// 4) + {0, 1} of rows lane/4 and lane/4 + 8). WGMMA_M64K16(N, R, …) defines wgmma_m64n<N>k16, R = N/2 its
// accumulators and the four operand numbers after them (desc_a, desc_b, accumulate, then the two flags),
// REGS the placeholders %0 … %R−1, then their constraints. The instruction exists on sm_90a alone; elsewhere
// the function is empty (callers never run it there: HAS_WGMMA).
#define WGMMA_REGS_64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WGMMA_REGS_96 \
    WGMMA_REGS_64 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define WGMMA_REGS_128 \
    WGMMA_REGS_96 ", " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WGMMA_D8(i)                                                                                       \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
        "+f"(d[i + 7])
#define WGMMA_D64 \
    WGMMA_D8(0), WGMMA_D8(8), WGMMA_D8(16), WGMMA_D8(24), WGMMA_D8(32), WGMMA_D8(40), WGMMA_D8(48), WGMMA_D8(56)
#define WGMMA_D96 WGMMA_D64, WGMMA_D8(64), WGMMA_D8(72), WGMMA_D8(80), WGMMA_D8(88)
#define WGMMA_D128 WGMMA_D96, WGMMA_D8(96), WGMMA_D8(104), WGMMA_D8(112), WGMMA_D8(120)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_ASM(N, R, R1, R2, R3, R4, REGS, ...)                                                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #R2 ", 0;\n"                                                \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" REGS "}, %" #R ", %" #R1            \
                 ", p, 1, 1, %" #R3 ", %" #R4 ";\n}\n"                                                             \
                 : __VA_ARGS__                                                                                    \
                 : "l"(desc_a), "l"(desc_b), "r"((int)accumulate), "n"(A_K_CONTIGUOUS ? 0 : 1),                  \
                   "n"(B_K_CONTIGUOUS ? 0 : 1))
#else
#define WGMMA_ASM(N, R, R1, R2, R3, R4, REGS, ...)
#endif
#define WGMMA_M64K16(N, R, R1, R2, R3, R4, REGS, ...)                                                             \
    template <bool A_K_CONTIGUOUS, bool B_K_CONTIGUOUS>                                                          \
    __device__ __forceinline__ void wgmma_m64n##N##k16(float (&d)[R], unsigned long long desc_a,                  \
                                                       unsigned long long desc_b, bool accumulate) {              \
        WGMMA_ASM(N, R, R1, R2, R3, R4, REGS, __VA_ARGS__);                                                       \
    }
WGMMA_M64K16(128, 64, 65, 66, 67, 68, WGMMA_REGS_64, WGMMA_D64)
WGMMA_M64K16(192, 96, 97, 98, 99, 100, WGMMA_REGS_96, WGMMA_D96)
WGMMA_M64K16(256, 128, 129, 130, 131, 132, WGMMA_REGS_128, WGMMA_D128)

// A store whose results go to the block's shared memory, over the stages (SharedStore{f} calls f as a
// store): gemm_tile_bf16_wgmma then waits at a barrier for every warpgroup's last wgmma before the first
// result, so that a caller can stage the tile there and write it out in whole rows (a wgmma thread's
// results are pairs of columns in 8 rows apart, which an epilogue with operands to read made latency bound).
template <class F>
struct SharedStore {
    F f;
    __device__ __forceinline__ void operator()(int m, int n, float v0, float v1) const { f(m, n, v0, v1); }
};
template <class S>
struct IsSharedStore {
    static constexpr bool value = false;
};
template <class F>
struct IsSharedStore<SharedStore<F>> {
    static constexpr bool value = true;
};

template <int STAGES, bool A_TRANS, bool B_TRANS, class Store, class OnChunk = NoChunkHook>
__device__ __forceinline__ void gemm_tile_bf16_wgmma(int M, int N, int K, int m0, int n0, const bf16* A, int lda,
                                                     const bf16* B, int ldb, Store store, float* smem,
                                                     OnChunk on_chunk = {}) {
    using G = GemmWgmma<STAGES>;
    constexpr bool A_K = !A_TRANS, B_K = B_TRANS;  // which operands are K-contiguous
    const unsigned misalignment = (unsigned)__cvta_generic_to_shared(smem) % 1024;
    bf16* buffers = reinterpret_cast<bf16*>(reinterpret_cast<char*>(smem) + (1024 - misalignment) % 1024);
    const bool a_vector = lda % 8 == 0 && reinterpret_cast<size_t>(A) % 16 == 0;
    const bool b_vector = ldb % 8 == 0 && reinterpret_cast<size_t>(B) % 16 == 0;
    const int rows = threadIdx.x / 128 * 64;  // the warpgroup's first row in the tile
    float d[64];  // set by the first wgmma (no accumulate), so no other instruction writes them

    // Group c of cp.async copies holds chunk c (empty past K).
    const auto issue = [&](int c) {
        if (c * G::BK < K) {
            bf16* s = buffers + c % STAGES * G::STAGE;
            wgmma_chunk_issue<G::BM, A_K>(s, A, lda, M, K, m0, c * G::BK, a_vector);
            wgmma_chunk_issue<G::BN, B_K>(s + G::A_CHUNK, B, ldb, N, K, n0, c * G::BK, b_vector);
        }
        cp_async_commit();
    };
#pragma unroll
    for (int c = 0; c < STAGES - 1; ++c) issue(c);
    for (int c = 0; c * G::BK < K; ++c) {
        cp_async_wait_pending<STAGES - 2>();
        fence_proxy_async();
        __syncthreads();
        // Chunk c − 1's stage: every warpgroup waited for its wgmmas before this barrier.
        issue(c + STAGES - 1);
        const bf16* As = buffers + c % STAGES * G::STAGE;
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < G::BK; ks += 16)
            wgmma_m64n128k16<A_K, B_K>(d, wgmma_descriptor<A_K>(As + wgmma_chunk_offset<A_K>(rows, ks)),
                                       wgmma_descriptor<B_K>(As + G::A_CHUNK + wgmma_chunk_offset<B_K>(0, ks)),
                                       c > 0 || ks > 0);
        wgmma_commit();
        on_chunk([&](int o, int k) { return As[wgmma_chunk_offset<A_K>(o, k)]; });
        wgmma_wait<0>();
    }
    wgmma_wait<0>();
    cp_async_wait_pending<0>();
    // A store into the stages' shared memory waits until no warpgroup's wgmma reads them.
    if constexpr (IsSharedStore<Store>::value) __syncthreads();
    if (K <= 0) {
#pragma unroll
        for (int i = 0; i < 64; ++i) d[i] = 0.0f;
    }

    const int lane = threadIdx.x % 32, row = m0 + rows + threadIdx.x / 32 % 4 * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int m = row + 8 * half, n = n0 + 8 * j + 2 * (lane % 4);
            if (m < M && n < N) store(m, n, d[4 * j + 2 * half], d[4 * j + 2 * half + 1]);
        }
    __syncthreads();
}

// The bf16 tile of this compile: gemm_tile_bf16_wgmma where HAS_WGMMA, else gemm_tile_bf16_async (mma.sync);
// 128×128 either way, the same operand contract, results by pairs of adjacent columns (store(m, n, v0,
// v1) as gemm_tile_bf16_wgmma's), no ones column (a caller sums A through on_chunk instead).
// Dynamic shared memory: Bf16Tile::SHARED_FLOATS floats.
struct Bf16Tile {
    static constexpr int BM = 128, BN = 128, BK = HAS_WGMMA ? 64 : 32, STAGES = HAS_WGMMA ? 3 : 4;
    static constexpr int SHARED_FLOATS =
        HAS_WGMMA ? GemmWgmma<STAGES>::SHARED_FLOATS : GemmBf16Async<BM, BN, BK, STAGES>::SHARED_FLOATS;
};

template <bool A_TRANS, bool B_TRANS, class Store, class OnChunk = NoChunkHook>
__device__ __forceinline__ void gemm_tile_bf16_fast(int M, int N, int K, int m0, int n0, const bf16* A, int lda,
                                                    const bf16* B, int ldb, Store store, float* smem,
                                                    OnChunk on_chunk = {}) {
    using T = Bf16Tile;
    if constexpr (HAS_WGMMA)
        gemm_tile_bf16_wgmma<T::STAGES, A_TRANS, B_TRANS>(M, N, K, m0, n0, A, lda, B, ldb, store, smem, on_chunk);
    else
        gemm_tile_bf16_async<T::BM, T::BN, T::BK, T::STAGES, A_TRANS, B_TRANS>(M, N, K, m0, n0, A, lda, B, ldb, -1,
                                                                              store, smem, on_chunk);
}

// Hands out the staged results of a tile by rows: `rows` × `cols` of them, rows `ld` floats apart, the
// first at (m0, n0) of C (M×N; `cols` ≤ BN, a multiple of 4 apart from C's edge), four adjacent columns at
// a time, thread t of `threads` taking every threads-th group (a warp a row where BN is 128): out(m, n, v,
// count, whole) as gemm_tile_bf16_by_rows says.
template <int BN, class Out>
__device__ __forceinline__ void out_staged_rows(const float* staged, int ld, int rows, int cols, int m0, int n0, int N,
                                                int t, int threads, Out out) {
    constexpr int QUADS = BN / 4;
#pragma unroll 4
    for (int i = t; i < rows * QUADS; i += threads) {
        const int r = i / QUADS, q = i % QUADS * 4;
        if (q >= cols) continue;
        const float4 v = *reinterpret_cast<const float4*>(staged + r * ld + q);
        const int count = min(4, cols - q);
        out(m0 + r, n0 + q, v, count, count == 4 && N % 4 == 0);
    }
}

// The bf16 tile's results by rows: out(m, n, v, count, whole) with (m, n) the first result's place in C
// (M×N), v its value and the next three's, count how many of the four lie inside C (4, or fewer at its
// edge) and whole whether all 4 do at an index m·N + n that is a multiple of 4 (a 16-byte access wherever
// C's and its operands' starts are). On the wgmma tile the results are staged in shared memory over the
// stages (SharedStore; rows BY_ROWS_LD floats apart, so that a wgmma thread's pairs land on distinct banks)
// and handed out by rows (out_staged_rows): an epilogue that reads operands of its own (a slope's, a bias)
// reads them as 16-byte loads of whole rows, all in flight, where the wgmma fragments' pairs, 8 rows apart,
// left each pair's loads waiting one after another. The mma.sync tile hands its pairs out as they come, as
// runs of two (count ≤ 2, never whole), so that one epilogue serves both.
constexpr int BY_ROWS_LD = Bf16Tile::BN + 8;
static_assert(!HAS_WGMMA || Bf16Tile::BM * BY_ROWS_LD <= Bf16Tile::SHARED_FLOATS, "the staged tile fits the stages");

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<size_t>(p) % 16 == 0; }

template <bool TA, bool TB, class Out>
__device__ __forceinline__ void gemm_tile_bf16_by_rows(int M, int N, int K, int m0, int n0, const bf16* a, int lda,
                                                       const bf16* b, int ldb, float* smem, Out out) {
    if constexpr (HAS_WGMMA) {
        const auto stage = [&](int m, int n, float v0, float v1) {
            float* t = smem + (m - m0) * BY_ROWS_LD + (n - n0);
            t[0] = v0;
            t[1] = v1;
        };
        gemm_tile_bf16_fast<TA, TB>(M, N, K, m0, n0, a, lda, b, ldb, SharedStore<decltype(stage)>{stage}, smem);
        // gemm_tile_bf16_fast ends at a barrier: the whole tile is staged.
        out_staged_rows<Bf16Tile::BN>(smem, BY_ROWS_LD, min(Bf16Tile::BM, M - m0), min(Bf16Tile::BN, N - n0), m0, n0,
                                      N, threadIdx.x, THREADS, out);
    } else {
        const auto pairs = [&](int m, int n, float v0, float v1) {
            out(m, n, make_float4(v0, v1, 0.0f, 0.0f), min(2, N - n), false);
        };
        gemm_tile_bf16_fast<TA, TB>(M, N, K, m0, n0, a, lda, b, ldb, pairs, smem);
    }
}
