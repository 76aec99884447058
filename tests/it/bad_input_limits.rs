//! Bad input, round 3 (the audit of 2026-11-28, each case named by its ID): memory limits that the
//! estimates must see (`ulimit -v`, evaluation's buffers), outputs that must never replace a model, a
//! failed save that says what `--out` holds, and help that is not lost on a full disk.

use crate::common::bad_input;

use bad_input::{Tmpfs, bytes, english, run, run_limited};
use std::process::Stdio;

/// `rows` rows of a table whose target y is 3·a − 2·b plus noise, comma-separated.
fn table(rows: usize) -> String {
    let mut state = 5u64;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 40) as f64 / (1u64 << 24) as f64
    };
    let mut text = String::from("a,b,y\n");
    for _ in 0..rows {
        let (a, b) = (next(), next());
        text += &format!("{a:.4},{b:.4},{:.4}\n", 3.0 * a - 2.0 * b + 0.01 * next());
    }
    text
}

/// A folder with `english.txt`, `t.csv`, a text model `text.st` and a fit model of the table `fit.st`.
fn inputs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("english.txt"), english(20_000, 1)).unwrap();
    std::fs::write(dir.path().join("t.csv"), table(300)).unwrap();
    let train = ["train", "english.txt", "--out", "text.st", "--device", "cpu", "--epochs", "1", "--quiet"];
    run(dir.path(), &train).succeeds();
    let fit = fit_args("fit.st", &["--epochs", "20"]);
    run(dir.path(), &fit).succeeds();
    dir
}

fn fit_args<'a>(out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["fit", "--layers", "Linear(16), ReLU, Linear(1)", "--table", "t.csv", "--target", "y"];
    args.extend(["--device", "cpu", "--quiet", "--out", out]);
    args.extend(extra);
    args
}

/// UL01–UL04, U008: under an address-space limit every command either runs or ends in the one-line
/// error; the C allocator's per-thread arenas and rayon's threads once aborted them.
#[test]
fn ul01_ul04_commands_under_a_small_address_space_limit_never_abort() {
    let dir = inputs();
    let commands: [&[&str]; 4] = [
        &["train", "english.txt", "--out", "m.st", "--device", "cpu", "--epochs", "1", "--quiet"],
        &fit_args("f.st", &["--epochs", "2"]),
        &["sales", "t.csv", "--target", "y", "--out", "s.st", "--device", "cpu", "--epochs", "2", "--quiet"],
        &["eval", "english.txt", "--model", "text.st", "--quiet"],
    ];
    // Above the binary's own size (with its kernels compiled in, 50 MB), which `exec` must map first.
    let binary = std::fs::metadata(bad_input::bin()).unwrap().len();
    for headroom_mb in [20, 40, 70] {
        let limit = binary + (headroom_mb << 20);
        for args in commands {
            let run = run_limited(dir.path(), args, limit);
            assert!(!run.timed_out, "{args:?} under {limit} bytes hung");
            match run.code {
                Some(0) => {}
                _ => {
                    run.fails_with(&[]);
                }
            }
        }
    }
}

/// FS49: evaluation forwards a chunk of samples per thread keeping every layer's output; the estimate
/// counts it, so a deep spec is refused before training instead of aborting after it.
#[test]
fn fs49_the_fit_memory_estimate_counts_evaluations_chunks_on_every_thread() {
    use textnet::nn::stack::model::Network;
    use textnet::nn::stack::spec::{Shape, parse};
    let spec = parse(&(["ReLU"; 100].join(", ") + ", Linear(784, 10)")).unwrap();
    let net = Network::new(&spec, Shape::Flat(784)).unwrap();
    let need = net.memory_need(0, 64);
    let (_, eval, _) = need.parts.iter().find(|(what, ..)| what.starts_with("evaluation")).expect("no evaluation part");
    let outputs: u64 = net.shapes.iter().map(|&s| textnet::nn::stack::model::size(s) as u64).sum();
    let rows = (textnet::nn::stack::cpu::EVAL_CHUNK * rayon::current_num_threads()) as u64;
    assert_eq!(*eval, outputs * rows * 4);
}

/// FP07: `fit --predictions` never replaces a model file, as `sales --predictions` does not (P123).
#[test]
fn fp07_fit_predictions_never_overwrite_a_model_file() {
    let dir = inputs();
    let before = bytes(&dir.path().join("text.st"));
    let args = ["fit", "--model", "fit.st", "--predict", "t.csv", "--predictions", "text.st"];
    run(dir.path(), &args).fails_with(&["--predictions text.st holds a model file"]);
    assert_eq!(bytes(&dir.path().join("text.st")), before);
}

/// DF01, DF02, DF13: a save that fails says what `--out` holds, as `train` and `mnist` do.
#[test]
fn df01_df02_a_failed_fit_save_says_what_out_holds() {
    let dir = inputs();
    let Some(_full) = Tmpfs::mount(dir.path(), "64k") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    // 80,001 parameters: more than the 64 KB file system takes.
    let args = ["fit", "--layers", "Linear(20000), ReLU, Linear(1)", "--table", "t.csv", "--target", "y"];
    let run_full = run(dir.path(), &[&args[..], &["--device", "cpu", "--epochs", "1", "--out", "full/m.st"]].concat());
    run_full.fails_with(&["cannot write full/m.st", "nothing written to full/m.st"]);

    std::fs::copy(dir.path().join("fit.st"), dir.path().join("full/m.st")).unwrap();
    let before = bytes(&dir.path().join("full/m.st"));
    let overwrite = ["--device", "cpu", "--epochs", "1", "--out", "full/m.st", "--overwrite"];
    run(dir.path(), &[&args[..], &overwrite].concat())
        .fails_with(&["cannot write full/m.st", "nothing written, so full/m.st is unchanged"]);
    assert_eq!(bytes(&dir.path().join("full/m.st")), before);
}

/// CM11, CM16, CM17: help and version written to a full disk are an error, as every command's output is.
#[test]
fn cm11_cm16_cm17_help_and_version_on_a_full_disk_fail() {
    for args in [&["--help"][..], &["--version"], &["fit", "--help"]] {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = std::process::Command::new(bad_input::bin()).args(args).stdout(Stdio::from(full)).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.starts_with("textnet: error: cannot write to standard output"), "{args:?}: {stderr}");
    }
    // A reader that goes away (`| head -1`) is no error.
    let out = crate::common::textnet_without_reader(&["--help"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

/// F002: a negative count and 0 are refused with the same lower bound.
#[test]
fn f002_negative_and_zero_epochs_name_the_same_bound() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("e.txt"), english(2_000, 1)).unwrap();
    let negative = run(dir.path(), &["train", "e.txt", "--epochs", "-1"]);
    negative.fails_with_code(2, &["--epochs takes a whole number of 1 or more, got -1"]);
    run(dir.path(), &["train", "e.txt", "--epochs", "0"]).fails_with(&["--epochs must be at least 1, got 0"]);
    // A flag that takes 0 still says so.
    run(dir.path(), &["train", "e.txt", "--seed", "-1"])
        .fails_with_code(2, &["--seed takes a whole number of 0 or more"]);
}
