//! The flags every training command shares, flattened into each command (`#[command(flatten)]`): where
//! the run writes and what it prints (`RunArgs`), the optimizer (`OptimArgs`) and the learning-rate
//! schedule (`ScheduleArgs`), turned into `ops::optim`'s `OptimConfig` and `LrSchedule`, and how clap reads
//! the values of `ops`' enums (`--optim`, `--lr-schedule`, `--activation`), so that `ops` stays free of the
//! command line. Each group serialises as the report's `config` lists it (`report::with_flags`).

use crate::device::DeviceChoice;
use crate::harness::report;
use crate::ops::activations::Activation;
use crate::ops::optim::{LrSchedule, LrScheduleKind, OptimConfig, OptimKind};
use anyhow::{Result, bail};
use clap::Arg;
use clap::builder::PossibleValue;
use std::path::PathBuf;

/// The run flags every training command shares (`#[command(flatten)]`): the model file, the pictures and
/// event files, the seed, the device and how much is printed. `--out` has no default here: each command
/// gives its own with `#[command(mut_arg("out", run_out(DEFAULT, HELP)))]`, and says with `mut_arg` what
/// its `--seed` seeds where that is more than the parameters and the shuffle.
#[derive(clap::Args, Clone, Debug, serde::Serialize)]
pub struct RunArgs {
    /// Where to write the model (.safetensors)
    #[arg(short = 'o', long)]
    #[serde(serialize_with = "report::serialize_path")]
    pub out: PathBuf,
    #[arg(long, help = crate::harness::checkpoint::OVERWRITE_HELP)]
    /// Replace the model at --out whatever it holds (the help text is `checkpoint::OVERWRITE_HELP`).
    pub overwrite: bool,
    #[arg(long, value_name = "FILE", help = crate::harness::plot::HELP)]
    #[serde(serialize_with = "report::serialize_optional_path")]
    /// Draw the training curves to this picture (the help text is `plot::HELP`).
    pub plot: Option<PathBuf>,
    #[arg(long, value_name = "DIR", help = crate::harness::report::TENSORBOARD_HELP)]
    #[serde(serialize_with = "report::serialize_optional_path")]
    /// Write TensorBoard event files to this directory (the help text is `report::TENSORBOARD_HELP`).
    pub tensorboard: Option<PathBuf>,
    /// Seed of the initial parameters and of the shuffle
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to train
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    #[serde(serialize_with = "report::serialize_flag_value")]
    pub device: DeviceChoice,
    /// Print errors only: no progress bar and no other lines (the --json report still comes)
    #[arg(short = 'q', long)]
    #[serde(skip)]
    pub quiet: bool,
    /// Print one JSON report on stdout at the end (the other lines go to stderr)
    #[arg(long)]
    #[serde(skip)]
    pub json: bool,
}

/// A command's `--out`: its default file and its help, which says when the file is replaced
/// (`#[command(mut_arg("out", run_out(…)))]`).
pub fn run_out(default: &'static str, help: &'static str) -> impl FnOnce(Arg) -> Arg {
    move |arg| arg.required(false).default_value(default).help(help)
}

/// The optimizer flags every training command shares (`#[command(flatten)]`); `--optim` defaults to Adam.
/// The report lists them as the run used them (`OptimArgs::of`).
#[derive(clap::Args, Clone, Debug, serde::Serialize)]
pub struct OptimArgs {
    /// Optimizer
    #[arg(long, value_enum, default_value_t = OptimKind::Adam)]
    #[serde(serialize_with = "report::serialize_flag_value")]
    pub optim: OptimKind,
    /// Learning rate [default: adam 0.001, sgd 0.1, momentum 0.05]
    #[arg(long, allow_negative_numbers = true)]
    #[serde(serialize_with = "report::serialize_optional_decimal")]
    pub lr: Option<f32>,
    /// Momentum μ of --optim momentum [default: 0.9]
    #[arg(long, allow_negative_numbers = true)]
    #[serde(serialize_with = "report::serialize_optional_decimal")]
    pub momentum: Option<f32>,
    /// Weight decay: L2, added to the gradient as wd·θ (adamw: decoupled, θ shrinks by lr·wd·θ)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    #[serde(serialize_with = "report::serialize_decimal")]
    pub weight_decay: f32,
    /// Clip the gradient's global L2 norm to this before each update (0 = off)
    #[arg(long, visible_alias = "grad-clip", default_value_t = 0.0, allow_negative_numbers = true)]
    #[serde(serialize_with = "report::serialize_decimal")]
    pub clip_norm: f32,
}

impl OptimArgs {
    /// The flags that ask for `config`, each given: `--lr` always, `--momentum` with `--optim momentum`.
    /// The report's `config` lists these, so that it names the rate a run used also when `--lr` was left
    /// to the optimizer's default.
    pub fn of(config: &OptimConfig) -> OptimArgs {
        OptimArgs {
            optim: config.kind,
            lr: Some(config.lr),
            momentum: (config.kind == OptimKind::Momentum).then_some(config.momentum),
            weight_decay: config.weight_decay,
            clip_norm: config.clip_norm,
        }
    }

    /// The configuration the flags ask for, checked.
    pub fn config(&self) -> Result<OptimConfig> {
        let mut config = OptimConfig::new(self.optim);
        if let Some(lr) = self.lr {
            config.lr = lr;
        }
        if let Some(momentum) = self.momentum {
            if self.optim != OptimKind::Momentum {
                bail!("--momentum applies to --optim momentum only (this run uses --optim {})", self.optim.name());
            }
            config.momentum = momentum;
        }
        config.weight_decay = self.weight_decay;
        config.clip_norm = self.clip_norm;
        config.validate()?;
        Ok(config)
    }
}

/// The learning-rate schedule flags every training command can share (`#[command(flatten)]`), as the
/// report's `config` lists them (`report::with_flags`).
#[derive(clap::Args, Clone, Debug, Default, serde::Serialize)]
pub struct ScheduleArgs {
    /// How the learning rate moves over the run
    #[arg(long, value_enum, default_value_t)]
    pub lr_schedule: LrScheduleKind,
    /// Optimizer steps of linear warm-up first: step k (from 0) of them runs at --lr × (k + 1) / (N + 1)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub warmup: usize,
    /// Where --lr-schedule cosine ends
    #[arg(long, value_name = "LR", default_value_t = 0.0, allow_negative_numbers = true)]
    #[serde(serialize_with = "crate::harness::report::serialize_decimal")]
    pub min_lr: f32,
}

impl ScheduleArgs {
    /// The schedule the flags ask for, checked against the base rate `lr`.
    pub fn schedule(&self, lr: f32) -> Result<LrSchedule> {
        if !(self.min_lr.is_finite() && self.min_lr >= 0.0) {
            bail!("--min-lr must be a finite number ≥ 0, got {}", self.min_lr);
        }
        if self.min_lr > lr {
            bail!("--min-lr {} is above --lr {lr}: the cosine schedule decays from --lr down to --min-lr", self.min_lr);
        }
        if self.min_lr > 0.0 && self.lr_schedule != LrScheduleKind::Cosine {
            bail!("--min-lr applies to --lr-schedule cosine only (this run uses {})", self.lr_schedule.name());
        }
        Ok(LrSchedule { kind: self.lr_schedule, warmup: self.warmup, min_lr: self.min_lr })
    }
}

impl clap::ValueEnum for OptimKind {
    fn value_variants<'a>() -> &'a [Self] {
        &[OptimKind::Sgd, OptimKind::Momentum, OptimKind::Adam, OptimKind::AdamW]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self {
            OptimKind::Sgd => "Plain stochastic gradient descent",
            OptimKind::Momentum => "SGD with heavy-ball momentum (--momentum, default 0.9)",
            OptimKind::Adam => "Adam with bias correction (β1 0.9, β2 0.999, ε 1e-8)",
            OptimKind::AdamW => {
                "Adam with decoupled weight decay: θ shrinks by lr·wd·θ each step instead of wd·θ joining the gradient"
            }
        };
        Some(PossibleValue::new(self.name()).help(help))
    }
}

impl clap::ValueEnum for LrScheduleKind {
    fn value_variants<'a>() -> &'a [Self] {
        &[LrScheduleKind::Constant, LrScheduleKind::Cosine, LrScheduleKind::Step]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self {
            LrScheduleKind::Constant => "--lr at every step",
            LrScheduleKind::Cosine => {
                "Half a cosine from --lr down to --min-lr over the run (nanoGPT's and `CosineAnnealingLR`'s curve)"
            }
            LrScheduleKind::Step => {
                "--lr, ×0.1 from 50 % of the run's steps and ×0.01 from 75 % (`MultiStepLR`, as DenseNet trains)"
            }
        };
        Some(PossibleValue::new(self.name()).help(help))
    }
}

impl clap::ValueEnum for Activation {
    fn value_variants<'a>() -> &'a [Self] {
        &Activation::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    /// Each value clap reads is the name `ops` gives it.
    #[test]
    fn the_flag_values_are_the_names_of_ops() {
        for kind in OptimKind::value_variants() {
            assert_eq!(kind.to_possible_value().unwrap().get_name(), kind.name());
        }
        for kind in LrScheduleKind::value_variants() {
            assert_eq!(kind.to_possible_value().unwrap().get_name(), kind.name());
        }
        for activation in Activation::value_variants() {
            assert_eq!(activation.to_possible_value().unwrap().get_name(), activation.name());
        }
    }

    #[test]
    fn the_flags_are_checked() {
        let args = |kind, warmup, min_lr| ScheduleArgs { lr_schedule: kind, warmup, min_lr };
        assert!(args(LrScheduleKind::Cosine, 0, 0.01).schedule(0.1).is_ok());
        let err = args(LrScheduleKind::Cosine, 0, 0.5).schedule(0.1).unwrap_err().to_string();
        assert!(err.contains("--min-lr 0.5 is above --lr 0.1"), "{err}");
        let err = args(LrScheduleKind::Step, 0, 0.01).schedule(0.1).unwrap_err().to_string();
        assert!(err.contains("cosine only"), "{err}");
        let s = args(LrScheduleKind::Constant, 10, 0.0).schedule(0.1).unwrap();
        assert!(s.check(11).is_ok());
        assert!(s.check(10).unwrap_err().to_string().contains("--warmup 10 is as long as the whole run (10"));
    }
}
