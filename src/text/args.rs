//! The flags of `textnet train`, with the checks that need no data, and the plan they make on a device:
//! the learning rate, batch and epochs with the GPU's or the CPU's defaults filled in.

use super::model::TextShape;
use super::tokenizer::Tokenizer;
use crate::device::precision::Precision;
use crate::harness::args::{RunArgs, ScheduleArgs, run_out};
use crate::harness::checkpoint::Keep;
use crate::harness::report;
use crate::ops::optim::{OptimConfig, OptimKind};
use anyhow::{Result, bail};
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
#[command(mut_arg(
    "out",
    run_out(
        "textnet.safetensors",
        "Where to write the model (.safetensors); it is written after every epoch that --keep keeps"
    )
))]
/// The flags of `textnet train`.
pub struct TrainArgs {
    /// UTF-8 text file to train on, `-` for standard input (other encodings are rejected, naming the first
    /// invalid byte)
    pub corpus: PathBuf,
    #[command(flatten)]
    /// The run flags (`--out`, `--seed`, `--device`, `--json`, ...).
    pub run: RunArgs,
    /// Which epoch the model file holds: the one of lowest validation loss, or the last
    #[arg(long, value_enum, default_value_t = Keep::Best)]
    pub keep: Keep,
    /// Go on training this model file on CORPUS, with its vocabulary, tokenizer and shape (which is why
    /// --max-vocab, --context, --embed, --hidden and --keep-case cannot be given with it)
    #[arg(long, value_name = "MODEL", conflicts_with_all = ["max_vocab", "context", "embed", "hidden", "keep_case"])]
    pub resume: Option<PathBuf>,
    #[arg(long, default_value_t = 8192, help = "Vocabulary size cap, <unk> included; rarer tokens become <unk>")]
    /// Vocabulary size cap, `<unk>` included; rarer tokens become `<unk>`.
    pub max_vocab: usize,
    /// Context tokens per prediction (N)
    #[arg(long, default_value_t = 3)]
    pub context: usize,
    /// Embedding width (D)
    #[arg(long, default_value_t = 64)]
    pub embed: usize,
    /// Hidden layer width (H)
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// SGD learning rate (single samples: 0.01-0.02 did best on the Shakespeare corpus at the default size;
    /// 0.1 is worse). With --batch B, B times this keeps an epoch's progress (a step averages B samples)
    /// [default: 0.02; on the CPU 0.01 × the batch: 2.56 for its default batch of 256, 0.64 for --batch 64]
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f32>,
    /// Optimizer: sgd is fused into the step kernels (single samples at full speed); momentum and adam take
    /// every step through the batched kernels and the shared update, with --lr as their learning rate
    /// (Adam wants about 1e-3)
    #[arg(long, value_enum, default_value_t = OptimKind::Sgd)]
    pub optim: OptimKind,
    /// Momentum μ of --optim momentum [default: 0.9]
    #[arg(long, allow_negative_numbers = true)]
    pub momentum: Option<f32>,
    /// L2 weight decay of --optim momentum or adam, added to the gradient as wd·θ
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub weight_decay: f32,
    #[command(flatten)]
    /// The learning-rate schedule (`--lr-schedule`, `--warmup`, `--min-lr`).
    pub schedule: ScheduleArgs,
    /// Passes over the training samples [default: 5; on the CPU: 3]
    #[arg(short = 'e', long)]
    pub epochs: Option<usize>,
    /// Samples per SGD step. On the CPU, given neither --batch nor --lr, steps of 256 samples at lr 2.56
    /// (single samples would take hours there); given either, the other takes its GPU default
    /// [default: 1; on the CPU: 256]
    #[arg(long)]
    pub batch: Option<usize>,
    /// Shuffle the training samples each epoch (the default; seeded by --seed)
    #[arg(long, overrides_with = "no_shuffle")]
    // Only so that `--shuffle` can be written: the last of the two flags wins, and `no_shuffle` says which.
    pub shuffle: bool,
    /// Train on the samples in corpus order
    #[arg(long, overrides_with = "shuffle")]
    pub no_shuffle: bool,
    /// Keep upper case (by default all text is lowercased; the model remembers which)
    #[arg(long)]
    pub keep_case: bool,
    /// Use only the first N tokens of the corpus (the vocabulary is built from them too)
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Validate on at most N samples, spread evenly over the held-out last 10% (0 = all of them)
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    pub val_max: usize,
    /// The arithmetic of the three vocabulary-sized products (logits, ∂W2, ∂h): fp32, or bf16 operands on
    /// the tensor cores with fp32 sums, weights, softmax and updates (every step then takes the batched
    /// kernels; pays from --batch 64). The CPU runs bf16 as its twin for SGD; tf32 is not offered
    #[arg(long, value_enum, default_value_t)]
    pub precision: Precision,
    /// Print an epoch's line only every N epochs (and the first and last), for long runs
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub log_every: usize,
}

impl TrainArgs {
    pub(super) fn validate(&self) -> Result<()> {
        for (flag, value, least) in [
            ("--max-vocab", self.max_vocab, 2),
            ("--context", self.context, 1),
            ("--embed", self.embed, 1),
            ("--hidden", self.hidden, 1),
            ("--batch", self.batch.unwrap_or(1), 1),
            ("--max-tokens", self.max_tokens.unwrap_or(1), 1),
        ] {
            if value < least {
                bail!("{flag} must be at least {least}, got {value}");
            }
        }
        if let Some(epochs) = self.epochs {
            crate::io::resources::check_epochs(epochs)?;
        }
        if let Some(lr) = self.lr.filter(|lr| !(lr.is_finite() && *lr > 0.0)) {
            bail!("--lr must be a positive finite number, got {lr}");
        }
        if self.run.out.is_dir() {
            bail!("--out {} is a directory; give a file name", self.run.out.display());
        }
        self.optim_config(self.lr.unwrap_or(DEFAULT_LR)).validate()?;
        if self.momentum.is_some() && self.optim != OptimKind::Momentum {
            bail!("--momentum applies to --optim momentum only (this run uses --optim {})", self.optim.name());
        }
        super::check_precision(self.precision)?;
        if self.weight_decay != 0.0 && self.optim == OptimKind::Sgd {
            bail!("--weight-decay applies to --optim momentum and adam (the fused SGD update has none)");
        }
        Ok(())
    }

    /// The update the flags ask for, at learning rate `lr`.
    pub(super) fn optim_config(&self, lr: f32) -> OptimConfig {
        let mut config = OptimConfig { lr, weight_decay: self.weight_decay, ..OptimConfig::new(self.optim) };
        if let Some(momentum) = self.momentum {
            config.momentum = momentum;
        }
        config
    }

    /// The flags with the defaults of the device the run trains on filled in.
    pub(super) fn plan(&self, on_cpu: bool) -> Plan {
        let cpu_rule = on_cpu && self.lr.is_none() && self.optim == OptimKind::Sgd;
        let cpu_default = cpu_rule && self.batch.is_none();
        let batch = self.batch.unwrap_or(if cpu_default { CPU_BATCH } else { 1 });
        let lr = match self.lr {
            Some(lr) => lr,
            None if cpu_rule && batch > 1 => CPU_LR_PER_SAMPLE * batch as f32,
            None => DEFAULT_LR,
        };
        let epochs = self.epochs.unwrap_or(if on_cpu { CPU_EPOCHS } else { DEFAULT_EPOCHS });
        Plan { lr, batch, epochs, cpu_default, cpu_rule: cpu_rule && batch > 1 }
    }

    pub(super) fn config_json(&self, shape: TextShape, tokenizer: Tokenizer, plan: &Plan) -> serde_json::Value {
        report::with_flags(
            json!({
                "corpus": self.corpus.display().to_string(),
                "keep": self.keep.name(),
                "resume": self.resume.as_ref().map(|p| p.display().to_string()),
                "max_vocab": self.max_vocab,
                "context": shape.context,
                "embed": shape.embed,
                "hidden": shape.hidden,
                "lr": report::decimal(plan.lr),
                "optim": self.optim.name(),
                "weight_decay": report::decimal(self.weight_decay),
                "epochs": plan.epochs,
                "batch": plan.batch,
                "shuffle": !self.no_shuffle,
                "keep_case": !tokenizer.lowercase,
                "max_tokens": self.max_tokens,
                "val_max": self.val_max,
                "precision": self.precision.name(),
            }),
            &[&self.run, &self.schedule],
        )
    }
}

/// The single-sample default learning rate.
pub(super) const DEFAULT_LR: f32 = 0.02;

/// The default number of epochs on a GPU.
pub(super) const DEFAULT_EPOCHS: usize = 5;

/// The CPU's defaults. Single-sample SGD runs at about 600 samples a second there (over two hours for
/// the corpus's five epochs on 2 cores); SGD steps of 256 samples at 256 × 0.01 run on every core at thousands
/// a second and follow the single-sample run's validation loss epoch for epoch, so three epochs reach
/// about the loss the GPU's five do (BENCHMARKS.md, "CPU fallback").
pub(super) const CPU_BATCH: usize = 256;

/// The CPU's SGD learning rate per sample of a batch: 2.56 for its batch of 256.
pub(super) const CPU_LR_PER_SAMPLE: f32 = 0.01;

pub(super) const CPU_EPOCHS: usize = 3;

/// What a run trains with: the flags, with the defaults of its device filled in.
#[derive(Clone, Copy, Debug)]
pub(super) struct Plan {
    pub(super) lr: f32,
    pub(super) batch: usize,
    pub(super) epochs: usize,
    /// The CPU's own batch and learning rate (neither --batch nor --lr given on the CPU).
    pub(super) cpu_default: bool,
    /// The learning rate is the CPU's rule for the batch (SGD batches on the CPU without --lr).
    pub(super) cpu_rule: bool,
}
