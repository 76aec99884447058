//! Helpers of the text tests: a small `train` command line, a tiny model
//! and a way to rewrite a model file into each kind of broken file the loader must reject.
#![allow(dead_code)]

use super::strings;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use textnet::text::corpus::{Corpus, CorpusOptions};
use textnet::text::model::{TextParams, TextShape};
use textnet::text::modelfile::TextModel;
use textnet::text::tokenizer::Tokenizer;

/// `train` on a small slice of the corpus at a small size, writing `out`; `extra` flags (`--flag value`
/// or `--flag=value`) replace the small defaults.
pub fn train_args(corpus: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let small =
        [("--device", "cpu"), ("--max-tokens", "20000"), ("--max-vocab", "300"), ("--embed", "8"), ("--hidden", "16")];
    let overridden = |flag: &str| extra.iter().any(|e| e.split('=').next() == Some(flag));
    let mut args = strings(&["train", corpus.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    for (flag, value) in small.iter().filter(|(flag, _)| !overridden(flag)) {
        args.extend(strings(&[flag, value]));
    }
    args.extend(strings(extra));
    args
}

/// Runs `train` (`train_args` with `--epochs 1000` and `extra`), presses Ctrl-C once its first epoch line
/// is out, and returns how it ended and its stdout lines after that one.
pub fn train_until_ctrl_c(out: &Path, extra: &[&str]) -> (std::process::Output, Vec<String>) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let extra: Vec<&str> = ["--epochs", "1000"].iter().chain(extra).copied().collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_textnet"))
        .args(train_args(&shakespeare(), out, &extra))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.unwrap().starts_with("epoch 1/1000")));
    assert!(Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap().success());
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    (child.wait_with_output().unwrap(), rest)
}

/// The committed corpus.
pub fn shakespeare() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus/shakespeare.txt")
}

/// An untrained model over the vocabulary of a short sentence.
pub fn tiny_model() -> TextModel {
    let tokenizer = Tokenizer::default();
    let corpus = Corpus::from_text(
        "To be, or not to be: that is the question. Whether 'tis nobler in the mind to suffer",
        CorpusOptions { tokenizer, max_vocab: 300, max_tokens: None },
    )
    .unwrap();
    let shape = TextShape { vocab: corpus.vocab.len(), embed: 8, hidden: 16, context: 3 };
    TextModel { params: TextParams::init(shape, 7), tokenizer, vocab: corpus.vocab }
}

/// One tensor of a safetensors file, owned.
pub struct Tensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// Parses a safetensors file, lets `edit` change its tensors and metadata, and serializes it again.
pub fn rewrite(bytes: &[u8], edit: impl FnOnce(&mut Vec<Tensor>, &mut HashMap<String, String>)) -> Vec<u8> {
    let (_, header) = SafeTensors::read_metadata(bytes).unwrap();
    let mut metadata = header.metadata().clone().unwrap_or_default();
    let file = SafeTensors::deserialize(bytes).unwrap();
    let mut tensors: Vec<Tensor> = file
        .iter()
        .map(|(name, view)| Tensor {
            name: name.to_string(),
            dtype: view.dtype(),
            shape: view.shape().to_vec(),
            data: view.data().to_vec(),
        })
        .collect();
    edit(&mut tensors, &mut metadata);
    let views: Vec<(String, TensorView)> =
        tensors.iter().map(|t| (t.name.clone(), TensorView::new(t.dtype, t.shape.clone(), &t.data).unwrap())).collect();
    safetensors::serialize(views, Some(metadata)).unwrap()
}

/// Each way of breaking a valid model file, with a fragment the error message must contain.
pub fn broken_model_files(valid: &[u8]) -> Vec<(&'static str, Vec<u8>, &'static str)> {
    vec![
        ("truncated", valid[..valid.len() - 10].to_vec(), "truncated"),
        ("cut inside the header", valid[..20].to_vec(), "truncated"),
        ("shorter than a header", valid[..5].to_vec(), "too short"),
        ("empty", Vec::new(), "too short"),
        ("plain text", b"To be, or not to be: that is the question.\n".to_vec(), "not a safetensors file"),
        ("missing tensor", rewrite(valid, |t, _| t.retain(|t| t.name != "w2")), "missing tensor \"w2\""),
        ("missing metadata key", rewrite(valid, |_, m| drop(m.remove("hidden"))), "missing metadata key \"hidden\""),
        ("no metadata at all", rewrite(valid, |_, m| m.clear()), "not a textnet model file"),
        ("wrong format", rewrite(valid, |_, m| drop(m.insert("format".into(), "other".into()))), "not a textnet"),
        (
            "shape disagrees with metadata",
            rewrite(valid, |_, m| drop(m.insert("hidden".into(), "17".into()))),
            "metadata implies",
        ),
        (
            "vocabulary length disagrees",
            rewrite(valid, |_, m| {
                let mut words: Vec<String> = serde_json::from_str(&m["vocabulary"]).unwrap();
                words.pop();
                m.insert("vocabulary".into(), serde_json::to_string(&words).unwrap());
            }),
            "vocabulary lists",
        ),
        (
            "invalid metadata value",
            rewrite(valid, |_, m| drop(m.insert("embed".into(), "eight".into()))),
            "invalid value",
        ),
        (
            "vocabulary not JSON",
            rewrite(valid, |_, m| drop(m.insert("vocabulary".into(), "[\"<unk>\", oops".into()))),
            "vocabulary",
        ),
        (
            "wrong dtype",
            rewrite(valid, |t, _| {
                let b2 = t.iter_mut().find(|t| t.name == "b2").unwrap();
                b2.dtype = Dtype::I32;
            }),
            "expected F32",
        ),
    ]
}
