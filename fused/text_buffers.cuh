// The text model's device buffers as every text kernel takes them: one struct, its first parameter, by
// value (mirrored by `TextBuffers` in src/text/gpu/buffers.rs, which says why by value). The host fills it
// when the buffers are allocated, not per launch; a kernel takes its sizes and the step's values (offset,
// batch, rate) as parameters after it.
//
// The pointers carry no __restrict__, and NVRTC gives the read-only loads (ld.global.nc) only to
// restrict-qualified pointers. So each kernel opens by naming the buffers it touches as __restrict__
// locals, const where it only reads them, and reads the ones it only reads through __ldg, which keeps its
// loads as they were when the buffers were parameters (compare the PTX before changing one).
//
// __ldg is inline assembly, which the compiler does not copy into the versions of a loop it would
// otherwise make (one per optimizer kind, a peeled or unrolled copy). Where a kernel's loop was copied
// that way, the buffers it reads stay restrict parameters after the struct: W1 and b1 of
// text_batch_forward and text_batch_hidden_bf16, ∂W2 and ∂b2 of text_batch_optimize.
#pragma once
#include "common.cuh"

// The text model's buffers: parameters, corpus, step buffers and those of the single-sample,
// optimizer and bf16 steps (null where a step is not in use).
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
    // The single-sample step's (SampleBuffers).
    float* partials;
    float* sample_stats;
    unsigned* records;
    float* h_pending;
    float* dx_shares;
    float* w2_target;
    float* next_rows;
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
