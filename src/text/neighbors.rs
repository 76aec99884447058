//! `textnet neighbors WORD`: the words whose embeddings lie nearest a word's in a trained text model, by
//! cosine similarity over the embedding table (as fastText's `nn`). `<unk>` and the word itself are left
//! out.

use super::modelfile::TextModel;
use super::vocab::UNK_ID;
use crate::harness::console;
use crate::ops::cpu::{dot, top_k};
use anyhow::{Result, bail};
use serde::Serialize;
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
/// The flags of `textnet neighbors`.
pub struct NeighborsArgs {
    /// The word (read with the model's tokenizer: one token)
    #[arg(allow_hyphen_values = true)]
    pub word: String,
    /// How many neighbours to print
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Model file written by `textnet train`
    #[arg(short = 'm', long, default_value = "textnet.safetensors")]
    pub model: PathBuf,
    /// Print one JSON object
    #[arg(long)]
    pub json: bool,
}

/// A word and the cosine similarity of its embedding to the asked word's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Neighbor {
    /// The word.
    pub token: String,
    /// Cosine similarity of its embedding to the asked word's, −1 to 1.
    pub similarity: f32,
}

/// The `k` tokens nearest `word` by cosine similarity of their embedding rows, nearest first.
pub fn neighbors(model: &TextModel, word: &str, k: usize) -> Result<Vec<Neighbor>> {
    if k == 0 {
        bail!("--top must be at least 1");
    }
    let tokens: Vec<String> = model.tokenizer.tokens(word).map(|t| t.into_owned()).collect();
    let [token] = &tokens[..] else {
        bail!("{word:?} is {} tokens for this model's tokenizer; give one word", tokens.len());
    };
    let Some(id) = model.vocab.get(token).filter(|&id| id != UNK_ID) else {
        bail!("{token:?} is not in the model's vocabulary of {} tokens", model.vocab.len());
    };
    let d = model.params.shape.embed;
    let rows: Vec<&[f32]> = model.params.embedding.chunks_exact(d).collect();
    let norm = |row: &[f32]| dot(row, row).sqrt();
    let target = rows[id as usize];
    let target_norm = norm(target);
    let similarity: Vec<f32> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| match i as u32 {
            i if i == id || i == UNK_ID => f32::NEG_INFINITY,
            _ => dot(row, target) / (norm(row) * target_norm).max(f32::MIN_POSITIVE),
        })
        .collect();
    if similarity.iter().any(|s| s.is_nan()) {
        bail!("the model's embeddings are not finite: its weights are too large to be a trained model");
    }
    let candidates = rows.len().saturating_sub(2);
    Ok(top_k(&similarity, k.min(candidates))
        .into_iter()
        .map(|i| Neighbor { token: model.vocab.token(i as u32).to_string(), similarity: similarity[i] })
        .collect())
}

/// Runs `textnet neighbors`.
pub fn run(args: NeighborsArgs) -> Result<()> {
    if args.top == 0 {
        bail!("--top must be at least 1");
    }
    let model = TextModel::load(&args.model)?;
    let found = neighbors(&model, &args.word, args.top)?;
    if args.json {
        console::out(
            &json!({"model": args.model.display().to_string(), "word": args.word, "neighbors": found}).to_string(),
        );
        return Ok(());
    }
    let width = found.iter().map(|n| n.token.chars().count()).max().unwrap_or(0);
    for (rank, n) in found.iter().enumerate() {
        console::out(&format!("{:>3}. {:<width$}  {:.4}", rank + 1, n.token, n.similarity));
    }
    Ok(())
}
