//! `textnet eval`: a saved text model on another corpus, without training: loss, perplexity, top-1 and
//! top-5 accuracy over its samples (on the CPU reference).

use super::corpus::{Corpus, CorpusOptions};
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

pub fn run(args: EvalArgs) -> Result<()> {
    let model = TextModel::load(&args.model)?;
    let options = CorpusOptions { tokenizer: model.tokenizer, max_vocab: usize::MAX, max_tokens: args.max_tokens };
    let corpus = Corpus::read(&args.corpus, options)?.in_vocabulary(&model.vocab);
    let n = model.params.shape.context;
    if corpus.tokens.len() <= n {
        bail!("the corpus has {} tokens; the model reads {n} before each one it predicts, so it needs at least {}", corpus.tokens.len(), n + 1);
    }
    let all: Vec<u32> = (n as u32..corpus.tokens.len() as u32).collect();
    let positions = spread_subset(&all, args.max_samples);
    let sums = model::evaluate(&model.params, &corpus.tokens, &positions);
    let samples = sums.samples.max(1) as f64;
    let (loss, top1, top5) = (sums.loss / samples, sums.top1 as f64 / samples, sums.top5 as f64 / samples);
    let unknown = corpus.unknown as f64 / corpus.tokens.len() as f64;
    if args.json {
        console::out(&json!({
            "model": args.model.display().to_string(), "corpus": args.corpus.display().to_string(),
            "tokens": corpus.tokens.len(), "unknown_tokens": corpus.unknown, "samples": sums.samples,
            "loss": loss, "perplexity": loss.exp(), "top1_accuracy": top1, "top5_accuracy": top5,
        }).to_string());
    } else {
        console::out(&format!(
            "{}: {} tokens ({:.2}% outside the model's vocabulary), {} samples",
            args.corpus.display(),
            corpus.tokens.len(),
            100.0 * unknown,
            sums.samples
        ));
        console::out(&format!("loss {loss:.4} (perplexity {:.1}), top-1 {:.1}%, top-5 {:.1}%", loss.exp(), 100.0 * top1, 100.0 * top5));
    }
    Ok(())
}
