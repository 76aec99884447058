//! The training loop, the same for every backend: it drives a `TextTrainer` through seeded-shuffled
//! epochs in chunks (so progress can be shown), each step at its rate of the learning-rate schedule,
//! validates after each epoch, and stops at the first non-finite loss, handing back the parameters of
//! the last good epoch. Also the unigram baseline the epochs are measured against, and the choice of
//! trainer for a `Backend`.

use super::cpu_batch::BatchTrainer;
use super::gpu::GpuTrainer;
use super::model::{EvalSums, TextParams};
use super::{CpuTrainer, TextTrainer};
use crate::cpu::SeededRng;
use crate::device::Backend;
use crate::ops::optim::{LrSchedule, OptimConfig, OptimKind, Optimizer};
use crate::precision::Precision;
use crate::report::Divergence;
use anyhow::{Result, bail};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::sync::Arc;
use std::time::Instant;

/// The trainer for `backend`, owning `params` and the token stream, for steps of `batch` samples updated
/// with `optim`. SGD: on the GPU the fused kernels' update at each step's rate; on the CPU
/// single samples take the reference (`CpuTrainer`), batches the batched, multi-threaded
/// `cpu_batch::BatchTrainer` (the same math). Momentum and Adam: the GPU's tiled path with the shared
/// update, or the reference with `model::optimizer_update`. `precision` bf16: the GPU's bf16 step, and on
/// the CPU its twin for SGD (`BatchTrainer::at`); the reference with an optimizer stays fp32.
pub fn make_trainer(
    backend: &Backend,
    params: TextParams,
    tokens: Arc<[u32]>,
    batch: usize,
    optim: OptimConfig,
    precision: Precision,
) -> Result<Box<dyn TextTrainer>> {
    optim.validate()?;
    super::check_precision(precision)?;
    let sgd = optim.kind == OptimKind::Sgd;
    let fp32 = precision == Precision::Fp32;
    match backend {
        Backend::Cpu if sgd && batch <= 1 && fp32 => Ok(Box::new(CpuTrainer::new(params, tokens))),
        Backend::Cpu if sgd => Ok(Box::new(BatchTrainer::at(params, tokens, precision))),
        Backend::Cpu => {
            let count = params.shape.parameter_count() as usize;
            Ok(Box::new(CpuTrainer { params, tokens, optimizer: Some(Optimizer::new(optim, count)) }))
        }
        Backend::Cuda(gpu) => {
            let mut trainer = GpuTrainer::new(gpu.clone(), &params, tokens)?;
            trainer.use_optimizer(optim)?;
            trainer.use_precision(precision)?;
            Ok(Box::new(trainer))
        }
    }
}

#[derive(Clone, Copy, Debug)]
/// How the training loop runs.
pub struct TrainOptions {
    /// The learning rate (the schedule's base rate).
    pub lr: f32,
    /// How the rate moves over the run's steps (epochs × ⌈training samples / batch⌉).
    pub schedule: LrSchedule,
    /// Passes over the training samples.
    pub epochs: usize,
    /// Samples per optimizer step.
    pub batch: usize,
    /// Seeds the per-epoch shuffle (the parameter initialisation takes the seed separately).
    pub seed: u64,
    /// Whether the training order is reshuffled before each epoch.
    pub shuffle: bool,
}

/// What one epoch achieved. Losses are mean cross-entropy in nats; accuracies are fractions.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochMetrics {
    /// The epoch, 1-based.
    pub epoch: usize,
    /// Mean loss over the epoch's training samples, each taken just before its own update.
    pub train_loss: f64,
    /// Mean loss on the validation samples after the epoch.
    pub val_loss: f64,
    /// Validation perplexity, e^val_loss.
    pub val_perplexity: f64,
    /// Fraction of validation samples whose target was the top prediction.
    pub top1: f64,
    /// Fraction of validation samples whose target was among the top 5.
    pub top5: f64,
    /// Training samples per second (validation time excluded).
    pub samples_per_s: f64,
    /// Seconds since training started, validation included.
    pub elapsed_s: f64,
}

/// Hooks for showing progress; every method defaults to doing nothing, so `()` shows nothing.
pub trait Progress {
    /// An epoch of `samples` training samples begins.
    fn epoch_started(&mut self, _epoch: usize, _samples: usize) {}
    /// `samples` more training samples are done.
    fn advanced(&mut self, _samples: usize) {}
    /// An epoch ended, with its metrics.
    fn epoch_finished(&mut self, _metrics: &EpochMetrics) {}
    /// Called with each completed epoch's parameters, before `epoch_finished` (to save a checkpoint);
    /// `Ok(false)` ends training after this epoch.
    fn epoch_completed(&mut self, _metrics: &EpochMetrics, _params: &TextParams) -> Result<bool> {
        Ok(true)
    }
}

impl Progress for () {}

#[derive(Clone, Debug)]
/// What a training run produced.
pub struct TrainRun {
    /// Metrics of the completed epochs (fewer than asked for when stopped early).
    pub epochs: Vec<EpochMetrics>,
    /// The final parameters, or after a divergence those of the last good epoch (the initial ones when
    /// the first epoch diverged).
    pub params: TextParams,
    /// Where the run diverged, if it did.
    pub diverged: Option<Divergence>,
}

/// The most samples per `trainer.train` call: about 1/256 of an epoch, at least 256 and at most 8192,
/// whole batches so no SGD step is split between calls.
fn chunk_len(epoch_samples: usize, batch: usize) -> usize {
    let target = (epoch_samples / 256).clamp(256, 8192);
    (target / batch).max(1) * batch
}

/// Runs `options.epochs` epochs over the samples at `train`, validating on `val` after each, or fewer
/// when `progress.epoch_completed` says stop.
pub fn train(
    trainer: &mut dyn TextTrainer,
    train: &[u32],
    val: &[u32],
    options: &TrainOptions,
    progress: &mut dyn Progress,
) -> Result<TrainRun> {
    if train.is_empty() || val.is_empty() {
        bail!("internal: training needs at least one training and one validation sample");
    }
    // A stream apart from the one `TextParams::init` draws from the same seed.
    let mut rng = SeededRng::seed_from_u64(options.seed ^ 0x9E37_79B9_7F4A_7C15);
    let mut order = train.to_vec();
    let mut last_good = trainer.params()?;
    let mut epochs = Vec::new();
    let started = Instant::now();
    for epoch in 1..=options.epochs {
        if options.shuffle {
            order.shuffle(&mut rng);
        }
        match run_epoch(trainer, epoch, &order, val, options, progress, started)? {
            EpochEnd::Finished(metrics, params) => {
                let go_on = progress.epoch_completed(&metrics, &params)?;
                progress.epoch_finished(&metrics);
                epochs.push(metrics);
                last_good = params;
                if !go_on {
                    break;
                }
            }
            EpochEnd::NonFinite(what) => {
                return Ok(TrainRun { epochs, params: last_good, diverged: Some(Divergence { epoch, what }) });
            }
        }
    }
    Ok(TrainRun { epochs, params: last_good, diverged: None })
}

enum EpochEnd {
    Finished(EpochMetrics, TextParams),
    /// What stopped being finite.
    NonFinite(&'static str),
}

/// One pass over `order` in chunks, then validation and a copy of the parameters.
fn run_epoch(
    trainer: &mut dyn TextTrainer,
    epoch: usize,
    order: &[u32],
    val: &[u32],
    options: &TrainOptions,
    progress: &mut dyn Progress,
    started: Instant,
) -> Result<EpochEnd> {
    progress.epoch_started(epoch, order.len());
    let epoch_started = Instant::now();
    let mut loss_sum = 0.0f64;
    let (batch, largest) = (options.batch.max(1), chunk_len(order.len(), options.batch));
    // The first chunk is one batch, so progress moves within the first second however slow the
    // trainer is; each next one twice the last, up to `largest`. The sizes depend on nothing but the
    // epoch and the batch, so where a run's chunks fall never changes its result.
    let mut chunk = batch;
    let mut done = 0;
    // Step k of the run is at the schedule's rate k; a chunk is whole steps.
    let steps = order.len().div_ceil(batch);
    let total = steps * options.epochs;
    while done < order.len() {
        let part = &order[done..(done + chunk).min(order.len())];
        let first = (epoch - 1) * steps + done / batch;
        let rates: Vec<f32> =
            (first..first + part.len().div_ceil(batch)).map(|k| options.schedule.rate(options.lr, k, total)).collect();
        let loss = trainer.train_steps(part, options.batch, &rates)?;
        if !loss.is_finite() {
            return Ok(EpochEnd::NonFinite("training loss"));
        }
        loss_sum += loss;
        done += part.len();
        progress.advanced(part.len());
        chunk = (2 * chunk).min(largest);
    }
    let samples_per_s = order.len() as f64 / epoch_started.elapsed().as_secs_f64();
    let eval = trainer.evaluate(val)?;
    if !eval.loss.is_finite() {
        return Ok(EpochEnd::NonFinite("validation loss"));
    }
    let params = trainer.params()?;
    if !params.all_finite() {
        return Ok(EpochEnd::NonFinite("parameters"));
    }
    let metrics = epoch_metrics(epoch, loss_sum / order.len() as f64, &eval, samples_per_s, started);
    Ok(EpochEnd::Finished(metrics, params))
}

fn epoch_metrics(epoch: usize, train_loss: f64, eval: &EvalSums, samples_per_s: f64, started: Instant) -> EpochMetrics {
    let n = eval.samples.max(1) as f64;
    let val_loss = eval.loss / n;
    EpochMetrics {
        epoch,
        train_loss,
        val_loss,
        val_perplexity: val_loss.exp(),
        top1: eval.top1 as f64 / n,
        top5: eval.top5 as f64 / n,
        samples_per_s,
        elapsed_s: started.elapsed().as_secs_f64(),
    }
}

/// At most `max` of `positions`, spread evenly over them (all of them when `max` is 0 or not smaller),
/// so a capped validation set still covers the whole held-out text.
pub fn spread_subset(positions: &[u32], max: usize) -> Vec<u32> {
    if max == 0 || max >= positions.len() {
        return positions.to_vec();
    }
    (0..max).map(|i| positions[i * positions.len() / max]).collect()
}

/// Validation loss of the unigram baseline: token frequencies of `training_tokens` with add-one
/// smoothing over all `vocab_size` ids, scored on the targets at `val` positions of `tokens`.
pub fn unigram_loss(tokens: &[u32], training_tokens: usize, vocab_size: usize, val: &[u32]) -> f64 {
    let mut counts = vec![0u64; vocab_size];
    for &t in &tokens[..training_tokens] {
        counts[t as usize] += 1;
    }
    let total = (training_tokens + vocab_size) as f64;
    let loss: f64 = val.iter().map(|&pos| -(((counts[tokens[pos as usize] as usize] + 1) as f64) / total).ln()).sum();
    loss / val.len().max(1) as f64
}
