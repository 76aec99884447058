//! The transformer's model file: `.safetensors` with every parameter tensor under its PyTorch
//! `state_dict` name and layout (`model::Layout`: `tok_emb.weight` … `head.bias`) as little-endian F32, so
//! `load_state_dict` takes them, and string metadata that makes it self-contained:
//!
//! | key                                 | value                                                      |
//! |-------------------------------------|------------------------------------------------------------|
//! | `format`                            | `textnet-transformer`                                      |
//! | `vocab`                             | JSON array of the characters in id order, one-character strings, U+FFFD first |
//! | `block`, `embed`, `heads`, `layers` | the sizes (decimal); the vocabulary size is the array's length |
//! | `bias`, `tie_weights`               | `true` or `false` (absent: a model with biases and an untied head) |
//! | `val_loss`                          | the validation loss when it was saved                      |
//! | `steps`                             | the training steps taken                                   |
//!
//! Without biases the `.bias` tensors are absent. With tied weights `head.weight` is written as a copy of
//! `tok_emb.weight`, as a tied PyTorch module's `state_dict` holds both names, and not read back.

use super::data::CharVocab;
use super::model::{Config, Layout};
use anyhow::{Context, Result, anyhow, bail};
use safetensors::SafeTensors;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The model file's `format` tag.
pub const FORMAT: &str = crate::io::modelkind::TRANSFORMER.tag;

/// A trained transformer and what it takes to use it.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerModel {
    /// The model's sizes.
    pub config: Config,
    /// The characters and their ids.
    pub vocab: CharVocab,
    /// Flat, in `Layout` order.
    pub params: Vec<f32>,
    /// The validation loss when the model was saved.
    pub val_loss: f32,
    /// Training steps taken.
    pub steps: usize,
}

impl TransformerModel {
    /// The model as .safetensors bytes: the tensors, and the sizes, vocabulary, loss and steps in the metadata.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let c = self.config;
        if self.vocab.len() != c.vocab {
            bail!("internal: the vocabulary has {} characters but the model {}", self.vocab.len(), c.vocab);
        }
        let layout = Layout::new(&c);
        if self.params.len() != layout.len() {
            bail!("internal: {} parameters for a model of {}", self.params.len(), layout.len());
        }
        let chars: Vec<String> = self.vocab.chars().iter().map(char::to_string).collect();
        let metadata = BTreeMap::from([
            crate::io::modelkind::TRANSFORMER.entry(),
            ("vocab".to_string(), serde_json::to_string(&chars)?),
            ("block".to_string(), c.block.to_string()),
            ("embed".to_string(), c.embed.to_string()),
            ("heads".to_string(), c.heads.to_string()),
            ("layers".to_string(), c.layers.to_string()),
            ("bias".to_string(), c.bias.to_string()),
            ("tie_weights".to_string(), c.tie_weights.to_string()),
            ("val_loss".to_string(), self.val_loss.to_string()),
            ("steps".to_string(), self.steps.to_string()),
        ]);
        let mut tensors: Vec<(&str, &[f32], Vec<usize>)> =
            layout.tensors().iter().map(|t| (t.name.as_str(), &self.params[t.range()], t.shape.clone())).collect();
        if c.tie_weights {
            let tok = layout.get("tok_emb.weight").expect("every model has tok_emb");
            tensors.push(("head.weight", &self.params[tok.range()], tok.shape.clone()));
        }
        crate::io::tensorfile::to_bytes(&tensors, metadata)
    }

    /// Writes the model to `path` (atomically).
    pub fn save(&self, path: &Path) -> Result<()> {
        crate::io::fsutil::write_atomic(path, &self.to_bytes()?)
    }

    /// Reads a Transformer model file.
    pub fn load(path: &Path) -> Result<TransformerModel> {
        let bytes = crate::io::fsutil::read_input(path, "model file")?;
        TransformerModel::from_bytes(&bytes).with_context(|| format!("model file {}", path.display()))
    }

    /// Parses .safetensors bytes as a Transformer model; errors when they hold another kind of model.
    pub fn from_bytes(bytes: &[u8]) -> Result<TransformerModel> {
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| anyhow!("not a safetensors file ({e})"))?;
        let no_metadata = HashMap::new();
        let meta = header.metadata().as_ref().unwrap_or(&no_metadata);
        crate::io::modelkind::TRANSFORMER.check(Some(meta), "textnet transformer model file")?;
        let entry =
            |key: &str| meta.get(key).map(String::as_str).ok_or_else(|| anyhow!("metadata entry {key:?} is missing"));
        let number = |key: &str| -> Result<usize> {
            let value = entry(key)?;
            value.parse().map_err(|_| anyhow!("metadata entry {key:?} is not a number: {value:?}"))
        };
        let chars: Vec<String> = serde_json::from_str(entry("vocab")?)
            .map_err(|e| anyhow!("metadata entry \"vocab\" is not a JSON array of strings: {e}"))?;
        let chars = chars
            .iter()
            .map(|s| {
                let mut it = s.chars();
                match (it.next(), it.next()) {
                    (Some(c), None) => Ok(c),
                    _ => Err(anyhow!("metadata entry \"vocab\" lists {s:?}, not one character")),
                }
            })
            .collect::<Result<Vec<char>>>()?;
        let vocab = CharVocab::from_chars(chars).map_err(|e| anyhow!("metadata entry \"vocab\": {e}"))?;
        let flag = |key: &str, absent: bool| -> Result<bool> {
            match meta.get(key).map(String::as_str) {
                None => Ok(absent),
                Some("true") => Ok(true),
                Some("false") => Ok(false),
                Some(value) => bail!("metadata entry {key:?} is neither true nor false: {value:?}"),
            }
        };
        let config = Config {
            vocab: vocab.len(),
            block: number("block")?,
            embed: number("embed")?,
            heads: number("heads")?,
            layers: number("layers")?,
            bias: flag("bias", true)?,
            tie_weights: flag("tie_weights", false)?,
        };
        config.validate().map_err(|e| anyhow!("invalid sizes in the metadata: {e}"))?;
        let val_loss = entry("val_loss")?;
        let val_loss: f32 =
            val_loss.parse().map_err(|_| anyhow!("metadata entry \"val_loss\" is not a number: {val_loss:?}"))?;
        let steps = number("steps")?;
        let tensors = SafeTensors::deserialize(bytes).map_err(|e| anyhow!("invalid safetensors file: {e}"))?;
        sizes_match_tensors(&config, &tensors)?;
        let layout = Layout::new(&config);
        let mut params = Vec::with_capacity(layout.len());
        for t in layout.tensors() {
            params.extend(crate::io::tensorfile::read_f32(&tensors, &t.name, &t.shape)?);
        }
        if !params.iter().all(|v| v.is_finite()) {
            bail!("the parameters contain NaN or infinite values");
        }
        Ok(TransformerModel { config, vocab, params, val_loss, steps })
    }
}

/// Checks the metadata's sizes against the tensors the file holds before anything is sized by them
/// (a layout of `layers` blocks, vectors of `block × embed`): a file that claims a billion layers or an
/// embedding of 10^12 rows is refused here rather than by an allocation that aborts.
fn sizes_match_tensors(config: &Config, tensors: &SafeTensors) -> Result<()> {
    // More layers than tensors cannot be; fewer missing tensors are named one by one when read.
    if config.layers > tensors.len() {
        let expected = config.layers.saturating_mul(super::model::BLOCK_TENSORS.len()).saturating_add(FIXED_TENSORS);
        bail!(
            "the metadata says {} layers ({expected} tensors) but the file holds {} tensors",
            config.layers,
            tensors.len()
        );
    }
    for (name, rows, what) in [("tok_emb.weight", config.vocab, "vocab"), ("pos_emb.weight", config.block, "block")] {
        let shape = tensors.tensor(name).map_err(|e| anyhow!("tensor {name}: {e}"))?.shape().to_vec();
        if shape != [rows, config.embed] {
            bail!("the metadata says {what} {rows} and embed {} but tensor {name} is {shape:?}", config.embed);
        }
    }
    Ok(())
}

/// The tensors outside the blocks: the two embeddings, the last LayerNorm's two and the head's two.
const FIXED_TENSORS: usize = 6;
