//! An MNIST model file, MLP or CNN, as an ONNX model: both are layer stacks whose flat parameters are the
//! stack's own layout (`Linear(784, H), act, Linear(H, 10)`; the CNN's conv3x3, ReLU, maxpool2 twice,
//! then `Flatten, Linear(fc), ReLU, Linear(classes)`), so each is written as that stack
//! (`nn::stack::onnx`): input `input` of 28×28 images scaled as in training, outputs `logits` and
//! `probabilities`.

use super::{Classifier, mlp};
use crate::nn::stack::model::Network;
use crate::nn::stack::onnx::{Head, model};
use crate::nn::stack::spec::{Layer, Shape, Spec};
use anyhow::Result;

/// The CNN of `shape` as a layer stack over `side`×`side` greyscale images.
fn cnn_network(shape: super::cnn::CnnShape) -> Result<Network> {
    let conv = |inputs, outputs| Layer::Conv2d { inputs, outputs, kernel: 3, stride: 1, padding: 1 };
    let layers = vec![
        conv(1, shape.c1),
        Layer::Relu,
        Layer::MaxPool2d(2),
        conv(shape.c1, shape.c2),
        Layer::Relu,
        Layer::MaxPool2d(2),
        Layer::Flatten,
        Layer::Linear { inputs: None, outputs: shape.fc, bias: true },
        Layer::Relu,
        Layer::Linear { inputs: None, outputs: shape.classes, bias: true },
    ];
    Network::new(&Spec { layers }, Shape::Image { channels: 1, height: shape.side, width: shape.side })
}

/// An MNIST model file's bytes as an ONNX file's (`pipeline::OnnxExport`).
pub fn export_file(bytes: &[u8]) -> Result<Vec<u8>> {
    let (classifier, meta) = Classifier::from_safetensors(bytes)?;
    let (net, params, classes) = match classifier {
        Classifier::Mlp(p) => (mlp::network(p.shape)?, p.flat, p.shape.classes),
        Classifier::Cnn(p) => (cnn_network(p.shape)?, p.flat, p.shape.classes),
    };
    assert_eq!(params.len(), net.param_count, "the stack's layout is the MNIST model's");
    let names = meta
        .get("class_names")
        .and_then(|n| serde_json::from_str::<Vec<String>>(n).ok())
        .filter(|n| n.len() == classes)
        .unwrap_or_else(|| (0..classes).map(|c| c.to_string()).collect());
    let dataset = meta.get("dataset").map_or("mnist", String::as_str);
    let input = format!("{dataset} images, {}", super::INPUT_SCALING);
    model(&net, &params, Head::Classes(&names), &[("input", input)])
}
