//! Inputs that once crashed or hung the binary: absurd sizes and epoch counts, FIFOs, a corpus cut
//! short while it is read, a model whose forward pass overflows. Each must end in a one-line error (or,
//! for the corpus, a clean run), never a panic, an abort, a signal or a hang.

use crate::common::text::{shakespeare, tiny_model};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs textnet with `args`, killing it (and failing) if it runs past `secs` seconds.
fn textnet_within(args: &[&str], secs: u64) -> Output {
    run_within(Command::new(env!("CARGO_BIN_EXE_textnet")).args(args), secs)
}

fn run_within(command: &mut Command, secs: u64) -> Output {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("cannot run textnet");
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("{command:?} still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Checks that `out` is a failure with one line on stderr, `textnet: error: …` containing `expected`.
fn failed_with(out: &Output, expected: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "should fail with status 1; stderr: {stderr}");
    assert!(stderr.starts_with("textnet: error: ") && !stderr.contains("internal error"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(expected), "{stderr:?} lacks {expected:?}");
    stderr
}

/// A small CPU training run on `corpus`; `extra` flags replace the small defaults.
fn train_args<'a>(corpus: &'a str, out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let small =
        [("--device", "cpu"), ("--max-tokens", "20000"), ("--max-vocab", "300"), ("--embed", "8"), ("--hidden", "16")];
    let mut args = vec!["train", corpus, "--out", out];
    for (flag, value) in small.into_iter().filter(|(flag, _)| !extra.contains(flag)) {
        args.extend([flag, value]);
    }
    args.extend(extra);
    args
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("cannot run mkfifo");
    assert!(status.success());
}

#[test]
fn absurd_epoch_counts_are_refused_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.safetensors");
    let out = out.to_str().unwrap();
    let corpus = shakespeare();
    let corpus = corpus.to_str().unwrap();
    for epochs in ["18446744073709551615", "1000000000000", "1000001"] {
        let args = train_args(corpus, out, &["--epochs", epochs]);
        failed_with(&textnet_within(&args, 60), "--epochs must be at most 1000000");
        let mnist = ["mnist", "--device", "cpu", "--data", "/nonexistent", "--out", out, "--epochs", epochs];
        failed_with(&textnet_within(&mnist, 60), "--epochs must be at most 1000000");
    }
    assert!(!Path::new(out).exists());
}

#[test]
fn a_model_too_large_for_memory_is_refused_before_allocating() {
    // 300 × 1,000,000 embedding entries pass the per-tensor size check, but four 1.2 GB copies of the
    // parameters do not fit under a 3 GB address-space limit.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.safetensors");
    let corpus = shakespeare();
    let args = train_args(corpus.to_str().unwrap(), out.to_str().unwrap(), &["--embed", "1000000", "--hidden", "4"]);
    let mut command = Command::new("sh");
    command.args(["-c", "ulimit -v 3000000 && exec \"$0\" \"$@\"", env!("CARGO_BIN_EXE_textnet")]).args(&args);
    let stderr = failed_with(&run_within(&mut command, 60), "of memory");
    assert!(stderr.contains("lower --embed, --hidden or --max-vocab") && stderr.contains("GB"), "{stderr}");
    assert!(!out.exists());
}

#[test]
fn fifos_are_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let fifo = fifo.to_str().unwrap();
    let out = dir.path().join("m.safetensors");
    let args = train_args(fifo, out.to_str().unwrap(), &[]);
    failed_with(&textnet_within(&args, 20), "is not a regular file");
    failed_with(&textnet_within(&["predict", "--model", fifo, "--context", "to be"], 20), "is not a regular file");
}

#[test]
fn a_corpus_truncated_while_read_never_kills_the_process() {
    // The file flips between 64 MB and nothing while textnet reads it: whatever it sees, it must end
    // with a result or a one-line error, never a signal (SIGBUS, when the corpus was memory-mapped).
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
    let file = std::fs::File::create(&corpus).unwrap();
    file.set_len(64 << 20).unwrap();
    let out = dir.path().join("m.safetensors");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                file.set_len(0).unwrap();
                file.set_len(64 << 20).unwrap();
            }
        })
    };
    let args = train_args(corpus.to_str().unwrap(), out.to_str().unwrap(), &["--epochs", "1"]);
    let result = textnet_within(&args, 120);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    flipper.join().unwrap();
    if !result.status.success() {
        failed_with(&result, "corpus");
    }
}

#[test]
fn a_model_whose_forward_pass_overflows_is_an_error() {
    let mut model = tiny_model();
    model.params.w2.iter_mut().for_each(|w| *w = 3e38);
    model.params.b1.iter_mut().for_each(|b| *b = 1.0);
    let e = format!("{:#}", textnet::text::predict::predict(&model, "to be", 5, false).unwrap_err());
    assert!(e.contains("not finite"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("huge.safetensors");
    model.save(&path).unwrap();
    let out = textnet_within(&["predict", "--model", path.to_str().unwrap(), "--context", "to be"], 20);
    failed_with(&out, "not finite");
    assert!(out.stdout.is_empty());
}

#[test]
fn the_memory_estimate_names_the_flags_that_shrink_its_largest_parts() {
    use textnet::text::model::TextShape;
    let shape = TextShape { vocab: 300, embed: 1_000_000, hidden: 4, context: 3 };
    let need = shape.training_memory(1, 20_000, true);
    let params = shape.parameter_count() * 4;
    assert!(need.total() >= 4 * params && need.total() < 4 * params + (16 << 20), "{}", need.total());
    need.check(None).unwrap();
    need.check(Some(need.total())).unwrap();
    let e = format!("{:#}", need.check(Some(2 << 30)).unwrap_err());
    assert!(e.contains("needs about 4.5 GB") && e.contains("only 2.0 GB is available"), "{e}");
    assert!(e.contains("lower --embed, --hidden or --max-vocab") && !e.contains("--batch"), "{e}");
    // A GPU trainer keeps no host copy of its own, and a CPU batch holds each sample's forward values.
    assert_eq!(shape.training_memory(1, 20_000, false).total(), need.total() - params - (2 * 1_000_000 + 12 + 600) * 4);
    let wide = TextShape { vocab: 50_000, embed: 8, hidden: 16, context: 3 };
    let e = format!("{:#}", wide.training_memory(100_000, 1_000_000, true).check(Some(1 << 30)).unwrap_err());
    assert!(e.contains("lower --batch") && e.contains("only 1.0 GB is available"), "{e}");
}

#[test]
fn a_shared_memory_shortfall_names_the_context_when_the_context_causes_it() {
    use textnet::text::gpu::TextLayout;
    use textnet::text::model::TextShape;
    let max = 227 * 1024;
    let long = TextShape { vocab: 8192, embed: 64, hidden: 256, context: 100_000 };
    let layout = TextLayout::new(long, 132, max).unwrap();
    assert_eq!(layout.flag_at_fault(&|l| l.sample_update_shared(), max, "--embed"), "--context");
    assert_eq!(layout.flag_at_fault(&|l| l.hidden_shared(8), max, "--embed"), "--context");
    assert_eq!(layout.flag_at_fault(&|l| l.update_shared(8, false), max, "--embed"), "--context");
    // Where the context is not what overflows, the kernel's own flag stays.
    let short = TextLayout::new(TextShape { context: 3, ..long }, 132, max).unwrap();
    assert_eq!(short.flag_at_fault(&|l| l.sample_update_shared(), 512, "--embed"), "--embed");
    assert_eq!(layout.flag_at_fault(&|l| l.forward_shared(1), 1024, "--hidden"), "--hidden");
}
