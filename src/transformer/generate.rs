//! Sampling from a Transformer model file for `textnet generate`: the prompt's characters (those outside
//! the vocabulary read as the unknown id, and the caller is told how many), then one character at a time
//! from the logits after the last `block` characters, on the CPU.

use super::model;
use super::modelfile::TransformerModel;
use crate::console;
use crate::cpu::SeededRng;
use crate::sampling::{GenerateArgs, sample};
use anyhow::{Context, Result, bail};
use rand::SeedableRng;
use serde_json::json;

/// `textnet generate` with a Transformer model file's bytes: characters, not tokens (--length counts
/// characters).
pub fn run(bytes: &[u8], args: &GenerateArgs) -> Result<()> {
    let model = TransformerModel::from_bytes(bytes).with_context(|| format!("model file {}", args.model.display()))?;
    let (generated, unknown) = generate(&model, &args.prompt, args.length, args.temperature, args.top_k, args.seed)?;
    if unknown > 0 {
        console::err(&format!(
            "note: {unknown} character{} of the prompt {} not in the model's vocabulary and read as unknown",
            if unknown == 1 { "" } else { "s" },
            if unknown == 1 { "is" } else { "are" }
        ));
    }
    if args.json {
        console::out(
            &json!({
                "model": args.model.display().to_string(), "prompt": args.prompt, "generated": generated,
                "text": format!("{}{generated}", args.prompt), "unknown_prompt_chars": unknown,
                "temperature": crate::report::decimal(args.temperature), "top_k": args.top_k, "seed": args.seed,
            })
            .to_string(),
        );
    } else {
        console::out(&format!("{}{generated}", args.prompt));
    }
    Ok(())
}

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
