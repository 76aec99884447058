//! `textnet sales FILE`: train the regressor on a table (its schema inferred from `--target`, `infer`)
//! and write the model, or go on training one (`--resume`); `textnet sales --model M --predict NEW` writes
//! its predictions for new rows. What it prints goes through `report`, as for every training command.

use super::args::SalesArgs;
use super::data::{dataset, read_table};
use super::epochs::SalesEpochs;
use super::model::{self, Evaluation, SalesParams, SalesShape};
use super::modelfile::{self, SalesModel};
use super::predict::predict;
use super::table::Schema;
use super::train::FitSales;
use crate::datasets::features::{Dataset, Split, SplitOrder, Stats};
use crate::device::{self, Backend};
use crate::harness::checkpoint::{self, Keeper};
use crate::harness::report::{self, Display, Divergence, EpochRow};
use crate::harness::run::{self, Ending, EpochPlan, TEST, Trainer, TrainingCommand};
use crate::io::fsutil;
use crate::ops::optim::{LrSchedule, OptimConfig};
use anyhow::{Context, Result, bail};
use std::path::Path;

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
    pub(super) display: Display,
    pub(super) schema: Schema,
    pub(super) delimiter: u8,
    pub(super) header: bool,
    pub(super) width: usize,
    pub(super) data: Dataset,
    pub(super) backend: Backend,
    pub(super) shape: SalesShape,
    pub(super) trainer: FitSales,
    pub(super) stats: Stats,
    pub(super) baseline_mae: f64,
    /// The validation rows, standardised, with --val-split.
    pub(super) val: Option<Split>,
    /// The MAE a run must match to replace the model at --out (and to be written after --resume): of
    /// that model and of the resumed one, on the rows epochs are judged by (validation, else test).
    pub(super) old_mae: Option<f64>,
    /// The learning rate of every optimizer step of the run, epoch after epoch.
    pub(super) rates: Vec<f32>,
    /// The columns the inferred schema leaves out (`Inferred::warnings`), for the report.
    pub(super) warnings: Vec<String>,
    /// The test MSE before training, which a run that did not learn compares its last one with.
    pub(super) untrained_mse: f64,
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
        args.check()?;
        let optim = args.optim.config()?;
        let lock = lock_out(args, &file)?;
        let existing = existing_out(&args.run.out)?.filter(|_| !args.run.overwrite);
        let resumed = args.resume.as_deref().map(|path| modelfile::load(path).context("--resume")).transpose()?;
        let display = Display::new(args.run.quiet, args.run.json, args.epochs)
            .log_every(args.log_every)
            .tensorboard(args.run.tensorboard.as_deref())?;
        let (table, options, warnings) = read_table(args, &file, resumed.as_ref(), &display)?;
        let data = dataset(args, &table, resumed.as_ref(), &display)?;
        if let Some(old) = &existing
            && (old.feature_names != data.feature_names || old.target_name != data.target_name)
        {
            return Err(checkpoint::other_data(&args.run.out, "a sales model of other features or target"));
        }
        let (backend, device_line) = device::select_described(args.run.device)?;
        let params = match &resumed {
            Some(m) => m.params.clone(),
            None => SalesParams::init(SalesShape { inputs: data.features(), hidden: args.hidden }, args.run.seed),
        };
        let shape = params.shape;
        args.describe_data(&data, shape, &display);
        let schedule = args.schedule.schedule(optim.lr)?;
        let steps = data.train.rows.div_ceil(args.batch.max(1)) * args.epochs;
        schedule.check(steps)?;
        let rates = schedule.rates(optim.lr, steps);
        args.describe_training(&optim, &schedule, &device_line, &display);
        let mut trainer =
            FitSales::new(&backend, &data, params, optim, resumed.as_ref().map(|m| m.stats.clone()), args.batch)?;
        let untrained_mse = trainer.evaluate(TEST)?.mse;
        let stats = trainer.stats().clone();
        let baseline_mae = baseline_mae(&data, &stats, &display);
        let old_mae = old_mae(args, existing.as_ref(), resumed.as_ref(), &data, &display)?;
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
        let Trained { mut setup, history, mut diverged, last, params, keeper, kept } = trained;
        let interrupted = diverged.is_none() && history.len() < args.epochs;
        if diverged.is_none() && !params.all_finite() {
            diverged = Some(Divergence { epoch: history.len(), what: "parameters" });
        }
        let stopped = interrupted || diverged.is_some();
        let (chosen, outcome, failed) =
            args.chosen(&setup, keeper.as_ref(), kept, last, diverged.is_none().then_some(params), stopped)?;
        let written = chosen.is_some();
        let kept_eval = chosen.as_ref().map(|(_, e)| *e);
        if let Some((params, _)) = chosen {
            modelfile::save(&setup.model(params), &args.run.out)?;
        }
        // A run that wrote nothing says so in its error line.
        if written && diverged.is_none() {
            setup.display.line(&outcome);
        }
        let history_len = history.len();
        let kept_epoch = match &keeper {
            Some(keeper) => keeper.kept_epoch(),
            None => written.then_some(history_len),
        };
        let (data, shape) = (&setup.data, setup.shape);
        let title = format!(
            "textnet sales on {}: {} features → {} hidden (ReLU) → {}; {}, batch {}",
            data.source,
            shape.inputs,
            shape.hidden,
            data.target_name,
            args.optim.config()?.describe(),
            args.batch
        );
        let mut ending = Ending {
            report: None,
            json: args.run.json,
            board: setup.display.take_board(),
            diverged,
            interrupted: interrupted.then(|| format!("after epoch {history_len} of {}", args.epochs)),
            failed,
            written,
            outcome,
            remedy: "try a lower --lr".into(),
            plot_failed: crate::harness::plot::training_curves(
                args.run.plot.as_deref(),
                &title,
                &history,
                &setup.display,
            ),
        };
        if args.run.json || args.run.tensorboard.is_some() {
            let mut report = args.report(&setup, ending.status(), history, keeper.as_ref(), kept_eval, kept_epoch)?;
            report.diverged = ending.diverged.clone();
            ending.report = Some(report);
        }
        Ok(ending)
    }
}

/// A kept epoch's parameters and its test evaluation.
type Chosen = Option<(SalesParams, Evaluation)>;

impl SalesArgs {
    /// The model a run writes: with --val-split the epoch --keep chose, else the last one (`params`, none
    /// when the run diverged) where it matches the MAE of --out; none when it is no better than predicting
    /// the training mean, which learned nothing. Returns it, what became of --out, and the error line of a
    /// run that learned nothing though it was not `stopped` (interrupted or diverged).
    fn chosen(
        &self,
        setup: &Setup,
        keeper: Option<&Keeper>,
        kept: Chosen,
        last: Option<Evaluation>,
        params: Option<SalesParams>,
        stopped: bool,
    ) -> Result<(Chosen, String, Option<String>)> {
        let args = self;
        let (old_mae, baseline_mae) = (setup.old_mae, setup.baseline_mae);
        let (chosen, outcome) = match keeper {
            Some(keeper) => (kept, keeper.outcome(&args.run.out, "val MAE")),
            None => {
                let final_mae = last.map(|e| e.mae).filter(|_| params.is_some());
                let better = final_mae.is_some_and(|m| old_mae.is_none_or(|b| m <= b));
                let outcome = run::write_once_outcome(
                    &args.run.out,
                    better,
                    final_mae.map(|m| format!("test MAE {m:.4}")),
                    old_mae.map(|b| format!("{b:.4}")),
                );
                (params.zip(last).filter(|_| better), outcome)
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
        let failed = not_learned.filter(|_| !stopped).map(|mae| {
            let untrained_mse = setup.untrained_mse;
            let loss = (untrained_mse, last.map_or(untrained_mse, |e| e.mse));
            let advice =
                run::retry_advice(setup.data.train.rows, "row", "--split, --val-split", loss, &lr, "more --epochs");
            run::not_learned(
                &format!("its test MAE {mae:.4} is no better than predicting the training mean ({baseline_mae:.4})"),
                &outcome,
                &advice,
            )
        });
        Ok((chosen, outcome, failed))
    }
}

impl Setup {
    /// The model file of `params` trained on this table.
    fn model(&self, params: SalesParams) -> SalesModel {
        SalesModel {
            params,
            stats: self.stats.clone(),
            schema: self.schema.clone(),
            delimiter: self.delimiter,
            header: self.header,
            width: Some(self.width),
            feature_names: self.data.feature_names.clone(),
            target_name: self.data.target_name.clone(),
            vocabularies: self.data.vocabularies.clone(),
        }
    }
}

/// Locks --out and checks --plot against the files the run reads. The --resume model may be --out itself:
/// it is read whole before training, and replaced only by a better model.
fn lock_out(args: &SalesArgs, file: &Path) -> Result<fsutil::OutputLock> {
    let lock = fsutil::check_output(&args.run.out, &[("table", file)])?;
    let mut inputs = vec![("table", file)];
    inputs.extend(args.resume.as_deref().map(|m| ("--resume model", m)));
    crate::harness::plot::check(args.run.plot.as_deref(), Some(&args.run.out), &inputs)?;
    Ok(lock)
}

/// The test MAE of predicting the training mean, which a model must beat (said on `display`).
fn baseline_mae(data: &Dataset, stats: &Stats, display: &Display) -> f64 {
    let mae =
        data.test.y.iter().map(|&y| (y as f64 - stats.target_mean as f64).abs()).sum::<f64>() / data.test.rows as f64;
    display.line(&format!("baseline test MAE (predicting the training mean): {mae:.4}"));
    mae
}

/// The MAE a run must match to replace --out and to be written after --resume: the lower of the model at
/// --out's and the resumed model's, on the rows epochs are judged by (validation, else test).
fn old_mae(
    args: &SalesArgs,
    existing: Option<&SalesModel>,
    resumed: Option<&SalesModel>,
    data: &Dataset,
    display: &Display,
) -> Result<Option<f64>> {
    let (judged, judged_name) = if data.val.is_empty() { (&data.test, "test MAE") } else { (&data.val, "val MAE") };
    let mut old_mae = None;
    if let Some(old) = existing {
        let mae = checkpoint::baseline(&args.run.out, mae_of(old, judged)?, judged_name)?;
        display.line(&format!(
            "--out {} already holds a model of {judged_name} {mae:.4} on this split; only a better one replaces it",
            args.run.out.display()
        ));
        old_mae = Some(mae);
    }
    if let (Some(m), Some(path)) = (resumed, &args.resume) {
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
    Ok(old_mae)
}

impl SalesArgs {
    /// The line that says what the run trains on.
    fn describe_data(&self, data: &Dataset, shape: SalesShape, display: &Display) {
        let args = self;
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
    }

    /// The line that says how it trains.
    fn describe_training(&self, optim: &OptimConfig, schedule: &LrSchedule, device_line: &str, display: &Display) {
        let args = self;
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
    }
}

/// The sales model already at `out` (anything else there is refused).
fn existing_out(out: &Path) -> Result<Option<SalesModel>> {
    fsutil::existing_model(out, "sales", modelfile::from_bytes)
}
