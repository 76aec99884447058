//! `textnet bench matmul`: C = A·B at 1024³ in fp32 by matmul_naive, matmul_tile128, matmul_tile64, matmul_tile128_split2 and cuBLAS
//! sgemm (left out, with the reason, where libcublas is missing), beside `benches/torch_matmul.py`. Each
//! row is timed with device events over LAUNCHES back-to-back launches after a warm-up (median of the
//! repeats), and its result is checked against the CPU reference first: any row off by more than
//! relative 1e-5 makes the bench fail. The tiled kernels' target is 60 % of cuBLAS's speed.
//!
//! Then bf16 on the tensor cores (operands rounded to bf16, fp32 sums and output): matmul_bf16 (gemm_tile_bf16
//! through functors), matmul_bf16_async (gemm_tile_bf16_async: 128×128 tiles fed by cp.async) and cuBLAS
//! GemmEx at 1024³ and 4096³; and the products of the Transformer's linear layers at nanoGPT's shape (16384
//! rows, 384 wide) and GPT-2-small's (16384 rows, 768 wide) in the layouts the layers read: gemm_tile_bf16 on fp32 operands (both tile sides),
//! gemm_bf16_async_* (the layers' tile) on bf16 operands with the weight gradient's bias column read as
//! ones, beside cuBLAS bf16 at the same M, N, K. Each bf16 row is checked against the CPU product of the
//! bf16-rounded operands, within `bf16_tolerance`. On Hopper, matmul_bf16_tma_* (TMA, `wgmma`, persistent
//! blocks) runs at each size and at each of the Transformer's products whose N and K it takes (row-major
//! operands, as cuBLAS's row), as `TmaTile::choose` picks its tile and then with each tile forced, so one
//! run shows whether the choice is right.

use super::checks::{TOLERANCE, bf16_matrix, bf16_tolerance, random_matrix, rounded, sum_slices, transpose};
use super::gpu::{Bf16Kernel, Bf16Tile, Cublas, GpuMatmul, Kernel, LINEAR_TILE, linear_kernel};
use crate::device::Gpu;
use crate::device::tma::TmaTile;
use crate::harness::check::rel_error;
use crate::harness::timing::{median, time_on_device};
use crate::ops::gemm::Strided;
use anyhow::{Context, Result, bail};
use cudarc::driver::CudaSlice;
use rand::SeedableRng;
use std::sync::Arc;

/// The side of the square matrices multiplied (M = N = K).
pub const SIZE: usize = 1024;
/// The sides of the square bf16 products.
pub const BF16_SIZES: [usize; 2] = [1024, 4096];
/// Rows of the Transformer's products (nanoGPT's batch 64 × block 256, GPT-2-small's 16 × 1024) and its
/// widths (nanoGPT's and GPT-2-small's).
const ROWS: usize = 16384;
const WIDTHS: [usize; 2] = [384, 768];
const LAUNCHES: usize = 10;
const TARGET: f64 = 0.6;
const CUBLAS_BF16: &str = "cublas_gemmex_bf16";

struct Row {
    name: String,
    /// M, N, K.
    shape: (usize, usize, usize),
    ms: Vec<f64>,
    rel_error: f64,
    tolerance: f64,
}

impl Row {
    fn median_ms(&self) -> f64 {
        median(&self.ms)
    }
    fn passed(&self) -> bool {
        self.rel_error.is_finite() && self.rel_error <= self.tolerance
    }
    fn tflops(&self) -> f64 {
        let (m, n, k) = self.shape;
        2.0 * (m * n * k) as f64 / (self.median_ms() * 1e-3) / 1e12
    }
}

/// What a row is checked against: the CPU product and the tolerance.
struct Want<'a> {
    c: &'a [f32],
    shape: (usize, usize, usize),
    tolerance: f64,
}

/// Checks then times one way of computing C (`enqueue` queues one product into its argument, which holds
/// `slices` partial products to be summed).
fn measure(
    gpu: &Gpu,
    name: String,
    want: &Want,
    slices: usize,
    repeats: usize,
    mut enqueue: impl FnMut(&mut CudaSlice<f32>) -> Result<()>,
) -> Result<Row> {
    let mut c = gpu.stream.clone_htod(&vec![f32::NAN; slices * want.c.len()])?;
    enqueue(&mut c)?;
    let got = gpu.stream.clone_dtoh(&c).with_context(|| format!("{name} failed"))?;
    let rel_error = rel_error(&sum_slices(&got, slices), want.c);
    let ms = (0..repeats)
        .map(|_| time_on_device(gpu, || (0..LAUNCHES).try_for_each(|_| enqueue(&mut c))).map(|ms| ms / LAUNCHES as f64))
        .collect::<Result<Vec<f64>>>()?;
    Ok(Row { name, shape: want.shape, ms, rel_error, tolerance: want.tolerance })
}

/// One of the Transformer's products as C = op(A)·op(B).
struct LayerProduct {
    what: &'static str,
    tile_a_trans: bool,
    tile_b_trans: bool,
    /// M, N, K.
    shape: (usize, usize, usize),
    /// B's last column is the bias gradient's column of ones.
    bias_column: bool,
}

/// The linear layers' products at each of WIDTHS: forward in·Wᵀ (W out × in), dx = dy·W, and dW = dyᵀ·[x | 1]
/// (the bias gradient as an extra column) over row slices; for the attention's qkv (C → 3C), its projection
/// (C → C), the MLP (C → 4C → C) and the vocabulary head (C → 65).
fn layer_products() -> Vec<LayerProduct> {
    let mut out = Vec::new();
    for c in WIDTHS {
        let layers = [(c, 3 * c), (c, c), (c, 4 * c), (4 * c, c), (c, 65)];
        for (what, a_trans, b_trans) in [("forward", false, true), ("dx", false, false), ("dW", true, false)] {
            for &(inputs, outputs) in &layers {
                let shape = match what {
                    "forward" => (ROWS, outputs, inputs),
                    "dx" => (ROWS, inputs, outputs),
                    _ => (outputs, inputs + 1, ROWS),
                };
                out.push(LayerProduct {
                    what,
                    tile_a_trans: a_trans,
                    tile_b_trans: b_trans,
                    shape,
                    bias_column: what == "dW",
                });
            }
        }
    }
    out
}

/// Row slices for a weight gradient of `tiles` tiles over `rows` rows, as the Transformer cuts them: about
/// two blocks per SM over all tiles, each slice at least 32 rows.
fn slices(gpu: &Gpu, tiles: usize, rows: usize) -> usize {
    (2 * gpu.sm_count as usize).div_ceil(tiles.max(1)).clamp(1, rows.div_ceil(32).max(1))
}

/// A bf16 product to time: operands A M×K, B K×N (row-major, uniform in `[−1, 1)`, B's column `ones` set
/// to 1), the CPU product of their bf16 roundings and its tolerance.
struct Bf16Problem {
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    tolerance: f64,
}

impl Bf16Problem {
    fn new(m: usize, n: usize, k: usize, ones: Option<usize>, seed: u64) -> Result<Bf16Problem> {
        let mut rng = crate::ops::cpu::SeededRng::seed_from_u64(seed);
        let (a, mut b) = (random_matrix(m * k, &mut rng), random_matrix(k * n, &mut rng));
        if let Some(col) = ones {
            b.iter_mut().skip(col).step_by(n).for_each(|x| *x = 1.0);
        }
        let (a16, b16) = (rounded(&a), rounded(&b));
        let c = super::reference(&a16, &b16, m, n, k)?;
        let tolerance = bf16_tolerance(&a16, &b16, &c, k);
        Ok(Bf16Problem { a, b, c, tolerance })
    }
}

/// `textnet bench matmul`: times each kernel and cuBLAS at SIZE³ (`repeats` repeats, median; a table, or one JSON
/// object with `json`), then the bf16 products.
pub fn bench(gpu: &Arc<Gpu>, repeats: usize, json: bool) -> Result<()> {
    let (m, n, k) = (SIZE, SIZE, SIZE);
    let mut rng = crate::ops::cpu::SeededRng::seed_from_u64(1);
    let (a, b) = (random_matrix(m * k, &mut rng), random_matrix(k * n, &mut rng));
    let want = super::reference(&a, &b, m, n, k)?;
    let want = Want { c: &want, shape: (m, n, k), tolerance: TOLERANCE };
    let (a_dev, b_dev) = (gpu.stream.clone_htod(&a)?, gpu.stream.clone_htod(&b)?);

    let kernels = GpuMatmul::new(gpu.clone())?;
    let mut rows = Kernel::ALL
        .into_iter()
        .map(|kernel| {
            measure(gpu, kernel.name().into(), &want, 1, repeats, |c| {
                kernels.enqueue(kernel, &a_dev, &b_dev, c, m, n, k)
            })
        })
        .collect::<Result<Vec<Row>>>()?;
    let blas = Cublas::new(gpu).map_err(|why| format!("{why:#}"));
    let cublas = match &blas {
        Ok(blas) => {
            rows.push(measure(gpu, "cublas_sgemm".into(), &want, 1, repeats, |c| {
                blas.enqueue(&a_dev, &b_dev, c, m, n, k)
            })?);
            Ok(rows.last().map(Row::median_ms).unwrap_or(f64::NAN))
        }
        Err(why) => Err(why.clone()),
    };
    drop((a_dev, b_dev));
    let bf16_rows = bench_bf16(gpu, &kernels, blas.as_ref().ok(), repeats)?;
    let layer_rows = bench_layers(gpu, &kernels, blas.as_ref().ok(), repeats)?;

    let ratio = |ms: f64| cublas.as_ref().ok().map(|c| c / ms);
    let best_tiled = rows
        .iter()
        .filter(|r| r.name != Kernel::Naive.name() && r.name != "cublas_sgemm")
        .min_by(|x, y| x.median_ms().total_cmp(&y.median_ms()));
    let failed: Vec<&str> =
        rows.iter().chain(&bf16_rows).chain(&layer_rows).filter(|r| !r.passed()).map(|r| r.name.as_str()).collect();
    if json {
        let report = serde_json::json!({
            "device": "cuda:0", "device_name": gpu.describe(),
            "m": m, "n": n, "k": k, "dtype": "fp32", "launches_per_repeat": LAUNCHES,
            "rows": rows.iter().map(|r| serde_json::json!({
                "kernel": r.name, "ms_median": r.median_ms(), "ms": r.ms, "tflops": r.tflops(),
                "cublas_ms_over_ms": ratio(r.median_ms()), "rel_error_vs_cpu": r.rel_error, "pass": r.passed(),
            })).collect::<Vec<_>>(),
            "cublas_missing": cublas.as_ref().err(),
            "best_tiled": best_tiled.map(|r| r.name.as_str()),
            "best_tiled_fraction_of_cublas": best_tiled.and_then(|r| ratio(r.median_ms())),
            "target_fraction_of_cublas": TARGET,
            "tolerance": TOLERANCE,
            "bf16_rows": bf16_json(&bf16_rows),
            "bf16_transformer_rows": bf16_json(&layer_rows),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "matmul on {}: {m}×{k} · {k}×{n} fp32, median of {repeats} ({LAUNCHES} launches each)",
            gpu.describe()
        );
        println!("  {:<22} {:>9} {:>9} {:>14} {:>11}", "kernel", "ms", "TFLOP/s", "cuBLAS/kernel", "rel. error");
        for r in &rows {
            let ms = r.median_ms();
            let ratio = ratio(ms).map_or("-".into(), |x| format!("{x:.3}"));
            let verdict = if r.passed() { "" } else { "  FAIL" };
            println!("  {:<22} {ms:>9.4} {:>9.2} {ratio:>14} {:>11.2e}{verdict}", r.name, r.tflops(), r.rel_error);
        }
        if let Err(why) = &cublas {
            println!("  cuBLAS left out: {why}");
        }
        if let Some((r, x)) = best_tiled.and_then(|r| ratio(r.median_ms()).map(|x| (r, x))) {
            println!("  best tiled: {} at {:.0} % of cuBLAS (target {:.0} %)", r.name, 100.0 * x, 100.0 * TARGET);
        }
        println!("bf16 on the tensor cores (operands rounded to bf16, fp32 sums and output):");
        print_bf16(&bf16_rows);
        println!(
            "the Transformer's products ({ROWS} rows, widths {WIDTHS:?}; fp32 operands, bf16 for gemm_bf16_async_*):"
        );
        print_bf16(&layer_rows);
    }
    if !failed.is_empty() {
        bail!("{} off the CPU reference by more than the tolerance", failed.join(", "));
    }
    Ok(())
}

/// matmul_bf16, matmul_bf16_async, matmul_bf16_wgmma and matmul_bf16_tma (where they run; the latter also
/// with each tile forced) and cuBLAS GemmEx at each of BF16_SIZES.
fn bench_bf16(gpu: &Gpu, kernels: &GpuMatmul, blas: Option<&Cublas>, repeats: usize) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for size in BF16_SIZES {
        let (m, n, k) = (size, size, size);
        let Bf16Problem { a, b, c: product, tolerance } = Bf16Problem::new(m, n, k, None, size as u64)?;
        let want = Want { c: &product, shape: (m, n, k), tolerance };
        let a_dev = gpu.stream.clone_htod(&bf16_matrix(&a))?;
        let b_dev = gpu.stream.clone_htod(&bf16_matrix(&b))?;
        for kernel in Bf16Kernel::ALL.into_iter().filter(|kernel| kernel.runs_on(gpu) && kernel.takes(m, n, k)) {
            rows.push(measure(gpu, format!("{} {size}³", kernel.name()), &want, 1, repeats, |c| {
                kernels.enqueue_bf16(kernel, &a_dev, &b_dev, c, m, n, k)
            })?);
        }
        rows.extend(tma_tile_rows(gpu, kernels, &want, &a_dev, &b_dev, &format!("{size}³"), repeats)?);
        if let Some(blas) = blas {
            rows.push(measure(gpu, format!("{CUBLAS_BF16} {size}³"), &want, 1, repeats, |c| {
                blas.enqueue_bf16(&a_dev, &b_dev, c, m, n, k)
            })?);
        }
    }
    Ok(rows)
}

/// gemm_tile_bf16 (both tile sides) and gemm_bf16_async_* at each of the Transformer's products, then
/// matmul_bf16_tma_* (where it runs and takes the shape) and cuBLAS GemmEx at its M, N, K (row-major, no
/// transposes: the same work).
fn bench_layers(gpu: &Gpu, kernels: &GpuMatmul, blas: Option<&Cublas>, repeats: usize) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (i, p) in layer_products().into_iter().enumerate() {
        let (m, n, k) = p.shape;
        let ones = p.bias_column.then(|| n - 1);
        let Bf16Problem { a, b, c: product, tolerance } = Bf16Problem::new(m, n, k, ones, 100 + i as u64)?;
        let want = Want { c: &product, shape: p.shape, tolerance };
        let label = format!("{} {m}×{n}×{k}", p.what);
        {
            let a_dev = gpu.stream.clone_htod(&if p.tile_a_trans { transpose(&a, m, k) } else { a.clone() })?;
            let b_dev = gpu.stream.clone_htod(&if p.tile_b_trans { transpose(&b, k, n) } else { b.clone() })?;
            for side in Bf16Tile::SIDES {
                let tile = Bf16Tile { a_trans: p.tile_a_trans, b_trans: p.tile_b_trans, side };
                let (bx, by) = tile.blocks(m, n);
                let s = if p.tile_a_trans { slices(gpu, bx * by, k) } else { 1 };
                let name =
                    if s > 1 { format!("{} {label} /{s}", tile.name()) } else { format!("{} {label}", tile.name()) };
                rows.push(measure(gpu, name, &want, s, repeats, |c| {
                    kernels.enqueue_tile(tile, &a_dev, &b_dev, c, m, n, k, s)
                })?);
            }
        }
        {
            // As the layer lies: A and B unpadded, B without its ones column (`[x | 1]` over x).
            let (a_trans, b_trans) = (p.tile_a_trans, p.tile_b_trans);
            let stored_n = if p.bias_column { n - 1 } else { n };
            let b_memory: Vec<f32> = b.chunks(n).flat_map(|row| &row[..stored_n]).copied().collect();
            let a_layout = Strided { trans: a_trans, ld: if a_trans { m } else { k } };
            let b_layout = Strided { trans: b_trans, ld: if b_trans { k } else { stored_n } };
            let a_dev = gpu.stream.clone_htod(&bf16_matrix(&if a_trans { transpose(&a, m, k) } else { a.clone() }))?;
            let b_stored = if b_trans { transpose(&b_memory, k, stored_n) } else { b_memory };
            let b_dev = gpu.stream.clone_htod(&bf16_matrix(&b_stored))?;
            let side = LINEAR_TILE.0;
            let s = if a_trans { slices(gpu, n.div_ceil(side) * m.div_ceil(side), k) } else { 1 };
            let name = linear_kernel(a_trans, b_trans);
            let name = if s > 1 { format!("{name} {label} /{s}") } else { format!("{name} {label}") };
            rows.push(measure(gpu, name, &want, s, repeats, |c| {
                kernels.enqueue_linear((&a_dev, a_layout), (&b_dev, b_layout), c, m, n, k, ones, s)
            })?);
            // The TMA pipeline on the same memory, 128×128 tiles (the Transformer's forward products'):
            // what a transposed operand costs it, beside the row-major rows below.
            let tile = TmaTile::M128N128;
            let copyable = !p.bias_column && Bf16Kernel::Tma.takes(m, n, k) && m.is_multiple_of(8);
            if (a_trans || b_trans) && copyable && Bf16Kernel::Tma.runs_on(gpu) {
                let name = format!("{} {label}", tile.layout_name(a_trans, b_trans));
                rows.push(measure(gpu, name, &want, 1, repeats, |c| {
                    kernels.enqueue_tma_strided(Some(tile), (&a_dev, a_layout), (&b_dev, b_layout), c, m, n, k)
                })?);
            }
        }
        // Row-major bf16 operands, as cuBLAS's row reads them.
        let a_dev = gpu.stream.clone_htod(&bf16_matrix(&a))?;
        let b_dev = gpu.stream.clone_htod(&bf16_matrix(&b))?;
        let tma = Bf16Kernel::Tma;
        if tma.runs_on(gpu) && tma.takes(m, n, k) {
            rows.push(measure(gpu, format!("{} {label}", tma.name()), &want, 1, repeats, |c| {
                kernels.enqueue_bf16(tma, &a_dev, &b_dev, c, m, n, k)
            })?);
            rows.extend(tma_tile_rows(gpu, kernels, &want, &a_dev, &b_dev, &label, repeats)?);
        }
        if let Some(blas) = blas {
            rows.push(measure(gpu, format!("{CUBLAS_BF16} {label}"), &want, 1, repeats, |c| {
                blas.enqueue_bf16(&a_dev, &b_dev, c, m, n, k)
            })?);
        }
    }
    Ok(rows)
}

/// matmul_bf16_tma_* with each tile forced, on row-major bf16 operands (none where the GPU lacks `wgmma` or
/// the shape is not one it takes); the tile `TmaTile::choose` picks marked.
fn tma_tile_rows(
    gpu: &Gpu,
    kernels: &GpuMatmul,
    want: &Want,
    a: &CudaSlice<u16>,
    b: &CudaSlice<u16>,
    label: &str,
    repeats: usize,
) -> Result<Vec<Row>> {
    let (m, n, k) = want.shape;
    if !Bf16Kernel::Tma.runs_on(gpu) || !Bf16Kernel::Tma.takes(m, n, k) {
        return Ok(Vec::new());
    }
    let chosen = TmaTile::choose(m, n, k, gpu.sm_count as usize);
    TmaTile::ALL
        .into_iter()
        .map(|tile| {
            let mark = if tile == chosen { " *" } else { "" };
            measure(gpu, format!("{} {label}{mark}", tile.name()), want, 1, repeats, |c| {
                kernels.enqueue_tma(Some(tile), a, b, c, m, n, k)
            })
        })
        .collect()
}

/// The cuBLAS row of a bf16 row's problem (the same M, N, K), if there is one.
fn cublas_of<'a>(rows: &'a [Row], row: &Row) -> Option<&'a Row> {
    rows.iter().find(|r| r.name.starts_with(CUBLAS_BF16) && r.shape == row.shape)
}

fn bf16_json(rows: &[Row]) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|r| {
            let (m, n, k) = r.shape;
            serde_json::json!({
                "kernel": r.name, "m": m, "n": n, "k": k, "ms_median": r.median_ms(), "ms": r.ms,
                "tflops": r.tflops(), "cublas_ms_over_ms": cublas_of(rows, r).map(|c| c.median_ms() / r.median_ms()),
                "rel_error_vs_cpu": r.rel_error, "tolerance": r.tolerance, "pass": r.passed(),
            })
        })
        .collect()
}

fn print_bf16(rows: &[Row]) {
    println!(
        "  {:<46} {:>9} {:>9} {:>14} {:>11} {:>11}",
        "kernel", "ms", "TFLOP/s", "cuBLAS/kernel", "rel. error", "tolerance"
    );
    for r in rows {
        let ms = r.median_ms();
        let ratio = cublas_of(rows, r).map_or("-".into(), |c| format!("{:.3}", c.median_ms() / ms));
        let verdict = if r.passed() { "" } else { "  FAIL" };
        println!(
            "  {:<46} {ms:>9.4} {:>9.2} {ratio:>14} {:>11.2e} {:>11.2e}{verdict}",
            r.name,
            r.tflops(),
            r.rel_error,
            r.tolerance
        );
    }
}
