// Dropout's mask as a hash of (seed, step, site, element) (CPU twin: src/ops/dropout.rs): no generator
// state, so a kernel draws the same mask as the CPU, a step repeats to the bit, and a CUDA graph replays
// many steps by reading the step number from device memory.
//
// A site (a layer, one of a model's dropouts) has a per-run seed from the host, site_seed =
// mix32(seed ^ site·0x9e3779b9); its key in a step is mix32(site_seed + step). Element e of the site
// survives when mix32(key ^ mix32(e)) >= threshold (threshold = p·2³², 0 keeps everything), and survivors
// are scaled by 1/(1 − p).
#pragma once

__device__ __forceinline__ unsigned mix32(unsigned x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

// The mask key of one site in this step, from its per-run seed and the step counter in device memory.
__device__ __forceinline__ unsigned dropout_key(unsigned site_seed, const unsigned* step) {
    return mix32(site_seed + *step);
}

__device__ __forceinline__ bool dropout_keeps(unsigned key, unsigned element, unsigned threshold) {
    return mix32(key ^ mix32(element)) >= threshold;
}

// The factor element `element` is multiplied by: scale when it survives, 0 when dropped.
__device__ __forceinline__ float dropout_factor(unsigned key, unsigned element, unsigned threshold, float scale) {
    return dropout_keeps(key, element, threshold) ? scale : 0.0f;
}

// One site's dropout as a kernel takes it, by value, its first parameter (mirrored by DropoutArgs in
// src/device/kernel_struct.rs): the site's per-run seed, the device's step counter, the threshold (0: off) and the
// survivors' scale.
struct DropoutArgs {
    const unsigned* step;
    unsigned seed, threshold;
    float scale;
};

// One site's dropout in this step: its key from the per-run seed and the device's step counter.
// threshold 0 turns it off (every factor 1).
struct SiteDropout {
    unsigned key, threshold;
    float scale;
    __device__ __forceinline__ explicit SiteDropout(const DropoutArgs& a)
        : key(a.threshold ? dropout_key(a.seed, a.step) : 0u), threshold(a.threshold), scale(a.scale) {}
    __device__ __forceinline__ float factor(size_t element) const {
        return threshold ? dropout_factor(key, (unsigned)element, threshold, scale) : 1.0f;
    }
};
