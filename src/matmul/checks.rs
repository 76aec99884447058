//! The matmul selftest checks: matmul_naive, matmul_tile128, matmul_tile64 and matmul_tile128_split2 against the CPU reference
//! (relative 1e-5) on fresh uniform inputs in [−1, 1), over shapes that hit every edge of the tiles: one
//! element, partial tiles in every dimension, exactly one 128² tile, and several partial ones. Each
//! output is poisoned with NaN first, so an element no thread writes fails the check.
//!
//! Then the bf16 tensor-core products, against the CPU product of the bf16-rounded operands (tolerance
//! `bf16_tolerance`): gemm_tile_bf16 in all four operand layouts and both tile sides, once with K in row
//! slices, and matmul_bf16 / matmul_bf16_async / matmul_bf16_wgmma (Hopper), on shapes that are multiples of
//! nothing (and, for the latter two, K and N multiples of 8, their 16-byte copies); and gemm_bf16_async_* (the
//! Transformer's linear-layer tile) on bf16 operands in all four layouts and once with K in row slices,
//! with leading dimensions that are multiples of 8 (16-byte copies) and that are not (element by
//! element), and a column of B read as ones. Its operands' padding and the ones column in memory hold
//! NaN, so a read of either fails the check.
//!
//! On Hopper, matmul_bf16_tma_* (TMA and `wgmma`, persistent blocks) with each of its tiles forced, and as
//! `TmaTile::choose` picks, on TMA_SHAPES: N and K multiples of 8 as it requires, none of the three a
//! multiple of its tiles, and enough tiles that every block takes several (its barriers' phases carried
//! from tile to tile); and each tile in all four operand layouts (A K×M, B N×K, as the Transformer's
//! products read them) through its store hook, every operand's leading dimension padded past its row
//! with NaN.

use super::gpu::{Bf16Kernel, Bf16Tile, GpuMatmul, Kernel, linear_kernel};
use crate::device::tma::TmaTile;
use crate::device::{Gpu, compile::ModuleRequest};
use crate::harness::check::{Check, Group, Plan, rel_error};
use crate::ops::cpu::SeededRng;
use crate::ops::gemm::Strided;
use crate::ops::gemm::{bf16_bits, round_bf16};
use anyhow::{Context, Result};
use cudarc::driver::CudaSlice;
use rand::RngExt;
use std::sync::Arc;

/// Largest relative error a kernel's product may have against the CPU reference.
pub const TOLERANCE: f64 = 1e-5;

/// (M, N, K).
const SHAPES: [(usize, usize, usize); 4] = [(1, 1, 1), (33, 65, 17), (128, 128, 128), (257, 129, 300)];

/// (M, N, K) of the bf16 checks: partial tiles in every dimension, K not a multiple of the 32-k chunk (one
/// chunk and a bit; twelve and a bit), and many tiles.
const BF16_SHAPES: [(usize, usize, usize); 2] = [(77, 131, 45), (515, 1031, 389)];
/// The same with K and N multiples of 8: row-major operands in whole 16-byte segments (matmul_bf16_async).
const BF16_ALIGNED_SHAPES: [(usize, usize, usize); 2] = [(77, 136, 40), (515, 1032, 392)];
/// (M, N, K) of matmul_bf16_tma_*'s checks: one whole 128×256 tile in one chunk of 64 k; less than a tile
/// and a chunk; partial tiles and K one 40 past a multiple of 64; 32 chunks (every stage reused many
/// times); and 144 to 288 tiles, more than an H200's 132 SMs, K in four chunks, one of them partial.
const TMA_SHAPES: [(usize, usize, usize); 5] =
    [(128, 256, 64), (72, 40, 24), (300, 520, 1000), (256, 512, 2048), (2048, 2304, 200)];
/// Row slices of the sliced check (gemm_tile_bf16 over K cut in slices, partials summed after).
const SLICES: usize = 3;

/// The largest relative error (Frobenius, as `rel_error`) a bf16 tensor-core product C = A·B may have
/// against `want`, the f64 product of the same bf16 operands `a`, `b` rounded to f32, over K terms.
/// Products of bf16 values are exact in fp32 (8-bit significands), so only the sums differ. Summing K
/// terms in any order with unit roundoff u is off by at most γ_K·Σ_k |a_ik|·|b_kj|, γ_K = K·u/(1 − K·u)
/// (Higham, Accuracy and Stability of Numerical Algorithms, §3.1), with u = 2⁻²³ because the tensor cores
/// may truncate rather than round as they align and add. Over C, ‖|A|·|B|‖ ≤ ‖A‖·‖B‖ (Cauchy–Schwarz, row
/// by column), and `want` is within 2⁻²⁴ of the exact product: γ_K·‖A‖·‖B‖/‖want‖ + 2⁻²⁴. For uniform
/// operands that is about 1.2e-7·K^1.5: 4e-5 at K = 45, 1e-3 at K = 389, while a dropped chunk or
/// misplaced fragment costs 1e-1 or more, and operands truncated instead of rounded to nearest 1e-3.
pub fn bf16_tolerance(a: &[f32], b: &[f32], want: &[f32], k: usize) -> f64 {
    let norm = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let u = 2f64.powi(-23);
    let gamma = k as f64 * u / (1.0 - k as f64 * u);
    let want_norm = norm(want);
    if want_norm == 0.0 { 2f64.powi(-24) } else { gamma * norm(a) * norm(b) / want_norm + 2f64.powi(-24) }
}

/// `values` rounded to bf16 (to nearest even).
pub fn rounded(values: &[f32]) -> Vec<f32> {
    values.iter().map(|&x| round_bf16(x)).collect()
}

/// The bf16 bits of `values` (rounded to nearest even), for kernels that read bf16.
pub fn bf16_matrix(values: &[f32]) -> Vec<u16> {
    values.iter().map(|&x| bf16_bits(x)).collect()
}

/// The `cols`×`rows` transpose of a row-major `rows`×`cols` matrix.
pub fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols).map(|i| values[(i % rows) * cols + i / rows]).collect()
}

/// The sum of `slices` equal parts of `values`, added in order in f64.
pub fn sum_slices(values: &[f32], slices: usize) -> Vec<f32> {
    let len = values.len() / slices.max(1);
    (0..len).map(|i| (0..slices).map(|s| values[s * len + i] as f64).sum::<f64>() as f32).collect()
}

/// `len` uniform values in [−1, 1).
pub fn random_matrix(len: usize, rng: &mut SeededRng) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// The kernel module the checks compile.
pub fn modules(_plan: &Plan) -> Vec<ModuleRequest> {
    vec![super::gpu::MODULE]
}

/// The selftest checks of every matmul kernel against the CPU product.
pub fn selftest_checks(gpu: &Arc<Gpu>, plan: &Plan) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    if !plan.wants(Group::Kernels) {
        return Ok(out);
    }
    let mut rng = plan.rng("matmul kernels");
    let kernels = GpuMatmul::new(gpu.clone())?;
    for (m, n, k) in SHAPES {
        let (a, b) = (random_matrix(m * k, &mut rng), random_matrix(k * n, &mut rng));
        let want = super::reference(&a, &b, m, n, k)?;
        let (a_dev, b_dev) = (gpu.stream.clone_htod(&a)?, gpu.stream.clone_htod(&b)?);
        for kernel in Kernel::ALL {
            let mut c = gpu.stream.clone_htod(&vec![f32::NAN; m * n])?;
            kernels.enqueue(kernel, &a_dev, &b_dev, &mut c, m, n, k)?;
            let got = gpu.stream.clone_dtoh(&c).with_context(|| format!("{} failed", kernel.name()))?;
            out.push(Check {
                kernel: kernel.name().into(),
                shape: format!("{m}×{k} · {k}×{n}"),
                rel_error: rel_error(&got, &want),
                tolerance: TOLERANCE,
            });
        }
    }
    bf16_checks(gpu, &kernels, &mut plan.rng("matmul bf16"), &mut out)?;
    linear_checks(gpu, &kernels, &mut plan.rng("matmul bf16 linear"), &mut out)?;
    Ok(out)
}

/// A row-major `rows`×`cols` matrix stored with `ld` floats per row, the padding NaN.
fn with_ld(values: &[f32], rows: usize, cols: usize, ld: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; rows * ld];
    for (r, row) in values.chunks(cols.max(1)).take(rows).enumerate() {
        out[r * ld..r * ld + cols].copy_from_slice(row);
    }
    out
}

/// gemm_bf16_async_* on bf16 operands against the CPU product of the bf16-rounded operands, B's ones
/// column set to 1.
fn linear_checks(gpu: &Arc<Gpu>, kernels: &GpuMatmul, rng: &mut SeededRng, out: &mut Vec<Check>) -> Result<()> {
    // Leading dimensions: a multiple of 8 past the row (`aligned`), or one that is not.
    let ld_of = |cols: usize, aligned: bool| match aligned {
        true => cols.next_multiple_of(8) + 8,
        false if (cols + 1).is_multiple_of(8) => cols + 2,
        false => cols + 1,
    };
    for (m, n, k) in BF16_SHAPES {
        let (a, b) = (random_matrix(m * k, rng), random_matrix(k * n, rng));
        // (aligned, ones column, ones column in memory): none; one inside a 16-byte segment; the last,
        // stored or (as the Transformer's bias column, `[x | 1]` over x) past B's memory.
        let variants = [
            (true, None, true, "ld ≡ 0 mod 8"),
            (true, Some(n / 2), true, "ld ≡ 0 mod 8, ones"),
            (false, Some(n - 1), true, "ld ≢ 0 mod 8, ones"),
            (true, Some(n - 1), false, "ld ≡ 0 mod 8, ones past B"),
        ];
        for (aligned, ones, ones_stored, variant) in variants {
            // B as the kernel reads it, and as it lies in memory (K×stored_n, NaN where the ones are read).
            let (mut b_logical, mut b_memory) = (b.clone(), b.clone());
            if let Some(col) = ones {
                (0..k).for_each(|row| b_logical[row * n + col] = 1.0);
                (0..k).for_each(|row| b_memory[row * n + col] = f32::NAN);
            }
            let stored_n = if ones_stored { n } else { n - 1 };
            let b_memory: Vec<f32> = b_memory.chunks(n).flat_map(|row| &row[..stored_n]).copied().collect();
            let (a16, b16) = (rounded(&a), rounded(&b_logical));
            let want = super::reference(&a16, &b16, m, n, k)?;
            let tolerance = bf16_tolerance(&a16, &b16, &want, k);
            // Every layout, then the weight gradient's (tn) with K in row slices, partials summed after.
            let layouts =
                [(false, false, 1), (false, true, 1), (true, false, 1), (true, true, 1), (true, false, SLICES)];
            for (a_trans, b_trans, slices) in layouts {
                let (a_rows, a_cols) = if a_trans { (k, m) } else { (m, k) };
                let (b_rows, b_cols) = if b_trans { (stored_n, k) } else { (k, stored_n) };
                let a_stored = if a_trans { transpose(&a, m, k) } else { a.clone() };
                let b_stored = if b_trans { transpose(&b_memory, k, stored_n) } else { b_memory.clone() };
                let a_layout = Strided { trans: a_trans, ld: ld_of(a_cols, aligned) };
                let b_layout = Strided { trans: b_trans, ld: ld_of(b_cols, aligned) };
                let a_dev = gpu.stream.clone_htod(&bf16_matrix(&with_ld(&a_stored, a_rows, a_cols, a_layout.ld)))?;
                let b_dev = gpu.stream.clone_htod(&bf16_matrix(&with_ld(&b_stored, b_rows, b_cols, b_layout.ld)))?;
                let mut c = gpu.stream.clone_htod(&vec![f32::NAN; slices * m * n])?;
                let name = linear_kernel(a_trans, b_trans);
                let kernel = match slices {
                    1 => format!("{name} ({variant})"),
                    _ => format!("{name} in {slices} slices ({variant})"),
                };
                kernels.enqueue_linear((&a_dev, a_layout), (&b_dev, b_layout), &mut c, m, n, k, ones, slices)?;
                let got = gpu.stream.clone_dtoh(&c).with_context(|| format!("{kernel} failed"))?;
                out.push(Check {
                    kernel,
                    shape: format!("{m}×{k} · {k}×{n}"),
                    rel_error: rel_error(&sum_slices(&got, slices), &want),
                    tolerance,
                });
            }
        }
    }
    Ok(())
}

/// gemm_tile_bf16 (every layout and tile, and sliced), matmul_bf16, matmul_bf16_async and (where the GPU
/// has wgmma) matmul_bf16_wgmma against the CPU product of the bf16-rounded operands.
fn bf16_checks(gpu: &Arc<Gpu>, kernels: &GpuMatmul, rng: &mut SeededRng, out: &mut Vec<Check>) -> Result<()> {
    let shape = |m: usize, n: usize, k: usize| format!("{m}×{k} · {k}×{n}");
    for (m, n, k) in BF16_SHAPES {
        let (a, b) = (random_matrix(m * k, rng), random_matrix(k * n, rng));
        let (a16, b16) = (rounded(&a), rounded(&b));
        let want = super::reference(&a16, &b16, m, n, k)?;
        let tolerance = bf16_tolerance(&a16, &b16, &want, k);
        let sliced = Bf16Tile { a_trans: true, b_trans: false, side: 128 };
        for (tile, slices) in Bf16Tile::all().map(|t| (t, 1)).chain([(sliced, SLICES)]) {
            let a_dev = gpu.stream.clone_htod(&if tile.a_trans { transpose(&a, m, k) } else { a.clone() })?;
            let b_dev = gpu.stream.clone_htod(&if tile.b_trans { transpose(&b, k, n) } else { b.clone() })?;
            let mut c = gpu.stream.clone_htod(&vec![f32::NAN; slices * m * n])?;
            kernels.enqueue_tile(tile, &a_dev, &b_dev, &mut c, m, n, k, slices)?;
            let got = gpu.stream.clone_dtoh(&c).with_context(|| format!("{} failed", tile.name()))?;
            let kernel = if slices == 1 { tile.name() } else { format!("{} in {slices} slices", tile.name()) };
            out.push(Check {
                kernel,
                shape: shape(m, n, k),
                rel_error: rel_error(&sum_slices(&got, slices), &want),
                tolerance,
            });
        }
    }
    for kernel in Bf16Kernel::ALL.into_iter().filter(|k| k.runs_on(gpu)) {
        let aligned: &[_] = if kernel == Bf16Kernel::Tile { &[] } else { &BF16_ALIGNED_SHAPES };
        for &(m, n, k) in BF16_SHAPES.iter().chain(aligned).filter(|&&(m, n, k)| kernel.takes(m, n, k)) {
            let (a, b) = (random_matrix(m * k, rng), random_matrix(k * n, rng));
            let (a16, b16) = (rounded(&a), rounded(&b));
            let want = super::reference(&a16, &b16, m, n, k)?;
            let a_dev = gpu.stream.clone_htod(&bf16_matrix(&a))?;
            let b_dev = gpu.stream.clone_htod(&bf16_matrix(&b))?;
            let mut c = gpu.stream.clone_htod(&vec![f32::NAN; m * n])?;
            kernels.enqueue_bf16(kernel, &a_dev, &b_dev, &mut c, m, n, k)?;
            let got = gpu.stream.clone_dtoh(&c).with_context(|| format!("{} failed", kernel.name()))?;
            out.push(Check {
                kernel: kernel.name().into(),
                shape: shape(m, n, k),
                rel_error: rel_error(&got, &want),
                tolerance: bf16_tolerance(&a16, &b16, &want, k),
            });
        }
    }
    if Bf16Kernel::Tma.runs_on(gpu) {
        tma_checks(gpu, kernels, rng, out)?;
    }
    Ok(())
}

/// One TMA product into a C filled with NaN (`enqueue`), against `want` at `tolerance`.
fn tma_check(
    gpu: &Gpu,
    name: String,
    (m, n, k): (usize, usize, usize),
    (want, tolerance): (&[f32], f64),
    enqueue: impl FnOnce(&mut CudaSlice<f32>) -> Result<()>,
) -> Result<Check> {
    let mut c = gpu.stream.clone_htod(&vec![f32::NAN; m * n])?;
    enqueue(&mut c)?;
    let got = gpu.stream.clone_dtoh(&c).with_context(|| format!("{name} failed"))?;
    Ok(Check { kernel: name, shape: format!("{m}×{k} · {k}×{n}"), rel_error: rel_error(&got, want), tolerance })
}

/// matmul_bf16_tma_* on TMA_SHAPES, each tile forced and then as `TmaTile::choose` picks.
fn tma_checks(gpu: &Arc<Gpu>, kernels: &GpuMatmul, rng: &mut SeededRng, out: &mut Vec<Check>) -> Result<()> {
    for (m, n, k) in TMA_SHAPES {
        let (a, b) = (random_matrix(m * k, rng), random_matrix(k * n, rng));
        let (a16, b16) = (rounded(&a), rounded(&b));
        let want = super::reference(&a16, &b16, m, n, k)?;
        let tolerance = bf16_tolerance(&a16, &b16, &want, k);
        let a_dev = gpu.stream.clone_htod(&bf16_matrix(&a))?;
        let b_dev = gpu.stream.clone_htod(&bf16_matrix(&b))?;
        let chosen = TmaTile::choose(m, n, k, gpu.sm_count as usize);
        for tile in TmaTile::ALL.map(Some).into_iter().chain([None]) {
            let name = match tile {
                Some(tile) => tile.name(),
                None => format!("{} (picks {})", Bf16Kernel::Tma.name(), chosen.name()),
            };
            out.push(tma_check(gpu, name, (m, n, k), (&want, tolerance), |c| {
                kernels.enqueue_tma(tile, &a_dev, &b_dev, c, m, n, k)
            })?);
        }
        // Every layout through the store hook (the Transformer's), each operand's rows padded past a
        // multiple of 8 with NaN, which a read past the map's sides would carry into C.
        for (a_trans, b_trans) in [(false, false), (false, true), (true, false), (true, true)] {
            let (a_rows, a_cols) = if a_trans { (k, m) } else { (m, k) };
            let (b_rows, b_cols) = if b_trans { (n, k) } else { (k, n) };
            let a_layout = Strided { trans: a_trans, ld: a_cols.next_multiple_of(8) + 8 };
            let b_layout = Strided { trans: b_trans, ld: b_cols.next_multiple_of(8) + 8 };
            let a_stored = if a_trans { transpose(&a, m, k) } else { a.clone() };
            let b_stored = if b_trans { transpose(&b, k, n) } else { b.clone() };
            let a_dev = gpu.stream.clone_htod(&bf16_matrix(&with_ld(&a_stored, a_rows, a_cols, a_layout.ld)))?;
            let b_dev = gpu.stream.clone_htod(&bf16_matrix(&with_ld(&b_stored, b_rows, b_cols, b_layout.ld)))?;
            for tile in TmaTile::ALL {
                let name = format!("{} (ld {} and {})", tile.layout_name(a_trans, b_trans), a_layout.ld, b_layout.ld);
                out.push(tma_check(gpu, name, (m, n, k), (&want, tolerance), |c| {
                    kernels.enqueue_tma_strided(Some(tile), (&a_dev, a_layout), (&b_dev, b_layout), c, m, n, k)
                })?);
            }
        }
    }
    Ok(())
}
