//! Which epochs a training run writes to its model file. Every pipeline saves after each completed epoch
//! that passes this rule:
//!
//! - an epoch is written only if its validation loss is below the baseline: the loss, on the same
//!   validation data, of the model `--out` held when the run started (or of the `--resume`d model), when
//!   there is one to compare with;
//! - among those, `--keep best` writes an epoch only if it also beats every epoch written before it,
//!   `--keep last` writes each.
//!
//! So a run never replaces a model with a worse one, a run that diverges before its first epoch ends
//! writes nothing, and one that diverges later leaves the epoch last written.

use std::path::Path;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// The epoch with the lowest validation loss
    Best,
    /// The last completed epoch
    Last,
}

impl Keep {
    pub fn name(self) -> &'static str {
        match self {
            Keep::Best => "best",
            Keep::Last => "last",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Keeper {
    pub keep: Keep,
    /// The validation loss an epoch must beat to be written at all.
    pub baseline: Option<f64>,
    /// The epoch the file holds, and its validation loss.
    pub kept: Option<(usize, f64)>,
    /// The run's lowest validation loss so far, and its epoch.
    pub best: Option<(usize, f64)>,
}

impl Keeper {
    pub fn new(keep: Keep, baseline: Option<f64>) -> Keeper {
        Keeper { keep, baseline, kept: None, best: None }
    }

    /// Whether `epoch`, of validation loss `loss`, is to be written; if so it is recorded as kept.
    pub fn offer(&mut self, epoch: usize, loss: f64) -> bool {
        if self.best.is_none_or(|(_, best)| loss < best) {
            self.best = Some((epoch, loss));
        }
        let beats_baseline = self.baseline.is_none_or(|b| loss < b);
        let write = match self.keep {
            Keep::Best => beats_baseline && self.kept.is_none_or(|(_, kept)| loss < kept),
            Keep::Last => beats_baseline,
        };
        if write {
            self.kept = Some((epoch, loss));
        }
        write
    }

    /// What the file at `out` holds after the run, for its closing line: "OUT holds epoch 3 (val loss
    /// 5.8321)", or why nothing was written.
    pub fn outcome(&self, path: &Path, loss_name: &str) -> String {
        let out = path.display();
        match (self.kept, self.baseline, self.best) {
            (Some((epoch, loss)), _, _) => format!("{out} holds epoch {epoch} ({loss_name} {loss:.4})"),
            (None, Some(baseline), Some((epoch, loss))) => format!(
                "nothing written: no epoch beat the {loss_name} {baseline:.4} of the model the run started from \
                 (best: epoch {epoch}, {loss:.4}), so {out} is unchanged"
            ),
            (None, _, _) if path.exists() => format!("nothing written, so {out} is unchanged"),
            (None, _, _) => format!("nothing written to {out}"),
        }
    }

    /// What became of the epoch just offered, for its summary line: "saved", or why not.
    pub fn note(&self, written: bool) -> String {
        match (written, self.kept, self.baseline) {
            (true, _, _) => "saved".into(),
            (false, Some((epoch, _)), _) => format!("not saved (the file keeps epoch {epoch})"),
            (false, None, Some(baseline)) => format!("not saved (the starting model's val loss is {baseline:.4})"),
            (false, None, None) => "not saved".into(),
        }
    }

    /// The epoch the file holds, for the `--json` report.
    pub fn kept_epoch(&self) -> Option<usize> {
        self.kept.map(|(epoch, _)| epoch)
    }
}
