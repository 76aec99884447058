//! The MNIST / Fashion-MNIST classifier (784 → hidden → 10 MLP): IDX loading (`idx`, `data`), the model
//! and its CPU reference (`model`), the optimizers as flat elementwise updates (`optim`), the epoch loop
//! (`train`) and `textnet mnist` (`cli`).
//!
//! Backends implement `MnistTrainer`. The caller hands a backend both splits once, as contiguous
//! buffers (a GPU backend uploads them once), then drives it with per-epoch sample orders, so every
//! backend sees the same shuffles and the CPU reference can check any of them.

/// What the model's inputs are, recorded in its file: the IDX pixel bytes, row by row (28×28), divided
/// by 255.
pub const INPUT_SCALING: &str = "pixel byte / 255, row-major 28x28";

pub mod bench;
pub mod checks;
pub mod classify;
pub mod cli;
pub mod cnn;
pub mod cnn_checks;
pub mod cnn_gpu;
pub mod gpu;
pub mod data;
pub mod idx;
pub mod model;
pub mod train;

use crate::device::{Backend, Gpu};
use anyhow::{Result, bail};
use idx::Split;
use model::{MlpParams, Workspace};
use crate::optim::{OptimConfig, Optimizer};
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

/// Loss and confusion counts over an evaluation set.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    pub samples: u64,
    /// Summed per-sample loss.
    pub loss: f64,
    /// classes × classes, row = true class, column = predicted class.
    pub confusion: Vec<u64>,
    pub classes: usize,
}

impl Evaluation {
    pub fn new(classes: usize) -> Evaluation {
        Evaluation { samples: 0, loss: 0.0, confusion: vec![0; classes * classes], classes }
    }

    pub fn record(&mut self, truth: usize, predicted: usize) {
        self.samples += 1;
        self.confusion[truth * self.classes + predicted] += 1;
    }

    pub fn correct(&self) -> u64 {
        (0..self.classes).map(|k| self.confusion[k * self.classes + k]).sum()
    }

    pub fn accuracy(&self) -> f64 {
        self.correct() as f64 / self.samples.max(1) as f64
    }

    pub fn mean_loss(&self) -> f64 {
        self.loss / self.samples.max(1) as f64
    }

    /// The confusion matrix as rows.
    pub fn confusion_rows(&self) -> Vec<Vec<u64>> {
        self.confusion.chunks(self.classes).map(<[u64]>::to_vec).collect()
    }
}

/// A training backend. It owns the parameters, the optimizer state and both splits (on a GPU: resident
/// in device memory).
pub trait MnistTrainer {
    /// One pass over the training samples `order` (indices into the training split), `batch` per
    /// optimizer step (the last step may be shorter). Calls `progress` with the number of samples done
    /// so far, at least once per step or group of steps. Returns the summed per-sample loss.
    fn train_epoch(&mut self, order: &[u32], batch: usize, progress: &mut dyn FnMut(usize)) -> Result<f64>;
    /// Loss and confusion matrix over the whole test split, without updating anything.
    fn evaluate(&mut self) -> Result<Evaluation>;
    /// A host copy of the current parameters.
    fn params(&mut self) -> Result<MlpParams>;
}

/// The trainer for `backend`.
pub fn trainer(
    backend: &Backend,
    params: MlpParams,
    optim: OptimConfig,
    train: Arc<Split>,
    test: Arc<Split>,
) -> Result<Box<dyn MnistTrainer>> {
    match backend {
        Backend::Cpu => Ok(Box::new(CpuTrainer::new(params, optim, train, test))),
        Backend::Cuda(gpu) => gpu_trainer(gpu, params, optim, train, test),
    }
}

/// The CUDA backend's trainer: both splits are copied to the GPU once.
fn gpu_trainer(
    gpu: &Arc<Gpu>,
    params: MlpParams,
    optim: OptimConfig,
    train: Arc<Split>,
    test: Arc<Split>,
) -> Result<Box<dyn MnistTrainer>> {
    Ok(Box::new(gpu::GpuTrainer::new(gpu.clone(), params, optim, &train, &test)?))
}

/// Images per CPU forward pass when evaluating.
pub(crate) const CPU_CHUNK: usize = 256;

/// Loss and confusion matrix of `params` over the whole of `data`, on the CPU: chunks of images on every
/// core, their sums added in chunk order (the same result on any number of cores).
pub fn evaluate_split(params: &MlpParams, data: &Split) -> Evaluation {
    use rayon::prelude::*;
    let classes = params.shape.classes;
    let all: Vec<u32> = (0..data.len() as u32).collect();
    let chunks: Vec<Evaluation> = all
        .par_chunks(CPU_CHUNK)
        .map_init(Workspace::default, |ws, rows| {
            let mut eval = Evaluation::new(classes);
            eval.loss = model::forward(params, data, rows, ws);
            for (&row, &predicted) in rows.iter().zip(&ws.predicted) {
                eval.record(data.label(row), predicted as usize);
            }
            eval
        })
        .collect();
    let mut eval = Evaluation::new(classes);
    for chunk in chunks {
        eval.samples += chunk.samples;
        eval.loss += chunk.loss;
        eval.confusion.iter_mut().zip(&chunk.confusion).for_each(|(a, b)| *a += b);
    }
    eval
}

/// The CPU reference as a trainer.
pub struct CpuTrainer {
    pub params: MlpParams,
    pub optimizer: Optimizer,
    /// When set, the smallest `model::kink_margin` of any training step so far (the selftest's training
    /// checks watch it); None: not watched.
    pub kink_margin: Option<f64>,
    grad: Vec<f32>,
    ws: Workspace,
    train: Arc<Split>,
    test: Arc<Split>,
}

impl CpuTrainer {
    pub fn new(params: MlpParams, optim: OptimConfig, train: Arc<Split>, test: Arc<Split>) -> CpuTrainer {
        let n = params.flat.len();
        CpuTrainer {
            params,
            optimizer: Optimizer::new(optim, n),
            kink_margin: None,
            grad: vec![0.0; n],
            ws: Workspace::default(),
            train,
            test,
        }
    }
}

impl MnistTrainer for CpuTrainer {
    fn train_epoch(&mut self, order: &[u32], batch: usize, progress: &mut dyn FnMut(usize)) -> Result<f64> {
        if batch == 0 {
            bail!("the batch size must be at least 1");
        }
        if let Some(&bad) = order.iter().find(|&&i| i as usize >= self.train.len()) {
            bail!("sample index {bad} is outside the training split ({} samples)", self.train.len());
        }
        let mut loss = 0.0;
        let mut done = 0;
        for rows in order.chunks(batch) {
            if let Some(margin) = &mut self.kink_margin {
                *margin = margin.min(model::kink_margin(&self.params, &self.train, rows));
            }
            loss += model::forward(&self.params, &self.train, rows, &mut self.ws);
            model::backward(&self.params, &self.train, rows, &mut self.ws, &mut self.grad);
            self.optimizer.step(&mut self.params.flat, &self.grad);
            done += rows.len();
            progress(done);
        }
        Ok(loss)
    }

    fn evaluate(&mut self) -> Result<Evaluation> {
        Ok(evaluate_split(&self.params, &self.test))
    }

    fn params(&mut self) -> Result<MlpParams> {
        Ok(self.params.clone())
    }
}
