//! `textnet bench nn`: what `nn` costs on a GPU, in two tables.
//!
//! Eager ops (not captured), one launch per op: `--ops` ops enqueued back to back; the host time an op
//! takes to enqueue (shape checks, the graph record, buffer allocation, the launch; the number the ≤ 5 µs
//! target is about), and the wall time an op takes once the GPU has finished them all.
//!
//! Training steps of models written with `nn` (cross-entropy, Adam at `textnet fit`'s default rate, batch
//! 64: `textnet bench fit`'s defaults), each run op by op and then captured once and replayed as a CUDA
//! graph (`CapturedStep`): the 784-128-10 MLP that `bench fit` trains by default, and a residual MLP. A
//! round is `--steps` steps, by default one Fashion-MNIST epoch at batch 64, and the device time of a
//! round (CUDA events around it) per step is the figure `bench fit` reports as `us_per_step`.
//!
//! How the step rows line up with `bench fit`: `bench fit` times each epoch's launches between two events
//! and divides the sum over its epochs by the steps, which gather a shuffled batch from the training set
//! resident on the GPU (the last of an epoch's 938 holds 32 images). Here every step trains on the same
//! batch of 64, resident on the GPU: `nn` has no gather on the device yet, and refilling the input from
//! the host each step would time the copy, not the step. So a row is the step without the batch's gather;
//! an epoch costs 938 of them (the "epoch ms" column; `bench fit`'s `train_device_ms` is ten epochs).
//!
//! Every figure is the median of `--repeats` rounds after one warm-up round (which, for a captured step,
//! runs it eagerly twice and captures it). `scripts/nn_eager_torch.py` prints PyTorch eager's rows under the
//! same workload names, timed the same way.

use super::cuda::Device;
use super::{CapturedStep, Linear, Module, Optimizer, Sequential, Tensor, no_grad, prefixed};
use crate::device::Gpu;
use crate::harness::timing::time_on_device;
use crate::ops::cpu::SeededRng;
use crate::ops::optim::OptimKind;
use crate::pipeline::{Bench, BenchOptions};
use anyhow::Result;
use rand::{RngExt, SeedableRng};
use std::sync::Arc;
use std::time::Instant;

/// Samples a training step takes: `bench fit`'s default `--batch`.
pub const BATCH: usize = 64;

/// Fashion-MNIST's training images, one epoch of `bench fit`.
const EPOCH_IMAGES: usize = 60_000;

/// The flags of `textnet bench nn`.
#[derive(clap::Args, Debug)]
pub struct NnBenchArgs {
    /// Ops enqueued per timed round of an eager op
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    pub ops: u32,
    /// Training steps per timed round (default: one Fashion-MNIST epoch at batch 64, as `bench fit`'s)
    #[arg(long, default_value_t = EPOCH_IMAGES.div_ceil(BATCH) as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub steps: u32,
}

/// `textnet bench nn`.
pub const BENCH: Bench = Bench {
    name: "nn",
    about: "Host and GPU time of nn's eager ops, and of MLP training steps eager and captured",
    args: <NnBenchArgs as clap::Args>::augment_args,
    run,
};

/// ReLU as a module (it has no parameters).
struct Relu;

impl Module for Relu {
    fn forward(&self, x: &Tensor) -> super::Result<Tensor> {
        x.relu()
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}

/// A residual block `x + f(x)`; `f`'s parameters are named under `f` (`f.0.weight`), as a PyTorch module
/// holding `f` as `self.f` names them.
pub struct Residual(pub Sequential);

impl Module for Residual {
    fn forward(&self, x: &Tensor) -> super::Result<Tensor> {
        x.add(&self.0.forward(x)?)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        prefixed("f", self.0.named_parameters())
    }

    fn set_training(&self, training: bool) {
        self.0.set_training(training);
    }
}

/// The 784-128-10 MLP `bench fit` trains by default: Linear(784, 128), ReLU, Linear(128, 10), drawn from
/// `rng` as PyTorch initialises it.
pub fn mlp(rng: &mut SeededRng) -> super::Result<Sequential> {
    Ok(Sequential::new().with(Linear::new(784, 128, true, rng)?).with(Relu).with(Linear::new(128, 10, true, rng)?))
}

/// The residual MLP: Linear(784, 256), two blocks x + Linear(256, 256)(ReLU(Linear(256, 256)(x))),
/// Linear(256, 10), drawn from `rng` as PyTorch initialises it.
pub fn residual_mlp(rng: &mut SeededRng) -> super::Result<Sequential> {
    let mut block = || -> super::Result<Residual> {
        let f = Sequential::new()
            .with(Linear::new(256, 256, true, rng)?)
            .with(Relu)
            .with(Linear::new(256, 256, true, rng)?);
        Ok(Residual(f))
    };
    let (first, second) = (block()?, block()?);
    Ok(Sequential::new()
        .with(Linear::new(784, 256, true, rng)?)
        .with(first)
        .with(second)
        .with(Linear::new(256, 10, true, rng)?))
}

/// One training step of `model` on inputs `x` with class ids `ids` (a tensor, so a captured step reads
/// each replay's): forward, cross-entropy, backward, `optimizer`'s update. Returns the loss.
pub fn train_step(model: &dyn Module, optimizer: &mut Optimizer, x: &Tensor, ids: &Tensor) -> super::Result<Tensor> {
    optimizer.zero_grad();
    let loss = model.forward(x)?.cross_entropy_ids(ids, None)?;
    loss.backward()?;
    optimizer.step()?;
    Ok(loss)
}

/// One workload's median times per op or step, in µs.
struct Row {
    workload: String,
    /// What one is: "op" or "step".
    unit: &'static str,
    per_round: usize,
    /// Host time to enqueue.
    host_us: f64,
    /// Wall time until the GPU is done.
    wall_us: f64,
    /// Device time between CUDA events around the round.
    device_us: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `round` (which enqueues `count` ops or steps and returns) `repeats` times after a warm-up: the
/// host time of the enqueueing, the wall time until the GPU is done and the device time between events
/// recorded before and after, each per op or step.
fn time(
    device: &Device,
    repeats: usize,
    (workload, unit, count): (String, &'static str, usize),
    mut round: impl FnMut() -> Result<()>,
) -> Result<Row> {
    round()?;
    device.synchronize()?;
    let (mut host, mut wall, mut on_device) = (Vec::new(), Vec::new(), Vec::new());
    let per = |seconds: f64| seconds * 1e6 / count as f64;
    for _ in 0..repeats {
        let started = Instant::now();
        let mut enqueued = 0.0;
        let ms = time_on_device(&device.gpu, || {
            round()?;
            enqueued = started.elapsed().as_secs_f64();
            Ok(())
        })?;
        device.synchronize()?;
        host.push(per(enqueued));
        wall.push(per(started.elapsed().as_secs_f64()));
        on_device.push(per(ms / 1e3));
    }
    Ok(Row {
        workload,
        unit,
        per_round: count,
        host_us: median(host),
        wall_us: median(wall),
        device_us: median(on_device),
    })
}

fn run(gpu: &Arc<Gpu>, options: &BenchOptions, matches: &clap::ArgMatches) -> Result<()> {
    use clap::FromArgMatches;
    let args = NnBenchArgs::from_arg_matches(matches)?;
    let device = Device::on(Arc::clone(gpu))?;
    let (ops, steps, repeats) = (args.ops as usize, args.steps as usize, options.repeats);
    let mut rng = SeededRng::seed_from_u64(1);
    let mut values = |n: usize| (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect::<Vec<f32>>();
    let small = Tensor::from_vec(values(64 * 64), &[64, 64])?.to_device(&device)?;
    let mut rows = Vec::new();

    rows.push(time(&device, repeats, ("mul_scalar 64×64, no grad".into(), "op", ops), || {
        let _off = no_grad();
        let mut x = small.clone();
        for _ in 0..ops {
            x = x.mul_scalar(0.999)?;
        }
        Ok(())
    })?);
    rows.push(time(&device, repeats, ("add 64×64 (inputs need no grad)".into(), "op", ops), || {
        let mut x = small.clone();
        for _ in 0..ops {
            x = x.add(&small)?;
        }
        Ok(())
    })?);

    // One batch of MNIST-sized inputs and its class ids, resident on the GPU for every step.
    let x = Tensor::from_vec(values(BATCH * 784), &[BATCH, 784])?.to_device(&device)?;
    let ids = Tensor::from_vec((0..BATCH).map(|i| (i % 10) as f32).collect(), &[BATCH])?.to_device(&device)?;
    let lr = OptimKind::Adam.default_lr();
    let mut init = SeededRng::seed_from_u64(2);
    let models =
        [("MLP 784-128-10 step", mlp(&mut init)?), ("residual MLP 784-256-2×res-10 step", residual_mlp(&mut init)?)];
    for (name, model) in &models {
        for p in model.parameters() {
            p.move_to_device(&device)?;
        }
        let mut adam = Optimizer::adam(model.parameters(), lr)?;
        rows.push(time(&device, repeats, (name.to_string(), "step", steps), || {
            for _ in 0..steps {
                train_step(model, &mut adam, &x, &ids)?;
            }
            Ok(())
        })?);
        let mut captured = CapturedStep::new(&device, &[&x, &ids])?;
        rows.push(time(&device, repeats, (format!("{name}, captured"), "step", steps), || {
            for _ in 0..steps {
                captured.run(|| train_step(model, &mut adam, &x, &ids))?;
            }
            Ok(())
        })?);
        anyhow::ensure!(captured.is_captured(), "the bench's {name} was not captured");
    }

    if options.json {
        let rows: Vec<_> = (rows.iter())
            .map(|r| {
                serde_json::json!({"workload": r.workload, "unit": r.unit, "per_round": r.per_round,
                    "host_us": r.host_us, "wall_us": r.wall_us, "device_us": r.device_us})
            })
            .collect();
        let steps = serde_json::json!({"batch": BATCH, "optimizer": format!("adam lr {lr}"), "loss": "cross_entropy"});
        println!("{}", serde_json::json!({"bench": "nn", "device": device.describe(), "steps": steps, "rows": rows}));
        return Ok(());
    }
    println!("nn on {} (median of {repeats} rounds after a warm-up)", device.describe());
    let header = |unit: &str, count: &str, last: &str| {
        println!();
        println!("{:<48} {:>6} {:>13} {:>13} {:>15} {last:>10}", unit, count, "host µs", "wall µs", "device µs");
    };
    header("eager op (not captured)", "ops", "");
    for r in rows.iter().filter(|r| r.unit == "op") {
        println!("{:<48} {:>6} {:>13.2} {:>13.2} {:>15.2}", r.workload, r.per_round, r.host_us, r.wall_us, r.device_us);
    }
    header(&format!("training step, batch {BATCH}, Adam lr {lr}"), "steps", "epoch ms");
    for r in rows.iter().filter(|r| r.unit == "step") {
        let epoch_ms = r.device_us * EPOCH_IMAGES.div_ceil(BATCH) as f64 / 1e3;
        println!(
            "{:<48} {:>6} {:>13.2} {:>13.2} {:>15.2} {epoch_ms:>10.2}",
            r.workload, r.per_round, r.host_us, r.wall_us, r.device_us
        );
    }
    println!();
    println!(
        "Times are per op or per step. A step's device µs is `bench fit`'s us_per_step (a step on one resident \
         batch, without bench fit's gather of a shuffled batch); epoch ms is {} steps of it, a tenth of bench \
         fit's train_device_ms.",
        EPOCH_IMAGES.div_ceil(BATCH)
    );
    Ok(())
}
