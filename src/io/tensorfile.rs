//! The model files every pipeline writes: safetensors with f32 tensors and string metadata. The same
//! model gives the same bytes: the safetensors crate writes its metadata map in hash order, which changes
//! from run to run, so the header is written again with its keys in sorted order (its length does not
//! change, so every tensor keeps its place).

use anyhow::{Result, bail};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::{BTreeMap, HashMap};

/// Named f32 tensors (row-major, with their shapes) and metadata as safetensors bytes.
pub fn to_bytes(tensors: &[(&str, &[f32], Vec<usize>)], metadata: BTreeMap<String, String>) -> Result<Vec<u8>> {
    let data: Vec<Vec<u8>> =
        tensors.iter().map(|(_, values, _)| values.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let views = tensors
        .iter()
        .zip(&data)
        .map(|((name, _, dims), bytes)| Ok((*name, TensorView::new(Dtype::F32, dims.clone(), bytes)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    let mut bytes = safetensors::serialize(views, Some(metadata.into_iter().collect::<HashMap<_, _>>()))?;
    sort_header(&mut bytes)?;
    Ok(bytes)
}

/// Rewrites the JSON header of safetensors `bytes` with every object's keys in sorted order, padded with
/// spaces to its old length.
fn sort_header(bytes: &mut [u8]) -> Result<()> {
    let len = u64::from_le_bytes(bytes[..8].try_into()?) as usize;
    let header = &bytes[8..8 + len];
    // serde_json's maps are ordered by key (no `preserve_order`), so parsing and printing sorts them.
    let value: serde_json::Value = serde_json::from_slice(header)?;
    let sorted = serde_json::to_vec(&value)?;
    if sorted.len() > len {
        bail!("internal: the sorted safetensors header is longer than the original");
    }
    bytes[8..8 + sorted.len()].copy_from_slice(&sorted);
    bytes[8 + sorted.len()..8 + len].fill(b' ');
    Ok(())
}

/// The f32 tensor `name` of `tensors`, which must have shape `dims`, as values.
pub fn read_f32(tensors: &safetensors::SafeTensors, name: &str, dims: &[usize]) -> Result<Vec<f32>> {
    let t = tensors.tensor(name).map_err(|_| anyhow::anyhow!("tensor {name} is missing"))?;
    if t.dtype() != Dtype::F32 || t.shape() != dims {
        bail!("tensor {name} is {:?} {:?}, expected F32 {dims:?}", t.dtype(), t.shape());
    }
    Ok(t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("four bytes"))).collect())
}
