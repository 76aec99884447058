//! The CNN's selftest checks against the CPU reference (`cnn.rs`), on random images and labels:
//!
//! - kernels: cnn_forward alone (p1, f, h, dlogits, loss) and cnn_backward alone (dh, dz2, dz1) against
//!   the reference's intermediates; then one step of the three kernels (B = 3): every tensor's gradient (written over a NaN-poisoned
//!   buffer), the updated parameters and the step's loss, on a problem whose reference stays MARGIN clear
//!   of every point where rounding could change a derivative (`cnn::kink_margin`: ReLU kinks and
//!   near-ties in max pooling; ~66,000 of them per image, so only a few images keep a draw clear);
//! - training: 100 steps of 4 images through the production path (one CUDA graph) for SGD, momentum and
//!   Adam with weight decay and clipping, each at a constant rate and under `TRAINING_SCHEDULE` (a rate per
//!   step from the graph's rates buffer): the summed loss, every tensor and the test loss, on a small CNN
//!   (8×8 images, 2 and 3 channels, 6 hidden units), whose run the reference watches at every step and
//!   which must stay MARGIN clear of every switch. At the full size a run of 100 steps passes tens of
//!   thousands of ReLU and pooling decisions per image, and some sit within rounding of their switch: a
//!   flipped one moved fc1's bias by 4.6e-3 relative in one measured run, so no full-size run can be
//!   compared tightly;
//! - repeat: the full-size step twice from the same start gives the same bits.

use super::cnn::{self, CnnParams, CnnShape};
use super::cnn_gpu::{GpuCnn, module_request};
use super::idx::Split;
use crate::device::{Gpu, compile::ModuleRequest};
use crate::harness::check::{Check, Group, Plan, rel_error, worst};
use crate::ops::cpu::SeededRng;
use crate::ops::optim::{LrSchedule, LrScheduleKind, OptimConfig, OptimKind, Optimizer};
use anyhow::Result;
use rand::RngExt;
use std::sync::Arc;

/// Largest relative error of a single kernel or step against the CPU reference.
pub const KERNEL_TOLERANCE: f64 = 1e-4;
/// Largest relative error of a whole training run against the CPU reference.
pub const TRAINING_TOLERANCE: f64 = 1e-4;
/// The smallest kink margin a one-step problem may reach (rounding moves values by ~1e-7 relative).
pub const MARGIN: f64 = 1e-6;
const MAX_DRAWS: usize = 8;
/// The training checks' CNN.
pub const TRAINING_SHAPE: CnnShape = CnnShape { side: 8, c1: 2, c2: 3, fc: 6, classes: 4 };
/// The training checks' schedule besides the constant rate: 10 steps of warm-up, then a cosine down to
/// 0, so every step of the 100 has a rate of its own.
pub const TRAINING_SCHEDULE: LrSchedule = LrSchedule { kind: LrScheduleKind::Cosine, warmup: 10, min_lr: 0.0 };

/// `n` random images (pixels uniform in [0, 1)) with random labels, for `shape`.
pub fn random_split(shape: CnnShape, n: usize, rng: &mut SeededRng) -> Split {
    let pixels = shape.side * shape.side;
    Split {
        images: (0..n * pixels).map(|_| rng.random_range(0.0f32..1.0)).collect(),
        labels: (0..n).map(|_| rng.random_range(0..shape.classes as u8)).collect(),
        pixels,
    }
}

fn label(shape: CnnShape, batch: usize) -> String {
    format!("{0}×{0} c{1} c{2} fc{3} B={batch}", shape.side, shape.c1, shape.c2, shape.fc)
}

/// The optimizers the training checks run: SGD, momentum, and Adam with weight decay and clipping.
pub fn optimizers() -> [OptimConfig; 3] {
    [
        OptimConfig { lr: 0.05, ..OptimConfig::new(OptimKind::Sgd) },
        OptimConfig { lr: 0.01, ..OptimConfig::new(OptimKind::Momentum) },
        OptimConfig { weight_decay: 1e-3, clip_norm: 0.5, ..OptimConfig::new(OptimKind::Adam) },
    ]
}

/// Relative error of each tensor of `got` against `want` (flat vectors of `shape`), the worst and where.
fn worst_tensor(shape: CnnShape, got: &[f32], want: &[f32]) -> (f64, &'static str) {
    let (starts, total) = shape.offsets();
    worst(shape.tensor_shapes().iter().enumerate().map(|(k, (name, _))| {
        let end = if k + 1 < 8 { starts[k + 1] } else { total };
        (*name, rel_error(&got[starts[k]..end], &want[starts[k]..end]))
    }))
}

/// The kernel modules the checks compile.
pub fn modules(_plan: &Plan) -> Vec<ModuleRequest> {
    vec![module_request(CnnShape::MNIST), module_request(TRAINING_SHAPE)]
}

/// The selftest checks of fused/mnist_cnn.cu against the CPU reference.
pub fn selftest_checks(gpu: &Arc<Gpu>, plan: &Plan) -> Result<Vec<Check>> {
    let shape = CnnShape::MNIST;
    let mut out = Vec::new();
    if plan.wants(Group::Kernels) {
        let mut rng = plan.rng("cnn kernels");
        out.extend(kernel_checks(gpu, shape, 3, &mut rng)?);
        for optim in optimizers() {
            out.push(step_check(gpu, shape, optim, 3, &mut rng)?);
        }
    }
    if plan.wants(Group::Training) {
        let mut rng = plan.rng("cnn training");
        for optim in optimizers() {
            for schedule in [LrSchedule::default(), TRAINING_SCHEDULE] {
                out.push(training_check(gpu, TRAINING_SHAPE, optim, schedule, 4, 100, &mut rng)?);
            }
        }
    }
    if plan.wants(Group::Repeat) {
        out.push(repeat_check(gpu, shape, &mut plan.rng("cnn repeat"))?);
    }
    Ok(out)
}

/// A problem whose reference stays MARGIN clear over `rows` (all of the split): the split and parameters,
/// or None after MAX_DRAWS tries.
fn clear_problem(shape: CnnShape, images: usize, rng: &mut SeededRng) -> Option<(Split, CnnParams, usize)> {
    for draw in 1..=MAX_DRAWS {
        let data = random_split(shape, images, rng);
        let params = CnnParams::init(shape, rng.random());
        let rows: Vec<u32> = (0..images as u32).collect();
        if cnn::kink_margin(&params, &data, &rows) >= MARGIN {
            return Some((data, params, draw));
        }
    }
    None
}

/// One step: the gradient of every tensor, the updated parameters and the loss.
fn step_check(gpu: &Arc<Gpu>, shape: CnnShape, optim: OptimConfig, batch: usize, rng: &mut SeededRng) -> Result<Check> {
    let name = format!("cnn step {}", optim.describe());
    let Some((data, params, draws)) = clear_problem(shape, batch, rng) else {
        return Ok(Check {
            kernel: format!("{name}: no clear problem"),
            shape: label(shape, batch),
            rel_error: f64::INFINITY,
            tolerance: KERNEL_TOLERANCE,
        });
    };
    let order: Vec<u32> = (0..batch as u32).collect();
    let mut want_grad = vec![0.0f32; params.flat.len()];
    let want_loss = cnn::loss_and_grad(shape, &params.flat, &data, &order, &mut want_grad);
    let mut want = params.clone();
    Optimizer::new(optim, params.flat.len()).step(&mut want.flat, &want_grad);

    let mut t = GpuCnn::new(gpu.clone(), params, optim, &data, &data)?;
    t.poison_gradient()?;
    let loss = t.train_epoch(&order, batch, &[optim.lr])?;
    let (grad_err, grad_at) = worst_tensor(shape, &t.gradient()?, &want_grad);
    let (param_err, param_at) = worst_tensor(shape, &t.cnn_params()?.flat, &want.flat);
    let loss_err = rel_error(&[loss as f32], &[want_loss]);
    let mut worst = (grad_err, format!("∂{grad_at}"));
    if param_err > worst.0 {
        worst = (param_err, param_at.to_string());
    }
    if loss_err > worst.0 {
        worst = (loss_err, "loss".into());
    }
    let drawn = if draws > 1 { format!(" ({draws} problems drawn)") } else { String::new() };
    Ok(Check {
        kernel: format!("{name}, worst: {}{drawn}", worst.1),
        shape: label(shape, batch),
        rel_error: worst.0,
        tolerance: KERNEL_TOLERANCE,
    })
}

/// `steps` steps of `batch` images (one epoch, one graph) on GPU and CPU from the same start, at the rates
/// of `schedule`.
fn training_check(
    gpu: &Arc<Gpu>,
    shape: CnnShape,
    optim: OptimConfig,
    schedule: LrSchedule,
    batch: usize,
    steps: usize,
    rng: &mut SeededRng,
) -> Result<Check> {
    let images = batch * steps;
    let rates = schedule.rates(optim.lr, steps);
    let scheduled = match schedule.describe() {
        d if d.is_empty() => String::new(),
        d => format!(", {d}"),
    };
    let name = format!("cnn {steps} steps (graph) {}{scheduled}", optim.describe());
    let test = random_split(shape, 50, rng);
    let mut accepted = None;
    for draw in 1..=MAX_DRAWS {
        let data = random_split(shape, images, rng);
        let start = CnnParams::init(shape, rng.random());
        let mut cpu = start.clone();
        let mut optimizer = Optimizer::new(optim, cpu.flat.len());
        let mut grad = vec![0.0f32; cpu.flat.len()];
        let (mut loss, mut margin) = (0.0f64, f64::INFINITY);
        let order: Vec<u32> = (0..images as u32).collect();
        for (rows, &rate) in order.chunks(batch).zip(&rates) {
            margin = margin.min(cnn::kink_margin(&cpu, &data, rows));
            loss += cnn::loss_and_grad(shape, &cpu.flat, &data, rows, &mut grad) as f64;
            optimizer.config.lr = rate;
            optimizer.step(&mut cpu.flat, &grad);
        }
        if margin >= MARGIN && cpu.all_finite() {
            accepted = Some((data, start, cpu, loss, draw));
            break;
        }
    }
    let Some((data, start, cpu, cpu_loss, draws)) = accepted else {
        return Ok(Check {
            kernel: format!("{name}: no clear problem"),
            shape: label(shape, batch),
            rel_error: f64::INFINITY,
            tolerance: TRAINING_TOLERANCE,
        });
    };
    let mut t = GpuCnn::new(gpu.clone(), start, optim, &data, &test)?;
    let order: Vec<u32> = (0..images as u32).collect();
    let loss = t.train_epoch(&order, batch, &rates)?;
    let got = t.cnn_params()?;
    let (mut worst, at) = worst_tensor(shape, &got.flat, &cpu.flat);
    let mut at = at.to_string();
    let loss_err = rel_error(&[loss as f32], &[cpu_loss as f32]);
    if loss_err > worst {
        (worst, at) = (loss_err, "loss".into());
    }
    let test_err = rel_error(&[t.evaluate()?.loss as f32], &[cnn::evaluate(&cpu, &test).loss as f32]);
    if test_err > worst {
        (worst, at) = (test_err, "test loss".into());
    }
    let drawn = if draws > 1 { format!(" ({draws} problems drawn)") } else { String::new() };
    Ok(Check {
        kernel: format!("{name}, worst: {at}{drawn}"),
        shape: label(shape, batch),
        rel_error: worst,
        tolerance: TRAINING_TOLERANCE,
    })
}

/// Two steps of 64 images twice from the same start: the same parameters to the bit.
fn repeat_check(gpu: &Arc<Gpu>, shape: CnnShape, rng: &mut SeededRng) -> Result<Check> {
    let data = random_split(shape, 128, rng);
    let start = CnnParams::init(shape, rng.random());
    let optim = optimizers()[2];
    let order: Vec<u32> = (0..128).collect();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut t = GpuCnn::new(gpu.clone(), start.clone(), optim, &data, &data)?;
        let loss = t.train_epoch(&order, 64, &[optim.lr; 2])?;
        runs.push((loss.to_bits(), t.cnn_params()?.flat.iter().map(|v| v.to_bits()).collect::<Vec<_>>()));
    }
    let same = runs[0] == runs[1];
    Ok(Check::holds("cnn 2 steps twice: the same bits", label(shape, 64), same))
}

/// cnn_forward and cnn_backward each alone against the reference's intermediates.
fn kernel_checks(gpu: &Arc<Gpu>, shape: CnnShape, batch: usize, rng: &mut SeededRng) -> Result<Vec<Check>> {
    let Some((data, params, draws)) = clear_problem(shape, batch, rng) else {
        return Ok(vec![Check {
            kernel: "cnn_forward, cnn_backward: no clear problem".into(),
            shape: label(shape, batch),
            rel_error: f64::INFINITY,
            tolerance: KERNEL_TOLERANCE,
        }]);
    };
    let order: Vec<u32> = (0..batch as u32).collect();
    let want = cnn::intermediates(&params, &data, &order);
    let mut t = GpuCnn::new(gpu.clone(), params, optimizers()[0], &data, &data)?;
    let got = t.forward_alone(&order)?;
    let (dh, dz2, dz1) = t.backward_alone(batch)?;
    let drawn = if draws > 1 { format!(" ({draws} problems drawn)") } else { String::new() };
    let check = |what: &str, a: &[f32], b: &[f32]| Check {
        kernel: format!("{what}{drawn}"),
        shape: label(shape, batch),
        rel_error: rel_error(a, b),
        tolerance: KERNEL_TOLERANCE,
    };
    Ok(vec![
        check("cnn_forward p1", &got.p1, &want.p1),
        check("cnn_forward f", &got.f, &want.f),
        check("cnn_forward h", &got.h, &want.h),
        check("cnn_forward dlogits", &got.dlogits, &want.dlogits),
        check("cnn_forward loss", &got.loss, &want.loss),
        check("cnn_backward dh", &dh, &want.dh),
        check("cnn_backward dz2", &dz2, &want.dz2),
        check("cnn_backward dz1", &dz1, &want.dz1),
    ])
}
