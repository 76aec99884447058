//! The model file: a save/load round trip, the layout other tools rely on, and a one-line error for
//! every kind of broken file.

use crate::common::text::{broken_model_files, tiny_model};
use safetensors::SafeTensors;
use textnet::text::modelfile::TextModel;

#[test]
fn save_then_load_gives_the_same_model() {
    let model = tiny_model();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/dir/model.safetensors");
    model.save(&path).unwrap();
    assert_eq!(TextModel::load(&path).unwrap(), model);

    let mut cased = tiny_model();
    cased.tokenizer.lowercase = false;
    assert_eq!(TextModel::from_bytes(&cased.to_bytes().unwrap()).unwrap().tokenizer, cased.tokenizer);
}

#[test]
fn file_holds_the_named_f32_tensors_and_metadata() {
    let model = tiny_model();
    let bytes = model.to_bytes().unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let (v, d, h) = (model.vocab.len(), 8, 16);
    for (name, shape) in
        [("embedding", vec![v, d]), ("w1", vec![h, d]), ("b1", vec![h]), ("w2", vec![v, h]), ("b2", vec![v])]
    {
        let t = file.tensor(name).unwrap();
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        assert_eq!(t.shape(), shape.as_slice(), "{name}");
    }
    let first = f32::from_le_bytes(file.tensor("w1").unwrap().data()[..4].try_into().unwrap());
    assert_eq!(first, model.params.w1[0]);

    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().as_ref().unwrap();
    assert_eq!(meta["format"], "textnet-text");
    assert_eq!(meta["format_version"], "1");
    assert_eq!(meta["vocab_size"], v.to_string());
    assert_eq!((meta["embed"].as_str(), meta["hidden"].as_str(), meta["context"].as_str()), ("8", "16", "3"));
    assert_eq!(meta["lowercase"], "true");
    let words: Vec<String> = serde_json::from_str(&meta["vocabulary"]).unwrap();
    assert_eq!(words, model.vocab.tokens());
}

#[test]
fn every_broken_file_is_a_one_line_error() {
    let valid = tiny_model().to_bytes().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (what, bytes, expected) in broken_model_files(&valid) {
        let path = dir.path().join(format!("{}.safetensors", what.replace(' ', "_")));
        std::fs::write(&path, &bytes).unwrap();
        let err = format!("{:#}", TextModel::load(&path).expect_err(what));
        assert!(err.contains(expected), "{what}: {err:?} lacks {expected:?}");
        assert!(err.contains(&path.display().to_string()), "{what}: {err:?} does not name the file");
        assert!(!err.contains('\n'), "{what}: {err:?}");
    }
}

#[test]
fn missing_file_and_directory_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = format!("{:#}", TextModel::load(&dir.path().join("nope.safetensors")).unwrap_err());
    assert!(err.contains("cannot open model file") && err.contains("nope.safetensors"), "{err}");
    let err = format!("{:#}", TextModel::load(dir.path()).unwrap_err());
    assert!(err.contains("not a regular file"), "{err}");
}

#[test]
fn non_finite_parameters_are_rejected() {
    let mut model = tiny_model();
    model.params.b2[1] = f32::NAN;
    let err = format!("{:#}", TextModel::from_bytes(&model.to_bytes().unwrap()).unwrap_err());
    assert!(err.contains("NaN"), "{err}");
}
