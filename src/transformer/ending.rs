//! How a `textnet transformer` run ends beyond what every command says: the remedy of a run that
//! diverged, the title of its plot, and its `--json` report.

use super::args::TransformerArgs;
use super::model::{self, Config};
use super::steps::{Kept, Setup};
use crate::harness::report::{self, EpochRow, Report, Status};
use crate::harness::run;
use crate::io::fsutil;
use serde_json::json;

impl TransformerArgs {
    /// The lines of a run that wrote its model: the evaluation written (`kept`), and how it compares with
    /// the unigram baseline.
    pub(super) fn say_kept(&self, setup: &Setup, kept: Kept, seconds: f64) {
        let args = self;
        let at = if setup.evals > 1 { format!(", step {} of {}", kept.step, args.steps) } else { String::new() };
        let out = args.run.out.display();
        setup
            .display
            .line(&format!("{out} holds the trained model (validation loss {:.4}{at}, {seconds:.1} s)", kept.val_loss));
        let unigram = setup.corpus.unigram_loss();
        if kept.val_loss >= unigram {
            setup.display.line(&run::weaker_than_unigram(kept.val_loss, unigram, "character"));
        }
    }

    /// What to try after a run diverged.
    pub(super) fn remedy(&self) -> String {
        let args = self;
        format!(
            "try a lower --lr (this run used {}){}",
            args.lr,
            if args.weight_decay > 1.0 {
                format!(" or a far lower --weight-decay (this run used {})", args.weight_decay)
            } else {
                String::new()
            }
        )
    }

    /// The title of the run's plot.
    pub(super) fn plot_title(&self, config: &Config) -> String {
        let args = self;
        format!(
            "textnet transformer on {}: {} layer{}, {} heads, embed {}, block {}; AdamW lr {}, batch {}",
            fsutil::shown(&args.corpus),
            config.layers,
            if config.layers == 1 { "" } else { "s" },
            config.heads,
            config.embed,
            config.block,
            args.lr,
            args.batch
        )
    }

    /// The `--json` report of a run that ended with `status`, its evaluations `rows`, the one written
    /// (`kept`) and its training time; `diverged` is the caller's to fill in.
    pub(super) fn report(
        &self,
        setup: &Setup,
        status: Status,
        rows: Vec<EpochRow>,
        kept: Option<Kept>,
        seconds: f64,
    ) -> Report {
        let args = self;
        let written = kept.is_some();
        Report {
            textnet: crate::VERSION,
            command: "transformer",
            status,
            config: report::with_flags(
                json!({
                    "corpus": args.corpus.display().to_string(),
                    "keep": "best",
                    "layers": setup.config.layers, "heads": setup.config.heads, "embed": setup.config.embed, "block": setup.config.block,
                    "bias": setup.config.bias, "tie_weights": setup.config.tie_weights,
                    "batch": args.batch, "grad_accum": args.grad_accum, "steps": args.steps, "lr": report::decimal(args.lr),
                    "weight_decay": report::decimal(args.weight_decay), "beta2": report::decimal(args.beta2),
                    "clip_norm": report::decimal(args.clip_norm),
                    "dropout": report::decimal(args.dropout),
                    "init": args.init.name(),
                    "eval_iters": args.eval_iters,
                    "vocab": args.vocab,
                    "eval_every": args.eval_every,
                    "precision": args.precision.name(),
                    "gpus": args.parallel.plan(args.batch).map_or(1, |p| p.replicas()),
                    "zero": args.zero,
                    "resume": args.resume.as_ref().map(|p| p.display().to_string()),
                }),
                &[&args.run, &args.schedule],
            ),
            device: report::DeviceFields::of(&setup.backend),
            data: json!({
                "train_chars": setup.corpus.train.len(),
                "val_chars": setup.corpus.val.len(),
                "val_windows": setup.val_offsets.len(),
                "vocabulary": setup.config.vocab,
                "unknown_chars": setup.corpus.unknown,
                "unigram_val_loss": setup.corpus.unigram_loss(),
            }),
            parameters: model::Layout::new(&setup.config).len(),
            epochs: rows,
            final_metrics: written.then(|| {
                let mut m = serde_json::Map::new();
                m.insert("val_loss".into(), json!(kept.map(|k| k.val_loss)));
                m.insert("train_s".into(), json!(seconds));
                m
            }),
            model: args.run.out.display().to_string(),
            kept_epoch: kept.map(|k| k.eval),
            baseline_val_loss: setup.baseline,
            diverged: None,
        }
    }
}
