// The bf16 product of Hopper (sm_90a) at the library's level: C = op(A)·op(B), A M×K and B K×N bf16 each
// stored K-contiguous or not (A M×K or K×M, B N×K or K×N, as gemm_tile_bf16_wgmma's A_TRANS and B_TRANS),
// fp32 sums handed to a store functor (gemm_bf16_tma: row-major fp32 C), by TMA copies into
// 128-byte-swizzled shared memory, `wgmma` from there, a producer warp and two consumer warpgroups handing
// stages to each other through mbarriers, and persistent blocks that walk the tiles.
//
//   block    384 threads, one per SM (gridDim.x = min(tiles, SMs)): warpgroup 0 the producer, 1 and 2
//            the consumers. The producer gives its registers up (setmaxnreg.dec to 40) and one thread
//            of it issues every copy; the consumers take them (setmaxnreg.inc to 232) for their
//            accumulators. Consumer c owns rows [c·BM/2, (c + 1)·BM/2) of the tile: per 16 k, BM/128
//            `wgmma`s m64nBNk16 (one per 64 rows), BM/2·BN/128 fp32 accumulators a thread.
//   stages   STAGES buffers of 64 k: A's BM × 64 k then B's 64 k × BN. A K-contiguous operand is one TMA
//            box {64 k, BM (BN) rows}; one whose rows run along m (n) is BM/64 (BN/64) boxes {64 m, 64 k},
//            each 8 KB. A box's inner side is 64 bf16 = 128 bytes, the 128-byte swizzle's row: row r of a
//            box lies at r·128 bytes, its 16-byte segment s at slot s ⊕ (r mod 8), which is the layout
//            wgmma_chunk_offset describes for either kind (K-contiguous: rows of k; otherwise blocks of 64
//            m or n, a row per k) and wgmma_descriptor addresses, with the `wgmma` transpose flag set
//            for the second kind, as for gemm_tile_bf16_wgmma. Every buffer starts on a 1024-byte
//            boundary, the swizzle's period.
//   barriers full[s]: one arrival (the producer's arrive.expect_tx of the stage's bytes) plus the
//            copies' bytes; a consumer waits on it for parity `phase`. empty[s]: one arrival per consumer
//            warpgroup, made when the `wgmma`s that read the stage are complete (wgmma.wait_group); the
//            producer waits on it for parity phase ⊕ 1 before refilling the stage, which a fresh
//            barrier passes at once (its phase of parity 1 counts as complete), so the first round
//            fills every stage without waiting. Both sides flip `phase` each time their stage index
//            wraps. A copy that reaches past M, N or K is zero-filled by the TMA unit, and still counts
//            its whole box in the transaction bytes, so expect_tx is the same for every stage.
//   mainloop a consumer keeps one chunk's `wgmma`s in flight behind the next (commit, then wait_group 1)
//            and releases a stage as soon as its `wgmma`s are complete, so the tensor cores never wait
//            for a release or the producer for more than the oldest stage.
//   tiles    tile t → (m, n) in groups of GROUP_M tile rows: consecutive tiles walk down a group's rows
//            first, so the blocks running at once share B's columns and A's rows in L2.
//   store    from the accumulators straight to store(m, n, v0, v1), the pairs of adjacent columns
//            gemm_tile_bf16_wgmma hands out (m < M and n < N only; the caller's epilogue: bias, GELU, bf16
//            copies), while the producer already loads the next tile's stages. Or by rows
//            (gemm_bf16_tma_tiles_by_rows): each consumer stages its rows in a shared-memory area of its
//            own after the stages (TmaByRows), then hands them out four adjacent columns at a time, as
//            gemm_tile_bf16_by_rows does, so that an epilogue with operands of its own reads and writes
//            whole rows.
//   shapes   every operand's leading dimension a multiple of 8 and its start 16-byte aligned (TMA needs
//            16-byte row strides; gemm_bf16_tma's row-major operands: N and K multiples of 8), any M, N,
//            K; the launch layer refuses the rest. Past M, N, K the copies read zeros.
//
// Tile shapes (template BM × BN, STAGES; the launch layer picks per problem, src/matmul/gpu.rs `TmaTile`):
//   128×256, 4 stages (48 KB each): each consumer 64×256, one m64n256k16 per 16 k. The most work per byte
//            loaded (A 16 KB and B 32 KB per 64 k feed 128·256 products); the default when it leaves no
//            SM idle for long (tiles ≥ SMs).
//   256×128, 4 stages: each consumer 128×128 (two m64n128k16): as much work per byte, for N = 384 (three
//            whole 128 columns where 256 wastes a third).
//   128×192, 5 stages (40 KB each): each consumer 64×192, one m64n192k16 per 16 k. For N a multiple of 192
//            and not of 256 (the Transformer's 1152-wide qkv product: six whole columns of tiles where 256
//            leaves a half-empty fifth, and whole waves where 128 wide leaves 0.73 of a last one).
//   128×128, 6 stages (32 KB each): for products too small to give every SM a large tile.
//   The choice by problem shape is a first model (waves of tiles over the SMs, a tile's cost ∝ its
//   area, 128×128 at a lower efficiency); `textnet bench matmul` times each shape at each size to set it.
//
// why: gemm_tile_bf16_wgmma feeds `wgmma` with every thread's cp.async and block barriers, and reached
// 0.42 of cuBLAS at 4096³. Here copies cost one thread a box, no thread waits for a copy it does not
// need, and a block never stops between tiles: cuBLAS's own design on Hopper.
//
// sm_90a only (HAS_WGMMA): elsewhere the kernels compile to nothing and are never launched. Dynamic shared
// memory: GemmTma<BM, BN, STAGES>::SHARED_BYTES.
#pragma once
#include "gemm_wgmma.cuh"

// CUtensorMap as the driver encodes it (cuTensorMapEncodeTiled), passed by value in the kernel's
// parameters: the TMA unit reads it from there (a __grid_constant__ parameter has an address).
struct alignas(64) TmaTensorMap {
    unsigned long long opaque[16];
};
// A's map then B's (gemm_bf16_tma_tiles says their dims and boxes in each layout).
struct TmaOperands {
    TmaTensorMap a, b;
};
static_assert(sizeof(TmaOperands) == 256, "two 128-byte tensor maps");

// Stages of each tile the kernels compile (src/matmul/gpu.rs `TmaTile::stages`).
constexpr int TMA_STAGES_128x256 = 4, TMA_STAGES_256x128 = 4, TMA_STAGES_128x192 = 5, TMA_STAGES_128x128 = 6;

template <int BM_, int BN_, int STAGES_>
struct GemmTma {
    static constexpr int BM = BM_, BN = BN_, BK = 64, STAGES = STAGES_;
    static constexpr int CONSUMER_ROWS = BM / 2, M_WGMMAS = CONSUMER_ROWS / 64, ACCUMULATORS = BN / 2;
    static_assert(CONSUMER_ROWS % 64 == 0 && (BN == 128 || BN == 192 || BN == 256) && BM <= 256,
                  "wgmma m64n{128,192,256}, TMA box ≤ 256");
    static constexpr int A_STAGE = BM * BK, B_STAGE = BN * BK, B_BOX = 64 * BK;  // bf16 elements
    static constexpr int STAGE_BYTES = (A_STAGE + B_STAGE) * 2;
    static constexpr int BLOCK_THREADS = 384;
    static constexpr int GROUP_M = 16;
    // The stages, 1 KB to align them to the swizzle's period, and the 2·STAGES mbarriers.
    static constexpr int SHARED_BYTES = STAGES * STAGE_BYTES + 1024 + 2 * STAGES * 8;
};

// The staged results of gemm_bf16_tma_tiles_by_rows: each consumer's CONSUMER_ROWS rows of the tile, LD
// floats apart (BN + 8, so that a wgmma thread's pairs land on distinct banks), after the mbarriers.
template <class G>
struct TmaByRows {
    static constexpr int LD = G::BN + 8;
    static constexpr int SHARED_BYTES = G::SHARED_BYTES + 2 * G::CONSUMER_ROWS * LD * 4;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ unsigned shared_address(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}

// Blocks until the phase of parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(shared_address(bar)), "r"(parity)
            : "memory");
    } while (!done);
}

__device__ __forceinline__ void mbarrier_arrive(unsigned long long* bar) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(shared_address(bar))
                 : "memory");
}

// This thread's arrival, and `bytes` more to come from copies that signal `bar`.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
                     shared_address(bar)),
                 "r"(bytes)
                 : "memory");
}

// The box of `map` at coordinates (inner, outer) into `dst`, completing its bytes on `bar`.
__device__ __forceinline__ void tma_load_2d(bf16* dst, const TmaTensorMap* map, int inner, int outer,
                                            unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            shared_address(dst)),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(inner), "r"(outer), "r"(shared_address(bar))
        : "memory");
}

// A barrier of one warpgroup's 128 threads (named barrier `id`; 0 is __syncthreads').
__device__ __forceinline__ void warpgroup_barrier(int id) { asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory"); }

__device__ __forceinline__ void tma_prefetch_map(const TmaTensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

template <int REGISTERS>
__device__ __forceinline__ void registers_down() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGISTERS));
}
template <int REGISTERS>
__device__ __forceinline__ void registers_up() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGISTERS));
}

template <int BN, bool A_K, bool B_K>
__device__ __forceinline__ void wgmma_tma(float (&d)[BN / 2], unsigned long long desc_a, unsigned long long desc_b,
                                          bool accumulate) {
    if constexpr (BN == 256)
        wgmma_m64n256k16<A_K, B_K>(d, desc_a, desc_b, accumulate);
    else if constexpr (BN == 192)
        wgmma_m64n192k16<A_K, B_K>(d, desc_a, desc_b, accumulate);
    else
        wgmma_m64n128k16<A_K, B_K>(d, desc_a, desc_b, accumulate);
}

// Tile t's first row and column: GROUP_M tile rows at a time, down the rows of a group first.
template <class G>
__device__ __forceinline__ void tma_tile_origin(int t, int m_tiles, int n_tiles, int& m0, int& n0) {
    const int group_tiles = G::GROUP_M * n_tiles, first = t / group_tiles * G::GROUP_M;
    const int rows = min(m_tiles - first, G::GROUP_M), within = t % group_tiles;
    m0 = (first + within % rows) * G::BM;
    n0 = within / rows * G::BN;
}
#endif

// op(A)·op(B) as the header says, by the block's share of the tiles, each result pair to store(m, n, v0, v1)
// (m < M, n < N, n even; v1 is column n + 1's, which the caller keeps only when n + 1 < N); with BY_ROWS,
// four adjacent results at a time to store(m, n, v, count, whole) as gemm_tile_bf16_by_rows's out. A_TRANS: A
// lies K×M (maps.a over it: dims {M, K}, box {64, 64}), else M×K (dims {K, M}, box {64, BM}); B_TRANS: B
// lies N×K (dims {K, N}, box {64, BN}), else K×N (dims {N, K}, box {64, 64}). smem: the dynamic shared
// memory.
template <class G, bool A_TRANS, bool B_TRANS, bool BY_ROWS = false, class Store>
__device__ __forceinline__ void gemm_bf16_tma_tiles(const TmaOperands& maps, int M, int N, int K, Store store,
                                                    char* smem) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr bool A_K = !A_TRANS, B_K = B_TRANS;  // which operands are K-contiguous
    bf16* stages = reinterpret_cast<bf16*>(smem + (1024 - shared_address(smem) % 1024) % 1024);
    auto* full = reinterpret_cast<unsigned long long*>(stages + G::STAGES * (G::A_STAGE + G::B_STAGE));
    unsigned long long* empty = full + G::STAGES;
    if (threadIdx.x == 0) {
        for (int s = 0; s < G::STAGES; ++s) {
            mbarrier_init(&full[s], 1);
            mbarrier_init(&empty[s], 2);
        }
        // The barriers' initialisation, visible to the TMA unit (the async proxy) before any copy.
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        fence_proxy_async();
    }
    __syncthreads();

    const int m_tiles = ceil_div(M, G::BM), n_tiles = ceil_div(N, G::BN), tiles = m_tiles * n_tiles;
    const int chunks = ceil_div(K, G::BK);
    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        registers_down<40>();
        if (threadIdx.x != 0) return;
        tma_prefetch_map(&maps.a);
        tma_prefetch_map(&maps.b);
        int stage = 0;
        unsigned phase = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            int m0, n0;
            tma_tile_origin<G>(t, m_tiles, n_tiles, m0, n0);
            for (int c = 0; c < chunks; ++c) {
                mbarrier_wait(&empty[stage], phase ^ 1);
                mbarrier_arrive_expect_tx(&full[stage], G::STAGE_BYTES);
                bf16* a = stages + stage * (G::A_STAGE + G::B_STAGE);
                if constexpr (A_TRANS) {
                    // 64 k rows of 64 m per box: wgmma_chunk_offset<false>'s blocks of 64 o.
#pragma unroll
                    for (int j = 0; j < G::BM / 64; ++j)
                        tma_load_2d(a + j * G::B_BOX, &maps.a, m0 + 64 * j, c * G::BK, &full[stage]);
                } else {
                    tma_load_2d(a, &maps.a, c * G::BK, m0, &full[stage]);
                }
                if constexpr (B_TRANS) {
                    tma_load_2d(a + G::A_STAGE, &maps.b, c * G::BK, n0, &full[stage]);
                } else {
#pragma unroll
                    for (int j = 0; j < G::BN / 64; ++j)
                        tma_load_2d(a + G::A_STAGE + j * G::B_BOX, &maps.b, n0 + 64 * j, c * G::BK, &full[stage]);
                }
                if (++stage == G::STAGES) stage = 0, phase ^= 1;
            }
        }
        return;
    }

    registers_up<232>();
    const int rows = (warpgroup - 1) * G::CONSUMER_ROWS;  // the consumer's first row in the tile
    const bool signals = threadIdx.x % 128 == 0;          // the warpgroup's arrival on `empty`
    float d[G::M_WGMMAS][G::ACCUMULATORS];
    int stage = 0;
    unsigned phase = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        int m0, n0;
        tma_tile_origin<G>(t, m_tiles, n_tiles, m0, n0);
#pragma unroll
        for (int i = 0; i < G::M_WGMMAS; ++i)
#pragma unroll
            for (int j = 0; j < G::ACCUMULATORS; ++j) d[i][j] = 0.0f;
        int previous = 0;
        for (int c = 0; c < chunks; ++c) {
            mbarrier_wait(&full[stage], phase);
            const bf16* a = stages + stage * (G::A_STAGE + G::B_STAGE);
            const bf16* b = a + G::A_STAGE;
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < G::BK; ks += 16)
#pragma unroll
                for (int i = 0; i < G::M_WGMMAS; ++i)
                    wgmma_tma<G::BN, A_K, B_K>(d[i],
                                               wgmma_descriptor<A_K>(a + wgmma_chunk_offset<A_K>(rows + 64 * i, ks)),
                                               wgmma_descriptor<B_K>(b + wgmma_chunk_offset<B_K>(0, ks)), true);
            wgmma_commit();
            // Chunk c − 1's wgmmas are complete: its stage goes back to the producer.
            wgmma_wait<1>();
            if (c > 0 && signals) mbarrier_arrive(&empty[previous]);
            previous = stage;
            if (++stage == G::STAGES) stage = 0, phase ^= 1;
        }
        wgmma_wait<0>();
        if (chunks > 0 && signals) mbarrier_arrive(&empty[previous]);

        const int lane = threadIdx.x % 32, row = rows + threadIdx.x / 32 % 4 * 16 + lane / 4;
        const int column = 2 * (lane % 4);
        if constexpr (BY_ROWS) {
            using R = TmaByRows<G>;
            float* staged = reinterpret_cast<float*>(empty + G::STAGES) + (warpgroup - 1) * G::CONSUMER_ROWS * R::LD;
            // The consumer's reads of the last tile's rows are done before its pairs overwrite them.
            warpgroup_barrier(warpgroup);
#pragma unroll
            for (int i = 0; i < G::M_WGMMAS; ++i)
#pragma unroll
                for (int j = 0; j < G::ACCUMULATORS / 4; ++j)
#pragma unroll
                    for (int half = 0; half < 2; ++half)
                        *reinterpret_cast<float2*>(staged + (row - rows + 64 * i + 8 * half) * R::LD + column + 8 * j) =
                            make_float2(d[i][4 * j + 2 * half], d[i][4 * j + 2 * half + 1]);
            warpgroup_barrier(warpgroup);
            out_staged_rows<G::BN>(staged, R::LD, min(G::CONSUMER_ROWS, M - m0 - rows), min(G::BN, N - n0), m0 + rows,
                                   n0, N, threadIdx.x % 128, 128, store);
        } else {
#pragma unroll
            for (int i = 0; i < G::M_WGMMAS; ++i)
#pragma unroll
                for (int j = 0; j < G::ACCUMULATORS / 4; ++j)
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const int m = m0 + row + 64 * i + 8 * half, n = n0 + column + 8 * j;
                        if (m < M && n < N) store(m, n, d[i][4 * j + 2 * half], d[i][4 * j + 2 * half + 1]);
                    }
        }
    }
#endif
}

// gemm_bf16_tma_tiles with its results by rows (TmaByRows<G>::SHARED_BYTES of dynamic shared memory).
template <class G, bool A_TRANS, bool B_TRANS, class Out>
__device__ __forceinline__ void gemm_bf16_tma_tiles_by_rows(const TmaOperands& maps, int M, int N, int K, Out out,
                                                            char* smem) {
    gemm_bf16_tma_tiles<G, A_TRANS, B_TRANS, true>(maps, M, N, K, out, smem);
}

// C = A·B, both row-major (A M×K, B K×N), into row-major fp32 C (N a multiple of 8, so every pair is whole).
template <class G>
__device__ __forceinline__ void gemm_bf16_tma(const TmaOperands& maps, float* __restrict__ C, int M, int N, int K,
                                              char* smem) {
    gemm_bf16_tma_tiles<G, false, false>(
        maps, M, N, K,
        [=](int m, int n, float v0, float v1) {
            *reinterpret_cast<float2*>(C + (size_t)m * N + n) = make_float2(v0, v1);
        },
        smem);
}
