//! What every training command prints, the same way: one `--json` report shape (the same top-level keys,
//! the same per-epoch names and units for the same quantities) and nothing at all with `--quiet` when the
//! run succeeds.

use crate::common::text::{shakespeare, train_args};
use crate::common::{strings, text, textnet};
use std::path::Path;
use std::process::Output;

fn train(out: &Path, extra: &[&str]) -> Output {
    textnet(&train_args(&shakespeare(), out, &[&["--epochs", "1"], extra].concat()))
}

fn mnist(out: &Path, extra: &[&str]) -> Output {
    let base = ["mnist", "--dataset", "fashion", "--device", "cpu", "--train-limit", "1000", "--hidden", "8"];
    textnet(&[&base[..], &["--epochs", "1", "--out", out.to_str().unwrap()], extra].concat())
}

fn xor(out: &Path, extra: &[&str]) -> Output {
    textnet(&[&["xor", "--device", "cpu", "--epochs", "1000", "--out", out.to_str().unwrap()], extra].concat())
}

fn transformer(out: &Path, extra: &[&str]) -> Output {
    let tiny =
        ["--device", "cpu", "--embed", "32", "--heads", "2", "--block", "16", "--batch", "4", "--eval-every", "10"];
    let corpus = shakespeare();
    textnet(
        &[
            &["transformer", corpus.to_str().unwrap()][..],
            &tiny,
            &["--steps", "20", "--out", out.to_str().unwrap()],
            extra,
        ]
        .concat(),
    )
}

fn report(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

fn keys(value: &serde_json::Value) -> Vec<String> {
    let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    keys
}

#[test]
fn train_mnist_and_xor_report_in_one_shape() {
    let dir = tempfile::tempdir().unwrap();
    let text_report = report(&train(&dir.path().join("t.safetensors"), &["--json"]));
    let mnist_report = report(&mnist(&dir.path().join("m.safetensors"), &["--json", "--val-split", "0.2"]));
    let xor_report = report(&xor(&dir.path().join("x.safetensors"), &["--json"]));
    let transformer_report = report(&transformer(&dir.path().join("tf.safetensors"), &["--json"]));
    let top = strings(&[
        "baseline_val_loss",
        "command",
        "config",
        "data",
        "device",
        "device_name",
        "device_reason",
        "diverged",
        "epochs",
        "final",
        "kept_epoch",
        "model",
        "parameters",
        "status",
        "textnet",
    ]);
    assert_eq!(keys(&text_report), top);
    assert_eq!(keys(&mnist_report), top);
    assert_eq!(keys(&xor_report), top);
    assert_eq!(keys(&transformer_report), top);
    // The device as PyTorch names it, the GPU's name (none on the CPU), and why that device.
    for r in [&text_report, &mnist_report, &xor_report, &transformer_report] {
        assert_eq!((r["device"].as_str(), r["device_name"].as_str()), (Some("cpu"), None));
        assert_eq!(r["device_reason"], "--device cpu");
    }

    for (r, command) in [(&text_report, "train"), (&mnist_report, "mnist")] {
        assert_eq!((r["command"].as_str(), r["status"].as_str()), (Some(command), Some("ok")));
        assert_eq!(r["textnet"], env!("CARGO_PKG_VERSION"));
        assert_eq!((r["device"].as_str(), r["kept_epoch"].as_u64()), (Some("cpu"), Some(1)));
        assert!(r["model"].as_str().unwrap().ends_with(".safetensors"));
        for key in ["out", "keep", "lr", "epochs", "batch", "seed", "device"] {
            assert!(!r["config"][key].is_null(), "{command}: config.{key}");
        }
        assert_eq!((r["config"]["seed"].as_u64(), r["config"]["device"].as_str()), (Some(1), Some("cpu")));
        assert!(r["data"]["train_samples"].as_u64().unwrap() > 0 && r["data"]["val_samples"].as_u64().unwrap() > 0);

        let row = &r["epochs"][0];
        assert_eq!(row["epoch"], 1);
        for key in ["train_loss", "val_loss", "val_accuracy", "samples_per_s", "elapsed_s"] {
            assert!(row[key].as_f64().is_some_and(f64::is_finite), "{command}: epochs[0].{key} in {row}");
        }
        let accuracy = row["val_accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&accuracy), "{command}: an accuracy is a fraction: {accuracy}");
        assert_eq!(r["final"]["val_loss"], row["val_loss"], "{command}: final is the kept epoch's");
    }
    let test_accuracy = mnist_report["epochs"][0]["test_accuracy"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&test_accuracy), "{test_accuracy}");

    // XOR trains on its four points and has nothing held out: its rows carry the training loss, its
    // final the loss and predictions after the last epoch.
    let r = &xor_report;
    assert_eq!((r["command"].as_str(), r["status"].as_str()), (Some("xor"), Some("ok")));
    assert_eq!(r["textnet"], env!("CARGO_PKG_VERSION"));
    assert_eq!((r["device"].as_str(), r["kept_epoch"].as_u64()), (Some("cpu"), Some(1000)));
    assert!(r["model"].as_str().unwrap().ends_with(".safetensors"));
    for key in ["out", "keep", "lr", "epochs", "batch", "seed", "device"] {
        assert!(!r["config"][key].is_null(), "xor: config.{key}");
    }
    assert_eq!((r["config"]["seed"].as_u64(), r["config"]["device"].as_str()), (Some(1), Some("cpu")));
    assert_eq!((r["data"]["train_samples"].as_u64(), r["data"]["val_samples"].as_u64()), (Some(4), Some(0)));
    let row = &r["epochs"][0];
    assert_eq!(row["epoch"], 1);
    for key in ["train_loss", "samples_per_s", "elapsed_s"] {
        assert!(row[key].as_f64().is_some_and(f64::is_finite), "xor: epochs[0].{key} in {row}");
    }
    assert!(r["final"]["loss"].as_f64().is_some_and(f64::is_finite));
    assert_eq!(r["final"]["predictions"].as_array().map(Vec::len), Some(4));

    // The Transformer counts steps, not epochs: a row is an evaluation (every --eval-every steps) and
    // carries its last step; its final is the last evaluation's.
    let r = &transformer_report;
    assert_eq!((r["command"].as_str(), r["status"].as_str()), (Some("transformer"), Some("ok")));
    assert_eq!(r["textnet"], env!("CARGO_PKG_VERSION"));
    assert_eq!((r["device"].as_str(), r["kept_epoch"].as_u64()), (Some("cpu"), Some(2)));
    assert!(r["model"].as_str().unwrap().ends_with(".safetensors"));
    for key in ["out", "keep", "lr", "steps", "batch", "seed", "device"] {
        assert!(!r["config"][key].is_null(), "transformer: config.{key}");
    }
    assert_eq!((r["config"]["seed"].as_u64(), r["config"]["device"].as_str()), (Some(1), Some("cpu")));
    assert!(r["data"]["train_chars"].as_u64().unwrap() > 0 && r["data"]["val_chars"].as_u64().unwrap() > 0);
    let row = &r["epochs"][1];
    assert_eq!((row["epoch"].as_u64(), row["step"].as_u64()), (Some(2), Some(20)));
    for key in ["train_loss", "val_loss", "samples_per_s", "elapsed_s"] {
        assert!(row[key].as_f64().is_some_and(f64::is_finite), "transformer: epochs[1].{key} in {row}");
    }
    assert_eq!(r["final"]["val_loss"], row["val_loss"], "transformer: final is the last evaluation's");
}

#[test]
fn quiet_prints_nothing_on_success() {
    let dir = tempfile::tempdir().unwrap();
    for (name, out) in [
        ("train", train(&dir.path().join("t.safetensors"), &["--quiet"])),
        ("mnist", mnist(&dir.path().join("m.safetensors"), &["--quiet"])),
        ("xor", xor(&dir.path().join("x.safetensors"), &["--quiet"])),
        ("transformer", transformer(&dir.path().join("tf.safetensors"), &["--quiet"])),
    ] {
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        assert_eq!((text(&out.stdout).as_str(), text(&out.stderr).as_str()), ("", ""), "{name} --quiet");
    }
    // With --json: the report alone.
    for (name, out) in [
        ("train", train(&dir.path().join("t2.safetensors"), &["--quiet", "--json"])),
        ("mnist", mnist(&dir.path().join("m2.safetensors"), &["--quiet", "--json"])),
        ("xor", xor(&dir.path().join("x2.safetensors"), &["--quiet", "--json"])),
        ("transformer", transformer(&dir.path().join("tf2.safetensors"), &["--quiet", "--json"])),
    ] {
        assert_eq!(text(&out.stderr), "", "{name} --quiet --json");
        assert_eq!(report(&out)["command"], name);
    }
}

/// The schedule flags every pinned run below passes, and the optimizer flags of those that take them.
const SCHEDULE: [&str; 6] = ["--lr-schedule", "cosine", "--warmup", "1", "--min-lr", "0.001"];
const OPTIM: [&str; 10] =
    ["--optim", "momentum", "--lr", "0.02", "--momentum", "0.8", "--weight-decay", "0.001", "--clip-norm", "2"];

/// The `config` of a `--json` run, with each of `paths` written as its name.
fn config(out: &Output, paths: &[(&Path, &str)]) -> serde_json::Value {
    let mut config = report(out)["config"].clone();
    for value in config.as_object_mut().unwrap().values_mut() {
        if let Some((_, name)) = paths.iter().find(|(path, _)| value.as_str() == path.to_str()) {
            *value = serde_json::json!(name);
        }
    }
    config
}

/// Each training command's report `config` for one set of flags, key by key and value by value: however
/// the report is built, what it says stays the same.
#[test]
fn each_commands_config_is_pinned() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let (corpus, out) = (shakespeare(), dir.path().join("m.safetensors"));
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let paths = [(corpus.as_path(), "CORPUS"), (out.as_path(), "OUT")];
    let out_flag = s(&out);
    let run = |args: &[&str], extra: &[&[&str]]| {
        let _ = std::fs::remove_file(&out);
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--out", out_flag.as_str(), "--json", "--quiet"]);
        all.extend(SCHEDULE);
        extra.iter().for_each(|flags| all.extend_from_slice(flags));
        textnet(&all)
    };

    let text_args = ["train", &s(&corpus), "--device", "cpu", "--max-tokens", "20000", "--max-vocab", "300"];
    let text_run = run(&text_args, &[&["--embed", "8", "--hidden", "16", "--epochs", "1"]]);
    assert_eq!(
        config(&text_run, &paths),
        json!({"batch": 256, "context": 3, "corpus": "CORPUS", "device": "cpu", "embed": 8, "epochs": 1,
            "hidden": 16, "keep": "best", "keep_case": false, "lr": 2.56, "lr_schedule": "cosine",
            "max_tokens": 20000, "max_vocab": 300, "min_lr": 0.001, "optim": "sgd", "out": "OUT",
            "overwrite": false, "plot": null, "precision": "fp32", "resume": null, "seed": 1, "shuffle": true,
            "tensorboard": null, "val_max": 20000, "warmup": 1, "weight_decay": 0.0})
    );

    let xor_run = run(&["xor", "--device", "cpu", "--epochs", "5000"], &[]);
    assert_eq!(
        config(&xor_run, &paths),
        json!({"activation": "sigmoid", "batch": 4, "device": "cpu", "epochs": 5000, "hidden": 4, "keep": "last",
            "lr": 0.5, "lr_schedule": "cosine", "min_lr": 0.001, "out": "OUT", "overwrite": false, "plot": null,
            "report_every": 500, "seed": 1, "tensorboard": null, "warmup": 1})
    );

    let mnist_args = ["mnist", "--dataset", "fashion", "--device", "cpu", "--train-limit", "1000", "--hidden", "8"];
    let mnist_run = run(&mnist_args, &[&["--epochs", "1", "--val-split", "0.2"], &OPTIM]);
    assert_eq!(
        config(&mnist_run, &paths),
        json!({"activation": "relu", "batch": 64, "clip_norm": 2.0, "data": null, "dataset": "fashion",
            "device": "cpu", "epochs": 1, "hidden": 8, "keep": "last", "lr": 0.02, "lr_schedule": "cosine",
            "min_lr": 0.001, "model": "mlp", "momentum": 0.8, "optim": "momentum", "out": "OUT",
            "overwrite": false, "plot": null, "resume": null, "seed": 1, "tensorboard": null, "train_limit": 1000,
            "val_split": 0.2, "warmup": 1, "weight_decay": 0.001})
    );

    let tiny =
        ["--embed", "32", "--heads", "2", "--block", "16", "--batch", "4", "--eval-every", "10", "--steps", "20"];
    let transformer_run = run(&["transformer", &s(&corpus), "--device", "cpu"], &[&tiny]);
    assert_eq!(
        config(&transformer_run, &paths),
        json!({"batch": 4, "beta2": 0.999, "bias": true, "block": 16, "clip_norm": 0.0, "corpus": "CORPUS",
            "device": "cpu", "dropout": 0.0, "embed": 32, "eval_every": 10, "eval_iters": null, "gpus": 1,
            "grad_accum": 1, "heads": 2, "init": "gpt2", "keep": "best", "layers": 2, "lr": 0.001,
            "lr_schedule": "cosine", "min_lr": 0.001, "out": "OUT", "overwrite": false, "plot": null, "precision": "fp32",
            "resume": null, "seed": 1, "steps": 20, "tensorboard": null, "tie_weights": false, "vocab": 256, "warmup": 1,
            "weight_decay": 0.01, "zero": false})
    );

    let sales = dir.path().join("sales.tsv");
    let made = std::process::Command::new("python3")
        .args([&format!("{}/scripts/make-sales.py", env!("CARGO_MANIFEST_DIR")), "--rows", "600", "--out", &s(&sales)])
        .output()
        .expect("runs python3");
    assert!(made.status.success(), "{}", text(&made.stderr));
    let sales_run = run(&["sales", &s(&sales), "--device", "cpu", "--epochs", "2"], &[&OPTIM]);
    assert_eq!(
        config(&sales_run, &paths),
        json!({"batch": 64, "clip_norm": 2.0, "device": "cpu", "epochs": 2, "hidden": 32, "keep": "last",
            "lr": 0.02, "lr_schedule": "cosine", "min_lr": 0.001, "optim": "momentum", "out": "OUT", "plot": null,
            "resume": null, "seed": 1, "split": 0.8, "split_order": "shuffled", "tensorboard": null,
            "val_split": null, "warmup": 1, "weight_decay": 0.001})
    );

    let table = dir.path().join("t.csv");
    let rows: String = (0..200).map(|i| format!("{},{},{}\n", i % 7, i % 5, i % 7 + 2 * (i % 5))).collect();
    std::fs::write(&table, format!("a,b,y\n{rows}")).unwrap();
    let fit_args = ["fit", "--device", "cpu", "--table", &s(&table), "--target", "y", "--epochs", "2"];
    let fit_run = run(&fit_args, &[&["--layers", "Linear(2, 8), ReLU, Linear(8, 1)"], &OPTIM]);
    assert_eq!(
        config(&fit_run, &[(table.as_path(), "TABLE"), (out.as_path(), "OUT")]),
        json!({"batch": 64, "clip_norm": 2.0, "dataset": null, "device": "cpu", "epochs": 2, "init": "pytorch",
            "keep": "last", "layers": "Linear(2, 8), ReLU, Linear(8, 1)", "loss": "mse", "lr": 0.02,
            "lr_schedule": "cosine", "min_lr": 0.001, "momentum": 0.8, "optim": "momentum", "out": "OUT",
            "overwrite": false, "patience": null, "plot": null, "seed": 1, "split": 0.8, "table": "TABLE",
            "target": "\"y\"", "tensorboard": null, "train_limit": null, "val_split": null, "warmup": 1,
            "weight_decay": 0.001})
    );
}
