//! `textnet transformer` and `textnet generate` with its model files, end to end on the CPU with tiny
//! models on a few KB of text: the report, the model file, the same bytes from the same seed, keep-best,
//! one-line errors for bad input, sampling, and the other commands refusing a Transformer file.

use crate::common::{fails_with, report, s, stderr, stdout, textnet};
use std::path::{Path, PathBuf};
use std::process::Output;
use textnet::transformer::modelfile::{FORMAT, TransformerModel};

/// About 4 KB of English, no '€' in it.
const TEXT: &str = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer \
the slings and arrows of outrageous fortune, or to take arms against a sea of troubles and by opposing end them.\n";

fn corpus(dir: &Path) -> PathBuf {
    let path = dir.join("corpus.txt");
    std::fs::write(&path, TEXT.repeat(20)).unwrap();
    path
}

/// The shape flags, which a --resume'd model brings its own of.
const SHAPE_FLAGS: [&str; 7] = ["--layers", "--heads", "--embed", "--block", "--no-bias", "--tie-weights", "--vocab"];

/// `transformer CORPUS --out OUT` at the tiny size on the CPU (a --resume'd model's own); a flag in `extra`
/// replaces its default.
fn transformer(corpus: &Path, out: &Path, extra: &[&str]) -> Output {
    let tiny = [
        ("--device", "cpu"),
        ("--embed", "32"),
        ("--heads", "2"),
        ("--block", "16"),
        ("--batch", "4"),
        ("--steps", "20"),
        ("--eval-every", "10"),
    ];
    let resume = extra.contains(&"--resume");
    let mut args = vec!["transformer", s(corpus), "--out", s(out)];
    let defaults = tiny.iter().filter(|(flag, _)| !(extra.contains(flag) || resume && SHAPE_FLAGS.contains(flag)));
    for (flag, value) in defaults {
        args.extend([*flag, *value]);
    }
    args.extend(extra);
    textnet(&args)
}

/// A trained tiny model at `dir/m.safetensors`.
pub fn trained(dir: &Path) -> PathBuf {
    let out = dir.join("m.safetensors");
    let o = transformer(&corpus(dir), &out, &["--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

fn generate(model: &Path, extra: &[&str]) -> Output {
    textnet(&[&["generate", "--model", s(model)], extra].concat())
}

/// What `generate` printed after the prompt (its line's newline taken off), checking the prompt leads.
fn continuation(o: &Output, prompt: &str) -> String {
    assert!(o.status.success(), "{}", stderr(o));
    let out = stdout(o);
    let text = out.strip_suffix('\n').unwrap_or_else(|| panic!("no closing newline: {out:?}"));
    text.strip_prefix(prompt).unwrap_or_else(|| panic!("does not start with {prompt:?}: {text:?}")).to_string()
}

#[test]
fn a_run_writes_the_model_and_reports_the_validation_loss() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = corpus(dir.path());

    // Human output: a line per evaluation with its validation loss, then the file written.
    let out = dir.path().join("m.safetensors");
    let o = transformer(&corpus, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let evals: Vec<&str> = text.lines().filter(|l| l.contains("val loss")).collect();
    assert_eq!(evals.len(), 2, "{text}");
    assert!(evals[0].contains("step 10/20") && evals[1].contains("step 20/20"), "{text}");
    assert!(text.contains("m.safetensors holds the trained model (validation loss "), "{text}");
    assert!(out.exists());

    // --json: one report on stdout, the other lines on stderr.
    let out = dir.path().join("j.safetensors");
    let o = transformer(&corpus, &out, &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("val loss"), "{}", stderr(&o));
    let r = report(&o);
    let mut keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "baseline_val_loss",
            "command",
            "config",
            "data",
            "device",
            "device_name",
            "device_reason",
            "diverged",
            "epochs",
            "final",
            "kept_epoch",
            "model",
            "parameters",
            "status",
            "textnet",
        ]
    );
    assert_eq!((r["command"].as_str(), r["status"].as_str()), (Some("transformer"), Some("ok")));
    assert_eq!(r["textnet"], env!("CARGO_PKG_VERSION"));
    assert_eq!((r["device"].as_str(), r["kept_epoch"].as_u64()), (Some("cpu"), Some(2)));
    assert_eq!(r["model"].as_str(), Some(s(&out)));
    assert!(r["baseline_val_loss"].is_null() && r["diverged"].is_null());
    for key in ["out", "keep", "lr", "batch", "seed", "device", "steps", "eval_every", "embed", "heads", "block"] {
        assert!(!r["config"][key].is_null(), "config.{key}");
    }
    assert_eq!((r["config"]["seed"].as_u64(), r["config"]["device"].as_str()), (Some(1), Some("cpu")));
    assert_eq!(
        r["data"]["train_chars"].as_u64().unwrap() + r["data"]["val_chars"].as_u64().unwrap(),
        20 * TEXT.len() as u64
    );
    assert!(r["data"]["val_windows"].as_u64().unwrap() > 0);
    assert_eq!(r["data"]["unknown_chars"], 0);

    let rows = r["epochs"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!((row["epoch"].as_u64(), row["step"].as_u64()), (Some(i as u64 + 1), Some(10 * (i as u64 + 1))));
        for key in ["train_loss", "val_loss", "samples_per_s", "elapsed_s", "last_step_loss"] {
            assert!(row[key].as_f64().is_some_and(f64::is_finite), "epochs[{i}].{key} in {row}");
        }
    }
    let val_loss = r["final"]["val_loss"].as_f64().unwrap();
    assert!(val_loss.is_finite() && val_loss > 0.0, "{val_loss}");
    assert_eq!(r["final"]["val_loss"], rows[1]["val_loss"], "final is the last evaluation's");
    let chance = (r["data"]["vocabulary"].as_u64().unwrap() as f64).ln();
    assert!(val_loss < chance, "20 steps learn something: {val_loss} against ln(vocab) {chance}");

    // The file is a Transformer of the run's sizes, vocabulary and loss.
    let m = TransformerModel::load(&out).unwrap();
    assert_eq!((m.config.embed, m.config.heads, m.config.block, m.steps), (32, 2, 16, 20));
    assert_eq!(m.config.vocab as u64, r["data"]["vocabulary"].as_u64().unwrap());
    assert_eq!(m.params.len() as u64, r["parameters"].as_u64().unwrap());
    assert_eq!(m.val_loss, val_loss as f32);
    let bytes = std::fs::read(&out).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(header.metadata().as_ref().unwrap()["format"], FORMAT);

    // --quiet prints nothing; with --json, the report alone.
    let o = transformer(&corpus, &dir.path().join("q.safetensors"), &["--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!((stdout(&o).as_str(), stderr(&o).as_str()), ("", ""));
    let o = transformer(&corpus, &dir.path().join("q2.safetensors"), &["--quiet", "--json"]);
    assert_eq!(stderr(&o), "");
    assert_eq!(report(&o)["command"], "transformer");
}

#[test]
fn the_same_seed_writes_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = corpus(dir.path());
    let run = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let o = transformer(&corpus, &out, &[&["--quiet"], extra].concat());
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        std::fs::read(&out).unwrap()
    };
    let a = run("a.safetensors", &["--seed", "7"]);
    let b = run("b.safetensors", &["--seed", "7"]);
    assert!(a == b, "seed 7 twice gave different files");
    let c = run("c.safetensors", &["--seed", "8"]);
    assert!(a != c, "seeds 7 and 8 gave the same file");

    // The same run again into the same --out may or may not count as better, but leaves the same bytes.
    let out = dir.path().join("a.safetensors");
    // The same run again ties with the file, and a tie rewrites the same bytes.
    let o = transformer(&corpus, &out, &["--quiet", "--seed", "7"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read(&out).unwrap() == a);
}

#[test]
fn a_better_model_is_not_replaced_by_a_worse_one() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = corpus(dir.path());
    let out = dir.path().join("m.safetensors");
    let o = transformer(&corpus, &out, &["--steps", "40", "--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let before = std::fs::read(&out).unwrap();
    let kept = TransformerModel::load(&out).unwrap().val_loss;

    let o = transformer(&corpus, &out, &["--steps", "2", "--json", "--quiet"]);
    fails_with(&o, &["nothing written", "is above", "unchanged"]);
    let r = report(&o);
    assert_eq!(r["status"], "not_better");
    assert!(r["final"].is_null() && r["kept_epoch"].is_null());
    // The model at --out is measured again on this run's windows: the loss it stored, up to f32 rounding.
    let baseline = r["baseline_val_loss"].as_f64().unwrap();
    assert!((baseline - f64::from(kept)).abs() < 1e-5 * baseline, "{baseline} against the stored {kept}");
    assert!(r["epochs"][0]["val_loss"].as_f64().unwrap() > f64::from(kept));
    assert!(std::fs::read(&out).unwrap() == before, "the better model's bytes changed");

    // Without --quiet it says what is there first.
    let o = transformer(&corpus, &out, &["--steps", "2"]);
    assert!(stdout(&o).contains("already holds a Transformer of validation loss"), "{}", stdout(&o));
    fails_with(&o, &["nothing written"]);
    assert!(std::fs::read(&out).unwrap() == before);
}

#[test]
fn bad_input_gets_one_line_errors_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = corpus(dir.path());
    let out = dir.path().join("m.safetensors");
    let file = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };

    let mut latin1 = TEXT.repeat(20).into_bytes();
    latin1[1234] = 0xE9;
    fails_with(&transformer(&file("latin1.txt", &latin1), &out, &[]), &["not UTF-8", "byte offset 1234", "0xE9"]);
    // 100 characters: 10 to validate, fewer than --block 16 + 1.
    fails_with(
        &transformer(&file("short.txt", &b"abcdefghij".repeat(10)), &out, &[]),
        &["--block", "validation part (10)"],
    );
    fails_with(&transformer(&file("empty.txt", b""), &out, &[]), &["is empty"]);
    fails_with(&transformer(&corpus, &out, &["--heads", "3"]), &["--heads 3", "--embed 32"]);
    fails_with(&transformer(&corpus, &out, &["--steps", "0"]), &["--steps must be at least 1"]);
    fails_with(&transformer(&corpus, &out, &["--batch", "0"]), &["--batch must be at least 1"]);
    fails_with(&transformer(&corpus, &out, &["--eval-every", "0"]), &["--eval-every must be at least 1"]);
    fails_with(&transformer(&corpus, &out, &["--vocab", "1"]), &["--vocab must be at least 2"]);
    for flag in ["--block", "--embed", "--heads", "--layers"] {
        fails_with(&transformer(&corpus, &out, &[flag, "0"]), &[flag]);
    }
    fails_with(&transformer(&corpus, &out, &["--lr", "0"]), &["--lr"]);
    fails_with(&transformer(&corpus, &out, &["--weight-decay", "-1"]), &["--weight-decay"]);
    fails_with(&transformer(&dir.path().join("missing.txt"), &out, &[]), &["cannot open corpus", "missing.txt"]);
    fails_with(&transformer(dir.path(), &out, &[]), &["not a regular file"]);
    assert!(!out.exists());

    // --out naming the corpus, by its own name or another spelling of it.
    let before = std::fs::read(&corpus).unwrap();
    fails_with(&transformer(&corpus, &corpus, &[]), &["--out", "corpus", "destroy"]);
    let spelled = dir.path().join(".").join("corpus.txt");
    fails_with(&transformer(&corpus, &spelled, &[]), &["--out", "corpus", "destroy"]);
    assert!(std::fs::read(&corpus).unwrap() == before, "the corpus changed");
    fails_with(&transformer(&corpus, dir.path(), &[]), &["is a directory"]);

    // --out holding another kind of model, or something else.
    let xor = dir.path().join("x.safetensors");
    let o = textnet(&["xor", "--device", "cpu", "--epochs", "1000", "--quiet", "--out", s(&xor)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let xor_bytes = std::fs::read(&xor).unwrap();
    fails_with(&transformer(&corpus, &xor, &[]), &["is not a textnet Transformer model", "XOR", "not replaced"]);
    assert!(std::fs::read(&xor).unwrap() == xor_bytes, "the XOR file changed");
    let notes = file("notes.txt", b"keep me");
    fails_with(&transformer(&corpus, &notes, &[]), &["is not a textnet Transformer model", "not replaced"]);
    assert_eq!(std::fs::read(&notes).unwrap(), b"keep me");
}

#[test]
fn device_cuda_never_panics() {
    // Without a usable GPU this is a one-line error; with one it trains.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.safetensors");
    let o = transformer(&corpus(dir.path()), &out, &["--device", "cuda", "--quiet"]);
    if !o.status.success() {
        fails_with(&o, &["--device cuda"]);
        assert!(!out.exists());
    }
}

#[test]
fn generate_continues_the_prompt_by_length_characters() {
    let dir = tempfile::tempdir().unwrap();
    let model = trained(dir.path());

    let o = generate(&model, &["--prompt", "To be", "--length", "30"]);
    assert_eq!(continuation(&o, "To be").chars().count(), 30);
    assert_eq!(stderr(&o), "");

    let o = generate(&model, &["--prompt", "To be", "--length", "30", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = report(&o);
    let generated = r["samples"][0]["generated"].as_str().unwrap();
    assert_eq!(generated.chars().count(), 30, "{generated:?}");
    assert_eq!(r["prompt"], "To be");
    assert_eq!(r["samples"][0]["text"].as_str().unwrap(), format!("To be{generated}"));
    assert_eq!(r["prompt_unknown"], 0);
    // The same seed (1 by default) as the plain run: the same characters.
    assert_eq!(continuation(&generate(&model, &["--prompt", "To be", "--length", "30"]), "To be"), generated);

    // A prompt longer than --block (16) uses its last 16 characters.
    let long = "whether 'tis nobler in the mind to suffer the slings";
    assert_eq!(continuation(&generate(&model, &["--prompt", long, "--length", "30"]), long).chars().count(), 30);
}

#[test]
fn generate_reads_unknown_characters_and_refuses_bad_flags() {
    let dir = tempfile::tempdir().unwrap();
    let model = trained(dir.path());

    let o = generate(&model, &["--prompt", "€ to be", "--length", "30"]);
    assert_eq!(continuation(&o, "€ to be").chars().count(), 30);
    let err = stderr(&o);
    assert!(err.starts_with("note: 1 character ") && err.contains("unknown"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let o = generate(&model, &["--prompt", "€€", "--length", "30", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(report(&o)["prompt_unknown"], 2);
    assert!(stderr(&o).contains("2 characters") && stderr(&o).contains("unknown"), "{}", stderr(&o));

    fails_with(&generate(&model, &["--prompt", "to", "--length", "0"]), &["--length"]);
    fails_with(&generate(&model, &["--prompt", "to", "--temperature", "-1"]), &["--temperature"]);
    fails_with(&generate(&model, &["--prompt", "to", "--top-k", "0"]), &["--top-k"]);
}

#[test]
fn generate_is_deterministic_by_seed_and_at_temperature_zero() {
    let dir = tempfile::tempdir().unwrap();
    let model = trained(dir.path());
    let sample = |extra: &[&str]| {
        continuation(&generate(&model, &[&["--prompt", "To be", "--length", "30"], extra].concat()), "To be")
    };
    let seed5 = sample(&["--seed", "5"]);
    assert_eq!(sample(&["--seed", "5"]), seed5);
    assert_ne!(sample(&["--seed", "6"]), seed5);

    let greedy = sample(&["--temperature", "0", "--seed", "5"]);
    assert_eq!(greedy.chars().count(), 30);
    assert_eq!(sample(&["--temperature", "0", "--seed", "6"]), greedy);
    assert_eq!(sample(&["--temperature", "0", "--seed", "123456"]), greedy);
    // The likeliest character is the likeliest among any top k.
    assert_eq!(sample(&["--temperature", "0", "--top-k", "3", "--seed", "9"]), greedy);
    // --top-k 1 takes the likeliest character at any temperature.
    assert_eq!(sample(&["--top-k", "1", "--seed", "9"]), greedy);
}

#[test]
fn other_commands_refuse_a_transformer_file_and_generate_refuses_other_models() {
    let dir = tempfile::tempdir().unwrap();
    let model = trained(dir.path());
    let before = std::fs::read(&model).unwrap();

    let o = textnet(&["predict", "--model", s(&model), "--context", "to be"]);
    fails_with(&o, &["m.safetensors", "not a text model of textnet train", "it is a character-level Transformer"]);

    let png = dir.path().join("digit.png");
    let file = std::fs::File::create(&png).unwrap();
    let mut encoder = png::Encoder::new(file, 28, 28);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header().unwrap().write_image_data(&[0u8; 28 * 28]).unwrap();
    let o = textnet(&["classify", "--model", s(&model), s(&png)]);
    fails_with(&o, &["m.safetensors", "not a textnet MNIST model file"]);
    assert!(std::fs::read(&model).unwrap() == before);

    let xor = dir.path().join("x.safetensors");
    let o = textnet(&["xor", "--device", "cpu", "--epochs", "1000", "--quiet", "--out", s(&xor)]);
    assert!(o.status.success(), "{}", stderr(&o));
    fails_with(
        &generate(&xor, &["--prompt", "to be", "--length", "5"]),
        &["x.safetensors: it is an XOR network", "does not generate text"],
    );
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "To be, or not to be").unwrap();
    fails_with(&generate(&notes, &["--prompt", "to be"]), &["not a textnet model that generates text"]);
    fails_with(&generate(&dir.path().join("none.safetensors"), &["--prompt", "to be"]), &["cannot open model file"]);
}

#[test]
fn each_evaluation_line_gives_the_step_train_and_val_loss_and_speed() {
    let dir = tempfile::tempdir().unwrap();
    let o = transformer(&corpus(dir.path()), &dir.path().join("m.safetensors"), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let evals: Vec<&str> = text.lines().filter(|l| l.starts_with("step ")).collect();
    assert_eq!(evals.len(), 2, "{text}");
    for line in evals {
        for part in [": train loss ", ", val loss ", " tokens/s, ", " elapsed"] {
            assert!(line.contains(part), "{part:?} in {line:?}");
        }
    }
}

#[test]
fn resume_continues_a_model_and_refuses_what_it_cannot_continue() {
    let dir = tempfile::tempdir().unwrap();
    let first = trained(dir.path());
    let before = TransformerModel::load(&first).unwrap();

    // RS10, RS29, RS30: a shape flag with --resume is refused (the model's own shape would be trained
    // whatever it said), before anything is read.
    let out = dir.path().join("resumed.safetensors");
    for (flag, value) in SHAPE_FLAGS.into_iter().zip(["3", "2", "64", "64", "", "", "100"]) {
        let mut extra = vec!["--resume", s(&first), flag];
        extra.extend(Some(value).filter(|v| !v.is_empty()));
        let o = transformer(&corpus(dir.path()), &out, &extra);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{flag}: {err}");
        assert!(err.starts_with("textnet: error: ") && err.trim_end().lines().count() == 1, "{err}");
        assert!(err.contains(flag) && err.contains("cannot be used with") && err.contains("--resume"), "{err}");
        assert!(!out.exists());
    }

    // Its shape and vocabulary are kept; the steps add up; the loss goes on down.
    let o = transformer(&corpus(dir.path()), &out, &["--resume", s(&first), "--steps", "40"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("resuming "), "{}", stdout(&o));
    let after = TransformerModel::load(&out).unwrap();
    assert_eq!((after.config, after.vocab.clone(), after.steps), (before.config, before.vocab.clone(), 60));
    assert!(after.val_loss < before.val_loss, "{} then {}", before.val_loss, after.val_loss);

    // Resuming the model at --out itself: it is replaced only by a better one.
    let o = transformer(&corpus(dir.path()), &out, &["--resume", s(&out), "--steps", "10", "--lr", "0.5", "--json"]);
    let now = TransformerModel::load(&out).unwrap();
    if report(&o)["status"] == "ok" {
        assert!(now.val_loss <= after.val_loss);
    } else {
        assert_eq!(now, after, "a worse model left the file as it was");
    }

    // Another kind of model file, a missing file, a corpus the vocabulary does not cover.
    let xor = dir.path().join("xor.safetensors");
    let o = textnet(&["xor", "--device", "cpu", "--epochs", "1000", "--quiet", "--out", s(&xor)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let fresh = dir.path().join("fresh.safetensors");
    fails_with(&transformer(&corpus(dir.path()), &fresh, &["--resume", s(&xor)]), &["--resume", "XOR"]);
    let missing = dir.path().join("missing.safetensors");
    fails_with(&transformer(&corpus(dir.path()), &fresh, &["--resume", s(&missing)]), &["--resume", "missing"]);
    let greek = dir.path().join("greek.txt");
    std::fs::write(&greek, "αβγδεζηθικλμνξοπρστυφχψω ".repeat(200)).unwrap();
    let o = transformer(&greek, &fresh, &["--resume", s(&first)]);
    fails_with(&o, &["not in the model's vocabulary", "without --resume"]);
    assert!(!fresh.exists());
}

#[test]
fn beta2_reaches_adamw_and_its_range_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = corpus(dir.path());
    let final_loss = |name: &str, extra: &[&str]| {
        let o = transformer(&corpus, &dir.path().join(name), &[&["--json"], extra].concat());
        let r = report(&o);
        (r["config"]["beta2"].as_f64(), r["final"]["val_loss"].as_f64().unwrap())
    };
    let (default_beta2, default_loss) = final_loss("a.safetensors", &[]);
    let (beta2, loss) = final_loss("b.safetensors", &["--beta2", "0.9"]);
    assert_eq!((default_beta2, beta2), (Some(0.999), Some(0.9)));
    // The second moment decays faster, so the steps differ and so does the model.
    assert_ne!(default_loss, loss);
    for bad in ["1", "-0.1", "nan"] {
        let o = transformer(&corpus, &dir.path().join("c.safetensors"), &["--beta2", bad]);
        fails_with(&o, &["--beta2 must be in [0, 1)"]);
    }
}

/// The final validation loss and the config of a `--json` run with `extra` flags.
fn run_report(corpus: &Path, out: &Path, extra: &[&str]) -> serde_json::Value {
    let o = transformer(corpus, out, &[&["--json"], extra].concat());
    assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
    report(&o)
}

#[test]
fn each_regularization_flag_changes_the_model_and_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = corpus(dir.path());
    let model = |name: &str| TransformerModel::load(&dir.path().join(name)).unwrap().params;
    let base = run_report(&corpus, &dir.path().join("base.st"), &[]);
    let config = &base["config"];
    assert_eq!(
        (config["dropout"].as_f64(), config["lr_schedule"].as_str(), config["warmup"].as_u64()),
        (Some(0.0), Some("constant"), Some(0))
    );
    assert_eq!((config["clip_norm"].as_f64(), config["eval_iters"].is_null()), (Some(0.0), true));
    assert_eq!((config["bias"].as_bool(), config["tie_weights"].as_bool()), (Some(true), Some(false)));
    let cases: [(&str, &[&str], &str, serde_json::Value); 8] = [
        ("nobias.st", &["--no-bias"], "bias", serde_json::json!(false)),
        ("tied.st", &["--tie-weights"], "tie_weights", serde_json::json!(true)),
        ("dropout.st", &["--dropout", "0.2"], "dropout", serde_json::json!(0.2)),
        ("cosine.st", &["--lr-schedule", "cosine", "--min-lr", "1e-4"], "lr_schedule", serde_json::json!("cosine")),
        ("warmup.st", &["--warmup", "5"], "warmup", serde_json::json!(5)),
        ("clip.st", &["--grad-clip", "0.1"], "clip_norm", serde_json::json!(0.1)),
        ("iters.st", &["--eval-iters", "2"], "eval_iters", serde_json::json!(2)),
        ("accum.st", &["--grad-accum", "2"], "grad_accum", serde_json::json!(2)),
    ];
    for (name, flags, key, value) in cases {
        let r = run_report(&corpus, &dir.path().join(name), flags);
        assert_eq!(r["config"][key], value, "{flags:?}");
        if key == "eval_iters" {
            // The same training, measured on 2 batches of 4 random windows instead of the spaced ones.
            assert_eq!(model(name), model("base.st"));
            assert_ne!(r["final"]["val_loss"], base["final"]["val_loss"]);
        } else {
            assert_ne!(model(name), model("base.st"), "{flags:?} left the model as it was");
        }
    }
    // The architecture flags are recorded in the file, and --resume keeps them.
    let tied = TransformerModel::load(&dir.path().join("tied.st")).unwrap();
    assert!(tied.config.tie_weights && tied.config.bias);
    let nobias = TransformerModel::load(&dir.path().join("nobias.st")).unwrap();
    assert!(!nobias.config.bias && !nobias.config.tie_weights);
    let resumed = dir.path().join("resumed.st");
    run_report(&corpus, &resumed, &["--resume", s(&dir.path().join("nobias.st"))]);
    assert_eq!(TransformerModel::load(&resumed).unwrap().config, nobias.config);
    // Dropout is a training-time thing only: the same seed gives the same model, and evaluation of it is
    // deterministic (the report's loss equals the file's).
    let again = run_report(&corpus, &dir.path().join("dropout2.st"), &["--dropout", "0.2"]);
    assert_eq!(model("dropout2.st"), model("dropout.st"));
    let stored = TransformerModel::load(&dir.path().join("dropout2.st")).unwrap().val_loss;
    assert_eq!(again["final"]["val_loss"].as_f64().unwrap() as f32, stored);
}

#[test]
fn precision_is_recorded_and_the_cpu_says_it_trains_in_fp32() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = corpus(dir.path());
    let fp32 = run_report(&corpus, &dir.path().join("fp32.st"), &[]);
    assert_eq!(fp32["config"]["precision"].as_str(), Some("fp32"));
    let o = transformer(&corpus, &dir.path().join("bf16.st"), &["--precision", "bf16", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("--precision bf16 applies to the GPU only; the CPU trains in fp32"), "{}", stderr(&o));
    let bf16 = report(&o);
    assert_eq!(bf16["config"]["precision"].as_str(), Some("bf16"));
    // The CPU computes in fp32 whatever the flag: the same run to the bit.
    assert_eq!(bf16["final"]["val_loss"], fp32["final"]["val_loss"]);
    let o = transformer(&corpus, &dir.path().join("bad.st"), &["--precision", "fp16"]);
    assert!(!o.status.success() && stderr(&o).contains("possible values: fp32, tf32, bf16"), "{}", stderr(&o));
}

#[test]
fn the_best_evaluation_is_kept_when_later_ones_overfit() {
    // Training text that alternates "ab", validation text (the last tenth) that mostly does but holds a
    // pair "aa" or "bb" every 8 characters: the validation loss falls while the alternation is learned,
    // then rises as the model grows too sure of it to afford the pairs.
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("overfit.txt");
    std::fs::write(&corpus, format!("{}{}", "ab".repeat(1800), "ababaabb".repeat(50))).unwrap();
    let out = dir.path().join("m.safetensors");
    let flags = ["--steps", "200", "--eval-every", "10", "--lr", "3e-3", "--json", "--quiet"];
    let o = transformer(&corpus, &out, &flags);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = report(&o);
    let losses: Vec<f64> = r["epochs"].as_array().unwrap().iter().map(|e| e["val_loss"].as_f64().unwrap()).collect();
    let best = (0..losses.len()).min_by(|&a, &b| losses[a].total_cmp(&losses[b])).unwrap();
    assert!(best + 1 < losses.len(), "the last evaluation is the best, so this run shows nothing: {losses:?}");
    assert_eq!(r["kept_epoch"].as_u64(), Some(best as u64 + 1), "{losses:?}");
    assert_eq!(r["final"]["val_loss"].as_f64(), Some(losses[best]));
    let model = TransformerModel::load(&out).unwrap();
    assert_eq!((model.val_loss, model.steps), (losses[best] as f32, 10 * (best + 1)));
}
