//! `textnet eval`'s flags and report, the same for every kind of language model file: loss, perplexity,
//! top-1 and top-5 accuracy of a model's next-token predictions over a corpus, without training. The
//! pipeline whose kind the file names computes the figures (`pipeline::LanguageModel::evaluate`).

use crate::harness::console;
use anyhow::{Result, bail};
use serde_json::json;
use std::path::PathBuf;

/// `textnet eval`'s flags.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// UTF-8 text to evaluate on, `-` for standard input
    pub corpus: PathBuf,
    /// Model file written by `textnet train` (tokens are words) or `textnet transformer` (characters)
    #[arg(short = 'm', long, default_value = "textnet.safetensors")]
    pub model: PathBuf,
    /// Use only the first N tokens (characters, for a Transformer) of the corpus
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Evaluate at most N samples, spread evenly over the corpus (0 = all); text models only
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_samples: usize,
    /// Print one JSON object
    #[arg(long)]
    pub json: bool,
    /// No progress bar
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// What a model scored on a corpus: sums over its samples (each a token predicted from those before it).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Evaluation {
    /// "token" or "character": what the model predicts.
    pub unit: &'static str,
    /// The corpus's length in units.
    pub tokens: usize,
    /// Of them, those outside the model's vocabulary (read as its unknown token).
    pub unknown_tokens: usize,
    /// The samples scored: positions with a full context before them.
    pub samples: u64,
    /// The summed cross-entropy (nats), in sample order.
    pub loss_sum: f64,
    /// Samples whose target was the model's first choice.
    pub top1: u64,
    /// Samples whose target was among the model's five first choices.
    pub top5: u64,
    /// The threads the samples were shared out over.
    pub threads: usize,
}

/// Prints `e` for `args`, as one JSON object with `--json`; an error when the loss is not finite.
pub fn report(args: &EvalArgs, kind: &str, e: &Evaluation) -> Result<()> {
    let samples = e.samples.max(1) as f64;
    let (loss, top1, top5) = (e.loss_sum / samples, e.top1 as f64 / samples, e.top5 as f64 / samples);
    if !loss.is_finite() {
        bail!(
            "the model's output is not finite on this corpus (loss {loss}): its weights are too large to be a trained model"
        );
    }
    if args.json {
        console::out(
            &json!({
                "model": args.model.display().to_string(), "kind": kind,
                "corpus": args.corpus.display().to_string(), "unit": e.unit,
                "tokens": e.tokens, "unknown_tokens": e.unknown_tokens, "samples": e.samples,
                "loss": loss, "perplexity": loss.exp(), "top1_accuracy": top1, "top5_accuracy": top5,
                "threads": e.threads,
            })
            .to_string(),
        );
    } else {
        console::out(&format!(
            "{}: {} {}s ({:.2}% outside the model's vocabulary), {} samples",
            args.corpus.display(),
            crate::harness::report::count(e.tokens),
            e.unit,
            100.0 * e.unknown_tokens as f64 / e.tokens.max(1) as f64,
            crate::harness::report::count(e.samples as usize)
        ));
        console::out(&format!(
            "loss {loss:.4} per {} (perplexity {:.2}), top-1 {:.1}%, top-5 {:.1}%",
            e.unit,
            loss.exp(),
            100.0 * top1,
            100.0 * top5
        ));
    }
    Ok(())
}
