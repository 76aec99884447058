//! `textnet mnist`'s side of the epoch loop (`train::Observer`): the progress display and each epoch's
//! line and report row, the validation and the save after each epoch.

use super::idx::Split;
use super::train::{EpochStats, Observer};
use super::{Classifier, Evaluation};
use crate::datasets::mnist::Dataset;
use crate::harness::checkpoint::Keeper;
use crate::harness::interrupt;
use crate::harness::report::{self, Display, EpochRow};
use crate::io::fsutil;
use anyhow::Result;
use std::path::PathBuf;

/// The progress display and the per-epoch lines, the rows of the report; the validation and the save
/// after each epoch.
pub(super) struct Epochs {
    pub(super) display: Display,
    pub(super) rows: Vec<EpochRow>,
    pub(super) saver: Saver,
}

/// Writes the epochs that `keeper` keeps to `out`, judged by their validation loss (with --val-split),
/// else by their test loss, which only `--keep last` (every epoch) uses. An epoch at chance level is
/// never written.
pub(super) struct Saver {
    pub(super) out: PathBuf,
    pub(super) dataset: Dataset,
    pub(super) keeper: Keeper,
    pub(super) val: Option<Split>,
    /// Validation loss and accuracy of each epoch, with --val-split.
    pub(super) val_history: Vec<(f64, f64)>,
    /// The test evaluation of the epoch the file holds.
    pub(super) kept_eval: Option<Evaluation>,
    pub(super) note: String,
}

impl Saver {
    pub(super) fn offer(&mut self, stats: &EpochStats, eval: &Evaluation, params: &Classifier) -> Result<()> {
        if at_chance(eval.accuracy(), eval.classes) {
            self.note = "not saved (chance level)".into();
            return Ok(());
        }
        let loss = match &self.val {
            Some(val) => {
                let v = params.evaluate(val)?;
                self.val_history.push((v.mean_loss(), v.accuracy()));
                v.mean_loss()
            }
            None => eval.mean_loss(),
        };
        let (dataset, out) = (self.dataset, &self.out);
        let written = self.keeper.offer(stats.epoch, loss, || {
            let classes = serde_json::to_string(&dataset.class_names())?;
            let extra = [
                ("dataset", dataset.name()),
                ("class_names", classes.as_str()),
                ("input_scaling", super::INPUT_SCALING),
            ];
            fsutil::write_atomic(out, &params.to_safetensors(&extra)?)
        })?;
        if written {
            self.kept_eval = Some(eval.clone());
        }
        self.note = self.keeper.note(written, self.loss_name());
        Ok(())
    }

    pub(super) fn loss_name(&self) -> &'static str {
        if self.val.is_some() { "val loss" } else { "test loss" }
    }
}

impl Observer for Epochs {
    fn epoch_start(&mut self, epoch: usize, samples: usize) {
        self.display.epoch_started(epoch, samples);
    }

    fn progress(&mut self, done: usize) {
        self.display.reached(done);
    }

    fn epoch_completed(&mut self, stats: &EpochStats, eval: &Evaluation, params: &Classifier) -> Result<bool> {
        self.saver.offer(stats, eval, params)?;
        Ok(!interrupt::requested())
    }

    fn epoch_end(&mut self, s: &EpochStats, _eval: &Evaluation) {
        let val = self.saver.val.as_ref().and(self.saver.val_history.last().copied());
        let row = EpochRow {
            epoch: s.epoch,
            train_loss: s.train_loss,
            val_loss: val.map(|v| v.0),
            val_accuracy: val.map(|v| v.1),
            test_loss: Some(s.test_loss),
            test_accuracy: Some(s.test_accuracy),
            samples_per_s: s.samples_per_s,
            lr: Some(report::decimal(s.lr)),
            elapsed_s: s.elapsed_s,
            extra: Default::default(),
        };
        let val = val.map_or(String::new(), |(loss, accuracy)| {
            format!("val loss {loss:.4}, val acc {:.2}%, ", 100.0 * accuracy)
        });
        let figures = format!("{val}test loss {:.4}, test acc {:.2}%", s.test_loss, 100.0 * s.test_accuracy);
        self.display.epoch_finished(&row, &figures, &self.saver.note);
        self.rows.push(row);
    }
}

/// Whether a test accuracy is no better than guessing: within half of chance's 1 / classes of it.
pub(super) fn at_chance(accuracy: f64, classes: usize) -> bool {
    accuracy <= 1.5 / classes as f64
}
