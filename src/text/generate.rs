//! Sampling from a next-token text model file for `textnet generate`: the prompt read with the model's
//! tokenizer, each next word drawn from the logits after the last N tokens, on the CPU, and the tokens
//! joined for reading.

use super::model::{Activations, forward};
use super::modelfile::TextModel;
use super::predict::quoted;
use super::vocab::UNK_ID;
use crate::ops::cpu::SeededRng;
use crate::ops::sampling::{Generator, Prompt, Sampling, continuation};
use anyhow::{Result, bail};
use rand::SeedableRng;

/// A text model ready to sample from.
pub struct TextGenerator {
    model: TextModel,
    acts: Activations,
}

impl TextGenerator {
    /// A generator of `model`, with the buffers its steps reuse.
    pub fn new(model: TextModel) -> TextGenerator {
        TextGenerator { acts: Activations::new(model.params.shape), model }
    }
}

impl Generator for TextGenerator {
    fn logits(&mut self, ids: &[u32]) -> Vec<f32> {
        let n = self.model.params.shape.context;
        forward(&self.model.params, &ids[ids.len().saturating_sub(n)..], &mut self.acts);
        self.acts.logits.clone()
    }

    fn unknown_id(&self) -> u32 {
        UNK_ID
    }

    fn unit(&self) -> &'static str {
        "token"
    }

    fn piece(&self, id: u32, before: &str) -> String {
        joined(before, self.model.vocab.token(id))
    }

    fn read_prompt(&self, text: &str) -> Result<Prompt> {
        read_prompt(&self.model, text)
    }
}

/// `generate`'s hook: a text model file's bytes.
pub fn open(bytes: &[u8]) -> Result<Box<dyn Generator>> {
    Ok(Box::new(TextGenerator::new(TextModel::from_bytes(bytes)?)))
}

/// The prompt in the model's ids, shown as its tokens joined. Empty: the start context, as after the end
/// of a sentence ("."; the most frequent token when "." is not in the vocabulary). A prompt whose words
/// are all outside the vocabulary is refused, as `predict` refuses such a context.
pub fn read_prompt(model: &TextModel, text: &str) -> Result<Prompt> {
    if text.is_empty() {
        let start = model.vocab.get(".").unwrap_or(if model.vocab.len() > 1 { UNK_ID + 1 } else { UNK_ID });
        return Ok(Prompt { ids: vec![start], shown: String::new(), unknown: 0 });
    }
    let tokens: Vec<String> = model.tokenizer.tokens(text).map(|t| t.into_owned()).collect();
    if tokens.is_empty() {
        bail!(
            "the prompt has no tokens; give some words, e.g. textnet generate \"to be or\" (or \"\" for an unconditional sample)"
        );
    }
    let ids: Vec<u32> = tokens.iter().map(|t| model.vocab.id(t)).collect();
    let unknown = ids.iter().filter(|&&id| id == UNK_ID).count();
    if unknown == tokens.len() {
        bail!("none of the prompt's tokens is in the model's vocabulary: {}", quoted(&tokens));
    }
    Ok(Prompt { ids, shown: join(&tokens), unknown })
}

/// `token` as it follows `before` when tokens are joined for reading: after a space, but none before
/// closing punctuation, after an opening bracket or at the start.
pub fn joined(before: &str, token: &str) -> String {
    let closing = token.starts_with(['.', ',', ';', ':', '!', '?', ')', ']', '}', '\'', '’']);
    if before.is_empty() || closing || before.ends_with(['(', '[', '{']) {
        token.to_string()
    } else {
        format!(" {token}")
    }
}

/// Tokens joined for reading (`joined`, one after another).
pub fn join(tokens: &[String]) -> String {
    let mut text = String::new();
    for token in tokens {
        let piece = joined(&text, token);
        text.push_str(&piece);
    }
    text
}

/// `length` tokens sampled after `prompt` from the seed (the prompt as read, and the tokens drawn).
pub fn generate(
    model: &TextModel,
    prompt: &str,
    length: usize,
    sampling: &Sampling,
    seed: u64,
) -> Result<(Prompt, Vec<String>)> {
    let prompt = read_prompt(model, prompt)?;
    let mut generator = TextGenerator::new(model.clone());
    let mut rng = SeededRng::seed_from_u64(seed);
    let sample = continuation(&mut generator, &prompt, sampling, length, &[], &mut rng, &mut |_| true)?;
    let tokens = sample.ids.iter().map(|&id| model.vocab.token(id).to_string()).collect();
    Ok((prompt, tokens))
}
