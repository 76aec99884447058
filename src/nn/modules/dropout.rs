//! `Dropout`: `dropout` as a layer, PyTorch's `nn.Dropout(p)`: on while training (the default), off after
//! `set_training(false)`. Each forward in training draws the next step's mask (a counter from 0), so two
//! calls drop different elements and a run from the same seed drops the same ones. The switch and the
//! counter are atomics, so a shared layer changes through `&self` as `Module` asks.
//!
//! On a GPU the counter moves to device memory at the layer's first forward there (from the host's
//! count), and the kernels read and advance it: a captured step's replays then draw step after step's
//! masks, each the one the host draws for that step. `step` counts the forwards run op by op.

use super::Module;
use crate::nn::cuda::{Device, DeviceBuffer, layers};
use crate::nn::dropout::{checked_probability, dropout};
use crate::nn::error::Result;
use crate::nn::tensor::{Tensor, lock};
use crate::ops::cpu::Real;
use crate::ops::dropout::{DropoutKey, Mask, dropout_scale, dropout_threshold, site_seed};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Zeroes each element with probability `p` in training, scaling the rest by 1/(1 − p).
#[derive(Debug)]
pub struct Dropout {
    p: f32,
    seed: u32,
    site: usize,
    training: AtomicBool,
    step: AtomicU32,
    /// The step counter on the GPU, once a forward ran there.
    device_step: Mutex<Option<DeviceBuffer>>,
}

impl Dropout {
    /// A layer dropping with probability `p` (0 ≤ p ≤ 1) under `seed`, in training, at site 0.
    pub fn new(p: f32, seed: u32) -> Result<Self> {
        checked_probability(p)?;
        Ok(Dropout {
            p,
            seed,
            site: 0,
            training: AtomicBool::new(true),
            step: AtomicU32::new(0),
            device_step: Mutex::new(None),
        })
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

    /// A layer of this one's p, seed, site and training switch at the step this one draws next (read
    /// back from the GPU when the counter lives there, where a captured step's replays advance it), with
    /// a counter of its own: the two draw the same masks from here on, each at its own pace.
    pub fn deep_copy(&self) -> Result<Dropout> {
        let step = match lock(&self.device_step).as_ref() {
            Some(counter) => counter.to_host("deepcopy")?[0].to_bits(),
            None => self.step(),
        };
        Ok(Dropout {
            p: self.p,
            seed: self.seed,
            site: self.site,
            training: AtomicBool::new(self.is_training()),
            step: AtomicU32::new(step),
            device_step: Mutex::new(None),
        })
    }
}

impl Dropout {
    /// The step counter on `device` (made from the host's count at the first forward there), for one more
    /// forward in training: the host's count advances with it (the kernels advance the device's).
    fn device_counter(&self, device: &Arc<Device>) -> Result<DeviceBuffer> {
        let mut counter = lock(&self.device_step);
        if counter.as_ref().is_none_or(|c| !Arc::ptr_eq(c.device(), device)) {
            *counter = Some(device.upload("dropout", &[f32::from_bits(self.step())])?);
        }
        self.step.fetch_add(1, Ordering::Relaxed);
        Ok(counter.clone().expect("made above"))
    }

    /// The mask's threshold and scale (scale 0 at p = 1, which drops everything).
    fn threshold_and_scale(&self) -> (u32, f32) {
        (dropout_threshold(self.p), if self.p == 1.0 { 0.0 } else { dropout_scale(self.p) })
    }

    /// The forward in training of `x` on `device`, by the counter in device memory.
    fn forward_on_device<F: Real>(&self, device: &Arc<Device>, x: &Tensor<F>) -> Result<Tensor<F>> {
        let step = self.device_counter(device)?;
        layers::dropout_counted(device, x, &step, site_seed(self.seed, self.site), self.threshold_and_scale())
    }

    /// For an op that drops with this layer's p (attention's probabilities): None outside training or at
    /// p = 0; otherwise the mask of the layer's next step, the step counted.
    pub(crate) fn next_mask(&self) -> Option<Mask> {
        let key = self.is_training().then(|| DropoutKey { seed: self.seed, step: self.step() });
        let mask = Mask::new(key, self.site, self.p)?;
        self.step.fetch_add(1, Ordering::Relaxed);
        Some(mask)
    }

    /// `next_mask` for a kernel on `device` that draws the mask itself: None outside training or at p = 0;
    /// otherwise the site's seed, a word holding this call's step (taken from the device counter, which
    /// advances), and the threshold and scale.
    pub(crate) fn next_device_mask(&self, device: &Arc<Device>) -> Result<Option<(u32, DeviceBuffer, u32, f32)>> {
        if !self.is_training() || self.p == 0.0 {
            return Ok(None);
        }
        let taken = layers::take_step(device, &self.device_counter(device)?)?;
        let (threshold, scale) = self.threshold_and_scale();
        Ok(Some((site_seed(self.seed, self.site), taken, threshold, scale)))
    }
}

impl<F: Real> Module<F> for Dropout {
    fn forward(&self, x: &Tensor<F>) -> Result<Tensor<F>> {
        let training = self.is_training();
        if training
            && self.p > 0.0
            && let Some(device) = x.device()
        {
            return self.forward_on_device(&device, x);
        }
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
