//! Optimizers over a list of parameter tensors. Each update is `ops::optim::update`, the rule the fused
//! update kernels implement, applied to each parameter with its accumulated gradient.

use super::cuda;
use super::error::{Error, Result};
use super::tensor::{Storage, Tensor};
use crate::cpu::Real;
use crate::ops::optim::{OptimConfig, OptimKind, update};

/// Stochastic gradient descent: θ ← θ − lr·(g + wd·θ) for every parameter that has a gradient.
pub struct Sgd<F: Real = f32> {
    parameters: Vec<Tensor<F>>,
    config: OptimConfig,
    steps: u64,
}

impl<F: Real> Sgd<F> {
    /// SGD at rate `lr` over `parameters`, without weight decay.
    pub fn new(parameters: Vec<Tensor<F>>, lr: f32) -> Result<Self> {
        let mut sgd = Sgd { parameters, config: OptimConfig::new(OptimKind::Sgd), steps: 0 };
        sgd.set_lr(lr)?;
        Ok(sgd)
    }

    /// Adds L2 weight decay `weight_decay` (≥ 0) to every gradient.
    pub fn with_weight_decay(mut self, weight_decay: f32) -> Result<Self> {
        if !(weight_decay.is_finite() && weight_decay >= 0.0) {
            return Err(Error::value("sgd", format!("weight decay must be a finite number ≥ 0, got {weight_decay}")));
        }
        self.config.weight_decay = weight_decay;
        Ok(self)
    }

    /// The rate of the next steps (a schedule sets it before each step).
    pub fn set_lr(&mut self, lr: f32) -> Result<()> {
        if !(lr.is_finite() && lr > 0.0) {
            return Err(Error::value("sgd", format!("the learning rate must be a positive finite number, got {lr}")));
        }
        self.config.lr = lr;
        Ok(())
    }

    /// The rate of the next step.
    pub fn lr(&self) -> f32 {
        self.config.lr
    }

    /// Updates every parameter that has a gradient (the others are left as they are, as PyTorch does).
    pub fn step(&mut self) -> Result<()> {
        self.steps += 1;
        let scalars = self.config.step_scalars(self.steps, 0.0);
        for parameter in &self.parameters {
            let Some(grad) = parameter.grad() else { continue };
            match &*grad.storage() {
                Storage::Host(grad) => parameter
                    .update_in_place(|theta| update(OptimKind::Sgd, &scalars, theta, grad, &mut [], &mut []))?,
                Storage::Device(grad) => parameter.replace_on_device("sgd", |theta| {
                    cuda::ops::update(theta.device(), OptimKind::Sgd, &scalars, theta, grad, (None, None))
                })?,
            }
        }
        Ok(())
    }

    /// Forgets every parameter's gradient.
    pub fn zero_grad(&self) {
        self.parameters.iter().for_each(Tensor::zero_grad);
    }
}
