//! The transformer's model file: a round trip gives the same model to the bit (and the same bytes), its
//! tensors carry PyTorch's names and shapes, and other kinds of model file, missing tensors and bad
//! metadata are refused with one-line errors.

use std::collections::BTreeMap;
use textnet::transformer::data::CharVocab;
use textnet::transformer::model::{Config, Layout, init};
use textnet::transformer::modelfile::{FORMAT, TransformerModel};

fn model() -> TransformerModel {
    // Characters JSON must escape, and characters of several bytes.
    let vocab = CharVocab::from_text("a\"b\\c\nd\té😀 aa", 256).unwrap();
    let config = Config { vocab: vocab.len(), block: 6, embed: 8, heads: 2, layers: 2, bias: true, tie_weights: false };
    let mut params = init(&config, 5);
    params.iter_mut().enumerate().for_each(|(i, p)| *p += (i as f32 * 0.37).sin() * 1e-3);
    TransformerModel { config, vocab, params, val_loss: 1.234_567_8, steps: 1234 }
}

#[test]
fn a_round_trip_keeps_every_bit() {
    let m = model();
    let bytes = m.to_bytes().unwrap();
    assert_eq!(bytes, m.to_bytes().unwrap(), "the same model gives the same bytes");
    let back = TransformerModel::from_bytes(&bytes).unwrap();
    assert_eq!((back.config, &back.vocab, back.steps), (m.config, &m.vocab, m.steps));
    assert_eq!(back.val_loss.to_bits(), m.val_loss.to_bits());
    assert!(
        back.params.len() == m.params.len()
            && back.params.iter().zip(&m.params).all(|(a, b)| a.to_bits() == b.to_bits())
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    m.save(&path).unwrap();
    assert_eq!(TransformerModel::load(&path).unwrap(), m);
}

#[test]
fn the_file_holds_pytorchs_names_and_the_metadata() {
    let m = model();
    let bytes = m.to_bytes().unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let layout = Layout::new(&m.config);
    let mut names = tensors.names();
    names.sort();
    let mut expected = layout.names();
    expected.sort();
    assert_eq!(names, expected);
    for t in layout.tensors() {
        assert_eq!(tensors.tensor(&t.name).unwrap().shape(), t.shape.as_slice());
    }
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().clone().unwrap();
    assert_eq!(meta["format"], FORMAT);
    assert_eq!(meta["vocab"], r#"["�","a","\t","\n"," ","\"","\\","b","c","d","é","😀"]"#);
    let sizes: Vec<&str> =
        ["block", "embed", "heads", "layers", "val_loss", "steps"].iter().map(|k| meta[*k].as_str()).collect();
    assert_eq!(sizes, ["6", "8", "2", "2", "1.2345678", "1234"]);
}

/// `m`'s file with its metadata edited and the tensor `drop` left out.
fn edited(m: &TransformerModel, edit: impl FnOnce(&mut BTreeMap<String, String>), drop: Option<&str>) -> Vec<u8> {
    let bytes = m.to_bytes().unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta: BTreeMap<String, String> = header.metadata().clone().unwrap().into_iter().collect();
    edit(&mut meta);
    let layout = Layout::new(&m.config);
    let tensors: Vec<(&str, &[f32], Vec<usize>)> = layout
        .tensors()
        .iter()
        .filter(|t| Some(t.name.as_str()) != drop)
        .map(|t| (t.name.as_str(), &m.params[t.range()], t.shape.clone()))
        .collect();
    textnet::io::tensorfile::to_bytes(&tensors, meta).unwrap()
}

fn refusal(bytes: &[u8]) -> String {
    let err = format!("{:#}", TransformerModel::from_bytes(bytes).unwrap_err());
    assert!(!err.contains('\n'), "{err}");
    err
}

#[test]
fn other_kinds_of_model_file_are_refused() {
    let m = model();
    let as_kind = |key: &str, value: &str| {
        edited(
            &m,
            |meta| {
                meta.remove("format");
                meta.insert(key.into(), value.into());
            },
            None,
        )
    };
    assert_eq!(
        refusal(&as_kind("format", "textnet-mnist")),
        "not a textnet transformer model file: it is an MNIST MLP classifier (for textnet classify)"
    );
    assert!(refusal(&as_kind("format", "textnet-mnist-cnn")).contains("an MNIST CNN classifier"));
    assert!(refusal(&as_kind("format", "textnet-text")).contains("a next-token text model"));
    assert!(refusal(&as_kind("kind", "xor")).contains("an XOR network"));
    assert!(refusal(&as_kind("kind", "sales")).contains("a sales (table) regressor"));
    assert!(refusal(&as_kind("format", "gguf")).contains("its metadata names the format \"gguf\""));
    assert_eq!(
        refusal(&edited(&m, |meta| meta.clear(), None)),
        "not a textnet model file: its metadata names no format (expected a textnet transformer model file)"
    );
    assert!(refusal(b"hello, world").starts_with("not a safetensors file"));
    // A real XOR model file.
    let xor = textnet::xor::model::XorParams::init(4, textnet::ops::activations::Activation::Tanh, 1);
    assert!(refusal(&textnet::xor::modelfile::to_bytes(&xor).unwrap()).contains("an XOR network"));
}

#[test]
fn missing_tensors_and_bad_metadata_are_refused() {
    let m = model();
    assert_eq!(refusal(&edited(&m, |_| {}, Some("blocks.1.mlp.fc.bias"))), "tensor blocks.1.mlp.fc.bias is missing");
    let with = |key: &str, value: &str| edited(&m, |meta| drop(meta.insert(key.into(), value.into())), None);
    assert_eq!(
        refusal(&with("heads", "3")),
        "invalid sizes in the metadata: --heads 3 must divide --embed 8 (each head takes embed / heads dimensions)"
    );
    assert_eq!(refusal(&with("layers", "two")), "metadata entry \"layers\" is not a number: \"two\"");
    assert_eq!(refusal(&edited(&m, |meta| drop(meta.remove("steps")), None)), "metadata entry \"steps\" is missing");
    assert!(refusal(&with("val_loss", "low")).contains("\"val_loss\" is not a number"));
    assert!(refusal(&with("vocab", "abc")).contains("\"vocab\" is not a JSON array of strings"));
    assert!(refusal(&with("vocab", r#"["�","ab"]"#)).contains("lists \"ab\", not one character"));
    assert!(refusal(&with("vocab", r#"["a","b"]"#)).contains("must start with the unknown character"));
    // A vocabulary of another size than the tensors': their shapes no longer match.
    let err = refusal(&with("vocab", r#"["�","a","b"]"#));
    assert_eq!(err, "the metadata says vocab 3 and embed 8 but tensor tok_emb.weight is [12, 8]");
    let err = refusal(&with("block", "7"));
    assert_eq!(err, "the metadata says block 7 and embed 8 but tensor pos_emb.weight is [6, 8]");
    let mut bad = model();
    bad.params[3] = f32::NAN;
    assert_eq!(refusal(&bad.to_bytes().unwrap()), "the parameters contain NaN or infinite values");
}

#[test]
fn load_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.safetensors");
    std::fs::write(&path, b"not a model").unwrap();
    let err = format!("{:#}", TransformerModel::load(&path).unwrap_err());
    assert!(err.starts_with(&format!("model file {}: not a safetensors file", path.display())), "{err}");
}

/// A model without biases and with a tied head: its flags are in the metadata, the `.bias` tensors are
/// absent, `head.weight` is tok_emb's copy (a tied PyTorch module's state_dict names both), and it loads
/// back to the bit; a file without the flags (older) reads as biased and untied, a bad flag is refused.
#[test]
fn no_bias_and_tied_weights_round_trip() {
    let mut m = model();
    m.config = Config { bias: false, tie_weights: true, ..m.config };
    m.params = init(&m.config, 6);
    let bytes = m.to_bytes().unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert!(tensors.names().iter().all(|n| !n.ends_with(".bias")));
    assert_eq!(tensors.tensor("head.weight").unwrap().data(), tensors.tensor("tok_emb.weight").unwrap().data());
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().clone().unwrap();
    assert_eq!((meta["bias"].as_str(), meta["tie_weights"].as_str()), ("false", "true"));
    assert_eq!(TransformerModel::from_bytes(&bytes).unwrap(), m);

    let plain = model().to_bytes().unwrap();
    let rewrite = |bytes: &[u8], edit: &dyn Fn(&mut BTreeMap<String, String>)| -> Vec<u8> {
        let tensors = safetensors::SafeTensors::deserialize(bytes).unwrap();
        let (_, header) = safetensors::SafeTensors::read_metadata(bytes).unwrap();
        let mut meta: BTreeMap<String, String> = header.metadata().clone().unwrap().into_iter().collect();
        edit(&mut meta);
        safetensors::serialize(tensors.tensors(), Some(meta.into_iter().collect())).unwrap()
    };
    let older = rewrite(&plain, &|meta| {
        meta.remove("bias");
        meta.remove("tie_weights");
    });
    assert_eq!(TransformerModel::from_bytes(&older).unwrap(), model());
    let bad = rewrite(&plain, &|meta| drop(meta.insert("bias".into(), "yes".into())));
    let err = TransformerModel::from_bytes(&bad).unwrap_err().to_string();
    assert!(err.contains("\"bias\" is neither true nor false"), "{err}");
}
