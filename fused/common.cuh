// Device helpers shared by every fused pipeline: warp and block reductions, asynchronous copies, bf16
// rounding, and the conventions the Rust launch layer relies on (256-thread blocks, extern dynamic shared
// memory).
//
// The device layer (src/device/) compiles each fused/*.cu with NVRTC for the GPU it runs on and
// passes the model's fixed sizes as -D defines, so per-lane register arrays have compile-time bounds.
#pragma once

#define FULL_MASK 0xffffffffu
#define THREADS 256
#define WARPS (THREADS / 32)
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// p + offset, or null when p is (an optional output's row).
template <class E>
__device__ __forceinline__ E* offset_or_null(E* p, size_t offset) { return p ? p + offset : nullptr; }

typedef unsigned short bf16;  // a bf16 value's bits, in global or shared memory
constexpr bf16 BF16_ONE = 0x3f80;

// Two floats rounded to bf16 (to nearest even) and packed, lo in the low half.
__device__ __forceinline__ unsigned bf16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// One float rounded to bf16 (to nearest even).
__device__ __forceinline__ bf16 to_bf16(float x) { return (bf16)(bf16x2(x, 0.0f) & 0xffffu); }

__device__ __forceinline__ float bf16_value(bf16 h) { return __uint_as_float((unsigned)h << 16); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

// Programmatic dependent launch (sm_90+). A kernel launched with the programmatic-serialization
// attribute may start while the previous kernel is still running: before grid_dependency_wait() it may
// only read memory that the previous kernels do not write. Without the attribute, or before sm_90,
// both calls do nothing.
__device__ __forceinline__ void grid_dependency_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asynchronous copies from global to shared memory that bypass registers (cp.async, sm_80+), read
// through L2. Issue, then cp_async_commit(); cp_async_wait_all() and a barrier before the data is used.
__device__ __forceinline__ void cp_async16(void* shared_dst, const void* global_src) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(shared_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(global_src) : "memory");
}

__device__ __forceinline__ void cp_async4(void* shared_dst, const void* global_src) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(shared_dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(global_src) : "memory");
}

// cp_async4 of `bytes` (4, or 0 for a 0.0f: the copy fills what it does not read with zeros; the source
// must still be an address of the tensor), so that a padded element needs no branch around its copy.
__device__ __forceinline__ void cp_async4_or_zero(void* shared_dst, const void* global_src, unsigned bytes) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(shared_dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(global_src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Waits for every committed group but the last.
__device__ __forceinline__ void cp_async_wait_all_but_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

// *dst += v on four consecutive floats, dst 16-byte aligned: one vector atomic on sm_90, four before.
__device__ __forceinline__ void atomic_add4(float* dst, float4 v) {
#if __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(dst), v);
#else
    atomicAdd(dst, v.x);
    atomicAdd(dst + 1, v.y);
    atomicAdd(dst + 2, v.z);
    atomicAdd(dst + 3, v.w);
#endif
}

// The last-block pattern: every block of the grid calls this once, after its writes; it is true in
// exactly one block, the last to arrive, and there every other block's writes are visible. `ticket`
// counts arrivals per gridDim.x blocks (pass one counter per grid row for 2-D grids); the last block
// must set it back to zero for the next launch.
// With `count`, the same over any group of `count` blocks that share `ticket`.
__device__ __forceinline__ bool last_block_to_finish(unsigned* ticket, unsigned count) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == count - 1;
    __syncthreads();
    if (last) __threadfence();
    return last;
}

__device__ __forceinline__ bool last_block_to_finish(unsigned* ticket) { return last_block_to_finish(ticket, gridDim.x); }

// The last block's sum of `count` partial vectors of ELEMS floats (vector k at parts + k·stride, read
// through L2): write(i, Σ_k parts[k·stride + i]) for every i < ELEMS, each sum from 0 in k order. Each
// thread holds ELEMS / THREADS sums, taken GROUP at a time (so that a 128×128 tile's 64 a thread do not
// cost 64 registers of sums and 64 of loads in flight), and issues its loads of about 16 / GROUP vectors
// together, so the sum runs at L2's bandwidth rather than one load latency per vector.
template <int ELEMS, class Write>
__device__ __forceinline__ void sum_partials(const float* parts, size_t stride, int count, Write write) {
    constexpr int PER = (ELEMS + THREADS - 1) / THREADS;
    constexpr int GROUP = PER < 16 ? PER : 16;
    constexpr int VECTORS_IN_FLIGHT = 16 / GROUP;  // about 16 loads in flight per thread
#pragma unroll 1
    for (int g = 0; g < PER; g += GROUP) {
        float sums[GROUP];
#pragma unroll
        for (int j = 0; j < GROUP; ++j) sums[j] = 0.0f;
        const auto inside = [&](int j) {
            const int i = threadIdx.x + (g + j) * THREADS;
            return (PER % GROUP == 0 || g + j < PER) && (ELEMS % THREADS == 0 || i < ELEMS);
        };
#pragma unroll VECTORS_IN_FLIGHT
        for (int k = 0; k < count; ++k)
#pragma unroll
            for (int j = 0; j < GROUP; ++j)
                if (inside(j)) sums[j] += __ldcg(&parts[(size_t)k * stride + threadIdx.x + (g + j) * THREADS]);
#pragma unroll
        for (int j = 0; j < GROUP; ++j)
            if (inside(j)) write(threadIdx.x + (g + j) * THREADS, sums[j]);
    }
}

// Combines one value per thread over a whole block of THREADS threads with a warp-wide combine (each warp,
// then the warps' results in every warp); every thread gets the result. `scratch` holds WARPS values,
// `empty` is the combine's identity.
template <class T, class WarpCombine>
__device__ __forceinline__ T block_combine(T v, T* scratch, T empty, WarpCombine warp_combine) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    v = warp_combine(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < WARPS ? scratch[lane] : empty;
    return warp_combine(v);
}

__device__ __forceinline__ float block_sum(float v, float* scratch) {
    return block_combine(v, scratch, 0.0f, [](float x) { return warp_sum(x); });
}
