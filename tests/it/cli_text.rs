//! `textnet train` and `textnet predict` end to end through the binary, on the CPU: a small run, its
//! JSON output, and a clean one-line error (never a panic) for every bad input.

use crate::common::text::{broken_model_files, shakespeare, tiny_model, train_args};
use crate::common::{strings, text, textnet};
use std::path::{Path, PathBuf};

/// Runs textnet expecting failure: exit status 1 and exactly one line on stderr, `textnet: error: …`.
fn fails(args: &[String], expected: &str) -> String {
    let out = textnet(args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?} should fail; stderr: {stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("internal error"), "{args:?}: {stderr}");
    assert!(stderr.starts_with("textnet: error: "), "{args:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    assert!(stderr.contains(expected), "{args:?}: {stderr:?} lacks {expected:?}");
    stderr
}

#[test]
fn train_then_predict() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.safetensors");
    let out = textnet(&train_args(&shakespeare(), &model, &["--epochs", "2"]));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for expected in
        ["vocabulary 300 entries", "device: cpu", "unigram baseline: val loss", "epoch 1/2:", "epoch 2/2:", "top-5"]
    {
        assert!(stdout.contains(expected), "{expected:?} missing from:\n{stdout}");
    }
    assert!(!stdout.contains('\r'), "a progress bar was drawn into a pipe:\n{stdout}");
    assert!(model.is_file());

    let out = textnet(&["predict", "--model", model.to_str().unwrap(), "--context", "my good xyzzy"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains(r#"unknown (read as <unk>): "xyzzy""#), "{stdout}");
    let ranks: Vec<&str> =
        stdout.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).collect();
    assert_eq!(ranks.len(), 5, "{stdout}");

    let out = textnet(&["predict", "--model", model.to_str().unwrap(), "--context", "lord", "--top", "3"]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("only 1 given"), "{stdout}");
}

#[test]
fn json_output_is_one_object() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("cased.safetensors");
    let extra =
        ["--json", "--epochs", "2", "--keep-case", "--no-shuffle", "--batch", "4", "--lr", "0.2", "--val-max", "500"];
    let out = textnet(&train_args(&shakespeare(), &model, &extra));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    assert_eq!((summary["status"].as_str(), summary["command"].as_str()), (Some("ok"), Some("train")));
    assert_eq!(summary["textnet"], env!("CARGO_PKG_VERSION"));
    assert_eq!(summary["data"]["vocab_size"], 300);
    assert_eq!(summary["device"], "cpu");
    assert_eq!(summary["model"], model.display().to_string());
    assert_eq!(summary["data"]["val_evaluated"], 500);
    assert_eq!(summary["config"]["keep_case"], true);
    assert_eq!(summary["config"]["shuffle"], false);
    assert_eq!(summary["config"]["batch"], 4);
    let unigram = summary["data"]["unigram_val_loss"].as_f64().unwrap();
    let epochs = summary["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 2);
    for key in
        ["train_loss", "val_loss", "val_perplexity", "val_accuracy", "val_top5_accuracy", "samples_per_s", "elapsed_s"]
    {
        assert!(epochs[1][key].as_f64().unwrap().is_finite(), "{key}");
    }
    let (top1, top5) = (epochs[1]["val_accuracy"].as_f64().unwrap(), epochs[1]["val_top5_accuracy"].as_f64().unwrap());
    assert!(0.0 < top1 && top1 <= top5 && top5 <= 1.0, "accuracies are fractions: {top1}, {top5}");
    assert!(epochs[1]["val_loss"].as_f64().unwrap() < unigram);
    let kept = summary["kept_epoch"].as_u64().unwrap() as usize;
    assert_eq!(summary["final"]["val_loss"], epochs[kept - 1]["val_loss"], "the final figures are the kept epoch's");
    // The human lines moved to stderr.
    assert!(text(&out.stderr).contains("epoch 2/2:"));

    let out =
        textnet(&["predict", "--json", "--model", model.to_str().unwrap(), "--context", "To be or", "--top", "7"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["context"], serde_json::json!(["To", "be", "or"]), "--keep-case must carry into predict");
    let top = p["top"].as_array().unwrap();
    assert_eq!(top.len(), 7);
    let probabilities: Vec<f64> = top.iter().map(|c| c["probability"].as_f64().unwrap()).collect();
    assert!(probabilities.windows(2).all(|w| w[0] >= w[1]) && probabilities[0] <= 1.0);
    assert!(top.iter().all(|c| c["token"].is_string() && c["id"].is_u64()));
}

/// `--lr-schedule`, `--warmup` and `--min-lr` reach the trainer (each changes the model the run writes),
/// and the report and the description line say which schedule it was.
#[test]
fn the_learning_rate_schedule_changes_the_run_and_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, flags: &[&str]| -> (serde_json::Value, Vec<u8>, String) {
        let model = dir.path().join(name);
        let base = ["--json", "--epochs", "2", "--batch", "16", "--lr", "0.2", "--keep", "last", "--no-shuffle"];
        let out = textnet(&train_args(&shakespeare(), &model, &[&base[..], flags].concat()));
        assert!(out.status.success(), "{flags:?}: {}", text(&out.stderr));
        let report = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
        (report, std::fs::read(&model).unwrap(), text(&out.stderr))
    };
    let (report, constant, said) = run("constant.safetensors", &[]);
    assert_eq!(report["config"]["lr_schedule"], "constant");
    assert_eq!((report["config"]["warmup"].as_u64(), report["config"]["min_lr"].as_f64()), (Some(0), Some(0.0)));
    assert!(said.contains("sgd lr 0.2, batch 16, 2 epochs"), "{said}");
    for (flags, kind, warmup, min_lr, described) in [
        (&["--lr-schedule", "cosine"][..], "cosine", 0, 0.0, "cosine schedule to 0"),
        (
            &["--lr-schedule", "cosine", "--warmup", "50", "--min-lr", "0.02"],
            "cosine",
            50,
            0.02,
            "cosine schedule to 0.02, 50 warm-up steps",
        ),
        (&["--warmup", "50"], "constant", 50, 0.0, "50 warm-up steps"),
        (&["--lr-schedule", "step"], "step", 0, 0.0, "step schedule (×0.1 at 50 % and 75 %)"),
    ] {
        let (report, model, said) = run(&format!("m{}.safetensors", flags.join("")), flags);
        let config = &report["config"];
        assert_eq!(config["lr_schedule"], kind, "{flags:?}");
        assert_eq!((config["warmup"].as_u64(), config["min_lr"].as_f64()), (Some(warmup), Some(min_lr)), "{flags:?}");
        assert!(said.contains(&format!("sgd lr 0.2, {described}, batch 16, 2 epochs")), "{flags:?}: {said}");
        assert_ne!(model, constant, "{flags:?} trained as the constant rate does");
    }
}

#[test]
fn divergence_in_the_first_epoch_writes_nothing_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("diverged.safetensors");
    let out = textnet(&train_args(&shakespeare(), &model, &["--lr", "1e9", "--max-tokens", "3000", "--json"]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("diverged") && stderr.contains("lower --lr") && stderr.contains("nothing written"),
        "{stderr}"
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["status"], "diverged");
    assert_eq!(summary["kept_epoch"], serde_json::Value::Null);
    assert!(!model.exists(), "untrained parameters were written");
}

#[test]
fn bad_training_inputs_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let empty = write("empty.txt", b"");
    let blank = write("blank.txt", b"  \n\n\t ");
    let short = write("short.txt", b"to be or");
    let latin1 = write("latin1.txt", b"na\xefve");
    let out = dir.path().join("never.safetensors");
    let corpus = shakespeare();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (train_args(&dir.path().join("missing.txt"), &out, &[]), "cannot open corpus"),
        (train_args(dir.path(), &out, &[]), "not a regular file"),
        (train_args(&empty, &out, &[]), "is empty"),
        (train_args(&blank, &out, &[]), "no tokens"),
        (train_args(&short, &out, &[]), "needs at least 5"),
        (train_args(&latin1, &out, &[]), "invalid byte 0xEF at byte offset 2"),
        (train_args(&corpus, &out, &["--max-vocab", "1"]), "--max-vocab must be at least 2"),
        (train_args(&corpus, &out, &["--max-vocab", "0"]), "--max-vocab must be at least 2"),
        (train_args(&corpus, &out, &["--context", "0"]), "--context must be at least 1"),
        (train_args(&corpus, &out, &["--embed", "0"]), "--embed must be at least 1"),
        (train_args(&corpus, &out, &["--hidden", "0"]), "--hidden must be at least 1"),
        (train_args(&corpus, &out, &["--epochs", "0"]), "--epochs must be at least 1"),
        (train_args(&corpus, &out, &["--batch", "0"]), "--batch must be at least 1"),
        (train_args(&corpus, &out, &["--max-tokens", "0"]), "--max-tokens must be at least 1"),
        (train_args(&corpus, &out, &["--lr", "nan"]), "--lr must be a positive finite number"),
        (train_args(&corpus, &out, &["--lr", "inf"]), "--lr must be a positive finite number"),
        (train_args(&corpus, &out, &["--lr", "-1"]), "--lr must be a positive finite number"),
        (train_args(&corpus, &out, &["--lr=-inf"]), "--lr must be a positive finite number"),
        (train_args(&corpus, &out, &["--lr", "0"]), "--lr must be a positive finite number"),
        (
            train_args(&corpus, &out, &["--lr", "0.1", "--lr-schedule", "cosine", "--min-lr", "0.5"]),
            "--min-lr 0.5 is above --lr 0.1",
        ),
        (train_args(&corpus, &out, &["--min-lr", "0.01"]), "--min-lr applies to --lr-schedule cosine only"),
        (
            train_args(&corpus, &out, &["--lr-schedule", "cosine", "--min-lr", "-1"]),
            "--min-lr must be a finite number ≥ 0",
        ),
        (train_args(&corpus, &out, &["--warmup", "100000"]), "--warmup 100000 is as long as the whole run"),
        (train_args(&corpus, &out, &["--context", "18446744073709551615"]), "needs at least"),
        (train_args(&corpus, &out, &["--hidden", "99999999999"]), "too large"),
        (train_args(&corpus, dir.path(), &[]), "is a directory"),
    ];
    for (args, expected) in cases {
        fails(&args, expected);
    }
    assert!(!out.exists(), "a failed run wrote a model");
}

#[test]
fn bad_models_and_contexts_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let valid = tiny_model().to_bytes().unwrap();
    let good = dir.path().join("good.safetensors");
    std::fs::write(&good, &valid).unwrap();
    let predict =
        |model: &Path, context: &str| strings(&["predict", "--model", model.to_str().unwrap(), "--context", context]);

    fails(&predict(&dir.path().join("missing.safetensors"), "to be"), "cannot open model file");
    for (what, bytes, expected) in broken_model_files(&valid) {
        let path = dir.path().join(format!("{}.safetensors", what.replace(' ', "_")));
        std::fs::write(&path, bytes).unwrap();
        fails(&predict(&path, "to be"), expected);
    }
    fails(&predict(&good, ""), "no tokens");
    fails(&predict(&good, "   "), "no tokens");
    fails(&predict(&good, "xyzzy plugh"), "none of the context tokens");
    let mut zero_top = predict(&good, "to be");
    zero_top.extend(strings(&["--top", "0"]));
    fails(&zero_top, "--top must be at least 1");
    // A context may start with a dash.
    assert!(textnet(&predict(&good, "-- to be")).status.success());
}

#[test]
fn device_cuda_never_panics() {
    // Without a usable GPU (or, for now, without the text kernels) this is a one-line error; with both
    // it trains.
    let dir = tempfile::tempdir().unwrap();
    let args = train_args(&shakespeare(), &dir.path().join("m.safetensors"), &["--epochs", "1", "--device", "cuda"]);
    let out = textnet(&args);
    if !out.status.success() {
        let stderr = text(&out.stderr);
        assert!(!stderr.contains("panicked") && stderr.starts_with("textnet: error: "), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    }
}
