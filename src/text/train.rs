//! The text model's training, the same for every backend: `run::epochs` drives a `TextTrainer` through
//! seeded-shuffled epochs (trained in chunks, so progress can be shown), each step at its rate of the
//! learning-rate schedule; the text hooks validate after each epoch, and the run stops at the first
//! non-finite loss, handing back the parameters of the last good epoch. Also the unigram baseline the
//! epochs are measured against, and the choice of trainer for a `Backend`.

use super::cpu_batch::BatchTrainer;
use super::gpu::GpuTrainer;
use super::model::{EvalSums, TextParams};
use super::{CpuTrainer, TextTrainer};
use crate::device::Backend;
use crate::device::precision::Precision;
use crate::harness::report::Divergence;
use crate::harness::run::{self, EpochHooks, EpochPlan, EpochTrained, Trainer, Verdict};
use crate::ops::optim::{LrSchedule, OptimConfig, OptimKind, Optimizer};
use anyhow::{Result, bail};
use std::sync::Arc;

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
    /// The learning rate of the epoch's last step.
    pub lr: f32,
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

/// The most samples per `train_steps` call: about 1/256 of an epoch, at least 256 and at most 8192,
/// whole batches so no SGD step is split between calls.
fn chunk_len(epoch_samples: usize, batch: usize) -> usize {
    let target = (epoch_samples / 256).clamp(256, 8192);
    (target / batch).max(1) * batch
}

/// A `TextTrainer` as `run::epochs` drives it: samples numbered 0..train.len() are the target positions
/// `train`, and the split evaluated each epoch is `val`.
struct Positions<'a> {
    trainer: &'a mut dyn TextTrainer,
    train: &'a [u32],
    val: &'a [u32],
}

impl Trainer for Positions<'_> {
    type Params = TextParams;
    type Evaluation = EvalSums;

    /// One pass in chunks, so that progress moves: the first chunk is one batch, so it moves within the
    /// first second however slow the trainer is; each next one twice the last, up to `chunk_len`. The
    /// sizes depend on nothing but the epoch and the batch, so where a run's chunks fall never changes
    /// its result. The pass stops at the first chunk whose loss is not finite.
    fn train_epoch(
        &mut self,
        order: &[u32],
        batch: usize,
        rates: &[f32],
        progress: &mut dyn FnMut(usize, f64),
    ) -> Result<f64> {
        let positions: Vec<u32> = order.iter().map(|&i| self.train[i as usize]).collect();
        let (step, largest) = (batch.max(1), chunk_len(positions.len(), batch));
        let (mut chunk, mut done, mut loss_sum) = (step, 0, 0.0f64);
        while done < positions.len() {
            let part = &positions[done..(done + chunk).min(positions.len())];
            let first = done / step;
            let loss = self.trainer.train_steps(part, batch, &rates[first..first + part.len().div_ceil(step)])?;
            if !loss.is_finite() {
                return Ok(loss);
            }
            loss_sum += loss;
            done += part.len();
            progress(done, loss_sum);
            chunk = (2 * chunk).min(largest);
        }
        Ok(loss_sum)
    }

    fn evaluate(&mut self, split: usize) -> Result<EvalSums> {
        match split {
            run::TRAIN => self.trainer.evaluate(self.train),
            run::VAL => self.trainer.evaluate(self.val),
            _ => bail!("internal: the text trainer holds no split {split}"),
        }
    }

    fn params(&mut self) -> Result<TextParams> {
        self.trainer.params()
    }
}

/// The text pipeline's side of `run::epochs`: validation, the parameters of the last good epoch, and
/// `Progress`.
struct Hooks<'a> {
    progress: &'a mut dyn Progress,
    /// Training samples of the epoch that `progress` has been told of.
    shown: usize,
    epochs: Vec<EpochMetrics>,
    last_good: TextParams,
}

impl EpochHooks<Positions<'_>> for Hooks<'_> {
    fn started(&mut self, epoch: usize, samples: usize) {
        self.shown = 0;
        self.progress.epoch_started(epoch, samples);
    }

    fn progress(&mut self, done: usize, _loss_sum: f64) {
        self.progress.advanced(done - self.shown);
        self.shown = done;
    }

    fn finished(&mut self, trainer: &mut Positions<'_>, epoch: &EpochTrained) -> Result<Verdict> {
        let eval = trainer.evaluate(run::VAL)?;
        if !eval.loss.is_finite() {
            return Ok(Verdict::Diverged("validation loss"));
        }
        let params = trainer.params()?;
        if !params.all_finite() {
            return Ok(Verdict::Diverged("parameters"));
        }
        let metrics = epoch_metrics(epoch, &eval);
        let go_on = self.progress.epoch_completed(&metrics, &params)?;
        self.progress.epoch_finished(&metrics);
        self.epochs.push(metrics);
        self.last_good = params;
        Ok(if go_on { Verdict::Next { judged: None } } else { Verdict::Stop })
    }
}

/// Runs `options.epochs` epochs over the samples at `train` through `run::epochs`, validating on `val`
/// after each, or fewer when `progress.epoch_completed` says stop or Ctrl-C is pressed.
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
    let steps = train.len().div_ceil(options.batch.max(1)) * options.epochs;
    let plan = EpochPlan {
        epochs: options.epochs,
        samples: train.len(),
        batch: options.batch,
        shuffle_seed: options.shuffle.then_some(options.seed ^ SHUFFLE_STREAM),
        rates: options.schedule.rates(options.lr, steps),
        patience: None,
    };
    let last_good = trainer.params()?;
    let mut hooks = Hooks { progress, shown: 0, epochs: Vec::new(), last_good };
    let run = run::epochs(&mut Positions { trainer, train, val }, &plan, &mut hooks)?;
    Ok(TrainRun { epochs: hooks.epochs, params: hooks.last_good, diverged: run.diverged })
}

/// Mixed into `--seed` for the shuffle: a stream apart from the one `TextParams::init` draws from the
/// same seed.
pub const SHUFFLE_STREAM: u64 = 0x9E37_79B9_7F4A_7C15;

fn epoch_metrics(epoch: &EpochTrained, eval: &EvalSums) -> EpochMetrics {
    let n = eval.samples.max(1) as f64;
    let val_loss = eval.loss / n;
    EpochMetrics {
        epoch: epoch.epoch,
        train_loss: epoch.train_loss,
        val_loss,
        val_perplexity: val_loss.exp(),
        top1: eval.top1 as f64 / n,
        top5: eval.top5 as f64 / n,
        samples_per_s: epoch.samples_per_s,
        lr: epoch.lr,
        elapsed_s: epoch.started.elapsed().as_secs_f64(),
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
