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
//! writes nothing, and one that diverges later leaves the epoch last written. An epoch counts as kept
//! only once its write has succeeded: a failed write (a full disk, an immutable file) leaves the file
//! as it was, and the closing line says so.

use anyhow::{Result, bail};
use std::path::Path;

/// The help of every training command's `--overwrite`.
pub const OVERWRITE_HELP: &str = "Replace the model at --out even when it was trained on other data or does better than \
this run (by default a model there is replaced only by an epoch measured better on this run's data; a file of another \
kind is never replaced)";

/// The baseline of a run whose `--out` holds a model of the same data: that model's `loss` on this
/// run's validation data. A loss that is not finite (a damaged or diverged model) could never be beaten,
/// so it is refused with what to do.
pub fn baseline(out: &Path, loss: f64, loss_name: &str) -> Result<f64> {
    if !loss.is_finite() {
        bail!(
            "--out {} holds a model whose outputs on this data are not finite ({loss_name} {loss}), so no epoch could \
             beat it; remove it, choose another --out, or pass --overwrite",
            out.display()
        );
    }
    Ok(loss)
}

/// The error of a run whose `--out` holds a model of the same kind trained on other data (`what`, e.g.
/// "a model of another vocabulary"), which this run's figures cannot be compared with.
pub fn other_data(out: &Path, what: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "--out {} holds {what}, which this run cannot be compared with, so it is not replaced; choose another \
         --out, or pass --overwrite to replace it",
        out.display()
    )
}

/// Checks `--val-split F` (a fraction between 0 and 1) and that `--keep best` comes with it: choosing the
/// epoch by the test set would make its figures optimistic.
pub fn check_val_split(val_split: Option<f64>, keep: Keep) -> Result<()> {
    if let Some(f) = val_split
        && !(f > 0.0 && f < 1.0)
    {
        bail!("--val-split must be a fraction between 0 and 1 (exclusive), got {f}");
    }
    if keep == Keep::Best && val_split.is_none() {
        bail!("--keep best needs --val-split F: choosing the epoch by the test set would leak it into the model");
    }
    Ok(())
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
/// Which epochs `--keep` writes to `--out`.
pub enum Keep {
    /// The epoch with the lowest validation loss
    Best,
    /// The last completed epoch
    Last,
}

impl Keep {
    /// The flag value, "best" or "last".
    pub fn name(self) -> &'static str {
        match self {
            Keep::Best => "best",
            Keep::Last => "last",
        }
    }
}

#[derive(Clone, Debug)]
/// Applies the rule above to each epoch of a run and remembers what the model file holds.
pub struct Keeper {
    /// Which epochs are written.
    pub keep: Keep,
    /// The validation loss an epoch must beat to be written at all.
    pub baseline: Option<f64>,
    /// The epoch the file holds, and its validation loss.
    pub kept: Option<(usize, f64)>,
    /// The run's lowest validation loss so far, and its epoch.
    pub best: Option<(usize, f64)>,
    /// A write of a kept epoch failed, so the file is as it was before that write.
    pub write_failed: bool,
    /// The loss of the task's trivial model (the unigram model for text), which an epoch must also beat
    /// to be written: one no better learned nothing (`run::not_learned`).
    pub floor: Option<f64>,
}

impl Keeper {
    /// A keeper that has written nothing yet; `baseline` is the validation loss of the model the run started from, if
    /// any.
    pub fn new(keep: Keep, baseline: Option<f64>) -> Keeper {
        Keeper { keep, baseline, kept: None, best: None, write_failed: false, floor: None }
    }

    /// The same, with an epoch no better than `floor` never written.
    pub fn with_floor(self, floor: f64) -> Keeper {
        Keeper { floor: Some(floor), ..self }
    }

    /// Offers `epoch`, of validation loss `loss`: when the rule keeps it, `write` writes it, and only
    /// once that succeeded is it recorded as kept. Returns whether it was written.
    pub fn offer(&mut self, epoch: usize, loss: f64, write: impl FnOnce() -> Result<()>) -> Result<bool> {
        if self.best.is_none_or(|(_, best)| loss < best) {
            self.best = Some((epoch, loss));
        }
        let beats_baseline = self.baseline.is_none_or(|b| loss < b) && self.floor.is_none_or(|f| loss < f);
        let keep = match self.keep {
            Keep::Best => beats_baseline && self.kept.is_none_or(|(_, kept)| loss < kept),
            Keep::Last => beats_baseline,
        };
        if !keep {
            return Ok(false);
        }
        if let Err(e) = write() {
            self.write_failed = true;
            return Err(e);
        }
        self.kept = Some((epoch, loss));
        Ok(true)
    }

    /// What the file at `out` holds after the run, for its closing line: "OUT holds epoch 3 (val loss
    /// 5.8321)", or why nothing was written.
    pub fn outcome(&self, path: &Path, loss_name: &str) -> String {
        let out = path.display();
        match (self.kept, self.baseline, self.best) {
            (Some((epoch, loss)), _, _) => format!("{out} holds epoch {epoch} ({loss_name} {loss:.4})"),
            (None, Some(baseline), Some((epoch, loss))) if !self.write_failed && loss >= baseline => format!(
                "nothing written: no epoch beat the {loss_name} {baseline:.4} of the model the run started from \
                 (best: epoch {epoch}, {loss:.4}), so {out} is unchanged"
            ),
            (None, _, _) if path.exists() => format!("nothing written, so {out} is unchanged"),
            (None, _, _) => format!("nothing written to {out}"),
        }
    }

    /// What became of the epoch just offered, for its summary line: "saved", or why not.
    pub fn note(&self, written: bool, loss_name: &str) -> String {
        match (written, self.kept, self.baseline) {
            (true, _, _) => "saved".into(),
            (false, Some((epoch, _)), _) => format!("not saved (the file keeps epoch {epoch})"),
            (false, None, Some(baseline)) => format!("not saved (the starting model's {loss_name} is {baseline:.4})"),
            (false, None, None) => "not saved".into(),
        }
    }

    /// The epoch the file holds, for the `--json` report.
    pub fn kept_epoch(&self) -> Option<usize> {
        self.kept.map(|(epoch, _)| epoch)
    }
}
