//! The epoch loop every backend shares: a seeded reshuffle of the training order before each epoch, one
//! `train_epoch` at the epoch's learning rates, then an evaluation on the test split.

use super::{Classifier, Evaluation, MnistTrainer};
use crate::cpu::SeededRng;
use crate::ops::optim::LrSchedule;
use crate::report::Divergence;
use anyhow::{Result, bail};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::time::Instant;

#[derive(Clone, Copy, Debug)]
/// How long to train, in what order and at what learning rates.
pub struct Schedule {
    /// Passes over the training split.
    pub epochs: usize,
    /// Samples per optimizer step.
    pub batch: usize,
    /// Seed of the shuffle before each epoch.
    pub seed: u64,
    /// The base learning rate (the optimizer's `--lr`).
    pub lr: f32,
    /// How the rate moves over the run's optimizer steps (epochs × ⌈samples / batch⌉).
    pub lr_schedule: LrSchedule,
}

/// What one epoch achieved (the figures of the per-epoch line and the JSON report).
#[derive(Clone, Copy, Debug)]
pub struct EpochStats {
    /// 1-based.
    pub epoch: usize,
    /// Mean training loss over the epoch (parameters moving meanwhile).
    pub train_loss: f64,
    /// Mean loss on the test split after the epoch.
    pub test_loss: f64,
    /// Fraction of the test split classified right, 0 to 1.
    pub test_accuracy: f64,
    /// Training samples per second of this epoch's training time (evaluation excluded).
    pub samples_per_s: f64,
    /// Seconds since training started, evaluation included.
    pub elapsed_s: f64,
}

/// Hooks for progress display; every method defaults to nothing.
pub trait Observer {
    /// An epoch of `samples` training samples begins.
    fn epoch_start(&mut self, _epoch: usize, _samples: usize) {}
    /// `done` training samples of the epoch so far.
    fn progress(&mut self, _done: usize) {}
    /// An epoch ended, with its figures and test evaluation.
    fn epoch_end(&mut self, _stats: &EpochStats, _eval: &Evaluation) {}
    /// Called with each epoch's parameters (finite), before `epoch_end` (to save a checkpoint);
    /// `Ok(false)` ends training after this epoch.
    fn epoch_completed(&mut self, _stats: &EpochStats, _eval: &Evaluation, _params: &Classifier) -> Result<bool> {
        Ok(true)
    }
}

impl Observer for () {}

/// Trains for `schedule.epochs` epochs on training samples 0..n_train (fewer when
/// `observer.epoch_completed` says stop). Returns the per-epoch figures and the last evaluation. Stops
/// with a `Divergence` error when the loss or the parameters stop being finite.
pub fn run(
    trainer: &mut dyn MnistTrainer,
    n_train: usize,
    schedule: Schedule,
    observer: &mut dyn Observer,
) -> Result<(Vec<EpochStats>, Evaluation)> {
    let mut rng = SeededRng::seed_from_u64(schedule.seed ^ crate::nn::stack::SHUFFLE_STREAM);
    let mut order: Vec<u32> = (0..n_train as u32).collect();
    let start = Instant::now();
    let mut history = Vec::with_capacity(schedule.epochs.min(1024));
    let mut last = None;
    let steps = n_train.div_ceil(schedule.batch.max(1));
    let total = steps * schedule.epochs;
    for epoch in 1..=schedule.epochs {
        order.shuffle(&mut rng);
        observer.epoch_start(epoch, n_train);
        let first = (epoch - 1) * steps;
        let rates: Vec<f32> =
            (first..first + steps).map(|k| schedule.lr_schedule.rate(schedule.lr, k, total)).collect();
        let epoch_start = Instant::now();
        let loss = trainer.train_epoch(&order, schedule.batch, &rates, &mut |done| observer.progress(done))?;
        let train_secs = epoch_start.elapsed().as_secs_f64();
        if !loss.is_finite() {
            return Err(Divergence { epoch, what: "training loss" }.into());
        }
        let eval = trainer.evaluate()?;
        let stats = EpochStats {
            epoch,
            train_loss: loss / n_train.max(1) as f64,
            test_loss: eval.mean_loss(),
            test_accuracy: eval.accuracy(),
            samples_per_s: n_train as f64 / train_secs.max(1e-9),
            elapsed_s: start.elapsed().as_secs_f64(),
        };
        let params = trainer.params()?;
        if !params.all_finite() {
            return Err(Divergence { epoch, what: "parameters" }.into());
        }
        let go_on = observer.epoch_completed(&stats, &eval, &params)?;
        observer.epoch_end(&stats, &eval);
        history.push(stats);
        last = Some(eval);
        if !go_on {
            break;
        }
    }
    match last {
        Some(eval) => Ok((history, eval)),
        None => bail!("--epochs must be at least 1"),
    }
}
