//! The shared-memory sizes of fused/gemm.cuh's tiles, for the launchers that allocate them: the one Rust
//! mirror of that file's formulas (`GemmTile<…>::SHARED_FLOATS`, gemm_128's `G128*` constants), so no
//! pipeline copies them, tested against the kernel file.

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
pub const fn tile_shared_floats(bm: usize, bn: usize, bk: usize, tm: usize, tn: usize) -> usize {
    let ksplit = THREADS_PER_BLOCK as usize / ((bm / tm) * (bn / tn));
    let stages = bk * (bm + 1 + bn + 1);
    let partials = if ksplit > 1 { ksplit * bm * bn } else { 0 };
    if stages > partials { stages } else { partials }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::kernel_constants;

    #[test]
    fn sizes_match_the_kernel_file() {
        let kernel = kernel_constants("matmul", &[], &["G128", "G128_BK", "G128_LD", "G128_STAGED_FLOATS"]).unwrap();
        assert_eq!(kernel, [G128, G128_BK, G128_LD, G128_STAGED_FLOATS].map(|v| v as i64));
        // Tiles covered once, split-k tiles (the partials are larger than the stages) and odd k.
        for (bm, bn, bk, tm, tn) in
            [(64, 64, 16, 4, 4), (8, 8, 784, 2, 2), (16, 64, 64, 4, 4), (8, 8, 4, 1, 1), (32, 32, 32, 2, 2)]
        {
            let expression = format!("GemmTile<{bm}, {bn}, {bk}, {tm}, {tn}>::SHARED_FLOATS");
            let kernel = kernel_constants("matmul", &[], &[&expression]).unwrap();
            assert_eq!(kernel, [tile_shared_floats(bm, bn, bk, tm, tn) as i64], "{expression}");
        }
    }
}
