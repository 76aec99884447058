//! `textnet train`'s side of the epoch loop (`train::Progress`): the progress display, each epoch's line
//! and report row, and the save of each epoch --keep keeps.

use super::model::TextParams;
use super::modelfile::TextModel;
use super::train::{EpochMetrics, Progress};
use crate::harness::checkpoint::Keeper;
use crate::harness::interrupt;
use crate::harness::report::{self, Display, EpochRow};
use anyhow::Result;
use std::path::PathBuf;

/// The progress display, and the save after each epoch.
pub(super) struct EpochBar {
    pub(super) display: Display,
    pub(super) saver: Saver,
}

/// Writes the epochs that `keeper` keeps to `out`.
pub(super) struct Saver {
    pub(super) out: PathBuf,
    pub(super) keeper: Keeper,
    /// The parameters are replaced by each saved epoch's.
    pub(super) model: TextModel,
    /// What happened to the last epoch, for its summary line.
    pub(super) note: String,
}

impl Saver {
    fn offer(&mut self, m: &EpochMetrics, params: &TextParams) -> Result<()> {
        let (model, out) = (&mut self.model, &self.out);
        let written = self.keeper.offer(m.epoch, m.val_loss, || {
            model.params = params.clone();
            model.save(out)
        })?;
        self.note = self.keeper.note(written, "val loss");
        Ok(())
    }
}

/// An epoch's row in the `--json` report.
pub(super) fn epoch_row(m: &EpochMetrics) -> EpochRow {
    EpochRow {
        epoch: m.epoch,
        train_loss: m.train_loss,
        val_loss: Some(m.val_loss),
        val_accuracy: Some(m.top1),
        test_loss: None,
        test_accuracy: None,
        samples_per_s: m.samples_per_s,
        lr: Some(report::decimal(m.lr)),
        elapsed_s: m.elapsed_s,
        extra: Default::default(),
    }
    .with("val_perplexity", m.val_perplexity)
    .with("val_top5_accuracy", m.top5)
}

impl Progress for EpochBar {
    fn epoch_started(&mut self, epoch: usize, samples: usize) {
        self.display.epoch_started(epoch, samples);
    }

    fn advanced(&mut self, samples: usize) {
        self.display.advanced(samples);
    }

    fn epoch_completed(&mut self, m: &EpochMetrics, params: &TextParams) -> Result<bool> {
        self.saver.offer(m, params)?;
        Ok(!interrupt::requested())
    }

    fn epoch_finished(&mut self, m: &EpochMetrics) {
        let figures = format!(
            "val loss {:.4} (perplexity {:.1}), top-1 {:.1}%, top-5 {:.1}%",
            m.val_loss,
            m.val_perplexity,
            100.0 * m.top1,
            100.0 * m.top5
        );
        self.display.epoch_finished(&epoch_row(m), &figures, &self.saver.note);
    }
}
