//! `textnet mnist`: train the classifier on MNIST or Fashion-MNIST, report test loss and accuracy after
//! every epoch and a confusion matrix at the end, and write the model as .safetensors.
//!
//! Output: human lines on stdout; with `--json` one JSON object on stdout and the human lines on
//! stderr. `--quiet` drops the progress bar and the notes (device, data, model file), keeping the
//! per-epoch lines and the confusion matrix, or with `--json` everything but the JSON.

use super::data::{self, Dataset};
use super::idx::Split;
use super::model::{Activation, MlpParams, MlpShape};
use super::optim::{OptimConfig, OptimKind};
use super::train::{self, EpochStats, Observer, Schedule};
use super::{Evaluation, evaluate_split, idx};
use crate::checkpoint::{Keep, Keeper};
use crate::device::{self, DeviceChoice};
use crate::interrupt::{self, Interrupted};
use crate::{console, fsutil};
use anyhow::{Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Data: --data DIR, else searched in $TEXTNET_DATA (MNIST), $TEXTNET_DATA/<mnist|fashion-mnist>, \
./data/<mnist|fashion-mnist>, the textnet cache dir and, for Fashion-MNIST, /usr/share/datasets/fashion-mnist \
(Debian package dataset-fashion-mnist); MNIST missing everywhere is downloaded into the cache with curl."
)]
pub struct MnistArgs {
    /// Which dataset
    #[arg(long, value_enum, default_value_t = Dataset::Mnist)]
    pub dataset: Dataset,
    /// Directory holding train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
    /// t10k-labels-idx1-ubyte, each raw or .gz
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Hidden units
    #[arg(long, default_value_t = 128)]
    pub hidden: usize,
    /// Hidden-layer activation
    #[arg(long, value_enum, default_value_t = Activation::Relu)]
    pub activation: Activation,
    /// Optimizer
    #[arg(long, value_enum, default_value_t = OptimKind::Adam)]
    pub optim: OptimKind,
    /// Learning rate [default: adam 0.001, sgd 0.1, momentum 0.05]
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f32>,
    /// Momentum μ of --optim momentum [default: 0.9]
    #[arg(long, allow_negative_numbers = true)]
    pub momentum: Option<f32>,
    /// L2 weight decay, added to the gradient as wd·θ
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub weight_decay: f32,
    /// Clip the gradient's global L2 norm to this before each update (0 = off)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub clip_norm: f32,
    /// Samples per optimizer step (the loss is the batch mean)
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Passes over the training set
    #[arg(long, default_value_t = 10)]
    pub epochs: usize,
    /// Seed of the initialisation and of the per-epoch shuffles
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Train on only the first N training images (for quick runs)
    #[arg(long, value_name = "N")]
    pub train_limit: Option<usize>,
    /// Hold out this fraction of the training images (the last ones) as a validation set, measured after
    /// every epoch; it is what --keep best chooses by
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub val_split: Option<f64>,
    /// Which epoch the model file holds. `best` (lowest validation loss) needs --val-split: choosing by
    /// the test set would make its figures optimistic
    #[arg(long, value_enum, default_value_t = Keep::Last)]
    pub keep: Keep,
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Where to write the trained model
    #[arg(long, value_name = "PATH", default_value = "mnist.safetensors")]
    pub out: PathBuf,
    /// No progress bar and no notes
    #[arg(long)]
    pub quiet: bool,
    /// Print one JSON object with per-epoch metrics and the confusion matrix at the end
    #[arg(long)]
    pub json: bool,
}

/// The optimizer settings from the flags, checked.
fn optim_config(args: &MnistArgs) -> Result<OptimConfig> {
    let mut config = OptimConfig::new(args.optim);
    if let Some(lr) = args.lr {
        config.lr = lr;
    }
    if let Some(momentum) = args.momentum {
        if args.optim != OptimKind::Momentum {
            bail!("--momentum applies to --optim momentum only (this run uses --optim {})", args.optim.name());
        }
        config.momentum = momentum;
    }
    config.weight_decay = args.weight_decay;
    config.clip_norm = args.clip_norm;
    config.validate()?;
    Ok(config)
}

fn check_args(args: &MnistArgs) -> Result<()> {
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    crate::resources::check_epochs(args.epochs)?;
    if args.train_limit == Some(0) {
        bail!("--train-limit must be at least 1");
    }
    if args.out.as_os_str().is_empty() || args.out.is_dir() {
        bail!("--out {:?} must name a file", args.out);
    }
    if let Some(f) = args.val_split {
        if !(f > 0.0 && f < 1.0) {
            bail!("--val-split must be a fraction between 0 and 1 (exclusive), got {f}");
        }
    }
    if args.keep == Keep::Best && args.val_split.is_none() {
        bail!("--keep best needs --val-split F: choosing the epoch by the test set would leak it into the model");
    }
    Ok(())
}

/// Where human-readable lines go: stdout, or stderr when stdout carries JSON. Write errors (a closed
/// pipe) are ignored so that training still finishes and saves the model.
struct Human {
    to_stderr: bool,
    results: bool,
    notes: bool,
}

impl Human {
    fn print(&self, text: &str) {
        console::line(self.to_stderr, text);
    }

    fn result(&self, text: &str) {
        if self.results {
            self.print(text);
        }
    }

    fn note(&self, text: &str) {
        if self.notes {
            self.print(text);
        }
    }
}

/// Per-epoch lines and the progress bar; the validation and the save after each epoch.
struct Display<'a> {
    human: &'a Human,
    epochs: usize,
    show_bar: bool,
    bar: Option<ProgressBar>,
    saver: Saver<'a>,
}

/// Writes the epochs that `keeper` keeps to `out`, judged by their validation loss (with --val-split),
/// else by their test loss, which only `--keep last` (every epoch) uses.
struct Saver<'a> {
    out: &'a Path,
    dataset: Dataset,
    keeper: Keeper,
    val: Option<&'a Split>,
    /// Validation loss and accuracy of each epoch, with --val-split.
    val_history: Vec<(f64, f64)>,
    /// The test evaluation of the epoch the file holds.
    kept_eval: Option<Evaluation>,
    note: &'static str,
}

impl Saver<'_> {
    fn offer(&mut self, stats: &EpochStats, eval: &Evaluation, params: &MlpParams) -> Result<()> {
        let loss = match self.val {
            Some(val) => {
                let v = evaluate_split(params, val);
                self.val_history.push((v.mean_loss(), v.accuracy()));
                v.mean_loss()
            }
            None => eval.mean_loss(),
        };
        self.note = if self.keeper.offer(stats.epoch, loss) {
            fsutil::write_atomic(self.out, &params.to_safetensors(&[("dataset", self.dataset.name())])?)?;
            self.kept_eval = Some(eval.clone());
            "saved"
        } else {
            "not saved"
        };
        Ok(())
    }

    fn loss_name(&self) -> &'static str {
        if self.val.is_some() { "val loss" } else { "test loss" }
    }
}

impl Observer for Display<'_> {
    fn epoch_start(&mut self, epoch: usize, samples: usize) {
        if self.show_bar {
            let bar = ProgressBar::with_draw_target(Some(samples as u64), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{prefix} [{bar:40}] {human_pos}/{human_len} images, eta {eta}")
                .map(|s| s.progress_chars("=> "))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_prefix(format!("epoch {epoch}/{}", self.epochs));
            self.bar = Some(bar);
        }
    }

    fn progress(&mut self, done: usize) {
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
        }
    }

    fn epoch_completed(&mut self, stats: &EpochStats, eval: &Evaluation, params: &MlpParams) -> Result<bool> {
        self.saver.offer(stats, eval, params)?;
        Ok(!interrupt::requested())
    }

    fn epoch_end(&mut self, s: &EpochStats, _eval: &Evaluation) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let width = self.epochs.to_string().len();
        let val = match (self.saver.val, self.saver.val_history.last()) {
            (Some(_), Some((loss, accuracy))) => {
                format!("  val loss {loss:.4}  val acc {:.2}%  {}", 100.0 * accuracy, self.saver.note)
            }
            _ => String::new(),
        };
        self.human.result(&format!(
            "epoch {:>width$}/{}  train loss {:.4}  test loss {:.4}  test acc {:.2}%  {:.0} samples/s  {:.1}s{val}",
            s.epoch,
            self.epochs,
            s.train_loss,
            s.test_loss,
            100.0 * s.test_accuracy,
            s.samples_per_sec,
            s.elapsed_s
        ));
    }
}

/// The confusion matrix as text: a header of predicted classes, one row per true class with its recall.
fn confusion_table(eval: &Evaluation, names: &[&str]) -> String {
    let c = eval.classes;
    let label = |k: usize| if names[k] == k.to_string() { k.to_string() } else { format!("{k} {}", names[k]) };
    let label_width = (0..c).map(|k| label(k).chars().count()).max().unwrap_or(1);
    let mut out = format!(
        "confusion matrix, {} test images (rows: true class, columns: predicted), accuracy {:.2}%\n{:label_width$}",
        eval.samples,
        100.0 * eval.accuracy(),
        ""
    );
    for k in 0..c {
        out += &format!(" {k:>6}");
    }
    out += "  recall";
    for (k, row) in eval.confusion_rows().iter().enumerate() {
        out += &format!("\n{:<label_width$}", label(k));
        for n in row {
            out += &format!(" {n:>6}");
        }
        let total: u64 = row.iter().sum();
        out += &format!("  {:>5.1}%", 100.0 * row[k] as f64 / total.max(1) as f64);
    }
    out
}

/// An epoch's figures in the `--json` report.
#[derive(Serialize)]
struct EpochReport {
    #[serde(flatten)]
    stats: EpochStats,
    #[serde(skip_serializing_if = "Option::is_none")]
    val_loss: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    val_accuracy: Option<f64>,
}

#[derive(Serialize)]
struct Report<'a> {
    /// "ok", "interrupted" or "not_better".
    status: &'a str,
    dataset: &'a str,
    data_dir: String,
    device: String,
    train_samples: usize,
    val_samples: usize,
    test_samples: usize,
    inputs: usize,
    hidden: usize,
    classes: usize,
    activation: &'a str,
    optimizer: &'a str,
    lr: f32,
    momentum: Option<f32>,
    weight_decay: f32,
    clip_norm: f32,
    batch: usize,
    seed: u64,
    keep: &'a str,
    epochs: Vec<EpochReport>,
    /// The epoch the model file holds; the test figures below are that epoch's.
    kept_epoch: Option<usize>,
    test_loss: f64,
    test_accuracy: f64,
    class_names: [&'a str; 10],
    /// Rows: true class; columns: predicted class.
    confusion: Vec<Vec<u64>>,
    model: String,
}

pub fn run(args: MnistArgs) -> Result<()> {
    check_args(&args)?;
    let optim = optim_config(&args)?;
    let shape =
        MlpShape { inputs: idx::PIXELS, hidden: args.hidden, classes: idx::CLASSES, activation: args.activation };
    shape.validate()?;
    let human = Human { to_stderr: args.json, results: !(args.json && args.quiet), notes: !args.quiet };

    let backend = device::select(args.device, args.quiet)?;
    let mut data = data::load(args.dataset, args.data.as_deref(), &|note| human.note(note))?;
    let inputs: Vec<PathBuf> =
        data::FILES.iter().flat_map(|f| [data.dir.join(f), data.dir.join(format!("{f}.gz"))]).collect();
    let inputs: Vec<(&str, &Path)> = inputs.iter().map(|p| ("data file", p.as_path())).collect();
    fsutil::check_output(&args.out, &inputs)?;
    if shadows_data_file(&args.out, &data.dir) {
        bail!(
            "--out {} would be read as a data file of {}; choose another name",
            args.out.display(),
            data.dir.display()
        );
    }
    let full_train = data.train.len();
    if let Some(limit) = args.train_limit {
        data.train.truncate(limit);
    }
    let val = match args.val_split {
        Some(fraction) => Some(hold_out(&mut data.train, fraction)?),
        None => None,
    };
    let existing = existing_out(&args.out)?;
    let (n_train, n_test) = (data.train.len(), data.test.len());
    let n_val = val.as_ref().map_or(0, Split::len);
    let limited = match (n_train + n_val < full_train, n_val) {
        (false, _) => String::new(),
        (true, 0) => format!(" (first {n_train} of {full_train})"),
        (true, _) => format!(" (of the first {} of {full_train})", n_train + n_val),
    };
    let held_out = if n_val > 0 { format!(", {n_val} held out for validation") } else { String::new() };
    human.note(&format!(
        "{} from {}: {n_train} training images{held_out}{limited}, {n_test} test images",
        args.dataset.title(),
        data.dir.display()
    ));
    human.note(&format!(
        "model {} → {} ({}) → {}, {} parameters; {}; batch {}, {} epoch{}, seed {}; device {}",
        shape.inputs,
        shape.hidden,
        shape.activation.name(),
        shape.classes,
        shape.param_count(),
        optim.describe(),
        args.batch,
        args.epochs,
        if args.epochs == 1 { "" } else { "s" },
        args.seed,
        backend.describe()
    ));

    let baseline = match (&existing, &val) {
        (Some(old), Some(val)) if old.shape.inputs == idx::PIXELS && old.shape.classes == idx::CLASSES => {
            let loss = evaluate_split(old, val).mean_loss();
            human.note(&format!(
                "--out {} already holds a model of val loss {loss:.4}; only a better epoch replaces it",
                args.out.display()
            ));
            Some(loss)
        }
        _ => None,
    };

    let params = MlpParams::init(shape, args.seed);
    let mut trainer = super::trainer(&backend, params, optim, Arc::new(data.train), Arc::new(data.test))?;
    let schedule = Schedule { epochs: args.epochs, batch: args.batch, seed: args.seed };
    let show_bar = !args.quiet && std::io::stderr().is_terminal();
    let saver = Saver {
        out: &args.out,
        dataset: args.dataset,
        keeper: Keeper::new(args.keep, baseline),
        val: val.as_ref(),
        val_history: Vec::new(),
        kept_eval: None,
        note: "",
    };
    let mut display = Display { human: &human, epochs: args.epochs, show_bar, bar: None, saver };
    interrupt::install();
    let result = train::run(trainer.as_mut(), n_train, schedule, &mut display);
    let Display { saver, .. } = display;
    let outcome = saver.keeper.outcome(&args.out, saver.loss_name());
    let (history, _) = result.map_err(|e| anyhow!("{e:#}; {outcome}"))?;
    let interrupted = history.len() < args.epochs;
    let status = match (interrupted, &saver.kept_eval) {
        (true, _) => "interrupted",
        (false, None) => "not_better",
        (false, Some(_)) => "ok",
    };

    let names = args.dataset.class_names();
    if let Some(eval) = &saver.kept_eval {
        human.result(&confusion_table(eval, &names));
    }
    human.note(&outcome);
    if args.json {
        let eval = saver.kept_eval.clone().unwrap_or_else(|| Evaluation::new(shape.classes));
        let epochs = history
            .iter()
            .enumerate()
            .map(|(i, &stats)| {
                let v = saver.val_history.get(i);
                EpochReport { stats, val_loss: v.map(|v| v.0), val_accuracy: v.map(|v| v.1) }
            })
            .collect();
        let report = Report {
            status,
            dataset: args.dataset.name(),
            data_dir: data.dir.display().to_string(),
            device: backend.describe(),
            train_samples: n_train,
            val_samples: n_val,
            test_samples: n_test,
            inputs: shape.inputs,
            hidden: shape.hidden,
            classes: shape.classes,
            activation: shape.activation.name(),
            optimizer: optim.kind.name(),
            lr: optim.lr,
            momentum: (optim.kind == OptimKind::Momentum).then_some(optim.momentum),
            weight_decay: optim.weight_decay,
            clip_norm: optim.clip_norm,
            batch: args.batch,
            seed: args.seed,
            keep: args.keep.name(),
            epochs,
            kept_epoch: saver.keeper.kept_epoch(),
            test_loss: eval.mean_loss(),
            test_accuracy: eval.accuracy(),
            class_names: names,
            confusion: eval.confusion_rows(),
            model: args.out.display().to_string(),
        };
        console::out(&serde_json::to_string(&report)?);
    }
    if interrupted {
        return Err(
            Interrupted(format!("interrupted after epoch {} of {}; {outcome}", history.len(), args.epochs)).into()
        );
    }
    if saver.kept_eval.is_none() {
        bail!("{outcome}");
    }
    Ok(())
}

/// Whether `out` is one of the names the data files are looked up under in `data_dir`.
fn shadows_data_file(out: &Path, data_dir: &Path) -> bool {
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    fsutil::same_file(dir, data_dir) && data::FILES.iter().any(|f| *name == **f || *name == format!("{f}.gz"))
}

/// Moves the last `fraction` of `train` (at least one image, leaving at least one) into a validation split.
fn hold_out(train: &mut Split, fraction: f64) -> Result<Split> {
    let n = train.len();
    let n_val = ((n as f64 * fraction).ceil() as usize).max(1);
    if n_val >= n {
        bail!("--val-split {fraction} of {n} training images leaves none to train on");
    }
    let keep = n - n_val;
    let val = Split {
        images: train.images[keep * train.pixels..].to_vec(),
        labels: train.labels[keep..].to_vec(),
        pixels: train.pixels,
    };
    train.truncate(keep);
    Ok(val)
}

/// The model already at `out`: `None` when there is no file or an empty one. Anything there that is not
/// an MNIST model is refused rather than overwritten.
fn existing_out(out: &Path) -> Result<Option<MlpParams>> {
    let Ok(meta) = std::fs::metadata(out) else { return Ok(None) };
    if meta.len() == 0 {
        return Ok(None);
    }
    let parsed = std::fs::read(out).map_err(anyhow::Error::from).and_then(|bytes| MlpParams::from_safetensors(&bytes));
    match parsed {
        Ok((params, _)) => Ok(Some(params)),
        Err(e) => bail!(
            "--out {} exists and is not a textnet MNIST model, so it is not replaced (remove it or choose another \
             --out): {e:#}",
            out.display()
        ),
    }
}
