//! `textnet eval`'s flags and report, the same for every kind of language model file: loss, perplexity,
//! top-1 and top-5 accuracy of a model's next-token predictions over a corpus, without training. The
//! pipeline whose kind the file names computes the figures (`pipeline::LanguageModel::evaluate`).

use crate::harness::console;
use crate::pipeline::{EvalArgs, Evaluation};
use anyhow::{Result, bail};
use serde_json::json;

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
