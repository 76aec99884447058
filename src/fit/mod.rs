//! Models the user writes (`textnet fit --layers SPEC`): the spec, parsed and its shapes followed through
//! every layer (`spec`), the network's CPU reference (`model`), the trainers that run it, and its image
//! models opened for the shared `textnet classify` (`classify`).
//!
//! Backends implement `FitTrainer`. The caller hands a backend every split once (a GPU backend uploads
//! them once), then drives it with per-epoch sample orders and per-step learning rates, so every backend
//! sees the same shuffles and schedule and the CPU reference can check any of them.

pub mod bench;
pub mod checks;
pub mod classify;
pub mod cli;
pub mod cpu;
pub mod data;
pub mod gpu;
pub mod model;
pub mod modelfile;
pub mod spec;

use anyhow::Result;
use model::Loss;
use std::sync::Arc;

/// Mixed into the seed for the stream of per-epoch shuffles, so it differs from the initialisation stream;
/// every trainer of a fit network (`textnet fit`, its presets, the Python package) shuffles with it.
pub const SHUFFLE_STREAM: u64 = 0x5348_5546_464c_4553;

/// One split in memory: `rows` samples of `features` values, and their targets.
#[derive(Clone, Debug, PartialEq)]
pub struct Samples {
    /// Values per sample (the network's input size; images channel-major).
    pub features: usize,
    /// `rows × features` inputs.
    pub x: Vec<f32>,
    /// What each sample is measured against.
    pub target: Target,
}

/// The targets of a split.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// A class index per sample (cross-entropy).
    Classes(Vec<u32>),
    /// `rows × outputs` values (squared error).
    Values(Vec<f32>),
}

impl Samples {
    /// Number of samples.
    pub fn rows(&self) -> usize {
        self.x.len() / self.features.max(1)
    }

    /// Bytes its inputs and targets take in memory.
    pub fn bytes(&self) -> u64 {
        let targets = match &self.target {
            Target::Classes(c) => c.len(),
            Target::Values(v) => v.len(),
        };
        (self.x.len() as u64 + targets as u64) * 4
    }

    /// The targets as the reference's loss reads them.
    pub fn targets(&self) -> model::Targets<'_> {
        match &self.target {
            Target::Classes(c) => model::Targets::Classes(c),
            Target::Values(v) => model::Targets::Values(v),
        }
    }
}

/// What a trainer is built from.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The network.
    pub net: model::Network,
    /// Its starting parameters (flat, `Network` layout).
    pub params: Vec<f32>,
    /// The loss.
    pub loss: Loss,
    /// The optimizer (its `lr` is replaced per step by `train_epoch`'s rates).
    pub optim: crate::ops::optim::OptimConfig,
    /// Seed of dropout's masks (`model::DropoutKey::seed`).
    pub dropout_seed: u32,
    /// The splits: `splits[0]` is trained on; every split can be evaluated.
    pub splits: Vec<Arc<Samples>>,
}

/// A training backend. It owns the parameters, the optimizer state and every split (on a GPU: resident in
/// device memory).
pub trait FitTrainer {
    /// One pass over the samples `order` of split 0, `batch` per optimizer step (the last step may be
    /// shorter), step k at learning rate `lr[k]` (`lr.len()` = the number of steps). Calls `progress`
    /// with the samples done so far, at least once per step or group of steps. Returns the summed
    /// per-sample loss.
    fn train_epoch(&mut self, order: &[u32], batch: usize, lr: &[f32], progress: &mut dyn FnMut(usize)) -> Result<f64>;
    /// `train_epoch` at the one learning rate `lr` for every step.
    fn train_epoch_at(&mut self, order: &[u32], batch: usize, lr: f32, progress: &mut dyn FnMut(usize)) -> Result<f64> {
        self.train_epoch(order, batch, &vec![lr; order.len().div_ceil(batch.max(1))], progress)
    }
    /// The summed loss over split `split` and the network's outputs (`rows × outputs`), dropout off,
    /// nothing updated.
    fn evaluate(&mut self, split: usize) -> Result<(f64, Vec<f32>)>;
    /// A host copy of the current parameters.
    fn params(&mut self) -> Result<Vec<f32>>;
}

/// The trainer of `setup` on `backend`: the CPU reference (`cpu::CpuTrainer`) or the GPU's.
/// `batch`: the most samples a training step takes (the GPU sizes its buffers for it).
pub fn trainer(backend: &crate::device::Backend, setup: Setup, batch: usize) -> Result<Box<dyn FitTrainer>> {
    match backend {
        crate::device::Backend::Cpu => Ok(Box::new(cpu::CpuTrainer::new(setup)?)),
        crate::device::Backend::Cuda(gpu) => Ok(Box::new(gpu::GpuTrainer::new(gpu.clone(), setup, batch)?)),
    }
}

/// The fit pipeline as the command line, `selftest` and `bench` see it.
pub const PIPELINE: crate::pipeline::Pipeline = crate::pipeline::Pipeline {
    name: "fit",
    commands: &[crate::pipeline::Command {
        name: "fit",
        about: "Train a network written as layers (--layers \"Linear(784, 128), ReLU, Linear(128, 10)\") on images or a table, or predict with one",
        args: <cli::FitArgs as clap::Args>::augment_args,
        run: |m| cli::run(crate::pipeline::parsed(m)?),
    }],
    checks: checks::selftest_checks,
    modules: checks::modules,
    benches: &[crate::pipeline::Bench {
        name: "fit",
        about: "A --layers model's training speed and accuracy on Fashion-MNIST or a --table",
        args: <bench::FitBenchArgs as clap::Args>::augment_args,
        run: |gpu, options, m| bench::run(gpu, options, &crate::pipeline::parsed(m)?),
    }],
    models: &[&crate::modelkind::FIT],
    language_model: None,
    image_classifier: Some(crate::pipeline::ImageClassifier { open: classify::open }),
};
