//! The shared-memory sizes of fused/gemm.cuh's tiles, for the launchers that allocate them: the one Rust
//! mirror of that file's formulas (`GemmTile<…>::SHARED_FLOATS`, `GemmBf16<…>::SHARED_FLOATS`,
//! `GemmBf16Cp<…>::SHARED_FLOATS`, gemm_128's `G128*` constants), so no pipeline copies them, tested
//! against the kernel file; and bf16 rounding as gemm_tile_bf16 rounds its operands, for the CPU references
//! of its products.

use crate::ops::THREADS_PER_BLOCK;

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

/// Floats of shared memory one `gemm_tile_bf16<BM, BN, BK, …>` needs (`GemmBf16<BM, BN, BK>::SHARED_FLOATS`):
/// two chunk buffers of bf16, each operand's chunk in the larger of its two layouts (`[o][k]` with rows of
/// BK + 8, or `[k][o]` with rows of o + 8).
pub const fn bf16_shared_floats(bm: usize, bn: usize, bk: usize) -> usize {
    const fn slot(extent: usize, bk: usize) -> usize {
        let (by_row, by_k) = (extent * (bk + 8), bk * (extent + 8));
        if by_row > by_k { by_row } else { by_k }
    }
    // Two buffers of bf16 (two per float).
    slot(bm, bk) + slot(bn, bk)
}

/// Floats of shared memory one `gemm_tile_bf16_async<BM, BN, BK, STAGES, …>` needs
/// (`GemmBf16Async<BM, BN, BK, STAGES>::SHARED_FLOATS`): `stages` chunk buffers of bf16, laid out as
/// `gemm_tile_bf16`'s two.
pub const fn bf16_async_shared_floats(bm: usize, bn: usize, bk: usize, stages: usize) -> usize {
    stages * bf16_shared_floats(bm, bn, bk) / 2
}

/// Floats of shared memory one `gemm_tile_bf16_wgmma<STAGES, …>` needs (`GemmWgmma<STAGES>::SHARED_FLOATS`):
/// `stages` chunks of 128 × 64 bf16 for each operand, and 1 KB to align them to the swizzle's period.
pub const fn wgmma_shared_floats(stages: usize) -> usize {
    (stages * 2 * 128 * 64 * 2 + 1024) / 4
}

/// Floats of shared memory of `Bf16Tile` (fused/gemm_wgmma.cuh), the bf16 tile a compile picks: `wgmma`'s
/// three stages of 64 k on GPUs that have it (`device::compile::has_wgmma`), else gemm_tile_bf16_async's four
/// stages of 32 k, 128×128 either way.
pub const fn bf16_tile_shared_floats(wgmma: bool) -> usize {
    if wgmma { wgmma_shared_floats(3) } else { bf16_async_shared_floats(128, 128, 32, 4) }
}

/// `x` rounded to bf16 (8-bit mantissa) to nearest, ties to even, as `cvt.rn.bf16x2.f32` does: the bits of
/// the bf16 value (the high half of its f32). Infinities stay, values past bf16's largest round to them,
/// NaN stays NaN (quiet, sign kept).
pub fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let lsb = (bits >> 16) & 1;
    (bits.wrapping_add(0x7fff + lsb) >> 16) as u16
}

/// The f32 value of bf16 bits.
pub fn bf16_value(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `x` rounded to bf16 (to nearest even), as an f32.
pub fn round_bf16(x: f32) -> f32 {
    bf16_value(bf16_bits(x))
}

/// `x` truncated to TF32 (a 10-bit mantissa: the low 13 bits dropped), as the tensor cores' TF32
/// products read an fp32 operand (`split_tf32`'s big part in fused/nn.cu).
pub fn truncate_tf32(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & 0xffff_e000)
}

/// An operand of a bf16 product (`gemm_bf16_async_*`, the TMA GEMM) as it lies in memory: transposed or not,
/// and its leading dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    /// Stored transposed (A K×M, B N×K).
    pub trans: bool,
    /// Elements between consecutive rows of the stored matrix.
    pub ld: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::compile::kernel_constants;

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
        for (bm, bn, bk) in [(128, 128, 32), (64, 64, 32), (32, 64, 32), (128, 64, 64)] {
            let expression = format!("GemmBf16<{bm}, {bn}, {bk}>::SHARED_FLOATS");
            let kernel = kernel_constants("matmul", &[], &[&expression]).unwrap();
            assert_eq!(kernel, [bf16_shared_floats(bm, bn, bk) as i64], "{expression}");
        }
        for (bm, bn, bk, stages) in [(128, 128, 32, 3), (64, 128, 16, 4), (32, 64, 64, 2)] {
            let expression = format!("GemmBf16Async<{bm}, {bn}, {bk}, {stages}>::SHARED_FLOATS");
            let kernel = kernel_constants("matmul", &[], &[&expression]).unwrap();
            assert_eq!(kernel, [bf16_async_shared_floats(bm, bn, bk, stages) as i64], "{expression}");
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        let ulp = 2f32.powi(-7); // bf16's spacing in [1, 2)
        // Exact values stay.
        for x in [0.0, -0.0, 1.0, -2.5, 1.0 + ulp, bf16_value(0x7f7f), bf16_value(0x0001)] {
            assert_eq!(round_bf16(x).to_bits(), x.to_bits(), "{x}");
        }
        // Ties go to the even neighbour: 1 + ulp/2 down to 1, 1 + 3ulp/2 up to 1 + 2ulp; and the signs.
        assert_eq!(round_bf16(1.0 + ulp / 2.0), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 * ulp / 2.0), 1.0 + 2.0 * ulp);
        assert_eq!(round_bf16(-(1.0 + ulp / 2.0)), -1.0);
        assert_eq!(round_bf16(-(1.0 + 3.0 * ulp / 2.0)), -(1.0 + 2.0 * ulp));
        // Off ties, to the nearer.
        assert_eq!(round_bf16((1.0 + ulp / 2.0).next_up()), 1.0 + ulp);
        assert_eq!(round_bf16((1.0 + ulp / 2.0).next_down()), 1.0);
        // Infinities stay; bf16's largest finite value plus half an ulp or more rounds to infinity.
        assert_eq!(round_bf16(f32::INFINITY), f32::INFINITY);
        assert_eq!(round_bf16(f32::NEG_INFINITY), f32::NEG_INFINITY);
        assert_eq!(round_bf16(f32::MAX), f32::INFINITY);
        assert_eq!(round_bf16(-f32::MAX), f32::NEG_INFINITY);
        // NaN stays NaN, also one whose payload lies only in the bits rounded away.
        for nan in [f32::NAN, -f32::NAN, f32::from_bits(0x7f80_0001)] {
            assert!(round_bf16(nan).is_nan(), "{:#x}", nan.to_bits());
            assert_eq!(round_bf16(nan).is_sign_negative(), nan.is_sign_negative());
        }
        assert_eq!(bf16_bits(1.0), 0x3f80);
        assert_eq!(bf16_value(0xc020), -2.5);
    }
}
