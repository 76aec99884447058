//! A layer stack's training timed on the GPU: `bench fit` and `bench mnist`'s MLP run it. It trains the
//! stack for a number of epochs as the commands do (the same shuffle stream per repeat, the epoch's
//! graph replayed), evaluating the test split after each epoch, then times each phase of a step alone
//! and reports the figures as JSON or one line.

use super::gpu::{DenseKernels, GpuTrainer, StepPath};
use super::model::{Init, Loss, Network};
use super::{Figures, Samples, Setup};
use crate::device::Gpu;
use crate::harness::run::Trainer;
use crate::harness::timing::{median, time_on_device};
use crate::ops::cpu::SeededRng;
use crate::ops::optim::OptimConfig;
use anyhow::Result;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::sync::Arc;
use std::time::Instant;

/// What a bench trains, and how its report names it.
pub struct StackBench {
    /// The spec as the report prints it.
    pub layers: String,
    /// The network.
    pub net: Network,
    /// Its initialisation (drawn with `seed`).
    pub init: Init,
    /// The loss.
    pub loss: Loss,
    /// The optimizer, at one learning rate for every step.
    pub optim: OptimConfig,
    /// Passes over the training split.
    pub epochs: usize,
    /// Samples per step.
    pub batch: usize,
    /// Seed of the weights, the shuffle and dropout.
    pub seed: u64,
    /// Where the data came from, as the report prints it.
    pub source: String,
    /// The training split.
    pub train: Arc<Samples>,
    /// The split evaluated after each epoch.
    pub test: Arc<Samples>,
}

/// Trains `bench` `repeats` times on `gpu` and prints its report (JSON when `json`); `figures` turns the
/// test split's summed loss and outputs into the figures reported.
pub fn run(
    gpu: &Arc<Gpu>,
    repeats: usize,
    json: bool,
    bench: &StackBench,
    figures: &dyn Fn(f64, &[f32]) -> Figures,
) -> Result<()> {
    let StackBench { layers, net, init, loss, optim, epochs, batch, seed, source, train, test } = bench;
    let (optim, epochs, batch, seed) = (*optim, *epochs, *batch, *seed);
    let params = net.init(*init, seed);
    let setup_start = Instant::now();
    let setup = Setup {
        net: net.clone(),
        params: params.clone(),
        loss: *loss,
        optim,
        dropout_seed: seed as u32,
        splits: vec![train.clone(), test.clone()],
    };
    // Its own kernels from the first step: the bench times them, not the generic ones a new spec starts on.
    let mut trainer = GpuTrainer::with_kernels(gpu.clone(), setup, batch, StepPath::Auto, DenseKernels::Own)?;
    trainer.synchronize()?;
    let setup_s = setup_start.elapsed().as_secs_f64();
    let n_train = train.rows();
    let steps_per_epoch = n_train.div_ceil(batch);
    let lr = vec![optim.lr; steps_per_epoch];
    let path = trainer.path(batch);

    let mut runs = Vec::new();
    for _ in 0..repeats.max(1) {
        trainer.reset(&params)?;
        trainer.synchronize()?;
        let mut rng = SeededRng::seed_from_u64(seed);
        let mut order: Vec<u32> = (0..n_train as u32).collect();
        let start = Instant::now();
        let mut train_ms = 0.0;
        let mut figs = None;
        for _ in 0..epochs {
            order.shuffle(&mut rng);
            trainer.set_epoch(&order, &lr)?;
            train_ms += time_on_device(gpu, || trainer.launch_epoch(n_train, batch))?;
            let (loss, outputs) = trainer.evaluate(1)?;
            figs = Some(figures(loss, &outputs));
        }
        let figs = figs.unwrap_or_default();
        runs.push(serde_json::json!({
            "total_s": start.elapsed().as_secs_f64(),
            "train_device_ms": train_ms,
            "us_per_step": train_ms * 1e3 / (epochs * steps_per_epoch) as f64,
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
            let graph = crate::device::launch::capture_graph(&stream, &mut trainer, |t| {
                for _ in 0..64 {
                    match phase {
                        "forward" => t.launch_forward(0, 0, batch, true)?,
                        "loss" => t.launch_loss(0, 0, batch, true, 0)?,
                        "backward" => t.launch_backward(0, batch)?,
                        _ => t.launch_update(0)?,
                    }
                }
                Ok(())
            })?;
            let times = crate::harness::timing::time_graph_launches(gpu, &graph, 64, repeats.max(1))?;
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
        "data": source,
        "train_samples": n_train,
        "test_samples": test.rows(),
        "layers": layers,
        "parameters": net.param_count,
        "features": net.inputs(),
        "loss": loss.name(),
        "init": format!("{:?}", init).to_lowercase(),
        "optimizer": optim.describe(),
        "batch": batch,
        "epochs": epochs,
        "steps": epochs * steps_per_epoch,
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
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let measure = match (out["test_accuracy"].as_f64(), out["test_mae"].as_f64()) {
            (Some(a), _) => format!("test accuracy {:.2}%", 100.0 * a),
            (_, Some(mae)) => format!("test MAE {mae:.4}"),
            _ => "no test figure".into(),
        };
        println!(
            "{} on {}, {}, batch {}, {} epochs on {}: {:.3} s ({:.2} µs/step on the device; {}, launches {launches}), {measure}, {} bytes allocated during training",
            layers,
            source,
            optim.describe(),
            batch,
            epochs,
            gpu.describe(),
            out["total_s"].as_f64().unwrap_or(f64::NAN),
            out["us_per_step"].as_f64().unwrap_or(f64::NAN),
            path.name(),
            allocated,
        );
    }
    Ok(())
}
