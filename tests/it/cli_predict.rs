//! `predict` takes its context as a positional argument, as `--context`, or from standard input one per
//! line; `--device cuda` fails as `train --device cuda` does where no GPU is usable; `train -` reads the
//! corpus from standard input. Through the binary, on the CPU.

use crate::common::text::{shakespeare, train_args};
use crate::common::{text, textnet};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use textnet::text::modelfile::TextModel;

/// Runs the binary with `input` on its standard input.
fn with_stdin(args: &[&str], input: &[u8]) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_textnet"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run textnet");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn small_model(dir: &Path) -> String {
    let out = dir.join("m.safetensors");
    let run = textnet(&train_args(&shakespeare(), &out, &["--epochs", "1", "--quiet"]));
    assert!(run.status.success(), "{}", text(&run.stderr));
    out.to_str().unwrap().to_string()
}

#[test]
fn the_context_is_positional_or_a_flag_or_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    let model = small_model(dir.path());
    let positional = textnet(&["predict", "--model", &model, "--json", "to be or"]);
    let flag = textnet(&["predict", "--model", &model, "--json", "--context", "to be or"]);
    assert!(positional.status.success(), "{}", text(&positional.stderr));
    assert_eq!(text(&positional.stdout), text(&flag.stdout));

    let piped = with_stdin(&["predict", "--model", &model, "--json"], b"to be or\nmy lord\n");
    assert!(piped.status.success(), "{}", text(&piped.stderr));
    let lines: Vec<serde_json::Value> = text(&piped.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "one JSON object per context line");
    assert_eq!(text(&positional.stdout).trim(), serde_json::to_string(&lines[0]).unwrap());
    assert_eq!(lines[1]["context"], serde_json::json!(["my", "lord"]));

    // A line without tokens gets an error of its own and the others their answers; the exit status says a
    // line failed. With --json the error stands in the line's place.
    let blank = with_stdin(&["predict", "--model", &model], b"to be or\n\nmy lord\n");
    assert_eq!(blank.status.code(), Some(1));
    let err = text(&blank.stderr);
    assert!(err.contains("textnet: line 2 of standard input: the context has no tokens"), "{err}");
    assert!(
        err.trim_end()
            .ends_with("textnet: error: 1 of 3 lines of standard input had no prediction (each is named above)"),
        "{err}"
    );
    assert_eq!(text(&blank.stdout).matches("context: ").count(), 2, "{}", text(&blank.stdout));
    let blank = with_stdin(&["predict", "--model", &model, "--json"], b"to be or\n\nmy lord\n");
    let lines: Vec<serde_json::Value> = text(&blank.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    assert_eq!((lines[1]["line"].as_u64(), lines[2]["context"].clone()), (Some(2), serde_json::json!(["my", "lord"])));
    assert!(lines[1]["error"].as_str().unwrap().contains("no tokens"));
}

#[test]
fn predict_on_cuda_fails_like_train_where_no_gpu_is_usable() {
    let dir = tempfile::tempdir().unwrap();
    let model = small_model(dir.path());
    let out = textnet(&["predict", "--model", &model, "--device", "cuda", "to be or"]);
    match textnet::device::select(textnet::device::DeviceChoice::Cuda) {
        Ok(_) => assert!(out.status.success(), "a usable GPU: {}", text(&out.stderr)),
        Err(e) => {
            assert_eq!(out.status.code(), Some(1));
            assert_eq!(text(&out.stderr).trim(), format!("textnet: error: {e:#}"));
            assert!(out.stdout.is_empty());
        }
    }
}

#[test]
fn train_reads_the_corpus_from_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    let from_file = dir.path().join("file.safetensors");
    let from_stdin = dir.path().join("stdin.safetensors");
    let corpus = std::fs::read(shakespeare()).unwrap();
    let slice = &corpus[..200_000];
    let file = dir.path().join("slice.txt");
    std::fs::write(&file, slice).unwrap();
    let a = textnet(&train_args(&file, &from_file, &["--epochs", "1", "--quiet"]));
    assert!(a.status.success(), "{}", text(&a.stderr));
    let args = train_args(Path::new("-"), &from_stdin, &["--epochs", "1", "--quiet"]);
    let b = with_stdin(&args.iter().map(String::as_str).collect::<Vec<_>>(), slice);
    assert!(b.status.success(), "{}", text(&b.stderr));
    let (a, b) = (TextModel::load(&from_file).unwrap(), TextModel::load(&from_stdin).unwrap());
    assert_eq!(a.params, b.params);
    assert_eq!(a.vocab.tokens(), b.vocab.tokens());
    // Not UTF-8 on standard input: the same one-line error as for a file.
    let bad = with_stdin(&args.iter().map(String::as_str).collect::<Vec<_>>(), b"abc\xff");
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).contains("(standard input) is not UTF-8 text"), "{}", text(&bad.stderr));
}

/// `<unk>` is no answer by default (generate never samples it either); `--show-unk` lists it. With --top
/// at the vocabulary's size every other token is listed either way.
#[test]
fn unk_is_left_out_of_the_candidates_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.safetensors");
    let run = textnet(&train_args(&shakespeare(), &out, &["--epochs", "1", "--quiet", "--max-vocab", "40"]));
    assert!(run.status.success(), "{}", text(&run.stderr));
    let vocab = TextModel::load(&out).unwrap().vocab.len();
    let model = out.to_str().unwrap();
    let top = |extra: &[&str]| -> Vec<String> {
        let o = textnet(&[&["predict", "--model", model, "--json", "--top", "1000", "to be"][..], extra].concat());
        assert!(o.status.success(), "{}", text(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["top"].as_array().unwrap().iter().map(|c| c["token"].as_str().unwrap().to_string()).collect()
    };
    let hidden = top(&[]);
    assert_eq!(hidden.len(), vocab - 1);
    assert!(!hidden.iter().any(|t| t == "<unk>"), "{hidden:?}");
    let shown = top(&["--show-unk"]);
    assert_eq!(shown.len(), vocab);
    assert!(shown.iter().any(|t| t == "<unk>"), "{shown:?}");
}
