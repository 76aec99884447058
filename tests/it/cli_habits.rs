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
        if args.len() < 3 {
            assert!(err.contains(&format!("(usage: textnet {} ", args[0])), "{args:?}: {err}");
        }
    }
    // Help is still help.
    let o = textnet(&["train", "--help"]);
    assert!(o.status.success() && stdout(&o).contains("Usage: textnet train"));
}

/// DP16: a data-parallel flag given to a command without it names the command that has it, instead of
/// clap's tip to pass it as a value after `--` (which would make it the corpus).
#[test]
fn dp16_a_data_parallel_flag_names_the_command_that_takes_it() {
    for (args, expected) in [
        (&["train", "c.txt", "--gpus", "2"][..], "--gpus is a flag of transformer only (train runs on one GPU)"),
        (&["fit", "--world-size", "2"][..], "--world-size is a flag of transformer only (fit runs on one GPU)"),
        (&["mnist", "--rank=1"][..], "--rank is a flag of transformer only (mnist runs on one GPU)"),
        (&["bench", "mnist", "--rendezvous", "h:1"][..], "--rendezvous is a flag of transformer only (bench mnist"),
    ] {
        let o = textnet(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("textnet: error: ") && err.contains(expected), "{args:?}: {err}");
        assert!(!err.contains("tip:"), "{args:?}: {err}");
    }
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

/// 5 epochs of a small text model, printing every second epoch: epochs 1, 2, 4 and 5 (the last); the
/// first says the time left (an epoch of 200,000 tokens takes more than a quarter of a second), the last
/// does not.
#[test]
fn log_every_thins_the_epoch_lines_and_each_says_the_time_left() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.safetensors");
    let args = train_args(&shakespeare(), &out, &["--epochs", "5", "--log-every", "2", "--max-tokens", "200000"]);
    let o = textnet(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let epochs: Vec<&str> = text.lines().filter(|l| l.starts_with("epoch ")).collect();
    let numbers: Vec<&str> = epochs.iter().map(|l| l.split(':').next().unwrap()).collect();
    assert_eq!(numbers, ["epoch 1/5", "epoch 2/5", "epoch 4/5", "epoch 5/5"], "{text}");
    assert!(epochs[0].contains(" left"), "{}", epochs[0]);
    assert!(!epochs[3].contains(" left"), "{}", epochs[3]);
    let o = textnet(&train_args(&shakespeare(), &out, &["--log-every", "0"]));
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("invalid value '0' for '--log-every <N>'"), "{}", stderr(&o));
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

/// A run whose model is no better than guessing writes nothing and fails with status `not_learned`, in
/// every pipeline. Each is given a validation or test part unlike what it trains on, so that what it
/// learns makes it worse than guessing there.
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
    // Trained on "alpha beta …", validated on "gamma delta …" (the last tenth).
    let corpus = dir.path().join("c.txt");
    std::fs::write(&corpus, "alpha beta ".repeat(900) + &"gamma delta ".repeat(100)).unwrap();
    let out = dir.path().join("t.safetensors");
    let o = textnet(&train_args(&corpus, &out, &["--epochs", "2", "--batch", "16", "--lr", "0.1", "--json"]));
    check(o, &out, "no better than guessing");

    let out = dir.path().join("tf.safetensors");
    let tiny = ["--device", "cpu", "--embed", "32", "--heads", "2", "--block", "8", "--batch", "4"];
    let steps = ["--steps", "30", "--lr", "0.01", "--json"];
    let o = textnet(&[&["transformer", s(&corpus), "-o", s(&out)][..], &tiny, &steps].concat());
    check(o, &out, "no better than guessing");

    // Trained on y = 1000 + 100 x, tested (the last rows, in file order) on y = 1000 + 100 (16 − x).
    let table = dir.path().join("t.csv");
    let row = |i: usize, test: bool| {
        let x = i % 17;
        format!("{x},{}\n", 1000 + 100 * if test { 16 - x } else { x })
    };
    let rows: String = (0..200).map(|i| row(i, i >= 160)).collect();
    std::fs::write(&table, format!("x,y\n{rows}")).unwrap();
    let out = dir.path().join("s.safetensors");
    let args = ["sales", s(&table), "--target", "y", "--device", "cpu", "--split-order", "file", "-e", "30"];
    let o = textnet(&[&args[..], &["-o", s(&out), "--json"]].concat());
    check(o, &out, "no better than predicting the training mean");
}
