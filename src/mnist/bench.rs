//! `textnet bench mnist`: the MNIST step's speed and accuracy on the GPU, beside `benches/torch_mnist.py`.

use super::MnistTrainer;
use super::gpu::{EVAL_CHUNK, GpuTrainer};
use super::model::{Activation, MlpParams, MlpShape};
use crate::cpu::SeededRng;
use crate::device::Gpu;
use crate::ops::optim::{OptimConfig, OptimKind};
use crate::timing::{median, time_graph_launches, time_on_device};
use anyhow::Result;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::sync::Arc;
use std::time::Instant;

/// The benchmark's configuration: the PyTorch baseline (benches/torch_mnist.py) trains the same.
const BENCH_EPOCHS: usize = 10;
const BENCH_BATCH: usize = 64;
const BENCH_HIDDEN: usize = 128;

/// `textnet bench mnist`: 10 epochs of Fashion-MNIST (batch 64, Adam 1e-3, 784 → 128 relu → 10) with the
/// data on the GPU, evaluating the test split after each epoch, as `textnet mnist` does. Reports the wall
/// time of the 10 epochs (the first run includes capturing the epoch's graph), per-epoch wall and device
/// times, test accuracy, and a per-step breakdown. Repeats from fresh parameters; reports the median.
/// The flags of `bench mnist`.
#[derive(clap::Args, Debug)]
pub struct MnistBenchArgs {
    /// The model to time
    #[arg(long, value_enum, default_value_t = super::ModelKind::Mlp)]
    pub model: super::ModelKind,
}

/// `textnet bench mnist`: the MLP's or the CNN's run.
pub fn run(gpu: &Arc<Gpu>, options: &crate::pipeline::BenchOptions, args: &MnistBenchArgs) -> Result<()> {
    match args.model {
        super::ModelKind::Mlp => bench(gpu, options.repeats, options.json),
        super::ModelKind::Cnn => cnn_bench(gpu, options.json),
    }
}

/// `textnet bench mnist`: times training epochs of the MLP on (Fashion-)MNIST (`repeats` repeats, median; a table, or
/// one JSON object with `json`).
pub fn bench(gpu: &Arc<Gpu>, repeats: usize, json: bool) -> Result<()> {
    use super::data::{self, Dataset};
    let repeats = repeats.max(1);
    let load_start = Instant::now();
    let data = data::load(Dataset::Fashion, None, &|note| eprintln!("{note}"))?;
    let load_s = load_start.elapsed().as_secs_f64();
    let shape = MlpShape {
        inputs: super::idx::PIXELS,
        hidden: BENCH_HIDDEN,
        classes: super::idx::CLASSES,
        activation: Activation::Relu,
    };
    let optim = OptimConfig::new(OptimKind::Adam);
    let params = MlpParams::init(shape, 0);
    let upload_start = Instant::now();
    let mut trainer = GpuTrainer::new(gpu.clone(), params.clone(), optim, &data.train, &data.test)?;
    trainer.synchronize()?;
    let setup_s = upload_start.elapsed().as_secs_f64();
    let n_train = data.train.len();
    let steps_per_epoch = n_train.div_ceil(BENCH_BATCH);

    let mut runs = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        trainer.reset(&params)?;
        trainer.synchronize()?;
        let mut rng = SeededRng::seed_from_u64(0);
        let mut order: Vec<u32> = (0..n_train as u32).collect();
        let start = Instant::now();
        let mut epochs = Vec::with_capacity(BENCH_EPOCHS);
        let mut capture_ms = 0.0;
        let mut last = None;
        for epoch in 1..=BENCH_EPOCHS {
            let epoch_start = Instant::now();
            order.shuffle(&mut rng);
            if epoch == 1 {
                let captured = Instant::now();
                trainer.prepare_epoch(n_train, BENCH_BATCH)?;
                capture_ms = captured.elapsed().as_secs_f64() * 1e3;
            }
            trainer.set_order(&order)?;
            trainer.zero_loss()?;
            let train_ms = time_on_device(gpu, || trainer.enqueue_epoch(n_train, BENCH_BATCH))?;
            let train_loss = trainer.read_loss()? / n_train as f64;
            let mut eval = None;
            let eval_ms = time_on_device(gpu, || {
                eval = Some(trainer.evaluate()?);
                Ok(())
            })?;
            let eval = eval.unwrap();
            epochs.push(serde_json::json!({
                "epoch": epoch,
                "wall_ms": epoch_start.elapsed().as_secs_f64() * 1e3,
                "train_device_ms": train_ms,
                "eval_device_ms": eval_ms,
                "train_loss": train_loss,
                "test_loss": eval.mean_loss(),
                "test_accuracy": eval.accuracy(),
            }));
            last = Some(eval);
        }
        let total_s = start.elapsed().as_secs_f64();
        let eval = last.unwrap();
        let train_device_ms: f64 = epochs.iter().map(|e| e["train_device_ms"].as_f64().unwrap()).sum();
        runs.push(serde_json::json!({
            "total_s": total_s,
            "graph_capture_ms": capture_ms,
            "train_device_ms": train_device_ms,
            "us_per_step": train_device_ms * 1e3 / (BENCH_EPOCHS * steps_per_epoch) as f64,
            "test_accuracy": eval.accuracy(),
            "test_loss": eval.mean_loss(),
            "epochs": epochs,
        }));
    }
    let field = |key: &str| -> Vec<f64> { runs.iter().map(|r| r[key].as_f64().unwrap()).collect() };
    let totals = field("total_s");
    let us_per_step = median(&field("us_per_step"));

    // Each kernel alone: a graph of 128 launches of it on a full batch, replayed.
    trainer.set_order(&(0..n_train as u32).collect::<Vec<_>>())?;
    trainer.launch_step(BENCH_BATCH, 0)?;
    let mut per_kernel = Vec::new();
    for (name, which) in [("mnist_forward", 0), ("mnist_backward", 1), ("mnist_update", 2)] {
        let graph = trainer.capture(|t| {
            for _ in 0..128 {
                match which {
                    0 => t.launch_forward(BENCH_BATCH, 0)?,
                    1 => t.launch_backward(BENCH_BATCH, 0)?,
                    _ => t.launch_update()?,
                }
            }
            Ok(())
        })?;
        let times = time_graph_launches(gpu, &graph, 128, repeats)?;
        per_kernel.push(serde_json::json!({"kernel": name, "us_median": median(&times), "us": times}));
    }
    let layout = trainer.layout;
    let (fx, fy) = layout.forward_grid(BENCH_BATCH);
    let steps = BENCH_EPOCHS * steps_per_epoch;
    let bytes = layout.bytes_per_step(BENCH_BATCH);
    let flops = layout.flops_per_step(BENCH_BATCH);
    let out = serde_json::json!({
        "device": "cuda:0", "device_name": gpu.describe(),
        "dataset": Dataset::Fashion.title(),
        "data_dir": data.dir.display().to_string(),
        "train_samples": n_train,
        "test_samples": data.test.len(),
        "model": format!("{} → {} relu → {}", shape.inputs, shape.hidden, shape.classes),
        "optimizer": optim.describe(),
        "batch": BENCH_BATCH,
        "epochs": BENCH_EPOCHS,
        "load_s": load_s,
        "setup_s": setup_s,
        "total_s": median(&totals),
        "total_s_runs": totals,
        "test_accuracy": runs.last().unwrap()["test_accuracy"],
        "us_per_step": us_per_step,
        "breakdown": {
            "steps": steps,
            "kernels_per_step": 3,
            "graph_nodes_per_epoch": GpuTrainer::graph_nodes(n_train, BENCH_BATCH),
            "graph_launches": BENCH_EPOCHS,
            "eval_launches_per_epoch": data.test.len().div_ceil(EVAL_CHUNK),
            "grids": {
                "mnist_forward": [fx, fy],
                "mnist_backward": layout.backward_grid,
                "mnist_update": layout.update_grid,
            },
            "shared_bytes": {"mnist_forward": layout.forward_shared, "mnist_backward": layout.backward_shared},
            "bytes_per_step": bytes,
            "flops_per_step": flops,
            "gflops_per_s": flops / (us_per_step * 1e3),
            "per_kernel": per_kernel,
            "resources (name, registers, local bytes)": trainer.kernel_resources(),
        },
        "runs": runs,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "Fashion-MNIST {} on {}: batch {BENCH_BATCH}, {}, {BENCH_EPOCHS} epochs",
            out["model"].as_str().unwrap(),
            gpu.describe(),
            optim.describe()
        );
        for (k, r) in runs.iter().enumerate() {
            println!(
                "run {}: {:.3} s for {BENCH_EPOCHS} epochs (graph capture {:.1} ms), {:.2} µs/step on the device, test accuracy {:.2}%",
                k + 1,
                r["total_s"].as_f64().unwrap(),
                r["graph_capture_ms"].as_f64().unwrap(),
                r["us_per_step"].as_f64().unwrap(),
                100.0 * r["test_accuracy"].as_f64().unwrap()
            );
        }
        println!(
            "{:>5} {:>10} {:>14} {:>13} {:>11} {:>9}",
            "epoch", "wall ms", "train dev. ms", "eval dev. ms", "train loss", "test acc"
        );
        for e in runs[0]["epochs"].as_array().unwrap() {
            println!(
                "{:>5} {:>10.2} {:>14.2} {:>13.2} {:>11.4} {:>8.2}%",
                e["epoch"],
                e["wall_ms"].as_f64().unwrap(),
                e["train_device_ms"].as_f64().unwrap(),
                e["eval_device_ms"].as_f64().unwrap(),
                e["train_loss"].as_f64().unwrap(),
                100.0 * e["test_accuracy"].as_f64().unwrap()
            );
        }
        println!(
            "median {:.3} s for {BENCH_EPOCHS} epochs; {steps} steps × 3 kernels, {} graph nodes per epoch; \
             {:.2} MB and {:.1} MFLOP per step",
            median(&totals),
            GpuTrainer::graph_nodes(n_train, BENCH_BATCH),
            bytes / 1e6,
            flops / 1e6
        );
        for k in &per_kernel {
            println!("{k}");
        }
        for (name, registers, local_bytes) in trainer.kernel_resources() {
            println!("{name}: {registers} registers, {local_bytes} bytes of local memory per thread");
        }
    }
    Ok(())
}

/// `textnet bench mnist --model cnn`: 10 epochs of Fashion-MNIST with the CNN (batch 64, Adam 1e-3) on the
/// GPU, evaluating the test split after each epoch as `textnet mnist` does; beside `benches/torch_mnist.py
/// --model cnn`. Reports the training time (device events around each epoch's graph; the first epoch
/// captures it), the wall time of the 10 epochs with the evaluations, and the test accuracy per epoch.
pub fn cnn_bench(gpu: &Arc<Gpu>, json: bool) -> Result<()> {
    use super::cnn::{CnnParams, CnnShape};
    use super::cnn_gpu::GpuCnn;
    use super::data::{self, Dataset};
    let load_start = Instant::now();
    let data = data::load(Dataset::Fashion, None, &|note| eprintln!("{note}"))?;
    let load_s = load_start.elapsed().as_secs_f64();
    let optim = OptimConfig::new(OptimKind::Adam);
    let setup = Instant::now();
    let mut trainer = GpuCnn::new(gpu.clone(), CnnParams::init(CnnShape::MNIST, 0), optim, &data.train, &data.test)?;
    let setup_s = setup.elapsed().as_secs_f64();
    let n_train = data.train.len();
    let mut rng = SeededRng::seed_from_u64(0);
    let mut order: Vec<u32> = (0..n_train as u32).collect();
    let mut epochs = Vec::with_capacity(BENCH_EPOCHS);
    let start = Instant::now();
    let mut last = None;
    for epoch in 1..=BENCH_EPOCHS {
        order.shuffle(&mut rng);
        let mut loss = 0.0;
        let train_ms = time_on_device(gpu, || {
            loss = trainer.train_epoch(&order, BENCH_BATCH)?;
            Ok(())
        })?;
        let eval = trainer.evaluate()?;
        epochs.push(serde_json::json!({
            "epoch": epoch, "train_device_ms": train_ms, "train_loss": loss / n_train as f64,
            "test_loss": eval.mean_loss(), "test_accuracy": eval.accuracy(),
        }));
        last = Some(eval);
    }
    let total_s = start.elapsed().as_secs_f64();
    let eval = last.expect("ten epochs");
    // Each kernel alone: a graph of 128 launches of it on a full batch, replayed (after the run, so the
    // timing launches do not change its parameters).
    let mut per_kernel = Vec::new();
    for (kernel, name) in ["cnn_forward", "cnn_backward", "cnn_update"].into_iter().enumerate() {
        let graph = trainer.kernel_graph(kernel, BENCH_BATCH, 128)?;
        let times = time_graph_launches(gpu, &graph, 128, 7)?;
        per_kernel.push(serde_json::json!({"kernel": name, "us_median": median(&times), "us": times}));
    }
    let train_ms: f64 = epochs.iter().map(|e| e["train_device_ms"].as_f64().unwrap_or(0.0)).sum();
    let steps = BENCH_EPOCHS * n_train.div_ceil(BENCH_BATCH);
    let out = serde_json::json!({
        "device": "cuda:0", "device_name": gpu.describe(),
        "dataset": Dataset::Fashion.title(),
        "model": "conv3x3(1→8) relu pool → conv3x3(8→16) relu pool → 784 → 64 relu → 10",
        "optimizer": optim.describe(), "batch": BENCH_BATCH, "epochs": BENCH_EPOCHS,
        "load_s": load_s, "setup_s": setup_s,
        "train_device_ms": train_ms, "us_per_step": train_ms * 1e3 / steps as f64,
        "total_s": total_s,
        "test_accuracy": eval.accuracy(), "test_loss": eval.mean_loss(),
        "per_epoch": epochs,
        "per_kernel": per_kernel,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for k in &per_kernel {
            println!(
                "  {} alone: {:.1} µs",
                k["kernel"].as_str().unwrap_or(""),
                k["us_median"].as_f64().unwrap_or(0.0)
            );
        }
        println!(
            "mnist cnn on {}: 10 epochs {:.3} s of training on the device ({:.1} µs/step), {total_s:.3} s with evaluations; test accuracy {:.2} %",
            gpu.describe(),
            train_ms / 1e3,
            train_ms * 1e3 / steps as f64,
            100.0 * eval.accuracy()
        );
    }
    Ok(())
}
