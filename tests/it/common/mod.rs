//! Helpers every test module may use: running the binary and reading what it printed, the one-line
//! error every failing command must print, and the relative error of two vectors.
#![allow(dead_code)]

pub mod bad_input;
pub mod gradcheck;
pub mod text;

use std::path::Path;
use std::process::{Command, Output};

/// Runs the textnet binary with `args` as `textnet … | head -0` would: its stdout's reader is gone before
/// the first line.
pub fn textnet_without_reader<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_textnet"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("cannot run textnet");
    drop(child.stdout.take());
    child.wait_with_output().expect("cannot wait for textnet")
}

/// Runs the textnet binary with `args`.
pub fn textnet<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_textnet")).args(args).output().expect("cannot run textnet")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn stdout(o: &Output) -> String {
    text(&o.stdout)
}

pub fn stderr(o: &Output) -> String {
    text(&o.stderr)
}

/// The JSON report a command printed on stdout.
pub fn report(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// Exit status 1 and one line on stderr, `textnet: error: …` containing each of `expected`, and no
/// panic.
pub fn fails_with(o: &Output, expected: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.starts_with("textnet: error: "), "{err}");
    for e in expected {
        assert!(err.contains(e), "expected {e:?}: {err}");
    }
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(!err.contains("panicked") && !err.contains("internal error"), "{err}");
}

pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// `textnet mnist` on the CPU, writing `out`: one epoch of a 784 → 8 → 10 model on the first `images`
/// Fashion-MNIST training images.
pub fn small_mnist_model(out: &Path, images: usize) {
    let images = images.to_string();
    let args =
        ["--device", "cpu", "--epochs", "1", "--hidden", "8", "--train-limit", &images, "--quiet", "--out", s(out)];
    let o = textnet(&[&["mnist", "--dataset", "fashion"][..], &args].concat());
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `textnet fit --layers LAYERS` on the CPU, writing `out`: one epoch on the first 1,000 Fashion-MNIST
/// training images; its JSON report.
pub fn small_fit_model(layers: &str, out: &Path) -> serde_json::Value {
    let args = ["--layers", layers, "--dataset", "fashion", "--train-limit", "1000", "--epochs", "1"];
    let o = textnet(&[&["fit", "--device", "cpu"][..], &args, &["--json", "--quiet", "--out", s(out)]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    report(&o)
}

/// A path as the &str a command line takes.
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// ‖a − b‖ / ‖b‖.
pub fn relative(a: &[f64], b: &[f64]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| y * y).sum();
    (diff / norm).sqrt()
}
