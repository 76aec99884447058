//! Small things users noticed in the output: one `device:` line, "1 epoch", `--data` naming a file, and
//! `--verbose` saying what it found.

use crate::common::text::{shakespeare, train_args};
use crate::common::{s, text, textnet};

#[test]
fn train_says_its_device_once_and_counts_epochs_in_english() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.safetensors");
    let run = textnet(&train_args(&shakespeare(), &out, &["--device", "auto", "--epochs", "1"]));
    assert!(run.status.success(), "{}", text(&run.stderr));
    let all = format!("{}{}", text(&run.stdout), text(&run.stderr));
    assert_eq!(all.lines().filter(|l| l.starts_with("device:")).count(), 1, "{all}");
    assert!(all.contains(", 1 epoch\n"), "{all}");
    assert!(!all.contains("1 epochs"), "{all}");
}

#[test]
fn mnist_data_that_is_a_file_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("train-images-idx3-ubyte");
    std::fs::write(&file, b"not a directory").unwrap();
    let run = textnet(&["mnist", "--data", file.to_str().unwrap(), "--device", "cpu", "--epochs", "1"]);
    assert_eq!(run.status.code(), Some(1));
    let stderr = text(&run.stderr);
    assert!(stderr.contains("is a file; give the directory"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}

#[test]
fn an_mnist_run_at_chance_level_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("c.safetensors");
    let run = textnet(&[
        "mnist",
        "--dataset",
        "fashion",
        "--device",
        "cpu",
        "--optim",
        "sgd",
        "--lr",
        "10",
        "--epochs",
        "1",
        "--train-limit",
        "3000",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(report["status"], "not_learned");
    let last = text(&run.stderr).trim_end().lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with("textnet: error: the model did not learn") && last.contains("lower --lr"), "{last}");
    // The same command at a learning rate that works is not flagged.
    let good = textnet(&[
        "mnist",
        "--dataset",
        "fashion",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--train-limit",
        "3000",
        "--json",
        "--out",
        dir.path().join("g.safetensors").to_str().unwrap(),
    ]);
    assert!(good.status.success(), "{}", text(&good.stderr));
    let report: serde_json::Value = serde_json::from_slice(&good.stdout).unwrap();
    assert_eq!(report["status"], "ok");
}

#[test]
fn a_batch_at_the_single_sample_learning_rate_gets_a_note() {
    // On the CPU a batch without --lr takes the CPU's rule (cli_habits); the note is for --lr 0.02 given.
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["--epochs", "1", "--batch", "64"];
        args.extend(extra);
        let out = textnet(&train_args(&shakespeare(), &dir.path().join("b.safetensors"), &args));
        assert!(out.status.success() || out.status.code() == Some(1), "{}", text(&out.stderr));
        format!("{}{}", text(&out.stdout), text(&out.stderr))
    };
    let note = run(&["--lr", "0.02"]);
    assert!(
        note.contains("note: --batch 64 averages 64 samples' gradients") && note.contains("try --lr 1.28"),
        "{note}"
    );
    assert!(!run(&["--lr", "1.28"]).contains("note: --batch"), "no note at a scaled learning rate");
}

/// `--verbose`'s line for the driver says what the search found: "found the driver" only where there is
/// one, "did not find the driver" where the error then says there is none. `predict --device cuda` opens
/// the GPU where there is one and then fails on the missing model, so it is quick either way.
#[test]
fn verbose_says_whether_it_found_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.safetensors");
    let run = textnet(&["--verbose", "predict", "to be", "--device", "cuda", "--model", s(&missing)]);
    let log = text(&run.stderr);
    assert!(!run.status.success(), "{log}");
    let Some(phase) = log.lines().find(|l| l.ends_with("the driver (libcuda)")) else {
        panic!("no phase line for the driver:\n{log}")
    };
    let no_driver = log.contains("no NVIDIA driver");
    assert_eq!(phase.ends_with("did not find the driver (libcuda)"), no_driver, "{log}");
    assert_eq!(phase.ends_with("  found the driver (libcuda)"), !no_driver, "{log}");
}
