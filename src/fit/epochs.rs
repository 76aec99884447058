//! `textnet fit`'s side of the epoch loop (`run::epochs`): after each epoch the test (and validation)
//! figures, the model written as --keep says when it learned, and the epoch's line.

use super::args::FitArgs;
use super::data::{Data, TargetInfo};
use super::modelfile::{self, FitModel};
use crate::harness::checkpoint::Keeper;
use crate::harness::report::{self, Display, EpochRow};
use crate::harness::run::{EpochHooks, EpochTrained, TEST, VAL, Verdict};
use crate::nn::stack::model::Network;
use crate::nn::stack::{Figures, Samples, StackTrainer, Target};
use anyhow::{Result, anyhow};

/// The figures of `outputs` on `s` (of `loss_sum` summed loss); `raw`: the targets in the file's units.
pub(super) fn figures(target: &TargetInfo, s: &Samples, raw: &[f32], loss_sum: f64, outputs: &[f32]) -> Figures {
    let rows = s.rows().max(1);
    let loss = loss_sum / rows as f64;
    match (target, &s.target) {
        (TargetInfo::Classes { names }, Target::Classes(classes)) => {
            Figures::of_classes(classes, names.len(), loss_sum, outputs)
        }
        (TargetInfo::Value { mean, std, .. }, _) => {
            let sum: f64 = outputs.iter().zip(raw).map(|(&o, &y)| ((o * std + mean) as f64 - y as f64).abs()).sum();
            Figures { loss, accuracy: None, mae: Some(sum / rows as f64) }
        }
        _ => Figures { loss, ..Default::default() },
    }
}

/// `textnet fit`'s side of the epoch loop: the test (and validation) figures, the model written by
/// --keep when it learned, the epoch's line.
pub(super) struct FitEpochs<'a> {
    pub(super) args: &'a FitArgs,
    pub(super) display: &'a mut Display,
    pub(super) data: &'a Data,
    pub(super) net: &'a Network,
    pub(super) baseline_mae: Option<f64>,
    pub(super) judged_name: &'static str,
    pub(super) keeper: Keeper,
    pub(super) rows: Vec<EpochRow>,
    pub(super) last: Option<Figures>,
}

impl EpochHooks<StackTrainer> for FitEpochs<'_> {
    fn started(&mut self, epoch: usize, samples: usize) {
        self.display.epoch_started(epoch, samples);
    }

    fn progress(&mut self, done: usize, _loss_sum: f64) {
        self.display.reached(done);
    }

    fn finished(&mut self, trainer: &mut StackTrainer, epoch: &EpochTrained) -> Result<Verdict> {
        let data = self.data;
        let (test_sum, test_out) = trainer.evaluate(TEST)?;
        let test = figures(&data.target, &data.test, &data.test_values, test_sum, &test_out);
        let val = match &data.val {
            Some(v) => {
                let (sum, out) = trainer.evaluate(VAL)?;
                Some(figures(&data.target, v, &data.val_values, sum, &out))
            }
            None => None,
        };
        let params = trainer.params()?;
        let finite = test.loss.is_finite() && val.is_none_or(|v| v.loss.is_finite());
        if !finite || !params.iter().all(|p| p.is_finite()) {
            return Ok(Verdict::Diverged("parameters"));
        }
        let learned = match (test.accuracy, test.mae, &data.target) {
            (Some(a), _, TargetInfo::Classes { names }) => a > 1.5 / names.len() as f64,
            (_, Some(mae), _) => self.baseline_mae.is_none_or(|b| mae < b),
            _ => true,
        };
        let judged = val.map_or(test.loss, |v| v.loss);
        let note = if learned {
            let model = FitModel {
                net: self.net.clone(),
                params,
                loss: data.loss,
                input: data.schema.clone(),
                target: data.target.clone(),
            };
            let (keeper, out) = (&mut self.keeper, &self.args.run.out);
            let written = keeper
                .offer(epoch.epoch, judged, || modelfile::save(&model, out))
                .map_err(|e| anyhow!("{e:#}; {}", keeper.outcome(out, self.judged_name)))?;
            keeper.note(written, self.judged_name)
        } else {
            "not saved (no better than guessing)".to_string()
        };
        let mut row = EpochRow {
            epoch: epoch.epoch,
            train_loss: epoch.train_loss,
            val_loss: val.map(|v| v.loss),
            val_accuracy: val.and_then(|v| v.accuracy),
            test_loss: Some(test.loss),
            test_accuracy: test.accuracy,
            samples_per_s: epoch.samples_per_s,
            lr: Some(report::decimal(epoch.lr)),
            elapsed_s: epoch.started.elapsed().as_secs_f64(),
            extra: Default::default(),
        };
        let mut text = String::new();
        if let Some(v) = val {
            text += &format!("val loss {:.4}, ", v.loss);
            if let Some(a) = v.accuracy {
                text += &format!("val acc {:.2}%, ", 100.0 * a);
            }
            if let Some(mae) = v.mae {
                row = row.with("val_mae", mae);
                text += &format!("val MAE {mae:.4}, ");
            }
        }
        text += &format!("test loss {:.4}", test.loss);
        if let Some(a) = test.accuracy {
            text += &format!(", test acc {:.2}%", 100.0 * a);
        }
        if let Some(mae) = test.mae {
            row = row.with("test_mae", mae);
            text += &format!(", test MAE {mae:.4}");
        }
        self.display.epoch_finished(&row, &text, &note);
        self.rows.push(row);
        self.last = Some(test);
        Ok(Verdict::Next { judged: Some(judged) })
    }

    fn stopping_early(&mut self, _epoch: usize, patience: usize, best: usize) {
        self.display.line(&format!(
            "stopping early: the val loss has not improved for {patience} epoch{} (best: epoch {best})",
            if patience == 1 { "" } else { "s" }
        ));
    }
}
