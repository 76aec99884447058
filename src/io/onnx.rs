//! ONNX files: the messages of `onnx.proto` that a textnet model needs, derived as `prost` structs (field
//! numbers and types as onnx.proto declares them, proto2 `optional` scalars kept optional so that a zero
//! is still written), and `Graph`, which builds one graph node by node and encodes it as a model of
//! operator set `OPSET` of the default domain. The pipelines write their models through it
//! (`pipeline::OnnxExport`); `textnet export --onnx` and the Python package's `export_onnx` save what
//! they write.
//!
//! Every graph takes its batch on axis 0 as the symbolic dimension `batch`; weights are initializers
//! under their `state_dict` names, stored as little-endian `raw_data`.

use prost::Message;

/// The operator set every exported graph uses: 17 (ONNX 1.12), the first with `LayerNormalization`.
pub const OPSET: i64 = 17;
/// The IR version of operator set 17's release.
pub const IR_VERSION: i64 = 8;
/// The name of the symbolic batch dimension on axis 0 of every input and output.
pub const BATCH: &str = "batch";

/// `TensorProto.DataType.FLOAT`.
const FLOAT: i32 = 1;
/// `TensorProto.DataType.INT64`.
const INT64: i32 = 7;

/// `ModelProto`.
#[derive(Clone, PartialEq, Message)]
pub struct ModelProto {
    /// The IR version the model follows.
    #[prost(int64, optional, tag = "1")]
    pub ir_version: Option<i64>,
    /// The operator sets the graph's nodes come from.
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// The tool that wrote it.
    #[prost(string, optional, tag = "2")]
    pub producer_name: Option<String>,
    /// Its version.
    #[prost(string, optional, tag = "3")]
    pub producer_version: Option<String>,
    /// What the model is, for people.
    #[prost(string, optional, tag = "6")]
    pub doc_string: Option<String>,
    /// The computation.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    /// Free key-value pairs (class names, the vocabulary).
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// `OperatorSetIdProto`.
#[derive(Clone, PartialEq, Message)]
pub struct OperatorSetIdProto {
    /// The domain; empty for the default `ai.onnx`.
    #[prost(string, optional, tag = "1")]
    pub domain: Option<String>,
    /// The operator set's version.
    #[prost(int64, optional, tag = "2")]
    pub version: Option<i64>,
}

/// `StringStringEntryProto`.
#[derive(Clone, PartialEq, Message)]
pub struct StringStringEntryProto {
    /// The key.
    #[prost(string, optional, tag = "1")]
    pub key: Option<String>,
    /// The value.
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}

/// `GraphProto`.
#[derive(Clone, PartialEq, Message)]
pub struct GraphProto {
    /// The nodes, in an order where every input is made before it is used.
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// The graph's name.
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    /// The constant tensors: weights, shapes, the causal mask.
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// What the graph is, for people.
    #[prost(string, optional, tag = "10")]
    pub doc_string: Option<String>,
    /// The values the caller gives.
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// The values the graph gives back.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
}

/// `NodeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct NodeProto {
    /// The values it reads.
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// The values it makes.
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// The node's name.
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    /// The operator, e.g. "Gemm".
    #[prost(string, optional, tag = "4")]
    pub op_type: Option<String>,
    /// The operator's attributes.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

/// `AttributeProto`, of the kinds the graphs use: a float, an integer or integers.
#[derive(Clone, PartialEq, Message)]
pub struct AttributeProto {
    /// The attribute's name.
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// `AttributeType`: FLOAT 1, INT 2, INTS 7.
    #[prost(int32, optional, tag = "20")]
    pub r#type: Option<i32>,
    /// A float's value.
    #[prost(float, optional, tag = "2")]
    pub f: Option<f32>,
    /// An integer's value.
    #[prost(int64, optional, tag = "3")]
    pub i: Option<i64>,
    /// Integers' values.
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
}

/// `TensorProto`, with its elements as little-endian `raw_data`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    /// The dimensions.
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    /// `DataType`: FLOAT 1, INT64 7.
    #[prost(int32, optional, tag = "2")]
    pub data_type: Option<i32>,
    /// The tensor's name.
    #[prost(string, optional, tag = "8")]
    pub name: Option<String>,
    /// The elements, row-major, little-endian.
    #[prost(bytes = "vec", optional, tag = "9")]
    pub raw_data: Option<Vec<u8>>,
}

/// `ValueInfoProto`.
#[derive(Clone, PartialEq, Message)]
pub struct ValueInfoProto {
    /// The value's name.
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// Its type.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// `TypeProto`, of its one kind the graphs use: a tensor.
#[derive(Clone, PartialEq, Message)]
pub struct TypeProto {
    /// `tensor_type`, of the `value` oneof.
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TensorTypeProto>,
}

/// `TypeProto.Tensor`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorTypeProto {
    /// `DataType` of the elements.
    #[prost(int32, optional, tag = "1")]
    pub elem_type: Option<i32>,
    /// The shape.
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// `TensorShapeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorShapeProto {
    /// The dimensions.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// `TensorShapeProto.Dimension`: a size or a name (the `value` oneof).
#[derive(Clone, PartialEq, Message)]
pub struct Dimension {
    /// A fixed size.
    #[prost(int64, optional, tag = "1")]
    pub dim_value: Option<i64>,
    /// A symbolic size, e.g. "batch".
    #[prost(string, optional, tag = "2")]
    pub dim_param: Option<String>,
}

/// One dimension of an input or output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A size fixed by the model.
    Fixed(usize),
    /// A size the caller picks, named (`BATCH`, or a sequence length).
    Named(&'static str),
}

/// An attribute of one integer.
pub fn int(name: &str, value: i64) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(2), i: Some(value), ..Default::default() }
}

/// An attribute of integers.
pub fn ints(name: &str, values: &[i64]) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(7), ints: values.to_vec(), ..Default::default() }
}

/// An attribute of one float.
pub fn float(name: &str, value: f32) -> AttributeProto {
    AttributeProto { name: Some(name.into()), r#type: Some(1), f: Some(value), ..Default::default() }
}

fn value_info(name: &str, elem_type: i32, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| match *d {
            Dim::Fixed(n) => Dimension { dim_value: Some(n as i64), dim_param: None },
            Dim::Named(name) => Dimension { dim_value: None, dim_param: Some(name.into()) },
        })
        .collect();
    let tensor = TensorTypeProto { elem_type: Some(elem_type), shape: Some(TensorShapeProto { dim }) };
    ValueInfoProto { name: Some(name.into()), r#type: Some(TypeProto { tensor_type: Some(tensor) }) }
}

/// A graph being built: nodes in the order they run, their outputs named by the caller.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    proto: GraphProto,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// A float input of the graph, `dims` its shape; returns its name.
    pub fn input(&mut self, name: &str, dims: &[Dim]) -> String {
        self.proto.input.push(value_info(name, FLOAT, dims));
        name.to_string()
    }

    /// An int64 input of the graph (token ids).
    pub fn int_input(&mut self, name: &str, dims: &[Dim]) -> String {
        self.proto.input.push(value_info(name, INT64, dims));
        name.to_string()
    }

    /// A float constant of shape `dims` (row-major `data`); returns its name.
    pub fn weight(&mut self, name: &str, dims: &[usize], data: &[f32]) -> String {
        assert_eq!(dims.iter().product::<usize>(), data.len(), "{name}: {} values for {dims:?}", data.len());
        let raw = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.constant(name, dims, FLOAT, raw)
    }

    /// An int64 vector constant (a shape, axes, slice bounds); returns its name.
    pub fn int64s(&mut self, name: &str, data: &[i64]) -> String {
        let raw = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.constant(name, &[data.len()], INT64, raw)
    }

    fn constant(&mut self, name: &str, dims: &[usize], data_type: i32, raw: Vec<u8>) -> String {
        self.proto.initializer.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: Some(data_type),
            name: Some(name.into()),
            raw_data: Some(raw),
        });
        name.to_string()
    }

    /// A node of operator `op` reading `inputs`, whose one output (and the node) is named `output`;
    /// returns that name.
    pub fn node(&mut self, op: &str, inputs: &[&str], attributes: Vec<AttributeProto>, output: &str) -> String {
        self.proto.node.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.to_string()],
            name: Some(output.into()),
            op_type: Some(op.into()),
            attribute: attributes,
        });
        output.to_string()
    }

    /// Declares value `value` an output of the graph under `name`, of shape `dims`: the node that makes
    /// it is renamed (or, for a graph input, an `Identity` added); returns `name`.
    pub fn output(&mut self, value: &str, name: &str, dims: &[Dim]) -> String {
        let made_here = self.proto.node.iter().any(|n| n.output.iter().any(|o| o == value));
        if !made_here {
            self.node("Identity", &[value], vec![], name);
        } else if value != name {
            for node in &mut self.proto.node {
                for v in node.input.iter_mut().chain(node.output.iter_mut()) {
                    if v == value {
                        *v = name.to_string();
                    }
                }
                if node.name.as_deref() == Some(value) {
                    node.name = Some(name.to_string());
                }
            }
        }
        self.proto.output.push(value_info(name, FLOAT, dims));
        name.to_string()
    }

    /// The model file: this graph under `name`, described by `doc`, with `metadata` as its properties.
    pub fn to_bytes(mut self, name: &str, doc: &str, metadata: &[(&str, String)]) -> Vec<u8> {
        self.proto.name = Some(name.into());
        let model = ModelProto {
            ir_version: Some(IR_VERSION),
            opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(OPSET) }],
            producer_name: Some("textnet".into()),
            producer_version: Some(crate::VERSION.into()),
            doc_string: Some(doc.into()),
            graph: Some(self.proto),
            metadata_props: metadata
                .iter()
                .map(|(k, v)| StringStringEntryProto { key: Some(k.to_string()), value: Some(v.clone()) })
                .collect(),
        };
        model.encode_to_vec()
    }

    /// GELU in its tanh form, as textnet computes it: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), written
    /// in elementary operators (operator set 17 has no `Gelu`); `prefix` names its values.
    pub fn gelu_tanh(&mut self, x: &str, prefix: &str) -> String {
        let c = |g: &mut Graph, suffix: &str, v: f32| g.weight(&format!("{prefix}.{suffix}"), &[], &[v]);
        let (cube_scale, inner_scale, half, one) = (
            c(self, "k0", 0.044715),
            c(self, "k1", (2.0f64 / std::f64::consts::PI).sqrt() as f32),
            c(self, "half", 0.5),
            c(self, "one", 1.0),
        );
        let sq = self.node("Mul", &[x, x], vec![], &format!("{prefix}.x2"));
        let cube = self.node("Mul", &[&sq, x], vec![], &format!("{prefix}.x3"));
        let scaled = self.node("Mul", &[&cube, &cube_scale], vec![], &format!("{prefix}.kx3"));
        let sum = self.node("Add", &[x, &scaled], vec![], &format!("{prefix}.inner"));
        let arg = self.node("Mul", &[&sum, &inner_scale], vec![], &format!("{prefix}.arg"));
        let t = self.node("Tanh", &[&arg], vec![], &format!("{prefix}.tanh"));
        let plus = self.node("Add", &[&t, &one], vec![], &format!("{prefix}.1p"));
        let hx = self.node("Mul", &[x, &half], vec![], &format!("{prefix}.hx"));
        self.node("Mul", &[&hx, &plus], vec![], &format!("{prefix}.out"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_decodes_to_what_was_built() {
        let mut g = Graph::new();
        let x = g.input("input", &[Dim::Named(BATCH), Dim::Fixed(2)]);
        let w = g.weight("0.weight", &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let y = g.node("Gemm", &[&x, &w], vec![int("transB", 1), int("transA", 0)], "0.out");
        g.output(&y, "logits", &[Dim::Named(BATCH), Dim::Fixed(3)]);
        let bytes = g.to_bytes("mlp", "test", &[("class_names", "[]".into())]);
        let model = ModelProto::decode(bytes.as_slice()).unwrap();
        let graph = model.graph.unwrap();
        assert_eq!(model.opset_import[0].version, Some(OPSET));
        assert_eq!(graph.node[0].output, ["logits"]);
        // A zero is written, not left out: proto2's `has_i` must hold for `transA = 0`.
        assert_eq!(graph.node[0].attribute[1].i, Some(0));
        let raw = graph.initializer[0].raw_data.as_ref().unwrap();
        assert_eq!(f32::from_le_bytes(raw[4..8].try_into().unwrap()), 2.0);
        assert_eq!(graph.input[0].r#type.as_ref().unwrap().tensor_type.as_ref().unwrap().elem_type, Some(FLOAT));
    }
}
