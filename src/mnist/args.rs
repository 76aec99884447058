//! The flags of `textnet mnist`, with the checks that need no data.

use super::ModelKind;
use super::model::Activation;
use crate::datasets::mnist::Dataset;
use crate::harness::args::{OptimArgs, RunArgs, ScheduleArgs, run_out};
use crate::harness::checkpoint::Keep;
use anyhow::{Result, bail};
use std::path::PathBuf;

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

impl MnistArgs {
    /// Refuses flags out of range, before the data is read.
    pub(super) fn check(&self) -> Result<()> {
        let args = self;
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
}
