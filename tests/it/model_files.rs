//! Model files reproduce: the same model gives the same bytes, and the same seed and data give the same
//! model file, for `train`, `mnist` and `xor` on the CPU.

use crate::common::text::{shakespeare, train_args};
use crate::common::{small_mnist_model, text, textnet};
use std::collections::BTreeMap;

#[test]
fn the_same_model_gives_the_same_bytes() {
    let metadata: BTreeMap<String, String> = (0..12).map(|i| (format!("key{i}"), format!("value {i}"))).collect();
    let w = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let tensors = [("w", &w[..], vec![2, 3]), ("b", &w[..2], vec![2])];
    let first = textnet::io::tensorfile::to_bytes(&tensors, metadata.clone()).unwrap();
    for _ in 0..20 {
        assert_eq!(textnet::io::tensorfile::to_bytes(&tensors, metadata.clone()).unwrap(), first);
    }
    let read = safetensors::SafeTensors::deserialize(&first).unwrap();
    assert_eq!(read.tensor("w").unwrap().shape(), &[2, 3]);
    let (_, header) = safetensors::SafeTensors::read_metadata(&first).unwrap();
    assert_eq!(header.metadata().as_ref().unwrap().get("key7").map(String::as_str), Some("value 7"));
}

#[test]
fn the_same_seed_writes_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str| {
        let out = dir.path().join(name);
        let r = textnet(&train_args(&shakespeare(), &out, &["--epochs", "1", "--quiet"]));
        assert!(r.status.success(), "{}", text(&r.stderr));
        std::fs::read(out).unwrap()
    };
    assert_eq!(run("a.safetensors"), run("b.safetensors"), "train: two runs of one seed differ");

    let mnist = |name: &str| {
        let out = dir.path().join(name);
        small_mnist_model(&out, 500);
        std::fs::read(out).unwrap()
    };
    assert_eq!(mnist("m1.safetensors"), mnist("m2.safetensors"), "mnist: two runs of one seed differ");

    let xor = |name: &str| {
        let out = dir.path().join(name);
        let r = textnet(&["xor", "--device", "cpu", "--quiet", "--out", out.to_str().unwrap()]);
        assert!(r.status.success(), "{}", text(&r.stderr));
        std::fs::read(out).unwrap()
    };
    assert_eq!(xor("x1.safetensors"), xor("x2.safetensors"), "xor: two runs of one seed differ");
}

#[test]
fn model_files_say_how_their_inputs_are_made() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.safetensors");
    let r = textnet(&train_args(&shakespeare(), &out, &["--epochs", "1", "--quiet"]));
    assert!(r.status.success(), "{}", text(&r.stderr));
    let bytes = std::fs::read(&out).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let tokenizer = header.metadata().as_ref().unwrap()["tokenizer"].clone();
    // The unicode-segmentation release named is the one Cargo.lock builds.
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock")).unwrap();
    let locked = lock.split("[[package]]").find(|p| p.contains("name = \"unicode-segmentation\"")).unwrap();
    let version = locked.lines().find_map(|l| l.strip_prefix("version = \"")).unwrap().trim_end_matches('"');
    assert!(tokenizer.contains(&format!("unicode-segmentation {version}")), "{tokenizer}");
    assert!(tokenizer.contains("UAX #29") && tokenizer.contains("lowercased"), "{tokenizer}");

    let out = dir.path().join("m.safetensors");
    small_mnist_model(&out, 500);
    let bytes = std::fs::read(&out).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().as_ref().unwrap();
    let classes: Vec<String> = serde_json::from_str(&meta["class_names"]).unwrap();
    assert_eq!(classes.len(), 10);
    assert_eq!(classes[0], "T-shirt/top");
    assert!(meta["input_scaling"].contains("/ 255"));
}
