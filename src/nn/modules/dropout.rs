//! `Dropout`: `dropout` as a layer, PyTorch's `nn.Dropout(p)`: on while training (the default), off after
//! `set_training(false)`. Each forward in training draws the next step's mask (a counter from 0), so two
//! calls drop different elements and a run from the same seed drops the same ones. The switch and the
//! counter are atomics, so a shared layer changes through `&self` as `Module` asks.

use super::Module;
use crate::cpu::Real;
use crate::nn::dropout::{checked_probability, dropout};
use crate::nn::error::Result;
use crate::nn::tensor::Tensor;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Zeroes each element with probability `p` in training, scaling the rest by 1/(1 − p).
#[derive(Debug)]
pub struct Dropout {
    p: f32,
    seed: u32,
    site: usize,
    training: AtomicBool,
    step: AtomicU32,
}

impl Dropout {
    /// A layer dropping with probability `p` (0 ≤ p ≤ 1) under `seed`, in training, at site 0.
    pub fn new(p: f32, seed: u32) -> Result<Self> {
        checked_probability(p)?;
        Ok(Dropout { p, seed, site: 0, training: AtomicBool::new(true), step: AtomicU32::new(0) })
    }

    /// The layer at site `site`: layers sharing a seed draw independent masks at different sites.
    pub fn with_site(mut self, site: usize) -> Self {
        self.site = site;
        self
    }

    /// The probability of dropping an element.
    pub fn p(&self) -> f32 {
        self.p
    }

    /// Whether forward drops elements now.
    pub fn is_training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }

    /// The step whose mask the next forward in training draws (the forwards in training so far).
    pub fn step(&self) -> u32 {
        self.step.load(Ordering::Relaxed)
    }
}

impl<F: Real> Module<F> for Dropout {
    fn forward(&self, x: &Tensor<F>) -> Result<Tensor<F>> {
        let training = self.is_training();
        let step = if training { self.step.fetch_add(1, Ordering::Relaxed) } else { 0 };
        dropout(x, self.p, training, self.seed, step, self.site)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<F>)> {
        Vec::new()
    }

    fn set_training(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
    }
}
