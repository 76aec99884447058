//! `textnet bench matmul`: C = A·B at 1024³ in fp32 by matmul_naive, matmul_tile128, matmul_tile64, matmul_tile128_split2 and cuBLAS
//! sgemm (left out, with the reason, where libcublas is missing), beside `benches/torch_matmul.py`. Each
//! row is timed with device events over LAUNCHES back-to-back launches after a warm-up (median of the
//! repeats), and its result is checked against the CPU reference first: any row off by more than
//! relative 1e-5 makes the bench fail. The tiled kernels' target is 60 % of cuBLAS's speed.

use super::checks::{TOLERANCE, random_matrix};
use super::gpu::{Cublas, GpuMatmul, Kernel};
use crate::check::rel_error;
use crate::device::Gpu;
use crate::timing::{median, time_on_device};
use anyhow::{Context, Result, bail};
use cudarc::driver::CudaSlice;
use rand::SeedableRng;
use std::sync::Arc;

/// The side of the square matrices multiplied (M = N = K).
pub const SIZE: usize = 1024;
const LAUNCHES: usize = 10;
const TARGET: f64 = 0.6;

struct Row {
    name: &'static str,
    ms: Vec<f64>,
    rel_error: f64,
}

impl Row {
    fn median_ms(&self) -> f64 {
        median(&self.ms)
    }
    fn passed(&self) -> bool {
        self.rel_error.is_finite() && self.rel_error <= TOLERANCE
    }
}

/// Checks then times one way of computing C (`enqueue` queues one product into its argument).
fn measure(
    gpu: &Gpu,
    name: &'static str,
    want: &[f32],
    repeats: usize,
    mut enqueue: impl FnMut(&mut CudaSlice<f32>) -> Result<()>,
) -> Result<Row> {
    let mut c = gpu.stream.clone_htod(&vec![f32::NAN; want.len()])?;
    enqueue(&mut c)?;
    let got = gpu.stream.clone_dtoh(&c).with_context(|| format!("{name} failed"))?;
    let ms = (0..repeats)
        .map(|_| time_on_device(gpu, || (0..LAUNCHES).try_for_each(|_| enqueue(&mut c))).map(|ms| ms / LAUNCHES as f64))
        .collect::<Result<Vec<f64>>>()?;
    Ok(Row { name, ms, rel_error: rel_error(&got, want) })
}

/// `textnet bench matmul`: times each kernel and cuBLAS at SIZE³ (`repeats` repeats, median; a table, or one JSON
/// object with `json`).
pub fn bench(gpu: &Arc<Gpu>, repeats: usize, json: bool) -> Result<()> {
    let (m, n, k) = (SIZE, SIZE, SIZE);
    let mut rng = crate::cpu::SeededRng::seed_from_u64(1);
    let (a, b) = (random_matrix(m * k, &mut rng), random_matrix(k * n, &mut rng));
    let want = super::reference(&a, &b, m, n, k)?;
    let (a_dev, b_dev) = (gpu.stream.clone_htod(&a)?, gpu.stream.clone_htod(&b)?);

    let kernels = GpuMatmul::new(gpu.clone())?;
    let mut rows = Kernel::ALL
        .into_iter()
        .map(|kernel| {
            measure(gpu, kernel.name(), &want, repeats, |c| kernels.enqueue(kernel, &a_dev, &b_dev, c, m, n, k))
        })
        .collect::<Result<Vec<Row>>>()?;
    let cublas = match Cublas::new(gpu) {
        Ok(blas) => {
            rows.push(measure(gpu, "cublas_sgemm", &want, repeats, |c| blas.enqueue(&a_dev, &b_dev, c, m, n, k))?);
            Ok(rows.last().map(Row::median_ms).unwrap_or(f64::NAN))
        }
        Err(why) => Err(format!("{why:#}")),
    };

    let flop = 2.0 * (m * n * k) as f64;
    let tflops = |ms: f64| flop / (ms * 1e-3) / 1e12;
    let ratio = |ms: f64| cublas.as_ref().ok().map(|c| c / ms);
    let best_tiled = rows
        .iter()
        .filter(|r| r.name != Kernel::Naive.name() && r.name != "cublas_sgemm")
        .min_by(|x, y| x.median_ms().total_cmp(&y.median_ms()));
    let failed: Vec<&str> = rows.iter().filter(|r| !r.passed()).map(|r| r.name).collect();
    if json {
        let report = serde_json::json!({
            "device": "cuda:0", "device_name": gpu.describe(),
            "m": m, "n": n, "k": k, "dtype": "fp32", "launches_per_repeat": LAUNCHES,
            "rows": rows.iter().map(|r| serde_json::json!({
                "kernel": r.name, "ms_median": r.median_ms(), "ms": r.ms, "tflops": tflops(r.median_ms()),
                "cublas_ms_over_ms": ratio(r.median_ms()), "rel_error_vs_cpu": r.rel_error, "pass": r.passed(),
            })).collect::<Vec<_>>(),
            "cublas_missing": cublas.as_ref().err(),
            "best_tiled": best_tiled.map(|r| r.name),
            "best_tiled_fraction_of_cublas": best_tiled.and_then(|r| ratio(r.median_ms())),
            "target_fraction_of_cublas": TARGET,
            "tolerance": TOLERANCE,
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
            println!("  {:<22} {ms:>9.4} {:>9.2} {ratio:>14} {:>11.2e}{verdict}", r.name, tflops(ms), r.rel_error);
        }
        if let Err(why) = &cublas {
            println!("  cuBLAS left out: {why}");
        }
        if let Some((r, x)) = best_tiled.and_then(|r| ratio(r.median_ms()).map(|x| (r, x))) {
            println!("  best tiled: {} at {:.0} % of cuBLAS (target {:.0} %)", r.name, 100.0 * x, 100.0 * TARGET);
        }
    }
    if !failed.is_empty() {
        bail!("{} off the CPU reference by more than {TOLERANCE:e}", failed.join(", "));
    }
    Ok(())
}
