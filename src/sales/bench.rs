//! `textnet bench sales`: a fixed run (50 epochs, batch 64, Adam 1e-3, H = 32) on a sales table,
//! beside `benches/torch_sales.py` on the same file, through the command's trainer (`train::FitSales`).
//! Reports the GPU's training time (device events around all epochs' kernels, each epoch's order uploaded
//! first; and wall time of the loop as the command runs it: host shuffles, the losses read back, the test
//! evaluation), the test MAE per epoch against the baseline, and the CPU
//! reference's run from the same start and order for the GPU-vs-CPU MAE comparison.

use super::model::{self, DEFAULT_BATCH, DEFAULT_HIDDEN, SalesParams, SalesShape, Shuffle};
use super::table::{LoadOptions, Schema};
use super::train::FitSales;
use crate::datasets::features::Dataset;
use crate::device::{Backend, Gpu};
use crate::harness::run::{TEST, Trainer};
use crate::nn::stack::gpu::{DenseKernels, GpuTrainer, StepPath};
use crate::ops::optim::{OptimConfig, OptimKind};
use crate::pipeline::BenchOptions;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// The flags of `bench sales`.
#[derive(clap::Args, Debug)]
pub struct SalesBenchArgs {
    /// The table (scripts/make-sales.py writes it)
    #[arg(long, default_value = "data/sales.tsv")]
    pub table: PathBuf,
    /// Epochs
    #[arg(long, default_value_t = model::DEFAULT_EPOCHS)]
    pub epochs: usize,
    /// Seed of the initial parameters and of the sample order
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Skip the CPU reference run
    #[arg(long)]
    pub no_cpu: bool,
    #[command(flatten)]
    /// The column flags, as `textnet sales` takes them (default: the sales.tsv schema).
    pub columns: super::args::ColumnArgs,
}

/// Per epoch at the constant rate `lr`: (mean training loss, test MAE).
fn run_epochs(t: &mut FitSales, rows: usize, epochs: usize, seed: u64, lr: f32) -> Result<Vec<(f64, f64)>> {
    let mut shuffle = Shuffle::new(rows, seed);
    let mut history = Vec::with_capacity(epochs);
    let rates = vec![lr; rows.div_ceil(DEFAULT_BATCH)];
    for _ in 0..epochs {
        let loss = t.train_epoch(shuffle.next_epoch(), DEFAULT_BATCH, &rates, &mut |_, _| {})?;
        history.push((loss / rows as f64, t.evaluate(TEST)?.mae));
    }
    Ok(history)
}

/// `textnet bench sales`: times training on the table `o.table` on the GPU (and the CPU reference unless skipped), with
/// the shared bench options.
pub fn bench(gpu: &Arc<Gpu>, options: &BenchOptions, o: &SalesBenchArgs) -> Result<()> {
    let loaded = Instant::now();
    let read = || -> Result<Dataset> {
        let bytes = crate::io::fsutil::read_input(&o.table, "table")?;
        let source = crate::io::fsutil::shown(&o.table);
        let Some(inferred) = o.columns.infer(&source, &bytes, &|line| eprintln!("{line}"))? else {
            return Dataset::load(&o.table, &LoadOptions::new(Schema::sales_tsv()));
        };
        inferred.warnings(&source).iter().for_each(|w| eprintln!("{w}"));
        Dataset::load(&o.table, &LoadOptions::new(inferred.schema))
    };
    let data = read()
        .with_context(|| format!("bench sales reads {} (make it with scripts/make-sales.py)", o.table.display()))?;
    let load_s = loaded.elapsed().as_secs_f64();
    let shape = SalesShape { inputs: data.features(), hidden: DEFAULT_HIDDEN };
    let optim = OptimConfig::new(OptimKind::Adam);
    let start = SalesParams::init(shape, o.seed);
    let rows = data.train.rows;
    let steps = o.epochs * rows.div_ceil(DEFAULT_BATCH);

    let on_gpu = Backend::Cuda(gpu.clone());
    // Warm-up: modules compiled and loaded, one epoch run.
    let mut warm = FitSales::new(&on_gpu, &data, start.clone(), optim, None, DEFAULT_BATCH)?;
    warm.train_epoch(
        Shuffle::new(rows, o.seed).next_epoch(),
        DEFAULT_BATCH,
        &vec![optim.lr; rows.div_ceil(DEFAULT_BATCH)],
        &mut |_, _| {},
    )?;
    drop(warm);

    // Device time of the training kernels alone: every epoch's order made first, then each epoch's order
    // uploaded and its kernels queued, all between two events.
    let (setup, _) = FitSales::setup(&data, start.clone(), optim, None)?;
    let own = DenseKernels::Own;
    let mut timed = GpuTrainer::with_kernels(gpu.clone(), setup, DEFAULT_BATCH, StepPath::Auto, own)?;
    let lr = vec![optim.lr; rows.div_ceil(DEFAULT_BATCH)];
    let mut shuffle = Shuffle::new(rows, o.seed);
    let orders: Vec<Vec<u32>> = (0..o.epochs).map(|_| shuffle.next_epoch().to_vec()).collect();
    let device_ms = crate::harness::timing::time_on_device(gpu, || {
        for order in &orders {
            timed.set_epoch(order, &lr)?;
            timed.launch_epoch(rows, DEFAULT_BATCH)?;
        }
        Ok(())
    })?;
    drop((orders, timed));

    // The loop as `textnet sales` runs it.
    let setup = Instant::now();
    let mut t = FitSales::new(&on_gpu, &data, start.clone(), optim, None, DEFAULT_BATCH)?;
    let setup_s = setup.elapsed().as_secs_f64();
    let wall = Instant::now();
    let gpu_history = run_epochs(&mut t, rows, o.epochs, o.seed, optim.lr)?;
    let wall_s = wall.elapsed().as_secs_f64();
    let stats = t.stats().clone();
    let baseline = model::baseline_mae(&stats.normalize(&data.test), &stats);

    let cpu = if o.no_cpu {
        None
    } else {
        let wall = Instant::now();
        let mut c = FitSales::new(&Backend::Cpu, &data, start, optim, None, DEFAULT_BATCH)?;
        let history = run_epochs(&mut c, rows, o.epochs, o.seed, optim.lr)?;
        Some((history, wall.elapsed().as_secs_f64()))
    };

    let final_mae = gpu_history.last().map(|h| h.1).unwrap_or(f64::NAN);
    let cpu_mae = cpu.as_ref().and_then(|(h, _)| h.last().map(|h| h.1));
    // The two runs take the same steps but round differently; over tens of thousands of steps the
    // difference grows until single epochs' MAEs (which move 10–20 % from epoch to epoch) decorrelate.
    // So also: each epoch's relative difference, and the means over the last ten epochs.
    let last_mean = |h: &[(f64, f64)]| {
        let tail = &h[h.len().saturating_sub(10)..];
        tail.iter().map(|e| e.1).sum::<f64>() / tail.len().max(1) as f64
    };
    let by_epoch: Option<Vec<f64>> =
        cpu.as_ref().map(|(h, _)| gpu_history.iter().zip(h).map(|(g, c)| (g.1 - c.1).abs() / c.1).collect());
    let report = serde_json::json!({
        "device": "cuda:0", "device_name": gpu.describe(),
        "table": o.table.display().to_string(),
        "train_rows": rows, "test_rows": data.test.rows, "features": shape.inputs,
        "model": format!("Linear({},{}) -> ReLU -> Linear({},1), MSE", shape.inputs, shape.hidden, shape.hidden),
        "optimizer": optim.describe(), "batch": DEFAULT_BATCH, "epochs": o.epochs, "steps": steps,
        "load_s": load_s,
        "setup_s": setup_s,
        "train_device_ms": device_ms,
        "us_per_step_device": device_ms * 1e3 / steps as f64,
        "train_wall_s": wall_s,
        "baseline_mae": baseline,
        "test_mae": final_mae,
        "mae_over_baseline": final_mae / baseline,
        "gpu_history": gpu_history.iter().map(|(l, m)| serde_json::json!({"train_mse": l, "test_mae": m})).collect::<Vec<_>>(),
        "cpu_test_mae": cpu_mae,
        "cpu_history": cpu.as_ref().map(|(h, _)| h.iter().map(|(l, m)| serde_json::json!({"train_mse": l, "test_mae": m})).collect::<Vec<_>>()),
        "cpu_wall_s": cpu.as_ref().map(|c| c.1),
        "gpu_vs_cpu_mae": cpu_mae.map(|c| (final_mae - c).abs() / c),
        "gpu_vs_cpu_mae_by_epoch": by_epoch,
        "test_mae_last10_mean": last_mean(&gpu_history),
        "cpu_test_mae_last10_mean": cpu.as_ref().map(|(h, _)| last_mean(h)),
    });
    if options.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "sales on {}: {} epochs × {} rows, batch {DEFAULT_BATCH} ({steps} steps)",
            gpu.describe(),
            o.epochs,
            rows
        );
        println!(
            "  training kernels {device_ms:.1} ms on the device ({:.2} µs/step); the command's loop {wall_s:.3} s",
            device_ms * 1e3 / steps as f64
        );
        println!("  test MAE {final_mae:.3} (baseline {baseline:.3}, ratio {:.3})", final_mae / baseline);
        if let (Some(c), Some((_, s))) = (cpu_mae, &cpu) {
            println!(
                "  CPU reference: test MAE {c:.3} ({:.2} % from the GPU's), {s:.1} s",
                100.0 * (final_mae - c).abs() / c
            );
        }
    }
    Ok(())
}
