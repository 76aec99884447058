//! `textnet classify`: a saved MNIST model on PNG, PGM and IDX images gives the model's own predictions,
//! evaluates an IDX test set as training did, and refuses images it cannot read as the model's input.

use crate::common::{small_mnist_model, text, textnet};
use std::path::Path;
use textnet::mnist::idx::{load_split, read_idx};
use textnet::mnist::model::{self, MlpParams, Workspace};

const DATA: &str = "/usr/share/datasets/fashion-mnist";

fn write_png(path: &Path, pixels: &[u8], width: u32, color: png::ColorType) {
    let file = std::fs::File::create(path).unwrap();
    let mut encoder = png::Encoder::new(file, width, 28);
    encoder.set_color(color);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header().unwrap().write_image_data(pixels).unwrap();
}

#[test]
fn images_in_every_format_get_the_models_predictions() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("m.safetensors");
    let train = textnet(&[
        "mnist",
        "--dataset",
        "fashion",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--hidden",
        "16",
        "--train-limit",
        "3000",
        "--quiet",
        "--json",
        "--out",
        model_path.to_str().unwrap(),
    ]);
    assert!(train.status.success(), "{}", text(&train.stderr));
    let report: serde_json::Value = serde_json::from_slice(&train.stdout).unwrap();

    // The first three test images as a binary PGM, a plain PGM and a PNG.
    let images = read_idx(&Path::new(DATA).join("t10k-images-idx3-ubyte.gz"), 3).unwrap();
    let pixels = |i: usize| &images.data[i * 784..(i + 1) * 784];
    let p5 = dir.path().join("a.pgm");
    std::fs::write(&p5, [b"P5\n# a comment\n28 28\n255\n".as_slice(), pixels(0)].concat()).unwrap();
    let p2 = dir.path().join("b.pgm");
    let plain: Vec<String> = pixels(1).iter().map(|p| p.to_string()).collect();
    std::fs::write(&p2, format!("P2 28 28 255\n{}\n", plain.join(" "))).unwrap();
    let png_path = dir.path().join("c.png");
    write_png(&png_path, pixels(2), 28, png::ColorType::Grayscale);

    let out = textnet(&[
        "classify",
        "--model",
        model_path.to_str().unwrap(),
        "--json",
        p5.to_str().unwrap(),
        p2.to_str().unwrap(),
        png_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let (params, _) = MlpParams::from_safetensors(&std::fs::read(&model_path).unwrap()).unwrap();
    let split = load_split(
        &Path::new(DATA).join("t10k-images-idx3-ubyte.gz"),
        &Path::new(DATA).join("t10k-labels-idx1-ubyte.gz"),
    )
    .unwrap();
    let mut ws = Workspace::default();
    model::forward(&params, &split, &[0, 1, 2], &mut ws);
    for i in 0..3 {
        let class = ws.predicted[i] as usize;
        assert_eq!(got["predictions"][i]["class"], serde_json::json!(class), "image {i}");
        let p = got["predictions"][i]["probability"].as_f64().unwrap();
        assert!((p - ws.probs[i * 10 + class] as f64).abs() < 1e-6);
    }
    assert_eq!(
        got["predictions"][0]["name"].as_str().unwrap(),
        ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
            [ws.predicted[0] as usize]
    );

    // The IDX test set with its labels: the accuracy the training run reported.
    let eval = textnet(&[
        "classify",
        "--model",
        model_path.to_str().unwrap(),
        "--json",
        &format!("{DATA}/t10k-images-idx3-ubyte.gz"),
        "--labels",
        &format!("{DATA}/t10k-labels-idx1-ubyte.gz"),
    ]);
    assert!(eval.status.success(), "{}", text(&eval.stderr));
    let eval: serde_json::Value = serde_json::from_slice(&eval.stdout).unwrap();
    assert_eq!(eval["predictions"].as_array().unwrap().len(), 10_000);
    assert_eq!(eval["accuracy"], report["final"]["test_accuracy"]);

    // TSV: one line per image.
    let tsv = textnet(&["classify", "--model", model_path.to_str().unwrap(), "--tsv", p5.to_str().unwrap()]);
    let line = text(&tsv.stdout);
    assert_eq!(line.trim_end().split('\t').count(), 4, "{line}");
}

#[test]
fn images_the_model_cannot_read_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("m.safetensors");
    small_mnist_model(&model_path, 300);
    let narrow = dir.path().join("narrow.pgm");
    std::fs::write(&narrow, [b"P5 27 28 255\n".as_slice(), &[0u8; 27 * 28]].concat()).unwrap();
    let rgb = dir.path().join("rgb.png");
    write_png(&rgb, &[0u8; 28 * 28 * 3], 28, png::ColorType::Rgb);
    let text_file = dir.path().join("note.txt");
    std::fs::write(&text_file, "hello").unwrap();
    for (input, expected) in [
        (&narrow, "27×28 pixels; the model reads 28×28"),
        (&rgb, "the model reads 8-bit greyscale"),
        (&text_file, "not a PNG, PGM or IDX image file"),
    ] {
        let out = textnet(&["classify", "--model", model_path.to_str().unwrap(), input.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{input:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected) && stderr.trim_end().lines().count() == 1, "{input:?}: {stderr}");
    }
    // A model file of another kind.
    let out = textnet(&["classify", "--model", text_file.to_str().unwrap(), narrow.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
}
