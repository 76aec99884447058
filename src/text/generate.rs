//! `textnet generate`: continues a prompt by sampling from a model file one token at a time, on the CPU.
//! The model kinds that generate are one enum, so a later kind (the character-level Transformer) adds a
//! variant; a model file of another kind is refused with what it is.

use super::model::{Activations, forward};
use super::modelfile::{self, TextModel};
use super::vocab::UNK_ID;
use crate::console;
use crate::cpu::SeededRng;
use anyhow::{Context, Result, bail};
use rand::{RngExt, SeedableRng};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[arg(
        long,
        allow_hyphen_values = true,
        help = "The text to continue (the model's tokenizer splits it; words outside its vocabulary read as <unk>)"
    )]
    pub prompt: String,
    /// Tokens to generate (characters, for a Transformer model), at most 100,000
    #[arg(long, default_value_t = 50)]
    pub length: usize,
    /// Softmax temperature: 1 samples the model's own distribution, lower is more conservative, 0 always
    /// takes the likeliest token
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Sample only among the K likeliest tokens
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Seed of the sampling
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Model file written by `textnet train` or `textnet transformer`
    #[arg(long, default_value = "textnet.safetensors")]
    pub model: PathBuf,
    /// Print one JSON object (the tokens as a list too)
    #[arg(long)]
    pub json: bool,
}

/// A model file that can continue text.
pub enum Generator {
    /// The next-token model of `textnet train`.
    Text(TextModel),
    /// The character-level Transformer of `textnet transformer`.
    Transformer(crate::transformer::modelfile::TransformerModel),
}

impl Generator {
    pub fn load(path: &Path) -> Result<Generator> {
        let bytes = crate::fsutil::read_input(path, "model file")?;
        let kind = safetensors::SafeTensors::read_metadata(&bytes)
            .ok()
            .and_then(|(_, header)| {
                let meta = header.metadata().as_ref()?;
                meta.get("format").or_else(|| meta.get("kind")).cloned()
            })
            .unwrap_or_default();
        match kind.as_str() {
            modelfile::FORMAT => Ok(Generator::Text(TextModel::from_bytes(&bytes).with_context(|| format!("model file {}", path.display()))?)),
            crate::transformer::modelfile::FORMAT => Ok(Generator::Transformer(
                crate::transformer::modelfile::TransformerModel::from_bytes(&bytes).with_context(|| format!("model file {}", path.display()))?,
            )),
            crate::mnist::model::FORMAT => bail!("{} is an MNIST classifier: it does not generate text", path.display()),
            crate::xor::modelfile::KIND => bail!("{} is an XOR network: it does not generate text", path.display()),
            _ => bail!("{} is not a textnet model that generates text", path.display()),
        }
    }
}

/// The index drawn from `logits` at `temperature` (0: the largest), among the `top_k` largest, never
/// `<unk>` while another candidate is left.
pub fn sample(logits: &[f32], temperature: f32, top_k: Option<usize>, rng: &mut SeededRng) -> usize {
    let mut candidates: Vec<usize> = (0..logits.len()).filter(|&i| i != UNK_ID as usize || logits.len() == 1).collect();
    candidates.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    candidates.truncate(top_k.unwrap_or(usize::MAX).max(1));
    if temperature == 0.0 || candidates.len() == 1 {
        return candidates[0];
    }
    let max = logits[candidates[0]];
    let weights: Vec<f64> = candidates.iter().map(|&i| (((logits[i] - max) / temperature) as f64).exp()).collect();
    let mut draw = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (&i, w) in candidates.iter().zip(&weights) {
        if draw < *w {
            return i;
        }
        draw -= w;
    }
    *candidates.last().expect("at least one candidate")
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
pub fn generate(model: &TextModel, prompt: &str, length: usize, temperature: f32, top_k: Option<usize>, seed: u64) -> Result<(Vec<String>, Vec<String>)> {
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
        let next = sample(&acts.logits, temperature, top_k, &mut rng) as u32;
        ids.push(next);
        generated.push(model.vocab.token(next).to_string());
    }
    Ok((prompt, generated))
}

/// The most tokens (or characters) one `generate` writes.
pub const MAX_LENGTH: usize = 100_000;

pub fn run(args: GenerateArgs) -> Result<()> {
    if !(1..=MAX_LENGTH).contains(&args.length) {
        bail!("--length must be between 1 and {MAX_LENGTH}, got {}", args.length);
    }
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        bail!("--temperature must be 0 or more, got {}", args.temperature);
    }
    if args.top_k == Some(0) {
        bail!("--top-k must be at least 1");
    }
    let model = match Generator::load(&args.model)? {
        Generator::Text(model) => model,
        Generator::Transformer(model) => return run_transformer(&args, &model),
    };
    let (prompt, generated) = generate(&model, &args.prompt, args.length, args.temperature, args.top_k, args.seed)?;
    let text = join(&prompt.iter().chain(&generated).cloned().collect::<Vec<_>>());
    if args.json {
        console::out(&json!({
            "model": args.model.display().to_string(), "prompt": prompt, "tokens": generated, "text": text,
            "temperature": crate::report::decimal(args.temperature), "top_k": args.top_k, "seed": args.seed,
        }).to_string());
    } else {
        console::out(&text);
    }
    Ok(())
}

/// `textnet generate` with a Transformer: characters, not tokens (--length counts characters).
fn run_transformer(args: &GenerateArgs, model: &crate::transformer::modelfile::TransformerModel) -> Result<()> {
    let (generated, unknown) =
        crate::transformer::generate::generate(model, &args.prompt, args.length, args.temperature, args.top_k, args.seed)?;
    if unknown > 0 {
        console::err(&format!(
            "note: {unknown} character{} of the prompt {} not in the model's vocabulary and read as unknown",
            if unknown == 1 { "" } else { "s" },
            if unknown == 1 { "is" } else { "are" }
        ));
    }
    if args.json {
        console::out(&json!({
            "model": args.model.display().to_string(), "prompt": args.prompt, "generated": generated,
            "text": format!("{}{generated}", args.prompt), "unknown_prompt_chars": unknown,
            "temperature": crate::report::decimal(args.temperature), "top_k": args.top_k, "seed": args.seed,
        }).to_string());
    } else {
        console::out(&format!("{}{generated}", args.prompt));
    }
    Ok(())
}
