//! Optimizers as one fused elementwise update over the flat parameter vector: the math a GPU update
//! kernel implements, and the reference it is checked against.
//!
//! Per step, with gradient g of the mean batch loss (PyTorch's order of operations):
//! ```text
//! 1. clip:         g ← g · min(1, clip / ‖g‖₂), ‖g‖₂ over the whole vector (when clip > 0)
//! 2. weight decay: g ← g + wd·θ                         (L2 added to the gradient; all but adamw)
//! 3. update, t = 1, 2, … counting steps:
//!    sgd       θ ← θ − lr·g
//!    momentum  m ← μ·m + g;  θ ← θ − lr·m               (heavy ball, no dampening)
//!    adam      m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²
//!              θ ← θ − lr · (m / (1−β1ᵗ)) / (√(v / (1−β2ᵗ)) + ε)
//!    adamw     θ ← θ·(1 − lr·wd), then adam's update     (decoupled weight decay, torch.optim.AdamW)
//! ```
//!
//! The scalars of a step (clip factor, bias corrections) are computed once per step on the host side
//! (`StepScalars`); `update` is then a pure function of slices and those scalars.

use anyhow::{Result, bail};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// The `--optim` flag: which update rule trains the parameters.
pub enum OptimKind {
    /// θ ← θ − lr·g
    Sgd,
    /// Heavy-ball momentum: m ← μ·m + g; θ ← θ − lr·m
    Momentum,
    /// Adam, bias-corrected
    Adam,
    /// Adam after θ ← θ·(1 − lr·wd) (decoupled weight decay)
    AdamW,
}

impl OptimKind {
    /// The flag value, e.g. "adamw".
    pub fn name(self) -> &'static str {
        match self {
            OptimKind::Sgd => "sgd",
            OptimKind::Momentum => "momentum",
            OptimKind::Adam => "adam",
            OptimKind::AdamW => "adamw",
        }
    }

    /// Its OPTIM_* code in fused/optim.cuh.
    pub fn kernel_code(self) -> i32 {
        match self {
            OptimKind::Sgd => 0,
            OptimKind::Momentum => 1,
            OptimKind::Adam => 2,
            OptimKind::AdamW => 3,
        }
    }

    /// The lengths of its state buffers `m` and `v` (see `update`) over `len` parameters: 0 for a buffer
    /// it does not use.
    pub fn buffer_lens(self, len: usize) -> (usize, usize) {
        match self {
            OptimKind::Sgd => (0, 0),
            OptimKind::Momentum => (len, 0),
            OptimKind::Adam | OptimKind::AdamW => (len, len),
        }
    }

    /// The learning rate used when none is given. With μ 0.9 a steady gradient moves momentum's
    /// parameters lr / (1 − μ) per step, so 0.05 there is a bolder step than SGD's 0.1; on (Fashion-)MNIST
    /// it trains faster and stays stable.
    pub fn default_lr(self) -> f32 {
        match self {
            OptimKind::Sgd => 0.1,
            OptimKind::Momentum => 0.05,
            OptimKind::Adam | OptimKind::AdamW => 1e-3,
        }
    }
}

/// Momentum μ when `--momentum` is not given.
pub const DEFAULT_MOMENTUM: f32 = 0.9;

#[derive(Clone, Copy, Debug, PartialEq)]
/// An optimizer and its hyper-parameters, as the flags give them.
pub struct OptimConfig {
    /// The update rule.
    pub kind: OptimKind,
    /// The learning rate.
    pub lr: f32,
    /// μ of `Momentum`.
    pub momentum: f32,
    /// Adam's β1: decay of the gradient's running mean.
    pub beta1: f32,
    /// Adam's β2: decay of the squared gradient's running mean.
    pub beta2: f32,
    /// Adam's ε, added to the denominator.
    pub eps: f32,
    /// Weight decay (L2 for all but adamw, decoupled for adamw); 0 turns it off.
    pub weight_decay: f32,
    /// Largest global gradient L2 norm; 0 turns clipping off.
    pub clip_norm: f32,
}

impl OptimConfig {
    /// `kind` with its default learning rate and hyper-parameters, no weight decay, no clipping.
    pub fn new(kind: OptimKind) -> OptimConfig {
        OptimConfig {
            kind,
            lr: kind.default_lr(),
            momentum: DEFAULT_MOMENTUM,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            clip_norm: 0.0,
        }
    }

    /// Ok when every hyper-parameter is in range, otherwise the error line naming its flag.
    pub fn validate(&self) -> Result<()> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            bail!("--lr must be a positive finite number, got {}", self.lr);
        }
        if !(0.0..1.0).contains(&self.momentum) {
            bail!("--momentum must be in [0, 1), got {}", self.momentum);
        }
        if !(0.0..1.0).contains(&self.beta1) || !(0.0..1.0).contains(&self.beta2) {
            bail!("Adam's β1 and β2 must be in [0, 1), got {} and {}", self.beta1, self.beta2);
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            bail!("Adam's ε must be a positive finite number, got {}", self.eps);
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            bail!("--weight-decay must be a finite number ≥ 0, got {}", self.weight_decay);
        }
        if !(self.clip_norm.is_finite() && self.clip_norm >= 0.0) {
            bail!("--clip-norm must be a finite number ≥ 0 (0 = off), got {}", self.clip_norm);
        }
        Ok(())
    }

    /// e.g. "adam lr 0.001, weight decay 0.0001, clip-norm 1".
    pub fn describe(&self) -> String {
        let mut s = format!("{} lr {}", self.kind.name(), self.lr);
        if self.kind == OptimKind::Momentum {
            s += &format!(" μ {}", self.momentum);
        }
        if self.weight_decay > 0.0 {
            s += &format!(", weight decay {}", self.weight_decay);
        }
        if self.clip_norm > 0.0 {
            s += &format!(", clip-norm {}", self.clip_norm);
        }
        s
    }

    /// The scalars of step `t` (1-based) given the gradient's global L2 norm.
    pub fn step_scalars(&self, t: u64, grad_norm: f32) -> StepScalars {
        let t = t.min(i32::MAX as u64) as i32;
        StepScalars {
            lr: self.lr,
            momentum: self.momentum,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            grad_scale: clip_scale(grad_norm, self.clip_norm),
            bias1: (1.0 - (self.beta1 as f64).powi(t)) as f32,
            bias2: (1.0 - (self.beta2 as f64).powi(t)) as f32,
        }
    }
}

/// Everything one update step needs besides the buffers: the arguments of a fused update kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepScalars {
    /// The learning rate.
    pub lr: f32,
    /// Momentum μ.
    pub momentum: f32,
    /// Adam's β1.
    pub beta1: f32,
    /// Adam's β2.
    pub beta2: f32,
    /// Adam's ε.
    pub eps: f32,
    /// Weight decay.
    pub weight_decay: f32,
    /// Clip factor applied to the gradient before weight decay (1 when not clipping).
    pub grad_scale: f32,
    /// Adam's bias corrections 1 − β1ᵗ and 1 − β2ᵗ.
    pub bias1: f32,
    /// Adam's bias correction 1 − β2ᵗ.
    pub bias2: f32,
}

/// ‖g‖₂, accumulated in f64.
pub fn global_norm(g: &[f32]) -> f32 {
    add_squares(0.0, g).sqrt() as f32
}

/// `sum` + Σ x² over `part`, element after element, in f64: carried from one buffer to the next, the
/// squared global norm of a gradient held in several (one per parameter tensor), summed in the order of
/// their concatenation.
pub fn add_squares<F: num_traits::Float>(sum: f64, part: &[F]) -> f64 {
    part.iter().fold(sum, |sum, x| sum + x.to_f64().map_or(f64::NAN, |x| x * x))
}

/// The factor that brings a gradient of norm `norm` down to `clip` (1 when it is within, or clip is 0).
pub fn clip_scale<F: num_traits::Float>(norm: F, clip: F) -> F {
    if clip > F::zero() && norm > clip { clip / norm } else { F::one() }
}

/// One update of every element: `params`, `m` and `v` in place from `grads`. `m` is the momentum
/// velocity or Adam's first moment, `v` Adam's second moment; an optimizer that does not use a buffer
/// accepts it empty. In f32 or f64 (`nn`'s tensors of either); the step's scalars stay f32.
pub fn update<F: num_traits::Float>(
    kind: OptimKind,
    s: &StepScalars,
    params: &mut [F],
    grads: &[F],
    m: &mut [F],
    v: &mut [F],
) {
    assert_eq!(params.len(), grads.len());
    let of = |x: f32| super::constant::<F>(x as f64);
    let (lr, momentum, beta1, beta2, eps) = (of(s.lr), of(s.momentum), of(s.beta1), of(s.beta2), of(s.eps));
    let (weight_decay, grad_scale, bias1, bias2) = (of(s.weight_decay), of(s.grad_scale), of(s.bias1), of(s.bias2));
    let one = F::one();
    let g_of = |g: F, theta: F| grad_scale * g + weight_decay * theta;
    let adam = |theta: &mut F, g: F, m: &mut F, v: &mut F| {
        *m = beta1 * *m + (one - beta1) * g;
        *v = beta2 * *v + (one - beta2) * g * g;
        *theta = *theta - lr * (*m / bias1) / ((*v / bias2).sqrt() + eps);
    };
    match kind {
        OptimKind::Sgd => {
            for (theta, &g) in params.iter_mut().zip(grads) {
                *theta = *theta - lr * g_of(g, *theta);
            }
        }
        OptimKind::Momentum => {
            assert_eq!(m.len(), params.len());
            for ((theta, &g), m) in params.iter_mut().zip(grads).zip(m) {
                *m = momentum * *m + g_of(g, *theta);
                *theta = *theta - lr * *m;
            }
        }
        OptimKind::Adam => {
            assert!(m.len() == params.len() && v.len() == params.len());
            for (((theta, &g), m), v) in params.iter_mut().zip(grads).zip(m).zip(v) {
                adam(theta, g_of(g, *theta), m, v);
            }
        }
        OptimKind::AdamW => {
            assert!(m.len() == params.len() && v.len() == params.len());
            for (((theta, &g), m), v) in params.iter_mut().zip(grads).zip(m).zip(v) {
                *theta = *theta * (one - lr * weight_decay);
                adam(theta, grad_scale * g, m, v);
            }
        }
    }
}

/// Optimizer state over a flat parameter vector.
#[derive(Clone, Debug, PartialEq)]
pub struct Optimizer {
    /// The optimizer and its hyper-parameters.
    pub config: OptimConfig,
    /// Steps taken so far.
    pub step: u64,
    /// First-moment state: momentum's velocity or Adam's running mean of g (empty for SGD).
    pub m: Vec<f32>,
    /// Adam's running mean of g² (empty for SGD and momentum).
    pub v: Vec<f32>,
}

impl Optimizer {
    /// Zeroed state for `len` parameters; only the buffers `config.kind` uses are allocated.
    pub fn new(config: OptimConfig, len: usize) -> Optimizer {
        let (m, v) = config.kind.buffer_lens(len);
        Optimizer { config, step: 0, m: vec![0.0; m], v: vec![0.0; v] }
    }

    /// Clips, then updates `params` from `grads`.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32]) {
        self.step += 1;
        let norm = if self.config.clip_norm > 0.0 { global_norm(grads) } else { 0.0 };
        let scalars = self.config.step_scalars(self.step, norm);
        update(self.config.kind, &scalars, params, grads, &mut self.m, &mut self.v);
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
/// The `--lr-schedule` flag: how the learning rate moves over a run (after `--warmup`).
pub enum LrScheduleKind {
    /// The base rate at every step
    #[default]
    Constant,
    /// Half a cosine from the base rate down to `LrSchedule::min_lr`
    Cosine,
    /// The base rate, ×`STEP_DECAY` at half the steps and again at three quarters
    Step,
}

impl LrScheduleKind {
    /// The flag value, e.g. "cosine".
    pub fn name(self) -> &'static str {
        match self {
            LrScheduleKind::Constant => "constant",
            LrScheduleKind::Cosine => "cosine",
            LrScheduleKind::Step => "step",
        }
    }
}

/// A learning-rate schedule: the rate of every step from the base rate and the run's length in steps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LrSchedule {
    /// The curve after the warm-up.
    pub kind: LrScheduleKind,
    /// Steps of linear warm-up.
    pub warmup: usize,
    /// The rate cosine decays to.
    pub min_lr: f32,
}

/// The factor of `LrScheduleKind::Step` at each of its milestones.
pub const STEP_DECAY: f32 = 0.1;

impl LrSchedule {
    /// Ok when the warm-up leaves steps to the schedule in a run of `total` steps.
    pub fn check(&self, total: usize) -> Result<()> {
        if self.warmup > 0 && self.warmup >= total {
            bail!(
                "--warmup {} is as long as the whole run ({total} optimizer steps): lower it, or train longer",
                self.warmup
            );
        }
        Ok(())
    }

    /// The rate of step `step` (from 0) of a run of `total` steps whose base rate is `lr`.
    pub fn rate(&self, lr: f32, step: usize, total: usize) -> f32 {
        if step < self.warmup {
            return (lr as f64 * (step + 1) as f64 / (self.warmup + 1) as f64) as f32;
        }
        let span = total.saturating_sub(self.warmup).max(1);
        let at = (step - self.warmup).min(span);
        match self.kind {
            LrScheduleKind::Constant => lr,
            LrScheduleKind::Cosine => {
                let progress = at as f64 / span as f64;
                let coeff = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                (self.min_lr as f64 + coeff * (lr as f64 - self.min_lr as f64)) as f32
            }
            LrScheduleKind::Step => {
                let passed = [span / 2, span * 3 / 4].iter().filter(|&&m| at >= m).count();
                lr * STEP_DECAY.powi(passed as i32)
            }
        }
    }

    /// The rate of each of `total` steps.
    pub fn rates(&self, lr: f32, total: usize) -> Vec<f32> {
        (0..total).map(|k| self.rate(lr, k, total)).collect()
    }

    /// e.g. "cosine schedule to 0.0001, 100 warm-up steps"; empty for a constant rate without warm-up.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match self.kind {
            LrScheduleKind::Constant => {}
            LrScheduleKind::Cosine => parts.push(format!("cosine schedule to {}", self.min_lr)),
            LrScheduleKind::Step => parts.push("step schedule (×0.1 at 50 % and 75 %)".to_string()),
        }
        if self.warmup > 0 {
            parts.push(format!("{} warm-up steps", self.warmup));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod schedule_tests {
    use super::*;

    fn schedule(kind: LrScheduleKind, warmup: usize, min_lr: f32) -> LrSchedule {
        LrSchedule { kind, warmup, min_lr }
    }

    #[test]
    fn constant_is_the_base_rate_after_a_linear_warmup() {
        let s = schedule(LrScheduleKind::Constant, 3, 0.0);
        let rates = s.rates(0.8, 6);
        assert_eq!(rates, [0.2, 0.4, 0.6, 0.8, 0.8, 0.8]);
        assert_eq!(schedule(LrScheduleKind::Constant, 0, 0.0).rates(0.5, 3), [0.5; 3]);
    }

    #[test]
    fn cosine_falls_from_the_base_rate_to_the_floor() {
        let s = schedule(LrScheduleKind::Cosine, 0, 0.1);
        let rates = s.rates(1.0, 100);
        assert_eq!(rates[0], 1.0);
        assert!((rates[50] - 0.55).abs() < 1e-6, "halfway is the mean of the ends: {}", rates[50]);
        assert!(rates.windows(2).all(|w| w[1] < w[0]), "strictly falling");
        assert!(rates[99] > 0.1 && rates[99] < 0.1 + 1e-3, "{}", rates[99]);
        // With a warm-up the cosine starts after it.
        let w = schedule(LrScheduleKind::Cosine, 10, 0.0).rates(1.0, 110);
        assert!((w[9] - 10.0 / 11.0).abs() < 1e-6);
        assert_eq!(w[10], 1.0);
        assert!((w[60] - 0.5).abs() < 1e-6);
    }

    #[test]
    fn step_decays_tenfold_at_half_and_three_quarters() {
        let rates = schedule(LrScheduleKind::Step, 0, 0.0).rates(1.0, 8);
        let hundredth = STEP_DECAY.powi(2);
        assert_eq!(rates, [1.0, 1.0, 1.0, 1.0, 0.1, 0.1, hundredth, hundredth]);
        let warm = schedule(LrScheduleKind::Step, 2, 0.0).rates(1.0, 10);
        assert_eq!(&warm[..2], [1.0 / 3.0, 2.0 / 3.0]);
        assert_eq!(warm[2..6], [1.0; 4]);
        assert_eq!(warm[6], 0.1);
        assert_eq!(warm[8], STEP_DECAY.powi(2));
    }
}
