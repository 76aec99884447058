//! The sales pipeline's selftest checks against the CPU reference, on random tables whose columns have
//! their own offsets and scales (one constant, whose std must become 1) and a target that depends on them:
//!
//! - kernels: the statistics and standardisation (`Stats`), the evaluation, and one short epoch of
//!   sales_train_epoch for each optimizer (with weight decay and clipping), a partial last batch included;
//! - training: 100 steps (two epochs, reshuffled) through the production path for each optimizer: the
//!   epoch losses, the test evaluation and every parameter;
//! - repeat: the same run twice gives the same bits (no atomics in the step).
//!
//! Hidden units start firmly on or off (`clear_params`), and a problem counts only if the reference run
//! stays finite and TRAINING_MARGIN clear of ReLU's kink (`check::kink_ratio`), so rounding cannot flip a
//! unit between the two sides.

use super::data::{Dataset, Split, Stats};
use super::gpu::{GpuSales, module_request};
use super::model::{self, SalesParams, SalesShape, Shuffle};
use super::train::{CpuSales, SalesTrainer};
use crate::check::{Check, Group, Plan, rel_error, worst};
use crate::cpu::SeededRng;
use crate::device::{Gpu, ModuleRequest};
use crate::ops::optim::{OptimConfig, OptimKind};
use anyhow::Result;
use rand::RngExt;
use std::sync::Arc;

/// Relative error of the statistics, the standardised values and the evaluation sums.
pub const KERNEL_TOLERANCE: f64 = 1e-5;
/// Relative error of a training run's losses and parameters against the reference's.
pub const TRAINING_TOLERANCE: f64 = 1e-4;
/// The smallest kink ratio a training problem's reference run may reach.
pub const TRAINING_MARGIN: f64 = 1e-3;
const MAX_DRAWS: usize = 8;

/// A random table in the file's units: `rows` training and `test` test rows of `n` features.
pub fn random_dataset(rows: usize, test: usize, n: usize, rng: &mut SeededRng) -> Dataset {
    let offset: Vec<f32> = (0..n).map(|_| rng.random_range(-500.0..500.0)).collect();
    let scale: Vec<f32> = (0..n).map(|c| if c == 1 { 0.0 } else { rng.random_range(0.1..40.0) }).collect();
    let weight: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut split = |rows: usize| {
        let mut x = Vec::with_capacity(rows * n);
        let mut y = Vec::with_capacity(rows);
        for _ in 0..rows {
            let u: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            x.extend(u.iter().zip(&offset).zip(&scale).map(|((u, o), s)| o + s * u));
            let signal: f32 = u.iter().zip(&weight).map(|(u, w)| u * w).sum();
            y.push(1000.0 + 300.0 * signal.max(-0.3) + 20.0 * rng.random_range(-1.0f32..1.0));
        }
        Split { rows, features: n, x, y, lines: (1..=rows as u64).collect() }
    };
    let (train, test) = (split(rows), split(test));
    Dataset {
        source: "random table".into(),
        skipped: 0,
        first_skipped: None,
        feature_names: (1..=n).map(|c| format!("f{c}")).collect(),
        target_name: "target".into(),
        vocabularies: vec![],
        val: split(0),
        train,
        test,
    }
}

/// Initial parameters with every hidden unit firmly on or off for every (standardised) row: W1 a tenth of
/// PyTorch's initialisation, so |W1·x| ≤ √(3n)/10 over uniform standardised features, and |b1| 0.5 + √(3n)/10
/// to 0.7 + √(3n)/10. The activations stay below about 1.5, so the output layer's curvature (Σ a² over the
/// units) keeps the checks' learning rates stable.
pub fn clear_params(shape: SalesShape, rng: &mut SeededRng) -> SalesParams {
    let mut p = SalesParams::init(shape, rng.random());
    let (h, n) = (shape.hidden, shape.inputs);
    let reach = (3.0 * n as f32).sqrt() / 10.0;
    let (w1, rest) = p.flat.split_at_mut(h * n);
    w1.iter_mut().for_each(|w| *w *= 0.1);
    for b in &mut rest[..h] {
        *b = (reach + rng.random_range(0.5..0.7)) * if rng.random() { 1.0 } else { -1.0 };
    }
    p
}

/// The optimizers the checks train with.
pub fn optimizers() -> [OptimConfig; 3] {
    let sgd = OptimConfig { lr: 0.01, ..OptimConfig::new(OptimKind::Sgd) };
    let momentum = OptimConfig { lr: 0.001, ..OptimConfig::new(OptimKind::Momentum) };
    let adam = OptimConfig { weight_decay: 1e-3, clip_norm: 0.5, ..OptimConfig::new(OptimKind::Adam) };
    [sgd, momentum, adam]
}

fn label(shape: SalesShape, rows: usize, batch: usize) -> String {
    format!("n={} H={} rows={rows} B={batch}", shape.inputs, shape.hidden)
}

/// (shape, rows, batch) of the kernel checks.
fn kernel_cases(quick: bool) -> Vec<(SalesShape, usize, usize)> {
    let mut cases = vec![(SalesShape { inputs: 1, hidden: 1 }, 3, 1), (REPEAT_CASE.0, 1000, 64)];
    if !quick {
        cases.push((SalesShape { inputs: 37, hidden: 70 }, 20_011, 100));
    }
    cases
}

/// The kernel modules the checks compile.
pub fn modules(plan: &Plan) -> Vec<ModuleRequest> {
    let shapes = kernel_cases(plan.quick).into_iter().map(|(shape, _, _)| shape);
    shapes.chain([TRAINING_CASE.0, REPEAT_CASE.0]).map(module_request).collect()
}

/// The selftest checks of fused/sales.cu against the CPU reference.
pub fn selftest_checks(gpu: &Arc<Gpu>, plan: &Plan) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    if plan.wants(Group::Kernels) {
        let mut rng = plan.rng("sales kernels");
        for (shape, rows, batch) in kernel_cases(plan.quick) {
            out.extend(kernel_checks(gpu, shape, rows, batch, &mut rng)?);
        }
    }
    if plan.wants(Group::Training) {
        let mut rng = plan.rng("sales training");
        for optim in optimizers() {
            let (shape, rows, batch, _) = TRAINING_CASE;
            out.push(training_check(gpu, shape, optim, rows, batch, &mut rng)?);
        }
    }
    if plan.wants(Group::Repeat) {
        let mut rng = plan.rng("sales repeat");
        out.push(repeat_check(gpu, &mut rng)?);
    }
    Ok(out)
}

/// Statistics, standardisation, evaluation and one epoch per optimizer, each against the reference.
fn kernel_checks(
    gpu: &Arc<Gpu>,
    shape: SalesShape,
    rows: usize,
    batch: usize,
    rng: &mut SeededRng,
) -> Result<Vec<Check>> {
    let data = random_dataset(rows, 97, shape.inputs, rng);
    let shape_label = label(shape, rows, batch);
    let check = |kernel: &str, rel_error: f64| Check {
        kernel: kernel.into(),
        shape: shape_label.clone(),
        rel_error,
        tolerance: KERNEL_TOLERANCE,
    };
    let mut out = Vec::new();
    let stats = Stats::of(&data.train);
    let (train, test) = (stats.normalize(&data.train), stats.normalize(&data.test));
    let params = clear_params(shape, rng);
    let mut t = GpuSales::new(gpu.clone(), &data, params.clone(), optimizers()[0], None)?;
    let flat = |s: &Stats| -> Vec<f32> {
        s.feature_mean.iter().chain(&s.feature_std).copied().chain([s.target_mean, s.target_std]).collect()
    };
    out.push(check("sales_column_stats mean, std", rel_error(&flat(t.stats()), &flat(&stats))));
    for (name, split, want) in [("train", true, &train), ("test", false, &test)] {
        let (x, y) = t.download(split)?;
        let err = rel_error(&x, &want.x).max(rel_error(&y, &want.y));
        out.push(check(&format!("sales_normalize {name} split"), err));
    }
    let want = model::evaluate(&params, &test, &stats);
    let got = t.evaluate_test()?;
    let err = rel_error(&[got.mse as f32, got.mae as f32], &[want.mse as f32, want.mae as f32]);
    out.push(check("sales_evaluate mse, mae", err));

    for optim in optimizers() {
        let order: Vec<u32> = Shuffle::new(train.rows, rng.random()).next_epoch().to_vec();
        let steps = 3.min(rows.div_ceil(batch));
        let order = &order[..(steps * batch).min(rows)];
        // The kernel trains on a prefix of the epoch's order: a shorter table of those rows.
        let part = Dataset {
            train: Split {
                rows: order.len(),
                features: shape.inputs,
                x: order.iter().flat_map(|&r| data.train.row(r as usize).to_vec()).collect(),
                y: order.iter().map(|&r| data.train.y[r as usize]).collect(),
                lines: vec![0; order.len()],
            },
            ..data.clone()
        };
        let mut gpu_run = GpuSales::new(gpu.clone(), &part, params.clone(), optim, None)?;
        let mut cpu_run = CpuSales::new(&part, params.clone(), optim, None)?;
        let identity: Vec<u32> = (0..order.len() as u32).collect();
        let gpu_loss = gpu_run.train_epoch(&identity, batch)?;
        let cpu_loss = cpu_run.train_epoch(&identity, batch)?;
        let got = gpu_run.params()?;
        let want = cpu_run.params()?;
        let err = rel_error(&got.flat, &want.flat).max(rel_error(&[gpu_loss as f32], &[cpu_loss as f32]));
        out.push(Check {
            kernel: format!("sales_train_epoch {steps} steps {}", optim.describe()),
            tolerance: TRAINING_TOLERANCE,
            ..check("", err)
        });
    }
    Ok(out)
}

/// Per epoch the training loss and test MSE and MAE, then the parameters.
pub fn run(
    trainer: &mut dyn SalesTrainer,
    rows: usize,
    batch: usize,
    epochs: usize,
    seed: u64,
) -> Result<(Vec<f32>, SalesParams)> {
    let mut shuffle = Shuffle::new(rows, seed);
    let mut history = Vec::new();
    for _ in 0..epochs {
        let loss = trainer.train_epoch(shuffle.next_epoch(), batch)?;
        let eval = trainer.evaluate_test()?;
        history.extend([(loss / rows as f64) as f32, eval.mse as f32, eval.mae as f32]);
    }
    Ok((history, trainer.params()?))
}

/// The training checks' shape, rows, batch and epochs.
pub const TRAINING_CASE: (SalesShape, usize, usize, usize) = (SalesShape { inputs: 7, hidden: 13 }, 795, 16, 2);

fn training_check(
    gpu: &Arc<Gpu>,
    shape: SalesShape,
    optim: OptimConfig,
    rows: usize,
    batch: usize,
    rng: &mut SeededRng,
) -> Result<Check> {
    let epochs = TRAINING_CASE.3;
    let steps = epochs * rows.div_ceil(batch);
    let mut draws = 0;
    let (data, params, seed, cpu_history, cpu_params) = loop {
        draws += 1;
        let data = random_dataset(rows, 97, shape.inputs, rng);
        let params = clear_params(shape, rng);
        let seed = rng.random();
        let mut cpu = CpuSales::new(&data, params.clone(), optim, None)?;
        cpu.kink_margin = Some(f64::INFINITY);
        let (history, cpu_params) = run(&mut cpu, rows, batch, epochs, seed)?;
        let finite = history.iter().all(|v| v.is_finite()) && cpu_params.all_finite();
        if finite && cpu.kink_margin.is_some_and(|m| m >= TRAINING_MARGIN) {
            break (data, params, seed, history, cpu_params);
        }
        if draws == MAX_DRAWS {
            return Ok(Check {
                kernel: format!(
                    "{steps} steps {}: no problem of {draws} stayed finite and clear of ReLU's switch at 0",
                    optim.describe()
                ),
                shape: label(shape, rows, batch),
                rel_error: f64::INFINITY,
                tolerance: TRAINING_TOLERANCE,
            });
        }
    };
    let mut gpu_trainer = GpuSales::new(gpu.clone(), &data, params, optim, None)?;
    let (gpu_history, gpu_params) = run(&mut gpu_trainer, rows, batch, epochs, seed)?;
    let (a, b) = (shape.split(&gpu_params.flat), shape.split(&cpu_params.flat));
    let worst = worst([
        ("losses", rel_error(&gpu_history, &cpu_history)),
        ("w1", rel_error(a.w1, b.w1)),
        ("b1", rel_error(a.b1, b.b1)),
        ("w2", rel_error(a.w2, b.w2)),
        ("b2", rel_error(a.b2, b.b2)),
    ]);
    let drawn = if draws > 1 { format!(" ({draws} problems drawn)") } else { String::new() };
    Ok(Check {
        kernel: format!("{steps} steps {}, worst: {}{drawn}", optim.describe(), worst.1),
        shape: label(shape, rows, batch),
        rel_error: worst.0,
        tolerance: TRAINING_TOLERANCE,
    })
}

/// The same run twice on the GPU: identical losses and parameters.
/// (shape, rows, batch) of the repeat check.
const REPEAT_CASE: (SalesShape, usize, usize) = (SalesShape { inputs: 19, hidden: 32 }, 3000, 64);

fn repeat_check(gpu: &Arc<Gpu>, rng: &mut SeededRng) -> Result<Check> {
    let (shape, rows, batch) = REPEAT_CASE;
    let data = random_dataset(rows, 97, shape.inputs, rng);
    let params = SalesParams::init(shape, rng.random());
    let optim = optimizers()[2];
    let seed = rng.random();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut t = GpuSales::new(gpu.clone(), &data, params.clone(), optim, None)?;
        let (history, p) = run(&mut t, rows, batch, 2, seed)?;
        runs.push(history.into_iter().chain(p.flat).map(f32::to_bits).collect::<Vec<_>>());
    }
    let same = runs[0] == runs[1];
    Ok(Check {
        kernel: "2 epochs twice: the same bits".into(),
        shape: label(shape, rows, batch),
        rel_error: if same { 0.0 } else { f64::INFINITY },
        tolerance: 0.0,
    })
}
