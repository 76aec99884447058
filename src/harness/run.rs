//! The skeleton every training command follows, so that each ends, reports and fails the same way:
//!
//! 1. `setup`: check the flags, lock `--out`, read the data, open the device, build the model and measure
//!    the model already at `--out` (the baseline a run must beat). Nothing is trained yet, so a bad input
//!    costs no training time.
//! 2. `train`: the epochs, with Ctrl-C handled (the run stops after the current epoch).
//! 3. `finish`: write the model if it earned it, print the last lines, and say how the run ended as an
//!    `Ending`: its `--json` report and what the exit status and error line are.
//!
//! `run` calls the three in order and then `Ending::conclude`: the report is printed, then the run
//! succeeds or fails with one line naming what happened to `--out`.
//!
//! The epochs of `train` are one loop for every pipeline that trains in epochs (`epochs`), over one
//! `Trainer`: the loop shuffles, hands the trainer the epoch's learning rates, stops on a training loss
//! that is not finite, on `--patience` and on Ctrl-C; the pipeline's `EpochHooks` evaluate, keep the
//! model and report each epoch.

use crate::harness::interrupt::{self, Interrupted};
use crate::harness::report::{Board, Divergence, Report, Status};
use crate::ops::cpu::SeededRng;
use anyhow::{Result, bail};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::time::Instant;

/// The training split, as `Trainer::evaluate` numbers a trainer's splits.
pub const TRAIN: usize = 0;
/// The test split.
pub const TEST: usize = 1;

/// Ok for `TEST`, else an internal error: for `who`, a trainer that holds the test split alone besides the
/// training one.
pub fn test_split_only(who: &str, split: usize) -> Result<()> {
    if split != TEST {
        anyhow::bail!("internal: {who} evaluates the test split only (asked for split {split})");
    }
    Ok(())
}
/// The validation split, where the trainer holds one.
pub const VAL: usize = 2;

/// A model being trained on one backend. It owns the parameters, the optimizer state and its splits (on
/// a GPU resident in device memory); the caller drives it with per-epoch sample orders and per-step
/// learning rates, so every backend sees the same shuffles and schedule and the CPU reference can check
/// any of them.
pub trait Trainer {
    /// A host copy of the parameters.
    type Params;
    /// What an evaluation of a split gives.
    type Evaluation;
    /// One pass over the training samples `order`, `batch` per optimizer step (the last step may be
    /// shorter), step k at learning rate `rates[k]` (`rates.len()` = the number of steps). Calls
    /// `progress` with the samples done so far and their summed loss, at least once per step or group of
    /// steps (the CPU trainers after every step, a GPU epoch once at its end). Returns the
    /// summed per-sample loss; a trainer may stop within the epoch at a loss that is no longer finite
    /// and return it, since `epochs` ends the run there anyway.
    fn train_epoch(
        &mut self,
        order: &[u32],
        batch: usize,
        rates: &[f32],
        progress: &mut dyn FnMut(usize, f64),
    ) -> Result<f64>;
    /// The model on split `split` (`TRAIN`, `TEST`, `VAL`), dropout off, nothing updated.
    fn evaluate(&mut self, split: usize) -> Result<Self::Evaluation>;
    /// A host copy of the current parameters.
    fn params(&mut self) -> Result<Self::Params>;
}

/// How `epochs` trains.
#[derive(Clone, Debug)]
pub struct EpochPlan {
    /// Passes over the training split.
    pub epochs: usize,
    /// Training samples (the order of each epoch is a permutation of 0..samples).
    pub samples: usize,
    /// Samples per optimizer step.
    pub batch: usize,
    /// Seed of the shuffle before each epoch (with the pipeline's stream mixed in); `None`: no shuffle,
    /// every epoch trains in the order 0..samples.
    pub shuffle_seed: Option<u64>,
    /// The learning rate of every step of the run (epochs × ⌈samples / batch⌉).
    pub rates: Vec<f32>,
    /// Stop when the judged loss has not improved for this many epochs.
    pub patience: Option<usize>,
}

/// An epoch just trained, as `EpochHooks::finished` sees it.
#[derive(Clone, Copy, Debug)]
pub struct EpochTrained {
    /// 1-based.
    pub epoch: usize,
    /// Mean training loss over the epoch (parameters moving meanwhile); finite.
    pub train_loss: f64,
    /// Training samples per second of the epoch's training (evaluation excluded).
    pub samples_per_s: f64,
    /// The learning rate of the epoch's last step.
    pub lr: f32,
    /// When the first epoch began.
    pub started: Instant,
}

/// What the pipeline made of an epoch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// Go on; `judged`: the loss `--patience` watches (None: not watched).
    Next {
        /// The epoch's judged loss.
        judged: Option<f64>,
    },
    /// What stopped being finite: training ends as diverged.
    Diverged(&'static str),
    /// Training ends here (the pipeline's own reason).
    Stop,
}

/// How an epoch about to train begins, as `EpochHooks::starting` says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EpochStart {
    /// At the plan's learning rates.
    AsPlanned,
    /// Every step of the epoch at this learning rate (a schedule set from outside as the run goes).
    At(f32),
    /// The run ends before this epoch.
    Stop,
}

/// The pipeline's side of `epochs`; every method but `finished` defaults to nothing.
pub trait EpochHooks<T: ?Sized> {
    /// Epoch `epoch` is about to train, its steps planned at `planned`: whether and at what rate.
    fn starting(&mut self, _epoch: usize, _planned: &[f32]) -> EpochStart {
        EpochStart::AsPlanned
    }
    /// An epoch of `samples` training samples begins.
    fn started(&mut self, _epoch: usize, _samples: usize) {}
    /// `done` training samples of the epoch so far, `loss_sum` their summed loss (as `train_epoch` calls
    /// its `progress`).
    fn progress(&mut self, _done: usize, _loss_sum: f64) {}
    /// The epoch is trained (its loss finite): evaluate, keep, report, and say how to go on.
    fn finished(&mut self, trainer: &mut T, epoch: &EpochTrained) -> Result<Verdict>;
    /// `--patience` stops the run after `epoch`: the judged loss was best at `best`.
    fn stopping_early(&mut self, _epoch: usize, _patience: usize, _best: usize) {}
}

/// How `epochs` ended.
#[derive(Debug, Default)]
pub struct EpochsRun {
    /// Epochs that `finished` saw.
    pub done: usize,
    /// Where and what stopped being finite.
    pub diverged: Option<Divergence>,
    /// The epoch after which `--patience` stopped the run.
    pub stopped_early: Option<usize>,
    /// Whether Ctrl-C stopped it.
    pub interrupted: bool,
}

/// The one epoch loop: for each epoch, a seeded reshuffle of the training order (unless the plan has no
/// shuffle seed), the pipeline's `starting` (which may set the epoch's rate or end the run), one
/// `train_epoch` at the epoch's slice of `plan.rates`, a divergence check of its loss, the pipeline's
/// `finished` hook, `--patience` on the judged loss it returns, and Ctrl-C (checked after the epoch is
/// finished, so the epoch in progress is kept).
pub fn epochs<T: Trainer + ?Sized>(
    trainer: &mut T,
    plan: &EpochPlan,
    hooks: &mut dyn EpochHooks<T>,
) -> Result<EpochsRun> {
    let n = plan.samples;
    let steps = n.div_ceil(plan.batch.max(1));
    if plan.rates.len() != steps * plan.epochs {
        bail!("internal: {} learning rates for {} epochs of {steps} steps", plan.rates.len(), plan.epochs);
    }
    let mut rng = plan.shuffle_seed.map(SeededRng::seed_from_u64);
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut run = EpochsRun::default();
    // The epoch of the lowest judged loss so far, for --patience.
    let mut best: Option<(usize, f64)> = None;
    let started = Instant::now();
    for epoch in 1..=plan.epochs {
        if let Some(rng) = &mut rng {
            order.shuffle(rng);
        }
        let planned = &plan.rates[(epoch - 1) * steps..epoch * steps];
        let set;
        let rates = match hooks.starting(epoch, planned) {
            EpochStart::AsPlanned => planned,
            EpochStart::At(lr) => {
                set = vec![lr; steps];
                &set
            }
            EpochStart::Stop => break,
        };
        hooks.started(epoch, n);
        let epoch_start = Instant::now();
        let sum =
            trainer.train_epoch(&order, plan.batch, rates, &mut |done, loss_sum| hooks.progress(done, loss_sum))?;
        let samples_per_s = n as f64 / epoch_start.elapsed().as_secs_f64().max(1e-9);
        let train_loss = sum / n.max(1) as f64;
        if !train_loss.is_finite() {
            run.diverged = Some(Divergence { epoch, what: "training loss" });
            break;
        }
        let lr = rates.last().copied().unwrap_or(0.0);
        let verdict = hooks.finished(trainer, &EpochTrained { epoch, train_loss, samples_per_s, lr, started })?;
        let judged = match verdict {
            Verdict::Diverged(what) => {
                run.diverged = Some(Divergence { epoch, what });
                break;
            }
            Verdict::Stop => {
                run.done = epoch;
                break;
            }
            Verdict::Next { judged } => judged,
        };
        run.done = epoch;
        if let Some(judged) = judged
            && best.is_none_or(|(_, b)| judged < b)
        {
            best = Some((epoch, judged));
        }
        if let (Some(patience), Some((best, _))) = (plan.patience, best)
            && epoch - best >= patience
        {
            hooks.stopping_early(epoch, patience, best);
            run.stopped_early = Some(epoch);
            break;
        }
        if interrupt::requested() {
            run.interrupted = true;
            break;
        }
    }
    Ok(run)
}

/// A training command in three stages (module comment).
pub trait TrainingCommand {
    /// What `setup` prepared for training.
    type Setup;
    /// What `train` hands to `finish`.
    type Trained;
    /// Stage 1: checks the flags, reads the data, builds the model and measures the baseline.
    fn setup(&self) -> Result<Self::Setup>;
    /// Stage 2: trains the epochs.
    fn train(&self, setup: Self::Setup) -> Result<Self::Trained>;
    /// Stage 3: writes the model if it earned it and says how the run ended.
    fn finish(&self, trained: Self::Trained) -> Result<Ending>;
}

/// Runs `command`'s three stages and concludes.
pub fn run<C: TrainingCommand>(command: &C) -> Result<()> {
    let setup = command.setup()?;
    interrupt::install();
    let trained = command.train(setup)?;
    command.finish(trained)?.conclude()
}

/// How a run ended.
#[derive(Debug, Default)]
pub struct Ending {
    /// The run's report: printed with `--json` (`json`); its settings are the hyperparameters of
    /// `--tensorboard` (`board`).
    pub report: Option<Report>,
    /// Whether the report is printed (`--json`).
    pub json: bool,
    /// `--tensorboard`'s event file (`Display::take_board`), closed with the report's settings and status.
    pub board: Option<Board>,
    /// Where the run diverged, if it did.
    pub diverged: Option<Divergence>,
    /// Stopped by Ctrl-C: where, e.g. "after epoch 2 of 5".
    pub interrupted: Option<String>,
    /// The model was trained but learned nothing (`not_learned`): the error line.
    pub failed: Option<String>,
    /// Whether `--out` now holds this run's model.
    pub written: bool,
    /// What happened to `--out`, e.g. "m.safetensors holds the trained model (test MAE 6.5799)".
    pub outcome: String,
    /// What to try after a divergence, e.g. "try a lower --lr (this run used 0.5)".
    pub remedy: String,
    /// The error of a `--plot` that could not be written (`plot::training_curves`), or of a `--tensorboard`
    /// file: the run fails with it, after its report, and its line names what became of `--out` too.
    pub plot_failed: Option<String>,
}

impl Ending {
    /// The report's `status`.
    pub fn status(&self) -> Status {
        match (&self.failed, self.diverged.is_some()) {
            (Some(_), false) => Status::NotLearned,
            _ => Status::of(self.diverged.is_some(), self.interrupted.is_some(), self.written),
        }
    }

    /// Closes `--tensorboard`'s file, prints the report, then: an error naming the divergence and the remedy; the interruption (exit
    /// status 130); the failure; "nothing written" when `--out` did not get this run's model; the
    /// `--plot` that could not be written; else Ok. A `--plot` failure is added to any of these lines.
    pub fn conclude(mut self) -> Result<()> {
        if let Some(failed) = self.board.take().and_then(|board| board.close(self.report.as_ref())) {
            self.plot_failed = Some(self.plot_failed.map_or(failed.clone(), |plot| format!("{plot}; {failed}")));
        }
        if let (true, Some(report)) = (self.json, &self.report) {
            report.print()?;
        }
        let plot = self.plot_failed.as_ref().map_or(String::new(), |e| format!("; {e}"));
        let outcome = &format!("{}{plot}", self.outcome);
        if let Some(d) = &self.diverged {
            bail!("{d}; {outcome}; {}", self.remedy);
        }
        if let Some(at) = &self.interrupted {
            return Err(Interrupted(format!("interrupted {at}; {outcome}")).into());
        }
        if let Some(failure) = self.failed {
            bail!("{failure}{plot}");
        }
        if !self.written {
            bail!("{outcome}");
        }
        if let Some(e) = self.plot_failed {
            bail!("{e}; {}", self.outcome);
        }
        Ok(())
    }
}

/// What happened to `out` in a run that writes its model once, at the end, if `written`; `figure`
/// names the run's result ("test MAE 6.5799") and `baseline` the result of the model `out` held, which
/// the run did not beat.
pub fn write_once_outcome(
    out: &std::path::Path,
    written: bool,
    figure: Option<String>,
    baseline: Option<String>,
) -> String {
    let shown = out.display();
    match (figure, baseline) {
        (Some(figure), _) if written => format!("{shown} holds the trained model ({figure})"),
        (Some(figure), Some(baseline)) => format!(
            "nothing written: the run's {figure} is above the {baseline} of the model {shown} holds, so it is unchanged"
        ),
        _ if out.exists() => format!("nothing written, so {shown} is unchanged"),
        _ => format!("nothing written to {shown}"),
    }
}

/// The one rule for a run that did not learn, in every pipeline: its model is no better than guessing,
/// the prediction that uses nothing of the input (every class or token equally likely for MNIST, the
/// text model and the Transformer; the training mean for sales; for XOR, a point on the wrong side).
/// Such a model is never written, and the run fails with status `not_learned` and this line: "the model
/// did not learn: `finding`; `outcome`; `advice`".
pub fn not_learned(finding: &str, outcome: &str, advice: &str) -> String {
    format!("the model did not learn: {finding}; {outcome}; {advice}")
}

/// Fewer training samples than this explain a run that did not learn before anything else does.
pub const FEW_SAMPLES: usize = 100;

/// What a run that did not learn should try (the `advice` of `not_learned`): more training samples when
/// it had fewer than `FEW_SAMPLES` (`too_few`), else another learning rate as its loss went (`lr_advice`).
pub fn retry_advice(samples: usize, unit: &str, more: &str, loss: (f64, f64), lr: &str, longer: &str) -> String {
    too_few(samples, unit, more).unwrap_or_else(|| lr_advice(loss, lr, longer))
}

/// "1 training row is too few to learn from; train on more (`more`)", when `samples` training samples
/// (each a `unit`) are fewer than `FEW_SAMPLES`.
pub fn too_few(samples: usize, unit: &str, more: &str) -> Option<String> {
    (samples < FEW_SAMPLES).then(|| {
        let are = if samples == 1 { " is" } else { "s are" };
        format!("{samples} training {unit}{are} too few to learn from; train on more ({more})")
    })
}

/// What to do with the learning rate `lr` of a run that did not learn, by how its loss went from
/// `before` training to `after` it: it barely moved (by 1% or less): raise the rate; it rose: lower it;
/// it fell, too little: train longer (`longer`, e.g. "more --epochs") or try another.
pub fn lr_advice((before, after): (f64, f64), lr: &str, longer: &str) -> String {
    if (after - before).abs() <= 0.01 * before.abs() {
        format!(
            "its loss barely moved ({before:.4} before training, {after:.4} after): raise --lr (this run used {lr})"
        )
    } else if after > before {
        format!("its loss rose ({before:.4} before training, {after:.4} after): lower --lr (this run used {lr})")
    } else {
        format!("try {longer} or another --lr (this run used {lr})")
    }
}

/// The warning for a language model written although no better than the unigram model (each `unit`
/// predicted by its frequency alone): it learned something, but less than word or character counts know.
pub fn weaker_than_unigram(loss: f64, unigram: f64, unit: &str) -> String {
    format!(
        "warning: its validation loss {loss:.4} is no better than the unigram model's {unigram:.4} (each {unit} \
         predicted by its frequency alone); train longer or with another --lr"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ending() -> Ending {
        Ending {
            written: true,
            outcome: "m holds the trained model".into(),
            remedy: "lower --lr".into(),
            ..Default::default()
        }
    }

    #[test]
    fn each_ending_has_its_status_and_line() {
        assert_eq!(ending().status(), Status::Ok);
        assert!(ending().conclude().is_ok());

        let diverged = Ending { diverged: Some(Divergence { epoch: 3, what: "loss" }), written: false, ..ending() };
        assert_eq!(diverged.status(), Status::Diverged);
        let err = diverged.conclude().unwrap_err().to_string();
        assert!(err.starts_with("training diverged in epoch 3") && err.ends_with("; lower --lr"), "{err}");

        let stopped = Ending { interrupted: Some("after epoch 2 of 5".into()), ..ending() };
        assert_eq!(stopped.status(), Status::Interrupted);
        let err = stopped.conclude().unwrap_err();
        assert!(err.downcast_ref::<Interrupted>().is_some());
        assert_eq!(err.to_string(), "interrupted after epoch 2 of 5; m holds the trained model");

        let failed = Ending { failed: Some("XOR not learned".into()), written: false, ..ending() };
        assert_eq!(failed.status(), Status::NotLearned);
        assert_eq!(failed.conclude().unwrap_err().to_string(), "XOR not learned");

        let kept = Ending { written: false, outcome: "nothing written".into(), ..ending() };
        assert_eq!(kept.status(), Status::NotBetter);
        assert_eq!(kept.conclude().unwrap_err().to_string(), "nothing written");
    }

    /// A trainer that records the rates of each epoch and trains nothing.
    struct Rates(Vec<Vec<f32>>);

    impl Trainer for Rates {
        type Params = ();
        type Evaluation = ();
        fn train_epoch(&mut self, _: &[u32], _: usize, rates: &[f32], _: &mut dyn FnMut(usize, f64)) -> Result<f64> {
            self.0.push(rates.to_vec());
            Ok(1.0)
        }
        fn evaluate(&mut self, _: usize) -> Result<()> {
            Ok(())
        }
        fn params(&mut self) -> Result<()> {
            Ok(())
        }
    }

    /// Epoch 2 at one rate, a stop before epoch 3.
    struct SetsTheRate;

    impl EpochHooks<Rates> for SetsTheRate {
        fn starting(&mut self, epoch: usize, _planned: &[f32]) -> EpochStart {
            match epoch {
                2 => EpochStart::At(0.5),
                3 => EpochStart::Stop,
                _ => EpochStart::AsPlanned,
            }
        }
        fn finished(&mut self, _: &mut Rates, _: &EpochTrained) -> Result<Verdict> {
            Ok(Verdict::Next { judged: None })
        }
    }

    #[test]
    fn the_hooks_may_set_an_epochs_rate_or_stop_before_it() {
        let plan = EpochPlan {
            epochs: 4,
            samples: 5,
            batch: 2,
            shuffle_seed: None,
            rates: (0..12).map(|k| k as f32).collect(),
            patience: None,
        };
        let mut trainer = Rates(Vec::new());
        let run = epochs(&mut trainer, &plan, &mut SetsTheRate).unwrap();
        assert_eq!(trainer.0, vec![vec![0.0, 1.0, 2.0], vec![0.5; 3]]);
        assert_eq!(run.done, 2);
        assert!(!run.interrupted && run.diverged.is_none() && run.stopped_early.is_none());
    }

    #[test]
    fn the_advice_of_a_run_that_did_not_learn_follows_its_samples_and_its_loss() {
        let advice = |samples, loss| retry_advice(samples, "row", "--split", loss, "0.001", "more --epochs");
        assert_eq!(advice(1, (1.0, 1.0)), "1 training row is too few to learn from; train on more (--split)");
        assert!(advice(99, (1.0, 1.0)).starts_with("99 training rows are too few"));
        let still = advice(FEW_SAMPLES, (1.7, 1.6999));
        assert!(still.contains("barely moved") && still.ends_with("raise --lr (this run used 0.001)"), "{still}");
        let rose = advice(FEW_SAMPLES, (2.3, 9.1));
        assert!(rose.contains("rose") && rose.ends_with("lower --lr (this run used 0.001)"), "{rose}");
        assert_eq!(advice(FEW_SAMPLES, (2.3, 1.9)), "try more --epochs or another --lr (this run used 0.001)");
    }

    #[test]
    fn a_plot_that_could_not_be_written_fails_the_run_and_says_what_became_of_out() {
        let plot = || Some("--plot p.png not written: cannot write p.png".to_string());
        let drawn = Ending { plot_failed: plot(), ..ending() };
        assert_eq!(drawn.status(), Status::Ok, "the model is written");
        let err = drawn.conclude().unwrap_err().to_string();
        assert_eq!(err, "--plot p.png not written: cannot write p.png; m holds the trained model");

        let stopped = Ending { interrupted: Some("after epoch 2 of 5".into()), plot_failed: plot(), ..ending() };
        let err = stopped.conclude().unwrap_err();
        assert!(err.downcast_ref::<Interrupted>().is_some());
        assert!(err.to_string().ends_with("m holds the trained model; --plot p.png not written: cannot write p.png"));

        let diverged =
            Ending { diverged: Some(Divergence { epoch: 3, what: "loss" }), plot_failed: plot(), ..ending() };
        let err = diverged.conclude().unwrap_err().to_string();
        assert!(err.contains("; --plot p.png not written: cannot write p.png; lower --lr"), "{err}");
    }
}
