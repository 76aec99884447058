//! `textnet bench mnist`: the MNIST classifiers' speed and accuracy on the GPU, beside `benches/torch_mnist.py`.

use crate::device::Gpu;
use crate::harness::timing::{median, time_graph_launches, time_on_device};
use crate::ops::cpu::SeededRng;
use crate::ops::optim::{OptimConfig, OptimKind};
use anyhow::Result;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::sync::Arc;
use std::time::Instant;

/// The runs of both models: the PyTorch baseline (benches/torch_mnist.py) trains the same.
const BENCH_EPOCHS: usize = 10;
const BENCH_BATCH: usize = 64;

/// The flags of `bench mnist`.
#[derive(clap::Args, Debug)]
pub struct MnistBenchArgs {
    /// The model to time
    #[arg(long, value_enum, default_value_t = super::ModelKind::Mlp)]
    pub model: super::ModelKind,
}

/// `textnet bench mnist`: the MLP's or the CNN's run. The MLP trains as a layer stack, so its run is
/// `nn::stack::bench`'s, as `bench fit` at its defaults: 10 epochs of Fashion-MNIST, batch 64, Adam 1e-3,
/// `Linear(784, 128), ReLU, Linear(128, 10)` with the MLP's Xavier initialisation (seed 0), beside
/// `benches/torch_mnist.py`.
pub fn run(gpu: &Arc<Gpu>, options: &crate::pipeline::BenchOptions, args: &MnistBenchArgs) -> Result<()> {
    match args.model {
        super::ModelKind::Mlp => mlp_bench(gpu, options.repeats, options.json),
        super::ModelKind::Cnn => cnn_bench(gpu, options.json),
    }
}

/// `textnet bench mnist --model mlp` (see `run`).
fn mlp_bench(gpu: &Arc<Gpu>, repeats: usize, json: bool) -> Result<()> {
    use super::model::{Activation, MlpShape};
    use crate::datasets::mnist::{self, Dataset};
    use crate::nn::stack::bench::StackBench;
    use crate::nn::stack::model::{Init, Loss};
    use crate::nn::stack::{Figures, Target, spec};
    let data = mnist::load(Dataset::Fashion, None, &|note| eprintln!("{note}"))?;
    let classes = Dataset::Fashion.class_names().len();
    let shape = MlpShape { inputs: data.train.pixels, hidden: 128, classes, activation: Activation::Relu };
    let net = super::mlp::network(shape)?;
    let bench = StackBench {
        layers: spec::text(&net.layers),
        net,
        init: Init::Xavier,
        loss: Loss::Ce,
        optim: OptimConfig::new(OptimKind::Adam),
        epochs: BENCH_EPOCHS,
        batch: BENCH_BATCH,
        seed: 0,
        source: format!("{} from {}", Dataset::Fashion.title(), data.dir.display()),
        train: Arc::new(super::mlp::samples(&data.train)),
        test: Arc::new(super::mlp::samples(&data.test)),
    };
    let Target::Classes(labels) = &bench.test.target else { unreachable!("an image's target is its class") };
    let labels = labels.clone();
    crate::nn::stack::bench::run(gpu, repeats, json, &bench, &|loss, outputs| {
        Figures::of_classes(&labels, classes, loss, outputs)
    })
}

/// `textnet bench mnist --model cnn`: 10 epochs of Fashion-MNIST with the CNN (batch 64, Adam 1e-3) on the
/// GPU, evaluating the test split after each epoch as `textnet mnist` does; beside `benches/torch_mnist.py
/// --model cnn`. Reports the training time (device events around each epoch's graph; the first epoch
/// captures it), the wall time of the 10 epochs with the evaluations, and the test accuracy per epoch.
pub fn cnn_bench(gpu: &Arc<Gpu>, json: bool) -> Result<()> {
    use super::cnn::{CnnParams, CnnShape};
    use super::cnn_gpu::GpuCnn;
    use crate::datasets::mnist::{self, Dataset};
    let load_start = Instant::now();
    let data = mnist::load(Dataset::Fashion, None, &|note| eprintln!("{note}"))?;
    let load_s = load_start.elapsed().as_secs_f64();
    let optim = OptimConfig::new(OptimKind::Adam);
    let setup = Instant::now();
    let mut trainer = GpuCnn::new(gpu.clone(), CnnParams::init(CnnShape::MNIST, 0), optim, &data.train, &data.test)?;
    let setup_s = setup.elapsed().as_secs_f64();
    let n_train = data.train.len();
    let mut rng = SeededRng::seed_from_u64(0);
    let mut order: Vec<u32> = (0..n_train as u32).collect();
    let rates = vec![optim.lr; n_train.div_ceil(BENCH_BATCH)];
    let mut epochs = Vec::with_capacity(BENCH_EPOCHS);
    let start = Instant::now();
    let mut last = None;
    for epoch in 1..=BENCH_EPOCHS {
        order.shuffle(&mut rng);
        let mut loss = 0.0;
        let train_ms = time_on_device(gpu, || {
            loss = trainer.train_epoch(&order, BENCH_BATCH, &rates)?;
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
