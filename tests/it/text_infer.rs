//! `textnet generate` and `textnet eval` on a small model trained on the CPU.

use crate::common::text::{shakespeare, train_args};
use crate::common::{small_mnist_model, text, textnet};
use std::path::Path;
use textnet::ops::sampling::{Sampling, sample};
use textnet::text::generate::{generate, join};
use textnet::text::model::{Activations, forward};
use textnet::text::modelfile::TextModel;

pub fn small_model(dir: &Path) -> std::path::PathBuf {
    let out = dir.join("m.safetensors");
    let run = textnet(&train_args(&shakespeare(), &out, &["--epochs", "1", "--quiet"]));
    assert!(run.status.success(), "{}", text(&run.stderr));
    out
}

#[test]
fn generation_repeats_for_a_seed_and_greedy_takes_the_likeliest() {
    let dir = tempfile::tempdir().unwrap();
    let path = small_model(dir.path());
    let model = TextModel::load(&path).unwrap();
    let plain = Sampling::PLAIN;
    let (_, a) = generate(&model, "to be or", 30, &plain, 7).unwrap();
    let (_, b) = generate(&model, "to be or", 30, &plain, 7).unwrap();
    let (_, c) = generate(&model, "to be or", 30, &plain, 8).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c, "another seed, the same 30 tokens");
    assert!(a.iter().all(|t| t != "<unk>"), "<unk> sampled: {a:?}");

    // Greedy: each token the largest logit after the last N, <unk> left out.
    let (prompt, greedy) = generate(&model, "to be or", 10, &Sampling { temperature: 0.0, ..plain }, 1).unwrap();
    let n = model.params.shape.context;
    let mut ids = prompt.ids.clone();
    let mut acts = Activations::new(model.params.shape);
    for token in &greedy {
        forward(&model.params, &ids[ids.len() - n..], &mut acts);
        let best =
            (1..acts.logits.len()).max_by(|&x, &y| acts.logits[x].total_cmp(&acts.logits[y]).then(y.cmp(&x))).unwrap();
        assert_eq!(model.vocab.token(best as u32), token);
        ids.push(best as u32);
    }
    // top-k 1 is greedy too.
    assert_eq!(generate(&model, "to be or", 10, &Sampling { top_k: Some(1), ..plain }, 3).unwrap().1, greedy);

    let cli = textnet(&[
        "generate",
        "--model",
        path.to_str().unwrap(),
        "--prompt",
        "to be or",
        "--length",
        "30",
        "--seed",
        "7",
        "--json",
    ]);
    assert!(cli.status.success(), "{}", text(&cli.stderr));
    let report: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap();
    let sample = &report["samples"][0];
    assert_eq!(sample["tokens"], 30);
    let words: Vec<String> = ["to", "be", "or"].iter().map(|w| w.to_string()).chain(a).collect();
    assert_eq!(sample["text"], join(&words));
}

#[test]
fn sampling_follows_the_temperature() {
    use rand::SeedableRng;
    let logits = [5.0f32, 1.0, 0.0, 0.5];
    let mut rng = textnet::ops::cpu::SeededRng::seed_from_u64(1);
    let draws: Vec<usize> = (0..4000).map(|_| sample(&logits, &Sampling::PLAIN, Some(0), &mut rng)).collect();
    assert!(!draws.contains(&0), "<unk> (id 0) drawn while others were left");
    let share = |i: usize| draws.iter().filter(|&&d| d == i).count() as f64 / draws.len() as f64;
    // exp(1) : exp(0) : exp(0.5) over ids 1, 2, 3.
    let total = 1f64.exp() + 1.0 + 0.5f64.exp();
    assert!((share(1) - 1f64.exp() / total).abs() < 0.03, "{}", share(1));
    assert!((share(2) - 1.0 / total).abs() < 0.03, "{}", share(2));
    assert_eq!(
        join(&["my".into(), "lord".into(), ",".into(), "(".into(), "aside".into(), ")".into()]),
        "my lord, (aside)"
    );
}

#[test]
fn bad_generate_inputs_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = small_model(dir.path());
    let model = path.to_str().unwrap();
    for (args, expected) in [
        (vec!["--prompt", "to be", "--length", "0"], "--length must be between 1 and 100000"),
        (vec!["--prompt", "to be", "--temperature", "-1"], "--temperature must be 0 or more"),
        (vec!["--prompt", "to be", "--top-k", "0"], "--top-k must be at least 1"),
        (vec!["--prompt", "   "], "the prompt has no tokens"),
    ] {
        let mut full = vec!["generate", "--model", model];
        full.extend(args);
        let out = textnet(&full);
        assert_eq!(out.status.code(), Some(1), "{full:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected) && stderr.trim_end().lines().count() == 1, "{full:?}: {stderr}");
    }
    // A model file of another kind says what it is.
    let mnist = dir.path().join("mnist.safetensors");
    small_mnist_model(&mnist, 300);
    let out = textnet(&["generate", "--model", mnist.to_str().unwrap(), "--prompt", "to be"]);
    assert!(text(&out.stderr).contains("it is an MNIST MLP classifier"), "{}", text(&out.stderr));
}

#[test]
fn eval_reports_the_reference_figures_on_another_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let path = small_model(dir.path());
    let corpus = std::fs::read_to_string(shakespeare()).unwrap();
    let other = dir.path().join("other.txt");
    std::fs::write(&other, &corpus[300_000..350_000]).unwrap();
    let out = textnet(&["eval", "--model", path.to_str().unwrap(), other.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let model = TextModel::load(&path).unwrap();
    let options =
        textnet::text::corpus::CorpusOptions { tokenizer: model.tokenizer, max_vocab: usize::MAX, max_tokens: None };
    let tokens = textnet::text::corpus::Corpus::from_text(&corpus[300_000..350_000], options)
        .unwrap()
        .in_vocabulary(&model.vocab)
        .tokens;
    let n = model.params.shape.context as u32;
    let positions: Vec<u32> = (n..tokens.len() as u32).collect();
    let sums = textnet::text::model::evaluate(&model.params, &tokens, &positions);
    assert_eq!(report["samples"], serde_json::json!(sums.samples));
    let loss = report["loss"].as_f64().unwrap();
    // eval runs the batched evaluator (matrix products on every core), whose sums round differently.
    let reference = sums.loss / sums.samples as f64;
    assert!((loss - reference).abs() < 1e-5 * reference, "loss {loss}, reference {reference}");
    assert!((report["perplexity"].as_f64().unwrap() - loss.exp()).abs() < 1e-6);
    let top5 = report["top5_accuracy"].as_f64().unwrap();
    assert!((top5 - sums.top5 as f64 / sums.samples as f64).abs() <= 2.0 / sums.samples as f64, "top-5 {top5}");

    std::fs::write(&other, "to be").unwrap();
    let short = textnet(&["eval", "--model", path.to_str().unwrap(), other.to_str().unwrap()]);
    assert_eq!(short.status.code(), Some(1));
    assert!(text(&short.stderr).contains("needs at least"), "{}", text(&short.stderr));
}
