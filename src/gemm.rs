//! The shared-memory sizes of fused/gemm.cuh's tiles, for the launchers that allocate them: the one Rust
//! mirror of that file's formulas (`GemmTile<…>::SHARED_FLOATS`, gemm_128's `G128*` constants), so no
//! pipeline copies them.

use crate::device::THREADS_PER_BLOCK;

/// gemm_128's square tile (`G128`).
pub const G128: usize = 128;
/// gemm_128's k per staged chunk (`G128_BK`).
pub const G128_BK: usize = 8;
/// gemm_128's shared row stride (`G128_LD`).
pub const G128_LD: usize = G128 + 4;
/// Floats of one gemm_128 operand staged through shared memory: two chunk buffers.
pub const G128_STAGED_FLOATS: usize = 2 * G128_BK * G128_LD;

/// Floats of shared memory one `gemm_tile<BM, BN, BK, TM, TN>` needs in a block of the launch layer's
/// threads: its k-major stages padded by one float per row, or the split-k partial tiles when the block
/// covers the tile more than once.
pub fn tile_shared_floats(bm: usize, bn: usize, bk: usize, tm: usize, tn: usize) -> usize {
    let ksplit = THREADS_PER_BLOCK as usize / ((bm / tm) * (bn / tn));
    let stages = bk * (bm + 1 + bn + 1);
    let partials = if ksplit > 1 { ksplit * bm * bn } else { 0 };
    stages.max(partials)
}
