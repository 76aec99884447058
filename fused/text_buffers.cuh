// The text model's device buffers as the kernels of fused/text.cu and fused/text_batch.cu take them: one
// struct, its first parameter, by value (mirrored by `TextBuffers` in src/text/gpu/buffers.rs, which says
// why by value). The host fills it when the buffers are allocated, not per launch; a kernel takes its sizes
// and the step's values (offset, batch, rate) as parameters after it.
//
// The single-sample kernels (fused/text_sample.cu) keep their buffers as parameters, and their buffers are
// not in the struct. A scheduled single-sample run launches them one by one (three launches a ~10 µs step),
// and with the struct (their bodies reading it through __ldg) that step took 10.64-10.68 µs against
// 10.15-10.17 on an H200, where the same kernels in a CUDA graph took no longer. The driver's host time per
// launch did not grow with the struct's bytes (a 336-byte struct launched as fast as 16 pointers there).
//
// The pointers carry no __restrict__, and NVRTC gives the read-only loads (ld.global.nc) only to
// restrict-qualified pointers. So each kernel opens by naming the buffers it touches as __restrict__
// locals, const where it only reads them, and reads the ones it only reads through __ldg, which keeps its
// loads as they were when the buffers were parameters (compare the PTX before changing one). Never through
// __ldg a buffer that the launch itself writes (its outputs, tickets, the sums other blocks add to): the
// read-only path may serve a line cached before another block's write. Those are read through L2 (__ldcg)
// or with plain loads, as they were.
//
// __ldg is inline assembly, which the compiler does not copy into the versions of a loop it would
// otherwise make (one per optimizer kind, a peeled or unrolled copy). Where a kernel's loop was copied
// that way, the buffers it reads stay restrict parameters after the struct: W1 and b1 of
// text_batch_forward and text_batch_hidden_bf16, ∂W2 and ∂b2 of text_batch_optimize.
#pragma once
#include "common.cuh"

// The text model's buffers: parameters, corpus, step buffers and those of the optimizer and bf16 steps
// (null where a step is not in use).
struct TextBuffers {
    // The parameters: E [V][D], W1 [H][D], b1 [H], W2 [V][H], b2 [V].
    float* embedding;
    float* w1;
    float* b1;
    float* w2;
    float* b2;
    // The token stream, the sample order and the device cursor into it.
    const unsigned* tokens;
    const unsigned* positions;
    unsigned* cursor;
    // The step buffers, sized for the trainer's batch capacity (src/text/gpu/mod.rs, StepBuffers).
    float* x;
    float* z1;
    float* logits;
    float* stats;
    float* dh;
    unsigned* rank;
    float* dx_sum;
    unsigned* ticket;
    float* norm;
    unsigned* tile_tickets;
    float* grad_w2;
    float* grad_b2;
    float* grad_w1;
    float* grad_b1;
    double* loss_sum;
    unsigned long long* hit_counts;
    // The optimizer's (--optim momentum or adam; null with SGD).
    float* m;
    float* v;
    float* grad_embedding;
    unsigned* step;
    unsigned* optimizer_ticket;
    // The bf16 step's (--precision bf16; null at fp32).
    bf16* w2_bf16;
    bf16* hidden_bf16;
    bf16* dlogits;
    float* dh_parts;
};
