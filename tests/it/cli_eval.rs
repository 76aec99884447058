//! `textnet eval` with both model kinds: the same figures on one thread as on two, a Transformer scored
//! per character as the CPU reference scores it, one report shape, no bar off a terminal, and one-line
//! errors.

use crate::common::text::shakespeare;
use crate::common::{fails_with, report, s, small_mnist_model, stderr, textnet};
use crate::text_infer::small_model;
use crate::transformer_cli::trained;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use textnet::transformer::model;
use textnet::transformer::modelfile::TransformerModel;

/// `eval CORPUS --model MODEL --json` on `threads` threads.
fn eval_on(threads: usize, model: &Path, corpus: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_textnet"))
        .args([&["eval", s(corpus), "--model", s(model)], extra].concat())
        .env("RAYON_NUM_THREADS", threads.to_string())
        .output()
        .unwrap()
}

/// A text model, a Transformer and 30,000 characters of Shakespeare neither trained on.
fn setup(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (text_dir, transformer_dir) = (dir.join("text"), dir.join("transformer"));
    std::fs::create_dir_all(&text_dir).unwrap();
    std::fs::create_dir_all(&transformer_dir).unwrap();
    let corpus = dir.join("other.txt");
    let all = std::fs::read_to_string(shakespeare()).unwrap();
    std::fs::write(&corpus, &all[400_000..430_000]).unwrap();
    (small_model(&text_dir), trained(&transformer_dir), corpus)
}

/// Both kinds sum their losses in sample order whatever the threads: the same bits (the JSON numbers
/// are the shortest decimals that read back as the same f64, so equal text is equal bits).
#[test]
fn eval_gives_the_same_bits_on_one_thread_and_on_two() {
    let dir = tempfile::tempdir().unwrap();
    let (text_model, transformer, corpus) = setup(dir.path());
    for model in [&text_model, &transformer] {
        let one = eval_on(1, model, &corpus, &["--json"]);
        let two = eval_on(2, model, &corpus, &["--json"]);
        assert!(one.status.success() && two.status.success(), "{}{}", stderr(&one), stderr(&two));
        let (mut one, mut two) = (report(&one), report(&two));
        // The reports differ in the threads they name, and nowhere else.
        assert_eq!((one["threads"].take(), two["threads"].take()), (1.into(), 2.into()));
        assert_eq!(one, two);
    }
}

#[test]
fn eval_scores_a_transformer_per_character_with_the_text_models_report() {
    let dir = tempfile::tempdir().unwrap();
    let (text_model, transformer, corpus) = setup(dir.path());
    let r = report(&eval_on(2, &transformer, &corpus, &["--json"]));

    // The reference: windows of `block` characters one after another, every character after the first
    // predicted from those before it in its window, the losses added in order.
    let m = TransformerModel::load(&transformer).unwrap();
    let text = std::fs::read_to_string(&corpus).unwrap();
    let (ids, unknown) = m.vocab.encode(&text);
    let mut loss = 0.0f64;
    for start in (0..ids.len() - 1).step_by(m.config.block) {
        let end = (start + m.config.block).min(ids.len() - 1);
        let f = model::forward::<f32>(&m.config, &m.params, &ids[start..end], 1, Some(&ids[start + 1..end + 1]), None);
        loss += f.losses.iter().map(|&l| f64::from(l)).sum::<f64>();
    }
    let mean = loss / (ids.len() - 1) as f64;
    assert_eq!(r["loss"].as_f64().unwrap(), mean);
    assert_eq!(r["perplexity"].as_f64().unwrap(), mean.exp());
    assert_eq!((r["unit"].as_str(), r["kind"].as_str()), (Some("character"), Some("textnet-transformer")));
    assert_eq!((r["tokens"].as_u64(), r["samples"].as_u64()), (Some(ids.len() as u64), Some(ids.len() as u64 - 1)));
    assert_eq!(r["unknown_tokens"], unknown);
    let top1 = r["top1_accuracy"].as_f64().unwrap();
    assert!(top1 > 0.0 && top1 <= r["top5_accuracy"].as_f64().unwrap(), "{r}");

    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    let t = report(&eval_on(2, &text_model, &corpus, &["--json"]));
    assert_eq!(keys(&t), keys(&r));
    assert_eq!((t["unit"].as_str(), t["kind"].as_str()), (Some("token"), Some("textnet-text")));

    // The human report names the unit, and writes its counts with thousands separators.
    let human = String::from_utf8(eval_on(2, &transformer, &corpus, &[]).stdout).unwrap();
    assert!(human.contains(" characters (") && human.contains("per character (perplexity"), "{human}");
    let (characters, samples) =
        (textnet::harness::report::count(ids.len()), textnet::harness::report::count(ids.len() - 1));
    assert!(characters.contains(','), "the corpus has over 1,000 characters: {characters}");
    assert!(human.contains(&format!(": {characters} characters (")), "{human}");
    assert!(human.contains(&format!(", {samples} samples\n")), "{human}");
    // --max-tokens counts characters.
    let r = report(&eval_on(2, &transformer, &corpus, &["--json", "--max-tokens", "1000"]));
    assert_eq!((r["tokens"].as_u64(), r["samples"].as_u64()), (Some(1000), Some(999)));
}

/// Off a terminal no bar is drawn, so stderr stays empty; `--quiet` is taken.
#[test]
fn eval_draws_no_bar_off_a_terminal_and_takes_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let (text_model, transformer, corpus) = setup(dir.path());
    for model in [&text_model, &transformer] {
        for extra in [&[][..], &["--quiet"], &["--quiet", "--json"]] {
            let o = eval_on(2, model, &corpus, extra);
            assert!(o.status.success(), "{}", stderr(&o));
            assert_eq!(stderr(&o), "", "{extra:?}");
        }
    }
}

#[test]
fn bad_eval_inputs_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (text_model, transformer, corpus) = setup(dir.path());
    fails_with(&eval_on(2, &transformer, &corpus, &["--max-samples", "10"]), &["--max-samples is for text models"]);
    for model in [&text_model, &transformer] {
        fails_with(&eval_on(2, model, &corpus, &["--max-tokens", "0"]), &["--max-tokens must be at least 1"]);
    }
    let short = dir.path().join("short.txt");
    std::fs::write(&short, "T").unwrap();
    fails_with(&eval_on(2, &transformer, &short, &[]), &["has 1 character", "needs at least 2"]);
    std::fs::write(&short, [0xffu8, 0xfe]).unwrap();
    fails_with(&eval_on(2, &transformer, &short, &[]), &["not UTF-8 text"]);
    let mnist = dir.path().join("mnist.safetensors");
    small_mnist_model(&mnist, 300);
    fails_with(
        &textnet(&["eval", s(&corpus), "--model", s(&mnist)]),
        &["it is an MNIST MLP classifier", "eval takes a text model or a Transformer"],
    );
}
