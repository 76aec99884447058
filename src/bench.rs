//! `textnet bench`: training speed on the GPU, timed with device events after warm-up, median of several
//! repeats. `bench text` (the default) measures the text model at V=8192, D=64, H=256, context 3:
//! single-sample steps/s (CUDA graph and plain launches) and batched samples/s at B=256 and B=4096.
//! `bench mnist` times the MNIST pipeline. Numbers go to BENCHMARKS.md; nothing here is asserted.

use crate::device::Gpu;
use crate::text::gpu::GpuTrainer;
use crate::text::model::{TextParams, TextShape};
use anyhow::{Context, Result};
use cudarc::driver::sys::CUevent_flags;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::sync::Arc;

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BenchTarget {
    #[default]
    Text,
    Mnist,
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Which pipeline to time
    #[arg(value_enum, default_value_t = BenchTarget::Text)]
    pub target: BenchTarget,
    /// Timed repeats per configuration (the median is reported)
    #[arg(long, default_value_t = 7)]
    pub repeats: usize,
    /// Print one JSON object instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize, Debug)]
pub struct TextBenchRow {
    pub mode: String,
    pub batch: usize,
    pub steps: usize,
    pub median_ms: f64,
    pub steps_per_s: f64,
    pub samples_per_s: f64,
    pub us_per_step: f64,
    pub repeats_ms: Vec<f64>,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let gpu = Arc::new(Gpu::open(0).map_err(|e| anyhow::anyhow!("bench needs a CUDA GPU: {e:#}"))?);
    match args.target {
        BenchTarget::Text => bench_text(&gpu, args.repeats.max(1), args.json),
        BenchTarget::Mnist => crate::mnist::gpu::bench(&gpu, &args),
    }
}

/// Median of a list of timings.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// Device time of `work`, in milliseconds, between two events on the GPU's stream.
pub fn time_on_device(gpu: &Gpu, work: impl FnOnce() -> Result<()>) -> Result<f64> {
    let start = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let end = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    start.record(&gpu.stream)?;
    work()?;
    end.record(&gpu.stream)?;
    Ok(start.elapsed_ms(&end).context("a benchmarked kernel failed")? as f64)
}

pub const BENCH_SHAPE: TextShape = TextShape { vocab: 8192, embed: 64, hidden: 256, context: 3 };

fn bench_text(gpu: &Arc<Gpu>, repeats: usize, json: bool) -> Result<()> {
    let shape = BENCH_SHAPE;
    let mut rng = StdRng::seed_from_u64(7);
    let tokens: Arc<[u32]> = (0..1usize << 20).map(|_| rng.random_range(0..shape.vocab as u32)).collect();
    let params = TextParams::init(shape, 1);
    let lr = 0.01f32;
    let mut rows = Vec::new();
    // (label, batch, steps, CUDA graph)
    let configs = [
        ("single-sample, CUDA graph", 1, 25_600, true),
        ("single-sample, plain launches", 1, 5_000, false),
        ("batch 256, CUDA graph", 256, 256, true),
        ("batch 4096, CUDA graph", 4096, 128, true),
    ];
    for (label, batch, steps, graph) in configs {
        let mut trainer = GpuTrainer::new(gpu.clone(), &params, tokens.clone())?;
        let samples = batch * steps;
        let positions: Vec<u32> =
            (0..samples).map(|_| rng.random_range(shape.context as u32..tokens.len() as u32)).collect();
        // Warm-up: compiles, captures and uploads the graph, fills the caches.
        trainer.set_positions(&positions)?;
        trainer.enqueue_training(samples, batch, lr, graph)?;
        trainer.synchronize()?;
        let mut times = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            trainer.set_positions(&positions)?;
            trainer.synchronize()?;
            times.push(time_on_device(gpu, || trainer.enqueue_training(samples, batch, lr, graph))?);
        }
        let median_ms = median(&times);
        let secs = median_ms / 1e3;
        rows.push(TextBenchRow {
            mode: label.into(),
            batch,
            steps,
            median_ms,
            steps_per_s: steps as f64 / secs,
            samples_per_s: samples as f64 / secs,
            us_per_step: median_ms * 1e3 / steps as f64,
            repeats_ms: times,
        });
    }
    // Each kernel alone: a graph of 128 launches of it (single sample), replayed.
    let mut per_kernel = Vec::new();
    {
        let mut t = GpuTrainer::new(gpu.clone(), &params, tokens.clone())?;
        let positions: Vec<u32> = (0..1024).map(|_| rng.random_range(shape.context as u32..tokens.len() as u32)).collect();
        t.set_positions(&positions)?;
        t.launch_step(1, 0, lr, false)?;
        for (name, which) in [("text_forward", 0), ("text_backward", 1), ("text_update", 2)] {
            let graph = t.capture(|t| {
                for _ in 0..128 {
                    match which {
                        0 => t.launch_forward(1, 0, true)?,
                        1 => t.launch_backward(1, 0, lr, true)?,
                        _ => t.launch_update(1, 0, lr, true)?,
                    }
                }
                Ok(())
            })?;
            graph.launch()?;
            t.synchronize()?;
            let times: Vec<f64> = (0..repeats)
                .map(|_| time_on_device(gpu, || Ok(graph.launch()?)).map(|ms| ms * 1e3 / 128.0))
                .collect::<Result<_>>()?;
            per_kernel.push(serde_json::json!({"kernel": name, "us_median": median(&times), "us": times}));
        }
        per_kernel.push(serde_json::json!({"resources (name, registers, local bytes)": t.kernel_resources()}));
    }
    // The floor of a single-sample step: W2 is read in text_forward and read + written in text_backward;
    // each forward block also reads W1 (the price of needing no grid-wide barrier).
    let f = 4.0;
    let (v, d, h) = (shape.vocab as f64, shape.embed as f64, shape.hidden as f64);
    let layout = crate::text::gpu::TextLayout::new(shape, gpu.sm_count as usize, gpu.max_shared_optin)?;
    let bytes_step = 3.0 * v * h * f + layout.grid as f64 * h * d * f + 2.0 * h * d * f;
    if json {
        let out = serde_json::json!({
            "device": gpu.describe(),
            "shape": {"vocab": shape.vocab, "embed": shape.embed, "hidden": shape.hidden, "context": shape.context},
            "grid": layout.grid, "rows_per_block": layout.rows_per_block,
            "single_sample_bytes_per_step": bytes_step,
            "single_sample_kernels": per_kernel,
            "rows": rows,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("text model V={} D={} H={} N={} on {}", shape.vocab, shape.embed, shape.hidden, shape.context, gpu.describe());
        println!("{:<32} {:>6} {:>8} {:>12} {:>14} {:>10}", "mode", "batch", "steps", "steps/s", "samples/s", "µs/step");
        for r in &rows {
            println!(
                "{:<32} {:>6} {:>8} {:>12.0} {:>14.0} {:>10.2}",
                r.mode, r.batch, r.steps, r.steps_per_s, r.samples_per_s, r.us_per_step
            );
        }
        for k in &per_kernel {
            println!("{k}");
        }
        println!(
            "single-sample bytes per step ≈ {:.1} MB → {:.1} µs at 5 TB/s (L2)",
            bytes_step / 1e6,
            bytes_step / 5e12 * 1e6
        );
    }
    Ok(())
}
