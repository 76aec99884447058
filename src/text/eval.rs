//! `textnet eval` for a text model file: every token with the model's context before it is predicted,
//! by the batched CPU evaluator `train` validates with (its matrix products share their rows out over
//! rayon's threads, and the losses are added in sample order, so any number of threads gives the same
//! bits).

use super::TextTrainer;
use super::corpus::{Corpus, CorpusOptions};
use super::cpu_batch::BatchTrainer;
use super::model::EvalSums;
use super::modelfile::TextModel;
use super::train::spread_subset;
use crate::pipeline::{EvalArgs, Evaluation};
use anyhow::{Context, Result, bail};
use indicatif::ProgressBar;

/// Samples evaluated between two updates of the progress bar.
const PROGRESS_CHUNK: usize = 1 << 13;

/// `eval`'s hook: a text model file's bytes scored on the corpus.
pub fn evaluate(bytes: &[u8], args: &EvalArgs, bar: &ProgressBar) -> Result<Evaluation> {
    let model = TextModel::from_bytes(bytes).with_context(|| format!("model file {}", args.model.display()))?;
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
    bar.set_length(positions.len() as u64);
    let mut evaluator = BatchTrainer::new(model.params, corpus.tokens.clone().into());
    let mut sums = EvalSums::default();
    for chunk in positions.chunks(PROGRESS_CHUNK) {
        sums.add(evaluator.evaluate(chunk)?);
        bar.inc(chunk.len() as u64);
    }
    Ok(Evaluation {
        unit: "token",
        tokens: corpus.tokens.len(),
        unknown_tokens: corpus.unknown,
        samples: sums.samples,
        loss_sum: sums.loss,
        top1: sums.top1,
        top5: sums.top5,
        threads: rayon::current_num_threads(),
    })
}
