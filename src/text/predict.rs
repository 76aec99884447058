//! Next-token prediction with a trained model, on the CPU reference: tokenize the context with the
//! model's own tokenizer settings, keep the last N tokens, average their embeddings, one forward pass.

use super::model::{Activations, forward};
use super::modelfile::TextModel;
use super::vocab::UNK_ID;
use crate::cpu::top_k;
use anyhow::{Result, bail};
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    pub token: String,
    pub id: u32,
    pub probability: f32,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    /// The context tokens the model read (at most its context length: the last ones of the text).
    pub context: Vec<String>,
    /// Those of them outside the vocabulary, read as `<unk>`.
    pub unknown: Vec<String>,
    /// Earlier tokens of the text that did not fit the context window.
    pub dropped: usize,
    /// How many context tokens the model was trained with; `context` is shorter when the text was.
    pub model_context: usize,
    /// The likeliest next tokens, likeliest first.
    pub top: Vec<Candidate>,
}

/// The `k` likeliest next tokens after `text` (all of them when `k` exceeds the vocabulary).
pub fn predict(model: &TextModel, text: &str, k: usize) -> Result<Prediction> {
    if k == 0 {
        bail!("--top must be at least 1");
    }
    let n = model.params.shape.context;
    let mut context: Vec<String> = model.tokenizer.tokens(text).map(|t| t.into_owned()).collect();
    if context.is_empty() {
        bail!("the context has no tokens; give some words, e.g. textnet predict \"to be or\"");
    }
    let dropped = context.len().saturating_sub(n);
    context.drain(..dropped);
    let ids: Vec<u32> = context.iter().map(|t| model.vocab.id(t)).collect();
    let unknown: Vec<String> =
        context.iter().zip(&ids).filter(|&(_, &id)| id == UNK_ID).map(|(t, _)| t.clone()).collect();
    if unknown.len() == context.len() {
        bail!("none of the context tokens is in the model's vocabulary: {}", quoted(&unknown));
    }

    let mut acts = Activations::new(model.params.shape);
    forward(&model.params, &ids, &mut acts);
    if !acts.logsumexp.is_finite() || acts.probs.iter().any(|p| !p.is_finite()) {
        bail!("the model's output is not finite for this context: its weights are too large to be a trained model");
    }
    let top = top_k(&acts.probs, k.min(acts.probs.len()))
        .into_iter()
        .map(|id| Candidate {
            token: model.vocab.token(id as u32).to_string(),
            id: id as u32,
            probability: acts.probs[id],
        })
        .collect();
    Ok(Prediction { context, unknown, dropped, model_context: n, top })
}

/// `"a", "b"`: tokens as they appear in messages.
pub fn quoted(tokens: &[String]) -> String {
    tokens.iter().map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", ")
}
