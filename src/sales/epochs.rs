//! `textnet sales`'s side of the epoch loop (`run::epochs`): after each epoch the test (and validation)
//! figures, the epoch kept with --val-split, and the epoch's line.

use super::model::{self, Evaluation, SalesParams};
use super::train::FitSales;
use crate::datasets::features::{Split, Stats};
use crate::harness::checkpoint::Keeper;
use crate::harness::report::{self, Display, EpochRow};
use crate::harness::run::{EpochHooks, EpochTrained, TEST, Trainer, Verdict};
use anyhow::Result;

/// `textnet sales`'s side of the epoch loop: the test (and validation) figures, the epoch kept with
/// --val-split, the epoch's line.
pub(super) struct SalesEpochs<'a> {
    pub(super) display: &'a mut Display,
    pub(super) rows: usize,
    pub(super) val: Option<&'a Split>,
    pub(super) stats: &'a Stats,
    pub(super) history: Vec<EpochRow>,
    pub(super) last: Option<Evaluation>,
    pub(super) keeper: Option<Keeper>,
    pub(super) kept: Option<(SalesParams, Evaluation)>,
}

impl EpochHooks<FitSales> for SalesEpochs<'_> {
    fn started(&mut self, epoch: usize, samples: usize) {
        self.display.epoch_started(epoch, samples);
    }

    fn finished(&mut self, trainer: &mut FitSales, epoch: &EpochTrained) -> Result<Verdict> {
        self.display.reached(self.rows);
        let eval = trainer.evaluate(TEST)?;
        let judged = match self.val {
            Some(val) => {
                let params = trainer.params()?;
                Some((model::evaluate(&params, val, self.stats)?, params))
            }
            None => None,
        };
        let val_eval = judged.as_ref().map(|(e, _)| *e);
        if ![Some(eval.mse), val_eval.map(|e| e.mse)].into_iter().flatten().all(f64::is_finite) {
            return Ok(Verdict::Diverged("test error"));
        }
        let mut note = String::new();
        if let (Some(keeper), Some((v, params))) = (self.keeper.as_mut(), judged) {
            let kept = &mut self.kept;
            let written = keeper.offer(epoch.epoch, v.mae, || {
                *kept = Some((params, eval));
                Ok(())
            })?;
            note = keeper.note(written, "val MAE").replace("saved", "kept");
        }
        let mut row = EpochRow {
            epoch: epoch.epoch,
            train_loss: epoch.train_loss,
            val_loss: val_eval.map(|v| v.mse),
            val_accuracy: None,
            test_loss: Some(eval.mse),
            test_accuracy: None,
            samples_per_s: epoch.samples_per_s,
            lr: Some(report::decimal(epoch.lr)),
            elapsed_s: epoch.started.elapsed().as_secs_f64(),
            extra: Default::default(),
        }
        .with("test_mae", eval.mae);
        let mut figures = format!("test MSE {:.4}, test MAE {:.4}", eval.mse, eval.mae);
        if let Some(v) = val_eval {
            row = row.with("val_mae", v.mae);
            figures = format!("val MAE {:.4}, {figures}", v.mae);
        }
        self.display.epoch_finished(&row, &figures, &note);
        self.history.push(row);
        self.last = Some(eval);
        Ok(Verdict::Next { judged: None })
    }
}
