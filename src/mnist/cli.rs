//! `textnet mnist`: train the classifier on MNIST or Fashion-MNIST, report test loss and accuracy after
//! every epoch and a confusion matrix at the end, and write the model as .safetensors.
//!
//! Output: human lines on stdout; with `--json` one JSON object on stdout and the human lines on
//! stderr. `--quiet` drops the progress bar and the notes (device, data, model file), keeping the
//! per-epoch lines and the confusion matrix, or with `--json` everything but the JSON.

use super::data::{self, Dataset};
use super::model::{Activation, MlpParams, MlpShape};
use super::optim::{OptimConfig, OptimKind};
use super::train::{self, EpochStats, Observer, Schedule};
use super::{Evaluation, idx};
use crate::device::{self, DeviceChoice};
use anyhow::{Result, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
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
        let _ =
            if self.to_stderr { writeln!(std::io::stderr(), "{text}") } else { writeln!(std::io::stdout(), "{text}") };
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

/// Per-epoch lines and the progress bar.
struct Display<'a> {
    human: &'a Human,
    epochs: usize,
    show_bar: bool,
    bar: Option<ProgressBar>,
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

    fn epoch_end(&mut self, s: &EpochStats, _eval: &Evaluation) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let width = self.epochs.to_string().len();
        self.human.result(&format!(
            "epoch {:>width$}/{}  train loss {:.4}  test loss {:.4}  test acc {:.2}%  {:.0} samples/s  {:.1}s",
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

#[derive(Serialize)]
struct Report<'a> {
    dataset: &'a str,
    data_dir: String,
    device: String,
    train_samples: usize,
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
    epochs: &'a [EpochStats],
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
    let full_train = data.train.len();
    if let Some(limit) = args.train_limit {
        data.train.truncate(limit);
    }
    let (n_train, n_test) = (data.train.len(), data.test.len());
    let limited = if n_train < full_train { format!(" (first {n_train} of {full_train})") } else { String::new() };
    human.note(&format!(
        "{} from {}: {n_train} training images{limited}, {n_test} test images",
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

    let params = MlpParams::init(shape, args.seed);
    let mut trainer = super::trainer(&backend, params, optim, Arc::new(data.train), Arc::new(data.test))?;
    let schedule = Schedule { epochs: args.epochs, batch: args.batch, seed: args.seed };
    let show_bar = !args.quiet && std::io::stderr().is_terminal();
    let mut display = Display { human: &human, epochs: args.epochs, show_bar, bar: None };
    let (history, eval) = train::run(trainer.as_mut(), n_train, schedule, &mut display)?;

    let params = trainer.params()?;
    if !params.all_finite() {
        bail!("training produced non-finite parameters; lower --lr or set --clip-norm");
    }
    let bytes = params.to_safetensors(&[("dataset", args.dataset.name())])?;
    crate::fsutil::write_atomic(&args.out, &bytes)?;

    let names = args.dataset.class_names();
    human.result(&confusion_table(&eval, &names));
    human.note(&format!("model written to {}", args.out.display()));
    if args.json {
        let report = Report {
            dataset: args.dataset.name(),
            data_dir: data.dir.display().to_string(),
            device: backend.describe(),
            train_samples: n_train,
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
            epochs: &history,
            test_loss: eval.mean_loss(),
            test_accuracy: eval.accuracy(),
            class_names: names,
            confusion: eval.confusion_rows(),
            model: args.out.display().to_string(),
        };
        let mut stdout = std::io::stdout().lock();
        serde_json::to_writer(&mut stdout, &report)?;
        writeln!(stdout)?;
    }
    Ok(())
}
