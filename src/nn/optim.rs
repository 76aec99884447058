//! Optimizers over parameter tensors, as `torch.optim`'s: SGD, SGD with momentum, Adam and AdamW in one
//! [`Optimizer`] that keeps each parameter's state (momentum's velocity, Adam's moments and step count),
//! parameter groups with their own weight decay and rate ([`ParamGroup`], [`decay_groups`] as nanoGPT's
//! `configure_optimizers`), the rate of each step from a schedule ([`Scheduler`]) and global-norm
//! clipping ([`clip_grad_norm`]).
//!
//! The math is the CPU twin of the fused update kernels, `ops::optim`: each step applies `update` to one
//! parameter with its gradient and state buffers, with the step's scalars from `OptimConfig::step_scalars`
//! (so the hyper-parameters are f32, as the kernels take them); clipping sums squares with
//! `ops::optim::add_squares` and scales with `clip_scale`; the rates come from `LrSchedule::rate`.
//!
//! As PyTorch: a parameter without a gradient is skipped (its state and step count stay), momentum's
//! velocity starts at the first gradient (μ·0 + g), and Adam's bias corrections count the steps that
//! parameter took. Momentum has neither dampening nor Nesterov's variant, Adam no AMSGrad.

use super::cuda::{self, DeviceBuffer};
use super::error::{Error, Result};
use super::tensor::{Storage, Tensor, lock};
use crate::ops::cpu::Real;
use crate::ops::optim::{OptimConfig, StepScalars, add_squares, clip_scale, update};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub use crate::ops::optim::{LrSchedule, LrScheduleKind, OptimKind};

/// Parameters that share a weight decay and a rate (PyTorch's param group).
#[derive(Clone, Debug)]
pub struct ParamGroup<F: Real = f32> {
    /// The tensors to train.
    pub parameters: Vec<Tensor<F>>,
    /// Weight decay (L2; decoupled for AdamW); None takes the optimizer's.
    pub weight_decay: Option<f32>,
    /// Factor on the optimizer's learning rate for this group.
    pub lr_scale: f32,
}

impl<F: Real> ParamGroup<F> {
    /// `parameters` at the optimizer's weight decay and rate.
    pub fn new(parameters: Vec<Tensor<F>>) -> Self {
        ParamGroup { parameters, weight_decay: None, lr_scale: 1.0 }
    }

    /// The same group with its own weight decay.
    pub fn with_weight_decay(self, weight_decay: f32) -> Self {
        ParamGroup { weight_decay: Some(weight_decay), ..self }
    }

    /// The same group at `lr_scale` times the optimizer's rate.
    pub fn with_lr_scale(self, lr_scale: f32) -> Self {
        ParamGroup { lr_scale, ..self }
    }
}

/// nanoGPT's two groups: the parameters of rank ≥ 2 (matrices, embeddings) decayed by `weight_decay`,
/// then the rest (biases, LayerNorm's gains) not decayed. Parameters that require no gradient are left
/// out, and a tensor named twice (tied weights) joins once, under its first name.
pub fn decay_groups<F: Real>(
    named_parameters: impl IntoIterator<Item = (String, Tensor<F>)>,
    weight_decay: f32,
) -> Vec<ParamGroup<F>> {
    let mut groups = vec![
        ParamGroup::new(Vec::new()).with_weight_decay(weight_decay),
        ParamGroup::new(Vec::new()).with_weight_decay(0.0),
    ];
    let mut seen: Vec<Tensor<F>> = Vec::new();
    for (_, parameter) in named_parameters {
        if !parameter.requires_grad() || seen.iter().any(|p| p.same(&parameter)) {
            continue;
        }
        seen.push(parameter.clone());
        groups[usize::from(parameter.rank() < 2)].parameters.push(parameter);
    }
    groups
}

/// What the optimizer keeps for one parameter.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParamState<F> {
    /// Steps this parameter took (those where it had a gradient).
    pub steps: u64,
    /// Momentum's velocity or Adam's first moment (empty for SGD, and before the first step).
    pub m: Vec<F>,
    /// Adam's second moment (empty for SGD and momentum, and before the first step).
    pub v: Vec<F>,
    /// `m` and `v` of a parameter on a GPU, which live there instead.
    device_moments: (Option<DeviceBuffer>, Option<DeviceBuffer>),
    /// The step count of a parameter on a GPU, kept there (a captured step advances it on each replay,
    /// while `steps` counts the steps the host ran).
    device_steps: Option<DeviceBuffer>,
}

#[derive(Debug)]
struct Group<F: Real> {
    parameters: Vec<Tensor<F>>,
    weight_decay: f32,
    lr_scale: f32,
    states: Vec<ParamState<F>>,
}

/// SGD, momentum, Adam or AdamW (`OptimConfig::kind`) over groups of parameters.
#[derive(Debug)]
pub struct Optimizer<F: Real = f32> {
    config: OptimConfig,
    groups: Vec<Group<F>>,
    /// The base rate on the GPU, once a parameter there took a step: the update kernels read it, so
    /// `set_lr` reaches a captured step's replays.
    device_lr: Option<DeviceBuffer>,
}

impl<F: Real> Optimizer<F> {
    /// The optimizer `config` asks for (its `weight_decay` is the default of groups that give none; its
    /// `clip_norm`, when not 0, clips the global norm of all gradients before each step) over `groups`.
    /// An error names the first hyper-parameter out of range or a tensor listed twice.
    pub fn new(config: OptimConfig, groups: Vec<ParamGroup<F>>) -> Result<Self> {
        validate(&config)?;
        let op = config.kind.name();
        let listed: Vec<(usize, usize, &Tensor<F>)> = (groups.iter().enumerate())
            .flat_map(|(g, group)| group.parameters.iter().enumerate().map(move |(i, p)| (g, i, p)))
            .collect();
        for (k, &(g, i, parameter)) in listed.iter().enumerate() {
            if let Some((h, j, _)) = listed[..k].iter().find(|(_, _, earlier)| earlier.same(parameter)) {
                let problem = format!("parameter {i} of group {g} is parameter {j} of group {h} again: list each once");
                return Err(Error::value(op, problem));
            }
        }
        let mut mine: Vec<Group<F>> = Vec::with_capacity(groups.len());
        for (g, group) in groups.into_iter().enumerate() {
            let weight_decay = group.weight_decay.unwrap_or(config.weight_decay);
            Range::NonNegative.check(op, &format!("the weight decay of group {g}"), weight_decay)?;
            Range::NonNegative.check(op, &format!("the lr scale of group {g}"), group.lr_scale)?;
            let states = vec![ParamState::default(); group.parameters.len()];
            mine.push(Group { parameters: group.parameters, weight_decay, lr_scale: group.lr_scale, states });
        }
        Ok(Optimizer { config, groups: mine, device_lr: None })
    }

    /// One group of `parameters` under `kind`'s defaults at rate `lr` (β 0.9 and 0.999, ε 1e-8, no
    /// weight decay).
    fn single(kind: OptimKind, parameters: Vec<Tensor<F>>, lr: f32) -> Result<Self> {
        Self::new(OptimConfig { lr, ..OptimConfig::new(kind) }, vec![ParamGroup::new(parameters)])
    }

    /// Plain SGD at rate `lr` (`torch.optim.SGD(params, lr)`).
    pub fn sgd(parameters: Vec<Tensor<F>>, lr: f32) -> Result<Self> {
        Self::single(OptimKind::Sgd, parameters, lr)
    }

    /// SGD with momentum μ (`torch.optim.SGD(params, lr, momentum)`).
    pub fn momentum(parameters: Vec<Tensor<F>>, lr: f32, momentum: f32) -> Result<Self> {
        let optimizer = Self::single(OptimKind::Momentum, parameters, lr)?;
        optimizer.with(|c| c.momentum = momentum)
    }

    /// Adam (`torch.optim.Adam(params, lr)`).
    pub fn adam(parameters: Vec<Tensor<F>>, lr: f32) -> Result<Self> {
        Self::single(OptimKind::Adam, parameters, lr)
    }

    /// AdamW with decoupled weight decay (`torch.optim.AdamW(params, lr, weight_decay=…)`).
    pub fn adamw(parameters: Vec<Tensor<F>>, lr: f32, weight_decay: f32) -> Result<Self> {
        Self::single(OptimKind::AdamW, parameters, lr)?.with_weight_decay(weight_decay)
    }

    /// The same optimizer after `change` to its configuration, checked.
    fn with(mut self, change: impl FnOnce(&mut OptimConfig)) -> Result<Self> {
        change(&mut self.config);
        validate(&self.config)?;
        Ok(self)
    }

    /// The same optimizer with weight decay `weight_decay` in every group.
    pub fn with_weight_decay(mut self, weight_decay: f32) -> Result<Self> {
        self.groups.iter_mut().for_each(|g| g.weight_decay = weight_decay);
        self.with(|c| c.weight_decay = weight_decay)
    }

    /// The same optimizer with Adam's β1 and β2.
    pub fn with_betas(self, beta1: f32, beta2: f32) -> Result<Self> {
        self.with(|c| (c.beta1, c.beta2) = (beta1, beta2))
    }

    /// The same optimizer with Adam's ε.
    pub fn with_eps(self, eps: f32) -> Result<Self> {
        self.with(|c| c.eps = eps)
    }

    /// The update rule.
    pub fn kind(&self) -> OptimKind {
        self.config.kind
    }

    /// The learning rate of the next steps (each group's is this times its lr scale).
    pub fn lr(&self) -> f32 {
        self.config.lr
    }

    /// Sets the learning rate of the next steps (a schedule sets it before each step; see [`Scheduler`]).
    pub fn set_lr(&mut self, lr: f32) -> Result<()> {
        Range::NonNegative.check(self.config.kind.name(), "the learning rate", lr)?;
        self.config.lr = lr;
        if let Some(device_lr) = self.device_lr.as_mut() {
            device_lr.overwrite("set_lr", &[lr])?;
        }
        Ok(())
    }

    /// Sets group `group`'s factor on the learning rate for the next steps (PyTorch's
    /// `param_groups[group]["lr"]` is this factor at a base rate of 1). A captured step keeps the factor
    /// it recorded; `set_lr` reaches its replays.
    pub fn set_lr_scale(&mut self, group: usize, lr_scale: f32) -> Result<()> {
        let op = self.config.kind.name();
        Range::NonNegative.check(op, &format!("the lr scale of group {group}"), lr_scale)?;
        let count = self.groups.len();
        let mine = self
            .groups
            .get_mut(group)
            .ok_or_else(|| Error::value(op, format!("there is no group {group} of {count}")))?;
        mine.lr_scale = lr_scale;
        Ok(())
    }

    /// The number of parameter groups.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// The state of parameter `index` of group `group` (None when there is no such parameter).
    pub fn state(&self, group: usize, index: usize) -> Option<&ParamState<F>> {
        self.groups.get(group)?.states.get(index)
    }

    /// This optimizer (configuration, groups' rates and weight decays, every parameter's state, step
    /// counts included) over `parameters` instead, one list per group of this one's lengths: PyTorch's
    /// deep copy of an optimizer, whose parameters are the copies of its model's. The state is copied,
    /// not shared, on the GPU too.
    pub fn deep_copy_onto(&self, parameters: Vec<Vec<Tensor<F>>>) -> Result<Self> {
        const OP: &str = "deepcopy";
        let mine: Vec<usize> = self.groups.iter().map(|g| g.parameters.len()).collect();
        let given: Vec<usize> = parameters.iter().map(Vec::len).collect();
        if mine != given {
            return Err(Error::value(OP, format!("groups of {given:?} parameters given for groups of {mine:?}")));
        }
        let copied = |buffer: &Option<DeviceBuffer>| buffer.as_ref().map(|b| b.duplicate(OP)).transpose();
        let mut groups = Vec::with_capacity(self.groups.len());
        for (group, parameters) in self.groups.iter().zip(parameters) {
            let states: Result<Vec<ParamState<F>>> = (group.states.iter())
                .map(|state| {
                    Ok(ParamState {
                        device_moments: (copied(&state.device_moments.0)?, copied(&state.device_moments.1)?),
                        device_steps: copied(&state.device_steps)?,
                        ..state.clone()
                    })
                })
                .collect();
            groups.push(Group { parameters, states: states?, ..*group });
        }
        Ok(Optimizer { config: self.config, groups, device_lr: copied(&self.device_lr)? })
    }

    /// Every parameter, group after group.
    pub fn parameters(&self) -> impl Iterator<Item = &Tensor<F>> {
        self.groups.iter().flat_map(|g| &g.parameters)
    }

    /// Updates every parameter that has a gradient, in place (the others are left as they are, state
    /// included). With a clip norm in the configuration the gradients are clipped first, in place.
    ///
    /// Parameters on the host are updated one after another; those on a GPU all together, as PyTorch's
    /// multi-tensor Adam: a launch advancing the step counts and one updating the parameters per table of
    /// up to 64 (`cuda::optim::update_tensors`), with the same math per element as the host's.
    pub fn step(&mut self) -> Result<()> {
        const OP: &str = "optimizer step";
        if self.config.clip_norm > 0.0 {
            let parameters: Vec<Tensor<F>> = self.parameters().cloned().collect();
            let max_norm = F::from(self.config.clip_norm).unwrap_or_else(F::infinity);
            clip_grad_norm(&parameters, max_norm)?;
        }
        let kind = self.config.kind;
        // What every device parameter shares: its rate and weight decay go in its entry, Adam's bias
        // corrections come from its step count on the device.
        let scalars = self.config.step_scalars(1, 0.0);
        let mut batch: Option<DeviceBatch> = None;
        for group in &mut self.groups {
            let config =
                OptimConfig { lr: self.config.lr * group.lr_scale, weight_decay: group.weight_decay, ..self.config };
            for (parameter, state) in group.parameters.iter().zip(&mut group.states) {
                let grad = match lock(&parameter.0.grad).as_ref() {
                    None => continue,
                    Some(Storage::Device(grad)) => grad.clone(),
                    Some(Storage::Host(grad)) => {
                        let (m, v) = kind.buffer_lens(grad.len());
                        if state.steps == 0 {
                            (state.m, state.v) = (vec![F::zero(); m], vec![F::zero(); v]);
                        }
                        state.steps += 1;
                        let scalars = config.step_scalars(state.steps, 0.0);
                        let (m, v) = (&mut state.m, &mut state.v);
                        parameter.update_in_place(|theta| update(kind, &scalars, theta, grad, m, v))?;
                        continue;
                    }
                };
                let device = Arc::clone(grad.device());
                if self.device_lr.as_ref().is_some_and(|lr| !Arc::ptr_eq(lr.device(), &device)) {
                    let problem = "the parameters live on more than one GPU: one optimizer steps the parameters of one";
                    return Err(Error::device(OP, problem));
                }
                let base_lr = match &self.device_lr {
                    Some(base_lr) => base_lr,
                    None => self.device_lr.insert(device.upload(OP, &[self.config.lr])?),
                };
                let batch =
                    batch.get_or_insert_with(|| DeviceBatch { device, entries: Vec::new(), storages: HashSet::new() });
                if !batch.storages.insert(Arc::as_ptr(&parameter.0.storage) as usize) {
                    batch.launch(kind, &scalars, base_lr)?;
                    batch.storages.insert(Arc::as_ptr(&parameter.0.storage) as usize);
                }
                let device = &batch.device;
                if state.steps == 0 {
                    let (m, v) = kind.buffer_lens(grad.len());
                    let zeros = |n: usize| (n > 0).then(|| device.upload(OP, &vec![0.0; n])).transpose();
                    state.device_moments = (zeros(m)?, zeros(v)?);
                    state.device_steps = Some(device.upload(OP, &[0.0])?);
                }
                state.steps += 1;
                let Some(steps) = state.device_steps.clone() else { unreachable!("set at the parameter's first step") };
                batch.entries.push(cuda::optim::UpdateEntry {
                    theta: parameter.buffer_to_update(OP)?,
                    grad,
                    moments: state.device_moments.clone(),
                    steps,
                    lr_scale: group.lr_scale,
                    weight_decay: group.weight_decay,
                });
            }
        }
        if let (Some(mut batch), Some(base_lr)) = (batch, self.device_lr.as_ref()) {
            batch.launch(kind, &scalars, base_lr)?;
        }
        Ok(())
    }

    /// Forgets every parameter's gradient.
    pub fn zero_grad(&self) {
        self.parameters().for_each(Tensor::zero_grad);
    }
}

/// The device parameters of an optimizer step, gathered to be updated together.
struct DeviceBatch {
    device: Arc<cuda::Device>,
    entries: Vec<cuda::optim::UpdateEntry>,
    /// The storage of each entry's parameter (its address): a tensor sharing one (a detached view of a
    /// parameter) is gathered after the entries so far are launched, so that it updates what they wrote,
    /// as one after the other on the host.
    storages: HashSet<usize>,
}

impl DeviceBatch {
    /// Updates the parameters gathered so far and forgets them.
    fn launch(&mut self, kind: OptimKind, scalars: &StepScalars, base_lr: &DeviceBuffer) -> Result<()> {
        cuda::optim::update_tensors(&self.device, kind, scalars, base_lr, &self.entries)?;
        self.entries.clear();
        self.storages.clear();
        Ok(())
    }
}

/// Ok when the configuration's hyper-parameters are in range (PyTorch's ranges: a rate may be 0).
fn validate(c: &OptimConfig) -> Result<()> {
    let op = c.kind.name();
    Range::NonNegative.check(op, "the learning rate", c.lr)?;
    Range::NonNegative.check(op, "the weight decay", c.weight_decay)?;
    Range::NonNegative.check(op, "the clip norm", c.clip_norm)?;
    match c.kind {
        OptimKind::Sgd => Ok(()),
        OptimKind::Momentum => Range::Fraction.check(op, "the momentum", c.momentum),
        OptimKind::Adam | OptimKind::AdamW => {
            Range::Fraction.check(op, "β1", c.beta1)?;
            Range::Fraction.check(op, "β2", c.beta2)?;
            Range::Positive.check(op, "ε", c.eps)
        }
    }
}

/// Where a hyper-parameter must lie.
#[derive(Clone, Copy)]
enum Range {
    /// Finite and ≥ 0 (rates, weight decay, scales).
    NonNegative,
    /// Finite and > 0 (Adam's ε).
    Positive,
    /// In [0, 1) (momentum, Adam's β).
    Fraction,
}

impl Range {
    /// Ok when `value` lies in the range, otherwise `op: WHAT must be RANGE, got VALUE`.
    fn check(self, op: &'static str, what: &str, value: f32) -> Result<()> {
        let (holds, range) = match self {
            Range::NonNegative => (value.is_finite() && value >= 0.0, "a finite number ≥ 0"),
            Range::Positive => (value.is_finite() && value > 0.0, "a finite number > 0"),
            Range::Fraction => ((0.0..1.0).contains(&value), "in [0, 1)"),
        };
        if holds { Ok(()) } else { Err(Error::value(op, format!("{what} must be {range}, got {value}"))) }
    }
}

/// Scales the gradients of `parameters` so that their global L2 norm is at most `max_norm`
/// (`torch.nn.utils.clip_grad_norm_`, with the fused kernels' factor `max_norm / norm` when the norm is
/// above it) and returns the norm before clipping, as a tensor of shape `[]` where the gradients live.
/// Parameters without a gradient are skipped.
///
/// On the host the squares are summed in f64, element after element, parameter after parameter in the
/// given order. When every gradient lives on one GPU, the whole clip runs there and nothing is read back,
/// so a captured step clips too, in three launches however many gradients (one more per 128 beyond 128):
/// each gradient cut into chunks of `TENSOR_CHUNK` (8192) elements, each chunk's squares summed in f32 by
/// one block (each thread its elements in order, then a fixed tree), the chunks' sums then in f64 by one
/// block in a fixed order; each gradient then scaled in place (into a new buffer where something else
/// holds it, as a gradient handed out by `grad()`). The same norm but for the f32 rounding of the chunk
/// sums: within about 40 units of f32 rounding (2⁻²⁴) of the host's, and the same bits on every run and GPU.
pub fn clip_grad_norm<F: Real>(parameters: &[Tensor<F>], max_norm: F) -> Result<Tensor<F>> {
    if !(max_norm.is_finite() && max_norm > F::zero()) {
        let problem =
            format!("max_norm must be a positive finite number, got {}", max_norm.to_f64().unwrap_or(f64::NAN));
        return Err(Error::value("clip_grad_norm", problem));
    }
    // Each gradient is locked in turn (a parameter may be listed twice).
    let (mut device_grads, mut host_squares, mut on_host) = (Vec::new(), 0.0, false);
    for parameter in parameters {
        match lock(&parameter.0.grad).as_ref() {
            Some(Storage::Device(g)) => device_grads.push(g.clone()),
            Some(Storage::Host(g)) => (host_squares, on_host) = (add_squares(host_squares, g), true),
            None => {}
        }
    }
    if let Some(device) = device_grads.first().map(|g| Arc::clone(g.device())) {
        if on_host || device_grads.iter().any(|g| !Arc::ptr_eq(g.device(), &device)) {
            let problem = "the gradients live in more than one place: move the parameters to one device";
            return Err(Error::device("clip_grad_norm", problem));
        }
        let limit = max_norm.to_f32().unwrap_or(f32::NAN);
        let (norm, factor) = cuda::optim::clip_norm(&device, &device_grads, limit)?;
        drop(device_grads);
        scale_device_grads(&device, parameters, &factor)?;
        return Ok(Tensor::from_device_buffer(norm, Vec::new()));
    }
    let norm = F::from(host_squares.sqrt()).unwrap_or_else(F::nan);
    let scale = clip_scale(norm, max_norm);
    if scale != F::one() {
        for parameter in parameters {
            if let Some(Storage::Host(g)) = lock(&parameter.0.grad).as_mut() {
                g.iter_mut().for_each(|g| *g = scale * *g);
            }
        }
    }
    Ok(Tensor::scalar(norm))
}

/// Multiplies the device gradient of each of `parameters` by `factor` (a float on the device) once per
/// time the parameter is listed, as the host does, in one launch per 128 parameters: in place where the
/// gradient's buffer is held by nothing else, else into a new buffer that then becomes the gradient.
fn scale_device_grads<F: Real>(
    device: &Arc<cuda::Device>,
    parameters: &[Tensor<F>],
    factor: &DeviceBuffer,
) -> Result<()> {
    const OP: &str = "clip_grad_norm";
    // Each parameter once, with the times it is listed, in the order of first listing.
    let mut distinct: Vec<(&Tensor<F>, usize)> = Vec::new();
    let mut index: HashMap<*const (), usize> = HashMap::new();
    for parameter in parameters {
        let at = *index.entry(Arc::as_ptr(&parameter.0).cast()).or_insert(distinct.len());
        if at == distinct.len() {
            distinct.push((parameter, 0));
        }
        distinct[at].1 += 1;
    }
    let (mut entries, mut replaced) = (Vec::new(), Vec::new());
    for (parameter, times) in distinct {
        let slot = lock(&parameter.0.grad);
        let Some(Storage::Device(g)) = slot.as_ref() else { continue };
        let out = if g.is_unshared() { None } else { Some(device.alloc(OP, g.len())?) };
        if let Some(out) = &out {
            replaced.push((parameter, out.clone()));
        }
        entries.push(cuda::optim::ScaleEntry { x: g.clone(), out, times });
    }
    cuda::optim::scale_tensors(device, &entries, factor)?;
    for (parameter, out) in replaced {
        *lock(&parameter.0.grad) = Some(Storage::Device(out));
    }
    Ok(())
}

/// The learning rate of each step of a run: a base rate through an `LrSchedule` (linear warm-up, then
/// constant, cosine down to a floor, or ×0.1 steps), as the training commands' `--lr-schedule`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scheduler {
    lr: f32,
    schedule: LrSchedule,
    total: usize,
}

impl Scheduler {
    /// The rates of a run of `total` steps at base rate `lr` under `schedule`.
    pub fn new(lr: f32, schedule: LrSchedule, total: usize) -> Result<Self> {
        let op = "Scheduler";
        Range::NonNegative.check(op, "the learning rate", lr)?;
        Range::NonNegative.check(op, "min_lr", schedule.min_lr)?;
        if schedule.min_lr > lr {
            return Err(Error::value(op, format!("min_lr {} is above the learning rate {lr}", schedule.min_lr)));
        }
        if schedule.min_lr > 0.0 && schedule.kind != LrScheduleKind::Cosine {
            let problem = format!("min_lr applies to the cosine schedule only (this one is {})", schedule.kind.name());
            return Err(Error::value(op, problem));
        }
        if total == 0 {
            return Err(Error::value(op, "a run of 0 steps has no rates"));
        }
        if schedule.warmup > 0 && schedule.warmup >= total {
            let problem = format!("{} warm-up steps leave none of the run's {total} to the schedule", schedule.warmup);
            return Err(Error::value(op, problem));
        }
        Ok(Scheduler { lr, schedule, total })
    }

    /// Linear warm-up over `warmup` steps, then half a cosine from `lr` down to `min_lr` at the end of
    /// `total` steps (nanoGPT's `get_lr`).
    pub fn cosine(lr: f32, warmup: usize, min_lr: f32, total: usize) -> Result<Self> {
        Self::new(lr, LrSchedule { kind: LrScheduleKind::Cosine, warmup, min_lr }, total)
    }

    /// The rate of step `step` (from 0; a step past the run gets the rate at its end).
    pub fn rate(&self, step: usize) -> f32 {
        self.schedule.rate(self.lr, step, self.total)
    }

    /// Sets `optimizer`'s rate to that of step `step`, and returns it.
    pub fn apply<F: Real>(&self, optimizer: &mut Optimizer<F>, step: usize) -> Result<f32> {
        let rate = self.rate(step);
        optimizer.set_lr(rate)?;
        Ok(rate)
    }
}
