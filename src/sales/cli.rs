//! `textnet sales FILE`: train the regressor on a table (its schema inferred from `--target`, `infer`)
//! and write the model, or go on training one (`--resume`); `textnet sales --model M --predict NEW` writes
//! its predictions for new rows. What it prints goes through `report`, as for every training command.

use super::infer::{self, Inferred, Overrides};
use super::model::{self, DEFAULT_BATCH, DEFAULT_EPOCHS, DEFAULT_HIDDEN, Evaluation, SalesParams, SalesShape};
use super::modelfile::{self, SalesModel};
use super::table::{ColumnSpec, HeaderMode, LoadOptions, Schema, Table};
use super::train::FitSales;
use crate::datasets::features::{Dataset, Split, SplitOrder, Stats};
use crate::device::{self, Backend};
use crate::harness::args::{OptimArgs, RunArgs, ScheduleArgs, run_out};
use crate::harness::checkpoint::{self, Keep, Keeper};
use crate::harness::report::{self, Display, Divergence, EpochRow, Report};
use crate::harness::run::{self, Ending, EpochHooks, EpochPlan, EpochTrained, TEST, Trainer, TrainingCommand, Verdict};
use crate::io::fsutil;
use crate::io::resources::{MemoryNeed, available_memory};
use anyhow::{Context, Result, anyhow, bail};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
#[command(
    override_usage = "textnet sales [OPTIONS] <FILE>\n       textnet sales --model <M> --predict <NEW> [--predictions <OUT>]",
    mut_arg("out", run_out(
        "sales.safetensors",
        "Where to write the model (.safetensors); a sales model of the same features already there is replaced only \
by one with a lower test MAE (validation MAE with --val-split)"
    )),
    mut_arg("seed", |a| a.help("Seed of the initial parameters, of the train/test split and of the row order")),
    mut_arg("plot", |a| a.conflicts_with("model")),
    mut_arg("tensorboard", |a| a.conflicts_with("model"))
)]
/// The flags of `textnet sales`.
pub struct SalesArgs {
    /// The table: tab- or comma-separated, with or without a header row (default schema: the
    /// 10-column sales.tsv, see --target)
    #[arg(value_name = "FILE", required_unless_present_any = ["model", "predict"])]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    /// The column flags (`--target`, `--numeric`, `--categorical`, `--date`, `--ignore`).
    pub columns: ColumnArgs,
    /// Go on training this sales model on FILE, with its schema, vocabularies, standardisation and shape
    /// (so no column flag or --hidden goes with it)
    #[arg(long, value_name = "M", conflicts_with_all = ["target", "numeric", "categorical", "date", "ignore", "hidden"])]
    pub resume: Option<PathBuf>,
    /// Skip bad rows (wrong column count, non-numbers, empty fields, NaN or inf, unreadable dates) and
    /// report how many, instead of stopping at the first
    #[arg(long)]
    pub skip_bad_rows: bool,
    /// Share of the rows that trains; the rest tests
    #[arg(long, default_value_t = super::table::DEFAULT_TRAIN_FRACTION)]
    pub split: f64,
    /// Hold out this fraction of the training rows (the last of them) as validation rows, measured after
    /// every epoch; --keep chooses the epoch by them, never by the test rows
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub val_split: Option<f64>,
    /// Which epoch the model file holds. `best` (lowest validation MAE) needs --val-split: choosing by the
    /// test rows would make their figures optimistic
    #[arg(long, value_enum, default_value_t = Keep::Last)]
    pub keep: Keep,
    /// Which rows train: the first --split of a shuffle of them seeded by --seed, or of the file as it is
    #[arg(long, value_enum, default_value_t)]
    pub split_order: SplitOrder,
    /// Hidden units
    #[arg(long, default_value_t = DEFAULT_HIDDEN)]
    pub hidden: usize,
    #[command(flatten)]
    /// The optimizer flags (`--optim`, `--lr`, ...).
    pub optim: OptimArgs,
    /// The learning-rate schedule (`--lr-schedule`, `--warmup`, `--min-lr`).
    #[command(flatten)]
    pub schedule: ScheduleArgs,
    /// Rows per optimizer step (the loss is the batch mean)
    #[arg(long, default_value_t = DEFAULT_BATCH)]
    pub batch: usize,
    /// Passes over the training rows
    #[arg(short = 'e', long, default_value_t = DEFAULT_EPOCHS)]
    pub epochs: usize,
    #[command(flatten)]
    /// The run flags (`--out`, `--seed`, `--device`, `--json`, ...).
    pub run: RunArgs,
    /// Predict with this model file instead of training (with --predict)
    #[arg(short = 'm', long, value_name = "M", requires = "predict", conflicts_with = "resume")]
    pub model: Option<PathBuf>,
    /// The table to predict, laid out as the training file; its target column may be left out or left
    /// empty (where it is given, the MAE is reported)
    #[arg(long, value_name = "NEW", requires = "model")]
    pub predict: Option<PathBuf>,
    /// Where --predict writes its TSV (line, prediction); default stdout
    #[arg(long, value_name = "OUT", requires = "predict")]
    pub predictions: Option<PathBuf>,
    /// Print an epoch's line only every N epochs (and the first and last), for long runs
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub log_every: usize,
}

/// Which column `sales` and `bench sales` predict and the other columns' roles.
#[derive(clap::Args, Debug, Clone)]
pub struct ColumnArgs {
    /// The column to predict, by header name or 1-based number; the other columns' roles are inferred
    /// from their values (and printed), unless a column flag names them [default: sales.tsv as scripts/make-sales.py writes it:
    /// column 9, total price, from its quantity, unit price, category and date]
    #[arg(long, value_name = "COLUMN")]
    pub target: Option<ColumnSpec>,
    /// Numeric feature columns (comma-separated names or numbers)
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',')]
    pub numeric: Vec<ColumnSpec>,
    /// Categorical feature columns, one-hot over the values seen in training
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',')]
    pub categorical: Vec<ColumnSpec>,
    /// Date columns, each giving its year, day of year and day of week (and time of day, when it has
    /// times)
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',')]
    pub date: Vec<ColumnSpec>,
    /// Columns to leave out
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',')]
    pub ignore: Vec<ColumnSpec>,
}

impl ColumnArgs {
    fn overrides(&self) -> Overrides {
        Overrides {
            numeric: self.numeric.clone(),
            categorical: self.categorical.clone(),
            date: self.date.clone(),
            ignore: self.ignore.clone(),
        }
    }

    /// The schema of `bytes`, the table `source`, inferred for the given target, each column's role given
    /// to `log` with its reason (`Inferred::warnings` are the caller's to print). None without --target:
    /// the default sales.tsv schema.
    pub fn infer(&self, source: &str, bytes: &[u8], log: &dyn Fn(&str)) -> Result<Option<Inferred>> {
        let overrides = self.overrides();
        let Some(target) = &self.target else {
            let given = [&overrides.numeric, &overrides.categorical, &overrides.date, &overrides.ignore];
            if given.iter().any(|specs| !specs.is_empty()) {
                bail!("--numeric, --categorical, --date and --ignore describe another table: name its --target too");
            }
            return Ok(None);
        };
        let inferred = infer::infer(source, bytes, target, &overrides)?;
        log(&format!("columns of {source}:"));
        for choice in &inferred.choices {
            log(&choice.line());
        }
        Ok(Some(inferred))
    }
}

/// Runs `textnet sales`: trains, or predicts with `--model` and `--predict`.
pub fn run(args: SalesArgs) -> Result<()> {
    if let (Some(model), Some(new)) = (&args.model, &args.predict) {
        return predict(&args, model, new);
    }
    run::run(&args)
}

/// What `setup` read, checked and built.
pub struct Setup {
    _lock: fsutil::OutputLock,
    display: Display,
    schema: Schema,
    delimiter: u8,
    header: bool,
    width: usize,
    data: Dataset,
    backend: Backend,
    shape: SalesShape,
    trainer: FitSales,
    stats: Stats,
    baseline_mae: f64,
    /// The validation rows, standardised, with --val-split.
    val: Option<Split>,
    /// The MAE a run must match to replace the model at --out (and to be written after --resume): of
    /// that model and of the resumed one, on the rows epochs are judged by (validation, else test).
    old_mae: Option<f64>,
    /// The learning rate of every optimizer step of the run, epoch after epoch.
    rates: Vec<f32>,
    /// The columns the inferred schema leaves out (`Inferred::warnings`), for the report.
    warnings: Vec<String>,
    /// The test MSE before training, which a run that did not learn compares its last one with.
    untrained_mse: f64,
}

/// `textnet sales`'s side of the epoch loop: the test (and validation) figures, the epoch kept with
/// --val-split, the epoch's line.
struct SalesEpochs<'a> {
    display: &'a mut Display,
    rows: usize,
    val: Option<&'a Split>,
    stats: &'a Stats,
    history: Vec<EpochRow>,
    last: Option<Evaluation>,
    keeper: Option<Keeper>,
    kept: Option<(SalesParams, Evaluation)>,
}

impl EpochHooks<FitSales> for SalesEpochs<'_> {
    fn started(&mut self, epoch: usize, samples: usize) {
        self.display.epoch_started(epoch, samples);
    }

    fn finished(&mut self, trainer: &mut FitSales, epoch: &EpochTrained) -> Result<Verdict> {
        self.display.reached(self.rows);
        let eval = trainer.evaluate(TEST)?;
        let judged = match self.val {
            Some(val) => {
                let params = trainer.params()?;
                Some((model::evaluate(&params, val, self.stats)?, params))
            }
            None => None,
        };
        let val_eval = judged.as_ref().map(|(e, _)| *e);
        if ![Some(eval.mse), val_eval.map(|e| e.mse)].into_iter().flatten().all(f64::is_finite) {
            return Ok(Verdict::Diverged("test error"));
        }
        let mut note = String::new();
        if let (Some(keeper), Some((v, params))) = (self.keeper.as_mut(), judged) {
            let kept = &mut self.kept;
            let written = keeper.offer(epoch.epoch, v.mae, || {
                *kept = Some((params, eval));
                Ok(())
            })?;
            note = keeper.note(written, "val MAE").replace("saved", "kept");
        }
        let mut row = EpochRow {
            epoch: epoch.epoch,
            train_loss: epoch.train_loss,
            val_loss: val_eval.map(|v| v.mse),
            val_accuracy: None,
            test_loss: Some(eval.mse),
            test_accuracy: None,
            samples_per_s: epoch.samples_per_s,
            lr: Some(report::decimal(epoch.lr)),
            elapsed_s: epoch.started.elapsed().as_secs_f64(),
            extra: Default::default(),
        }
        .with("test_mae", eval.mae);
        let mut figures = format!("test MSE {:.4}, test MAE {:.4}", eval.mse, eval.mae);
        if let Some(v) = val_eval {
            row = row.with("val_mae", v.mae);
            figures = format!("val MAE {:.4}, {figures}", v.mae);
        }
        self.display.epoch_finished(&row, &figures, &note);
        self.history.push(row);
        self.last = Some(eval);
        Ok(Verdict::Next { judged: None })
    }
}

/// What `train` hands to `finish`.
pub struct Trained {
    setup: Setup,
    history: Vec<EpochRow>,
    diverged: Option<Divergence>,
    last: Option<Evaluation>,
    params: SalesParams,
    /// With --val-split: the epochs kept by --keep, and the parameters and test evaluation of the last one.
    keeper: Option<Keeper>,
    kept: Option<(SalesParams, Evaluation)>,
}

/// The MAE on `split` (in the file's units) of `model`.
fn mae_of(model: &SalesModel, split: &Split) -> Result<f64> {
    Ok(model::evaluate(&model.params, &model.stats.normalize(split), &model.stats)?.mae)
}

impl TrainingCommand for SalesArgs {
    type Setup = Setup;
    type Trained = Trained;

    fn setup(&self) -> Result<Setup> {
        let args = self;
        let Some(file) = args.file.clone() else { bail!("give the table to train on (or --model and --predict)") };
        if args.hidden == 0 || args.hidden > model::MAX_HIDDEN {
            bail!("--hidden must be between 1 and {}, got {}", model::MAX_HIDDEN, args.hidden);
        }
        if args.batch == 0 {
            bail!("--batch must be at least 1");
        }
        crate::io::resources::check_epochs(args.epochs)?;
        if !(args.split > 0.0 && args.split < 1.0) {
            bail!("--split must be between 0 and 1 (exclusive), got {}", args.split);
        }
        checkpoint::check_val_split(args.val_split, args.keep)?;
        let optim = args.optim.config()?;
        // The --resume model may be --out itself: it is read whole before training, and replaced only by
        // a better model.
        let lock = fsutil::check_output(&args.run.out, &[("table", &file)])?;
        let mut inputs = vec![("table", file.as_path())];
        inputs.extend(args.resume.as_deref().map(|m| ("--resume model", m)));
        crate::harness::plot::check(args.run.plot.as_deref(), Some(&args.run.out), &inputs)?;
        let existing = existing_out(&args.run.out)?.filter(|_| !args.run.overwrite);
        let resumed = match &args.resume {
            Some(path) => Some(modelfile::load(path).context("--resume")?),
            None => None,
        };
        let display = Display::new(args.run.quiet, args.run.json, args.epochs)
            .log_every(args.log_every)
            .tensorboard(args.run.tensorboard.as_deref())?;
        let bytes = fsutil::read_input(&file, "table")?;
        let source = fsutil::shown(&file);
        let inferred = match &resumed {
            Some(_) => None,
            None => args.columns.infer(&source, &bytes, &|line| display.line(line))?,
        };
        let warnings = inferred.as_ref().map_or_else(Vec::new, |i| i.warnings(&source));
        warnings.iter().for_each(|w| display.warning(w));
        let mut options = LoadOptions::new(match (&resumed, &inferred) {
            (Some(m), _) => m.schema.clone(),
            (None, Some(inferred)) => inferred.schema.clone(),
            (None, None) => Schema::sales_tsv(),
        });
        options.skip_bad_rows = args.skip_bad_rows;
        options.train_fraction = args.split;
        if let Some(m) = &resumed {
            options.delimiter = Some(m.delimiter);
            options.header = if m.header { HeaderMode::Present } else { HeaderMode::Absent };
            options.width = m.width;
        }
        let table = Table::parse(&source, &bytes, &options).map_err(|e| match (&resumed, &inferred) {
            (Some(_), _) => anyhow!(
                "--resume {}: {source} does not match the table the model was trained on: {e:#}",
                args.resume.as_deref().unwrap_or(Path::new("")).display()
            ),
            (None, Some(inferred)) => inferred.explain(e),
            (None, None) => anyhow!(
                "{e:#} (without --target the 10-column sales.tsv schema is assumed; for another table give --target, \
                 and its other columns' roles are inferred)"
            ),
        })?;
        check_feature_memory(&table, resumed.as_ref().map_or(args.hidden, |m| m.params.shape.hidden))?;
        let vocabularies = resumed.as_ref().map(|m| m.vocabularies.as_slice());
        let mut data = Dataset::from_table_with(&table, args.split, args.split_order, args.run.seed, vocabularies)?;
        if let Some(m) = &resumed
            && (m.feature_names != data.feature_names || m.target_name != data.target_name)
        {
            bail!(
                "--resume {}: {source} does not match the model: it gives the features {:?} and target {:?}, the model \
                 takes {:?} and {:?}",
                args.resume.as_deref().unwrap_or(Path::new("")).display(),
                data.feature_names,
                data.target_name,
                m.feature_names,
                m.target_name
            );
        }
        if let Some(fraction) = args.val_split {
            data.hold_out(fraction)?;
        }
        if let Some(warning) = data.split_shift() {
            let hint = match args.split_order {
                SplitOrder::File => " (the file may be sorted: --split-order shuffled mixes the rows first)",
                SplitOrder::Shuffled => "",
            };
            display.line(&format!("{warning}{hint}"));
        }
        if data.skipped > 0 {
            display.line(&format!(
                "skipped {} bad row{} (the first: {})",
                data.skipped,
                if data.skipped == 1 { "" } else { "s" },
                data.first_skipped.as_deref().unwrap_or("?")
            ));
        }
        if let Some(old) = &existing
            && (old.feature_names != data.feature_names || old.target_name != data.target_name)
        {
            return Err(checkpoint::other_data(&args.run.out, "a sales model of other features or target"));
        }
        let (backend, device_line) = device::select_described(args.run.device)?;
        let (shape, params) = match &resumed {
            Some(m) => (m.params.shape, m.params.clone()),
            None => {
                let shape = SalesShape { inputs: data.features(), hidden: args.hidden };
                (shape, SalesParams::init(shape, args.run.seed))
            }
        };
        let held_out = match data.val.rows {
            0 => String::new(),
            n => format!(", {n} of them held out for validation"),
        };
        display.line(&format!(
            "{}: {} training and {} test rows ({}){held_out}, {} features → {} hidden (ReLU) → {}; {} parameters, \
             MSE on standardised values",
            data.source,
            report::count(data.train.rows + data.val.rows),
            report::count(data.test.rows),
            match args.split_order {
                SplitOrder::Shuffled => "rows shuffled by the seed",
                SplitOrder::File => "in file order",
            },
            shape.inputs,
            shape.hidden,
            data.target_name,
            report::count(shape.param_count()),
        ));
        let schedule = args.schedule.schedule(optim.lr)?;
        let steps_per_epoch = data.train.rows.div_ceil(args.batch.max(1));
        schedule.check(steps_per_epoch * args.epochs)?;
        let rates = schedule.rates(optim.lr, steps_per_epoch * args.epochs);
        let schedule_text = match schedule.describe() {
            text if text.is_empty() => text,
            text => format!(" ({text})"),
        };
        display.line(&format!(
            "{}{schedule_text}, batch {}, {} epoch{}, seed {}; device {device_line}",
            optim.describe(),
            args.batch,
            args.epochs,
            if args.epochs == 1 { "" } else { "s" },
            args.run.seed
        ));

        let given_stats = resumed.as_ref().map(|m| m.stats.clone());
        let mut trainer = FitSales::new(&backend, &data, params, optim, given_stats, args.batch)?;
        let untrained_mse = trainer.evaluate(TEST)?.mse;
        let stats = trainer.stats().clone();
        let baseline_mae = data.test.y.iter().map(|&y| (y as f64 - stats.target_mean as f64).abs()).sum::<f64>()
            / data.test.rows as f64;
        display.line(&format!("baseline test MAE (predicting the training mean): {baseline_mae:.4}"));
        let (judged, judged_name) = if data.val.is_empty() { (&data.test, "test MAE") } else { (&data.val, "val MAE") };
        let mut old_mae = None;
        if let Some(old) = &existing {
            let mae = checkpoint::baseline(&args.run.out, mae_of(old, judged)?, judged_name)?;
            display.line(&format!(
                "--out {} already holds a model of {judged_name} {mae:.4} on this split; only a better one replaces it",
                args.run.out.display()
            ));
            old_mae = Some(mae);
        }
        if let (Some(m), Some(path)) = (&resumed, &args.resume) {
            let mae = mae_of(m, judged)?;
            if !mae.is_finite() {
                bail!(
                    "--resume {}: the model's outputs on this table are not finite ({judged_name} {mae}), so it cannot \
                     be trained further; train a new model instead",
                    path.display()
                );
            }
            display.line(&format!(
                "--resume {}: {judged_name} {mae:.4} on this split before training; only a better model is written",
                path.display()
            ));
            old_mae = Some(old_mae.map_or(mae, |b: f64| b.min(mae)));
        }
        let val = (!data.val.is_empty()).then(|| stats.normalize(&data.val));
        Ok(Setup {
            _lock: lock,
            display,
            // The date features as this table settled them, which rows to predict must be given too.
            schema: Schema { date_features: Some(table.date_features.clone()), ..options.schema },
            delimiter: table.delimiter,
            header: table.header.is_some(),
            width: table.width,
            data,
            backend,
            shape,
            trainer,
            stats,
            baseline_mae,
            val,
            old_mae,
            rates,
            warnings,
            untrained_mse,
        })
    }

    fn train(&self, mut setup: Setup) -> Result<Trained> {
        let args = self;
        let rows = setup.data.train.rows;
        let plan = EpochPlan {
            epochs: args.epochs,
            samples: rows,
            batch: args.batch,
            shuffle_seed: Some(args.run.seed ^ model::SHUFFLE_STREAM),
            rates: setup.rates.clone(),
            patience: None,
        };
        let mut hooks = SalesEpochs {
            display: &mut setup.display,
            rows,
            val: setup.val.as_ref(),
            stats: &setup.stats,
            history: Vec::with_capacity(args.epochs),
            last: None,
            keeper: setup.val.as_ref().map(|_| Keeper::new(args.keep, setup.old_mae)),
            kept: None,
        };
        let ran = run::epochs(&mut setup.trainer, &plan, &mut hooks)?;
        let SalesEpochs { history, last, keeper, kept, .. } = hooks;
        let params = setup.trainer.params()?;
        Ok(Trained { setup, history, diverged: ran.diverged, last, params, keeper, kept })
    }

    fn finish(&self, trained: Trained) -> Result<Ending> {
        let args = self;
        let Trained { setup, history, mut diverged, last, params, keeper, kept } = trained;
        let Setup {
            mut display,
            schema,
            delimiter,
            header,
            width,
            data,
            backend,
            shape,
            stats,
            baseline_mae,
            old_mae,
            warnings,
            untrained_mse,
            ..
        } = setup;
        let interrupted = diverged.is_none() && history.len() < args.epochs;
        if diverged.is_none() && !params.all_finite() {
            diverged = Some(Divergence { epoch: history.len(), what: "parameters" });
        }
        // With --val-split the epoch --keep chose, else the last one if it did not diverge; and what became
        // of --out.
        let (chosen, outcome) = match &keeper {
            Some(keeper) => (kept, keeper.outcome(&args.run.out, "val MAE")),
            None => {
                let final_mae = last.map(|e| e.mae).filter(|_| diverged.is_none());
                let better = final_mae.is_some_and(|m| old_mae.is_none_or(|b| m <= b));
                let outcome = run::write_once_outcome(
                    &args.run.out,
                    better,
                    final_mae.map(|m| format!("test MAE {m:.4}")),
                    old_mae.map(|b| format!("{b:.4}")),
                );
                (better.then(|| (params, last.expect("a better run has an epoch"))), outcome)
            }
        };
        // A model no better than predicting the training mean learned nothing, and is not written.
        let not_learned = chosen.as_ref().map(|(_, e)| e.mae).filter(|&mae| mae >= baseline_mae);
        let chosen = chosen.filter(|_| not_learned.is_none());
        let outcome = match not_learned {
            Some(_) => run::write_once_outcome(&args.run.out, false, None, None),
            None => outcome,
        };
        let lr = report::decimal(args.optim.config()?.lr).to_string();
        let failed = not_learned.filter(|_| !interrupted && diverged.is_none()).map(|mae| {
            let loss = (untrained_mse, last.map_or(untrained_mse, |e| e.mse));
            let advice = run::retry_advice(data.train.rows, "row", "--split, --val-split", loss, &lr, "more --epochs");
            run::not_learned(
                &format!("its test MAE {mae:.4} is no better than predicting the training mean ({baseline_mae:.4})"),
                &outcome,
                &advice,
            )
        });
        let written = chosen.is_some();
        let kept_eval = chosen.as_ref().map(|(_, e)| *e);
        if let Some((params, _)) = chosen {
            let model = SalesModel {
                params,
                stats,
                schema,
                delimiter,
                header,
                width: Some(width),
                feature_names: data.feature_names.clone(),
                target_name: data.target_name.clone(),
                vocabularies: data.vocabularies.clone(),
            };
            modelfile::save(&model, &args.run.out)?;
        }
        // A run that wrote nothing says so in its error line.
        if written && diverged.is_none() {
            display.line(&outcome);
        }

        let history_len = history.len();
        let kept_epoch = match &keeper {
            Some(keeper) => keeper.kept_epoch(),
            None => written.then_some(history_len),
        };
        let mut ending = Ending {
            report: None,
            json: args.run.json,
            board: display.take_board(),
            diverged,
            interrupted: interrupted.then(|| format!("after epoch {history_len} of {}", args.epochs)),
            failed,
            written,
            outcome,
            remedy: "try a lower --lr".into(),
            plot_failed: crate::harness::plot::training_curves(
                args.run.plot.as_deref(),
                &format!(
                    "textnet sales on {}: {} features → {} hidden (ReLU) → {}; {}, batch {}",
                    data.source,
                    shape.inputs,
                    shape.hidden,
                    data.target_name,
                    args.optim.config()?.describe(),
                    args.batch
                ),
                &history,
                &display,
            ),
        };
        if args.run.json || args.run.tensorboard.is_some() {
            let final_metrics = kept_eval.map(|eval| {
                let mut figures = serde_json::Map::new();
                figures.insert("test_mae".into(), json!(eval.mae));
                figures.insert("test_mse".into(), json!(eval.mse));
                figures.insert("baseline_mae".into(), json!(baseline_mae));
                if let Some((_, val_mae)) = keeper.as_ref().and_then(|k| k.kept) {
                    figures.insert("val_mae".into(), json!(val_mae));
                }
                figures
            });
            let o = args.optim.config()?;
            ending.report = Some(Report {
                textnet: report::VERSION,
                command: "sales",
                status: ending.status(),
                config: sales_config(
                    json!({
                        "keep": args.keep.name(),
                        "val_split": args.val_split,
                        "resume": args.resume.as_ref().map(|p| p.display().to_string()),
                        "hidden": shape.hidden,
                        "epochs": args.epochs,
                        "batch": args.batch,
                        "split": args.split,
                        "split_order": args.split_order.name(),
                    }),
                    &[&args.run, &OptimArgs::of(&o), &args.schedule],
                ),
                device: report::DeviceFields::of(&backend),
                data: json!({
                    "file": data.source,
                    "train_samples": data.train.rows,
                    "val_samples": data.val.rows,
                    "test_samples": data.test.rows,
                    "skipped_rows": data.skipped,
                    "features": data.feature_names,
                    "target": data.target_name,
                    "warnings": warnings,
                }),
                parameters: shape.param_count(),
                epochs: history,
                final_metrics,
                model: args.run.out.display().to_string(),
                kept_epoch,
                baseline_val_loss: keeper.as_ref().and_then(|k| k.baseline),
                diverged: ending.diverged.clone(),
            });
        }
        Ok(ending)
    }
}

/// What a run on `rows` rows of `features` features (`copies` f32 copies of them at once) and a model
/// of `hidden` units needs in memory, counted before it is allocated (an allocation that fails aborts).
/// The report's `config`, which for `sales` has never listed `overwrite` or `momentum` (its shape is
/// pinned by `tests/it/cli_report.rs`).
fn sales_config(own: serde_json::Value, groups: &[&dyn report::FlagGroup]) -> serde_json::Value {
    let mut config = report::with_flags(own, groups);
    if let Some(entries) = config.as_object_mut() {
        entries.remove("overwrite");
        entries.remove("momentum");
    }
    config
}

fn feature_memory(rows: usize, features: usize, copies: u64, hidden: usize, fewer_rows: &'static str) -> MemoryNeed {
    let parameters = SalesShape { inputs: features, hidden }.param_count() as u64;
    let values = (rows as u64).saturating_mul(features as u64);
    MemoryNeed {
        parts: vec![
            ("the one-hot feature rows", values.saturating_mul(4 * copies), fewer_rows),
            // Parameters, gradients and the optimizer's two moments.
            ("the model", parameters.saturating_mul(16), "--hidden"),
        ],
    }
}

/// Refuses a training table whose one-hot feature rows would not fit in memory, naming the categorical
/// column with the most levels: an identifier given as one has a level per row.
fn check_feature_memory(table: &Table, hidden: usize) -> Result<()> {
    let levels: usize = table.levels.iter().map(Vec::len).sum();
    let dates: usize = table.date_features.iter().map(|f| f.count()).sum();
    let features = table.columns.numeric.len() + levels + dates;
    // Copies of the rows at once: the split's, the trainer's standardised (on a GPU: staged) one, and the
    // test rows' for a model at --out.
    let need = feature_memory(table.rows.len(), features, 3, hidden, "--categorical (fewer or narrower columns)");
    need.check(available_memory()).map_err(|e| {
        let widest = table.columns.categorical.iter().zip(&table.levels).max_by_key(|(_, levels)| levels.len());
        let culprit = widest.map_or(String::new(), |(c, levels)| {
            format!(
                "; the categorical column {:?} alone has {} levels (a column with a level per row, such as an \
                 identifier, does not belong in --categorical)",
                c.name,
                levels.len()
            )
        });
        anyhow!("{}: {} rows × {features} features: {e}{culprit}", table.source, table.rows.len())
    })
}

/// The sales model already at `out` (anything else there is refused).
fn existing_out(out: &Path) -> Result<Option<SalesModel>> {
    fsutil::existing_model(out, "sales", modelfile::from_bytes)
}

/// `--model M --predict NEW`: one line per good row of NEW, its file line and the prediction in the
/// target's units; the MAE over the rows that give the target.
fn predict(args: &SalesArgs, model_path: &Path, new: &Path) -> Result<()> {
    let _lock = match &args.predictions {
        Some(path) => Some(fsutil::check_data_output("--predictions", path, &[("model", model_path), ("table", new)])?),
        None => None,
    };
    let m = modelfile::load(model_path)?;
    let mut options = LoadOptions::new(m.schema.clone());
    options.delimiter = Some(m.delimiter);
    options.header = if m.header { HeaderMode::Present } else { HeaderMode::Absent };
    options.skip_bad_rows = args.skip_bad_rows;
    options.width = m.width;
    options.target_optional = true;
    let table = Table::read(new, &options)?;
    if table.rows.is_empty() {
        bail!("{}: no usable rows to predict", new.display());
    }
    // The feature rows and their standardised copy.
    let SalesShape { inputs, hidden } = m.params.shape;
    feature_memory(table.rows.len(), inputs, 2, hidden, "the rows of --predict (predict them in parts)")
        .check(available_memory())
        .map_err(|e| anyhow!("{}: {e}", new.display()))?;
    let split = Split::of_rows(&table, &table.rows, &m.vocabularies);
    if split.features != m.params.shape.inputs {
        bail!("{} gives {} features but the model takes {}", new.display(), split.features, m.params.shape.inputs);
    }
    let x = m.stats.normalize(&split);
    let mut out = String::from("line\tprediction\n");
    let (mut with_target, mut error_sum) = (0usize, 0f64);
    let predictions = model::predict(&m.params, &x.x)?;
    for (i, &prediction) in predictions.iter().enumerate() {
        let y = m.stats.target_value(prediction);
        out += &format!("{}\t{y}\n", split.lines[i]);
        if split.y[i].is_finite() {
            with_target += 1;
            error_sum += (y as f64 - split.y[i] as f64).abs();
        }
    }
    match &args.predictions {
        Some(path) => fsutil::write_atomic(path, out.as_bytes())?,
        None => crate::harness::console::out(out.trim_end()),
    }
    if table.skipped > 0 && !args.run.quiet {
        crate::harness::console::err(&format!(
            "skipped {} bad row{}",
            table.skipped,
            if table.skipped == 1 { "" } else { "s" }
        ));
    }
    if with_target > 0 && !args.run.quiet {
        let mae = error_sum / with_target as f64;
        crate::harness::console::err(&format!("MAE over {with_target} rows with a {}: {mae:.4}", m.target_name));
    }
    Ok(())
}
