//! `textnet fit --layers SPEC`: train a network written as layers on images (`--dataset`) or a table
//! (`--table --target`), report each epoch as every training command does, and write the model
//! (`modelfile`); `textnet fit --model M --predict FILE` predicts a table's rows with a table model.
//!
//! Every bad input is refused in `setup`, before training: the spec (parse and shapes), a first layer
//! that does not take the data's features, an output layer that does not fit the target, a loss that
//! does not fit it, image layers on a table, and a run too large for host memory.

use super::args::FitArgs;
use super::data::{self, Data, InputSchema, Request, Source, TargetInfo};
use super::epochs::FitEpochs;
use super::modelfile;
use super::predict::predict;
use crate::device::{self, Backend};
use crate::harness::args::RunArgs;
use crate::harness::checkpoint::{self, Keeper};
use crate::harness::report::{self, Display, Divergence, EpochRow};
use crate::harness::run::{self, Ending, EpochPlan, TEST, TrainingCommand};
use crate::io::fsutil;
use crate::io::resources::available_memory;
use crate::nn::stack::model::Network;
use crate::nn::stack::spec::{self, Layer, Spec};
use crate::nn::stack::{Figures, Setup as TrainerSetup, StackTrainer};
use crate::ops::optim::{LrSchedule, OptimConfig};
use anyhow::{Result, anyhow, bail};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Runs `textnet fit`: trains, or predicts with `--model` and `--predict`.
pub fn run(args: FitArgs) -> Result<()> {
    if let (Some(model), Some(new)) = (&args.model, &args.predict) {
        return predict(&args, model, new);
    }
    run::run(&args)
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

/// What `setup` read, checked and built.
pub struct Setup {
    _lock: fsutil::OutputLock,
    pub(super) display: Display,
    pub(super) data: Data,
    pub(super) net: Network,
    pub(super) backend: Backend,
    pub(super) optim: OptimConfig,
    pub(super) schedule: LrSchedule,
    pub(super) trainer: Box<StackTrainer>,
    /// The judged loss of the model at --out, an epoch must beat it.
    pub(super) baseline: Option<f64>,
    /// Values: the test MAE of predicting the training mean.
    pub(super) baseline_mae: Option<f64>,
    /// The test loss before training, which a run that did not learn compares its last one with.
    pub(super) untrained_loss: f64,
    pub(super) started: Instant,
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
        check_layers_take(&spec, &source)?;
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
        let lock = lock_out(&args.run, &data, &display)?;
        let net = network(&spec, &data, text, args.batch)?;
        let steps = data.train.rows().div_ceil(args.batch) * args.epochs;
        schedule.check(steps)?;
        let (backend, device_line) = device::select_described(args.run.device)?;
        let baseline = baseline(&args.run, &net, &data, &display)?;
        let baseline_mae = baseline_mae(&data);
        let params = net.init(args.init, args.run.seed);
        args.describe(&data, &net, &optim, &schedule, &device_line, &display);
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
        let Trained { mut setup, rows, keeper, diverged, stopped_early, last, training_s } = trained;
        let data = &setup.data;
        let judged_name = if data.val.is_some() { "val loss" } else { "test loss" };
        let outcome = keeper.outcome(&args.run.out, judged_name);
        let completed = rows.len();
        let interrupted = diverged.is_none() && stopped_early.is_none() && completed < args.epochs;
        let written = keeper.kept.is_some();
        let failed = match (written, diverged.is_some() || interrupted, last) {
            (false, false, Some(last)) => not_learned(&setup, last, &outcome),
            _ => None,
        };
        // A run that wrote nothing says so in its error line.
        if written && diverged.is_none() {
            setup.display.line(&outcome);
        }
        let title = format!(
            "textnet fit on {}: {}; {}, batch {}",
            data.source.split(" from ").next().unwrap_or_default(),
            spec::text(&setup.net.layers),
            setup.optim.describe(),
            args.batch
        );
        let mut ending = Ending {
            report: None,
            json: args.run.json,
            board: setup.display.take_board(),
            diverged,
            interrupted: interrupted.then(|| format!("after epoch {completed} of {}", args.epochs)),
            failed,
            written,
            outcome,
            remedy: format!("lower --lr or set --clip-norm (this run used --lr {})", report::decimal(setup.optim.lr)),
            plot_failed: crate::harness::plot::training_curves(args.run.plot.as_deref(), &title, &rows, &setup.display),
        };
        if args.run.json || args.run.tensorboard.is_some() {
            let mut report = args.report(&setup, ending.status(), rows, &keeper, training_s);
            report.diverged = ending.diverged.clone();
            if let Some(epoch) = stopped_early {
                report.config["stopped_early_after"] = json!(epoch);
            }
            ending.report = Some(report);
        }
        Ok(ending)
    }
}

/// Locks --out and checks --plot against the data files the run reads; then says what reading the data
/// noted and warned of.
fn lock_out(run: &RunArgs, data: &Data, display: &Display) -> Result<fsutil::OutputLock> {
    let inputs: Vec<(&str, &Path)> = data.files.iter().map(|p| ("data file", p.as_path())).collect();
    let lock = fsutil::check_output(&run.out, &inputs)?;
    crate::harness::plot::check(run.plot.as_deref(), Some(&run.out), &inputs)?;
    for note in &data.notes {
        display.line(note);
    }
    for warning in &data.warnings {
        display.warning(warning);
    }
    Ok(lock)
}

/// Refuses image layers (`Conv2d`, `MaxPool2d`, `Flatten`) on a table's rows.
fn check_layers_take(spec: &Spec, source: &Source) -> Result<()> {
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
    Ok(())
}

/// The network of `spec` on `data`, checked against its target and against host memory at `batch`; `text`
/// is the --layers spec as given.
fn network(spec: &Spec, data: &Data, text: &str, batch: usize) -> Result<Network> {
    let net = Network::new(spec, data.input).map_err(|e| match &data.schema {
        InputSchema::Table(t) if e.to_string().starts_with("layer 1 ") => anyhow!(
            "{e:#} ({} gives {} features: its numeric columns, one per category of each categorical column, and \
             the date features; write Linear({}) or Linear(out) to take them all)",
            data.source,
            t.feature_names.len(),
            t.feature_names.len()
        ),
        _ => e,
    })?;
    check_outputs(&net, data)?;
    net.memory_need(data.samples_bytes(), batch)
        .check(available_memory())
        .map_err(|e| anyhow!("--layers {:?}: {e}", crate::harness::console::abridged(text)))?;
    Ok(net)
}

/// The judged loss of the model already at --out, which only a better epoch replaces; a model of another
/// spec or other data is refused. None without one or with --overwrite.
fn baseline(run: &RunArgs, net: &Network, data: &Data, display: &Display) -> Result<Option<f64>> {
    // The model already at --out: only a better epoch replaces it, and one of other data is refused.
    let existing = fsutil::existing_model(&run.out, "fit", modelfile::from_bytes)?.filter(|_| !run.overwrite);
    let judged = data.val.as_ref().unwrap_or(&data.test);
    let loss_name = if data.val.is_some() { "val loss" } else { "test loss" };
    Ok(match &existing {
        Some(old) => {
            if old.net != *net || old.input != data.schema || old.target_kind() != data.target_kind() {
                return Err(checkpoint::other_data(&run.out, "a fit model of another spec or other data"));
            }
            let (sum, _) = crate::nn::stack::cpu::evaluate(&old.net, &old.params, judged, old.loss);
            let loss = checkpoint::baseline(&run.out, sum / judged.rows().max(1) as f64, loss_name)?;
            display.line(&format!(
                "--out {} already holds a model of {loss_name} {loss:.4}; only a better epoch replaces it",
                run.out.display()
            ));
            Some(loss)
        }
        None => None,
    })
}

/// A numeric target's test MAE of predicting the training mean, which a model must beat.
fn baseline_mae(data: &Data) -> Option<f64> {
    match &data.target {
        TargetInfo::Value { mean, .. } => Some(
            data.test_values.iter().map(|&y| (y as f64 - *mean as f64).abs()).sum::<f64>()
                / data.test_values.len().max(1) as f64,
        ),
        TargetInfo::Classes { .. } => None,
    }
}

impl FitArgs {
    /// The lines that say what the run trains on and with what, and a numeric target's baseline MAE.
    fn describe(
        &self,
        data: &Data,
        net: &Network,
        optim: &OptimConfig,
        schedule: &LrSchedule,
        device_line: &str,
        display: &Display,
    ) {
        let args = self;
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
        if let Some(mae) = baseline_mae(data) {
            display.line(&format!("baseline test MAE (predicting the training mean): {mae:.4}"));
        }
    }
}

/// Why a run that wrote nothing learned nothing, as its error line: a classifier no better than guessing,
/// or values no better than the training mean (`last`: the last epoch's test figures); none when it did
/// learn (then it wrote nothing because no epoch beat --out).
fn not_learned(setup: &Setup, last: Figures, outcome: &str) -> Option<String> {
    let (data, baseline_mae) = (&setup.data, setup.baseline_mae);
    let finding = match (&data.target, last.accuracy, last.mae) {
        (TargetInfo::Classes { names }, Some(a), _) if a <= 1.5 / names.len() as f64 => {
            format!("test accuracy {:.1}% where guessing gets {:.1}%", 100.0 * a, 100.0 / names.len() as f64)
        }
        (TargetInfo::Value { .. }, _, Some(mae)) if baseline_mae.is_some_and(|b| mae >= b) => format!(
            "its test MAE {mae:.4} is no better than predicting the training mean ({:.4})",
            baseline_mae.unwrap_or_default()
        ),
        _ => return None,
    };
    let more = if matches!(data.schema, InputSchema::Table(_)) {
        "--split, --val-split"
    } else {
        "--train-limit, --val-split"
    };
    let lr = report::decimal(setup.optim.lr).to_string();
    let loss = (setup.untrained_loss, last.loss);
    let advice = run::retry_advice(data.train.rows(), "sample", more, loss, &lr, "more --epochs");
    Some(run::not_learned(&finding, outcome, &advice))
}
