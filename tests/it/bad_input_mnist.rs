//! Bad input to `mnist` and `classify`: the cases of the bad-input audit of 2026-11-24, each named by
//! its ID. The data are small synthetic IDX sets (class k: a bright block at a spot of its own, on noise),
//! so that a model learns them in one short epoch.

use crate::common::bad_input;

use bad_input::{bytes, run, run_limited};
use std::path::Path;

/// Writes `train-*` and `t10k-*` IDX files of `n_train` and `n_test` images into `dir`; `shift` moves
/// every class's block, so that two shifts are two datasets; `labels` picks each image's class.
fn idx_set(dir: &Path, n_train: usize, n_test: usize, shift: usize, labels: impl Fn(usize) -> u8) {
    std::fs::create_dir_all(dir).unwrap();
    let mut state = 5u64 + shift as u64;
    let mut noise = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) % 40) as u8
    };
    let mut write = |name: &str, n: usize, first: usize| {
        let (mut images, mut classes) = (Vec::new(), Vec::new());
        for i in 0..n {
            let label = labels(first + i);
            let mut image: Vec<u8> = (0..784).map(|_| noise()).collect();
            let k = (label as usize + shift) % 9;
            let (y0, x0) = (2 + 8 * (k % 3), 2 + 8 * (k / 3) + usize::from(label == 9) * 3);
            for y in y0..y0 + 6 {
                for x in x0..x0 + 6 {
                    image[y * 28 + x] = if label < 9 { 255 } else { 128 };
                }
            }
            images.extend(image);
            classes.push(label);
        }
        let count = (n as u32).to_be_bytes();
        let header = [&[0u8, 0, 8, 3][..], &count, &28u32.to_be_bytes(), &28u32.to_be_bytes()].concat();
        std::fs::write(dir.join(format!("{name}-images-idx3-ubyte")), [header, images].concat()).unwrap();
        std::fs::write(dir.join(format!("{name}-labels-idx1-ubyte")), [&[0u8, 0, 8, 1][..], &count, &classes].concat())
            .unwrap();
    };
    write("train", n_train, 0);
    write("t10k", n_test, n_train);
}

/// A black 28×28 8-bit greyscale PNG at `path`.
fn black_png(path: &Path) {
    let mut encoder = png::Encoder::new(std::fs::File::create(path).unwrap(), 28, 28);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header().unwrap().write_image_data(&[0u8; 784]).unwrap();
}

fn digit(i: usize) -> u8 {
    (i * 7 % 10) as u8
}

/// A folder with a synthetic dataset `digits/` and an MLP `good.st` trained on it (near 100 %).
fn trained() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    idx_set(&dir.path().join("digits"), 2000, 500, 0, digit);
    mnist(dir.path(), "digits", "good.st", &["--epochs", "2"]).succeeds();
    dir
}

/// `mnist --data DATA --out OUT` on the CPU, a small MLP, with `extra` flags.
fn mnist(dir: &Path, data: &str, out: &str, extra: &[&str]) -> bad_input::Run {
    let mut args = vec!["mnist", "--data", data, "--out", out, "--device", "cpu", "--hidden", "16", "--quiet"];
    args.extend_from_slice(extra);
    run(dir, &args)
}

#[test]
fn n046_a_chance_level_run_writes_nothing() {
    let dir = trained();
    std::fs::copy(dir.path().join("good.st"), dir.path().join("m.st")).unwrap();
    let before = bytes(&dir.path().join("m.st"));
    let run = mnist(dir.path(), "digits", "m.st", &["--train-limit", "1", "--epochs", "1"]);
    run.fails_with(&["did not learn", "m.st is unchanged", "1 training image is too few"]);
    assert_eq!(bytes(&dir.path().join("m.st")), before);
    mnist(dir.path(), "digits", "new.st", &["--train-limit", "1", "--epochs", "1"])
        .fails_with(&["nothing written to new.st"]);
    assert!(!dir.path().join("new.st").exists());
}

#[test]
fn n047_without_val_split_a_worse_run_does_not_replace_the_model() {
    let dir = trained();
    let before = bytes(&dir.path().join("good.st"));
    let run = mnist(dir.path(), "digits", "good.st", &["--train-limit", "200", "--epochs", "1"]);
    run.fails_with(&["no epoch beat the test loss", "good.st is unchanged"]);
    assert_eq!(bytes(&dir.path().join("good.st")), before);
}

#[test]
fn n048_a_model_of_another_dataset_is_kept_unless_overwrite() {
    let dir = trained();
    idx_set(&dir.path().join("fashion"), 2000, 500, 4, digit);
    let before = bytes(&dir.path().join("good.st"));
    let args = ["--dataset", "fashion", "--val-split", "0.1", "--epochs", "1"];
    mnist(dir.path(), "fashion", "good.st", &args)
        .fails_with(&["holds an MNIST model of another dataset (mnist)", "--overwrite"]);
    assert_eq!(bytes(&dir.path().join("good.st")), before);
    mnist(dir.path(), "fashion", "good.st", &[&args[..], &["--overwrite"]].concat()).succeeds();
}

/// 60,000 images of 784 floats: 188 MB, under an address-space limit of 150 MB.
#[test]
fn u006_u009_images_that_do_not_fit_in_memory_are_refused() {
    let dir = trained();
    idx_set(&dir.path().join("big"), 60_000, 10, 0, digit);
    let args = ["mnist", "--data", "big", "--out", "m.st", "--device", "cpu", "--epochs", "1"];
    run_limited(dir.path(), &args, 150 << 20).fails_with(&["60000 images take", "of memory is available"]);
    let args = ["classify", "--model", "good.st", "big/train-images-idx3-ubyte"];
    run_limited(dir.path(), &args, 150 << 20).fails_with(&["60000 images take", "of memory is available"]);
}

/// `model` with every weight of `tensor` set to `value`.
fn with_tensor(model: &Path, out: &Path, tensor: &str, value: f32) {
    let file = bytes(model);
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&file[8..8 + n]).unwrap();
    let offsets = &header[tensor]["data_offsets"];
    let (start, end) = (8 + n + offsets[0].as_u64().unwrap() as usize, 8 + n + offsets[1].as_u64().unwrap() as usize);
    let mut changed = file.clone();
    for chunk in changed[start..end].chunks_exact_mut(4) {
        chunk.copy_from_slice(&value.to_le_bytes());
    }
    std::fs::write(out, changed).unwrap();
}

#[test]
fn c002_c003_c004_classify_refuses_non_finite_models_and_outputs() {
    let dir = trained();
    let model = dir.path().join("good.st");
    with_tensor(&model, &dir.path().join("nan.st"), "w1", f32::NAN);
    with_tensor(&model, &dir.path().join("inf.st"), "b2", f32::INFINITY);
    with_tensor(&model, &dir.path().join("huge.st"), "w1", 3e38);
    let images = "digits/t10k-images-idx3-ubyte";
    for crafted in ["nan.st", "inf.st"] {
        run(dir.path(), &["classify", "--model", crafted, images])
            .fails_with(&["the parameters contain NaN or infinite values"]);
    }
    run(dir.path(), &["classify", "--model", "huge.st", images, "--json"])
        .fails_with(&["the model's output is not finite"]);
}

#[test]
fn i038_l008_l020_an_idx_file_of_no_images_is_refused() {
    let dir = trained();
    idx_set(&dir.path().join("empty"), 0, 0, 0, digit);
    let images = "empty/t10k-images-idx3-ubyte";
    run(dir.path(), &["classify", "--model", "good.st", images]).fails_with(&["holds no images"]);
    let labels = ["classify", "--model", "good.st", images, "--labels", "empty/t10k-labels-idx1-ubyte", "--json"];
    run(dir.path(), &labels).fails_with(&["holds no images"]);
}

#[test]
fn l005_i048_labels_need_one_idx_image_file_and_label_files_are_named() {
    let dir = trained();
    let png = dir.path().join("a#1.png");
    black_png(&png);
    idx_set(&dir.path().join("one"), 1, 1, 0, digit);
    let args = ["classify", "--model", "good.st", "a#1.png", "--labels", "one/t10k-labels-idx1-ubyte"];
    run(dir.path(), &args).fails_with(&["--labels goes with exactly one IDX image file"]);
    let args = ["classify", "--model", "good.st", "digits/t10k-labels-idx1-ubyte"];
    run(dir.path(), &args).fails_with(&["is an IDX label file", "--labels"]);
}

#[test]
fn n016_n033_learning_nothing_names_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    idx_set(&dir.path().join("one-class"), 500, 200, 0, |i| if i < 500 { 3 } else { digit(i) });
    mnist(dir.path(), "one-class", "m.st", &["--epochs", "1"]).fails_with(&["every training image is labelled 3"]);
    idx_set(&dir.path().join("digits"), 500, 200, 0, digit);
    let run = mnist(dir.path(), "digits", "m.st", &["--val-split", "0.99", "--epochs", "1"]);
    run.fails_with(&["5 training images are too few"]);
    assert!(!run.stderr.contains("--optim adam"), "{}", run.stderr);
}

#[test]
fn n041_a_divergence_with_a_huge_weight_decay_names_it() {
    let dir = tempfile::tempdir().unwrap();
    idx_set(&dir.path().join("digits"), 500, 200, 0, digit);
    let run = mnist(dir.path(), "digits", "m.st", &["--optim", "sgd", "--weight-decay", "1e30", "--epochs", "1"]);
    run.fails_with(&["diverged", "--weight-decay"]);
}

#[test]
fn n055_a_model_at_out_whose_output_is_not_finite_is_named() {
    let dir = trained();
    with_tensor(&dir.path().join("good.st"), &dir.path().join("huge.st"), "w1", 3e38);
    let run = mnist(dir.path(), "digits", "huge.st", &["--val-split", "0.1", "--epochs", "1"]);
    run.fails_with(&["holds a model whose outputs on this data are not finite", "--overwrite"]);
}

#[test]
fn l018_one_image_can_come_from_standard_input() {
    let dir = trained();
    let png = dir.path().join("x.png");
    black_png(&png);
    let mut command = bad_input::textnet(dir.path(), &["classify", "--model", "good.st", "-"]);
    command.stdin(std::fs::File::open(&png).unwrap());
    let run = bad_input::run_for(command, std::time::Duration::from_secs(60));
    run.succeeds();
    assert!(run.stdout.contains("(standard input)"), "{}", run.stdout);
}

/// CL10: a second `-` would read an empty standard input (the first read it to its end).
#[test]
fn cl10_standard_input_is_read_once() {
    let dir = trained();
    let png = dir.path().join("x.png");
    black_png(&png);
    for args in [&["classify", "--model", "good.st", "-", "-"][..], &["classify", "--model", "-", "-"]] {
        let mut command = bad_input::textnet(dir.path(), args);
        command.stdin(std::fs::File::open(&png).unwrap());
        bad_input::run_for(command, std::time::Duration::from_secs(60))
            .fails_with(&["- (standard input) can be given once"]);
    }
}
