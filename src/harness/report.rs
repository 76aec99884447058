//! What every training command shows and reports, the same way in each pipeline: the informational
//! lines, a progress bar per epoch that the epoch's summary line replaces, the `--json` report, and with
//! `--tensorboard DIR` each epoch's figures as TensorBoard scalars as the run goes (`Board`).
//!
//! Human lines go to stdout, or to stderr with `--json`, whose report then owns stdout. The bar is drawn
//! on stderr, and only where stderr is a terminal. `--quiet` leaves errors only: no bar and no lines
//! (the `--json` report is still printed).

use crate::harness::console;
use crate::harness::tensorboard::{self, EventWriter};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use serde_json::{Map, Value};

/// How a training run ended: `status` in the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Every epoch ran and the model file holds one of them.
    Ok,
    /// A loss or the parameters stopped being finite.
    Diverged,
    /// Stopped by Ctrl-C.
    Interrupted,
    /// Every epoch ran, none beat the model the run started from, so nothing was written.
    NotBetter,
    /// Every epoch ran, but the model does no better than its task's trivial baseline, so none of it was
    /// written (`run::not_learned` says which baseline each pipeline has).
    NotLearned,
}

impl Status {
    /// The status of a run from whether it diverged, was interrupted and wrote the model file.
    pub fn of(diverged: bool, interrupted: bool, kept: bool) -> Status {
        match (diverged, interrupted, kept) {
            (true, _, _) => Status::Diverged,
            (false, true, _) => Status::Interrupted,
            (false, false, false) => Status::NotBetter,
            (false, false, true) => Status::Ok,
        }
    }
}

/// Where a run stopped because a loss or the parameters stopped being finite.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Divergence {
    /// The epoch (1-based) in which it happened.
    pub epoch: usize,
    /// What went non-finite, e.g. "training loss".
    pub what: &'static str,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "training diverged in epoch {}: the {} became NaN or infinite", self.epoch, self.what)
    }
}

impl std::error::Error for Divergence {}

/// One epoch in the report. Losses are mean cross-entropy per sample in nats, accuracies fractions
/// (0 to 1); `val_` figures are on the held-out validation samples, `test_` ones on a test set, each
/// present where the pipeline has that set.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpochRow {
    /// 1-based.
    pub epoch: usize,
    /// Mean over the epoch's training samples, each taken before its own update.
    pub train_loss: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Mean loss on the validation set after the epoch.
    pub val_loss: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Accuracy on the validation set after the epoch.
    pub val_accuracy: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Mean loss on the test set after the epoch.
    pub test_loss: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// Accuracy on the test set after the epoch.
    pub test_accuracy: Option<f64>,
    /// Training samples per second of the epoch's training time (evaluation excluded).
    pub samples_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// The learning rate of the epoch's last optimizer step.
    pub lr: Option<f64>,
    /// Seconds since training started, evaluation included.
    pub elapsed_s: f64,
    /// The pipeline's further figures on held-out data, e.g. `val_perplexity`.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl EpochRow {
    /// Adds a pipeline's own figure.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> EpochRow {
        self.extra.insert(key.to_string(), value.into());
        self
    }

    /// The row's numeric figures as TensorBoard scalars, each under `tensorboard::tag` of its name
    /// (`train_loss` as `loss/train`, `val_accuracy` as `accuracy/val`, `lr`, `samples_per_s`, the
    /// pipeline's own): all but `epoch`, `step` and `elapsed_s`, which TensorBoard's axes show.
    pub fn scalars(&self) -> Vec<(String, f64)> {
        let Ok(Value::Object(map)) = serde_json::to_value(self) else { return Vec::new() };
        map.iter()
            .filter(|(key, _)| !matches!(key.as_str(), "epoch" | "step" | "elapsed_s"))
            .filter_map(|(key, value)| Some((tensorboard::tag(key), value.as_f64()?)))
            .collect()
    }

    /// The figures on held-out data: the row less `epoch`, `train_loss`, `samples_per_s`, `lr` and
    /// `elapsed_s`.
    fn evaluation(&self) -> Map<String, Value> {
        let Ok(Value::Object(mut map)) = serde_json::to_value(self) else { return Map::new() };
        for key in ["epoch", "train_loss", "samples_per_s", "lr", "elapsed_s"] {
            map.remove(key);
        }
        map
    }
}

/// The `--json` report of every training command: one JSON object on stdout when the run ends, also
/// when it diverged, was interrupted or wrote nothing.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The version of textnet that wrote it.
    pub textnet: &'static str,
    /// The subcommand: "train", "fit", "mnist", "xor", "sales", "transformer".
    pub command: &'static str,
    /// How the run ended.
    pub status: Status,
    /// The settings, flat, one key per flag (defaults filled in); `out`, `keep`, `lr`, `epochs`,
    /// `batch`, `seed` and `device` (as given: auto, cuda, cpu) in every pipeline.
    pub config: Value,
    /// `device` ("cpu" or "cuda:0"), `device_name` and `device_reason`.
    #[serde(flatten)]
    pub device: DeviceFields,
    /// What the run trained on; `train_samples` and `val_samples` in every pipeline.
    pub data: Value,
    /// Number of trainable parameters.
    pub parameters: usize,
    /// One row per completed epoch.
    pub epochs: Vec<EpochRow>,
    /// The held-out figures of the epoch the model file holds (those of its row, and the pipeline's
    /// further ones); null when the run wrote none.
    #[serde(rename = "final")]
    pub final_metrics: Option<Map<String, Value>>,
    /// The model file (`--out`).
    pub model: String,
    /// The epoch the model file holds, if the run wrote one.
    pub kept_epoch: Option<usize>,
    /// The validation loss an epoch had to beat to be written: that of the model the run started from.
    pub baseline_val_loss: Option<f64>,
    /// Where the run diverged, if it did.
    pub diverged: Option<Divergence>,
}

/// Where a run trained: `device` as PyTorch names it ("cpu" or "cuda:0"), the GPU's name (null on the
/// CPU), and why that device (`--device cpu`, `--device auto found a usable GPU`, …).
#[derive(Clone, Debug, Serialize)]
pub struct DeviceFields {
    /// "cpu" or "cuda:0".
    pub device: &'static str,
    /// The GPU's name, compute capability and SM count; none on the CPU.
    pub device_name: Option<String>,
    /// Why this device: the `--device` flag, or what `--device auto` found.
    pub device_reason: String,
}

impl DeviceFields {
    /// The fields of the run's backend, with the reason `device::select_described` gave.
    pub fn of(backend: &crate::device::Backend) -> DeviceFields {
        DeviceFields {
            device: backend.id(),
            device_name: match backend {
                crate::device::Backend::Cpu => None,
                crate::device::Backend::Cuda(gpu) => Some(gpu.describe()),
            },
            device_reason: crate::device::selection_reason().unwrap_or_default().to_string(),
        }
    }
}

/// The report's `final`: the held-out figures of the `kept` epoch's row with `extra` added, or none
/// when no epoch was kept.
pub fn final_metrics(
    epochs: &[EpochRow],
    kept: Option<usize>,
    extra: Map<String, Value>,
) -> Option<Map<String, Value>> {
    let row = epochs.iter().find(|row| Some(row.epoch) == kept)?;
    let mut figures = row.evaluation();
    figures.extend(extra);
    Some(figures)
}

impl Report {
    /// The report as one line on stdout.
    pub fn print(&self) -> serde_json::Result<()> {
        console::out(&serde_json::to_string(self)?);
        Ok(())
    }
}

/// `f32` flags through their shortest decimal form, so `--lr 0.05` reports 0.05 and not
/// 0.05000000074505806.
pub fn decimal(value: f32) -> f64 {
    value.to_string().parse::<f64>().unwrap_or(f64::from(value))
}

/// `decimal` as a serde field serializer (`#[serde(serialize_with = …)]`).
pub fn serialize_decimal<S: serde::Serializer>(value: &f32, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(decimal(*value))
}

/// `decimal` of a value that may be absent, as a serde field serializer.
pub fn serialize_optional_decimal<S: serde::Serializer>(value: &Option<f32>, serializer: S) -> Result<S::Ok, S::Error> {
    value.map(decimal).serialize(serializer)
}

/// A path as the report writes it (`Path::display`), as a serde field serializer.
pub fn serialize_path<S: serde::Serializer>(path: &std::path::Path, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&path.display())
}

/// `serialize_path` of a path that may be absent.
pub fn serialize_optional_path<S: serde::Serializer>(
    path: &Option<std::path::PathBuf>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    path.as_ref().map(|p| p.display().to_string()).serialize(serializer)
}

/// `flag_value` as a serde field serializer.
pub fn serialize_flag_value<T: clap::ValueEnum, S: serde::Serializer>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&flag_value(value))
}

/// A flag group as the report's `config` lists it: its serialised fields (`harness::args`). Any
/// `Serialize` is one, so that `with_flags` takes groups of different types in one list.
pub trait FlagGroup {
    /// The group's fields as a JSON object.
    fn entries(&self) -> Value;
}

impl<T: Serialize> FlagGroup for T {
    fn entries(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// The report's `config`: a command's own entries `config` (a JSON object) and the fields of the flag
/// groups it flattens (`RunArgs`, `OptimArgs`, `ScheduleArgs`), serialised.
pub fn with_flags(mut config: Value, groups: &[&dyn FlagGroup]) -> Value {
    if let Some(entries) = config.as_object_mut() {
        for group in groups {
            if let Value::Object(fields) = group.entries() {
                entries.extend(fields);
            }
        }
    }
    config
}

/// A value-enum flag's value as written on the command line, e.g. `auto` for `--device auto`.
pub fn flag_value<T: clap::ValueEnum>(value: &T) -> String {
    value.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default()
}

/// The help of every training command's `--tensorboard`.
pub const TENSORBOARD_HELP: &str = "Write TensorBoard event files to DIR (created if missing) as the run trains: \
the training and held-out losses and accuracies, the learning rate and the speed per epoch (per evaluation and \
per step for transformer), and the run's settings as hyperparameters; watch with `tensorboard --logdir DIR`";

/// `--tensorboard DIR`: the event file each row of the run goes to as it comes, and at the end the run's
/// settings and how it ended (`close`). A write that fails stops the writing; `close` says why.
#[derive(Debug)]
pub struct Board {
    writer: EventWriter,
    dir: std::path::PathBuf,
    failed: Option<String>,
}

impl Board {
    /// The event file of a new run in `dir` (created if missing), or the one-line error of a `dir` that
    /// cannot hold it; none without `dir`.
    pub fn open(dir: Option<&std::path::Path>) -> anyhow::Result<Option<Board>> {
        let Some(dir) = dir else { return Ok(None) };
        match EventWriter::create(dir) {
            Ok(writer) => Ok(Some(Board { writer, dir: dir.to_path_buf(), failed: None })),
            Err(e) => anyhow::bail!("--tensorboard {}: {e:#}", dir.display()),
        }
    }

    /// Scalars at `step`, unless a write failed before.
    pub fn scalars(&mut self, step: usize, scalars: &[(String, f64)]) {
        if self.failed.is_none()
            && let Err(e) = self.writer.scalars(step as u64, scalars)
        {
            self.failed = Some(format!("--tensorboard {}: {e:#}", self.dir.display()));
        }
    }

    /// Writes the run's settings (`report.config`) as its hyperparameters, with the scalar tags written as
    /// their metrics and the report's status as the run's end (a run that diverged, was interrupted
    /// or did not learn as a failure); returns the error line of any write that failed.
    pub fn close(mut self, report: Option<&Report>) -> Option<String> {
        if let (None, Some(report)) = (&self.failed, report) {
            let status = match report.status {
                Status::Ok | Status::NotBetter => tensorboard::proto::Status::Success,
                _ => tensorboard::proto::Status::Failure,
            };
            let config = report.config.as_object().cloned().unwrap_or_default();
            let metrics = self.writer.tags().to_vec();
            if let Err(e) = self.writer.hparams(&config, &metrics, status) {
                self.failed = Some(format!("--tensorboard {}: {e:#}", self.dir.display()));
            }
        }
        self.failed
    }
}

/// The human side of a training run: informational lines, and per epoch a progress bar that the
/// epoch's summary line replaces; with `--tensorboard`, the rows' scalars too.
pub struct Display {
    quiet: bool,
    to_stderr: bool,
    epochs: usize,
    bar: Option<ProgressBar>,
    /// A run counted in steps (`steps_started`): tokens per step, and the last step and time the bar's
    /// speed was measured from.
    tokens_per_step: usize,
    last: (usize, std::time::Instant),
    /// `--log-every`: an epoch line every this many epochs (and the first and last).
    log_every: usize,
    /// `--tensorboard`: where the rows go as they come.
    board: Option<Board>,
}

impl Display {
    /// For a run of `epochs` epochs; `json`: the lines go to stderr.
    pub fn new(quiet: bool, json: bool, epochs: usize) -> Display {
        Display {
            quiet,
            to_stderr: json,
            epochs,
            bar: None,
            tokens_per_step: 0,
            last: (0, std::time::Instant::now()),
            log_every: 1,
            board: None,
        }
    }

    /// The same, writing each row to TensorBoard event files in `dir` (`--tensorboard`): the one-line error
    /// of a `dir` that cannot hold them comes now, before training.
    pub fn tensorboard(mut self, dir: Option<&std::path::Path>) -> anyhow::Result<Display> {
        self.board = Board::open(dir)?;
        Ok(self)
    }

    /// Writes `row`'s scalars at `step` (the epoch, or the optimizer step of a run counted in steps) to
    /// `--tensorboard`; `epoch_finished` does it for its row.
    pub fn record(&mut self, step: usize, row: &EpochRow) {
        if let Some(board) = &mut self.board {
            board.scalars(step, &row.scalars());
        }
    }

    /// Writes the training loss of each optimizer step from `first` on (`loss/train_step`) to
    /// `--tensorboard`.
    pub fn record_steps(&mut self, first: usize, losses: &[f64]) {
        if let Some(board) = &mut self.board {
            for (k, &loss) in losses.iter().enumerate() {
                board.scalars(first + k, &[("loss/train_step".to_string(), loss)]);
            }
        }
    }

    /// Hands the `--tensorboard` event file over to the run's `Ending`, which closes it.
    pub fn take_board(&mut self) -> Option<Board> {
        self.board.take()
    }

    /// The same, printing an epoch's line only every `n` epochs, the first and the last (`--log-every`).
    pub fn log_every(mut self, n: usize) -> Display {
        self.log_every = n.max(1);
        self
    }

    /// An informational line (none with `--quiet`).
    pub fn line(&self, text: &str) {
        if !self.quiet {
            console::line(self.to_stderr, text);
        }
    }

    /// A warning: a line as `line` prints it, and on stderr with `--quiet`.
    pub fn warning(&self, text: &str) {
        console::line(self.to_stderr || self.quiet, text);
    }

    /// Starts the progress bar of `epoch`, over `samples` training samples (hidden with `--quiet`).
    pub fn epoch_started(&mut self, epoch: usize, samples: usize) {
        self.bar = Some(progress_bar(self.quiet, &format!("epoch {epoch}/{}", self.epochs), samples));
    }

    /// A run counted in optimizer steps, as nanoGPT counts them: one bar for the whole run, "step 120/1000"
    /// with the tokens/s and ms/step of the latest steps, and each evaluation's line (`evaluated`) printed
    /// above it.
    pub fn steps_started(&mut self, steps: usize, tokens_per_step: usize) {
        let template = "step {human_pos}/{human_len} [{bar:30}] {msg}, ETA {eta}";
        self.bar = Some(bar(self.quiet, template, steps));
        self.tokens_per_step = tokens_per_step;
        self.last = (0, std::time::Instant::now());
    }

    /// `done` steps of the run are done.
    pub fn steps_reached(&mut self, done: usize) {
        let (step, at) = self.last;
        if let Some(bar) = &self.bar
            && done > step
        {
            let seconds_per_step = at.elapsed().as_secs_f64() / (done - step) as f64;
            bar.set_message(format!(
                "{} tokens/s, {:.1} ms/step",
                thousands(self.tokens_per_step as f64 / seconds_per_step.max(1e-12)),
                seconds_per_step * 1e3
            ));
            bar.set_position(done as u64);
        }
        self.last = (done, std::time::Instant::now());
    }

    /// An evaluation's line, above the run's bar; the speed after it is measured afresh.
    pub fn evaluated(&mut self, text: &str) {
        match &self.bar {
            Some(bar) if !self.quiet => bar.suspend(|| console::line(self.to_stderr, text)),
            _ => self.line(text),
        }
        self.last.1 = std::time::Instant::now();
    }

    /// `samples` more of the epoch's training samples are done.
    pub fn advanced(&self, samples: usize) {
        if let Some(bar) = &self.bar {
            bar.inc(samples as u64);
        }
    }

    /// `done` of the epoch's training samples are done.
    pub fn reached(&self, done: usize) {
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
        }
    }

    /// Writes the row to `--tensorboard` and replaces the bar by "epoch 2/5: train loss …, `figures`, … samples/s, … elapsed, about … left;
    /// `note`" (the time left at the run's mean speed so far, when a second or more).
    pub fn epoch_finished(&mut self, row: &EpochRow, figures: &str, note: &str) {
        self.record(row.epoch, row);
        self.clear();
        if !(row.epoch == 1 || row.epoch.is_multiple_of(self.log_every) || row.epoch >= self.epochs) {
            return;
        }
        let note = if note.is_empty() { String::new() } else { format!("; {note}") };
        let epochs_left = self.epochs.saturating_sub(row.epoch) as f64;
        let seconds_left = row.elapsed_s / row.epoch.max(1) as f64 * epochs_left;
        let left = match seconds_left >= 1.0 {
            true => format!(", about {} left", duration(seconds_left)),
            false => String::new(),
        };
        self.line(&format!(
            "epoch {}/{}: train loss {:.4}, {figures}, {} samples/s, {} elapsed{left}{note}",
            row.epoch,
            self.epochs,
            row.train_loss,
            thousands(row.samples_per_s),
            duration(row.elapsed_s)
        ));
    }

    /// Takes the bar off the screen.
    pub fn clear(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Display {
    /// Clears a bar left mid-epoch by a divergence or an error.
    fn drop(&mut self) {
        self.clear();
    }
}

/// A count a person reads, with thousands separators: `1,234,567`.
pub fn count(n: usize) -> String {
    indicatif::HumanCount(n as u64).to_string()
}

/// A rate or count a person reads, rounded, with thousands separators: `1,234,567`.
pub fn thousands(value: f64) -> String {
    indicatif::HumanCount(value.round().max(0.0) as u64).to_string()
}

/// A bar over `samples` samples on stderr, led by `label` ("epoch 2/5"): drawn only where stderr is a
/// terminal, never with `quiet`.
pub fn progress_bar(quiet: bool, label: &str, samples: usize) -> ProgressBar {
    let template = "{prefix} [{bar:30}] {human_pos}/{human_len} samples, {per_sec:0}, ETA {eta}";
    bar(quiet, template, samples).with_prefix(label.to_string())
}

/// A bar of `len` on stderr drawn with indicatif's `template`: only where stderr is a terminal, never
/// with `quiet`.
fn bar(quiet: bool, template: &str, len: usize) -> ProgressBar {
    let target = if quiet { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() };
    let style = ProgressStyle::with_template(template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    let bar = ProgressBar::with_draw_target(Some(len as u64), target).with_style(style);
    // Drawn at once and redrawn while a slow step runs, not only when a chunk of samples ends; the tick
    // is a thread of its own, started only where there is a terminal to draw on.
    if !bar.is_hidden() {
        bar.enable_steady_tick(std::time::Duration::from_millis(250));
    }
    bar
}

/// `42.0s`, `3m05s`, `1h02m`.
pub fn duration(secs: f64) -> String {
    let whole = secs as u64;
    match whole {
        0..60 => format!("{secs:.1}s"),
        60..3600 => format!("{}m{:02}s", whole / 60, whole % 60),
        _ => format!("{}h{:02}m", whole / 3600, whole % 3600 / 60),
    }
}
