//! The flags of `textnet sales` (`SalesArgs`) and of the columns of its table (`ColumnArgs`, shared with
//! `bench sales`), with the checks that need no data.

use super::infer::{self, Inferred, Overrides};
use super::model::{self, DEFAULT_BATCH, DEFAULT_EPOCHS, DEFAULT_HIDDEN};
use super::table::ColumnSpec;
use crate::datasets::features::SplitOrder;
use crate::harness::args::{OptimArgs, RunArgs, ScheduleArgs, run_out};
use crate::harness::checkpoint::{self, Keep};
use anyhow::{Result, bail};
use std::path::PathBuf;

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

impl SalesArgs {
    /// Refuses flags out of range, before the table is read.
    pub(super) fn check(&self) -> Result<()> {
        let args = self;
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
        checkpoint::check_val_split(args.val_split, args.keep)
    }
}
