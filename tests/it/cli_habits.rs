//! Habits users bring from cargo, ripgrep, PyTorch and Keras: usage errors in one line like every other
//! error, short flags, `--log-every`, the time left after each epoch, the CPU's learning-rate rule for a
//! batch, and one rule for a run that learned nothing.

use crate::common::text::{shakespeare, train_args};
use crate::common::{fails_with, report, s, stderr, stdout, textnet};
use std::path::Path;

#[test]
fn usage_errors_are_one_line_with_the_usage() {
    for (args, expected) in [
        (&["train"][..], "the following required arguments were not provided: <CORPUS>"),
        (&["train", "c.txt", "--bogus"][..], "unexpected argument '--bogus' found"),
        (&["xor", "--device", "gpu"][..], "invalid value 'gpu' for '--device <DEVICE>'"),
    ] {
        let o = textnet(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("textnet: error: ") && err.contains(expected), "{args:?}: {err}");
        assert!(err.contains(&format!("(usage: textnet {} ", args[0])), "{args:?}: {err}");
    }
    // Help is still help.
    let o = textnet(&["train", "--help"]);
    assert!(o.status.success() && stdout(&o).contains("Usage: textnet train"));
}

#[test]
fn short_flags_read_as_their_long_forms() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.safetensors");
    let o = textnet(&["xor", "--device", "cpu", "-e", "2000", "-q", "-o", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!((stdout(&o).as_str(), stderr(&o).as_str()), ("", ""));
    assert!(out.exists());
    let o = textnet(&["predict", "-m", s(&out), "to be"]);
    fails_with(&o, &["XOR"]);
}

/// 5 epochs of a small text model, printing every second epoch: epochs 1, 2, 4 and 5 (the last), each
/// but the last with the time left.
#[test]
fn log_every_thins_the_epoch_lines_and_each_says_the_time_left() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.safetensors");
    let args = train_args(&shakespeare(), &out, &["--epochs", "5", "--log-every", "2", "--max-tokens", "5000"]);
    let o = textnet(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let epochs: Vec<&str> = text.lines().filter(|l| l.starts_with("epoch ")).collect();
    let numbers: Vec<&str> = epochs.iter().map(|l| l.split(':').next().unwrap()).collect();
    assert_eq!(numbers, ["epoch 1/5", "epoch 2/5", "epoch 4/5", "epoch 5/5"], "{text}");
    for line in &epochs[..3] {
        assert!(line.contains(" left"), "{line}");
    }
    assert!(!epochs[3].contains(" left"), "{}", epochs[3]);
    let o = textnet(&train_args(&shakespeare(), &out, &["--log-every", "0"]));
    fails_with(&o, &["--log-every"]);
}

#[test]
fn a_cpu_batch_without_lr_keeps_the_cpus_learning_rate_rule() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.safetensors");
    let o = textnet(&train_args(&shakespeare(), &out, &["--epochs", "1", "--batch", "64", "--json"]));
    let r = report(&o);
    assert_eq!(r["config"]["lr"], 0.64);
    assert!(stderr(&o).contains("SGD lr 0.64 (the CPU's rule: 0.01 × the batch)"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("try --lr"), "{}", stderr(&o));
}

/// A run whose model is no better than its task's trivial model writes nothing and fails with status
/// `not_learned`, in every pipeline that has such a model.
#[test]
fn a_model_that_learned_nothing_is_not_written_and_the_run_fails() {
    let dir = tempfile::tempdir().unwrap();
    let check = |o: std::process::Output, out: &Path, finding: &str| {
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["status"], "not_learned", "{r}");
        let err = stderr(&o);
        let last = err.lines().last().unwrap_or_default();
        assert!(last.starts_with("textnet: error: the model did not learn: ") && last.contains(finding), "{err}");
        assert!(!out.exists());
    };
    let out = dir.path().join("t.safetensors");
    let o = textnet(&train_args(&shakespeare(), &out, &["--epochs", "1", "--lr", "1e-9", "--json"]));
    check(o, &out, "no better than the unigram model's");

    let out = dir.path().join("tf.safetensors");
    let tiny = ["--device", "cpu", "--embed", "32", "--heads", "2", "--block", "16", "--batch", "2"];
    let o = textnet(&[&["transformer", s(&shakespeare()), "-o", s(&out), "--steps", "2", "--lr", "1e-9", "--json"][..], &tiny].concat());
    check(o, &out, "no better than the unigram model's");

    let table = dir.path().join("t.csv");
    let rows: String = (0..200).map(|i| format!("{},{}\n", i % 17, 1000 + 3 * (i % 17))).collect();
    std::fs::write(&table, format!("x,y\n{rows}")).unwrap();
    let out = dir.path().join("s.safetensors");
    let o = textnet(&["sales", s(&table), "--target", "y", "--device", "cpu", "-e", "1", "--lr", "1e-9", "-o", s(&out), "--json"]);
    check(o, &out, "no better than predicting the training mean");
}
