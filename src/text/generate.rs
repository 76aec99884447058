//! Sampling a continuation from the next-token text model, one token at a time on the CPU, and joining
//! the tokens for reading: `textnet generate` for text model files.

use super::model::{Activations, forward};
use super::modelfile::TextModel;
use super::vocab::UNK_ID;
use crate::console;
use crate::cpu::SeededRng;
use crate::sampling::{GenerateArgs, sample};
use anyhow::{Context, Result, bail};
use rand::SeedableRng;
use serde_json::json;

/// `textnet generate` with a text model file's bytes.
pub fn run(bytes: &[u8], args: &GenerateArgs) -> Result<()> {
    let model = TextModel::from_bytes(bytes).with_context(|| format!("model file {}", args.model.display()))?;
    let (prompt, generated) = generate(&model, &args.prompt, args.length, args.temperature, args.top_k, args.seed)?;
    let text = join(&prompt.iter().chain(&generated).cloned().collect::<Vec<_>>());
    if args.json {
        console::out(
            &json!({
                "model": args.model.display().to_string(), "prompt": prompt, "tokens": generated, "text": text,
                "temperature": crate::report::decimal(args.temperature), "top_k": args.top_k, "seed": args.seed,
            })
            .to_string(),
        );
    } else {
        console::out(&text);
    }
    Ok(())
}

/// Tokens joined for reading: a space between them, none before closing punctuation or after an opening
/// bracket.
pub fn join(tokens: &[String]) -> String {
    let mut out = String::new();
    for token in tokens {
        let closing = token.starts_with(['.', ',', ';', ':', '!', '?', ')', ']', '}', '\'', '’']);
        if !out.is_empty() && !closing && !out.ends_with(['(', '[', '{']) {
            out.push(' ');
        }
        out.push_str(token);
    }
    out
}

/// The prompt's tokens and `length` generated ones.
pub fn generate(
    model: &TextModel,
    prompt: &str,
    length: usize,
    temperature: f32,
    top_k: Option<usize>,
    seed: u64,
) -> Result<(Vec<String>, Vec<String>)> {
    let prompt: Vec<String> = model.tokenizer.tokens(prompt).map(|t| t.into_owned()).collect();
    if prompt.is_empty() {
        bail!("the prompt has no tokens; give some words, e.g. --prompt \"to be or\"");
    }
    let n = model.params.shape.context;
    let mut ids: Vec<u32> = prompt.iter().map(|t| model.vocab.id(t)).collect();
    let mut rng = SeededRng::seed_from_u64(seed);
    let mut acts = Activations::new(model.params.shape);
    let mut generated = Vec::new();
    for _ in 0..length {
        forward(&model.params, &ids[ids.len().saturating_sub(n)..], &mut acts);
        if acts.logits.iter().any(|l| !l.is_finite()) {
            bail!("the model's output is not finite: its weights are too large to be a trained model");
        }
        let next = sample(&acts.logits, temperature, top_k, Some(UNK_ID as usize), &mut rng) as u32;
        ids.push(next);
        generated.push(model.vocab.token(next).to_string());
    }
    Ok((prompt, generated))
}
