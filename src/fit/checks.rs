//! `textnet selftest` checks of `fused/fit.cu` against the CPU reference (src/nn/stack/model.rs), on fixed
//! specs covering every layer kind and on random specs (depth 1–6, widths 1–1024, images of odd sizes with
//! padding and stride), each with fresh random parameters, data and targets:
//!
//! - kernels: one step with a zero learning rate, every output poisoned first: the per-sample losses,
//!   the gradient of every parameter, and the evaluation outputs, against the reference in f32;
//! - training: 100 steps of each optimizer through the production path (a CUDA graph per epoch, a
//!   warmup-and-cosine schedule) against the reference's 100 steps: the summed losses and parameters;
//! - repeat: the same training twice on the GPU gives the same bits; and a spec's dense groups on the
//!   generic dense kernels, throughout or swapped for their own after an epoch, give their own's bits.
//!
//! Each check runs on the layer kernels, and again on the whole-epoch kernel where that takes the spec
//! at the check's batch.
//!
//! The kink rule: a GPU and the CPU round a ReLU input or a max-pool's runner-up differently by about a
//! relative 1e-7, so they may take different sides of a kink that close. The one-step check draws its
//! problem again while it comes within KINK_MARGIN (ten times that) of a kink; a training run touches
//! far more values, so a training check that misses is drawn again only when its reference run came
//! that close (at most MAX_DRAWS times). Exact zeros (dropped values, ReLU outputs pooled together) are
//! no kink: they are exact on both.
//!
//! The random specs come from a fixed stream (so `modules` can list what the selftest compiles); the
//! parameters and data come from the run's seed.

use crate::device::{Gpu, compile::ModuleRequest};
use crate::harness::check::{Check, Group, Plan, rel_error, worst};
use crate::harness::run::Trainer;
use crate::nn::stack::gpu::{
    DenseKernels, GpuTrainer, Op, StepPath, generic_dense_module, modules as network_modules, plan as group_plan,
    whole_epoch_module, whole_epoch_plan,
};
use crate::nn::stack::model::{self, Init, Loss, Network};
use crate::nn::stack::spec::{self, Shape};
use crate::nn::stack::{Samples, Setup, Target};
use crate::ops::cpu::SeededRng;
use crate::ops::dropout::DropoutKey;
use crate::ops::optim::{OptimConfig, OptimKind, Optimizer};
use anyhow::Result;
use rand::{RngExt, SeedableRng};
use std::sync::Arc;

/// Relative distance from a kink below which a problem is drawn again (see the module comment).
const KINK_MARGIN: f64 = 1e-6;
/// Problems drawn at most before a check reports that none stayed clear of the kinks.
const MAX_DRAWS: usize = 8;
const STEP_TOLERANCE: f64 = 1e-4;
const TRAINING_TOLERANCE: f64 = 1e-3;
/// Random specs checked (fewer with --quick).
const RANDOM_SPECS: usize = 8;
const QUICK_RANDOM_SPECS: usize = 3;
const SPEC_STREAM: u64 = 0x6669_745f_7370_6563;

/// Specs that together hold every layer kind and every fusion, with their input shapes and losses.
fn fixed_specs() -> Vec<(String, Shape, Loss)> {
    let image = |c, h, w| Shape::Image { channels: c, height: h, width: w };
    [
        ("Linear(784, 128), ReLU, Linear(128, 10)", Shape::Flat(784), Loss::Ce),
        ("Linear(37, 64), Tanh, Dropout(0.2), Linear(64, 48, bias=false), Sigmoid, Linear(3)", Shape::Flat(37), Loss::Mse),
        ("Linear(20, 33), GELU, Linear(33, 7), Dropout(0.5), ReLU, Linear(5)", Shape::Flat(20), Loss::Ce),
        (
            "Conv2d(1, 8, 3, padding=1), ReLU, MaxPool2d(2), Conv2d(8, 16, 3, padding=1), ReLU, MaxPool2d(2), Flatten, Linear(784, 64), ReLU, Linear(64, 10)",
            image(1, 28, 28),
            Loss::Ce,
        ),
        ("Conv2d(3, 5, 4, stride=2, padding=2), Tanh, Conv2d(5, 4, 3, stride=2, padding=1), MaxPool2d(3), Flatten, Dropout(0.3), Linear(6)", image(3, 13, 11), Loss::Ce),
        ("ReLU, Flatten, Linear(2)", image(2, 5, 7), Loss::Mse),
        ("Linear(19, 32), ReLU, Linear(1)", Shape::Flat(19), Loss::Mse),
        ("Linear(6, 40), Tanh, Dropout(0.3), Linear(8, bias=false), Sigmoid, Linear(2)", Shape::Flat(6), Loss::Mse),
        ("Linear(50, 3)", Shape::Flat(50), Loss::Ce),
    ]
    .into_iter()
    .map(|(s, shape, loss)| (s.to_string(), shape, loss))
    .collect()
}

/// A random spec from `rng`: images through 0–2 conv blocks or features, then dense layers, 1–6 layers
/// with parameters in all.
fn random_spec(rng: &mut SeededRng, quick: bool) -> (String, Shape, Loss) {
    let widest = if quick { 256 } else { 1024 };
    let activation = |rng: &mut SeededRng| ["ReLU", "Sigmoid", "Tanh", "GELU"][rng.random_range(0..4)];
    let mut layers: Vec<String> = Vec::new();
    let mut param_layers = 0;
    let input = if rng.random_bool(0.4) {
        let (mut c, mut h, mut w) = (rng.random_range(1..4), rng.random_range(5..20), rng.random_range(5..20));
        let input = Shape::Image { channels: c, height: h, width: w };
        for _ in 0..rng.random_range(1..3) {
            let (k, stride, padding) =
                (rng.random_range(1..5usize), rng.random_range(1..3usize), rng.random_range(0..3usize));
            let (oh, ow) = ((h + 2 * padding).checked_sub(k), (w + 2 * padding).checked_sub(k));
            let (Some(oh), Some(ow)) = (oh, ow) else { continue };
            let cout = rng.random_range(1..9);
            layers.push(format!("Conv2d({c}, {cout}, {k}, stride={stride}, padding={padding})"));
            param_layers += 1;
            (c, h, w) = (cout, oh / stride + 1, ow / stride + 1);
            if rng.random_bool(0.7) {
                layers.push(activation(rng).into());
            }
            if h >= 2 && w >= 2 && rng.random_bool(0.5) {
                let k = rng.random_range(2..4).min(h).min(w);
                layers.push(format!("MaxPool2d({k})"));
                (h, w) = (h / k, w / k);
            }
        }
        layers.push("Flatten".into());
        input
    } else {
        Shape::Flat(rng.random_range(1..widest + 1))
    };
    let dense = rng.random_range(1..(7 - param_layers).clamp(2, 5));
    let loss = if rng.random_bool(0.6) { Loss::Ce } else { Loss::Mse };
    for d in 0..dense {
        let last = d + 1 == dense;
        let width = if last {
            if loss == Loss::Ce { rng.random_range(2..13) } else { rng.random_range(1..4) }
        } else {
            rng.random_range(1..widest + 1)
        };
        layers.push(format!("Linear({width}{})", if rng.random_bool(0.2) { ", bias=false" } else { "" }));
        if !last {
            if rng.random_bool(0.8) {
                layers.push(activation(rng).into());
            }
            if rng.random_bool(0.3) {
                layers.push(format!("Dropout({:.2})", rng.random_range(0.05..0.6)));
            }
        }
    }
    (layers.join(", "), input, loss)
}

/// Every spec the selftest checks: the fixed ones, then the random ones.
fn specs(plan: &Plan) -> Vec<(String, Shape, Loss)> {
    let mut rng = SeededRng::seed_from_u64(SPEC_STREAM);
    let count = if plan.quick { QUICK_RANDOM_SPECS } else { RANDOM_SPECS };
    let mut out = fixed_specs();
    out.extend((0..count).map(|_| random_spec(&mut rng, plan.quick)));
    out
}

fn network(spec_text: &str, input: Shape) -> Result<Network> {
    Network::new(&spec::parse(spec_text)?, input)
}

/// Batches of the step, training and repeat checks.
const STEP_BATCH: usize = 8;
const TRAINING_BATCH: usize = 4;
const REPEAT_BATCH: usize = 16;

/// The paths a check of `net` at `batch` runs on: the layer kernels, and the whole-epoch kernel where it
/// takes the network.
fn paths(net: &Network, loss: Loss, batch: usize) -> Vec<StepPath> {
    let mut out = vec![StepPath::Layers];
    if whole_epoch_plan(net, &group_plan(net), loss, batch).is_some() {
        out.push(StepPath::WholeEpoch);
    }
    out
}

/// The kernel modules the checks compile (so the selftest compiles them all at once first).
pub fn modules(plan: &Plan) -> Vec<ModuleRequest> {
    let mut out = vec![generic_dense_module()];
    for (text, input, loss) in specs(plan) {
        if let Ok(net) = network(&text, input) {
            out.extend(network_modules(&net, loss));
            for batch in [STEP_BATCH, TRAINING_BATCH, REPEAT_BATCH] {
                if let Some(p) = whole_epoch_plan(&net, &group_plan(&net), loss, batch) {
                    out.push(whole_epoch_module(&p, loss, batch));
                }
            }
        }
    }
    out
}

/// How a check's label names the path (the layer kernels' checks keep their plain names).
fn on_path(path: StepPath) -> &'static str {
    if path == StepPath::WholeEpoch { " (whole epoch)" } else { "" }
}

/// A random split of `rows` samples for `net` with `loss`'s targets.
fn random_samples(net: &Network, loss: Loss, rows: usize, rng: &mut SeededRng) -> Samples {
    let features = net.inputs();
    let x = (0..rows * features).map(|_| rng.random_range(-1.0..1.0)).collect();
    let target = match loss {
        Loss::Ce => Target::Classes((0..rows).map(|_| rng.random_range(0..net.outputs() as u32)).collect()),
        Loss::Mse => Target::Values((0..rows * net.outputs()).map(|_| rng.random_range(-1.0..1.0)).collect()),
    };
    Samples { features, x, target }
}

/// A problem: the network's starting parameters and a training and an evaluation split.
struct Problem {
    params: Vec<f32>,
    train: Arc<Samples>,
    eval: Arc<Samples>,
    dropout_seed: u32,
}

fn draw(net: &Network, loss: Loss, rows: usize, rng: &mut SeededRng) -> Problem {
    Problem {
        params: net.init(Init::Pytorch, rng.random()),
        train: Arc::new(random_samples(net, loss, rows, rng)),
        eval: Arc::new(random_samples(net, loss, 37, rng)),
        dropout_seed: rng.random(),
    }
}

fn setup(net: &Network, loss: Loss, optim: OptimConfig, p: &Problem) -> Setup {
    Setup {
        net: net.clone(),
        params: p.params.clone(),
        loss,
        optim,
        dropout_seed: p.dropout_seed,
        splits: vec![p.train.clone(), p.eval.clone()],
    }
}

fn rows_of(s: &Samples, rows: &[u32]) -> (Vec<f32>, Samples) {
    let f = s.features;
    let x: Vec<f32> = rows.iter().flat_map(|&r| s.x[r as usize * f..][..f].iter().copied()).collect();
    let target = match &s.target {
        Target::Classes(c) => Target::Classes(rows.iter().map(|&r| c[r as usize]).collect()),
        Target::Values(v) => {
            let o = v.len() / s.rows().max(1);
            Target::Values(rows.iter().flat_map(|&r| v[r as usize * o..][..o].iter().copied()).collect())
        }
    };
    (x.clone(), Samples { features: f, x, target })
}

/// The reference's training run: summed loss per epoch, final parameters, and the closest it came to a
/// kink.
fn reference_run(
    net: &Network,
    loss: Loss,
    optim: OptimConfig,
    p: &Problem,
    orders: &[Vec<u32>],
    batch: usize,
    lr: &[f32],
) -> (Vec<f64>, Vec<f32>, f64) {
    let mut params = p.params.clone();
    let mut optimizer = Optimizer::new(optim, params.len());
    let (mut sums, mut margin) = (Vec::new(), f64::INFINITY);
    for order in orders {
        let mut sum = 0.0;
        for (k, rows) in order.chunks(batch).enumerate() {
            let (x, batch_samples) = rows_of(&p.train, rows);
            let key = DropoutKey { seed: p.dropout_seed, step: optimizer.step as u32 };
            let trace = model::forward(net, &params, &x, rows.len(), Some(key));
            margin = margin.min(model::kink_margin(net, &trace));
            let (l, d) = model::loss(
                loss,
                trace.values.last().expect("output"),
                rows.len(),
                net.outputs(),
                batch_samples.targets(),
            );
            let grad = model::backward(net, &params, &trace, d, Some(key));
            optimizer.config.lr = lr[k];
            optimizer.step(&mut params, &grad);
            sum += l as f64;
        }
        sums.push(sum);
    }
    (sums, params, margin)
}

/// One checked spec: its text, the input shape and loss it is checked with, and its network.
struct Case {
    text: String,
    input: Shape,
    loss: Loss,
    net: Network,
}

impl Case {
    fn label(&self) -> String {
        format!("{} on {}, {}", self.text, self.input, self.loss.name())
    }
}

/// One step at learning rate 0 on every output poisoned: losses, gradient and evaluation outputs.
fn step_check(gpu: &Arc<Gpu>, case: &Case, path: StepPath, rng: &mut SeededRng) -> Result<Check> {
    let (net, loss) = (&case.net, case.loss);
    let batch = STEP_BATCH;
    let mut draws = 0;
    let (p, order, x, batch_samples, key) = loop {
        draws += 1;
        let p = draw(net, loss, 2 * batch + 3, rng);
        let mut order: Vec<u32> = (0..p.train.rows() as u32).collect();
        rand::seq::SliceRandom::shuffle(&mut order[..], rng);
        order.truncate(batch);
        let (x, batch_samples) = rows_of(&p.train, &order);
        let key = DropoutKey { seed: p.dropout_seed, step: 0 };
        let trace = model::forward(net, &p.params, &x, batch, Some(key));
        let eval_trace = model::forward(net, &p.params, &p.eval.x, p.eval.rows(), None);
        if model::kink_margin(net, &trace).min(model::kink_margin(net, &eval_trace)) >= KINK_MARGIN
            || draws == MAX_DRAWS
        {
            break (p, order, x, batch_samples, key);
        }
    };
    let optim = OptimConfig::new(OptimKind::Sgd);
    let mut t = GpuTrainer::with_path(gpu.clone(), setup(net, loss, optim, &p), batch, path)?;
    t.poison()?;
    let gpu_loss = t.train_epoch(&order, batch, &[0.0], &mut |_, _| {})?;
    let gpu_grad = t.gradient()?;
    let (gpu_eval_loss, gpu_outputs) = t.evaluate(1)?;
    let (cpu_loss, cpu_grad) =
        model::loss_and_grad(net, &p.params, &x, batch, batch_samples.targets(), loss, Some(key));
    let eval_trace = model::forward(net, &p.params, &p.eval.x, p.eval.rows(), None);
    let cpu_outputs = eval_trace.values.last().expect("output");
    let (cpu_eval_loss, _) = model::loss(loss, cpu_outputs, p.eval.rows(), net.outputs(), p.eval.targets());
    let w = worst([
        ("loss", rel_error(&[gpu_loss as f32], &[cpu_loss])),
        ("gradient", rel_error(&gpu_grad, &cpu_grad)),
        ("eval outputs", rel_error(&gpu_outputs, cpu_outputs)),
        ("eval loss", rel_error(&[gpu_eval_loss as f32], &[cpu_eval_loss])),
    ]);
    Ok(Check {
        kernel: format!("fit step{}, every kernel, worst: {}{}", on_path(path), w.1, drawn(draws)),
        shape: case.label(),
        rel_error: w.0,
        tolerance: STEP_TOLERANCE,
    })
}

fn drawn(draws: usize) -> String {
    if draws > 1 { format!(" ({draws} problems drawn)") } else { String::new() }
}

/// The epochs' orders and one epoch's warmup-and-cosine rates for `steps` steps of `batch`.
fn schedule(rows: usize, batch: usize, epochs: usize, base: f32, rng: &mut SeededRng) -> (Vec<Vec<u32>>, Vec<f32>) {
    let orders = (0..epochs)
        .map(|_| {
            let mut o: Vec<u32> = (0..rows as u32).collect();
            rand::seq::SliceRandom::shuffle(&mut o[..], rng);
            o
        })
        .collect();
    let steps = rows.div_ceil(batch);
    let lr = (0..steps)
        .map(|k| {
            let warm = ((k + 1) as f32 / 10.0).min(1.0);
            warm * base * 0.5 * (1.0 + (std::f32::consts::PI * k as f32 / steps as f32).cos())
        })
        .collect();
    (orders, lr)
}

/// 100 steps (two epochs of 50) of `optim` on the GPU and the reference.
fn training_check(
    gpu: &Arc<Gpu>,
    case: &Case,
    optim: OptimConfig,
    path: StepPath,
    rng: &mut SeededRng,
) -> Result<Check> {
    let (net, loss) = (&case.net, case.loss);
    let (batch, rows, epochs) = (TRAINING_BATCH, 200, 2);
    let mut draws = 0;
    loop {
        draws += 1;
        let p = draw(net, loss, rows, rng);
        let (orders, lr) = schedule(rows, batch, epochs, optim.lr, rng);
        let (cpu_sums, cpu_params, margin) = reference_run(net, loss, optim, &p, &orders, batch, &lr);
        let mut t = GpuTrainer::with_path(gpu.clone(), setup(net, loss, optim, &p), batch, path)?;
        let mut sums = Vec::new();
        for order in &orders {
            sums.push(t.train_epoch(order, batch, &lr, &mut |_, _| {})? as f32);
        }
        let cpu_sums: Vec<f32> = cpu_sums.iter().map(|&s| s as f32).collect();
        let w = worst([("losses", rel_error(&sums, &cpu_sums)), ("parameters", rel_error(&t.params()?, &cpu_params))]);
        // Only a run near a kink excuses a miss; a miss clear of every kink, or on every draw, fails.
        let excused = w.0 > TRAINING_TOLERANCE && margin < KINK_MARGIN && draws < MAX_DRAWS;
        if !excused {
            return Ok(Check {
                kernel: format!(
                    "fit 100 steps ({}) {}, worst: {}{}",
                    if path == StepPath::WholeEpoch { "whole epoch" } else { "graph" },
                    optim.describe(),
                    w.1,
                    drawn(draws)
                ),
                shape: case.label(),
                rel_error: w.0,
                tolerance: TRAINING_TOLERANCE,
            });
        }
    }
}

/// The repeat checks' training: two epochs of Adam, clipped, over 160 random rows.
struct RepeatRun {
    p: Problem,
    orders: Vec<Vec<u32>>,
    lr: Vec<f32>,
    optim: OptimConfig,
}

impl RepeatRun {
    fn draw(case: &Case, rng: &mut SeededRng) -> RepeatRun {
        let p = draw(&case.net, case.loss, 160, rng);
        let (orders, lr) = schedule(160, REPEAT_BATCH, 2, 1e-3, rng);
        let mut optim = OptimConfig::new(OptimKind::Adam);
        optim.clip_norm = 1.0;
        RepeatRun { p, orders, lr, optim }
    }

    /// The bits of the parameters and the evaluation outputs after the training on `path`, the dense groups
    /// on `dense` kernels, swapped to their own before epoch `swap_before` where given.
    fn bits(
        &self,
        gpu: &Arc<Gpu>,
        case: &Case,
        (path, dense): (StepPath, DenseKernels),
        swap_before: Option<usize>,
    ) -> Result<Vec<u32>> {
        let setup = setup(&case.net, case.loss, self.optim, &self.p);
        let mut t = GpuTrainer::with_kernels(gpu.clone(), setup, REPEAT_BATCH, path, dense)?;
        for (epoch, order) in self.orders.iter().enumerate() {
            if swap_before == Some(epoch) {
                t.use_own_kernels()?;
            }
            t.train_epoch(order, REPEAT_BATCH, &self.lr, &mut |_, _| {})?;
        }
        let (_, outputs) = t.evaluate(1)?;
        Ok(t.params()?.iter().chain(&outputs).map(|v| v.to_bits()).collect())
    }
}

/// How many values two runs' bits differ in.
fn differing(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len())
}

/// A check that passes when no value differs.
fn same_bits(kernel: String, case: &Case, differ: usize) -> Check {
    Check::holds(kernel, case.label(), differ == 0)
}

/// Two identical GPU runs: 0 when every parameter and evaluation output has the same bits.
fn repeat_check(gpu: &Arc<Gpu>, case: &Case, path: StepPath, rng: &mut SeededRng) -> Result<Check> {
    let run = RepeatRun::draw(case, rng);
    let kernels = (path, DenseKernels::Auto);
    let differ = differing(&run.bits(gpu, case, kernels, None)?, &run.bits(gpu, case, kernels, None)?);
    Ok(same_bits(format!("fit two runs{}, same bits ({differ} values differ)", on_path(path)), case, differ))
}

/// The same training on the layer kernels three ways: the dense groups on their own kernels; on the
/// generic ones throughout; on the generic ones for the first epoch, then their own (the swap a new spec
/// makes). 0 when the parameters and evaluation outputs of all three have the same bits.
fn generic_check(gpu: &Arc<Gpu>, case: &Case, rng: &mut SeededRng) -> Result<Check> {
    let run = RepeatRun::draw(case, rng);
    let own = run.bits(gpu, case, (StepPath::Layers, DenseKernels::Own), None)?;
    let generic = |swap_before| run.bits(gpu, case, (StepPath::Layers, DenseKernels::Generic), swap_before);
    let (throughout, swapped) = (differing(&generic(None)?, &own), differing(&generic(Some(1))?, &own));
    let kernel = format!(
        "fit generic dense kernels = own, same bits ({throughout} values differ throughout, {swapped} swapped after an epoch)"
    );
    Ok(same_bits(kernel, case, throughout + swapped))
}

/// Every fit check the plan asks for.
pub fn selftest_checks(gpu: &Arc<Gpu>, plan: &Plan) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    let specs = specs(plan);
    let mut rng = plan.rng("fit");
    for (i, (text, input, loss)) in specs.iter().enumerate() {
        let case = Case { text: text.clone(), input: *input, loss: *loss, net: network(text, *input)? };
        let net = &case.net;
        if plan.wants(Group::Kernels) {
            for path in paths(net, *loss, STEP_BATCH) {
                out.push(step_check(gpu, &case, path, &mut rng)?);
            }
        }
        // Training and repeat on the fixed specs and the narrower random ones.
        let narrow = net.shapes.iter().all(|s| model::size(*s) <= 256) || i < fixed_specs().len();
        if plan.wants(Group::Training) && narrow {
            for path in paths(net, *loss, TRAINING_BATCH) {
                for kind in [OptimKind::Sgd, OptimKind::Momentum, OptimKind::Adam, OptimKind::AdamW] {
                    let mut optim = OptimConfig::new(kind);
                    optim.lr = if matches!(kind, OptimKind::Sgd | OptimKind::Momentum) { 0.02 } else { 2e-3 };
                    if kind == OptimKind::AdamW {
                        optim.weight_decay = 0.01;
                        optim.clip_norm = 0.5;
                    }
                    out.push(training_check(gpu, &case, optim, path, &mut rng)?);
                }
            }
        }
        if plan.wants(Group::Repeat) && i < fixed_specs().len() {
            for path in paths(net, *loss, REPEAT_BATCH) {
                out.push(repeat_check(gpu, &case, path, &mut rng)?);
            }
            if group_plan(net).iter().any(|g| matches!(g.op, Op::Dense { .. })) {
                out.push(generic_check(gpu, &case, &mut rng)?);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_checked_spec_builds_and_every_layer_kind_is_checked() {
        let plan = Plan { seed: 1, quick: false, groups: vec![] };
        let mut kinds = std::collections::BTreeSet::new();
        for (text, input, _) in specs(&plan) {
            let net = network(&text, input).unwrap_or_else(|e| panic!("{text}: {e:#}"));
            kinds.extend(net.layers.iter().map(|l| l.name()));
        }
        let all = ["Linear", "ReLU", "Sigmoid", "Tanh", "GELU", "Dropout", "Conv2d", "MaxPool2d", "Flatten"];
        assert_eq!(kinds.into_iter().collect::<Vec<_>>().len(), all.len());
    }
}
