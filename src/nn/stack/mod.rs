//! Layer stacks: a network written as a list of layers (`Linear`, `Conv2d`, activations, `Dropout`,
//! `MaxPool2d`, `Flatten`), its shapes followed through every layer (`spec`), its CPU reference (`model`,
//! trained by `cpu`), and its GPU trainer (`gpu`), which compiles each group of layers of a spec into its
//! own module of `fused/fit.cu` and replays a whole epoch as one CUDA graph.
//!
//! This is the engine under `textnet fit`, `mnist`'s MLP, `sales` and the Python package's `Sequential`.
//! It sits beside the tensors with autograd of the rest of `nn`, and shares nothing with them but the CPU
//! twins of `ops`: a tensor program records ops one by one and differentiates the record, whereas a stack
//! is fixed by its spec before training, so its forward, backward and update are written per layer kind
//! and fused per spec. A model a stack can express trains faster as a stack; anything else (residuals,
//! embeddings, attention, several inputs) is written with tensors.
//!
//! Backends implement `run::Trainer` (`StackTrainer`). The caller hands a backend every split once (a GPU backend uploads
//! them once), then drives it with per-epoch sample orders and per-step learning rates, so every backend
//! sees the same shuffles and schedule and the CPU reference can check any of them.
//!
//! ```
//! use textnet::nn::stack::spec::{Layer, Shape, Spec};
//! use textnet::nn::stack::model::Network;
//! # fn main() -> anyhow::Result<()> {
//! let spec = Spec {
//!     layers: vec![
//!         Layer::Linear { inputs: Some(4), outputs: 8, bias: true },
//!         Layer::Relu,
//!         Layer::Linear { inputs: None, outputs: 2, bias: true },
//!     ],
//! };
//! let net = Network::new(&spec, Shape::Flat(4))?;
//! assert_eq!(net.outputs(), 2);
//! # Ok(())
//! # }
//! ```

pub mod bench;
pub mod cpu;
pub mod gpu;
pub mod model;
pub mod onnx;
pub mod spec;

use anyhow::Result;
use model::Loss;
use std::sync::Arc;

/// Mixed into the seed for the stream of per-epoch shuffles, so it differs from the initialisation stream;
/// every trainer of a layer stack (`textnet fit`, `mnist`'s MLP, `sales`, the Python package) shuffles with it.
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

/// A stack's trainer on some backend: the shared `run::Trainer` whose parameters are the flat vector
/// (`model::Network`'s layout) and whose evaluation of a split is its summed loss and the network's
/// outputs (`rows × outputs`).
pub type StackTrainer = dyn crate::harness::run::Trainer<Params = Vec<f32>, Evaluation = (f64, Vec<f32>)>;

/// The trainer of `setup` on `backend`: the CPU reference (`cpu::CpuTrainer`) or the GPU's.
/// `batch`: the most samples a training step takes (the GPU sizes its buffers for it).
pub fn trainer(backend: &crate::device::Backend, setup: Setup, batch: usize) -> Result<Box<StackTrainer>> {
    match backend {
        crate::device::Backend::Cpu => Ok(Box::new(cpu::CpuTrainer::new(setup)?)),
        crate::device::Backend::Cuda(gpu) => Ok(Box::new(gpu::GpuTrainer::new(gpu.clone(), setup, batch)?)),
    }
}

/// The figures of one split's evaluation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Figures {
    /// Mean loss.
    pub loss: f64,
    /// Classes: the fraction right.
    pub accuracy: Option<f64>,
    /// Values: the mean absolute error in the file's units.
    pub mae: Option<f64>,
}

impl Figures {
    /// The figures of `outputs` (`k` per sample) against `classes`, of `loss_sum` summed loss.
    pub fn of_classes(classes: &[u32], k: usize, loss_sum: f64, outputs: &[f32]) -> Figures {
        let rows = classes.len().max(1);
        let right = outputs.chunks(k).zip(classes).filter(|(o, c)| crate::ops::cpu::argmax(o) == **c as usize).count();
        Figures { loss: loss_sum / rows as f64, accuracy: Some(right as f64 / rows as f64), mae: None }
    }
}
