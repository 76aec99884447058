//! `textnet bench nn`: what an op of `nn` costs in eager mode (not captured), one launch per op. For each
//! workload, `--ops` ops are enqueued back to back: the host time an op takes to enqueue (shape checks,
//! the graph record, buffer allocation, the launch; the number the ≤ 5 µs target is about), and the wall
//! time an op takes once the GPU has finished them all. Median of `--repeats`, after one warm-up round.
//! The last row is the MLP's training step captured once and replayed as a CUDA graph (`CapturedStep`).

use super::cuda::Device;
use super::{Linear, Module, Optimizer, Tensor, no_grad};
use crate::cpu::SeededRng;
use crate::device::Gpu;
use crate::pipeline::{Bench, BenchOptions};
use anyhow::Result;
use rand::{RngExt, SeedableRng};
use std::sync::Arc;
use std::time::Instant;

/// The flags of `textnet bench nn`.
#[derive(clap::Args, Debug)]
pub struct NnBenchArgs {
    /// Ops enqueued per timed round
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    pub ops: u32,
}

/// `textnet bench nn`.
pub const BENCH: Bench = Bench {
    name: "nn",
    about: "Host and GPU time of one eager op of nn's device tensors (not captured)",
    args: <NnBenchArgs as clap::Args>::augment_args,
    run,
};

/// One workload's median times per op, in µs.
struct Row {
    workload: &'static str,
    ops_per_round: usize,
    host_us: f64,
    wall_us: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `round` (which enqueues `ops` ops and returns) `repeats` times after a warm-up: the host time of
/// the enqueueing and the wall time until the GPU is done, per op.
fn time(device: &Device, repeats: usize, ops: usize, mut round: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    round()?;
    device.synchronize()?;
    let (mut host, mut wall) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let started = Instant::now();
        round()?;
        host.push(started.elapsed().as_secs_f64() * 1e6 / ops as f64);
        device.synchronize()?;
        wall.push(started.elapsed().as_secs_f64() * 1e6 / ops as f64);
    }
    Ok((median(host), median(wall)))
}

fn run(gpu: &Arc<Gpu>, options: &BenchOptions, matches: &clap::ArgMatches) -> Result<()> {
    use clap::FromArgMatches;
    let args = NnBenchArgs::from_arg_matches(matches)?;
    let device = Device::on(Arc::clone(gpu))?;
    let ops = args.ops as usize;
    let mut rng = SeededRng::seed_from_u64(1);
    let mut values = |n: usize| (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect::<Vec<f32>>();
    let small = Tensor::from_vec(values(64 * 64), &[64, 64])?.to_device(&device)?;
    let mut rows = Vec::new();

    let (host_us, wall_us) = time(&device, options.repeats, ops, || {
        let _off = no_grad();
        let mut x = small.clone();
        for _ in 0..ops {
            x = x.mul_scalar(0.999)?;
        }
        Ok(())
    })?;
    rows.push(Row { workload: "mul_scalar 64×64, no grad", ops_per_round: ops, host_us, wall_us });

    let (host_us, wall_us) = time(&device, options.repeats, ops, || {
        let mut x = small.clone();
        for _ in 0..ops {
            x = x.add(&small)?;
        }
        Ok(())
    })?;
    rows.push(Row { workload: "add 64×64 (inputs need no grad)", ops_per_round: ops, host_us, wall_us });

    // A training step of the 784-128-10 MLP at batch 64: 9 forward ops, their backward, 4 updates.
    let mut init = SeededRng::seed_from_u64(2);
    let (first, second) =
        (Linear::<f32>::new(784, 128, true, &mut init)?, Linear::<f32>::new(128, 10, true, &mut init)?);
    let parameters: Vec<Tensor> = first.parameters().into_iter().chain(second.parameters()).collect();
    for p in &parameters {
        p.move_to_device(&device)?;
    }
    let x = Tensor::from_vec(values(64 * 784), &[64, 784])?.to_device(&device)?;
    let targets: Vec<i64> = (0..64).map(|i| i % 10).collect();
    let mut sgd = Optimizer::sgd(parameters, 0.01)?;
    let steps = (ops / 20).max(1);
    let (host_us, wall_us) = time(&device, options.repeats, steps, || {
        for _ in 0..steps {
            sgd.zero_grad();
            let loss = second.forward(&first.forward(&x)?.relu()?)?.cross_entropy(&targets, None)?;
            loss.backward()?;
            sgd.step()?;
        }
        Ok(())
    })?;
    rows.push(Row { workload: "MLP 784-128-10 step, batch 64 (per step)", ops_per_round: steps, host_us, wall_us });

    // The same step captured once and replayed as one CUDA graph.
    let ids = Tensor::from_vec(targets.iter().map(|&t| t as f32).collect(), &[64])?.to_device(&device)?;
    let mut captured = super::CapturedStep::new(&device, &[&x, &ids])?;
    let (host_us, wall_us) = time(&device, options.repeats, steps, || {
        for _ in 0..steps {
            captured.run(|| {
                sgd.zero_grad();
                let loss = second.forward(&first.forward(&x)?.relu()?)?.cross_entropy_ids(&ids, None)?;
                loss.backward()?;
                sgd.step()?;
                Ok(loss)
            })?;
        }
        Ok(())
    })?;
    anyhow::ensure!(captured.is_captured(), "the bench's step was not captured");
    let workload = "MLP 784-128-10 step, batch 64, captured (per step)";
    rows.push(Row { workload, ops_per_round: steps, host_us, wall_us });

    if options.json {
        let rows: Vec<_> = (rows.iter())
            .map(|r| {
                serde_json::json!({"workload": r.workload, "ops": r.ops_per_round, "host_us": r.host_us, "wall_us": r.wall_us})
            })
            .collect();
        println!("{}", serde_json::json!({"bench": "nn", "device": device.describe(), "rows": rows}));
    } else {
        println!("nn eager ops on {} (median of {} rounds)", device.describe(), options.repeats);
        println!("{:<44} {:>8} {:>12} {:>12}", "workload", "ops", "host µs/op", "wall µs/op");
        for r in &rows {
            println!("{:<44} {:>8} {:>12.2} {:>12.2}", r.workload, r.ops_per_round, r.host_us, r.wall_us);
        }
    }
    Ok(())
}
