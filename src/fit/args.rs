//! The flags of `textnet fit` (`FitArgs`) and of the table it trains on (`TableArgs`, shared with
//! `bench fit`), with the checks that need no data.

use super::data::Source;
use crate::datasets::features::SplitOrder;
use crate::datasets::infer::Overrides;
use crate::datasets::mnist::Dataset;
use crate::datasets::table::ColumnSpec;
use crate::harness::args::{OptimArgs, RunArgs, ScheduleArgs, run_out};
use crate::harness::checkpoint::{self, Keep};
use crate::nn::stack::model::{Init, Loss};
use anyhow::{Result, anyhow, bail};
use std::path::PathBuf;

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

impl FitArgs {
    pub(super) fn keep(&self) -> Keep {
        self.keep.unwrap_or(if self.patience.is_some() { Keep::Best } else { Keep::Last })
    }

    pub(super) fn source(&self) -> Result<Source> {
        match (&self.dataset, self.tabular.source()?) {
            (Some(dataset), None) => Ok(Source::Images { dataset: *dataset, dir: self.data.clone() }),
            (None, Some(table)) => Ok(table),
            _ => bail!("give the data to train on: --dataset mnist|fashion, or --table FILE --target COLUMN"),
        }
    }

    pub(super) fn check(&self) -> Result<()> {
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
