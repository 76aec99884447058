//! `textnet mnist`: train the classifier on MNIST or Fashion-MNIST, report test loss and accuracy after
//! every epoch and a confusion matrix at the end, and write the model as .safetensors. What it prints
//! goes through `report`, as for every training command.

use super::args::MnistArgs;
use super::cnn::{CnnParams, CnnShape};
use super::epochs::{Epochs, Saver, at_chance};
use super::idx::Split;
use super::model::{MlpParams, MlpShape};
use super::setup::{baseline, device_and_data, existing, hold_out, lock_out, resumed_model};
use super::train::{self, EpochStats, Schedule};
use super::{Classifier, Evaluation, ModelKind, idx};
use crate::device;
use crate::harness::checkpoint::Keeper;
use crate::harness::report::{self, Display, Divergence};
use crate::harness::run::{self, Ending, TrainingCommand};
use crate::io::fsutil;
use crate::ops::optim::{LrSchedule, OptimConfig, OptimKind};
use anyhow::{Result, bail};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

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
pub struct RunInfo {
    _lock: fsutil::OutputLock,
    pub(super) backend: device::Backend,
    pub(super) optim: OptimConfig,
    pub(super) lr_schedule: LrSchedule,
    pub(super) shape: MlpShape,
    pub(super) data_dir: PathBuf,
    pub(super) n_train: usize,
    pub(super) n_val: usize,
    pub(super) n_test: usize,
    /// The one label of every training image, if they all have the same.
    pub(super) one_class: Option<u8>,
    pub(super) started: std::time::Instant,
    /// When opening the device and reading the data (side by side) ended, counted from `started`.
    pub(super) device_s: f64,
    pub(super) data_s: f64,
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
        args.check()?;
        let optim = args.optim.config()?;
        let lr_schedule = args.schedule.schedule(optim.lr)?;
        let shape =
            MlpShape { inputs: idx::PIXELS, hidden: args.hidden, classes: idx::CLASSES, activation: args.activation };
        shape.validate()?;
        let resumed = resumed_model(args, shape)?;
        let display = Display::new(args.run.quiet, args.run.json, args.epochs)
            .log_every(args.log_every)
            .tensorboard(args.run.tensorboard.as_deref())?;
        let started = Instant::now();
        let (backend, device_line, mut data, device_s, data_s) = device_and_data(args, &display, started)?;
        let lock = lock_out(args, &data.dir)?;
        let full_train = data.train.len();
        if let Some(limit) = args.train_limit {
            data.train.truncate(limit);
        }
        let val = args.val_split.map(|fraction| hold_out(&mut data.train, fraction)).transpose()?;
        let existing = existing(args)?;
        let (n_train, n_test) = (data.train.len(), data.test.len());
        lr_schedule.check(n_train.div_ceil(args.batch) * args.epochs)?;
        let n_val = val.as_ref().map_or(0, Split::len);
        args.describe_data(&data.dir, (n_train, n_val, n_test), full_train, &display);
        let params = match (resumed, args.model) {
            (Some(model), _) => model,
            (None, ModelKind::Mlp) => Classifier::Mlp(MlpParams::init(shape, args.run.seed)),
            (None, ModelKind::Cnn) => Classifier::Cnn(CnnParams::init(CnnShape::MNIST, args.run.seed)),
        };
        display.line(&args.model_line(&params, shape, &optim, &lr_schedule, &device_line));
        if let Some(path) = &args.resume {
            display.line(&format!("resuming: {} (its parameters; a fresh optimizer state)", path.display()));
        }
        let judged = match &val {
            Some(val) => (val, "val loss"),
            None => (&data.test, "test loss"),
        };
        let baseline = baseline(args, existing.as_ref(), &params, judged, &display)?;
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
        let last_accuracy = rows.last().and_then(|r| r.test_accuracy);
        let at_chance = last_accuracy.filter(|&a| {
            saver.kept_eval.is_none() && diverged.is_none() && !interrupted && at_chance(a, run.shape.classes)
        });
        // A run that wrote nothing says so in its error line.
        if let Some(eval) = saver.kept_eval.as_ref().filter(|_| diverged.is_none()) {
            display.line(&eval.confusion_table(&args.dataset.class_names(), "test images"));
            display.line(&outcome);
        }
        let failed = at_chance.map(|accuracy| not_learned(&run, accuracy, &outcome));
        let optim = &run.optim;
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
                &plot_title(args, optim),
                &rows,
                &display,
            ),
        };
        if args.run.json || args.run.tensorboard.is_some() {
            let mut report = args.report(&run, ending.status(), rows, &saver, params_count, (setup_s, training_s));
            report.diverged = ending.diverged.clone();
            ending.report = Some(report);
        }
        Ok(ending)
    }
}

impl MnistArgs {
    /// The line that says what the run trains on: `n_train` images (of the first `full_train`) and
    /// `n_val` held out.
    fn describe_data(
        &self,
        dir: &Path,
        (n_train, n_val, n_test): (usize, usize, usize),
        full_train: usize,
        display: &Display,
    ) {
        let args = self;
        let limited = match (n_train + n_val < full_train, n_val) {
            (false, _) => String::new(),
            (true, 0) => format!(" (first {n_train} of {full_train})"),
            (true, _) => format!(" (of the first {} of {full_train})", n_train + n_val),
        };
        let held_out = if n_val > 0 { format!(", {n_val} held out for validation") } else { String::new() };
        display.line(&format!(
            "{} from {}: {} training images{held_out}{limited}, {} test images",
            args.dataset.title(),
            dir.display(),
            report::count(n_train),
            report::count(n_test)
        ));
    }

    /// The line that says what the run trains and how.
    fn model_line(
        &self,
        params: &Classifier,
        shape: MlpShape,
        optim: &OptimConfig,
        lr_schedule: &LrSchedule,
        device_line: &str,
    ) -> String {
        let args = self;
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
        format!(
            "model {architecture}, {} parameters; {}{schedule_text}; batch {}, {} epoch{}, seed {}; device {}",
            report::count(params.param_count()),
            optim.describe(),
            args.batch,
            args.epochs,
            if args.epochs == 1 { "" } else { "s" },
            args.run.seed,
            device_line
        )
    }
}

/// The error line of a run whose last test `accuracy` is at chance level, with what to try.
fn not_learned(run: &RunInfo, accuracy: f64, outcome: &str) -> String {
    let optim = &run.optim;
    let too_few = run::too_few(run.n_train, "image", "--train-limit, --val-split");
    let advice = match (run.one_class, too_few) {
        (_, Some(too_few)) => too_few,
        (Some(label), None) => format!("every training image is labelled {label}, so there is nothing to tell apart"),
        _ if optim.kind == OptimKind::Adam => format!("lower --lr (this run used {})", report::decimal(optim.lr)),
        _ => format!("lower --lr (this run used {}) or try --optim adam", report::decimal(optim.lr)),
    };
    let chance = 1.0 / run.shape.classes as f64;
    let finding = format!("test accuracy {:.1}% where guessing gets {:.1}%", 100.0 * accuracy, 100.0 * chance);
    run::not_learned(&finding, outcome, &advice)
}

/// The title of the `--plot` picture.
fn plot_title(args: &MnistArgs, optim: &OptimConfig) -> String {
    let model = match args.model {
        ModelKind::Mlp => format!("MLP 784 → {} ({}) → 10", args.hidden, args.activation.name()),
        ModelKind::Cnn => "CNN".to_string(),
    };
    format!("textnet mnist on {}: {model}; {}, batch {}", args.dataset.title(), optim.describe(), args.batch)
}
