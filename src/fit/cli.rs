//! `textnet fit --layers SPEC`: train a network written as layers on images (`--dataset`) or a table
//! (`--table --target`), report each epoch as every training command does, and write the model
//! (`modelfile`); `textnet fit --model M --predict FILE` predicts a table's rows with a table model.
//!
//! Every bad input is refused in `setup`, before training: the spec (parse and shapes), a first layer
//! that does not take the data's features, an output layer that does not fit the target, a loss that
//! does not fit it, image layers on a table, and a run too large for host memory.

use super::data::{self, Data, InputSchema, Request, Source, TargetInfo};
use super::modelfile::{self, FitModel};
use crate::datasets::features::{Split, SplitOrder};
use crate::datasets::infer::Overrides;
use crate::datasets::mnist::Dataset;
use crate::datasets::table::{ColumnSpec, HeaderMode, LoadOptions, Table};
use crate::device::{self, Backend};
use crate::harness::args::{OptimArgs, RunArgs, ScheduleArgs, run_out};
use crate::harness::checkpoint::{self, Keep, Keeper};
use crate::harness::report::{self, Display, Divergence, EpochRow, Report};
use crate::harness::run::{self, Ending, EpochHooks, EpochPlan, EpochTrained, TEST, TrainingCommand, VAL, Verdict};
use crate::io::fsutil;
use crate::io::resources::available_memory;
use crate::nn::stack::model::{Init, Loss, Network};
use crate::nn::stack::spec::{self, Layer, Shape};
use crate::nn::stack::{Figures, Samples, Setup as TrainerSetup, StackTrainer, Target};
use crate::ops::cpu::argmax;
use crate::ops::optim::{LrSchedule, OptimConfig};
use anyhow::{Result, anyhow, bail};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args, Debug)]
#[command(
    override_usage = "textnet fit --layers <SPEC> (--dataset <mnist|fashion> | --table <FILE> --target <COLUMN>) [OPTIONS]\n       textnet fit --model <M> --predict <FILE> [--predictions <OUT>]",
    after_help = "Layers (as PyTorch's nn.Sequential; parentheses optional without arguments): Linear(in, out[, bias=false]) \
or Linear(out) (its input width from the data or the layer before), ReLU, Sigmoid, Tanh, GELU, Dropout(p), \
Conv2d(in_channels, out_channels, kernel[, stride, padding]), MaxPool2d(k), Flatten. Images are 784 values, or \
1×28×28 when the spec starts with Conv2d, MaxPool2d or Flatten.",
    mut_arg("out", run_out("fit.safetensors", "Where to write the model (.safetensors); written after every epoch --keep keeps")),
    mut_arg("seed", |a| a.help("Seed of the initial parameters, the table's split, the shuffles and dropout")),
    mut_arg("plot", |a| a.conflicts_with("model")),
    mut_arg("tensorboard", |a| a.conflicts_with("model"))
)]
/// The flags of `textnet fit`.
pub struct FitArgs {
    /// The network, e.g. "Linear(784, 128), ReLU, Linear(128, 10)"
    #[arg(long, value_name = "SPEC", required_unless_present = "model")]
    pub layers: Option<String>,
    /// Train on these images (labels are the classes)
    #[arg(long, value_enum, conflicts_with = "table")]
    pub dataset: Option<Dataset>,
    /// Directory of the --dataset's four IDX files (else searched as `textnet mnist` searches)
    #[arg(long, value_name = "DIR", requires = "dataset")]
    pub data: Option<PathBuf>,
    #[command(flatten)]
    /// The table flags (`--table`, `--target`, the column roles, `--split`).
    pub tabular: TableArgs,
    /// The loss [default: ce for images and for a target column that is not all numbers, mse for a numeric one]
    #[arg(long, value_enum)]
    pub loss: Option<Loss>,
    /// How the weights start
    #[arg(long, value_enum, default_value_t)]
    pub init: Init,
    #[command(flatten)]
    /// The optimizer flags (`--optim`, `--lr`, ...).
    pub optim: OptimArgs,
    #[command(flatten)]
    /// The learning-rate schedule (`--lr-schedule`, `--warmup`, `--min-lr`).
    pub schedule: ScheduleArgs,
    /// Stop when the validation loss has not improved for N epochs; the file keeps the best epoch (needs
    /// --val-split)
    #[arg(long, value_name = "N")]
    pub patience: Option<usize>,
    /// Samples per optimizer step (the loss is the batch mean)
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Passes over the training samples
    #[arg(short = 'e', long, default_value_t = 10)]
    pub epochs: usize,
    #[command(flatten)]
    /// The run flags (`--out`, `--seed`, `--device`, `--json`, ...).
    pub run: RunArgs,
    /// Train on only the first N training samples
    #[arg(long, value_name = "N")]
    pub train_limit: Option<usize>,
    /// Hold out this fraction of the training samples (the last ones) as validation samples, measured
    /// after every epoch; --keep best and --patience choose by them
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub val_split: Option<f64>,
    /// Which epoch the model file holds [default: last; best with --patience]
    #[arg(long, value_enum)]
    pub keep: Option<Keep>,
    /// Predict with this table model file instead of training (with --predict)
    #[arg(short = 'm', long, value_name = "M", requires = "predict", conflicts_with_all = ["layers", "dataset", "table"])]
    pub model: Option<PathBuf>,
    /// The table to predict, laid out as the training table (its target column may be empty or left out)
    #[arg(long, value_name = "FILE", requires = "model")]
    pub predict: Option<PathBuf>,
    /// Where --predict writes its TSV (line, prediction); default stdout
    #[arg(long, value_name = "OUT", requires = "predict")]
    pub predictions: Option<PathBuf>,
    /// Print an epoch's line only every N epochs (and the first and last)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub log_every: usize,
}

/// A table to train on and how its columns are read: the flags `fit` and `bench fit` share.
#[derive(clap::Args, Debug, Clone)]
pub struct TableArgs {
    /// Train on this table (tab- or comma-separated), predicting --target from the other columns
    #[arg(long, value_name = "FILE", requires = "target")]
    pub table: Option<PathBuf>,
    /// The column to predict, by header name or 1-based number: a class label with --loss ce, a number
    /// with --loss mse
    #[arg(long, value_name = "COLUMN", requires = "table")]
    pub target: Option<ColumnSpec>,
    /// Numeric feature columns (comma-separated names or numbers; the other columns' roles are inferred)
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',', requires = "table")]
    pub numeric: Vec<ColumnSpec>,
    /// Categorical feature columns, one-hot over the values seen in training
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',', requires = "table")]
    pub categorical: Vec<ColumnSpec>,
    /// Date columns
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',', requires = "table")]
    pub date: Vec<ColumnSpec>,
    /// Columns to leave out
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',', requires = "table")]
    pub ignore: Vec<ColumnSpec>,
    /// Skip the table's bad rows (and report how many) instead of stopping at the first
    #[arg(long)]
    pub skip_bad_rows: bool,
    /// Share of the table's rows that trains; the rest tests
    #[arg(long, default_value_t = crate::datasets::table::DEFAULT_TRAIN_FRACTION)]
    pub split: f64,
    /// Which of the table's rows train: the first --split of a shuffle seeded by --seed, or of the file
    #[arg(long, value_enum, default_value_t)]
    pub split_order: SplitOrder,
}

impl TableArgs {
    /// The table source, or None without --table.
    pub fn source(&self) -> Result<Option<Source>> {
        let Some(file) = &self.table else { return Ok(None) };
        if !(self.split > 0.0 && self.split < 1.0) {
            bail!("--split must be between 0 and 1 (exclusive), got {}", self.split);
        }
        Ok(Some(Source::Table {
            file: file.clone(),
            target: self.target.clone().ok_or_else(|| anyhow!("--table needs --target COLUMN"))?,
            overrides: Overrides {
                numeric: self.numeric.clone(),
                categorical: self.categorical.clone(),
                date: self.date.clone(),
                ignore: self.ignore.clone(),
            },
            split: self.split,
            order: self.split_order,
            skip_bad_rows: self.skip_bad_rows,
        }))
    }
}

/// Runs `textnet fit`: trains, or predicts with `--model` and `--predict`.
pub fn run(args: FitArgs) -> Result<()> {
    if let (Some(model), Some(new)) = (&args.model, &args.predict) {
        return predict(&args, model, new);
    }
    run::run(&args)
}

impl FitArgs {
    fn keep(&self) -> Keep {
        self.keep.unwrap_or(if self.patience.is_some() { Keep::Best } else { Keep::Last })
    }

    fn source(&self) -> Result<Source> {
        match (&self.dataset, self.tabular.source()?) {
            (Some(dataset), None) => Ok(Source::Images { dataset: *dataset, dir: self.data.clone() }),
            (None, Some(table)) => Ok(table),
            _ => bail!("give the data to train on: --dataset mnist|fashion, or --table FILE --target COLUMN"),
        }
    }

    fn check(&self) -> Result<()> {
        if self.batch == 0 {
            bail!("--batch must be at least 1");
        }
        crate::io::resources::check_epochs(self.epochs)?;
        if self.train_limit == Some(0) {
            bail!("--train-limit must be at least 1");
        }
        if let Some(p) = self.patience {
            if p == 0 {
                bail!("--patience must be at least 1 epoch");
            }
            if self.val_split.is_none() {
                bail!("--patience needs --val-split F: stopping by the test set would leak it into the model");
            }
            if self.keep == Some(Keep::Last) {
                bail!("--patience keeps the best epoch; leave out --keep last");
            }
        }
        checkpoint::check_val_split(self.val_split, self.keep())?;
        Ok(())
    }
}

/// Checks that `net`'s outputs fit the target: one per class, or one value.
fn check_outputs(net: &Network, data: &Data) -> Result<()> {
    let (last, outputs) = (net.layers.len(), net.outputs());
    match &data.target {
        TargetInfo::Classes { names } if outputs != names.len() => {
            let shown: Vec<&str> = names.iter().take(12).map(String::as_str).collect();
            bail!(
                "layer {last} ({}) gives {outputs} outputs but the target has {} classes ({}{}): end --layers with \
                 Linear({})",
                net.layers[last - 1].name(),
                names.len(),
                shown.join(", "),
                if names.len() > shown.len() { ", …" } else { "" },
                names.len()
            )
        }
        TargetInfo::Value { name, .. } if outputs != 1 => bail!(
            "layer {last} ({}) gives {outputs} outputs but the numeric target {name} is one value (--loss mse): end \
             --layers with Linear(1)",
            net.layers[last - 1].name()
        ),
        _ => Ok(()),
    }
}

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

/// What `setup` read, checked and built.
pub struct Setup {
    _lock: fsutil::OutputLock,
    display: Display,
    data: Data,
    net: Network,
    backend: Backend,
    optim: OptimConfig,
    schedule: LrSchedule,
    trainer: Box<StackTrainer>,
    /// The judged loss of the model at --out, an epoch must beat it.
    baseline: Option<f64>,
    /// Values: the test MAE of predicting the training mean.
    baseline_mae: Option<f64>,
    /// The test loss before training, which a run that did not learn compares its last one with.
    untrained_loss: f64,
    started: Instant,
}

/// `textnet fit`'s side of the epoch loop: the test (and validation) figures, the model written by
/// --keep when it learned, the epoch's line.
struct FitEpochs<'a> {
    args: &'a FitArgs,
    display: &'a mut Display,
    data: &'a Data,
    net: &'a Network,
    baseline_mae: Option<f64>,
    judged_name: &'static str,
    keeper: Keeper,
    rows: Vec<EpochRow>,
    last: Option<Figures>,
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

/// What `train` hands to `finish`.
pub struct Trained {
    setup: Setup,
    rows: Vec<EpochRow>,
    keeper: Keeper,
    diverged: Option<Divergence>,
    stopped_early: Option<usize>,
    last: Option<Figures>,
    training_s: f64,
}

impl TrainingCommand for FitArgs {
    type Setup = Setup;
    type Trained = Trained;

    fn setup(&self) -> Result<Setup> {
        let args = self;
        let started = Instant::now();
        args.check()?;
        let Some(text) = &args.layers else { bail!("give the network with --layers SPEC (or --model and --predict)") };
        let spec = spec::parse(text)?;
        let source = args.source()?;
        if let Source::Table { file, .. } = &source
            && let Some((i, layer)) = spec
                .layers
                .iter()
                .enumerate()
                .find(|(_, l)| matches!(l, Layer::Conv2d { .. } | Layer::MaxPool2d(_) | Layer::Flatten))
        {
            bail!(
                "layer {} ({}) takes images, but --table {} gives rows of features: leave the image layers out",
                i + 1,
                layer.name(),
                file.display()
            );
        }
        let optim = args.optim.config()?;
        let schedule = args.schedule.schedule(optim.lr)?;
        let display = Display::new(args.run.quiet, args.run.json, args.epochs)
            .log_every(args.log_every)
            .tensorboard(args.run.tensorboard.as_deref())?;
        if let Source::Table { file, .. } = &source {
            fsutil::check_output(&args.run.out, &[("table", file)])?;
        }
        let request =
            Request { loss: args.loss, seed: args.run.seed, train_limit: args.train_limit, val_split: args.val_split };
        let data = data::load(&source, &spec, request, &|note| display.line(note))?;
        let inputs: Vec<(&str, &Path)> = data.files.iter().map(|p| ("data file", p.as_path())).collect();
        let lock = fsutil::check_output(&args.run.out, &inputs)?;
        crate::harness::plot::check(args.run.plot.as_deref(), Some(&args.run.out), &inputs)?;
        for note in &data.notes {
            display.line(note);
        }
        for warning in &data.warnings {
            display.warning(warning);
        }
        let net = Network::new(&spec, data.input).map_err(|e| match &data.schema {
            InputSchema::Table(t) if e.to_string().starts_with("layer 1 ") => anyhow!(
                "{e:#} ({} gives {} features: its numeric columns, one per category of each categorical column, and \
                 the date features; write Linear({}) or Linear(out) to take them all)",
                data.source,
                t.feature_names.len(),
                t.feature_names.len()
            ),
            _ => e,
        })?;
        check_outputs(&net, &data)?;
        net.memory_need(data.samples_bytes(), args.batch)
            .check(available_memory())
            .map_err(|e| anyhow!("--layers {:?}: {e}", crate::harness::console::abridged(text)))?;
        let steps = data.train.rows().div_ceil(args.batch) * args.epochs;
        schedule.check(steps)?;
        let (backend, device_line) = device::select_described(args.run.device)?;

        // The model already at --out: only a better epoch replaces it, and one of other data is refused.
        let existing =
            fsutil::existing_model(&args.run.out, "fit", modelfile::from_bytes)?.filter(|_| !args.run.overwrite);
        let judged = data.val.as_ref().unwrap_or(&data.test);
        let loss_name = if data.val.is_some() { "val loss" } else { "test loss" };
        let baseline = match &existing {
            Some(old) => {
                if old.net != net || old.input != data.schema || old.target_kind() != data.target_kind() {
                    return Err(checkpoint::other_data(&args.run.out, "a fit model of another spec or other data"));
                }
                let (sum, _) = crate::nn::stack::cpu::evaluate(&old.net, &old.params, judged, old.loss);
                let loss = checkpoint::baseline(&args.run.out, sum / judged.rows().max(1) as f64, loss_name)?;
                display.line(&format!(
                    "--out {} already holds a model of {loss_name} {loss:.4}; only a better epoch replaces it",
                    args.run.out.display()
                ));
                Some(loss)
            }
            None => None,
        };
        let baseline_mae = match &data.target {
            TargetInfo::Value { mean, .. } => Some(
                data.test_values.iter().map(|&y| (y as f64 - *mean as f64).abs()).sum::<f64>()
                    / data.test_values.len().max(1) as f64,
            ),
            TargetInfo::Classes { .. } => None,
        };

        let params = net.init(args.init, args.run.seed);
        let limited = match args.train_limit {
            Some(limit) if limit < data.full_train => {
                format!(" (the first {} of {})", report::count(limit), report::count(data.full_train))
            }
            _ => String::new(),
        };
        let held_out = data.val.as_ref().map_or(String::new(), |v| format!(", {} held out for validation", v.rows()));
        display.line(&format!(
            "{}: {} training samples{limited}{held_out}, {} test samples; input {}",
            data.source,
            report::count(data.train.rows()),
            report::count(data.test.rows()),
            data.input
        ));
        let target = match &data.target {
            TargetInfo::Classes { names } => format!("{} classes, cross-entropy", names.len()),
            TargetInfo::Value { name, .. } => format!("{name}, squared error on standardised values"),
        };
        let schedule_text = match schedule.describe() {
            s if s.is_empty() => String::new(),
            s => format!(", {s}"),
        };
        display.line(&format!(
            "model {}; {} parameters; {target}; {}{schedule_text}, batch {}, {} epoch{}, seed {}, {} init; device \
             {device_line}",
            spec::text(&net.layers),
            report::count(net.param_count),
            optim.describe(),
            args.batch,
            args.epochs,
            if args.epochs == 1 { "" } else { "s" },
            args.run.seed,
            report::flag_value(&args.init),
        ));
        if let Some(mae) = baseline_mae {
            display.line(&format!("baseline test MAE (predicting the training mean): {mae:.4}"));
        }
        let mut splits = vec![Arc::new(data.train.clone()), Arc::new(data.test.clone())];
        splits.extend(data.val.clone().map(Arc::new));
        let setup = TrainerSetup {
            net: net.clone(),
            params,
            loss: data.loss,
            optim,
            dropout_seed: args.run.seed as u32,
            splits,
        };
        let mut trainer = crate::nn::stack::trainer(&backend, setup, args.batch)?;
        let (untrained_sum, _) = trainer.evaluate(TEST)?;
        Ok(Setup {
            untrained_loss: untrained_sum / data.test.rows().max(1) as f64,
            _lock: lock,
            display,
            data,
            net,
            backend,
            optim,
            schedule,
            trainer,
            baseline,
            baseline_mae,
            started,
        })
    }

    fn train(&self, mut setup: Setup) -> Result<Trained> {
        let args = self;
        let n = setup.data.train.rows();
        let steps_per_epoch = n.div_ceil(args.batch);
        let plan = EpochPlan {
            epochs: args.epochs,
            samples: n,
            batch: args.batch,
            shuffle_seed: Some(args.run.seed ^ crate::nn::stack::SHUFFLE_STREAM),
            rates: setup.schedule.rates(setup.optim.lr, steps_per_epoch * args.epochs),
            patience: args.patience,
        };
        let judged_name = if setup.data.val.is_some() { "val loss" } else { "test loss" };
        let mut hooks = FitEpochs {
            args,
            display: &mut setup.display,
            data: &setup.data,
            net: &setup.net,
            baseline_mae: setup.baseline_mae,
            judged_name,
            keeper: Keeper::new(args.keep(), setup.baseline),
            rows: Vec::new(),
            last: None,
        };
        let training = Instant::now();
        let ran = run::epochs(setup.trainer.as_mut(), &plan, &mut hooks)?;
        let training_s = training.elapsed().as_secs_f64();
        let FitEpochs { keeper, rows, last, .. } = hooks;
        Ok(Trained { setup, rows, keeper, diverged: ran.diverged, stopped_early: ran.stopped_early, last, training_s })
    }

    fn finish(&self, trained: Trained) -> Result<Ending> {
        let args = self;
        let Trained { setup, rows, keeper, diverged, stopped_early, last, training_s } = trained;
        let Setup { mut display, data, net, backend, optim, baseline_mae, untrained_loss, started, .. } = setup;
        let judged_name = if data.val.is_some() { "val loss" } else { "test loss" };
        let outcome = keeper.outcome(&args.run.out, judged_name);
        let completed = rows.len();
        let interrupted = diverged.is_none() && stopped_early.is_none() && completed < args.epochs;
        let written = keeper.kept.is_some();
        let finding = match (written, diverged.is_some() || interrupted, last) {
            (false, false, Some(f)) => match (&data.target, f.accuracy, f.mae) {
                (TargetInfo::Classes { names }, Some(a), _) if a <= 1.5 / names.len() as f64 => Some(format!(
                    "test accuracy {:.1}% where guessing gets {:.1}%",
                    100.0 * a,
                    100.0 / names.len() as f64
                )),
                (TargetInfo::Value { .. }, _, Some(mae)) if baseline_mae.is_some_and(|b| mae >= b) => Some(format!(
                    "its test MAE {mae:.4} is no better than predicting the training mean ({:.4})",
                    baseline_mae.unwrap_or_default()
                )),
                _ => None,
            },
            _ => None,
        };
        let failed = finding.zip(last).map(|(finding, last)| {
            let more = if matches!(data.schema, InputSchema::Table(_)) {
                "--split, --val-split"
            } else {
                "--train-limit, --val-split"
            };
            let lr = report::decimal(optim.lr).to_string();
            let loss = (untrained_loss, last.loss);
            let advice = run::retry_advice(data.train.rows(), "sample", more, loss, &lr, "more --epochs");
            run::not_learned(&finding, &outcome, &advice)
        });
        // A run that wrote nothing says so in its error line.
        if written && diverged.is_none() {
            display.line(&outcome);
        }
        let mut ending = Ending {
            report: None,
            json: args.run.json,
            board: display.take_board(),
            diverged,
            interrupted: interrupted.then(|| format!("after epoch {completed} of {}", args.epochs)),
            failed,
            written,
            outcome,
            remedy: format!("lower --lr or set --clip-norm (this run used --lr {})", report::decimal(optim.lr)),
            plot_failed: crate::harness::plot::training_curves(
                args.run.plot.as_deref(),
                &format!(
                    "textnet fit on {}: {}; {}, batch {}",
                    data.source.split(" from ").next().unwrap_or_default(),
                    spec::text(&net.layers),
                    optim.describe(),
                    args.batch
                ),
                &rows,
                &display,
            ),
        };
        if args.run.json || args.run.tensorboard.is_some() {
            let mut extra = serde_json::Map::new();
            if let Some(mae) = baseline_mae {
                extra.insert("baseline_mae".into(), json!(mae));
            }
            extra.insert("wall_s".into(), json!({"training": training_s, "total": started.elapsed().as_secs_f64()}));
            let (dataset, table) = match &args.dataset {
                Some(d) => (Some(d.name()), None),
                None => (None, args.tabular.table.as_ref().map(|p| p.display().to_string())),
            };
            let classes = match &data.target {
                TargetInfo::Classes { names } => Some(names.clone()),
                TargetInfo::Value { .. } => None,
            };
            ending.report = Some(Report {
                textnet: report::VERSION,
                command: "fit",
                status: ending.status(),
                config: report::with_flags(
                    json!({
                        "layers": spec::text(&net.layers),
                        "dataset": dataset,
                        "table": table,
                        "target": args.tabular.target.as_ref().map(|t| t.to_string()),
                        "loss": data.loss.name(),
                        "init": report::flag_value(&args.init),
                        "patience": args.patience,
                        "epochs": args.epochs,
                        "batch": args.batch,
                        "train_limit": args.train_limit,
                        "val_split": args.val_split,
                        "split": args.tabular.table.as_ref().map(|_| args.tabular.split),
                        "keep": args.keep().name(),
                    }),
                    &[&args.run, &OptimArgs::of(&optim), &args.schedule],
                ),
                device: report::DeviceFields::of(&backend),
                data: json!({
                    "source": data.source,
                    "input": crate::nn::stack::model::size(data.input),
                    "input_shape": match data.input {
                        Shape::Flat(n) => vec![n],
                        Shape::Image { channels, height, width } => vec![channels, height, width],
                    },
                    "train_samples": data.train.rows(),
                    "val_samples": data.val.as_ref().map_or(0, Samples::rows),
                    "test_samples": data.test.rows(),
                    "skipped_rows": data.skipped,
                    "class_names": classes,
                    "warnings": data.warnings,
                }),
                parameters: net.param_count,
                final_metrics: report::final_metrics(&rows, keeper.kept_epoch(), extra),
                epochs: rows,
                model: args.run.out.display().to_string(),
                kept_epoch: keeper.kept_epoch(),
                baseline_val_loss: keeper.baseline,
                diverged: ending.diverged.clone(),
            });
            if let (Some(report), Some(epoch)) = (ending.report.as_mut(), stopped_early) {
                report.config["stopped_early_after"] = json!(epoch);
            }
        }
        Ok(ending)
    }
}

impl FitModel {
    /// "classes" or "value", to tell a model of another target apart.
    pub fn target_kind(&self) -> &'static str {
        match self.target {
            TargetInfo::Classes { .. } => "classes",
            TargetInfo::Value { .. } => "value",
        }
    }
}

impl Data {
    /// "classes" or "value".
    pub fn target_kind(&self) -> &'static str {
        match self.target {
            TargetInfo::Classes { .. } => "classes",
            TargetInfo::Value { .. } => "value",
        }
    }
}

/// `--model M --predict FILE`: one line per good row of FILE, its file line and the prediction (the class
/// name, or the value in the target's units); the accuracy or MAE over the rows that give the target.
fn predict(args: &FitArgs, model_path: &Path, new: &Path) -> Result<()> {
    let _lock = match &args.predictions {
        Some(path) => Some(fsutil::check_data_output("--predictions", path, &[("model", model_path), ("table", new)])?),
        None => None,
    };
    let m = modelfile::load(model_path)?;
    let t = match &m.input {
        InputSchema::Table(t) => t,
        InputSchema::Array { .. } => bail!(
            "{} is a model of arrays; predict with it in Python: textnet.load({:?}).predict(X)",
            model_path.display(),
            model_path.display().to_string()
        ),
        InputSchema::Images { .. } => bail!(
            "{} is a model of images; classify images with textnet classify --model {} IMAGE…",
            model_path.display(),
            model_path.display()
        ),
    };
    let mut options = LoadOptions::new(t.schema.clone());
    options.delimiter = Some(t.delimiter);
    options.header = if t.header { HeaderMode::Present } else { HeaderMode::Absent };
    options.skip_bad_rows = args.tabular.skip_bad_rows;
    options.width = Some(t.width);
    options.target_optional = true;
    options.target_labels = m.loss == Loss::Ce;
    let table = Table::read(new, &options)?;
    let split = Split::of_rows(&table, &table.rows, &t.vocabularies);
    if split.features != m.net.inputs() {
        bail!("{} gives {} features but the model takes {}", new.display(), split.features, m.net.inputs());
    }
    let mut x = split.x.clone();
    for row in x.chunks_mut(split.features.max(1)) {
        for ((v, mean), std) in row.iter_mut().zip(&t.feature_mean).zip(&t.feature_std) {
            *v = (*v - mean) / std;
        }
    }
    let trace = crate::nn::stack::model::forward(&m.net, &m.params, &x, split.rows, None);
    let out = trace.values.last().expect("an output");
    let k = m.net.outputs();
    let mut text = String::from("line\tprediction\n");
    let (mut with_target, mut score) = (0usize, 0f64);
    for (i, o) in out.chunks(k).enumerate() {
        match &m.target {
            TargetInfo::Classes { names } => {
                let class = argmax(o);
                text += &format!("{}\t{}\n", split.lines[i], names[class]);
                if split.y[i].is_finite() {
                    let label = &table.target_levels[split.y[i] as usize];
                    with_target += 1;
                    score += f64::from(u8::from(*label == names[class]));
                }
            }
            TargetInfo::Value { mean, std, .. } => {
                let y = o[0] * std + mean;
                text += &format!("{}\t{y}\n", split.lines[i]);
                if split.y[i].is_finite() {
                    with_target += 1;
                    score += (y as f64 - split.y[i] as f64).abs();
                }
            }
        }
    }
    match &args.predictions {
        Some(path) => fsutil::write_atomic(path, text.as_bytes())?,
        None => crate::harness::console::out(text.trim_end()),
    }
    if table.skipped > 0 && !args.run.quiet {
        crate::harness::console::err(&format!(
            "skipped {} bad row{}",
            table.skipped,
            if table.skipped == 1 { "" } else { "s" }
        ));
    }
    if with_target > 0 && !args.run.quiet {
        let figure = match &m.target {
            TargetInfo::Classes { .. } => format!("accuracy {:.2}%", 100.0 * score / with_target as f64),
            TargetInfo::Value { .. } => format!("MAE {:.4}", score / with_target as f64),
        };
        crate::harness::console::err(&format!("{figure} over {with_target} rows with a {}", t.target_name));
    }
    Ok(())
}
