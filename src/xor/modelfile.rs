//! The XOR model file: `.safetensors` with the tensors `w1` `[H,2]`, `b1` `[H]`, `w2` `[1,H]`, `b2` `[1]` as
//! little-endian F32 (PyTorch's `nn.Linear` layouts, so `load_state_dict` takes them) and string metadata
//! `kind` (`xor`), `activation` and `hidden`.

use super::model::XorParams;
use crate::ops::activations::Activation;
use anyhow::{Context, Result, anyhow, bail};
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::path::Path;

/// The model file's `format` tag.
pub const KIND: &str = crate::io::modelkind::XOR.tag;

/// The model as .safetensors bytes: its tensors, and the kind and activation in the metadata.
pub fn to_bytes(p: &XorParams) -> Result<Vec<u8>> {
    let metadata = BTreeMap::from([
        crate::io::modelkind::XOR.entry(),
        ("activation".to_string(), p.activation.name().to_string()),
        ("hidden".to_string(), p.hidden().to_string()),
    ]);
    let tensors = p.tensors();
    let tensors: Vec<(&str, &[f32], Vec<usize>)> =
        tensors.iter().map(|(name, values, dims)| (*name, values.as_slice(), dims.clone())).collect();
    crate::io::tensorfile::to_bytes(&tensors, metadata)
}

/// Writes the model to `path` (atomically).
pub fn save(p: &XorParams, path: &Path) -> Result<()> {
    crate::io::fsutil::write_atomic(path, &to_bytes(p)?)
}

/// Reads an XOR model file.
pub fn load(path: &Path) -> Result<XorParams> {
    let bytes = crate::io::fsutil::read_input(path, "model file")?;
    from_bytes(&bytes).with_context(|| format!("model file {}", path.display()))
}

/// Parses .safetensors bytes as an XOR model; errors when they hold another kind of model.
pub fn from_bytes(bytes: &[u8]) -> Result<XorParams> {
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| anyhow!("not a safetensors file ({e})"))?;
    let meta = header.metadata().clone().unwrap_or_default();
    crate::io::modelkind::XOR.check(Some(&meta), "textnet XOR model file")?;
    let activation = meta
        .get("activation")
        .and_then(|a| Activation::from_name(a))
        .ok_or_else(|| anyhow!("metadata entry \"activation\" is missing or unknown"))?;
    let hidden: usize = meta
        .get("hidden")
        .and_then(|h| h.parse().ok())
        .filter(|&h| h >= 1)
        .ok_or_else(|| anyhow!("metadata entry \"hidden\" is missing or not a positive number"))?;
    let tensors = SafeTensors::deserialize(bytes).map_err(|e| anyhow!("invalid safetensors file: {e}"))?;
    let read = |name: &str, dims: &[usize]| crate::io::tensorfile::read_f32(&tensors, name, dims);
    let p = XorParams {
        activation,
        w1: read("w1", &[hidden, 2])?,
        b1: read("b1", &[hidden])?,
        w2: read("w2", &[1, hidden])?,
        b2: read("b2", &[1])?[0],
    };
    if !p.all_finite() {
        bail!("the parameters contain NaN or infinite values");
    }
    Ok(p)
}
