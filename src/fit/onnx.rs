//! A `textnet fit` model (also the Python package's `Sequential`) as an ONNX model (`nn::stack::onnx`):
//! input `input`, a batch of the network's inputs (`[batch, features]` or `[batch, channels, height,
//! width]`, as `fit` and `Sequential` hand them to the network: images scaled, a table's row made its
//! feature vector), outputs `logits` and `probabilities` for classes or `values` for a value, as
//! `Sequential.predict` gives them. What the input is goes into the metadata.

use super::data::{InputSchema, TargetInfo};
use super::modelfile::{self, FitModel};
use crate::nn::stack::onnx::{Head, model};
use anyhow::Result;

/// The model as the bytes of an ONNX file.
pub fn export(m: &FitModel) -> Result<Vec<u8>> {
    let head = match &m.target {
        TargetInfo::Classes { names } => Head::Classes(names),
        TargetInfo::Value { name, mean, std } => Head::Value { name, mean: *mean, std: *std },
    };
    model(&m.net, &m.params, head, &[("input", input_description(&m.input))])
}

/// What `input` holds, in words for the file's metadata.
fn input_description(input: &InputSchema) -> String {
    match input {
        InputSchema::Images { dataset, scaling, .. } => format!("{dataset} images, {scaling}"),
        InputSchema::Array { .. } => "arrays as given to Sequential.fit".into(),
        InputSchema::Table(t) => format!(
            "a table row as its {} features (numbers standardised, categories one-hot, dates as features): {}",
            t.feature_names.len(),
            t.feature_names.join(", ")
        ),
    }
}

/// A fit model file's bytes as an ONNX file's (`pipeline::OnnxExport`).
pub fn export_file(bytes: &[u8]) -> Result<Vec<u8>> {
    export(&modelfile::from_bytes(bytes)?)
}
