// Programmatic dependent launch for kernels that read nothing before the kernels before them have
// finished: nn.cu's and nn_attention.cu's (launched with the attribute where src/nn/cuda/mod.rs's
// Device asks for it), text.cu's and text_sample.cu's.
#pragma once
#include "common.cuh"

// A kernel's first statement: it waits for the kernels before it, then lets the next kernel's blocks be
// scheduled while this one runs (they wait in turn), so a chain of small kernels does not pay each
// launch's latency after the previous one ends.
__device__ __forceinline__ void begin_after_previous_grid() {
    grid_dependency_wait();
    allow_dependent_launch();
}
