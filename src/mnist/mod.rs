//! The MNIST / Fashion-MNIST classifiers, a 784 → hidden → 10 MLP and a small CNN: IDX loading (`idx`,
//! `datasets::mnist`), the MLP's parameters, file and CPU inference (`model`) and its trainer (`mlp`: the network as a
//! layer stack, on `nn::stack`'s CPU reference or GPU kernels), the CNN's CPU reference and hand-fused GPU trainer
//! (`cnn`, `cnn_gpu`), the epoch loop both share (`train`), `textnet mnist` (`args`, `cli`, `setup`, `epochs`,
//! `ending`) and its model files opened for the shared `textnet classify` (`classify`). The optimizers are the shared
//! `ops::optim`.  Backends implement `run::Trainer` (`MnistTrainer`). The caller hands a backend both splits once, as
//! contiguous buffers (a GPU backend uploads them once), then drives it with per-epoch sample orders and per-step
//! learning rates, so every backend sees the same shuffles and schedule and the CPU reference can check any of them.

pub use crate::datasets::mnist::INPUT_SCALING;

pub mod args;
pub mod bench;
pub use crate::datasets::idx;
pub use crate::harness::classification::Evaluation;
pub mod classify;
pub mod cli;
pub mod cnn;
pub mod cnn_checks;
pub mod cnn_gpu;
mod ending;
mod epochs;
pub use crate::datasets::images;
pub mod mlp;
pub mod model;
pub mod onnx;
mod setup;
pub mod train;

use crate::device::Backend;
use crate::harness::run::Trainer;
use crate::ops::optim::{OptimConfig, Optimizer};
use anyhow::{Result, bail};
use idx::Split;
use model::MlpParams;
use std::sync::Arc;

/// The classifier's architecture.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModelKind {
    /// 784 → hidden → 10
    #[default]
    Mlp,
    /// two conv3x3 + ReLU + maxpool2 layers (8, 16 channels), then 784 → 64 → 10
    Cnn,
}

/// A classifier's parameters: the MLP or the CNN.
#[derive(Clone, Debug, PartialEq)]
pub enum Classifier {
    /// The multilayer perceptron.
    Mlp(MlpParams),
    /// The convolutional network.
    Cnn(cnn::CnnParams),
}

impl Classifier {
    /// Which architecture it is.
    pub fn kind(&self) -> ModelKind {
        match self {
            Classifier::Mlp(_) => ModelKind::Mlp,
            Classifier::Cnn(_) => ModelKind::Cnn,
        }
    }

    /// Number of parameters.
    pub fn param_count(&self) -> usize {
        match self {
            Classifier::Mlp(p) => p.flat.len(),
            Classifier::Cnn(p) => p.flat.len(),
        }
    }

    /// Whether every parameter is finite.
    pub fn all_finite(&self) -> bool {
        match self {
            Classifier::Mlp(p) => p.all_finite(),
            Classifier::Cnn(p) => p.all_finite(),
        }
    }

    /// Whether it takes 28×28 images into the 10 MNIST classes.
    pub fn fits_mnist(&self) -> bool {
        match self {
            Classifier::Mlp(p) => p.shape.inputs == idx::PIXELS && p.shape.classes == idx::CLASSES,
            Classifier::Cnn(p) => p.shape.side * p.shape.side == idx::PIXELS && p.shape.classes == idx::CLASSES,
        }
    }

    /// Loss and confusion matrix over all of `data`, on the CPU (the MLP's as its trainer evaluates).
    pub fn evaluate(&self, data: &Split) -> Result<Evaluation> {
        Ok(match self {
            Classifier::Mlp(p) => mlp::evaluate(p, data)?,
            Classifier::Cnn(p) => cnn::evaluate(p, data),
        })
    }

    /// The model file's bytes (.safetensors), with `extra` metadata entries added.
    pub fn to_safetensors(&self, extra: &[(&str, &str)]) -> Result<Vec<u8>> {
        match self {
            Classifier::Mlp(p) => p.to_safetensors(extra),
            Classifier::Cnn(p) => p.to_safetensors(extra),
        }
    }

    /// Either kind of MNIST model file, told apart by its `format` metadata.
    pub fn from_safetensors(bytes: &[u8]) -> Result<(Classifier, std::collections::HashMap<String, String>)> {
        let (_, header) = safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| anyhow::anyhow!("not a safetensors file ({e})"))?;
        let is_cnn = header.metadata().as_ref().is_some_and(|m| crate::io::modelkind::MNIST_CNN.matches(m));
        let (model, meta) = if is_cnn {
            cnn::CnnParams::from_safetensors(bytes).map(|(p, meta)| (Classifier::Cnn(p), meta))?
        } else {
            MlpParams::from_safetensors(bytes).map(|(p, meta)| (Classifier::Mlp(p), meta))?
        };
        let finite = match &model {
            Classifier::Mlp(p) => p.all_finite(),
            Classifier::Cnn(p) => p.all_finite(),
        };
        if !finite {
            anyhow::bail!("the parameters contain NaN or infinite values");
        }
        Ok((model, meta))
    }
}

/// An MNIST trainer: the shared `run::Trainer` over a `Classifier`'s parameters, evaluating the test
/// split (`run::TEST`, the one split it holds besides the training one) to a loss and confusion matrix.
pub type MnistTrainer = dyn Trainer<Params = Classifier, Evaluation = Evaluation>;

/// Refuses a split other than the test split, the one an MNIST trainer evaluates.
fn test_split_only(split: usize) -> Result<()> {
    crate::harness::run::test_split_only("an MNIST trainer", split)
}

/// The trainer for `backend` and the model's kind, for batches of up to `batch` samples; on a GPU both
/// splits are copied to it once.
pub fn trainer(
    backend: &Backend,
    params: Classifier,
    optim: OptimConfig,
    train: Arc<Split>,
    test: Arc<Split>,
    batch: usize,
) -> Result<Box<MnistTrainer>> {
    Ok(match (backend, params) {
        (_, Classifier::Mlp(p)) => Box::new(mlp::FitMlp::new(backend, p, optim, &train, &test, batch)?),
        (Backend::Cpu, Classifier::Cnn(p)) => Box::new(CpuCnnTrainer::new(p, optim, train, test)),
        (Backend::Cuda(gpu), Classifier::Cnn(p)) => {
            Box::new(cnn_gpu::GpuCnn::new(gpu.clone(), p, optim, &train, &test)?)
        }
    })
}

/// The CNN's CPU reference as a trainer: batches on every core (rayon), their gradients added in batch
/// order.
pub struct CpuCnnTrainer {
    /// The parameters being trained.
    pub params: cnn::CnnParams,
    optimizer: Optimizer,
    train: Arc<Split>,
    test: Arc<Split>,
}

impl CpuCnnTrainer {
    /// A trainer of `params` with a fresh optimizer state over the two splits.
    pub fn new(params: cnn::CnnParams, optim: OptimConfig, train: Arc<Split>, test: Arc<Split>) -> CpuCnnTrainer {
        let n = params.flat.len();
        CpuCnnTrainer { params, optimizer: Optimizer::new(optim, n), train, test }
    }
}

impl Trainer for CpuCnnTrainer {
    type Params = Classifier;
    type Evaluation = Evaluation;

    fn train_epoch(
        &mut self,
        order: &[u32],
        batch: usize,
        rates: &[f32],
        progress: &mut dyn FnMut(usize, f64),
    ) -> Result<f64> {
        use rayon::prelude::*;
        if batch == 0 {
            bail!("the batch size must be at least 1");
        }
        if rates.len() != order.len().div_ceil(batch) {
            bail!("internal: {} learning rates for {} steps", rates.len(), order.len().div_ceil(batch));
        }
        if let Some(&bad) = order.iter().find(|&&i| i as usize >= self.train.len()) {
            bail!("sample index {bad} is outside the training split ({} samples)", self.train.len());
        }
        let (shape, n) = (self.params.shape, self.params.flat.len());
        let (mut loss, mut done) = (0.0, 0);
        for (rows, &rate) in order.chunks(batch).zip(rates) {
            // Each core takes a run of the batch's images; the runs' gradients (of their summed loss) add
            // in run order, then scale to the batch mean.
            let part = rows.len().div_ceil(rayon::current_num_threads()).max(1);
            let parts: Vec<(f32, Vec<f32>)> = rows
                .par_chunks(part)
                .map(|run| {
                    let mut grad = vec![0.0f32; n];
                    let l = cnn::loss_and_grad(shape, &self.params.flat, &self.train, run, &mut grad);
                    let scale = run.len() as f32;
                    grad.iter_mut().for_each(|g| *g *= scale);
                    (l, grad)
                })
                .collect();
            let mut grad = vec![0.0f32; n];
            for (l, g) in &parts {
                loss += *l as f64;
                grad.iter_mut().zip(g).for_each(|(a, b)| *a += b);
            }
            let inv = 1.0 / rows.len() as f32;
            grad.iter_mut().for_each(|g| *g *= inv);
            self.optimizer.config.lr = rate;
            self.optimizer.step(&mut self.params.flat, &grad);
            done += rows.len();
            progress(done, loss);
        }
        Ok(loss)
    }

    fn evaluate(&mut self, split: usize) -> Result<Evaluation> {
        test_split_only(split)?;
        Ok(cnn::evaluate(&self.params, &self.test))
    }

    fn params(&mut self) -> Result<Classifier> {
        Ok(Classifier::Cnn(self.params.clone()))
    }
}

/// The MNIST pipeline as the command line, `selftest` and `bench` see it.
pub const PIPELINE: crate::pipeline::Pipeline = crate::pipeline::Pipeline {
    name: "mnist",
    commands: &[crate::pipeline::Command {
        name: "mnist",
        about: "Train the MNIST / Fashion-MNIST classifier (784 → hidden → 10)",
        args: <args::MnistArgs as clap::Args>::augment_args,
        run: |m| cli::run(crate::pipeline::parsed(m)?),
    }],
    // The MLP trains on the layer stack's kernels, which fit's checks cover; the CNN's are its own.
    checks: cnn_checks::selftest_checks,
    modules: cnn_checks::modules,
    benches: &[crate::pipeline::Bench {
        name: "mnist",
        about: "MNIST pipeline speed and accuracy",
        args: <bench::MnistBenchArgs as clap::Args>::augment_args,
        run: |gpu, options, m| bench::run(gpu, options, &crate::pipeline::parsed(m)?),
    }],
    models: &[&crate::io::modelkind::MNIST_MLP, &crate::io::modelkind::MNIST_CNN],
    language_model: None,
    image_classifier: Some(crate::pipeline::ImageClassifier { open: classify::open }),
    onnx: Some(crate::pipeline::OnnxExport { export: onnx::export_file }),
};
