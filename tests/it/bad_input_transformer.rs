//! Bad input to `transformer` and `generate`: the cases of the bad-input audit of 2026-11-24, each
//! named by its ID.

use crate::common::bad_input;

use bad_input::{bytes, english, run};
use std::path::Path;

/// A folder with `english.txt` and a small Transformer `tf.st` trained on it on the CPU.
fn trained() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("english.txt"), english(20_000, 1)).unwrap();
    transformer(dir.path(), "english.txt", "tf.st", &["--steps", "20"]).succeeds();
    dir
}

/// `transformer CORPUS --out OUT` on the CPU at a small size (a --resume'd model's own), with `extra` flags.
fn transformer(dir: &Path, corpus: &str, out: &str, extra: &[&str]) -> bad_input::Run {
    let mut args = vec!["transformer", corpus, "--out", out, "--device", "cpu"];
    if !extra.contains(&"--resume") {
        args.extend_from_slice(&["--layers", "1", "--embed", "32", "--block", "32"]);
    }
    args.extend_from_slice(&["--batch", "8", "--eval-every", "10", "--quiet"]);
    args.extend_from_slice(extra);
    run(dir, &args)
}

/// `model` rewritten to `out` with metadata entry `key` set to `value` (tensors unchanged).
fn with_metadata(model: &Path, out: &Path, key: &str, value: &str) {
    bad_input::with_metadata(model, out, |meta| drop(meta.insert(key.into(), value.into())));
}

/// The old model stored a validation loss measured on its own corpus; a run compared with that number
/// replaced a better model. Here the file claims a loss of 99, and a 2-step run, far worse than the
/// 20-step model, must not replace it: the model is measured again on this run's windows.
#[test]
fn x023_the_model_at_out_is_measured_on_this_runs_data() {
    let dir = trained();
    let out = dir.path().join("tf.st");
    with_metadata(&out, &out, "val_loss", "99");
    let before = bytes(&out);
    transformer(dir.path(), "english.txt", "tf.st", &["--steps", "2", "--seed", "2"])
        .fails_with(&["nothing written", "unchanged"]);
    assert_eq!(bytes(&out), before, "a worse model replaced the one at --out");
}

#[test]
fn x023_a_transformer_of_another_vocabulary_at_out_is_kept() {
    let dir = trained();
    std::fs::write(dir.path().join("toy.txt"), "abab abba baab ".repeat(400)).unwrap();
    let before = bytes(&dir.path().join("tf.st"));
    transformer(dir.path(), "toy.txt", "tf.st", &["--steps", "2"]).fails_with(&["another vocabulary", "--overwrite"]);
    assert_eq!(bytes(&dir.path().join("tf.st")), before);
    transformer(dir.path(), "toy.txt", "tf.st", &["--steps", "2", "--overwrite"]).succeeds();
}

#[test]
fn g003_g004_g005_generate_bounds_length() {
    let dir = trained();
    std::fs::write(dir.path().join("t.txt"), english(5000, 3)).unwrap();
    let train = [
        "train", "t.txt", "--out", "text.st", "--device", "cpu", "--embed", "8", "--hidden", "8", "--epochs", "1",
        "--quiet",
    ];
    run(dir.path(), &train).succeeds();
    for model in ["text.st", "tf.st"] {
        for length in ["18446744073709551615", "1000000000000"] {
            let args = ["generate", "--model", model, "--prompt", "the king", "--length", length];
            run(dir.path(), &args).fails_with(&["--length must be between 1 and"]);
        }
    }
}

#[test]
fn x003_x004_x005_x011_metadata_sizes_are_checked_against_the_tensors() {
    let dir = trained();
    let model = dir.path().join("tf.st");
    for (key, value) in
        [("block", "1000000000000"), ("embed", "1000000"), ("embed", "1000000000"), ("layers", "1000000000")]
    {
        let crafted = dir.path().join(format!("{key}-{value}.st"));
        with_metadata(&model, &crafted, key, value);
        let args = ["generate", "--model", crafted.to_str().unwrap(), "--prompt", "the", "--length", "5"];
        run(dir.path(), &args).fails_with(&["the metadata says"]);
    }
}

/// MF41: a Transformer whose header lies about a tensor's shape gets the loader's reason, not "not a model
/// that generates text".
#[test]
fn mf41_a_transformer_with_a_broken_header_gets_the_loaders_reason() {
    let dir = trained();
    let crafted = dir.path().join("lie.st");
    bad_input::with_header(&dir.path().join("tf.st"), &crafted, |header| {
        header["pos_emb.weight"]["shape"][0] = 1_000_000_000.into();
    });
    let reason = "model file lie.st: not a safetensors file (invalid shape, data type, or offset for tensor";
    run(dir.path(), &["generate", "--model", "lie.st", "--prompt", "the", "--length", "5"]).fails_with(&[reason]);
    run(dir.path(), &["eval", "english.txt", "--model", "lie.st"]).fails_with(&[reason]);
}

/// DF03: a model that cannot be written (here a file-size limit, as a full disk) ends the run with what
/// --out holds.
#[test]
fn df03_a_failed_write_says_what_out_holds() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("english.txt"), english(20_000, 1)).unwrap();
    let mut args = vec!["transformer", "english.txt", "--out", "t.st", "--device", "cpu", "--layers", "1"];
    args.extend(["--embed", "32", "--block", "32", "--batch", "8", "--steps", "20", "--eval-every", "10", "--quiet"]);
    let mut command = bad_input::textnet(dir.path(), &args);
    // SAFETY: setrlimit and signal are async-signal-safe and touch no memory of the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            // A write past the limit fails with EFBIG instead of killing the process.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit { rlim_cur: 16 << 10, rlim_max: 16 << 10 };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    bad_input::run_for(command, std::time::Duration::from_secs(60)).fails_with(&[
        "cannot write t.st",
        "File too large",
        "nothing written to t.st",
    ]);
    assert!(!dir.path().join("t.st").exists());
}

#[test]
fn x025_x026_a_crafted_transformer_at_out_is_refused_at_once() {
    let dir = trained();
    let model = dir.path().join("tf.st");
    for (key, value) in [("embed", "1000000"), ("layers", "1000000000")] {
        with_metadata(&model, &dir.path().join("o.st"), key, value);
        let run = transformer(dir.path(), "english.txt", "o.st", &["--steps", "2"]);
        run.fails_with(&["--out o.st exists and is not a textnet Transformer model", "the metadata says"]);
    }
}

#[test]
fn z030_a_corpus_of_replacement_characters_is_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.txt"), "\u{fffd}".repeat(5000)).unwrap();
    transformer(dir.path(), "r.txt", "t.st", &["--steps", "2"]).fails_with(&["corpus r.txt holds only U+FFFD"]);
}

#[test]
fn z021_a_divergence_with_a_huge_weight_decay_names_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("english.txt"), english(20_000, 1)).unwrap();
    let run = transformer(dir.path(), "english.txt", "t.st", &["--steps", "10", "--weight-decay", "1000000"]);
    run.fails_with(&["diverged", "--weight-decay"]);
}

#[test]
fn z027_the_corpus_can_come_from_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("english.txt"), english(20_000, 1)).unwrap();
    let mut command =
        bad_input::textnet(dir.path(), &["transformer", "-", "--out", "t.st", "--device", "cpu", "--layers", "1"]);
    command.args(["--embed", "32", "--block", "32", "--batch", "8", "--steps", "2", "--eval-every", "2", "--quiet"]);
    command.stdin(std::fs::File::open(dir.path().join("english.txt")).unwrap());
    bad_input::run_for(command, std::time::Duration::from_secs(60)).succeeds();
    assert!(dir.path().join("t.st").exists());
}

#[test]
fn the_regularization_flags_are_range_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("english.txt"), english(20_000, 1)).unwrap();
    let cases: [(&[&str], &[&str]); 10] = [
        (&["--dropout", "1"], &["--dropout must be in [0, 1), got 1"]),
        (&["--grad-accum", "0"], &["--grad-accum must be at least 1 (micro-batches a step), got 0"]),
        (&["--dropout", "-0.1"], &["--dropout must be in [0, 1)"]),
        (&["--dropout", "nan"], &["--dropout must be in [0, 1)"]),
        (&["--grad-clip", "-1"], &["--clip-norm must be a finite number ≥ 0"]),
        (&["--clip-norm", "inf"], &["--clip-norm must be a finite number ≥ 0"]),
        (&["--eval-iters", "0"], &["--eval-iters must be at least 1"]),
        (&["--warmup", "20", "--steps", "20"], &["--warmup 20 is as long as the whole run"]),
        (&["--lr-schedule", "cosine", "--min-lr", "0.1"], &["--min-lr 0.1 is above --lr 0.001"]),
        (&["--min-lr", "1e-4"], &["--min-lr applies to --lr-schedule cosine only"]),
    ];
    for (flags, expected) in cases {
        transformer(dir.path(), "english.txt", "t.st", flags).fails_with(expected);
        assert!(!dir.path().join("t.st").exists(), "{flags:?} wrote a model");
    }
}

#[test]
fn the_regularization_flags_apply_to_a_resumed_model_and_are_checked_with_it() {
    let dir = trained();
    let resume = ["--resume", "tf.st", "--steps", "10"];
    for flags in [&["--dropout", "0.1"][..], &["--lr-schedule", "cosine", "--warmup", "2"], &["--grad-clip", "1"]] {
        transformer(dir.path(), "english.txt", "r.st", &[&resume[..], flags].concat()).succeeds();
        let _ = std::fs::remove_file(dir.path().join("r.st"));
    }
    transformer(dir.path(), "english.txt", "r.st", &[&resume[..], &["--dropout", "1.5"]].concat())
        .fails_with(&["--dropout must be in [0, 1)"]);
    transformer(dir.path(), "english.txt", "r.st", &[&resume[..], &["--warmup", "10"]].concat())
        .fails_with(&["--warmup 10 is as long as the whole run (10"]);
}

/// The data-parallel flags are checked before anything is read or opened: each mistake is one line, and
/// nothing is written.
#[test]
fn data_parallel_flags_that_cannot_work_end_the_run_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("english.txt"), english(5000, 1)).unwrap();
    let cases: [(&[&str], &[&str]); 5] = [
        (&["--gpus", "2"], &["--gpus and --world-size train on GPUs: leave out --device cpu"]),
        (
            &["--zero"],
            &[
                "--zero shards AdamW's state over the GPUs of a data-parallel run: give --gpus N (N ≥ 2) or --world-size",
            ],
        ),
        (&["--gpus", "3"], &["--batch 8 does not split evenly over 3 GPUs: give a multiple of 3"]),
        (&["--world-size", "2", "--rank", "0"], &["--world-size, --rank and --rendezvous go together"]),
        (
            &["--world-size", "2", "--rank", "0", "--rendezvous", "localhost"],
            &["--rendezvous localhost: expected HOST:PORT"],
        ),
    ];
    for (flags, expected) in cases {
        transformer(dir.path(), "english.txt", "tf.st", flags).fails_with(expected);
        assert!(!dir.path().join("tf.st").exists(), "{flags:?} wrote a model");
    }
}
