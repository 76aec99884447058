//! Bad input to `train`, `predict`, `eval` and `xor`, and to what every command shares (the lock on
//! --out, stdout errors, inputs that are not files, negative numbers): the cases of the bad-input audit
//! of 2026-11-24, each named by its ID.

use crate::common::bad_input;

use bad_input::{Tmpfs, bytes, english, run, run_for, textnet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use textnet::text::corpus::{Corpus, CorpusOptions};
use textnet::text::model::{TextParams, TextShape};
use textnet::text::modelfile::TextModel;
use textnet::text::tokenizer::Tokenizer;

/// A folder with an English-like corpus `english.txt` and a model `m.st` trained on it for one epoch.
fn trained() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("english.txt"), english(20_000, 1)).unwrap();
    let model = dir.path().join("m.st");
    train(dir.path(), "english.txt", "m.st", &[]).succeeds();
    (dir, model)
}

/// `train CORPUS --out OUT` on the CPU, one epoch, at a small size unless `extra` gives --embed and
/// --hidden, with `extra` flags.
fn train(dir: &Path, corpus: &str, out: &str, extra: &[&str]) -> bad_input::Run {
    let mut args = vec!["train", corpus, "--out", out, "--device", "cpu", "--epochs", "1", "--quiet"];
    if !extra.contains(&"--embed") {
        args.extend_from_slice(&["--embed", "16", "--hidden", "32"]);
    }
    args.extend_from_slice(extra);
    run(dir, &args)
}

/// `model`'s file rewritten with its hidden and output weights at `value` (finite but far too large).
fn with_huge_weights(model: &Path, out: &Path, value: f32) {
    let mut m = TextModel::load(model).unwrap();
    m.params.w1.fill(value);
    m.params.w2.fill(value);
    m.save(out).unwrap();
}

#[test]
fn r012_resume_on_a_corpus_outside_the_vocabulary_keeps_the_model() {
    let (dir, model) = trained();
    std::fs::write(dir.path().join("cjk.txt"), "天地玄黄宇宙洪荒日月盈昃辰宿列张".repeat(2000)).unwrap();
    let before = bytes(&model);
    let args = ["train", "cjk.txt", "--resume", "m.st", "--out", "m.st", "--device", "cpu", "--epochs", "1"];
    run(dir.path(), &args).fails_with(&["--resume m.st", "not in the model's vocabulary", "<unk>"]);
    assert_eq!(bytes(&model), before, "the model was replaced");
}

#[test]
fn r006_resume_on_a_corpus_outside_the_vocabulary_is_refused() {
    let (dir, _) = trained();
    std::fs::write(dir.path().join("cjk.txt"), "天地玄黄宇宙洪荒日月盈昃辰宿列张".repeat(2000)).unwrap();
    let args = ["train", "cjk.txt", "--resume", "m.st", "--out", "new.st", "--device", "cpu", "--epochs", "1"];
    run(dir.path(), &args).fails_with(&["100.0% of the tokens"]);
    assert!(!dir.path().join("new.st").exists());
}

#[test]
fn k002_a_model_of_another_vocabulary_at_out_is_kept() {
    let (dir, model) = trained();
    std::fs::write(dir.path().join("five.txt"), "a b c d e ".repeat(20)).unwrap();
    let before = bytes(&model);
    train(dir.path(), "five.txt", "m.st", &[])
        .fails_with(&["--out m.st holds a text model of another vocabulary", "--overwrite"]);
    assert_eq!(bytes(&model), before, "the model was replaced");
    train(dir.path(), "five.txt", "m.st", &["--overwrite"]).succeeds();
    assert_ne!(bytes(&model), before, "--overwrite did not replace it");
}

#[test]
fn o026_a_second_run_on_the_same_out_is_refused_while_the_first_runs() {
    let (dir, model) = trained();
    let mut first =
        textnet(dir.path(), &["train", "english.txt", "--out", "m.st", "--device", "cpu", "--epochs", "1000"]);
    let mut first = first.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let lock = dir.path().join(".m.st.lock");
    let start = Instant::now();
    while !lock.exists() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = bytes(&model);
    let second = train(dir.path(), "english.txt", "m.st", &["--keep", "last", "--seed", "2"]);
    first.kill().unwrap();
    first.wait().unwrap();
    second.fails_with(&["--out m.st is being written by another textnet run", "process"]);
    assert_eq!(bytes(&model), before);
}

#[test]
fn p026_predict_stops_reading_once_its_reader_is_gone() {
    let (dir, _) = trained();
    let mut child = textnet(dir.path(), &["predict", "--model", "m.st"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || while stdin.write_all(b"to be or\n").is_ok() {});
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("model: "), "{first}");
    // The reader is dropped here, as `| head -1` exits.
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            panic!("predict went on reading standard input after its stdout closed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    writer.join().unwrap();
}

/// A corpus of `words` draws from `distinct` made-up words, and an untrained model of its vocabulary at
/// the default size (embed 64, hidden 256), whose evaluation is dominated by the output layer.
fn large_vocabulary(dir: &Path, words: usize, distinct: usize) {
    let mut state = 7u64;
    let text: Vec<String> = (0..words)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            format!("w{}", (state >> 33) as usize % distinct)
        })
        .collect();
    let text = text.join(" ");
    std::fs::write(dir.join("big.txt"), &text).unwrap();
    let tokenizer = Tokenizer::default();
    let corpus =
        Corpus::from_text(&text, CorpusOptions { tokenizer, max_vocab: usize::MAX, max_tokens: None }).unwrap();
    let shape = TextShape { vocab: corpus.vocab.len(), embed: 64, hidden: 256, context: 3 };
    TextModel { params: TextParams::init(shape, 1), tokenizer, vocab: corpus.vocab }.save(&dir.join("big.st")).unwrap();
}

/// `eval` ran one sample at a time on one thread, so a corpus of a million tokens took minutes with no
/// output; it runs the batched evaluator, its samples shared out over rayon's threads, which its report
/// names. Its speed is the bench's to measure: the limit here only guards against a hang.
#[test]
fn e017_u008_eval_of_a_large_corpus_runs_on_every_thread() {
    let dir = tempfile::tempdir().unwrap();
    large_vocabulary(dir.path(), 100_000, 8000);
    let mut command = textnet(dir.path(), &["eval", "big.txt", "--model", "big.st", "--json"]);
    command.env("RAYON_NUM_THREADS", "3");
    let run = run_for(command, Duration::from_secs(1800));
    run.succeeds();
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["samples"], 100_000 - 3);
    assert_eq!(report["threads"], 3);
    let expected = (8000f64).ln();
    let loss = report["loss"].as_f64().unwrap();
    assert!((loss - expected).abs() < 0.5, "an untrained model's loss {loss} should be near ln(8000) = {expected}");
}

#[test]
fn m041_m042_j011_eval_refuses_a_model_whose_output_is_not_finite() {
    let (dir, model) = trained();
    with_huge_weights(&model, &dir.path().join("huge.st"), 3e38);
    run(dir.path(), &["eval", "english.txt", "--model", "huge.st"]).fails_with(&["not finite"]);
    let json = run(dir.path(), &["eval", "english.txt", "--model", "huge.st", "--json"]);
    json.fails_with(&["not finite"]);
    assert!(json.stdout.is_empty(), "{}", json.stdout);
}

#[test]
fn m044_resuming_a_model_whose_output_is_not_finite_is_refused_as_such() {
    let (dir, model) = trained();
    with_huge_weights(&model, &dir.path().join("huge.st"), 3e38);
    let args = ["train", "english.txt", "--resume", "huge.st", "--out", "new.st", "--device", "cpu", "--epochs", "1"];
    run(dir.path(), &args).fails_with(&["--resume huge.st", "not finite"]);
}

#[test]
fn m045_a_model_at_out_whose_output_is_not_finite_is_named() {
    let (dir, model) = trained();
    with_huge_weights(&model, &model, 3e38);
    train(dir.path(), "english.txt", "m.st", &[]).fails_with(&[
        "--out m.st holds a model whose outputs",
        "not finite",
        "--overwrite",
    ]);
}

#[test]
fn e005_eval_refuses_max_tokens_0() {
    let (dir, _) = trained();
    run(dir.path(), &["eval", "english.txt", "--model", "m.st", "--max-tokens", "0"])
        .fails_with(&["--max-tokens must be at least 1"]);
}

#[test]
fn t010_a_byte_order_mark_is_not_a_token() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bom.txt"), ["\u{feff}", &english(5000, 2)].concat()).unwrap();
    train(dir.path(), "bom.txt", "m.st", &[]).succeeds();
    let model = TextModel::load(&dir.path().join("m.st")).unwrap();
    assert!(model.vocab.tokens().iter().all(|t| !t.contains('\u{feff}')), "the BOM became a token");
}

#[test]
fn o021_out_that_is_a_symbolic_link_stays_one() {
    let (dir, model) = trained();
    std::fs::create_dir(dir.path().join("runs")).unwrap();
    std::fs::rename(&model, dir.path().join("runs/v1.st")).unwrap();
    std::os::unix::fs::symlink("runs/v1.st", dir.path().join("cur.st")).unwrap();
    let before = bytes(&dir.path().join("runs/v1.st"));
    train(dir.path(), "english.txt", "cur.st", &["--overwrite", "--seed", "3"]).succeeds();
    assert!(std::fs::symlink_metadata(dir.path().join("cur.st")).unwrap().file_type().is_symlink());
    assert_ne!(bytes(&dir.path().join("runs/v1.st")), before, "the link's target was not written");
}

#[test]
fn o025_a_write_protected_model_at_out_is_not_replaced() {
    let (dir, model) = trained();
    std::fs::set_permissions(&model, std::os::unix::fs::PermissionsExt::from_mode(0o444)).unwrap();
    train(dir.path(), "english.txt", "m.st", &["--seed", "3"]).fails_with(&["--out m.st is write-protected"]);
}

#[test]
fn o022_o023_a_failed_save_says_the_file_is_unchanged() {
    let (dir, model) = trained();
    let Some(_full) = Tmpfs::mount(dir.path(), "64k") else {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    // About 124 kB of parameters.
    let large = ["--embed", "64", "--hidden", "256"];
    train(dir.path(), "english.txt", "full/m.st", &large)
        .fails_with(&["No space left on device", "nothing written to full/m.st"]);
    // Room for a small old model but not for the new one beside it.
    let small = dir.path().join("full/m.st");
    std::fs::write(&small, bytes(&model)).unwrap();
    let args = [&large[..], &["--keep", "last", "--overwrite"]].concat();
    train(dir.path(), "english.txt", "full/m.st", &args)
        .fails_with(&["No space left on device", "full/m.st is unchanged"]);
    assert_eq!(bytes(&small), bytes(&model));
}

#[test]
fn w014_w015_output_lost_to_a_full_disk_fails_the_command() {
    let (dir, _) = trained();
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full");
        return;
    };
    let to_full = |args: &[&str], full: std::fs::File| {
        let out = textnet(dir.path(), args).stdout(full).stderr(Stdio::piped()).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        bad_input::Run { code: out.status.code(), stdout: String::new(), stderr, timed_out: false }
    };
    let predict = to_full(&["predict", "--model", "m.st", "to be"], full.try_clone().unwrap());
    predict.fails_with(&["cannot write to standard output", "No space left on device"]);
    let report =
        to_full(&["train", "english.txt", "--out", "j.st", "--device", "cpu", "--epochs", "1", "--json"], full);
    report.fails_with(&["cannot write to standard output"]);
}

#[test]
fn t026_t028_inputs_that_are_no_files_are_named_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut piped = textnet(dir.path(), &["train", "/dev/stdin", "--out", "m.st", "--device", "cpu"]);
    piped.stdin(Stdio::piped());
    run_for(piped, Duration::from_secs(60)).fails_with(&["corpus /dev/stdin is not a regular file", "give - instead"]);
    let _socket = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).unwrap();
    run(dir.path(), &["train", "sock", "--out", "m.st", "--device", "cpu"])
        .fails_with(&["corpus sock is not a regular file"]);
}

#[test]
fn p010_predict_with_nothing_on_standard_input_says_so() {
    let (dir, _) = trained();
    run(dir.path(), &["predict", "--model", "m.st"]).fails_with(&["standard input holds no contexts"]);
}

#[test]
fn p015_predict_names_the_kind_of_another_model() {
    let dir = tempfile::tempdir().unwrap();
    run(dir.path(), &["xor", "--out", "x.st", "--device", "cpu", "--quiet"]).succeeds();
    run(dir.path(), &["predict", "--model", "x.st", "to be"]).fails_with(&["it is an XOR network", "textnet xor"]);
}

#[test]
fn f002_f030_negative_numbers_name_their_flag() {
    let dir = tempfile::tempdir().unwrap();
    for flag in ["--epochs", "--seed"] {
        run(dir.path(), &["train", "c.txt", flag, "-1"]).fails_with_code(2, &[flag, "whole number", "-1"]);
    }
}

#[test]
fn y019_y021_xor_not_learned_fails_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run = run(dir.path(), &["xor", "--out", "x.st", "--device", "cpu", "--epochs", "10", "--json"]);
    run.fails_with(&["did not learn", "of 4 points are on the wrong side", "nothing written to x.st", "--epochs"]);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["status"], "not_learned");
    assert!(!dir.path().join("x.st").exists());
}
