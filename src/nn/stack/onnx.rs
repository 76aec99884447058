//! A layer stack as an ONNX graph (`crate::io::onnx`), layer by layer as its CPU reference computes it in
//! evaluation: `Linear` is `Gemm` (transB = 1, `nn.Linear`'s layout), `Conv2d` is `Conv`, `MaxPool2d(k)`
//! is `MaxPool` of a k×k window and stride k (the floor of the size, as `Spec::chain`), `Flatten` is
//! `Flatten` (axis 1) on images and nothing on features, `ReLU`, `Sigmoid` and `Tanh` are their operators,
//! `GELU` its tanh form (`Graph::gelu_tanh`), and `Dropout` nothing (it is off in evaluation). The
//! weights are initializers under the `state_dict` names (`0.weight`, `0.bias`, …).
//!
//! `model` makes the whole file: input `input`, a batch of the network's inputs, then for a model of
//! classes the outputs `logits` and their softmax `probabilities`, for a model of values `values` in the
//! target's units (the network's output × std + mean).

use super::model::Network;
use super::spec::{Layer, Shape};
use crate::io::onnx::{BATCH, Dim, Graph, int, ints};

/// What a network's outputs mean, which names the graph's outputs.
#[derive(Clone, Copy, Debug)]
pub enum Head<'a> {
    /// Scores of these classes: outputs `logits` and `probabilities`.
    Classes(&'a [String]),
    /// A value, standardised in training: output `values`, the network's output × `std` + `mean`.
    Value {
        /// The target's name.
        name: &'a str,
        /// The target's mean.
        mean: f32,
        /// The target's standard deviation.
        std: f32,
    },
}

/// The network as the bytes of an ONNX file (the module comment), with `metadata` besides the class names
/// or target and the spec.
pub fn model(net: &Network, params: &[f32], head: Head, metadata: &[(&str, String)]) -> anyhow::Result<Vec<u8>> {
    let mut graph = Graph::new();
    let input = graph.input("input", &dims(net.shapes[0]));
    let out = layers(&mut graph, net, params, &input);
    let out_dims = [Dim::Named(BATCH), Dim::Fixed(net.outputs())];
    let spec = super::spec::text(&net.layers);
    let mut metadata = metadata.to_vec();
    metadata.push(("spec", spec.clone()));
    match head {
        Head::Classes(names) => {
            let logits = graph.output(&out, "logits", &out_dims);
            let probabilities = graph.node("Softmax", &[&logits], vec![int("axis", 1)], "softmax");
            graph.output(&probabilities, "probabilities", &out_dims);
            metadata.push(("class_names", serde_json::to_string(names)?));
        }
        Head::Value { name, mean, std } => {
            let scale = graph.weight("target.std", &[], &[std]);
            let shift = graph.weight("target.mean", &[], &[mean]);
            let scaled = graph.node("Mul", &[&out, &scale], vec![], "target.scaled");
            let values = graph.node("Add", &[&scaled, &shift], vec![], "target.values");
            graph.output(&values, "values", &out_dims);
            metadata.push(("target", name.to_string()));
        }
    }
    Ok(graph.to_bytes("textnet-layers", &format!("textnet layer network: {spec}"), &metadata))
}

/// The dimensions of a batch of samples of shape `s`, the batch named.
pub fn dims(s: Shape) -> Vec<Dim> {
    match s {
        Shape::Flat(n) => vec![Dim::Named(BATCH), Dim::Fixed(n)],
        Shape::Image { channels, height, width } => {
            vec![Dim::Named(BATCH), Dim::Fixed(channels), Dim::Fixed(height), Dim::Fixed(width)]
        }
    }
}

/// Adds the network's layers to `graph`, reading value `input` (a batch of `net.shapes[0]`); returns the
/// value of its outputs (`input` itself for a network of layers that are all identities in evaluation).
pub fn layers(graph: &mut Graph, net: &Network, params: &[f32], input: &str) -> String {
    assert_eq!(params.len(), net.param_count, "parameter vector of another network");
    let mut x = input.to_string();
    let tensors = net.tensors();
    let tensor = |name: String| {
        let (_, dims, range) = tensors.iter().find(|(n, _, _)| *n == name).expect("a layer's own tensor");
        (name, dims.clone(), &params[range.clone()])
    };
    for (i, layer) in net.layers.iter().enumerate() {
        let out = format!("{i}.out");
        x = match *layer {
            Layer::Linear { bias, .. } => {
                let (name, dims, w) = tensor(format!("{i}.weight"));
                let w = graph.weight(&name, &dims, w);
                let mut inputs = vec![x.as_str(), w.as_str()];
                let b = bias.then(|| {
                    let (name, dims, b) = tensor(format!("{i}.bias"));
                    graph.weight(&name, &dims, b)
                });
                inputs.extend(b.as_deref());
                graph.node("Gemm", &inputs, vec![int("transB", 1)], &out)
            }
            Layer::Conv2d { kernel, stride, padding, .. } => {
                let (name, dims, w) = tensor(format!("{i}.weight"));
                let w = graph.weight(&name, &dims, w);
                let (name, dims, b) = tensor(format!("{i}.bias"));
                let b = graph.weight(&name, &dims, b);
                let (k, s, p) = (kernel as i64, stride as i64, padding as i64);
                let attributes =
                    vec![ints("kernel_shape", &[k, k]), ints("strides", &[s, s]), ints("pads", &[p, p, p, p])];
                graph.node("Conv", &[&x, &w, &b], attributes, &out)
            }
            Layer::MaxPool2d(k) => {
                let k = k as i64;
                graph.node("MaxPool", &[&x], vec![ints("kernel_shape", &[k, k]), ints("strides", &[k, k])], &out)
            }
            Layer::Flatten => match net.shapes[i] {
                Shape::Image { .. } => graph.node("Flatten", &[&x], vec![int("axis", 1)], &out),
                Shape::Flat(_) => x,
            },
            Layer::Relu => graph.node("Relu", &[&x], vec![], &out),
            Layer::Sigmoid => graph.node("Sigmoid", &[&x], vec![], &out),
            Layer::Tanh => graph.node("Tanh", &[&x], vec![], &out),
            Layer::Gelu => graph.gelu_tanh(&x, &format!("{i}.gelu")),
            Layer::Dropout(_) => x,
        };
    }
    x
}
