//! `textnet sales FILE`: train the regressor on a table and write the model; `textnet sales --model M
//! --predict NEW` writes its predictions for new rows. What it prints goes through `report`, as for every
//! training command.

use super::data::{Dataset, Split, SplitOrder, Stats};
use super::gpu::GpuSales;
use super::model::{self, DEFAULT_BATCH, DEFAULT_EPOCHS, DEFAULT_HIDDEN, Evaluation, SalesParams, SalesShape, Shuffle};
use super::modelfile::{self, SalesModel};
use super::table::{ColumnSpec, HeaderMode, LoadOptions, Schema, Table};
use super::train::{CpuSales, SalesTrainer};
use crate::checkpoint;
use crate::device::{self, Backend, DeviceChoice};
use crate::fsutil;
use crate::ops::optim::OptimArgs;
use crate::report::{self, Display, Divergence, EpochRow, Report};
use crate::resources::{MemoryNeed, available_memory};
use crate::run::{self, Ending, TrainingCommand};
use anyhow::{Result, anyhow, bail};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct SalesArgs {
    /// The table: tab- or comma-separated, with or without a header row (default schema: the roadmap's
    /// 10-column sales.tsv, see --target)
    #[arg(value_name = "FILE", required_unless_present = "model")]
    pub file: Option<PathBuf>,
    /// The column to predict, by header name or 1-based number [default: 9, total price, with the sales.tsv
    /// features]; giving any column flag replaces the default schema
    #[arg(long, value_name = "COLUMN")]
    pub target: Option<ColumnSpec>,
    /// Numeric feature columns (comma-separated names or numbers)
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',')]
    pub numeric: Vec<ColumnSpec>,
    /// Categorical feature columns, one-hot over the values seen in training
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',')]
    pub categorical: Vec<ColumnSpec>,
    /// Date columns, each a day-of-year feature
    #[arg(long, value_name = "COLUMNS", value_delimiter = ',')]
    pub date: Vec<ColumnSpec>,
    /// Skip bad rows (wrong column count, non-numbers, empty fields, NaN or inf, unreadable dates) and
    /// report how many, instead of stopping at the first
    #[arg(long)]
    pub skip_bad_rows: bool,
    /// Share of the rows that trains; the rest tests
    #[arg(long, default_value_t = super::table::DEFAULT_TRAIN_FRACTION)]
    pub split: f64,
    /// Which rows train: the first --split of a shuffle of them seeded by --seed, or of the file as it is
    #[arg(long, value_enum, default_value_t)]
    pub split_order: SplitOrder,
    /// Hidden units
    #[arg(long, default_value_t = DEFAULT_HIDDEN)]
    pub hidden: usize,
    #[command(flatten)]
    pub optim: OptimArgs,
    /// Rows per optimizer step (the loss is the batch mean)
    #[arg(long, default_value_t = DEFAULT_BATCH)]
    pub batch: usize,
    /// Passes over the training rows
    #[arg(long, default_value_t = DEFAULT_EPOCHS)]
    pub epochs: usize,
    /// Seed of the initial parameters, of the train/test split and of the row order
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to train (on the GPU one block runs each epoch)
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Where to write the model (.safetensors); a sales model of the same features already there is
    /// replaced only by one with a lower test MAE
    #[arg(long, default_value = "sales.safetensors")]
    pub out: PathBuf,
    #[arg(long, help = crate::checkpoint::OVERWRITE_HELP)]
    pub overwrite: bool,
    /// Predict with this model file instead of training (with --predict)
    #[arg(long, value_name = "M", requires = "predict")]
    pub model: Option<PathBuf>,
    /// The table to predict, laid out as the training file (the target column too: any number, e.g. 0,
    /// where it is unknown)
    #[arg(long, value_name = "NEW", requires = "model")]
    pub predict: Option<PathBuf>,
    /// Where --predict writes its TSV (line, prediction); default stdout
    #[arg(long, value_name = "FILE", requires = "predict")]
    pub predictions: Option<PathBuf>,
    /// Print errors only (the --json report still comes)
    #[arg(long)]
    pub quiet: bool,
    /// Print one JSON report on stdout at the end (the other lines go to stderr)
    #[arg(long)]
    pub json: bool,
}

fn schema(args: &SalesArgs) -> Result<Schema> {
    let custom = !(args.numeric.is_empty() && args.categorical.is_empty() && args.date.is_empty());
    match (&args.target, custom) {
        (None, false) => Ok(Schema::sales_tsv()),
        (None, true) => bail!("--numeric, --categorical and --date describe another table: name its --target too"),
        (Some(_), false) => {
            bail!("--target needs the features too: at least one of --numeric, --categorical or --date")
        }
        (Some(target), true) => Ok(Schema {
            target: target.clone(),
            numeric: args.numeric.clone(),
            categorical: args.categorical.clone(),
            date: args.date.clone(),
            column_names: None,
        }),
    }
}

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
    data: Dataset,
    backend: Backend,
    shape: SalesShape,
    trainer: Box<dyn SalesTrainer>,
    stats: Stats,
    baseline_mae: f64,
    /// The test MAE of the sales model already at --out, which a run must match to replace it.
    old_mae: Option<f64>,
}

/// What `train` hands to `finish`.
pub struct Trained {
    setup: Setup,
    history: Vec<EpochRow>,
    diverged: Option<Divergence>,
    last: Option<Evaluation>,
    params: SalesParams,
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
        crate::resources::check_epochs(args.epochs)?;
        if !(args.split > 0.0 && args.split < 1.0) {
            bail!("--split must be between 0 and 1 (exclusive), got {}", args.split);
        }
        let optim = args.optim.config()?;
        let lock = fsutil::check_output(&args.out, &[("table", &file)])?;
        let existing = existing_out(&args.out)?.filter(|_| !args.overwrite);
        let mut options = LoadOptions::new(schema(args)?);
        options.skip_bad_rows = args.skip_bad_rows;
        options.train_fraction = args.split;
        let bytes = fsutil::read_input(&file, "table")?;
        let table = Table::parse(&fsutil::shown(&file), &bytes, &options).map_err(|e| match &args.target {
            Some(_) => e,
            None => anyhow!(
                "{e:#} (without --target the 10-column sales.tsv schema is assumed; for another table give --target and its \
                 feature columns)"
            ),
        })?;
        check_feature_memory(&table, args.hidden)?;
        let data = Dataset::from_table(&table, args.split, args.split_order, args.seed)?;
        let display = Display::new(args.quiet, args.json, args.epochs);
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
            return Err(checkpoint::other_data(&args.out, "a sales model of other features or target"));
        }
        let (backend, device_line) = device::select_described(args.device)?;
        let shape = SalesShape { inputs: data.features(), hidden: args.hidden };
        let params = SalesParams::init(shape, args.seed);
        display.line(&format!(
            "{}: {} training and {} test rows ({}), {} features → {} hidden (ReLU) → {}; {} parameters, MSE \
             on standardised values",
            data.source,
            data.train.rows,
            data.test.rows,
            match args.split_order {
                SplitOrder::Shuffled => "rows shuffled by the seed",
                SplitOrder::File => "in file order",
            },
            shape.inputs,
            shape.hidden,
            data.target_name,
            shape.param_count(),
        ));
        display.line(&format!(
            "{}, batch {}, {} epoch{}, seed {}; device {device_line}",
            optim.describe(),
            args.batch,
            args.epochs,
            if args.epochs == 1 { "" } else { "s" },
            args.seed
        ));

        let trainer: Box<dyn SalesTrainer> = match &backend {
            Backend::Cpu => Box::new(CpuSales::new(&data, params, optim)?),
            Backend::Cuda(gpu) => Box::new(GpuSales::new(gpu.clone(), &data, params, optim)?),
        };
        let stats = trainer.stats().clone();
        let baseline_mae = data.test.y.iter().map(|&y| (y as f64 - stats.target_mean as f64).abs()).sum::<f64>()
            / data.test.rows as f64;
        display.line(&format!("baseline test MAE (predicting the training mean): {baseline_mae:.4}"));
        let old_mae = match &existing {
            Some(old) => {
                let mae = model::evaluate(&old.params, &old.stats.normalize(&data.test), &old.stats).mae;
                let mae = checkpoint::baseline(&args.out, mae, "test MAE")?;
                display.line(&format!(
                    "--out {} already holds a model of test MAE {mae:.4} on this split; only a better one replaces it",
                    args.out.display()
                ));
                Some(mae)
            }
            None => None,
        };
        Ok(Setup {
            _lock: lock,
            display,
            schema: options.schema,
            delimiter: table.delimiter,
            header: table.header.is_some(),
            data,
            backend,
            shape,
            trainer,
            stats,
            baseline_mae,
            old_mae,
        })
    }

    fn train(&self, mut setup: Setup) -> Result<Trained> {
        let args = self;
        let Setup { ref mut display, ref mut trainer, ref data, .. } = setup;
        let rows = data.train.rows;
        let mut shuffle = Shuffle::new(rows, args.seed);
        let mut history = Vec::with_capacity(args.epochs);
        let mut diverged = None;
        let mut last = None;
        let started = Instant::now();
        for epoch in 1..=args.epochs {
            display.epoch_started(epoch, rows);
            let epoch_start = Instant::now();
            let loss = trainer.train_epoch(shuffle.next_epoch(), args.batch)? / rows as f64;
            display.reached(rows);
            let eval = trainer.evaluate_test()?;
            if !loss.is_finite() || !eval.mse.is_finite() {
                diverged =
                    Some(Divergence { epoch, what: if loss.is_finite() { "test error" } else { "training loss" } });
                break;
            }
            let row = EpochRow {
                epoch,
                train_loss: loss,
                val_loss: None,
                val_accuracy: None,
                test_loss: Some(eval.mse),
                test_accuracy: None,
                samples_per_s: rows as f64 / epoch_start.elapsed().as_secs_f64().max(1e-9),
                elapsed_s: started.elapsed().as_secs_f64(),
                extra: Default::default(),
            }
            .with("test_mae", eval.mae);
            display.epoch_finished(&row, &format!("test MSE {:.4}, test MAE {:.4}", eval.mse, eval.mae), "");
            history.push(row);
            last = Some(eval);
            if crate::interrupt::requested() {
                break;
            }
        }
        let params = trainer.params()?;
        Ok(Trained { setup, history, diverged, last, params })
    }

    fn finish(&self, trained: Trained) -> Result<Ending> {
        let args = self;
        let Trained { setup, history, mut diverged, last, params } = trained;
        let Setup { display, schema, delimiter, header, data, backend, shape, stats, baseline_mae, old_mae, .. } =
            setup;
        let interrupted = diverged.is_none() && history.len() < args.epochs;
        if diverged.is_none() && !params.all_finite() {
            diverged = Some(Divergence { epoch: history.len(), what: "parameters" });
        }
        let final_mae = last.map(|e| e.mae);
        let written = diverged.is_none() && final_mae.is_some_and(|m| old_mae.is_none_or(|b| m <= b));
        let outcome = run::write_once_outcome(
            &args.out,
            written,
            final_mae.filter(|_| diverged.is_none()).map(|m| format!("test MAE {m:.4}")),
            old_mae.map(|b| format!("{b:.4}")),
        );
        if written {
            let model = SalesModel {
                params,
                stats,
                schema,
                delimiter,
                header,
                feature_names: data.feature_names.clone(),
                target_name: data.target_name.clone(),
                vocabularies: data.vocabularies.clone(),
            };
            modelfile::save(&model, &args.out)?;
        }
        display.line(&outcome);

        let history_len = history.len();
        let mut ending = Ending {
            report: None,
            diverged,
            interrupted: interrupted.then(|| format!("after epoch {history_len} of {}", args.epochs)),
            failed: None,
            written,
            outcome,
            remedy: "try a lower --lr".into(),
        };
        if args.json {
            let final_metrics = written.then(|| {
                let mut figures = serde_json::Map::new();
                figures.insert("test_mae".into(), json!(final_mae));
                figures.insert("test_mse".into(), json!(last.map(|e| e.mse)));
                figures.insert("baseline_mae".into(), json!(baseline_mae));
                figures
            });
            let o = args.optim.config()?;
            ending.report = Some(Report {
                textnet: report::VERSION,
                command: "sales",
                status: ending.status(),
                config: json!({
                    "out": args.out.display().to_string(),
                    "keep": "last",
                    "hidden": args.hidden,
                    "optim": o.kind.name(),
                    "lr": report::decimal(o.lr),
                    "weight_decay": report::decimal(o.weight_decay),
                    "clip_norm": report::decimal(o.clip_norm),
                    "epochs": args.epochs,
                    "batch": args.batch,
                    "seed": args.seed,
                    "split": args.split,
                    "split_order": args.split_order.name(),
                    "device": report::flag_value(&args.device),
                }),
                device: backend.describe(),
                data: json!({
                    "file": data.source,
                    "train_samples": data.train.rows,
                    "val_samples": 0,
                    "test_samples": data.test.rows,
                    "skipped_rows": data.skipped,
                    "features": data.feature_names,
                    "target": data.target_name,
                }),
                parameters: shape.param_count(),
                epochs: history,
                final_metrics,
                model: args.out.display().to_string(),
                kept_epoch: written.then_some(history_len),
                baseline_val_loss: None,
                diverged: ending.diverged.clone(),
            });
        }
        Ok(ending)
    }
}

/// What a run on `rows` rows of `features` features (`copies` f32 copies of them at once) and a model
/// of `hidden` units needs in memory, counted before it is allocated (an allocation that fails aborts).
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
    let features = table.columns.numeric.len() + levels + table.columns.date.len();
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

fn delimiter_name(delimiter: u8) -> &'static str {
    if delimiter == b'\t' { "tab-separated" } else { "comma-separated" }
}

/// How `path`'s first line is separated, when by the other of tab and comma than `expected` alone.
fn other_delimiter(path: &Path, expected: u8) -> Option<&'static str> {
    let file = fsutil::open_input(path, "table").ok()?;
    let mut first = Vec::new();
    std::io::BufRead::read_until(&mut std::io::BufReader::new(std::io::Read::take(file, 1 << 20)), b'\n', &mut first)
        .ok()?;
    let other = if expected == b'\t' { b',' } else { b'\t' };
    (first.contains(&other) && !first.contains(&expected)).then(|| delimiter_name(other))
}

/// The sales model already at `out` (anything else there is refused).
fn existing_out(out: &Path) -> Result<Option<SalesModel>> {
    fsutil::existing_model(out, "sales", modelfile::from_bytes)
}

/// `--model M --predict NEW`: one line per good row of NEW, its file line and the prediction in the
/// target's units.
fn predict(args: &SalesArgs, model_path: &Path, new: &Path) -> Result<()> {
    let _lock = match &args.predictions {
        Some(path) => Some(check_predictions(path, model_path, new)?),
        None => None,
    };
    let m = modelfile::load(model_path)?;
    let mut options = LoadOptions::new(m.schema.clone());
    options.delimiter = Some(m.delimiter);
    options.header = if m.header { HeaderMode::Present } else { HeaderMode::Absent };
    options.skip_bad_rows = args.skip_bad_rows;
    let table = Table::read(new, &options).map_err(|e| match other_delimiter(new, m.delimiter) {
        Some(theirs) => anyhow!(
            "{}: the model reads {} rows but this file is {theirs}; write it as the model's training table was",
            new.display(),
            delimiter_name(m.delimiter)
        ),
        None => e,
    })?;
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
    for i in 0..x.rows {
        let y = m.stats.target_value(model::predict(&m.params, x.row(i)));
        out += &format!("{}\t{y}\n", split.lines[i]);
    }
    match &args.predictions {
        Some(path) => fsutil::write_atomic(path, out.as_bytes())?,
        None => crate::console::out(out.trim_end()),
    }
    if table.skipped > 0 && !args.quiet {
        crate::console::err(&format!("skipped {} bad row{}", table.skipped, if table.skipped == 1 { "" } else { "s" }));
    }
    Ok(())
}

/// Checks `--predictions` before any work (see `fsutil::check_output`), and refuses a model file there:
/// predictions never replace a model.
fn check_predictions(path: &Path, model_path: &Path, new: &Path) -> Result<fsutil::OutputLock> {
    let lock = fsutil::check_output_named("--predictions", path, &[("model", model_path), ("table", new)])?;
    let is_model = std::fs::metadata(path).is_ok_and(|m| m.len() > 0)
        && fsutil::read_input(path, "file").is_ok_and(|b| safetensors::SafeTensors::read_metadata(&b).is_ok());
    if is_model {
        bail!(
            "--predictions {} holds a model file (safetensors); choose another file for the predictions",
            path.display()
        );
    }
    Ok(lock)
}
