//! `textnet generate` as users of nanoGPT's sample.py and Hugging Face's generate expect, with both model
//! kinds: the prompt positional (or absent: unconditional), `--top-p`, `--num-samples`, `--stop`, one JSON
//! shape, text streamed as it is drawn, and a one-line error for every bad flag.

use crate::common::{fails_with, report, s, stderr, stdout, textnet};
use crate::text_infer::small_model;
use crate::transformer_cli::trained;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn generate(model: &Path, extra: &[&str]) -> Output {
    textnet(&[&["generate", "--model", s(model)], extra].concat())
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", stderr(o));
    stdout(o)
}

/// One model of each kind in its own folder (both train to `m.safetensors`).
fn both(dir: &Path) -> [PathBuf; 2] {
    let (text_dir, transformer_dir) = (dir.join("text"), dir.join("transformer"));
    std::fs::create_dir_all(&text_dir).unwrap();
    std::fs::create_dir_all(&transformer_dir).unwrap();
    [small_model(&text_dir), trained(&transformer_dir)]
}

#[test]
fn the_prompt_is_positional_and_the_prompt_flag_still_works() {
    let dir = tempfile::tempdir().unwrap();
    for (model, prompt) in both(dir.path()).iter().zip(["to be or", "To be"]) {
        let positional = ok(&generate(model, &[prompt, "--length", "20", "--seed", "3"]));
        assert!(positional.starts_with(prompt), "{positional:?}");
        assert_eq!(ok(&generate(model, &["--prompt", prompt, "--length", "20", "--seed", "3"])), positional);
        // A prompt that starts with a hyphen is still a prompt.
        assert!(generate(model, &["--length", "5", "-- to be"]).status.success());
    }
}

#[test]
fn an_absent_or_empty_prompt_samples_unconditionally() {
    let dir = tempfile::tempdir().unwrap();
    let [text_model, transformer] = both(dir.path());
    for model in [&text_model, &transformer] {
        let absent = ok(&generate(model, &["--length", "30", "--seed", "4"]));
        assert_eq!(ok(&generate(model, &["", "--length", "30", "--seed", "4"])), absent);
        assert_eq!(ok(&generate(model, &["--prompt", "", "--length", "30", "--seed", "4"])), absent);
        assert!(!absent.trim().is_empty(), "{absent:?}");
        let r = report(&generate(model, &["--length", "30", "--seed", "4", "--json"]));
        assert_eq!(r["prompt"], "");
        assert_eq!(r["samples"][0]["tokens"], 30);
        assert_eq!(r["samples"][0]["text"], r["samples"][0]["generated"]);
        assert_eq!(format!("{}\n", r["samples"][0]["text"].as_str().unwrap()), absent);
    }
    // The Transformer starts from a newline, not printed: 30 characters and the line's end.
    let text = ok(&generate(&transformer, &["--length", "30"]));
    assert_eq!(text.strip_suffix('\n').unwrap().chars().count(), 30, "{text:?}");
}

#[test]
fn top_p_samples_and_stop_strings() {
    let dir = tempfile::tempdir().unwrap();
    let models = both(dir.path());
    for model in &models {
        let model = model.as_path();
        let one = ok(&generate(model, &["--length", "40", "--seed", "9"]));
        // --top-p 1 cuts nothing: the same draws.
        assert_eq!(ok(&generate(model, &["--length", "40", "--seed", "9", "--top-p", "1"])), one);
        // A small nucleus is nearly greedy: the same text from any seed.
        let narrow = |seed: &str| ok(&generate(model, &["--length", "40", "--seed", seed, "--top-p", "0.000001"]));
        assert_eq!(narrow("1"), ok(&generate(model, &["--length", "40", "--temperature", "0"])));
        assert_eq!(narrow("2"), narrow("1"));

        // Samples one after another from the one generator: the first is the single sample of the seed,
        // a line of dashes between two.
        let three = ok(&generate(model, &["--length", "40", "--seed", "9", "--num-samples", "3"]));
        let samples: Vec<&str> = three.split("---------------\n").collect();
        assert_eq!(samples.len(), 3, "{three}");
        assert_eq!(samples[0], one);
        assert!(samples[1] != samples[0] && samples[2] != samples[1], "{three}");
        let r = report(&generate(model, &["--length", "40", "--seed", "9", "--num-samples", "3", "--json"]));
        let texts: Vec<String> =
            r["samples"].as_array().unwrap().iter().map(|s| format!("{}\n", s["text"].as_str().unwrap())).collect();
        assert_eq!(texts, samples);

        // --stop: the sample ends after the token that completes the string, which is kept.
        let full = report(&generate(model, &["--length", "40", "--seed", "9", "--json"]));
        let generated = full["samples"][0]["generated"].as_str().unwrap().to_string();
        assert_eq!(full["samples"][0]["stopped"], "length");
        let chars: Vec<char> = generated.chars().collect();
        let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
        let r = report(&generate(model, &["--length", "40", "--seed", "9", "--json", "--stop", &stop]));
        let stopped = r["samples"][0]["generated"].as_str().unwrap();
        assert_eq!(r["samples"][0]["stopped"], "stop", "{stop:?} in {generated:?}");
        assert!(generated.starts_with(stopped), "{stop:?}: {stopped:?} of {generated:?}");
        assert!(stopped.len() >= generated.find(&stop).unwrap() + stop.len(), "{stop:?}: {stopped:?}");
        // A stop string never generated changes nothing.
        let never = report(&generate(model, &["--length", "40", "--seed", "9", "--json", "--stop", "§§§"]));
        assert_eq!(never["samples"][0]["generated"], generated.as_str());
    }
    // The Transformer's tokens are characters: the text ends exactly with the stop string.
    let transformer = &models[1];
    let full = report(&generate(transformer, &["To be", "--length", "60", "--json"]));
    let generated = full["samples"][0]["generated"].as_str().unwrap().to_string();
    let stop: String = generated.chars().skip(30).take(3).collect();
    let r = report(&generate(transformer, &["To be", "--length", "60", "--json", "--stop", &stop]));
    let stopped = r["samples"][0]["generated"].as_str().unwrap();
    assert_eq!(stopped.len(), generated.find(&stop).unwrap() + stop.len(), "{stop:?}: {stopped:?}");
    assert_eq!(r["samples"][0]["tokens"], stopped.chars().count());
}

#[test]
fn json_has_one_shape_for_both_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let [text_model, transformer] = both(dir.path());
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    let args = ["to be", "--length", "10", "--json", "--top-p", "0.9", "--top-k", "5", "--stop", "zz"];
    let (a, b) = (report(&generate(&text_model, &args)), report(&generate(&transformer, &args)));
    assert_eq!(keys(&a), keys(&b));
    assert_eq!(keys(&a["samples"][0]), keys(&b["samples"][0]));
    assert_eq!(
        keys(&a),
        [
            "device",
            "kind",
            "length",
            "model",
            "prompt",
            "prompt_unknown",
            "samples",
            "seed",
            "stop",
            "temperature",
            "top_k",
            "top_p"
        ]
    );
    assert_eq!(keys(&a["samples"][0]), ["generated", "stopped", "text", "tokens"]);
    assert_eq!((a["kind"].as_str(), b["kind"].as_str()), (Some("textnet-text"), Some("textnet-transformer")));
    assert_eq!((a["top_p"].as_f64(), a["top_k"].as_u64(), a["device"].as_str()), (Some(0.9), Some(5), Some("cpu")));
}

/// The first token is on stdout while the rest are still being drawn (the run would take minutes), and
/// a closed stdout ends the run.
#[test]
fn text_streams_as_it_is_drawn() {
    let dir = tempfile::tempdir().unwrap();
    for model in both(dir.path()) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_textnet"))
            .args(["generate", "--model", s(&model), "--length", "100000", "--num-samples", "1000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let (send, receive) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut first = [0u8; 1];
            let read = stdout.read_exact(&mut first).map(|()| first[0]);
            // The pipe goes back with the byte, so that it stays open until the child was seen running.
            send.send((read, stdout)).ok();
        });
        let received = receive.recv_timeout(Duration::from_secs(60));
        let running = child.try_wait().unwrap().is_none();
        let first = received.map(|(read, stdout)| {
            drop(stdout);
            read
        });
        // The reader's end of the pipe is closed now: generation stops soon after.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let ended = child.try_wait().unwrap();
        child.kill().ok();
        child.wait().unwrap();
        assert!(matches!(first, Ok(Ok(_))), "nothing printed within a minute: {first:?}");
        assert!(running, "the first byte came only at the end");
        assert_eq!(ended.map(|status| status.code()), Some(Some(0)), "still drawing for a closed stdout");
    }
}

#[test]
fn bad_flags_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let models = both(dir.path());
    for model in &models {
        for (args, expected) in [
            (&["--top-p", "0"][..], "--top-p must be more than 0 and at most 1, got 0"),
            (&["--top-p", "1.5"], "--top-p must be more than 0 and at most 1, got 1.5"),
            (&["--top-p", "-0.1"], "--top-p must be more than 0 and at most 1"),
            (&["--top-p", "NaN"], "--top-p must be more than 0 and at most 1"),
            (&["--num-samples", "0"], "--num-samples must be between 1 and 10000, got 0"),
            (&["--num-samples", "10001"], "--num-samples must be between 1 and 10000"),
            (&["--stop", ""], "--stop must be a non-empty string"),
            (&["--stop", "a", "--stop", ""], "--stop must be a non-empty string"),
        ] {
            fails_with(&generate(model, &[&["to be"], args].concat()), &[expected]);
        }
    }
    // A text prompt of words the model never saw has nothing to continue from, as predict says.
    let text_model = &models[0];
    fails_with(&generate(text_model, &["zqxj vwkq"]), &["none of the prompt's tokens is in the model's vocabulary"]);
    fails_with(&generate(text_model, &["   "]), &["the prompt has no tokens"]);
}
