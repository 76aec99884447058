//! What a `textnet train` run says beyond what every command says: the lines that describe the run
//! before it trains, and at its end the `--json` report.

use super::args::{DEFAULT_LR, Plan, TrainArgs};
use super::epochs::epoch_row;
use super::model::TextShape;
use super::tokenizer::Tokenizer;
use super::train::EpochMetrics;
use crate::device::precision::Precision;
use crate::harness::checkpoint::Keeper;
use crate::harness::report::{self, Display, EpochRow, Report, Status};
use crate::ops::optim::{LrSchedule, OptimKind};
use serde_json::json;

/// What a run trains on and with: printed before training and repeated in the `--json` summary.
pub(super) struct Summary {
    pub(super) plan: Plan,
    /// The learning-rate schedule over the run's steps.
    pub(super) schedule: LrSchedule,
    /// On the CPU: what it trains with and how long that should take.
    pub(super) cpu_line: Option<String>,
    pub(super) device: String,
    /// The report's device fields.
    pub(super) device_fields: report::DeviceFields,
    pub(super) tokens: usize,
    pub(super) truncated: bool,
    pub(super) unknown: usize,
    pub(super) shape: TextShape,
    pub(super) tokenizer: Tokenizer,
    pub(super) train_samples: usize,
    pub(super) val_samples: usize,
    pub(super) val_evaluated: usize,
    /// Validation loss of the unigram baseline, on the same validation samples as the epochs.
    pub(super) unigram: f64,
}

impl Summary {
    /// The validation loss of guessing, every token equally likely (ln V): an epoch no better learned
    /// nothing.
    pub(super) fn guessing_loss(&self) -> f64 {
        (self.shape.vocab as f64).ln()
    }

    pub(super) fn print(&self, args: &TrainArgs, display: &Display) {
        let (shape, plan) = (self.shape, self.plan);
        let limit_note = if self.truncated { " (cut at --max-tokens)" } else { "" };
        display.line(&format!(
            "corpus: {}, {} tokens{limit_note}; vocabulary {} entries, {:.2}% of tokens are <unk>",
            args.corpus.display(),
            report::count(self.tokens),
            report::count(shape.vocab),
            100.0 * self.unknown as f64 / self.tokens as f64
        ));
        display.line(&format!(
            "samples: {} training, {} validation ({} evaluated each epoch, --val-max {})",
            report::count(self.train_samples),
            report::count(self.val_samples),
            report::count(self.val_evaluated),
            args.val_max
        ));
        let schedule = match self.schedule.describe() {
            s if s.is_empty() => String::new(),
            s => format!(", {s}"),
        };
        display.line(&format!(
            "model: context {}, embed {}, hidden {}: {} parameters; {}{schedule}, batch {}, {} epoch{}",
            shape.context,
            shape.embed,
            shape.hidden,
            report::count(parameter_count(shape)),
            args.optim_config(plan.lr).describe(),
            plan.batch,
            plan.epochs,
            if plan.epochs == 1 { "" } else { "s" }
        ));
        if args.precision == Precision::Bf16 {
            display.line(match (args.optim, self.cpu_line.is_some()) {
                (OptimKind::Sgd, true) => {
                    "precision: bf16 products with fp32 sums (the CPU twin of the GPU's bf16 step)"
                }
                (_, true) => "note: --precision bf16 on the CPU takes --optim sgd; this run trains in fp32",
                _ => "precision: bf16 products on the tensor cores, fp32 sums, weights, softmax and updates",
            });
            if self.cpu_line.is_none() && plan.batch < super::gpu::TILED_MIN_BATCH {
                display.line(&format!(
                    "note: --precision bf16 takes every step through the batched kernels, which at --batch {} are \
                     slower than fp32's kernels for small batches; it pays from --batch 64",
                    plan.batch
                ));
            }
        }
        if let Some(path) = &args.resume {
            display.line(&format!("resuming: {} (its vocabulary, tokenizer and shape)", path.display()));
        }
        display.line(&format!("device: {}", self.device));
        if let Some(line) = &self.cpu_line {
            display.line(line);
        }
        display.line(&format!("unigram baseline: val loss {:.4} (perplexity {:.1})", self.unigram, self.unigram.exp()));
        if args.optim == OptimKind::Adam && plan.lr == DEFAULT_LR {
            display.line(&format!(
                "note: --lr {DEFAULT_LR} is the SGD default; Adam usually wants about 1e-3 (--lr 0.001)"
            ));
        }
        if let Some(note) = batch_lr_note(plan).filter(|_| args.optim == OptimKind::Sgd) {
            display.line(&note);
        }
    }

    /// The title of the `--plot` picture.
    pub(super) fn plot_title(&self, args: &TrainArgs) -> String {
        let (shape, plan) = (self.shape, self.plan);
        format!(
            "textnet train on {}: context {}, embed {}, hidden {}; {}, batch {}",
            crate::io::fsutil::shown(&args.corpus),
            shape.context,
            shape.embed,
            shape.hidden,
            args.optim_config(plan.lr).describe(),
            plan.batch
        )
    }

    pub(super) fn report(
        &self,
        args: &TrainArgs,
        status: Status,
        epochs: &[EpochMetrics],
        diverged: Option<report::Divergence>,
        keeper: &Keeper,
    ) -> Report {
        let epochs: Vec<EpochRow> = epochs.iter().map(epoch_row).collect();
        Report {
            textnet: crate::VERSION,
            command: "train",
            status,
            config: args.config_json(self.shape, self.tokenizer, &self.plan),
            device: self.device_fields.clone(),
            data: json!({
                "tokens": self.tokens,
                "tokens_truncated": self.truncated,
                "unknown_tokens": self.unknown,
                "vocab_size": self.shape.vocab,
                "train_samples": self.train_samples,
                "val_samples": self.val_samples,
                "val_evaluated": self.val_evaluated,
                "unigram_val_loss": self.unigram,
            }),
            parameters: parameter_count(self.shape),
            final_metrics: report::final_metrics(&epochs, keeper.kept_epoch(), Default::default()),
            epochs,
            model: args.run.out.display().to_string(),
            kept_epoch: keeper.kept_epoch(),
            baseline_val_loss: keeper.baseline,
            diverged,
        }
    }
}

/// A note for a batch run at the single-sample learning rate: each step averages `batch` samples'
/// gradients, so at the same lr an epoch moves the parameters about `batch` times less (`--batch 64` at
/// 0.02 ended worse than the unigram baseline on the corpus). On a 300,000-token slice (embed 32,
/// hidden 64, one epoch) batch 64 reached val loss 5.28 at lr 0.02, 5.19 at 0.16 and 5.11 at 1.28, where
/// single samples at 0.02 reached 5.10.
fn batch_lr_note(plan: Plan) -> Option<String> {
    let batch = plan.batch;
    (batch > 1 && plan.lr == DEFAULT_LR).then(|| {
        format!(
            "note: --batch {batch} averages {batch} samples' gradients per step, so at the single-sample --lr {DEFAULT_LR} an \
             epoch moves the model about {batch} times less; try --lr {} ({DEFAULT_LR} × {batch})",
            crate::harness::report::decimal(DEFAULT_LR * batch as f32)
        )
    })
}

fn parameter_count(s: TextShape) -> usize {
    s.vocab * s.embed + s.hidden * s.embed + s.hidden + s.vocab * s.hidden + s.vocab
}
