//! `textnet bench fit`: a spec trained on the GPU, on Fashion-MNIST as `textnet bench mnist` times the
//! hand-fused MLP (same data, batch, optimizer, shuffle stream and, with `--init xavier`, the same initial
//! weights), or on a table as `textnet bench sales` times the hand-fused sales model; beside
//! `benches/fit_torch.py --train`.

use super::cli::{TableArgs, figures};
use super::data::{self as fit_data, Request, Source};
use super::gpu::{GpuTrainer, StepPath};
use super::model::{Init, Network};
use super::spec;
use super::{FitTrainer, Setup};
use crate::cpu::SeededRng;
use crate::device::Gpu;
use crate::ops::optim::OptimArgs;
use crate::timing::{median, time_on_device};
use anyhow::Result;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::sync::Arc;
use std::time::Instant;

/// The flags of `bench fit`.
#[derive(clap::Args, Debug)]
pub struct FitBenchArgs {
    /// The model, as `textnet fit --layers` takes it
    #[arg(long, default_value = "Linear(784, 128), ReLU, Linear(128, 10)")]
    pub layers: String,
    /// Initial weights (`xavier` draws what `textnet mnist` draws for its MLP)
    #[arg(long, value_enum, default_value_t = Init::Xavier)]
    pub init: Init,
    #[command(flatten)]
    /// The optimizer flags.
    pub optim: OptimArgs,
    /// Passes over the training images
    #[arg(long, default_value_t = 10)]
    pub epochs: usize,
    /// Samples per step
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Seed of the weights, the shuffle and dropout (0 is `bench mnist`'s)
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    /// A table to train on instead of Fashion-MNIST.
    pub tabular: TableArgs,
}

/// `textnet bench fit`.
pub fn run(gpu: &Arc<Gpu>, options: &crate::pipeline::BenchOptions, args: &FitBenchArgs) -> Result<()> {
    use crate::datasets::mnist::Dataset;
    let spec = spec::parse(&args.layers)?;
    let source = match args.tabular.source()? {
        Some(table) => table,
        None => Source::Images { dataset: Dataset::Fashion, dir: None },
    };
    let request = Request { loss: None, seed: args.seed, train_limit: None, val_split: None };
    let data = fit_data::load(&source, &spec, request, &|note| eprintln!("{note}"))?;
    let net = Network::new(&spec, data.input)?;
    let (train, test) = (Arc::new(data.train.clone()), Arc::new(data.test.clone()));
    let optim = args.optim.config()?;
    let params = net.init(args.init, args.seed);
    let setup_start = Instant::now();
    let setup = Setup {
        net: net.clone(),
        params: params.clone(),
        loss: data.loss,
        optim,
        dropout_seed: args.seed as u32,
        splits: vec![train.clone(), test.clone()],
    };
    let mut trainer = GpuTrainer::new(gpu.clone(), setup, args.batch)?;
    trainer.synchronize()?;
    let setup_s = setup_start.elapsed().as_secs_f64();
    let n_train = train.rows();
    let steps_per_epoch = n_train.div_ceil(args.batch);
    let lr = vec![optim.lr; steps_per_epoch];
    let path = trainer.path(args.batch);

    let mut runs = Vec::new();
    for _ in 0..options.repeats.max(1) {
        trainer.reset(&params)?;
        trainer.synchronize()?;
        let mut rng = SeededRng::seed_from_u64(args.seed);
        let mut order: Vec<u32> = (0..n_train as u32).collect();
        let start = Instant::now();
        let mut train_ms = 0.0;
        let mut figs = None;
        for _ in 0..args.epochs {
            order.shuffle(&mut rng);
            trainer.set_epoch(&order, &lr)?;
            train_ms += time_on_device(gpu, || trainer.launch_epoch(n_train, args.batch))?;
            let (loss, outputs) = trainer.evaluate(1)?;
            figs = Some(figures(&data.target, &test, &data.test_values, loss, &outputs));
        }
        let figs = figs.unwrap_or_default();
        runs.push(serde_json::json!({
            "total_s": start.elapsed().as_secs_f64(),
            "train_device_ms": train_ms,
            "us_per_step": train_ms * 1e3 / (args.epochs * steps_per_epoch) as f64,
            "test_accuracy": figs.accuracy,
            "test_mae": figs.mae,
            "test_loss": figs.loss,
        }));
    }
    // Measured before the phase graphs below, which are not training and take their own memory.
    let allocated = trainer.device_bytes_allocated_by_training();
    // Each phase of a step alone on the layer kernels: a graph of 64 of it on a full batch, replayed.
    let mut phases = serde_json::Map::new();
    if path == StepPath::Layers {
        for phase in ["forward", "loss", "backward", "update"] {
            let stream = gpu.stream.clone();
            let graph = crate::device::capture_graph(&stream, &mut trainer, |t| {
                for _ in 0..64 {
                    match phase {
                        "forward" => t.launch_forward(0, 0, args.batch, true)?,
                        "loss" => t.launch_loss(0, 0, args.batch, true, 0)?,
                        "backward" => t.launch_backward(0, args.batch)?,
                        _ => t.launch_update(0)?,
                    }
                }
                Ok(())
            })?;
            let times = crate::timing::time_graph_launches(gpu, &graph, 64, options.repeats.max(1))?;
            phases.insert(phase.into(), median(&times).into());
        }
    }
    let field = |key: &str| -> Vec<f64> { runs.iter().map(|r| r[key].as_f64().unwrap_or(f64::NAN)).collect() };
    let last = |key: &str| runs.last().map(|r| r[key].clone());
    let launches = match path {
        StepPath::WholeEpoch => "one an epoch".to_string(),
        _ => format!("{} a step", trainer.launches_per_step()),
    };
    let out = serde_json::json!({
        "device": "cuda:0",
        "device_name": gpu.describe(),
        "data": data.source,
        "train_samples": n_train,
        "test_samples": test.rows(),
        "layers": args.layers,
        "parameters": net.param_count,
        "features": net.inputs(),
        "loss": data.loss.name(),
        "init": format!("{:?}", args.init).to_lowercase(),
        "optimizer": optim.describe(),
        "batch": args.batch,
        "epochs": args.epochs,
        "steps": args.epochs * steps_per_epoch,
        "path": path.name(),
        "setup_s": setup_s,
        "total_s": median(&field("total_s")),
        "train_device_ms": median(&field("train_device_ms")),
        "us_per_step": median(&field("us_per_step")),
        "test_accuracy": last("test_accuracy"),
        "test_mae": last("test_mae"),
        "launches": launches,
        "launches_per_step": (path == StepPath::Layers).then(|| trainer.launches_per_step()),
        "arena_bytes": trainer.arena_bytes(),
        "device_bytes_allocated_during_training": allocated,
        "epoch_graph_bytes": trainer.graph_bytes(),
        "us_per_phase": phases,
        "runs": runs,
    });
    if options.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let measure = match (out["test_accuracy"].as_f64(), out["test_mae"].as_f64()) {
            (Some(a), _) => format!("test accuracy {:.2}%", 100.0 * a),
            (_, Some(mae)) => format!("test MAE {mae:.4}"),
            _ => "no test figure".into(),
        };
        println!(
            "{} on {}, {}, batch {}, {} epochs on {}: {:.3} s ({:.2} µs/step on the device; {}, launches {launches}), {measure}, {} bytes allocated during training",
            args.layers,
            data.source,
            optim.describe(),
            args.batch,
            args.epochs,
            gpu.describe(),
            out["total_s"].as_f64().unwrap_or(f64::NAN),
            out["us_per_step"].as_f64().unwrap_or(f64::NAN),
            path.name(),
            allocated,
        );
    }
    Ok(())
}
