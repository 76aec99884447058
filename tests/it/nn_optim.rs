//! `nn::optim` against PyTorch's documented algorithms, written out here in f64 and independently of the
//! crate (`Reference`): every step of SGD (with L2 weight decay), momentum (its velocity starts at the first
//! gradient), Adam (bias corrections that count each parameter's own steps) and AdamW (decoupled decay),
//! over seeded random shapes with odd sizes and size-1 axes; parameter groups (nanoGPT's split, decay only
//! where asked, per-group rates); global-norm clipping; the schedules' rates; each bad input's one line.
//!
//! A step's gradient is set directly (the backward of Σ g ⊙ θ is g, exactly), so the reference and the
//! optimizer see the same gradient and only the update rule is compared. The hyper-parameters are f32, as
//! the fused kernels take them; the reference takes the same f32 values widened to f64.

use crate::common::relative;
use rand::{RngExt, SeedableRng};
use textnet::nn::optim::{LrSchedule, LrScheduleKind, OptimKind};
use textnet::nn::{
    self, Linear, Module, Optimizer, ParamGroup, Scheduler, Sequential, Tensor, clip_grad_norm, decay_groups,
};
use textnet::ops::cpu::SeededRng;
use textnet::ops::optim::{OptimConfig, global_norm};

/// Sets the gradient of `p` to `grad`: the backward of Σ grad ⊙ p.
fn set_grad<F: textnet::ops::cpu::Real>(p: &Tensor<F>, grad: &[F]) {
    p.zero_grad();
    let g = Tensor::from_slice(grad, p.shape()).unwrap();
    p.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(p.grad().unwrap().to_vec(), grad);
}

/// One parameter's hyper-parameters, as f64.
#[derive(Clone, Copy, Debug)]
struct Hyper {
    kind: OptimKind,
    lr: f64,
    momentum: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
}

impl Hyper {
    /// The hyper-parameters of `config` (f32) widened, at `lr_scale` times its rate, with `weight_decay`.
    fn of(config: &OptimConfig, lr_scale: f32, weight_decay: f32) -> Hyper {
        Hyper {
            kind: config.kind,
            lr: (config.lr * lr_scale) as f64,
            momentum: config.momentum as f64,
            beta1: config.beta1 as f64,
            beta2: config.beta2 as f64,
            eps: config.eps as f64,
            weight_decay: weight_decay as f64,
        }
    }
}

/// PyTorch's algorithms for one parameter, as the `torch.optim.SGD`, `Adam` and `AdamW` pages write them
/// (dampening 0, no Nesterov, no AMSGrad, maximize off).
#[derive(Default)]
struct Reference {
    t: i32,
    velocity: Option<Vec<f64>>,
    m: Vec<f64>,
    v: Vec<f64>,
}

impl Reference {
    fn step(&mut self, h: &Hyper, theta: &mut [f64], grad: &[f64]) {
        self.t += 1;
        let n = theta.len();
        if self.m.is_empty() {
            (self.m, self.v) = (vec![0.0; n], vec![0.0; n]);
        }
        let mut g: Vec<f64> = grad.to_vec();
        if h.kind != OptimKind::AdamW && h.weight_decay != 0.0 {
            (0..n).for_each(|i| g[i] += h.weight_decay * theta[i]);
        }
        match h.kind {
            OptimKind::Sgd => (0..n).for_each(|i| theta[i] -= h.lr * g[i]),
            OptimKind::Momentum => {
                let b = match self.velocity.take() {
                    None => g.clone(),
                    Some(b) => (0..n).map(|i| h.momentum * b[i] + g[i]).collect(),
                };
                (0..n).for_each(|i| theta[i] -= h.lr * b[i]);
                self.velocity = Some(b);
            }
            OptimKind::Adam | OptimKind::AdamW => {
                if h.kind == OptimKind::AdamW {
                    (0..n).for_each(|i| theta[i] -= h.lr * h.weight_decay * theta[i]);
                }
                for i in 0..n {
                    self.m[i] = h.beta1 * self.m[i] + (1.0 - h.beta1) * g[i];
                    self.v[i] = h.beta2 * self.v[i] + (1.0 - h.beta2) * g[i] * g[i];
                    let m_hat = self.m[i] / (1.0 - h.beta1.powi(self.t));
                    let v_hat = self.v[i] / (1.0 - h.beta2.powi(self.t));
                    theta[i] -= h.lr * m_hat / (v_hat.sqrt() + h.eps);
                }
            }
        }
    }
}

/// Parameters of seeded random shapes (odd sizes, axes of size 1, a scalar) with values in (−1, 1).
fn random_parameters(rng: &mut SeededRng, count: usize) -> Vec<Tensor<f64>> {
    let mut shapes: Vec<Vec<usize>> = vec![vec![3, 1], vec![], vec![1, 5, 1]];
    while shapes.len() < count {
        shapes.push((0..rng.random_range(1..4)).map(|_| [1, 2, 3, 7][rng.random_range(0..4)]).collect());
    }
    shapes.truncate(count);
    (shapes.iter())
        .map(|s| {
            let n = s.iter().product();
            Tensor::parameter((0..n).map(|_| rng.random_range(-1.0..1.0)).collect(), s).unwrap()
        })
        .collect()
}

/// Runs `steps` steps of `optimizer` over `params` beside one `Reference` per parameter (hyper-parameters
/// `hypers[i]`). In step k, parameter i has the gradient 2a⊙θ + b (a loss Σ a⊙θ² + b⊙θ, a and b drawn
/// once) when `joins(k, i)`, and none otherwise; every parameter's change in every step must be the
/// reference's. Returns the largest relative difference of a change.
fn follow(
    optimizer: &mut Optimizer<f64>,
    params: &[Tensor<f64>],
    hypers: &[Hyper],
    steps: usize,
    joins: impl Fn(usize, usize) -> bool,
) -> f64 {
    let mut rng = SeededRng::seed_from_u64(17);
    let coefficients: Vec<(Vec<f64>, Vec<f64>)> = (params.iter())
        .map(|p| {
            let a = (0..p.numel()).map(|_| rng.random_range(0.2..1.0)).collect();
            (a, (0..p.numel()).map(|_| rng.random_range(-1.0..1.0)).collect())
        })
        .collect();
    let mut references: Vec<Reference> = params.iter().map(|_| Reference::default()).collect();
    let mut worst: f64 = 0.0;
    for k in 0..steps {
        optimizer.zero_grad();
        let mut expected = Vec::new();
        for (i, (p, (a, b))) in params.iter().zip(&coefficients).enumerate() {
            let mut theta = p.to_vec();
            if joins(k, i) {
                let grad: Vec<f64> = (0..p.numel()).map(|j| 2.0 * a[j] * theta[j] + b[j]).collect();
                set_grad(p, &grad);
                references[i].step(&hypers[i], &mut theta, &grad);
            }
            expected.push(theta);
        }
        let before: Vec<Vec<f64>> = params.iter().map(|p| p.to_vec()).collect();
        optimizer.step().unwrap();
        for (i, p) in params.iter().enumerate() {
            let change: Vec<f64> = p.to_vec().iter().zip(&before[i]).map(|(x, y)| x - y).collect();
            let wanted: Vec<f64> = expected[i].iter().zip(&before[i]).map(|(x, y)| x - y).collect();
            if !joins(k, i) {
                assert!(change.iter().all(|&c| c == 0.0), "parameter {i} without a gradient moved in step {k}");
                continue;
            }
            let error = relative(&change, &wanted);
            assert!(error < 1e-6, "{:?} step {k} parameter {i}: {change:?} vs {wanted:?} ({error:e})", hypers[i].kind);
            worst = worst.max(error);
        }
    }
    worst
}

/// One group of `params` under `config`, followed for 6 steps, every parameter in every step.
fn follow_single(config: OptimConfig, params: &[Tensor<f64>]) -> f64 {
    let mut optimizer = Optimizer::new(config, vec![ParamGroup::new(params.to_vec())]).unwrap();
    let hypers = vec![Hyper::of(&config, 1.0, config.weight_decay); params.len()];
    follow(&mut optimizer, params, &hypers, 6, |_, _| true)
}

fn config(kind: OptimKind, lr: f32, weight_decay: f32) -> OptimConfig {
    OptimConfig { lr, weight_decay, ..OptimConfig::new(kind) }
}

#[test]
fn sgd_follows_pytorchs_algorithm() {
    let mut rng = SeededRng::seed_from_u64(1);
    for weight_decay in [0.0, 0.1] {
        let error = follow_single(config(OptimKind::Sgd, 0.05, weight_decay), &random_parameters(&mut rng, 5));
        assert!(error < 1e-12, "plain SGD is the reference's arithmetic: {error:e}");
    }
}

#[test]
fn momentums_velocity_starts_at_the_first_gradient() {
    let mut rng = SeededRng::seed_from_u64(2);
    for weight_decay in [0.0, 0.01] {
        let params = random_parameters(&mut rng, 5);
        let momentum = OptimConfig { momentum: 0.8, ..config(OptimKind::Momentum, 0.05, weight_decay) };
        follow_single(momentum, &params);
    }
    let p = Tensor::parameter(vec![1.0f64, -2.0, 0.5], &[3]).unwrap();
    let mut optimizer = Optimizer::momentum(vec![p.clone()], 0.1, 0.9).unwrap();
    assert_eq!(optimizer.state(0, 0).unwrap().steps, 0);
    set_grad(&p, &[0.5, -1.0, 2.0]);
    optimizer.step().unwrap();
    let state = optimizer.state(0, 0).unwrap();
    assert_eq!((state.steps, state.m.as_slice(), state.v.len()), (1, &[0.5, -1.0, 2.0][..], 0));
    assert_eq!(p.to_vec(), [1.0 - 0.1f32 as f64 * 0.5, -2.0 + 0.1f32 as f64, 0.5 - 0.1f32 as f64 * 2.0]);
}

#[test]
fn adam_follows_pytorchs_algorithm_with_bias_correction() {
    let mut rng = SeededRng::seed_from_u64(3);
    for weight_decay in [0.0, 0.05] {
        let adam = OptimConfig { beta1: 0.8, beta2: 0.99, ..config(OptimKind::Adam, 0.01, weight_decay) };
        follow_single(adam, &random_parameters(&mut rng, 6));
    }
    // A first step moves each element by lr (times the sign), whatever the gradient's size: m̂ = g, v̂ = g².
    let p = Tensor::parameter(vec![0.0f64; 3], &[3]).unwrap();
    let mut optimizer = Optimizer::adam(vec![p.clone()], 0.25).unwrap();
    set_grad(&p, &[1e-2, -40.0, 2.0]);
    optimizer.step().unwrap();
    let moved: Vec<f64> = p.to_vec().iter().map(|x| x / 0.25).collect();
    assert!(relative(&moved, &[-1.0, 1.0, -1.0]) < 1e-5, "{moved:?}");
}

#[test]
fn adamw_decays_the_weights_apart_from_the_gradient() {
    let mut rng = SeededRng::seed_from_u64(4);
    follow_single(config(OptimKind::AdamW, 0.01, 0.1), &random_parameters(&mut rng, 6));
    let adamw = Optimizer::<f64>::adamw(vec![], 1e-3, 0.1).unwrap();
    assert_eq!((adamw.kind(), adamw.lr()), (OptimKind::AdamW, 1e-3));
}

#[test]
fn a_parameter_without_a_gradient_keeps_its_value_and_its_state() {
    // Parameter 1 first has a gradient in step 2, parameter 2 in steps 0, 2 and 4 only: Adam's bias
    // corrections count each parameter's own steps, as PyTorch's per-parameter `step`.
    let mut rng = SeededRng::seed_from_u64(5);
    let params = random_parameters(&mut rng, 3);
    let adam = config(OptimKind::Adam, 0.02, 0.0);
    let mut optimizer = Optimizer::new(adam, vec![ParamGroup::new(params.clone())]).unwrap();
    let hypers = vec![Hyper::of(&adam, 1.0, 0.0); 3];
    let joins = |k: usize, i: usize| match i {
        1 => k >= 2,
        2 => k.is_multiple_of(2),
        _ => true,
    };
    follow(&mut optimizer, &params, &hypers, 5, joins);
    let steps: Vec<u64> = (0..3).map(|i| optimizer.state(0, i).unwrap().steps).collect();
    assert_eq!(steps, [5, 3, 3]);
    assert!(optimizer.state(0, 3).is_none() && optimizer.state(1, 0).is_none());
}

#[test]
fn groups_decay_only_where_asked_and_scale_their_rate() {
    let mut rng = SeededRng::seed_from_u64(6);
    let model = Sequential::<f64>::new()
        .with(Linear::new(5, 3, true, &mut rng).unwrap())
        .with(Linear::new(3, 1, false, &mut rng).unwrap())
        .with(Linear::new(1, 2, true, &mut rng).unwrap());
    let named = model.named_parameters();
    let frozen = &named[3].1;
    frozen.set_requires_grad(false).unwrap();
    let groups = decay_groups(named.clone(), 0.1);
    let (decay, no_decay) = (&groups[0], &groups[1]);
    let names = |group: &ParamGroup<f64>| -> Vec<&str> {
        let name = |p: &Tensor<f64>| named.iter().find(|(_, q)| q.same(p)).unwrap().0.as_str();
        group.parameters.iter().map(name).collect()
    };
    assert_eq!((names(decay), decay.weight_decay), (vec!["0.weight", "1.weight"], Some(0.1)));
    assert_eq!((names(no_decay), no_decay.weight_decay), (vec!["0.bias", "2.bias"], Some(0.0)));
    // A tensor named twice (tied weights) joins once.
    let tied = [named[0].clone(), ("tied".into(), named[0].1.clone())];
    assert_eq!(decay_groups(tied, 0.1)[0].parameters.len(), 1);

    // With zero gradients AdamW only decays: the matrices shrink by 1 − lr·wd, the bias stays.
    frozen.set_requires_grad(true).unwrap();
    let adamw = config(OptimKind::AdamW, 0.01, 0.0);
    let mut optimizer = Optimizer::new(adamw, decay_groups(named.clone(), 0.1)).unwrap();
    let before: Vec<Vec<f64>> = named.iter().map(|(_, p)| p.to_vec()).collect();
    named.iter().for_each(|(_, p)| set_grad(p, &vec![0.0; p.numel()]));
    optimizer.step().unwrap();
    let shrink = 1.0 - 0.01f32 as f64 * 0.1f32 as f64;
    for ((name, p), before) in named.iter().zip(&before) {
        let factor = if p.rank() >= 2 { shrink } else { 1.0 };
        let wanted: Vec<f64> = before.iter().map(|x| x * factor).collect();
        assert!(relative(&p.to_vec(), &wanted) < 1e-15, "{name}");
    }

    // Every group at its own rate and decay, against the reference.
    let params = random_parameters(&mut rng, 5);
    let base = config(OptimKind::Momentum, 0.05, 0.02);
    let groups = vec![
        ParamGroup::new(params[..2].to_vec()).with_lr_scale(0.5),
        ParamGroup::new(params[2..4].to_vec()).with_weight_decay(0.3),
        ParamGroup::new(params[4..].to_vec()).with_weight_decay(0.0).with_lr_scale(2.0),
    ];
    let mut optimizer = Optimizer::new(base, groups).unwrap();
    assert_eq!(optimizer.group_count(), 3);
    let hypers = [
        Hyper::of(&base, 0.5, 0.02),
        Hyper::of(&base, 0.5, 0.02),
        Hyper::of(&base, 1.0, 0.3),
        Hyper::of(&base, 1.0, 0.3),
        Hyper::of(&base, 2.0, 0.0),
    ];
    follow(&mut optimizer, &params, &hypers, 4, |_, _| true);
}

#[test]
fn set_lr_follows_a_schedule() {
    let (lr, min_lr, warmup, total) = (6e-4f32, 6e-5f32, 10, 50);
    let scheduler = Scheduler::cosine(lr, warmup, min_lr, total).unwrap();
    // nanoGPT's get_lr, in f64.
    let get_lr = |it: usize| {
        let (lr, min_lr) = (lr as f64, min_lr as f64);
        if it < warmup {
            return lr * (it + 1) as f64 / (warmup + 1) as f64;
        }
        let ratio = (it - warmup) as f64 / (total - warmup) as f64;
        min_lr + 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos()) * (lr - min_lr)
    };
    let p = Tensor::parameter(vec![0.0f32], &[1]).unwrap();
    let mut optimizer = Optimizer::adamw(vec![p], 1.0, 0.1).unwrap();
    for k in 0..total {
        let rate = scheduler.apply(&mut optimizer, k).unwrap();
        assert_eq!(rate, optimizer.lr());
        assert!(((rate as f64 - get_lr(k)) / get_lr(k)).abs() < 1e-6, "step {k}: {rate} vs {}", get_lr(k));
    }
    assert_eq!(scheduler.rate(warmup), lr);
    assert_eq!(scheduler.rate(total + 5), min_lr);

    let step = LrSchedule { kind: LrScheduleKind::Step, warmup: 0, min_lr: 0.0 };
    let rates: Vec<f32> = (0..8).map(|k| Scheduler::new(1.0, step, 8).unwrap().rate(k)).collect();
    assert_eq!(rates, [1.0, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1f32 * 0.1, 0.1f32 * 0.1]);
    let constant = Scheduler::new(0.5, LrSchedule { warmup: 3, ..LrSchedule::default() }, 6).unwrap();
    assert_eq!((0..6).map(|k| constant.rate(k)).collect::<Vec<_>>(), [0.125, 0.25, 0.375, 0.5, 0.5, 0.5]);
}

#[test]
fn clipping_scales_every_gradient_by_the_global_norm() {
    let p = |v: Vec<f32>, s: &[usize]| Tensor::parameter(v, s).unwrap();
    let (a, b, idle) = (p(vec![0.0; 3], &[3]), p(vec![0.0; 2], &[2, 1]), p(vec![7.0], &[1]));
    let (ga, gb) = ([3.0f32, 0.0, -4.0], [12.0f32, 0.0]);
    let params = [a.clone(), idle.clone(), b.clone()];
    let set = || {
        set_grad(&a, &ga);
        set_grad(&b, &gb);
    };
    // ‖(3, 0, −4, 12, 0)‖ = 13; the parameter without a gradient is skipped.
    set();
    assert_eq!(clip_grad_norm(&params, 26.0).unwrap().item().unwrap(), 13.0);
    assert_eq!((a.grad().unwrap().to_vec(), b.grad().unwrap().to_vec()), (ga.to_vec(), gb.to_vec()));
    assert_eq!(clip_grad_norm(&params, 13.0).unwrap().item().unwrap(), 13.0);
    assert_eq!(a.grad().unwrap().to_vec(), ga);
    assert!(idle.grad().is_none());
    assert_eq!(clip_grad_norm(&params, 6.5).unwrap().item().unwrap(), 13.0);
    assert_eq!((a.grad().unwrap().to_vec(), b.grad().unwrap().to_vec()), (vec![1.5, 0.0, -2.0], vec![6.0, 0.0]));

    // A tensor listed twice counts twice, as in PyTorch (and holds no lock across the other's).
    assert_eq!(clip_grad_norm(&[b.clone(), b.clone()], 100.0).unwrap().item().unwrap(), 72f64.sqrt() as f32);
    // ... and is scaled twice; a gradient handed out by grad() before keeps its values (the device's
    // clip, which scales in place, copies such a gradient first).
    let c = p(vec![0.0; 2], &[2]);
    set_grad(&c, &[3.0, 4.0]);
    let handed = c.grad().unwrap();
    let norm = clip_grad_norm(&[c.clone(), c.clone()], 5.0).unwrap().item().unwrap();
    assert_eq!(norm, 50f64.sqrt() as f32);
    let f = 5.0 / norm;
    assert_eq!(c.grad().unwrap().to_vec(), [f * (f * 3.0), f * (f * 4.0)]);
    assert_eq!(handed.to_vec(), [3.0, 4.0]);

    // Random gradients: the norm is the twin's global_norm over their concatenation, to the bit, and the
    // clipped gradients are each scaled by max_norm / norm.
    let mut rng = SeededRng::seed_from_u64(7);
    let params: Vec<Tensor<f32>> =
        (0..4).map(|i| Tensor::parameter(vec![0.0; 2 * i + 1], &[2 * i + 1]).unwrap()).collect();
    let grads: Vec<Vec<f32>> =
        params.iter().map(|p| (0..p.numel()).map(|_| rng.random_range(-3.0f32..3.0)).collect()).collect();
    params.iter().zip(&grads).for_each(|(p, g)| set_grad(p, g));
    let norm = clip_grad_norm(&params, 1.0).unwrap().item().unwrap();
    assert_eq!(norm, global_norm(&grads.concat()));
    let clipped: Vec<f32> = params.iter().flat_map(|p| p.grad().unwrap().to_vec()).collect();
    assert_eq!(clipped, grads.concat().iter().map(|g| (1.0 / norm) * g).collect::<Vec<_>>());
    assert!((global_norm(&clipped) - 1.0).abs() < 1e-6);

    // An optimizer with a clip norm clips before its update: SGD at rate 1 moves by the clipped gradient.
    let q = p(vec![0.0; 3], &[3]);
    let sgd = OptimConfig { clip_norm: 2.5, ..config(OptimKind::Sgd, 1.0, 0.0) };
    let mut optimizer = Optimizer::new(sgd, vec![ParamGroup::new(vec![q.clone()])]).unwrap();
    set_grad(&q, &ga);
    optimizer.step().unwrap();
    assert_eq!(q.to_vec(), [-1.5, 0.0, 2.0]);
}

#[test]
fn sgd_steps_against_the_gradient() {
    let p = Tensor::parameter(vec![1.0f32, -2.0], &[2]).unwrap();
    let idle = Tensor::parameter(vec![5.0f32], &[1]).unwrap();
    let mut sgd = Optimizer::sgd(vec![p.clone(), idle.clone()], 0.1).unwrap().with_weight_decay(0.5).unwrap();
    p.mul(&p).unwrap().sum_all().unwrap().backward().unwrap();
    sgd.step().unwrap();
    // θ − lr·(2θ + wd·θ) = θ·(1 − 0.1·2.5); the parameter without a gradient stays.
    assert_eq!(p.to_vec(), [1.0 - 0.1 * (2.0 + 0.5), -2.0 - 0.1 * (-4.0 - 1.0)]);
    assert_eq!(idle.to_vec(), [5.0]);
    sgd.zero_grad();
    assert!(p.grad().is_none());
}

fn fails_with<T: std::fmt::Debug>(result: nn::Result<T>, expected: &str) {
    let err = result.unwrap_err().to_string();
    assert_eq!(err, expected);
    assert_eq!(err.lines().count(), 1);
}

#[test]
fn each_bad_setting_is_one_line() {
    let p = || Tensor::parameter(vec![0.0f32; 2], &[2]).unwrap();
    fails_with(Optimizer::sgd(vec![p()], -1.0), "sgd: the learning rate must be a finite number ≥ 0, got -1");
    fails_with(Optimizer::adam(vec![p()], f32::NAN), "adam: the learning rate must be a finite number ≥ 0, got NaN");
    fails_with(Optimizer::momentum(vec![p()], 0.1, 1.0), "momentum: the momentum must be in [0, 1), got 1");
    fails_with(Optimizer::adam(vec![p()], 1e-3).unwrap().with_betas(0.9, 1.0), "adam: β2 must be in [0, 1), got 1");
    fails_with(
        Optimizer::adamw(vec![p()], 1e-3, 0.0).unwrap().with_betas(-0.1, 0.999),
        "adamw: β1 must be in [0, 1), got -0.1",
    );
    fails_with(Optimizer::adam(vec![p()], 1e-3).unwrap().with_eps(0.0), "adam: ε must be a finite number > 0, got 0");
    fails_with(
        Optimizer::adamw(vec![p()], 1e-3, -0.01),
        "adamw: the weight decay must be a finite number ≥ 0, got -0.01",
    );
    let groups = vec![ParamGroup::new(vec![p()]), ParamGroup::new(vec![p()]).with_weight_decay(f32::INFINITY)];
    fails_with(
        Optimizer::new(OptimConfig::new(OptimKind::AdamW), groups),
        "adamw: the weight decay of group 1 must be a finite number ≥ 0, got inf",
    );
    fails_with(
        Optimizer::new(OptimConfig::new(OptimKind::Sgd), vec![ParamGroup::new(vec![p()]).with_lr_scale(-1.0)]),
        "sgd: the lr scale of group 0 must be a finite number ≥ 0, got -1",
    );
    let (a, b) = (p(), p());
    let twice = vec![ParamGroup::new(vec![a.clone(), b.clone()]), ParamGroup::new(vec![b])];
    fails_with(
        Optimizer::new(OptimConfig::new(OptimKind::Adam), twice),
        "adam: parameter 0 of group 1 is parameter 1 of group 0 again: list each once",
    );
    let clip = OptimConfig { clip_norm: -1.0, ..OptimConfig::new(OptimKind::Sgd) };
    fails_with(
        Optimizer::new(clip, vec![ParamGroup::new(vec![a.clone()])]),
        "sgd: the clip norm must be a finite number ≥ 0, got -1",
    );
    let mut adam = Optimizer::adam(vec![a.clone()], 1e-3).unwrap();
    fails_with(adam.set_lr(f32::INFINITY), "adam: the learning rate must be a finite number ≥ 0, got inf");
    assert_eq!(adam.lr(), 1e-3, "a refused rate leaves the old one");
    adam.set_lr(0.0).unwrap();
    fails_with(
        clip_grad_norm(std::slice::from_ref(&a), 0.0),
        "clip_grad_norm: max_norm must be a positive finite number, got 0",
    );
    fails_with(clip_grad_norm(&[a], f32::NAN), "clip_grad_norm: max_norm must be a positive finite number, got NaN");

    let schedule = |kind, warmup, min_lr| LrSchedule { kind, warmup, min_lr };
    let cosine = schedule(LrScheduleKind::Cosine, 0, 0.5);
    fails_with(Scheduler::new(0.1, cosine, 10), "Scheduler: min_lr 0.5 is above the learning rate 0.1");
    fails_with(Scheduler::new(-0.1, cosine, 10), "Scheduler: the learning rate must be a finite number ≥ 0, got -0.1");
    fails_with(
        Scheduler::new(1.0, schedule(LrScheduleKind::Step, 0, 0.5), 10),
        "Scheduler: min_lr applies to the cosine schedule only (this one is step)",
    );
    fails_with(Scheduler::cosine(1.0, 0, 0.0, 0), "Scheduler: a run of 0 steps has no rates");
    fails_with(
        Scheduler::cosine(1.0, 10, 0.0, 10),
        "Scheduler: 10 warm-up steps leave none of the run's 10 to the schedule",
    );
}
