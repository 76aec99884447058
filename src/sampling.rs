//! Drawing the next token from a model's logits, for every pipeline that generates: temperature, top-k,
//! and an id that is never drawn while another is left (the unknown token). On the CPU: one draw per
//! generated token, next to a forward pass that costs far more.

use crate::cpu::SeededRng;
use rand::RngExt;
use std::path::PathBuf;

/// The flags of `textnet generate`, shared by every pipeline that generates.
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

/// The most tokens (or characters) one `generate` writes.
pub const MAX_LENGTH: usize = 100_000;

/// The index drawn from `logits` at `temperature` (0: the largest), among the `top_k` largest, never
/// `skip` (the unknown token's id) while another candidate is left.
pub fn sample(
    logits: &[f32],
    temperature: f32,
    top_k: Option<usize>,
    skip: Option<usize>,
    rng: &mut SeededRng,
) -> usize {
    let mut candidates: Vec<usize> = (0..logits.len()).filter(|&i| Some(i) != skip || logits.len() == 1).collect();
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
