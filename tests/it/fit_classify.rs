//! `textnet classify` on models of `textnet fit`: an MLP and a Conv2d spec trained on Fashion-MNIST
//! classify PNG and PGM images as the fit CPU reference's forward does, an IDX test set to the accuracy
//! the training run reported, and a model trained on a table is refused with the command that takes it.

use crate::common::{fails_with, report, s, small_fit_model, stderr, textnet};
use std::path::Path;
use textnet::fit::data::TargetInfo;
use textnet::fit::modelfile;
use textnet::mnist::idx::read_idx;
use textnet::nn::stack::model;

const DATA: &str = "/usr/share/datasets/fashion-mnist";

fn write_png(path: &Path, pixels: &[u8]) {
    let mut encoder = png::Encoder::new(std::fs::File::create(path).unwrap(), 28, 28);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header().unwrap().write_image_data(pixels).unwrap();
}

/// Trains `layers`, classifies test images 0–7 from PGM and PNG files, and checks each prediction against
/// the fit model's own CPU forward; then the whole IDX test set against the run's reported accuracy.
fn classifies_as_the_cpu_forward(layers: &str) {
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("fit.safetensors");
    let trained = small_fit_model(layers, &model_path);

    let images = read_idx(&Path::new(DATA).join("t10k-images-idx3-ubyte.gz"), 3).unwrap();
    let pixels = |i: usize| &images.data[i * 784..(i + 1) * 784];
    let count = 8;
    let mut files = Vec::new();
    for i in 0..count {
        let path = if i % 2 == 0 {
            let path = dir.path().join(format!("{i}.pgm"));
            std::fs::write(&path, [b"P5\n28 28\n255\n".as_slice(), pixels(i)].concat()).unwrap();
            path
        } else {
            let path = dir.path().join(format!("{i}.png"));
            write_png(&path, pixels(i));
            path
        };
        files.push(path);
    }
    let mut args = vec!["classify", "--model", s(&model_path), "--json"];
    args.extend(files.iter().map(|f| s(f)));
    let o = textnet(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "8-bit greyscale 28×28 images need no conversion note");
    let got = report(&o);
    assert_eq!(got["model"], s(&model_path));
    let predictions = got["predictions"].as_array().unwrap();
    assert_eq!(predictions.len(), count);

    // The fit model's CPU forward on the same images, scaled as fit trains: pixel byte / 255.
    let m = modelfile::load(&model_path).unwrap();
    let names = match &m.target {
        TargetInfo::Classes { names } => names.clone(),
        other => panic!("{other:?}"),
    };
    let x: Vec<f32> = images.data[..count * 784].iter().map(|&p| p as f32 / 255.0).collect();
    let trace = model::forward(&m.net, &m.params, &x, count, None);
    let out = trace.values.last().unwrap();
    let mut classes = Vec::new();
    for (i, logits) in out.chunks(10).enumerate() {
        let class = logits.iter().enumerate().fold(0, |b, (k, &v)| if v > logits[b] { k } else { b });
        let max = logits[class];
        let sum: f32 = logits.iter().map(|&v| (v - max).exp()).sum();
        let probability = 1.0 / sum;
        let p = &predictions[i];
        assert_eq!(p["input"], s(&files[i]), "image {i}");
        assert_eq!(p["class"], class, "image {i}: {logits:?}");
        assert_eq!(p["name"], names[class].as_str(), "image {i}");
        let printed = p["probability"].as_f64().unwrap();
        assert!((printed - probability as f64).abs() < 1e-5, "image {i}: {printed} against {probability}");
        classes.push(class);
    }
    classes.sort();
    classes.dedup();
    assert!(classes.len() >= 3, "a trained model tells these images apart: {classes:?}");

    // The IDX test set with its labels: the accuracy the training run reported.
    let o = textnet(&[
        "classify",
        "--model",
        s(&model_path),
        "--json",
        &format!("{DATA}/t10k-images-idx3-ubyte.gz"),
        "--labels",
        &format!("{DATA}/t10k-labels-idx1-ubyte.gz"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let evaluated = report(&o);
    assert_eq!(evaluated["predictions"].as_array().unwrap().len(), 10_000);
    let accuracy = evaluated["accuracy"].as_f64().unwrap();
    let reported = trained["final"]["test_accuracy"].as_f64().unwrap();
    assert!((accuracy - reported).abs() < 1e-12, "classify {accuracy}, fit {reported}");
    let loss = evaluated["loss"].as_f64().unwrap();
    let reported = trained["final"]["test_loss"].as_f64().unwrap();
    assert!((loss - reported).abs() < 1e-4 * reported.abs().max(1.0), "classify {loss}, fit {reported}");
}

#[test]
fn a_fit_mlp_classifies_images_as_its_cpu_forward() {
    classifies_as_the_cpu_forward("Linear(784, 32), ReLU, Linear(10)");
}

#[test]
fn a_fit_conv_spec_classifies_images_as_its_cpu_forward() {
    classifies_as_the_cpu_forward("Conv2d(1, 4, 3, padding=1), ReLU, MaxPool2d(2), Flatten, Linear(10)");
}

#[test]
fn a_fit_model_of_a_table_is_refused_with_the_command_that_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t.csv");
    let mut text = String::from("x1,x2,label\n");
    for i in 0..400 {
        let (x1, x2) = ((i * 37 % 101) as f64 / 50.0 - 1.0, (i * 53 % 97) as f64 / 48.0 - 1.0);
        text += &format!("{x1:.3},{x2:.3},{}\n", if x1 + x2 > 0.0 { "high" } else { "low" });
    }
    std::fs::write(&table, text).unwrap();
    let model_path = dir.path().join("table.safetensors");
    let o = textnet(&[
        "fit",
        "--device",
        "cpu",
        "--table",
        s(&table),
        "--target",
        "label",
        "--layers",
        "Linear(8), ReLU, Linear(2)",
        "--epochs",
        "30",
        "--lr",
        "0.01",
        "--quiet",
        "--out",
        s(&model_path),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let png = dir.path().join("a.png");
    write_png(&png, &[0u8; 784]);
    let o = textnet(&["classify", "--model", s(&model_path), s(&png)]);
    let expected =
        format!("this model was trained on a table; use textnet fit --model {} --predict FILE", model_path.display());
    fails_with(&o, &[&expected]);
    assert_eq!(crate::common::stdout(&o), "");
}
