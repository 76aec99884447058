//! Sampling from a Transformer model file for `textnet generate`: the prompt's characters (those outside
//! the vocabulary read as the unknown id, and the caller is told how many), then one character at a time
//! from the logits after the last `block` characters, on the CPU.

use super::model;
use super::modelfile::TransformerModel;
use crate::cpu::SeededRng;
use crate::sampling::sample;
use anyhow::{Result, bail};
use rand::SeedableRng;

/// The continuation of `prompt`: `length` characters, and how many of the prompt's were unknown.
pub fn generate(
    model: &TransformerModel,
    prompt: &str,
    length: usize,
    temperature: f32,
    top_k: Option<usize>,
    seed: u64,
) -> Result<(String, usize)> {
    if prompt.is_empty() {
        bail!("the prompt is empty; give at least one character, e.g. --prompt \"ROMEO:\"");
    }
    let (mut ids, unknown) = model.vocab.encode(prompt);
    let mut rng = SeededRng::seed_from_u64(seed);
    let first = ids.len();
    for _ in 0..length {
        let logits = model::next_logits(&model.config, &model.params, &ids);
        if logits.iter().any(|l| !l.is_finite()) {
            bail!("the model's output is not finite: its weights are too large to be a trained model");
        }
        ids.push(sample(&logits, temperature, top_k, Some(super::data::UNKNOWN_ID as usize), &mut rng) as u32);
    }
    Ok((model.vocab.decode(&ids[first..]), unknown))
}
