//! `textnet bench xor`: a fixed run (H = 4, sigmoid, lr 0.5, 5000 epochs) in one launch, timed with
//! device events after a warm-up (median of the repeats), beside `benches/torch_xor.py`. Also the time
//! from parameters on the host to parameters back (upload, launch, download), the CPU reference's time
//! for the same run, and how far the GPU's parameters end from the reference's.

use super::checks::{EPOCHS, LR, REPORT_EVERY, worst_error};
use super::gpu::GpuXor;
use super::model::{self, INPUTS, TARGETS, XorParams};
use crate::device::Gpu;
use crate::harness::timing::{median, time_on_device};
use crate::ops::activations::Activation;
use anyhow::Result;
use std::sync::Arc;
use std::time::Instant;

/// `textnet bench xor`: times the whole 5000-epoch run in one launch (`repeats` repeats, median; a table, or one JSON
/// object with `json`).
pub fn bench(gpu: &Arc<Gpu>, repeats: usize, json: bool) -> Result<()> {
    let start = XorParams::init(4, Activation::Sigmoid, 1);
    let reports = EPOCHS.div_ceil(REPORT_EVERY);
    let mut losses = gpu.stream.alloc_zeros::<f32>(reports)?;
    let rates = vec![LR; EPOCHS];
    let device_rates = gpu.stream.clone_htod(&rates)?;
    // Warm-up: the module compiled and loaded, the first launch paid.
    let mut warm = GpuXor::new(gpu.clone(), &start)?;
    warm.train(&rates, REPORT_EVERY)?;

    let mut device_ms = Vec::with_capacity(repeats);
    let mut round_trip_ms = Vec::with_capacity(repeats);
    let mut last = None;
    for _ in 0..repeats.max(1) {
        let mut t = GpuXor::new(gpu.clone(), &start)?;
        gpu.stream.synchronize()?;
        device_ms.push(time_on_device(gpu, || t.enqueue(&device_rates, REPORT_EVERY, &mut losses))?);
        let wall = Instant::now();
        let mut t = GpuXor::new(gpu.clone(), &start)?;
        let recorded = t.train(&rates, REPORT_EVERY)?;
        let params = t.params()?;
        round_trip_ms.push(wall.elapsed().as_secs_f64() * 1e3);
        last = Some((params, recorded));
    }
    let (gpu_params, gpu_losses) = last.expect("at least one repeat");

    let wall = Instant::now();
    let mut cpu = start.clone();
    let cpu_losses = model::train(&mut cpu, &rates, REPORT_EVERY);
    let cpu_ms = wall.elapsed().as_secs_f64() * 1e3;

    let predictions: Vec<f32> = INPUTS.iter().map(|x| model::predict(&gpu_params, *x)).collect();
    let solved = predictions.iter().zip(TARGETS).all(|(y, t)| (y - t).abs() < 0.5);
    let ms = median(&device_ms);
    let report = serde_json::json!({
        "device": "cuda:0", "device_name": gpu.describe(),
        "model": "Linear(2,4) -> sigmoid -> Linear(4,1), MSE, full-batch SGD",
        "lr": LR, "epochs": EPOCHS,
        "device_ms_median": ms, "device_ms": device_ms,
        "us_per_epoch": ms * 1e3 / EPOCHS as f64,
        "round_trip_ms_median": median(&round_trip_ms),
        "cpu_reference_ms": cpu_ms,
        "final_loss": gpu_losses.last(), "cpu_final_loss": cpu_losses.last(),
        "rel_error_vs_cpu": worst_error(&gpu_params, &cpu),
        "predictions": predictions, "solved": solved,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("xor on {}: {EPOCHS} epochs in one launch", gpu.describe());
        println!(
            "  device time {ms:.3} ms (median of {}; {:.3} µs/epoch), {:.3} ms from host parameters to host parameters",
            device_ms.len(),
            ms * 1e3 / EPOCHS as f64,
            median(&round_trip_ms)
        );
        println!(
            "  CPU reference {cpu_ms:.3} ms; final loss {:?} (CPU {:?}); solved: {solved}",
            gpu_losses.last(),
            cpu_losses.last()
        );
    }
    Ok(())
}
