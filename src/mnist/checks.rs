//! The MNIST pipeline's selftest checks: each kernel of fused/mnist.cu alone against the CPU reference on
//! fresh random inputs with outputs poisoned first, the optimizer updates, and whole training runs through
//! the production path (a CUDA graph per epoch) against the CPU trainer. ReLU problems are kept clear of
//! the kink as the text checks' are (`check::kink_ratio`).

use super::gpu::{EVAL_CHUNK, GpuTrainer, module_request};
use super::idx::Split;
use super::model::{self, Activation, MlpParams, MlpShape, Workspace};
use super::{CpuTrainer, MnistTrainer};
use crate::check::{Check, Group, Plan, rel_error, worst};
use crate::cpu::SeededRng;
use crate::device::{Gpu, ModuleRequest};
use crate::ops::optim::{self, OptimConfig, OptimKind};
use anyhow::Result;
use rand::RngExt;
use std::sync::Arc;

/// `n` random images of `inputs` pixels in [0,1] with random labels below `classes`.
fn random_split(n: usize, shape: MlpShape, rng: &mut SeededRng) -> Split {
    Split {
        images: (0..n * shape.inputs).map(|_| rng.random::<f32>()).collect(),
        labels: (0..n).map(|_| rng.random_range(0..shape.classes as u32) as u8).collect(),
        pixels: shape.inputs,
    }
}

/// Xavier-initialised parameters with non-zero biases.
fn random_params(shape: MlpShape, rng: &mut SeededRng) -> MlpParams {
    let mut p = MlpParams::init(shape, rng.random());
    let (h, i, c) = (shape.hidden, shape.inputs, shape.classes);
    let flat = &mut p.flat;
    flat[h * i..h * i + h].iter_mut().for_each(|b| *b = rng.random_range(-0.2..0.2));
    flat[h * i + h + c * h..].iter_mut().for_each(|b| *b = rng.random_range(-0.2..0.2));
    p
}

fn shape_label(s: MlpShape, batch: usize) -> String {
    format!("I={} H={} C={} {} B={batch}", s.inputs, s.hidden, s.classes, s.activation.name())
}

/// The kernel modules the checks compile (the MLP's depend on its input and class counts alone).
pub fn modules(plan: &Plan) -> Vec<ModuleRequest> {
    let mlp = |inputs, classes| MlpShape { inputs, hidden: 1, classes, activation: Activation::Relu };
    let mut out = vec![module_request(mlp(784, 10)), module_request(mlp(50, 7))];
    out.extend(super::cnn_checks::modules(plan));
    out
}

/// Each MNIST kernel and whole training steps against the CPU reference (see `textnet selftest`).
pub fn selftest_checks(gpu: &Arc<Gpu>, plan: &Plan) -> Result<Vec<Check>> {
    let mut checks = Vec::new();
    if plan.wants(Group::Kernels) {
        checks.extend(all_kernel_checks(gpu, &mut plan.rng("mnist kernels"))?);
    }
    checks.extend(super::cnn_checks::selftest_checks(gpu, plan)?);
    if !plan.wants(Group::Training) {
        return Ok(checks);
    }
    let mut rng = plan.rng("mnist training");
    for TrainingCase { shape, optim, samples, batch } in training_cases() {
        checks.push(training_check(gpu, shape, optim, samples, batch, TRAINING_EPOCHS, &mut rng)?);
    }
    Ok(checks)
}

/// A whole training run to compare: model shape, optimizer, random training images and images a step.
#[derive(Clone, Copy, Debug)]
pub struct TrainingCase {
    /// The MLP's sizes.
    pub shape: MlpShape,
    /// The optimizer.
    pub optim: OptimConfig,
    /// Random training images.
    pub samples: usize,
    /// Images per optimizer step.
    pub batch: usize,
}

/// Epochs of each training check.
pub const TRAINING_EPOCHS: usize = 10;

/// Every activation with every optimizer, 10 epochs of 10 steps (100 steps). Random labels make this
/// training chaotic: a difference at the rounding level can grow. The learning rates are those at which,
/// on the CPU, noise of 1e-6 added to the parameters after every step stays below 2e-4 after 100 steps
/// (64 seeds each); the defaults grow it past 1e-3 for tanh with SGD or momentum. ReLU with momentum runs
/// at 5e-4, where its units stay on their side of the kink (at 0.005 most problems crossed it).
pub fn training_cases() -> Vec<TrainingCase> {
    use Activation::{Relu, Sigmoid, Tanh};
    use OptimKind::{Adam, Momentum, Sgd};
    let config =
        |kind, lr, weight_decay, clip_norm| OptimConfig { lr, weight_decay, clip_norm, ..OptimConfig::new(kind) };
    [
        (Relu, config(Adam, 1e-4, 0.0, 0.0), 128, 640, 64),
        (Relu, config(Sgd, 0.005, 1e-3, 1.0), 48, 630, 64),
        (Relu, config(Momentum, 5e-4, 0.0, 0.0), 48, 69, 7),
        (Sigmoid, config(Sgd, 0.02, 0.0, 0.0), 48, 500, 50),
        (Sigmoid, config(Momentum, 0.005, 1e-3, 0.5), 48, 999, 100),
        (Sigmoid, config(Adam, 1e-3, 0.0, 0.0), 48, 10, 1),
        (Tanh, config(Sgd, 0.02, 0.0, 0.0), 48, 95, 10),
        (Tanh, config(Momentum, 0.005, 0.0, 0.0), 48, 320, 32),
        (Tanh, config(Adam, 1e-3, 1e-4, 0.5), 100, 600, 64),
    ]
    .into_iter()
    .map(|(activation, optim, hidden, samples, batch)| TrainingCase {
        shape: MlpShape { inputs: 784, hidden, classes: 10, activation },
        optim,
        samples,
        batch,
    })
    .collect()
}

/// Each MNIST kernel alone on several shapes and activations, and the optimizer updates.
fn all_kernel_checks(gpu: &Arc<Gpu>, rng: &mut SeededRng) -> Result<Vec<Check>> {
    let shape = |inputs, hidden, classes, activation| MlpShape { inputs, hidden, classes, activation };
    let mut checks = Vec::new();
    for (s, batch, test) in [
        (shape(784, 128, 10, Activation::Relu), 64, 1000),
        (shape(784, 100, 10, Activation::Sigmoid), 13, 77),
        (shape(784, 37, 10, Activation::Tanh), 1, 5),
        // Odd input and class counts, a wide hidden layer, and a test split of two evaluation launches.
        (shape(50, 300, 7, Activation::Relu), 200, EVAL_CHUNK + 37),
    ] {
        checks.extend(kernel_checks(gpu, s, batch, test, rng)?);
    }
    checks.extend(update_checks(gpu, shape(784, 128, 10, Activation::Relu), rng)?);
    Ok(checks)
}

/// mnist_forward, mnist_backward and mnist_evaluate alone on fresh random inputs, each against the CPU
/// reference, outputs poisoned before each run.
fn kernel_checks(gpu: &Arc<Gpu>, s: MlpShape, batch: usize, n_test: usize, rng: &mut SeededRng) -> Result<Vec<Check>> {
    const TOL: f64 = 1e-5;
    let label = shape_label(s, batch);
    let check =
        |kernel: &str, rel_error: f64| Check { kernel: kernel.into(), shape: label.clone(), rel_error, tolerance: TOL };
    let (h, c) = (s.hidden, s.classes);
    let n_train = 2 * batch + 20;
    let train = random_split(n_train, s, rng);
    let test = random_split(n_test, s, rng);
    let p = random_params(s, rng);
    // Samples may repeat within a batch; the step reads order[cursor + offset ..].
    let order: Vec<u32> = (0..n_train).map(|_| rng.random_range(0..n_train as u32)).collect();
    let (cursor, offset) = (3, 5);
    let rows = &order[cursor + offset..][..batch];

    let mut ws = Workspace::default();
    let loss = model::forward(&p, &train, rows, &mut ws);
    let act = ws.a[..batch * h].to_vec();
    let z1 = ws.z1[..batch * h].to_vec();
    let mut grad = vec![0f32; s.param_count()];
    model::backward(&p, &train, rows, &mut ws, &mut grad);
    let dlogits = ws.probs[..batch * c].to_vec();
    let dz1 = ws.dz1[..batch * h].to_vec();

    let optim = OptimConfig { clip_norm: 1.0, ..OptimConfig::new(OptimKind::Adam) };
    let mut t = GpuTrainer::new(gpu.clone(), p.clone(), optim, &train, &test)?;
    t.ensure_capacity(batch)?;
    t.set_order(&order)?;
    t.set_cursor(cursor)?;
    t.poison_outputs()?;
    t.zero_loss()?;
    t.launch_forward(batch, offset)?;
    t.synchronize()?;
    let b = &t.buffers;
    let gpu_dz1 = t.download(&b.dz1)?[..batch * h].to_vec();
    // ReLU′ jumps at z = 0: where the CPU's z1 is within rounding of 0 the two sides may pick different
    // slopes, so those entries are left out of the comparison.
    let near_kink = |k: usize| s.activation == Activation::Relu && z1[k].abs() < 1e-5;
    let masked =
        |v: &[f32]| -> Vec<f32> { v.iter().enumerate().map(|(k, &x)| if near_kink(k) { 0.0 } else { x }).collect() };
    let mut out = vec![
        check("mnist_forward a", rel_error(&t.download(&b.act)?[..batch * h], &act)),
        check("mnist_forward dlogits", rel_error(&t.download(&b.dlogits)?[..batch * c], &dlogits)),
        check("mnist_forward dz1", rel_error(&masked(&gpu_dz1), &masked(&dz1))),
        check("mnist_forward loss", rel_error(&[t.read_loss()? as f32], &[loss as f32])),
    ];

    // mnist_backward from the CPU's intermediates, so that it is checked alone.
    let buf = &mut t.buffers;
    gpu.stream.memcpy_htod(&act, &mut buf.act.slice_mut(..act.len()))?;
    gpu.stream.memcpy_htod(&dlogits, &mut buf.dlogits.slice_mut(..dlogits.len()))?;
    gpu.stream.memcpy_htod(&dz1, &mut buf.dz1.slice_mut(..dz1.len()))?;
    t.launch_backward(batch, offset)?;
    t.synchronize()?;
    let gpu_grad = t.download(&t.grad)?;
    let (got, want) = (s.split(&gpu_grad), s.split(&grad));
    out.push(check("mnist_backward ∂W1", rel_error(got.w1, want.w1)));
    out.push(check("mnist_backward ∂b1", rel_error(got.b1, want.b1)));
    out.push(check("mnist_backward ∂W2", rel_error(got.w2, want.w2)));
    out.push(check("mnist_backward ∂b2", rel_error(got.b2, want.b2)));
    let partials: f64 = t.download(&t.norm_partials)?.iter().map(|&x| x as f64).sum();
    let squares: f64 = grad.iter().map(|&g| g as f64 * g as f64).sum();
    out.push(check("mnist_backward Σg² partials", rel_error(&[partials as f32], &[squares as f32])));

    // mnist_evaluate over the whole test split.
    let mut cpu_loss = 0.0;
    let mut cpu_probs = Vec::with_capacity(n_test * c);
    let mut cpu_predicted = Vec::with_capacity(n_test);
    let all: Vec<u32> = (0..n_test as u32).collect();
    for chunk in all.chunks(super::CPU_CHUNK) {
        cpu_loss += model::forward(&p, &test, chunk, &mut ws);
        cpu_probs.extend_from_slice(&ws.probs[..chunk.len() * c]);
        cpu_predicted.extend_from_slice(&ws.predicted[..chunk.len()]);
    }
    let (gpu_loss, gpu_predicted) = t.evaluate_raw()?;
    // A prediction differs only if the CPU's probabilities of the two classes are not a near tie.
    let differ = (0..n_test)
        .filter(|&k| {
            let (mine, theirs) = (gpu_predicted[k] as usize, cpu_predicted[k] as usize);
            mine >= c || cpu_probs[k * c + theirs] - cpu_probs[k * c + mine] > 1e-5
        })
        .count();
    out.push(check("mnist_evaluate loss", rel_error(&[gpu_loss as f32], &[cpu_loss as f32])));
    out.push(Check {
        kernel: "mnist_evaluate predictions (share differing)".into(),
        shape: format!("{label} test={n_test}"),
        rel_error: differ as f64 / n_test as f64,
        tolerance: 0.0,
    });
    Ok(out)
}

/// mnist_update alone for each optimizer against `optim::update`, at step 7, with weight decay and a clip
/// that binds (and Adam once without either). At lr 0.5 the parameter deltas are far above the rounding
/// of the parameters themselves.
fn update_checks(gpu: &Arc<Gpu>, s: MlpShape, rng: &mut SeededRng) -> Result<Vec<Check>> {
    const TOL: f64 = 1e-5;
    let n = s.param_count();
    let mut out = Vec::new();
    // The gradient's norm is about 180: a clip of 20 binds.
    let configs = [
        (OptimKind::Sgd, 0.01, 20.0),
        (OptimKind::Momentum, 0.01, 20.0),
        (OptimKind::Adam, 0.01, 20.0),
        (OptimKind::Adam, 0.0, 0.0),
    ];
    for (kind, weight_decay, clip_norm) in configs {
        let optim = OptimConfig { lr: 0.5, weight_decay, clip_norm, ..OptimConfig::new(kind) };
        let params: Vec<f32> = (0..n).map(|_| rng.random_range(-0.2..0.2)).collect();
        let grad: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let m: Vec<f32> = (0..n).map(|_| rng.random_range(-0.1..0.1)).collect();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(0.0..0.01)).collect();
        let steps_taken = 6u32;

        let norm = optim::global_norm(&grad);
        let scalars = optim.step_scalars(steps_taken as u64 + 1, norm);
        let (mut want_params, mut want_m, mut want_v) = (params.clone(), m.clone(), v.clone());
        optim::update(kind, &scalars, &mut want_params, &grad, &mut want_m, &mut want_v);

        let split = random_split(1, s, rng);
        let mut t = GpuTrainer::new(gpu.clone(), MlpParams { shape: s, flat: params.clone() }, optim, &split, &split)?;
        let count = t.layout.backward_grid;
        let mut partials = vec![0f32; count];
        for (k, g) in grad.iter().enumerate() {
            partials[k % count] += g * g;
        }
        gpu.stream.memcpy_htod(&grad, &mut t.grad)?;
        gpu.stream.memcpy_htod(&m, &mut t.m)?;
        gpu.stream.memcpy_htod(&v, &mut t.v)?;
        gpu.stream.memcpy_htod(&partials, &mut t.norm_partials)?;
        gpu.stream.memcpy_htod(&[steps_taken], &mut t.step)?;
        t.launch_update()?;
        t.synchronize()?;
        let delta = |after: &[f32]| -> Vec<f32> { params.iter().zip(after).map(|(b, a)| a - b).collect() };
        let mut what = optim.describe();
        if clip_norm > 0.0 {
            what += &format!(" (‖g‖ {norm:.2})");
        }
        let label = format!("{what}, n={n}");
        let row = |kernel: String, rel_error: f64| Check { kernel, shape: label.clone(), rel_error, tolerance: TOL };
        out.push(row(
            format!("mnist_update {} Δθ", kind.name()),
            rel_error(&delta(&t.download(&t.params)?), &delta(&want_params)),
        ));
        if kind != OptimKind::Sgd {
            out.push(row(format!("mnist_update {} m", kind.name()), rel_error(&t.download(&t.m)?, &want_m)));
        }
        if kind == OptimKind::Adam {
            out.push(row(format!("mnist_update {} v", kind.name()), rel_error(&t.download(&t.v)?, &want_v)));
        }
        let step = t.download(&t.step)?[0];
        out.push(row(
            format!("mnist_update {} step count", kind.name()),
            if step == steps_taken + 1 { 0.0 } else { f64::INFINITY },
        ));
    }
    Ok(out)
}

/// The smallest kink ratio (`check::kink_ratio`) a ReLU training problem's reference run may reach: the GPU
/// drifts from the reference by about a relative 1e-7 over a run, ten thousand times less.
pub const TRAINING_MARGIN: f64 = 1e-3;

/// The relative error a training check accepts. Over 200 seeds the worst case measured 1.1e-5 (tanh with
/// Adam, whose step divides by √v and so magnifies rounding where v is small), every other below 2e-6.
pub const TRAINING_TOLERANCE: f64 = 1e-3;

/// A training check's problem: random images and labels, a 97-image test split, initial parameters and
/// the shuffle seed. With ReLU every hidden unit starts firmly on or off for every image: its bias puts
/// `W1[j]`·x + `b1[j]` 5 to 7 away from 0 at the mean image, where images move it by about 0.4 and the
/// check's 100 steps by far less than 5.
pub fn training_problem(s: MlpShape, samples: usize, rng: &mut SeededRng) -> (Split, Split, MlpParams, u64) {
    let train = random_split(samples, s, rng);
    let test = random_split(97, s, rng);
    let mut p = random_params(s, rng);
    if s.activation == Activation::Relu {
        let mean: Vec<f32> = (0..s.inputs)
            .map(|k| (0..samples).map(|r| train.image(r as u32)[k]).sum::<f32>() / samples as f32)
            .collect();
        let (i, h) = (s.inputs, s.hidden);
        let (w1, b1) = p.flat.split_at_mut(h * i);
        for (j, b) in b1[..h].iter_mut().enumerate() {
            let at_mean: f32 = w1[j * i..][..i].iter().zip(&mean).map(|(w, x)| w * x).sum();
            *b = -at_mean + rng.random_range(5.0..7.0) * if rng.random() { 1.0 } else { -1.0 };
        }
    }
    (train, test, p, rng.random())
}

/// `epochs` epochs of `samples` random images, `batch` a step, trained by the GPU through the production
/// path (a CUDA graph per epoch) and by the CPU reference from the same start and sample order: the losses
/// of every epoch, the final test loss and the parameters within TRAINING_TOLERANCE relative. A ReLU problem is drawn
/// again (at most MAX_DRAWS times) while the reference run comes within TRAINING_MARGIN of the kink.
/// The GPU measured within 2e-6 of the reference over 40 seeds of every case.
fn training_check(
    gpu: &Arc<Gpu>,
    s: MlpShape,
    optim: OptimConfig,
    samples: usize,
    batch: usize,
    epochs: usize,
    rng: &mut SeededRng,
) -> Result<Check> {
    use super::train::{self, Schedule};
    const MAX_DRAWS: usize = 8;
    let steps = epochs * samples.div_ceil(batch);
    let label = format!("{} N={samples}", shape_label(s, batch));
    let mut draws = 0;
    let (train_split, test_split, p, schedule, cpu, cpu_history, cpu_eval) = loop {
        draws += 1;
        let (train_split, test_split, p, seed) = training_problem(s, samples, rng);
        let (train_split, test_split) = (Arc::new(train_split), Arc::new(test_split));
        let schedule = Schedule { epochs, batch, seed };
        let mut cpu = CpuTrainer::new(p.clone(), optim, train_split.clone(), test_split.clone());
        cpu.kink_margin = Some(f64::INFINITY);
        let (cpu_history, cpu_eval) = train::run(&mut cpu, samples, schedule, &mut ())?;
        if cpu.kink_margin.is_some_and(|m| m >= TRAINING_MARGIN) {
            break (train_split, test_split, p, schedule, cpu, cpu_history, cpu_eval);
        }
        if draws == MAX_DRAWS {
            return Ok(Check {
                kernel: format!(
                    "{steps} steps {}: no problem of {draws} stayed {TRAINING_MARGIN:e} clear of ReLU's kink",
                    optim.describe()
                ),
                shape: label,
                rel_error: f64::INFINITY,
                tolerance: TRAINING_TOLERANCE,
            });
        }
    };
    let mut gpu_trainer = GpuTrainer::new(gpu.clone(), p, optim, &train_split, &test_split)?;
    let (gpu_history, gpu_eval) = train::run(&mut gpu_trainer, samples, schedule, &mut ())?;

    let losses = |h: &[train::EpochStats]| -> Vec<f32> {
        h.iter().flat_map(|e| [e.train_loss as f32, e.test_loss as f32]).collect()
    };
    let super::Classifier::Mlp(got) = gpu_trainer.params()? else {
        anyhow::bail!("the MLP trainer returned another model")
    };
    let (a, b) = (s.split(&got.flat), s.split(&cpu.params.flat));
    let worst = worst([
        ("loss", rel_error(&losses(&gpu_history), &losses(&cpu_history))),
        ("test loss", rel_error(&[gpu_eval.loss as f32], &[cpu_eval.loss as f32])),
        ("w1", rel_error(a.w1, b.w1)),
        ("b1", rel_error(a.b1, b.b1)),
        ("w2", rel_error(a.w2, b.w2)),
        ("b2", rel_error(a.b2, b.b2)),
    ]);
    let drawn = if draws > 1 { format!(" ({draws} problems drawn)") } else { String::new() };
    Ok(Check {
        kernel: format!("{steps} steps (graph) {}, worst: {}{drawn}", optim.describe(), worst.1),
        shape: label,
        rel_error: worst.0,
        tolerance: TRAINING_TOLERANCE,
    })
}
