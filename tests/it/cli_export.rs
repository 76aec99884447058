//! `textnet export --onnx`: the graphs it writes for each kind it covers (names, the dynamic batch, the
//! operator set, decoded back with the same messages), and a one-line error with a non-zero exit for
//! every input it refuses. The numbers the graphs compute are checked against textnet's own in
//! onnxruntime by tests/python/test_onnx.py.

use crate::common::bad_input::{run, with_metadata};
use prost::Message;
use std::path::Path;
use textnet::fit::data::{InputSchema, TargetInfo};
use textnet::fit::modelfile::{self, FitModel};
use textnet::io::onnx::{ModelProto, ValueInfoProto};
use textnet::nn::stack::model::{Init, Loss, Network};
use textnet::nn::stack::spec::{self, Shape};

/// A fit model of `layers` over `shape`, its parameters drawn from seed 1, written to `dir/name`.
fn fit_model(dir: &Path, name: &str, layers: &str, shape: Shape, loss: Loss) {
    let net = Network::new(&spec::parse(layers).unwrap(), shape).unwrap();
    let params = net.init(Init::Pytorch, 1);
    let target = match loss {
        Loss::Ce => TargetInfo::Classes { names: (0..net.outputs()).map(|c| format!("class {c}")).collect() },
        Loss::Mse => TargetInfo::Value { name: "price".into(), mean: 10.0, std: 2.0 },
    };
    let model = FitModel { net, params, loss, input: InputSchema::Array { shape }, target };
    std::fs::write(dir.join(name), modelfile::to_bytes(&model).unwrap()).unwrap();
}

/// `textnet export --onnx out.onnx model`, which must succeed; the model it wrote.
fn export(dir: &Path, model: &str) -> ModelProto {
    run(dir, &["export", "--onnx", "out.onnx", model]).succeeds();
    ModelProto::decode(std::fs::read(dir.join("out.onnx")).unwrap().as_slice()).unwrap()
}

/// A value's name and dimensions, each a size or a name.
type Described = (String, Vec<String>);

fn described(value: &ValueInfoProto) -> Described {
    let tensor = value.r#type.as_ref().unwrap().tensor_type.as_ref().unwrap();
    let dims = tensor.shape.as_ref().unwrap().dim.iter();
    let dims = dims.map(|d| d.dim_param.clone().unwrap_or_else(|| d.dim_value.unwrap().to_string())).collect();
    (value.name.clone().unwrap(), dims)
}

/// The graph's inputs and outputs, described.
fn inputs_and_outputs(model: &ModelProto) -> (Vec<Described>, Vec<Described>) {
    let graph = model.graph.as_ref().unwrap();
    (graph.input.iter().map(described).collect(), graph.output.iter().map(described).collect())
}

fn dims(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn ops(model: &ModelProto) -> Vec<String> {
    model.graph.as_ref().unwrap().node.iter().map(|n| n.op_type.clone().unwrap()).collect()
}

#[test]
fn a_cnn_of_classes_becomes_input_logits_and_probabilities() {
    let dir = tempfile::tempdir().unwrap();
    let layers = "Conv2d(1, 2, 3, padding=1), GELU, MaxPool2d(2), Dropout(0.5), Flatten, Linear(3)";
    fit_model(dir.path(), "cnn.st", layers, Shape::Image { channels: 1, height: 6, width: 6 }, Loss::Ce);
    let model = export(dir.path(), "cnn.st");
    assert_eq!(model.opset_import[0].version, Some(17));
    let (inputs, outputs) = inputs_and_outputs(&model);
    assert_eq!(inputs, [("input".into(), dims(&["batch", "1", "6", "6"]))]);
    assert_eq!(outputs, [("logits".into(), dims(&["batch", "3"])), ("probabilities".into(), dims(&["batch", "3"]))]);
    let ops = ops(&model);
    assert_eq!(ops.first().map(String::as_str), Some("Conv"));
    assert!(ops.ends_with(&["MaxPool", "Flatten", "Gemm", "Softmax"].map(String::from)), "{ops:?}");
    assert!(!ops.iter().any(|op| op.contains("Dropout")), "dropout is off in evaluation: {ops:?}");
    let names: Vec<_> = model.graph.unwrap().initializer.iter().map(|t| t.name.clone().unwrap()).collect();
    for weight in ["0.weight", "0.bias", "5.weight", "5.bias"] {
        assert!(names.iter().any(|n| n == weight), "{weight} in {names:?}");
    }
}

#[test]
fn a_regressor_gives_values() {
    let dir = tempfile::tempdir().unwrap();
    fit_model(dir.path(), "mlp.st", "Linear(4, 3), Sigmoid, Linear(1)", Shape::Flat(4), Loss::Mse);
    let (inputs, outputs) = inputs_and_outputs(&export(dir.path(), "mlp.st"));
    assert_eq!(inputs, [("input".into(), dims(&["batch", "4"]))]);
    assert_eq!(outputs, [("values".into(), dims(&["batch", "1"]))]);
}

#[test]
fn a_transformer_takes_ids_of_any_batch_and_length() {
    use textnet::transformer::{data::CharVocab, model, modelfile::TransformerModel};
    let dir = tempfile::tempdir().unwrap();
    let vocab = CharVocab::from_text("to be or not to be", usize::MAX).unwrap();
    let config = model::Config { bias: false, tie_weights: true, ..model::Config::sized(vocab.len(), 8, 8, 2, 2) };
    let params = model::init(&config, 1);
    let file = TransformerModel { config, vocab, params, val_loss: 2.0, steps: 1 }.to_bytes().unwrap();
    std::fs::write(dir.path().join("tf.st"), file).unwrap();
    let model = export(dir.path(), "tf.st");
    let (inputs, outputs) = inputs_and_outputs(&model);
    assert_eq!(inputs, [("input_ids".into(), dims(&["batch", "sequence"]))]);
    let v = config.vocab.to_string();
    assert_eq!(outputs, [("logits".into(), dims(&["batch", "sequence", &v]))]);
    let ops = ops(&model);
    assert_eq!(ops.iter().filter(|op| *op == "LayerNormalization").count(), 2 * 2 + 1);
    assert_eq!(ops.iter().filter(|op| *op == "Softmax").count(), 2, "one per block: {ops:?}");
}

#[test]
fn an_mnist_cnn_file_is_its_layer_stack() {
    use textnet::mnist::cnn::{CnnParams, CnnShape};
    let dir = tempfile::tempdir().unwrap();
    let file = CnnParams::init(CnnShape::MNIST, 1).to_safetensors(&[]).unwrap();
    std::fs::write(dir.path().join("cnn.st"), file).unwrap();
    let model = export(dir.path(), "cnn.st");
    let (inputs, outputs) = inputs_and_outputs(&model);
    assert_eq!(inputs, [("input".into(), dims(&["batch", "1", "28", "28"]))]);
    assert_eq!(outputs[0], ("logits".into(), dims(&["batch", "10"])));
    assert_eq!(ops(&model).iter().filter(|op| *op == "Conv").count(), 2);
}

#[test]
fn bad_inputs_get_one_line_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fit_model(d, "fit.st", "Linear(2, 2)", Shape::Flat(2), Loss::Ce);
    run(d, &["export", "--onnx", "out.onnx", "missing.st"]).fails_with(&["missing.st"]);
    std::fs::write(d.join("notes.txt"), "To be, or not to be").unwrap();
    run(d, &["export", "--onnx", "out.onnx", "notes.txt"]).fails_with(&["notes.txt", "not a safetensors file"]);

    // A kind textnet writes that export does not cover, and a kind textnet does not know.
    with_metadata(&d.join("fit.st"), &d.join("sales.st"), |meta| {
        drop(meta.insert("format".into(), "textnet-sales".into()))
    });
    run(d, &["export", "--onnx", "out.onnx", "sales.st"])
        .fails_with(&["sales.st", "ONNX export does not cover a sales (table) regressor"]);
    with_metadata(&d.join("fit.st"), &d.join("gguf.st"), |meta| drop(meta.insert("format".into(), "gguf".into())));
    run(d, &["export", "--onnx", "out.onnx", "gguf.st"]).fails_with(&["gguf.st", "\"gguf\""]);

    // A covered kind whose file does not hold what it says: the loader's reason.
    with_metadata(&d.join("fit.st"), &d.join("lying.st"), |meta| {
        drop(meta.insert("spec".into(), "Linear(2, 2), ReLU, Linear(2, 2)".into()))
    });
    run(d, &["export", "--onnx", "out.onnx", "lying.st"]).fails_with(&["lying.st", "tensor 2.weight is missing"]);

    // Where the ONNX file would go: never over a model file, nor over the model it reads.
    run(d, &["export", "--onnx", "sales.st", "fit.st"]).fails_with(&["--onnx sales.st", "holds a model file"]);
    run(d, &["export", "--onnx", "fit.st", "fit.st"]).fails_with(&["fit.st"]);
    assert!(!d.join("out.onnx").exists(), "nothing written by a refused export");
    let missing_flag = run(d, &["export", "fit.st"]);
    assert_eq!(missing_flag.code, Some(2), "{}", missing_flag.stderr);
    assert!(missing_flag.stderr.contains("--onnx"), "{}", missing_flag.stderr);
}
