//! A `textnet fit` model (also the Python package's `Sequential`) as an ONNX model: input `input`, a batch
//! of the network's inputs (`[batch, features]` or `[batch, channels, height, width]`, as `fit` and
//! `Sequential` hand them to the network: images scaled, a table's row made its feature vector), the
//! layers (`nn::stack::onnx`), then for a model of classes `logits` and their softmax `probabilities`,
//! for a model of a value `values` in the target's units (the network's output × std + mean), as
//! `Sequential.predict` gives them. Class names and the input's description go into the metadata.

use super::data::{InputSchema, TargetInfo};
use super::modelfile::{self, FitModel};
use crate::nn::stack::onnx::{dims, layers};
use crate::onnx::{BATCH, Dim, Graph, int};
use anyhow::Result;

/// The model as the bytes of an ONNX file.
pub fn export(model: &FitModel) -> Result<Vec<u8>> {
    let net = &model.net;
    let mut graph = Graph::new();
    let input = graph.input("input", &dims(net.shapes[0]));
    let out = layers(&mut graph, net, &model.params, &input);
    let out_dims = [Dim::Named(BATCH), Dim::Fixed(net.outputs())];
    let mut metadata = vec![("input".to_string(), input_description(&model.input))];
    match &model.target {
        TargetInfo::Classes { names } => {
            let logits = graph.output(&out, "logits", &out_dims);
            let probabilities = graph.node("Softmax", &[&logits], vec![int("axis", 1)], "softmax");
            graph.output(&probabilities, "probabilities", &out_dims);
            metadata.push(("class_names".into(), serde_json::to_string(names)?));
        }
        TargetInfo::Value { name, mean, std } => {
            let scale = graph.weight("target.std", &[], &[*std]);
            let shift = graph.weight("target.mean", &[], &[*mean]);
            let scaled = graph.node("Mul", &[&out, &scale], vec![], "target.scaled");
            let values = graph.node("Add", &[&scaled, &shift], vec![], "target.values");
            graph.output(&values, "values", &out_dims);
            metadata.push(("target".into(), name.clone()));
        }
    }
    let spec = crate::nn::stack::spec::text(&net.layers);
    let metadata: Vec<(&str, String)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v.clone())).chain([("spec", spec.clone())]).collect();
    Ok(graph.to_bytes("textnet-fit", &format!("textnet fit network: {spec}"), &metadata))
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
