//! `textnet mnist` end to end on the CPU: human and JSON output, the model file, and one-line errors.

use crate::common::{s, stderr, stdout, textnet};
use flate2::{Compression, write::GzEncoder};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use textnet::mnist::model::MlpParams;

/// A tiny MNIST-format dataset in `dir`: class k images are bright in band k, so it is learnable.
fn write_synthetic(dir: &Path, n_train: usize, n_test: usize) {
    let gz = |bytes: &[u8]| {
        let mut e = GzEncoder::new(Vec::new(), Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    };
    for (prefix, n) in [("train", n_train), ("t10k", n_test)] {
        let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
        let mut images = Vec::new();
        images.extend(0x803u32.to_be_bytes());
        [n as u32, 28, 28].iter().for_each(|d| images.extend(d.to_be_bytes()));
        for (i, &label) in labels.iter().enumerate() {
            images.extend(
                (0..784).map(|p| if p / 28 / 3 == label as usize { 200 + (i % 50) as u8 } else { (p % 7) as u8 }),
            );
        }
        let mut label_file = 0x801u32.to_be_bytes().to_vec();
        label_file.extend((n as u32).to_be_bytes());
        label_file.extend(&labels);
        std::fs::write(dir.join(format!("{prefix}-images-idx3-ubyte.gz")), gz(&images)).unwrap();
        std::fs::write(dir.join(format!("{prefix}-labels-idx1-ubyte")), label_file).unwrap();
    }
}

#[test]
fn fashion_json_run_writes_a_model() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("fashion.safetensors");
    let o = textnet(&[
        "mnist",
        "--dataset",
        "fashion",
        "--device",
        "cpu",
        "--train-limit",
        "3000",
        "--epochs",
        "2",
        "--hidden",
        "32",
        "--json",
        "--quiet",
        "--out",
        model.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "--json --quiet prints only the JSON");
    let report: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("stdout is one JSON object");
    assert_eq!((report["status"].as_str(), report["command"].as_str()), (Some("ok"), Some("mnist")));
    assert_eq!(report["config"]["dataset"], "fashion");
    assert_eq!(report["data"]["train_samples"], 3000);
    assert_eq!(report["data"]["test_samples"], 10000);
    assert_eq!(report["config"]["hidden"], 32);
    assert_eq!(report["config"]["seed"], 1, "the default seed");
    assert_eq!(report["parameters"], 784 * 32 + 32 + 32 * 10 + 10);
    let epochs = report["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 2);
    for key in ["train_loss", "test_loss", "test_accuracy", "samples_per_s", "elapsed_s"] {
        assert!(epochs[1][key].as_f64().unwrap() > 0.0, "{key}");
    }
    assert!(epochs[1].get("val_loss").is_none(), "no validation set without --val-split: {report}");
    let accuracy = report["final"]["test_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.7 && accuracy <= 1.0, "{report}");
    let confusion = report["final"]["confusion"].as_array().unwrap();
    assert_eq!(confusion.len(), 10);
    let total: u64 = confusion.iter().flat_map(|r| r.as_array().unwrap()).map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(total, 10000);
    let (params, meta) = MlpParams::from_safetensors(&std::fs::read(&model).unwrap()).unwrap();
    assert_eq!((params.shape.inputs, params.shape.hidden, params.shape.classes), (784, 32, 10));
    assert_eq!((meta["dataset"].as_str(), meta["activation"].as_str()), ("fashion", "relu"));
}

#[test]
fn human_output_on_a_data_directory() {
    let tmp = tempfile::tempdir().unwrap();
    write_synthetic(tmp.path(), 300, 100);
    let model = tmp.path().join("m.safetensors");
    let o = textnet(&[
        "mnist",
        "--data",
        tmp.path().to_str().unwrap(),
        "--device",
        "cpu",
        "--epochs",
        "3",
        "--hidden",
        "16",
        "--activation",
        "tanh",
        "--optim",
        "momentum",
        "--momentum",
        "0.8",
        "--batch",
        "10",
        "--clip-norm",
        "2",
        "--weight-decay",
        "1e-4",
        "--out",
        model.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("300 training images, 100 test images"), "{out}");
    assert!(out.contains("momentum lr 0.05 μ 0.8, weight decay 0.0001, clip-norm 2"), "{out}");
    for line in ["epoch 1/3: train loss", "epoch 3/3: train loss", "confusion matrix, 100 test images", "recall"] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    assert!(out.contains("accuracy 100.00%"), "the synthetic classes are trivially separable:\n{out}");
    assert!(model.is_file());
}

#[test]
fn bad_inputs_fail_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    write_synthetic(&data, 20, 10);
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let corrupt = tmp.path().join("corrupt");
    std::fs::create_dir(&corrupt).unwrap();
    write_synthetic(&corrupt, 20, 10);
    std::fs::write(corrupt.join("t10k-labels-idx1-ubyte"), [0, 0, 8, 1, 0, 0, 0, 10, 1, 2]).unwrap();
    let (d, e, c) = (data.to_str().unwrap(), empty.to_str().unwrap(), corrupt.to_str().unwrap());
    let out = tmp.path().join("m.safetensors");
    let cases: &[(&[&str], &str)] = &[
        (&["--lr", "0"], "--lr"),
        (&["--lr", "-0.5"], "--lr"),
        (&["--lr", "nan"], "--lr"),
        (&["--lr", "inf"], "--lr"),
        (&["--batch", "0"], "--batch"),
        (&["--hidden", "0"], "--hidden"),
        (&["--hidden", "100000000"], "--hidden"),
        (&["--epochs", "0"], "--epochs"),
        (&["--clip-norm", "-1"], "--clip-norm"),
        (&["--weight-decay", "-0.1"], "--weight-decay"),
        (&["--optim", "momentum", "--momentum", "1.5"], "--momentum"),
        (&["--momentum", "0.5"], "--momentum"),
        (&["--train-limit", "0"], "--train-limit"),
        (&["--lr-schedule", "cosine", "--min-lr", "1"], "--min-lr 1 is above --lr 0.001"),
        (&["--min-lr", "0.0001"], "--min-lr applies to --lr-schedule cosine only"),
        (&["--lr-schedule", "cosine", "--min-lr", "-1"], "--min-lr must be a finite number ≥ 0"),
        (&["--warmup", "10"], "--warmup 10 is as long as the whole run (10 optimizer steps)"),
        (&["--warmup", "6", "--epochs", "2", "--batch", "8"], "--warmup 6 is as long as the whole run (6 optimizer"),
        (&["--out", d], "--out"),
        (&["--data", "/nonexistent/textnet-data"], "no such directory"),
        (&["--data", e], "train-images-idx3-ubyte"),
        (&["--data", c], "truncated"),
    ];
    for (extra, expect) in cases {
        let mut args = vec!["mnist", "--device", "cpu"];
        for (flag, default) in [("--data", d), ("--out", out.to_str().unwrap())] {
            if !extra.contains(&flag) {
                args.extend([flag, default]);
            }
        }
        args.extend(*extra);
        let o = textnet(&args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{extra:?} succeeded");
        assert!(!err.contains("panicked") && !err.contains("internal error"), "{extra:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{extra:?}: not one line: {err}");
        assert!(err.starts_with("textnet: error:") && err.contains(expect), "{extra:?}: {err}");
    }
    // Arguments clap rejects: an error and usage hint, still no panic.
    for extra in [["--batch", "-3"], ["--activation", "softplus"], ["--lr", "fast"], ["--dataset", "cifar"]] {
        let o = textnet(&[&["mnist", "--device", "cpu"], &extra[..]].concat());
        assert!(!o.status.success() && !stderr(&o).contains("panicked"), "{extra:?}");
    }
    assert!(!out.exists(), "a failed run must not write a model");
}

/// `--lr-schedule`, `--warmup` and `--min-lr` reach both models' trainers: a scheduled run writes the
/// parameters the library trains with the same schedule (step k of the whole run at its rate), which
/// differ from the constant rate's, and the report and the description line say which schedule it was.
#[test]
fn the_learning_rate_schedule_reaches_the_mlp_and_the_cnn() {
    use std::sync::Arc;
    use textnet::datasets::mnist::{self, Dataset};
    use textnet::device::Backend;
    use textnet::mnist::cnn::{CnnParams, CnnShape};
    use textnet::mnist::model::{Activation, MlpShape};
    use textnet::mnist::train::{self, Schedule};
    use textnet::mnist::{Classifier, ModelKind};
    use textnet::ops::optim::{LrSchedule, LrScheduleKind, OptimConfig, OptimKind};
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    write_synthetic(&data_dir, 200, 50);
    let data = mnist::load(Dataset::Mnist, Some(&data_dir), &|_| {}).unwrap();
    // 200 images in batches of 64: 4 steps an epoch, 8 in the run.
    let (epochs, batch, lr) = (2, 64, 0.01f32);
    let library = |model: ModelKind, lr_schedule: LrSchedule| -> Classifier {
        let params = match model {
            ModelKind::Mlp => {
                let shape = MlpShape { inputs: 784, hidden: 16, classes: 10, activation: Activation::Relu };
                Classifier::Mlp(textnet::mnist::model::MlpParams::init(shape, 1))
            }
            ModelKind::Cnn => Classifier::Cnn(CnnParams::init(CnnShape::MNIST, 1)),
        };
        let optim = OptimConfig { lr, ..OptimConfig::new(OptimKind::Adam) };
        let (train_split, test_split) = (Arc::new(data.train.clone()), Arc::new(data.test.clone()));
        let mut t = textnet::mnist::trainer(&Backend::Cpu, params, optim, train_split, test_split, batch).unwrap();
        let schedule = Schedule { epochs, batch, seed: 1, lr, lr_schedule };
        train::run(t.as_mut(), data.train.len(), schedule, &mut ()).unwrap();
        t.params().unwrap()
    };
    for (model, name) in [(ModelKind::Mlp, "mlp"), (ModelKind::Cnn, "cnn")] {
        let constant = library(model, LrSchedule::default());
        for (flags, kind, warmup, min_lr) in [
            (&["--lr-schedule", "cosine", "--min-lr", "0"][..], LrScheduleKind::Cosine, 0, 0.0),
            (&["--lr-schedule", "cosine", "--warmup", "3", "--min-lr", "0.001"], LrScheduleKind::Cosine, 3, 0.001),
            (&["--warmup", "5"], LrScheduleKind::Constant, 5, 0.0),
        ] {
            let out = tmp.path().join(format!("{name}{}.safetensors", flags.join("")));
            let mut args = vec!["mnist", "--model", name, "--data", s(&data_dir), "--device", "cpu", "--keep", "last"];
            args.extend([
                "--epochs",
                "2",
                "--batch",
                "64",
                "--hidden",
                "16",
                "--lr",
                "0.01",
                "--out",
                s(&out),
                "--json",
            ]);
            args.extend(flags);
            let o = textnet(&args);
            assert!(o.status.success(), "{name} {flags:?}: {}", stderr(&o));
            let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(r["config"]["lr_schedule"], kind.name(), "{flags:?}");
            assert_eq!(r["config"]["warmup"], warmup, "{flags:?}");
            assert_eq!(r["config"]["min_lr"].as_f64().unwrap() as f32, min_lr, "{flags:?}");
            let said = LrSchedule { kind, warmup, min_lr }.describe();
            assert!(stderr(&o).contains(&format!("adam lr 0.01, {said}; batch 64")), "{said}: {}", stderr(&o));
            let (written, _) = Classifier::from_safetensors(&std::fs::read(&out).unwrap()).unwrap();
            assert_eq!(written, library(model, LrSchedule { kind, warmup, min_lr }), "{name} {flags:?}");
            assert_ne!(written, constant, "{name} {flags:?} trained at the constant rate");
        }
    }
}

#[test]
fn missing_dataset_names_the_files_and_places() {
    let tmp = tempfile::tempdir().unwrap();
    // Nothing anywhere, and the mirror a loopback port nothing listens on: the download cannot start.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mirror = format!("http://127.0.0.1:{port}");
    let o = Command::new(env!("CARGO_BIN_EXE_textnet"))
        .args(["mnist", "--device", "cpu", "--epochs", "1"])
        .current_dir(tmp.path())
        .env("TEXTNET_DATA", tmp.path().join("data-root"))
        .env("TEXTNET_CACHE", tmp.path().join("cache"))
        .env("TEXTNET_MNIST_MIRROR", &mirror)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!tmp.path().join("cache").join("mnist").exists(), "the failed download left its folder");
    let downloading = format!("downloading from {mirror} failed");
    for needed in [
        "MNIST not found",
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
        "./data/mnist",
        "--data DIR",
        downloading.as_str(),
    ] {
        assert!(err.contains(needed), "missing {needed:?} in {err}");
    }
}

/// `--model cnn` on the CPU: it learns the synthetic bands, writes a CNN file under PyTorch's tensor names,
/// and a model of the other kind is refused as `--out` and by `classify`.
#[test]
fn cnn_trains_writes_its_file_and_the_kinds_stay_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    write_synthetic(&data, 200, 50);
    let cnn = tmp.path().join("cnn.safetensors");
    let (d, c) = (data.to_str().unwrap(), cnn.to_str().unwrap());
    let o =
        textnet(&["mnist", "--model", "cnn", "--data", d, "--device", "cpu", "--epochs", "3", "--out", c, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["config"]["model"], "cnn");
    assert_eq!(r["parameters"], 52138);
    assert!(r["final"]["test_accuracy"].as_f64().unwrap() > 0.5, "{r}");
    let bytes = std::fs::read(&cnn).unwrap();
    let (p, meta) = textnet::mnist::cnn::CnnParams::from_safetensors(&bytes).unwrap();
    assert_eq!(p.shape, textnet::mnist::cnn::CnnShape::MNIST);
    assert_eq!(meta["format"], "textnet-mnist-cnn");
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("conv2.weight").unwrap().shape(), &[16, 8, 3, 3]);

    let o = textnet(&["mnist", "--model", "mlp", "--data", d, "--device", "cpu", "--epochs", "1", "--out", c]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("holds an MNIST CNN model and this run trains the MLP"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&cnn).unwrap(), bytes);
    // classify takes the CNN too: on the test images it finds the accuracy the run reported.
    let images = data.join("t10k-images-idx3-ubyte.gz");
    let labels = data.join("t10k-labels-idx1-ubyte");
    let o = textnet(&["classify", "--model", c, images.to_str().unwrap(), "--labels", s(&labels), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let classified: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(classified["accuracy"].as_f64(), r["final"]["test_accuracy"].as_f64(), "{classified}");
    assert!((classified["loss"].as_f64().unwrap() - r["final"]["test_loss"].as_f64().unwrap()).abs() < 1e-4);
}

/// `mnist` and `mnist --model cnn` with their default --out write two files, not one over the other.
#[test]
fn the_mlp_and_the_cnn_have_their_own_default_files() {
    let dir = tempfile::tempdir().unwrap();
    write_synthetic(dir.path(), 200, 50);
    let data = dir.path().to_str().unwrap();
    for model in ["mlp", "cnn"] {
        let o = Command::new(env!("CARGO_BIN_EXE_textnet"))
            .args(["mnist", "--data", data, "--model", model, "--device", "cpu", "--epochs", "1", "--quiet"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{model}: {}", stderr(&o));
    }
    let mlp = std::fs::read(dir.path().join("mnist.safetensors")).unwrap();
    assert!(MlpParams::from_safetensors(&mlp).is_ok());
    let cnn = std::fs::read(dir.path().join("mnist-cnn.safetensors")).unwrap();
    assert!(textnet::mnist::cnn::CnnParams::from_safetensors(&cnn).is_ok());
}

/// `--resume M` goes on from M's parameters, MLP and CNN: the resumed epoch starts where M left off, so
/// its training loss is below a fresh run's first epoch, and it is saved only when better than M; a model
/// of another dataset, kind or shape is refused in one line, before any data is read.
#[test]
fn resume_continues_training_and_refuses_other_models() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    write_synthetic(&data, 300, 50);
    // The --json report of a run, and whether it exited 0.
    let try_run = |model: &str, out: &Path, extra: &[&str]| -> (serde_json::Value, bool) {
        let mut args = vec!["mnist", "--model", model, "--data", s(&data), "--device", "cpu", "--epochs", "1"];
        args.extend(["--hidden", "16", "--quiet", "--json", "--out", s(out)]);
        args.extend(extra);
        let o = textnet(&args);
        (serde_json::from_slice(&o.stdout).unwrap_or_else(|_| panic!("{}", stderr(&o))), o.status.success())
    };
    let run = |model: &str, out: &Path, extra: &[&str]| -> serde_json::Value {
        let (report, ok) = try_run(model, out, extra);
        assert!(ok, "{report}");
        report
    };
    for model in ["mlp", "cnn"] {
        let out = tmp.path().join(format!("{model}.safetensors"));
        let fresh = run(model, &out, &[]);
        let first = std::fs::read(&out).unwrap();
        let one_epoch = tmp.path().join(format!("{model}-1.safetensors"));
        std::fs::write(&one_epoch, &first).unwrap();
        // Resuming from the file at --out itself, judged against its own loss.
        let resumed = run(model, &out, &["--resume", s(&out)]);
        assert_eq!(resumed["config"]["resume"], s(&out));
        assert_eq!(resumed["baseline_val_loss"], fresh["final"]["test_loss"], "{resumed}");
        let loss = |r: &serde_json::Value, key: &str| r["epochs"][0][key].as_f64().unwrap();
        assert!(loss(&resumed, "train_loss") < loss(&fresh, "train_loss"), "{model}: {fresh} then {resumed}");
        assert!(loss(&resumed, "test_loss") < loss(&fresh, "test_loss"), "{model}: {fresh} then {resumed}");
        assert_eq!(resumed["kept_epoch"], 1);
        let second = std::fs::read(&out).unwrap();
        assert_ne!(second, first);
        // From the one-epoch model into --out, which now holds a better one, at a rate too small to catch
        // up: nothing is written.
        let (behind, ok) = try_run(model, &out, &["--resume", s(&one_epoch), "--lr", "1e-9"]);
        assert!(!ok && behind["status"] == "not_better" && behind["kept_epoch"].is_null(), "{behind}");
        assert_eq!(std::fs::read(&out).unwrap(), second);
    }

    let mlp = tmp.path().join("mlp.safetensors");
    let note = tmp.path().join("note.txt");
    std::fs::write(&note, "hello").unwrap();
    let out = tmp.path().join("new.safetensors");
    for (args, expected) in [
        (
            vec!["--dataset", "fashion", "--hidden", "16"],
            "a model trained on MNIST, and this run trains on Fashion-MNIST (give --dataset mnist)",
        ),
        (vec!["--model", "cnn"], "an MNIST MLP model, and this run trains the CNN (give --model mlp)"),
        (vec!["--hidden", "32"], "an MLP of 16 hidden units (relu), and this run's has 32 (relu)"),
        (vec!["--hidden", "16", "--activation", "tanh"], "(give --hidden 16 --activation relu)"),
    ] {
        let mut all = vec!["mnist", "--data", s(&data), "--device", "cpu", "--out", s(&out), "--resume", s(&mlp)];
        all.extend(args);
        let o = textnet(&all);
        assert_eq!(o.status.code(), Some(1), "{all:?}");
        let err = stderr(&o);
        assert!(err.contains(expected) && err.trim_end().lines().count() == 1, "{all:?}: {err}");
        assert!(!out.exists());
    }
    let o = textnet(&["mnist", "--data", s(&data), "--device", "cpu", "--out", s(&out), "--resume", s(&note)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("is not a textnet MNIST model file") && stderr(&o).trim_end().lines().count() == 1);
}
