//! `textnet mnist`: train the classifier on MNIST or Fashion-MNIST, report test loss and accuracy after
//! every epoch and a confusion matrix at the end, and write the model as .safetensors. What it prints
//! goes through `report`, as for every training command.

use super::cnn::{CnnParams, CnnShape};
use super::idx::Split;
use super::model::{Activation, MlpParams, MlpShape};
use super::train::{self, EpochStats, Observer, Schedule};
use super::{Classifier, ModelKind};
use super::{Evaluation, idx};
use crate::datasets::mnist::{self, Dataset};
use crate::device;
use crate::harness::args::{OptimArgs, RunArgs, ScheduleArgs, run_out};
use crate::harness::checkpoint::{self, Keep, Keeper};
use crate::harness::interrupt;
use crate::harness::report::{self, Display, Divergence, EpochRow, Report};
use crate::harness::run::{self, Ending, TrainingCommand};
use crate::io::fsutil;
use crate::ops::optim::{LrSchedule, OptimConfig, OptimKind};
use anyhow::{Result, bail};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "Data: --data DIR, else searched in $TEXTNET_DATA (MNIST), $TEXTNET_DATA/<mnist|fashion-mnist>, \
./data/<mnist|fashion-mnist>, the textnet cache dir and, for Fashion-MNIST, /usr/share/datasets/fashion-mnist \
(Debian package dataset-fashion-mnist); MNIST missing everywhere is downloaded into the cache \
(HTTPS, checked against the published SHA-256 sums).",
    mut_arg("out", |a| run_out(
        "mnist.safetensors",
        "Where to write the model (.safetensors; mnist-cnn.safetensors for --model cnn); it is written after every \
epoch that --keep keeps"
    )(a)
    .default_value_if("model", "cnn", "mnist-cnn.safetensors"))
)]
/// The flags of `textnet mnist`.
pub struct MnistArgs {
    /// Which dataset
    #[arg(long, value_enum, default_value_t = Dataset::Mnist)]
    pub dataset: Dataset,
    /// Directory holding train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
    /// t10k-labels-idx1-ubyte, each raw or .gz
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// The classifier: an MLP (784 → --hidden → 10), or the CNN (conv3x3 1→8, ReLU, maxpool 2, conv3x3
    /// 8→16, ReLU, maxpool 2, 784 → 64 ReLU → 10; --hidden and --activation apply to the MLP)
    #[arg(long, value_enum, default_value_t = ModelKind::Mlp)]
    pub model: ModelKind,
    /// Hidden units (MLP)
    #[arg(long, default_value_t = 128)]
    pub hidden: usize,
    /// Hidden-layer activation (MLP)
    #[arg(long, value_enum, default_value_t = Activation::Relu)]
    pub activation: Activation,
    #[command(flatten)]
    /// The optimizer flags (`--optim`, `--lr`, ...).
    pub optim: OptimArgs,
    #[command(flatten)]
    /// The learning-rate schedule (`--lr-schedule`, `--warmup`, `--min-lr`).
    pub schedule: ScheduleArgs,
    /// Samples per optimizer step (the loss is the batch mean)
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Passes over the training samples
    #[arg(short = 'e', long, default_value_t = 10)]
    pub epochs: usize,
    #[command(flatten)]
    /// The run flags (`--out`, `--seed`, `--device`, `--json`, ...).
    pub run: RunArgs,
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
    /// Go on training this model file (a fresh optimizer state); only an epoch better than it is saved. It
    /// must be of this run's --dataset, --model, --hidden and --activation (the file at --out may be it)
    #[arg(long, value_name = "MODEL")]
    pub resume: Option<PathBuf>,
    /// Print an epoch's line only every N epochs (and the first and last), for long runs
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub log_every: usize,
}

/// The optimizer settings from the flags, checked.
fn optim_config(args: &MnistArgs) -> Result<OptimConfig> {
    args.optim.config()
}

fn check_args(args: &MnistArgs) -> Result<()> {
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    crate::io::resources::check_epochs(args.epochs)?;
    if args.train_limit == Some(0) {
        bail!("--train-limit must be at least 1");
    }
    if args.run.out.as_os_str().is_empty() || args.run.out.is_dir() {
        bail!("--out \"{}\" must name a file", args.run.out.display());
    }
    if let Some(f) = args.val_split
        && !(f > 0.0 && f < 1.0)
    {
        bail!("--val-split must be a fraction between 0 and 1 (exclusive), got {f}");
    }
    if args.keep == Keep::Best && args.val_split.is_none() {
        bail!("--keep best needs --val-split F: choosing the epoch by the test set would leak it into the model");
    }
    Ok(())
}

/// The progress display and the per-epoch lines, the rows of the report; the validation and the save
/// after each epoch.
struct Epochs {
    display: Display,
    rows: Vec<EpochRow>,
    saver: Saver,
}

/// Writes the epochs that `keeper` keeps to `out`, judged by their validation loss (with --val-split),
/// else by their test loss, which only `--keep last` (every epoch) uses. An epoch at chance level is
/// never written.
struct Saver {
    out: PathBuf,
    dataset: Dataset,
    keeper: Keeper,
    val: Option<Split>,
    /// Validation loss and accuracy of each epoch, with --val-split.
    val_history: Vec<(f64, f64)>,
    /// The test evaluation of the epoch the file holds.
    kept_eval: Option<Evaluation>,
    note: String,
}

impl Saver {
    fn offer(&mut self, stats: &EpochStats, eval: &Evaluation, params: &Classifier) -> Result<()> {
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

    fn loss_name(&self) -> &'static str {
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
fn at_chance(accuracy: f64, classes: usize) -> bool {
    accuracy <= 1.5 / classes as f64
}

/// Runs `textnet mnist`.
pub fn run(args: MnistArgs) -> Result<()> {
    run::run(&args)
}

/// What `setup` read, checked and built.
pub struct Setup {
    run: RunInfo,
    display: Display,
    params: Classifier,
    train: Split,
    test: Split,
    /// The images held out for validation (--val-split).
    val: Option<Split>,
    /// The loss of the model already at --out, on the data each epoch is judged by.
    baseline: Option<f64>,
}

/// What a run's end reports about its setup.
struct RunInfo {
    _lock: fsutil::OutputLock,
    backend: device::Backend,
    optim: OptimConfig,
    lr_schedule: LrSchedule,
    shape: MlpShape,
    data_dir: PathBuf,
    n_train: usize,
    n_val: usize,
    n_test: usize,
    /// The one label of every training image, if they all have the same.
    one_class: Option<u8>,
    started: std::time::Instant,
    /// When opening the device and reading the data (side by side) ended, counted from `started`.
    device_s: f64,
    data_s: f64,
}

/// What `train` hands to `finish`.
pub struct Trained {
    run: RunInfo,
    epochs: Epochs,
    result: Result<(Vec<EpochStats>, Evaluation)>,
    params_count: usize,
    setup_s: f64,
    training_s: f64,
}

impl TrainingCommand for MnistArgs {
    type Setup = Setup;
    type Trained = Trained;

    fn setup(&self) -> Result<Setup> {
        let args = self;
        check_args(args)?;
        let optim = optim_config(args)?;
        let lr_schedule = args.schedule.schedule(optim.lr)?;
        let shape =
            MlpShape { inputs: idx::PIXELS, hidden: args.hidden, classes: idx::CLASSES, activation: args.activation };
        shape.validate()?;
        let resumed = resumed_model(args, shape)?;
        let display = Display::new(args.run.quiet, args.run.json, args.epochs)
            .log_every(args.log_every)
            .tensorboard(args.run.tensorboard.as_deref())?;

        let started = std::time::Instant::now();
        // Opening the GPU (a CUDA context: ~0.5 s) and decoding the data files (~0.3 s) overlap.
        let (device, data, device_s, data_s) = std::thread::scope(|scope| {
            let reading = scope.spawn(|| {
                let data = mnist::load(args.dataset, args.data.as_deref(), &|note| display.line(note));
                (data, started.elapsed().as_secs_f64())
            });
            let device = device::select_described(args.run.device);
            let device_s = started.elapsed().as_secs_f64();
            let (data, data_s) =
                reading.join().unwrap_or_else(|_| (Err(anyhow::anyhow!("reading the data failed")), 0.0));
            (device, data, device_s, data_s)
        });
        let (backend, device_line) = device?;
        let mut data = data?;
        let inputs: Vec<PathBuf> =
            mnist::FILES.iter().flat_map(|f| [data.dir.join(f), data.dir.join(format!("{f}.gz"))]).collect();
        let inputs: Vec<(&str, &Path)> = inputs.iter().map(|p| ("data file", p.as_path())).collect();
        let lock = fsutil::check_output(&args.run.out, &inputs)?;
        let mut inputs = inputs;
        inputs.extend(args.resume.as_deref().map(|m| ("--resume model", m)));
        crate::harness::plot::check(args.run.plot.as_deref(), Some(&args.run.out), &inputs)?;
        if shadows_data_file(&args.run.out, &data.dir) {
            bail!(
                "--out {} would be read as a data file of {}; choose another name",
                args.run.out.display(),
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
        let existing = match &args.resume {
            Some(resume) if fsutil::same_file(resume, &args.run.out) => None,
            _ => existing_out(&args.run.out)?,
        };
        if let Some((_, meta)) = &existing
            && !args.run.overwrite
            && meta.get("dataset").is_some_and(|d| d != args.dataset.name())
        {
            let what =
                format!("an MNIST model of another dataset ({})", meta.get("dataset").map_or("", String::as_str));
            return Err(checkpoint::other_data(&args.run.out, &what));
        }
        let existing = existing.map(|(old, _)| old).filter(|_| !args.run.overwrite);
        if let Some(old) = &existing
            && old.kind() != args.model
        {
            bail!(
                "--out {} holds an MNIST {} model and this run trains the {}; choose another --out",
                args.run.out.display(),
                report::flag_value(&old.kind()).to_uppercase(),
                report::flag_value(&args.model).to_uppercase()
            );
        }
        let (n_train, n_test) = (data.train.len(), data.test.len());
        lr_schedule.check(n_train.div_ceil(args.batch) * args.epochs)?;
        let n_val = val.as_ref().map_or(0, Split::len);
        let limited = match (n_train + n_val < full_train, n_val) {
            (false, _) => String::new(),
            (true, 0) => format!(" (first {n_train} of {full_train})"),
            (true, _) => format!(" (of the first {} of {full_train})", n_train + n_val),
        };
        let held_out = if n_val > 0 { format!(", {n_val} held out for validation") } else { String::new() };
        display.line(&format!(
            "{} from {}: {} training images{held_out}{limited}, {} test images",
            args.dataset.title(),
            data.dir.display(),
            report::count(n_train),
            report::count(n_test)
        ));
        let params = match (resumed, args.model) {
            (Some(model), _) => model,
            (None, ModelKind::Mlp) => Classifier::Mlp(MlpParams::init(shape, args.run.seed)),
            (None, ModelKind::Cnn) => Classifier::Cnn(CnnParams::init(CnnShape::MNIST, args.run.seed)),
        };
        let architecture = match args.model {
            ModelKind::Mlp => {
                format!("{} → {} ({}) → {}", shape.inputs, shape.hidden, shape.activation.name(), shape.classes)
            }
            ModelKind::Cnn => {
                "CNN conv3x3 1→8, ReLU, maxpool 2, conv3x3 8→16, ReLU, maxpool 2, 784 → 64 (ReLU) → 10".into()
            }
        };
        let schedule_text = match lr_schedule.describe() {
            s if s.is_empty() => String::new(),
            s => format!(", {s}"),
        };
        display.line(&format!(
            "model {architecture}, {} parameters; {}{schedule_text}; batch {}, {} epoch{}, seed {}; device {}",
            report::count(params.param_count()),
            optim.describe(),
            args.batch,
            args.epochs,
            if args.epochs == 1 { "" } else { "s" },
            args.run.seed,
            device_line
        ));

        if let Some(path) = &args.resume {
            display.line(&format!("resuming: {} (its parameters; a fresh optimizer state)", path.display()));
        }
        // The model already at --out and the --resume'd one, measured on the data each epoch is judged by:
        // the validation split, else the test set. An epoch is saved only when it beats both.
        let (judged_by, loss_name) = match &val {
            Some(val) => (val, "val loss"),
            None => (&data.test, "test loss"),
        };
        let mut baseline = match &existing {
            Some(old) if old.fits_mnist() => {
                let loss = checkpoint::baseline(&args.run.out, old.evaluate(judged_by)?.mean_loss(), loss_name)?;
                display.line(&format!(
                    "--out {} already holds a model of {loss_name} {loss:.4}; only a better epoch replaces it",
                    args.run.out.display()
                ));
                Some(loss)
            }
            _ => None,
        };
        if let Some(path) = &args.resume {
            let loss = params.evaluate(judged_by)?.mean_loss();
            if !loss.is_finite() {
                bail!(
                    "--resume {}: the model's outputs on this data are not finite ({loss_name} {loss}), so it cannot be \
                     trained further; train a new model instead",
                    path.display()
                );
            }
            display.line(&format!("{} has {loss_name} {loss:.4}; only a better epoch is saved", path.display()));
            baseline = Some(baseline.map_or(loss, |b| b.min(loss)));
        }
        let one_class =
            data.train.labels.first().filter(|&&first| data.train.labels.iter().all(|&l| l == first)).copied();
        let run = RunInfo {
            _lock: lock,
            backend,
            optim,
            lr_schedule,
            shape,
            data_dir: data.dir,
            n_train,
            n_val,
            n_test,
            one_class,
            started,
            device_s,
            data_s,
        };
        Ok(Setup { run, display, params, train: data.train, test: data.test, val, baseline })
    }

    fn train(&self, setup: Setup) -> Result<Trained> {
        let args = self;
        let Setup { run, display, params, train, test, val, baseline } = setup;
        let params_count = params.param_count();
        let mut trainer = super::trainer(&run.backend, params, run.optim, Arc::new(train), Arc::new(test), args.batch)?;
        let schedule = Schedule {
            epochs: args.epochs,
            batch: args.batch,
            seed: args.run.seed,
            lr: run.optim.lr,
            lr_schedule: run.lr_schedule,
        };
        let saver = Saver {
            out: args.run.out.clone(),
            dataset: args.dataset,
            keeper: Keeper::new(args.keep, baseline),
            val,
            val_history: Vec::new(),
            kept_eval: None,
            note: String::new(),
        };
        let mut epochs = Epochs { display, rows: Vec::new(), saver };
        let setup_s = run.started.elapsed().as_secs_f64() - run.device_s.max(run.data_s);
        let training = std::time::Instant::now();
        let result = train::run(trainer.as_mut(), run.n_train, schedule, &mut epochs);
        let training_s = training.elapsed().as_secs_f64();
        Ok(Trained { run, epochs, result, params_count, setup_s, training_s })
    }

    fn finish(&self, trained: Trained) -> Result<Ending> {
        let args = self;
        let Trained { run, epochs, result, params_count, setup_s, training_s } = trained;
        let RunInfo {
            backend,
            optim,
            shape,
            data_dir,
            n_train,
            n_val,
            n_test,
            one_class,
            started,
            device_s,
            data_s,
            ..
        } = run;
        let Epochs { mut display, rows, saver } = epochs;
        let outcome = saver.keeper.outcome(&args.run.out, saver.loss_name());
        let diverged = match result.map(drop).map_err(anyhow::Error::downcast::<Divergence>) {
            Ok(()) => None,
            Err(Ok(divergence)) => Some(divergence),
            Err(Err(e)) => bail!("{e:#}; {outcome}"),
        };
        let completed = rows.len();
        let interrupted = diverged.is_none() && completed < args.epochs;
        // At chance level: the last epoch's test accuracy within half of chance's 1 / classes of it, so no
        // epoch was written.
        let chance = 1.0 / shape.classes as f64;
        let last_accuracy = rows.last().and_then(|r| r.test_accuracy);
        let at_chance = last_accuracy.filter(|&a| {
            saver.kept_eval.is_none() && diverged.is_none() && !interrupted && at_chance(a, shape.classes)
        });

        let names = args.dataset.class_names();
        // A run that wrote nothing says so in its error line.
        if let Some(eval) = saver.kept_eval.as_ref().filter(|_| diverged.is_none()) {
            display.line(&eval.confusion_table(&names, "test images"));
            display.line(&outcome);
        }
        let failed = at_chance.map(|accuracy| {
            let too_few = run::too_few(n_train, "image", "--train-limit, --val-split");
            let advice = match (one_class, too_few) {
                (_, Some(too_few)) => too_few,
                (Some(label), None) => {
                    format!("every training image is labelled {label}, so there is nothing to tell apart")
                }
                _ if optim.kind == OptimKind::Adam => {
                    format!("lower --lr (this run used {})", report::decimal(optim.lr))
                }
                _ => format!("lower --lr (this run used {}) or try --optim adam", report::decimal(optim.lr)),
            };
            let finding = format!("test accuracy {:.1}% where guessing gets {:.1}%", 100.0 * accuracy, 100.0 * chance);
            run::not_learned(&finding, &outcome, &advice)
        });
        let decay = match optim.weight_decay > 1.0 {
            true => format!(", or a far lower --weight-decay (this run used {})", report::decimal(optim.weight_decay)),
            false => String::new(),
        };
        let mut ending = Ending {
            report: None,
            json: args.run.json,
            board: display.take_board(),
            diverged,
            interrupted: interrupted.then(|| format!("after epoch {completed} of {}", args.epochs)),
            failed,
            written: saver.kept_eval.is_some(),
            outcome,
            remedy: format!("lower --lr or set --clip-norm (this run used --lr {}){decay}", report::decimal(optim.lr)),
            plot_failed: crate::harness::plot::training_curves(
                args.run.plot.as_deref(),
                &plot_title(args, &optim),
                &rows,
                &display,
            ),
        };
        if args.run.json || args.run.tensorboard.is_some() {
            let confusion = saver.kept_eval.as_ref().map(Evaluation::confusion_rows);
            let mut final_extra = serde_json::Map::new();
            final_extra.insert("confusion".into(), json!(confusion));
            // Where the command's time went: when opening the device and reading the data (side by side)
            // ended, counted from the start; then building the trainer (uploads, kernel modules), and the
            // epochs with their evaluations and saves.
            final_extra.insert(
                "wall_s".into(),
                json!({"device_open": device_s, "data": data_s, "setup": setup_s, "training": training_s, "total": started.elapsed().as_secs_f64()}),
            );
            let config = report::with_flags(
                json!({
                    "dataset": args.dataset.name(),
                    "data": args.data.as_ref().map(|p| p.display().to_string()),
                    "keep": args.keep.name(),
                    "model": report::flag_value(&args.model),
                    "hidden": (args.model == ModelKind::Mlp).then_some(shape.hidden),
                    "activation": (args.model == ModelKind::Mlp).then(|| shape.activation.name()),
                    "epochs": args.epochs,
                    "batch": args.batch,
                    "train_limit": args.train_limit,
                    "val_split": args.val_split,
                    "resume": args.resume.as_ref().map(|p| p.display().to_string()),
                }),
                &[&args.run, &OptimArgs::of(&optim), &args.schedule],
            );
            ending.report = Some(Report {
                textnet: report::VERSION,
                command: "mnist",
                status: ending.status(),
                config,
                device: report::DeviceFields::of(&backend),
                data: json!({
                    "dataset": args.dataset.name(),
                    "dir": data_dir.display().to_string(),
                    "train_samples": n_train,
                    "val_samples": n_val,
                    "test_samples": n_test,
                    "class_names": names,
                }),
                parameters: params_count,
                final_metrics: report::final_metrics(&rows, saver.keeper.kept_epoch(), final_extra),
                epochs: rows,
                model: args.run.out.display().to_string(),
                kept_epoch: saver.keeper.kept_epoch(),
                baseline_val_loss: saver.keeper.baseline,
                diverged: ending.diverged.clone(),
            });
        }
        Ok(ending)
    }
}

/// The title of the `--plot` picture.
fn plot_title(args: &MnistArgs, optim: &OptimConfig) -> String {
    let model = match args.model {
        ModelKind::Mlp => format!("MLP 784 → {} ({}) → 10", args.hidden, args.activation.name()),
        ModelKind::Cnn => "CNN".to_string(),
    };
    format!("textnet mnist on {}: {model}; {}, batch {}", args.dataset.title(), optim.describe(), args.batch)
}

/// Whether `out` is one of the names the data files are looked up under in `data_dir`.
fn shadows_data_file(out: &Path, data_dir: &Path) -> bool {
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    fsutil::same_file(dir, data_dir) && mnist::FILES.iter().any(|f| *name == **f || *name == format!("{f}.gz"))
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

/// The `--resume` model, refused unless it is of this run's dataset, kind and `shape` (the MLP's; the
/// CNN has one).
fn resumed_model(args: &MnistArgs, shape: MlpShape) -> Result<Option<Classifier>> {
    let Some(path) = &args.resume else { return Ok(None) };
    let bytes = fsutil::read_input(path, "model file")?;
    let shown = path.display();
    let (model, meta) = Classifier::from_safetensors(&bytes)
        .map_err(|e| anyhow::anyhow!("--resume {shown} is not a textnet MNIST model file: {e:#}"))?;
    if let Some(name) = meta.get("dataset").filter(|&d| d != args.dataset.name()) {
        let title = <Dataset as clap::ValueEnum>::from_str(name, false).map_or(name.as_str(), |d| d.title());
        bail!(
            "--resume {shown}: a model trained on {title}, and this run trains on {} (give --dataset {name})",
            args.dataset.title()
        );
    }
    if model.kind() != args.model {
        let kind = report::flag_value(&model.kind());
        bail!(
            "--resume {shown}: an MNIST {} model, and this run trains the {} (give --model {kind})",
            kind.to_uppercase(),
            report::flag_value(&args.model).to_uppercase()
        );
    }
    match &model {
        Classifier::Mlp(p) if !model.fits_mnist() => bail!(
            "--resume {shown}: an MLP of {} inputs and {} classes; MNIST images need {} and {}",
            p.shape.inputs,
            p.shape.classes,
            idx::PIXELS,
            idx::CLASSES
        ),
        Classifier::Mlp(p) if p.shape != shape => bail!(
            "--resume {shown}: an MLP of {} hidden units ({}), and this run's has {} ({}) (give --hidden {} \
             --activation {})",
            p.shape.hidden,
            p.shape.activation.name(),
            shape.hidden,
            shape.activation.name(),
            p.shape.hidden,
            p.shape.activation.name()
        ),
        Classifier::Cnn(p) if p.shape != CnnShape::MNIST => bail!(
            "--resume {shown}: a CNN of another shape than the one this command trains ({} channels, then {}; \
             {} hidden units)",
            CnnShape::MNIST.c1,
            CnnShape::MNIST.c2,
            CnnShape::MNIST.fc
        ),
        _ => Ok(Some(model)),
    }
}

/// The MNIST model (MLP or CNN) already at `out`, with its metadata (anything else there is refused).
fn existing_out(out: &Path) -> Result<Option<(Classifier, std::collections::HashMap<String, String>)>> {
    fsutil::existing_model(out, "MNIST", Classifier::from_safetensors)
}
