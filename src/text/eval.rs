//! `textnet eval`: a saved text model on another corpus, without training: loss, perplexity, top-1 and
//! top-5 accuracy over its samples, on every core (the batched CPU evaluator `train` validates with),
//! with a progress bar on a terminal.

use super::TextTrainer;
use super::corpus::{Corpus, CorpusOptions};
use super::cpu_batch::BatchTrainer;
use super::model;
use super::modelfile::TextModel;
use super::train::spread_subset;
use crate::console;
use anyhow::{Result, bail};
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// UTF-8 text to evaluate on, `-` for standard input
    pub corpus: PathBuf,
    /// Model file written by `textnet train`
    #[arg(long, default_value = "textnet.safetensors")]
    pub model: PathBuf,
    /// Use only the first N tokens of the corpus
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Evaluate at most N samples, spread evenly over the corpus (0 = all)
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_samples: usize,
    /// Print one JSON object
    #[arg(long)]
    pub json: bool,
}

/// Samples evaluated between two updates of the progress bar.
const PROGRESS_CHUNK: usize = 1 << 16;

pub fn run(args: EvalArgs) -> Result<()> {
    if args.max_tokens == Some(0) {
        bail!("--max-tokens must be at least 1, got 0");
    }
    let model = TextModel::load(&args.model)?;
    let options = CorpusOptions { tokenizer: model.tokenizer, max_vocab: usize::MAX, max_tokens: args.max_tokens };
    let corpus = Corpus::read(&args.corpus, options)?.in_vocabulary(&model.vocab);
    let n = model.params.shape.context;
    if corpus.tokens.len() <= n {
        bail!(
            "the corpus has {} tokens; the model reads {n} before each one it predicts, so it needs at least {}",
            corpus.tokens.len(),
            n + 1
        );
    }
    let all: Vec<u32> = (n as u32..corpus.tokens.len() as u32).collect();
    let positions = spread_subset(&all, args.max_samples);
    let bar =
        indicatif::ProgressBar::with_draw_target(Some(positions.len() as u64), indicatif::ProgressDrawTarget::stderr())
            .with_style(
                indicatif::ProgressStyle::with_template(
                    "evaluating [{bar:30}] {human_pos}/{human_len} samples, {per_sec:0}, ETA {eta}",
                )
                .map(|s| s.progress_chars("=> "))
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
    let mut evaluator = BatchTrainer::new(model.params, corpus.tokens.clone().into());
    let mut sums = model::EvalSums::default();
    for chunk in positions.chunks(PROGRESS_CHUNK) {
        sums.add(evaluator.evaluate(chunk)?);
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    let samples = sums.samples.max(1) as f64;
    let (loss, top1, top5) = (sums.loss / samples, sums.top1 as f64 / samples, sums.top5 as f64 / samples);
    if !loss.is_finite() {
        bail!(
            "the model's output is not finite on this corpus (loss {loss}): its weights are too large to be a trained model"
        );
    }
    let unknown = corpus.unknown as f64 / corpus.tokens.len() as f64;
    if args.json {
        console::out(
            &json!({
                "model": args.model.display().to_string(), "corpus": args.corpus.display().to_string(),
                "tokens": corpus.tokens.len(), "unknown_tokens": corpus.unknown, "samples": sums.samples,
                "loss": loss, "perplexity": loss.exp(), "top1_accuracy": top1, "top5_accuracy": top5,
            })
            .to_string(),
        );
    } else {
        console::out(&format!(
            "{}: {} tokens ({:.2}% outside the model's vocabulary), {} samples",
            args.corpus.display(),
            corpus.tokens.len(),
            100.0 * unknown,
            sums.samples
        ));
        console::out(&format!(
            "loss {loss:.4} (perplexity {:.1}), top-1 {:.1}%, top-5 {:.1}%",
            loss.exp(),
            100.0 * top1,
            100.0 * top5
        ));
    }
    Ok(())
}
