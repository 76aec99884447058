//! The model file: one `.safetensors` file (readable by Python's `safetensors.torch.load_file`) with the
//! tensors `embedding` `[V,D]`, `w1` `[H,D]`, `b1` `[H]`, `w2` `[V,H]`, `b2` `[V]` as little-endian F32, and string
//! metadata that makes it self-contained for `predict`:
//!
//! | key              | value                                           |
//! |------------------|-------------------------------------------------|
//! | `format`         | `textnet-text`                                  |
//! | `format_version` | `1`                                             |
//! | `vocab_size`, `embed`, `hidden`, `context` | the model shape (decimal)  |
//! | `lowercase`      | `true` or `false` (tokenizer setting)           |
//! | `vocabulary`     | JSON array of the token strings in id order     |
//!
//! Written atomically; read into memory whole. Every way a file can be wrong is a one-line error.

use super::model::{TextParams, TextShape};
use super::tokenizer::Tokenizer;
use super::vocab::Vocab;
use anyhow::{Context, Result, anyhow, bail};
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The model file's `format` tag.
pub const FORMAT: &str = crate::io::modelkind::TEXT.tag;
/// Version of the model file layout, in its metadata.
pub const FORMAT_VERSION: u32 = 1;

/// Everything `predict` needs: the parameters, how to split text, and what the ids mean.
#[derive(Clone, Debug, PartialEq)]
pub struct TextModel {
    /// The trained parameters.
    pub params: TextParams,
    /// How text is split into tokens.
    pub tokenizer: Tokenizer,
    /// The token of each id.
    pub vocab: Vocab,
}

impl TextModel {
    /// The model as .safetensors bytes: the five tensors, and the shape, tokenizer and vocabulary in the metadata.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let shape = self.params.shape;
        if self.vocab.len() != shape.vocab {
            bail!("internal: the vocabulary has {} tokens but the model {}", self.vocab.len(), shape.vocab);
        }
        let metadata = BTreeMap::from([
            crate::io::modelkind::TEXT.entry(),
            ("format_version".to_string(), FORMAT_VERSION.to_string()),
            ("vocab_size".to_string(), shape.vocab.to_string()),
            ("embed".to_string(), shape.embed.to_string()),
            ("hidden".to_string(), shape.hidden.to_string()),
            ("context".to_string(), shape.context.to_string()),
            ("lowercase".to_string(), self.tokenizer.lowercase.to_string()),
            ("tokenizer".to_string(), self.tokenizer.description()),
            ("vocabulary".to_string(), serde_json::to_string(self.vocab.tokens())?),
        ]);
        let tensors = self.params.tensors();
        let tensors: Vec<(&str, &[f32], Vec<usize>)> =
            tensors.iter().map(|(name, values, dims)| (*name, *values, dims.clone())).collect();
        crate::io::tensorfile::to_bytes(&tensors, metadata)
    }

    /// Writes the model to `path` (atomically).
    pub fn save(&self, path: &Path) -> Result<()> {
        crate::io::fsutil::write_atomic(path, &self.to_bytes()?)
    }

    /// Reads a text model file.
    pub fn load(path: &Path) -> Result<TextModel> {
        let bytes = crate::io::fsutil::read_input(path, "model file")?;
        TextModel::from_bytes(&bytes).with_context(|| format!("model file {}", path.display()))
    }

    /// Parses .safetensors bytes as a text model; errors when they hold another kind of model.
    pub fn from_bytes(bytes: &[u8]) -> Result<TextModel> {
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(describe_format_error)?;
        let tensors = SafeTensors::deserialize(bytes).map_err(describe_format_error)?;
        let no_metadata = HashMap::new();
        let meta = Metadata(header.metadata().as_ref().unwrap_or(&no_metadata));

        crate::io::modelkind::TEXT.check(header.metadata().as_ref(), "text model of textnet train")?;
        let version: u32 = meta.parse("format_version")?;
        if version != FORMAT_VERSION {
            bail!("format version {version} is not supported (this textnet reads version {FORMAT_VERSION})");
        }
        let shape = TextShape {
            vocab: meta.parse("vocab_size")?,
            embed: meta.parse("embed")?,
            hidden: meta.parse("hidden")?,
            context: meta.parse("context")?,
        };
        shape.validate().context("invalid shape in the metadata")?;
        let tokenizer = Tokenizer { lowercase: meta.parse("lowercase")? };
        let words: Vec<String> = serde_json::from_str(meta.get("vocabulary")?)
            .map_err(|e| anyhow!("metadata key \"vocabulary\" is not a JSON array of strings: {e}"))?;
        let vocab = Vocab::from_tokens(words).context("invalid metadata key \"vocabulary\"")?;
        if vocab.len() != shape.vocab {
            bail!("the vocabulary lists {} tokens but the metadata says vocab_size {}", vocab.len(), shape.vocab);
        }

        let TextShape { vocab: v, embed: d, hidden: h, .. } = shape;
        let params = TextParams {
            shape,
            embedding: read_f32(&tensors, "embedding", &[v, d])?,
            w1: read_f32(&tensors, "w1", &[h, d])?,
            b1: read_f32(&tensors, "b1", &[h])?,
            w2: read_f32(&tensors, "w2", &[v, h])?,
            b2: read_f32(&tensors, "b2", &[v])?,
        };
        if !params.all_finite() {
            bail!("the parameters contain NaN or infinite values");
        }
        Ok(TextModel { params, tokenizer, vocab })
    }
}

/// The safetensors crate's parse errors, in words that say what is wrong with the file.
fn describe_format_error(e: SafeTensorError) -> anyhow::Error {
    use SafeTensorError::*;
    match e {
        HeaderTooSmall => anyhow!("too short to be a safetensors file"),
        InvalidHeaderLength | MetadataIncompleteBuffer => {
            anyhow!("truncated or corrupt: its size does not match its safetensors header ({e})")
        }
        HeaderTooLarge | InvalidHeader(_) | InvalidHeaderDeserialization(_) => {
            anyhow!("not a safetensors file ({e})")
        }
        other => anyhow!("invalid safetensors file: {other}"),
    }
}

/// The file's string metadata, with errors that name the key.
struct Metadata<'a>(&'a HashMap<String, String>);

impl Metadata<'_> {
    fn get(&self, key: &str) -> Result<&str> {
        self.0.get(key).map(String::as_str).ok_or_else(|| anyhow!("missing metadata key {key:?}"))
    }

    fn parse<T: std::str::FromStr>(&self, key: &str) -> Result<T> {
        let value = self.get(key)?;
        value.parse().map_err(|_| anyhow!("metadata key {key:?} has an invalid value {value:?}"))
    }
}

/// One F32 tensor of the expected shape, copied out of the (possibly unaligned) file bytes.
fn read_f32(tensors: &SafeTensors, name: &str, dims: &[usize]) -> Result<Vec<f32>> {
    let view = tensors.tensor(name).map_err(|_| anyhow!("missing tensor {name:?}"))?;
    if view.dtype() != Dtype::F32 {
        bail!("tensor {name:?} is {}, expected F32", view.dtype());
    }
    if view.shape() != dims {
        bail!("tensor {name:?} has shape {:?} but the metadata implies {dims:?}", view.shape());
    }
    Ok(view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}
