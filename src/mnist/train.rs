//! How `textnet mnist` trains, on any backend: the shared epoch loop (`run::epochs`: a seeded reshuffle of
//! the training order before each epoch, one `train_epoch` at the epoch's learning rates), then an
//! evaluation on the test split reported to an `Observer`.

use super::{Classifier, Evaluation, MnistTrainer};
use crate::harness::run::{self, EpochHooks, EpochPlan, EpochTrained, TEST, Verdict};
use crate::ops::optim::LrSchedule;
use anyhow::{Result, bail};

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
    /// The learning rate of the epoch's last step.
    pub lr: f32,
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

/// Trains for `schedule.epochs` epochs on training samples 0..n_train in `run::epochs` (fewer when
/// `observer.epoch_completed` says stop). Returns the per-epoch figures and the last evaluation. Stops
/// with a `Divergence` error when the loss or the parameters stop being finite.
pub fn run(
    trainer: &mut MnistTrainer,
    n_train: usize,
    schedule: Schedule,
    observer: &mut dyn Observer,
) -> Result<(Vec<EpochStats>, Evaluation)> {
    let steps = n_train.div_ceil(schedule.batch.max(1));
    let plan = EpochPlan {
        epochs: schedule.epochs,
        samples: n_train,
        batch: schedule.batch,
        shuffle_seed: Some(schedule.seed ^ crate::nn::stack::SHUFFLE_STREAM),
        rates: schedule.lr_schedule.rates(schedule.lr, steps * schedule.epochs),
        patience: None,
    };
    let mut hooks = Hooks { observer, history: Vec::with_capacity(schedule.epochs.min(1024)), last: None };
    let ran = run::epochs(trainer, &plan, &mut hooks)?;
    if let Some(divergence) = ran.diverged {
        return Err(divergence.into());
    }
    match hooks.last {
        Some(eval) => Ok((hooks.history, eval)),
        None => bail!("--epochs must be at least 1"),
    }
}

/// `run`'s side of the epoch loop: the test evaluation, the parameters' check, the observer.
struct Hooks<'a> {
    observer: &'a mut dyn Observer,
    history: Vec<EpochStats>,
    last: Option<Evaluation>,
}

impl EpochHooks<MnistTrainer> for Hooks<'_> {
    fn started(&mut self, epoch: usize, samples: usize) {
        self.observer.epoch_start(epoch, samples);
    }

    fn progress(&mut self, done: usize, _loss_sum: f64) {
        self.observer.progress(done);
    }

    fn finished(&mut self, trainer: &mut MnistTrainer, epoch: &EpochTrained) -> Result<Verdict> {
        let eval = trainer.evaluate(TEST)?;
        let stats = EpochStats {
            epoch: epoch.epoch,
            train_loss: epoch.train_loss,
            test_loss: eval.mean_loss(),
            test_accuracy: eval.accuracy(),
            samples_per_s: epoch.samples_per_s,
            lr: epoch.lr,
            elapsed_s: epoch.started.elapsed().as_secs_f64(),
        };
        let params = trainer.params()?;
        if !params.all_finite() {
            return Ok(Verdict::Diverged("parameters"));
        }
        let go_on = self.observer.epoch_completed(&stats, &eval, &params)?;
        self.observer.epoch_end(&stats, &eval);
        self.history.push(stats);
        self.last = Some(eval);
        Ok(if go_on { Verdict::Next { judged: None } } else { Verdict::Stop })
    }
}
