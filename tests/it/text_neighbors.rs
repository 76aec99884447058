//! `textnet neighbors WORD`: the nearest words by cosine similarity of the embedding table, against a
//! hand-made table, and through the binary.

use crate::common::text::{shakespeare, tiny_model, train_args};
use crate::common::{fails_with, report, textnet};
use textnet::text::neighbors::neighbors;

#[test]
fn the_nearest_rows_by_cosine_come_first_without_the_word_and_unk() {
    let mut model = tiny_model();
    let d = model.params.shape.embed;
    let id = |t: &str| model.vocab.get(t).unwrap() as usize;
    let (to, be, or, question) = (id("to"), id("be"), id("or"), id("question"));
    // "be" points where "to" does at twice the length (cosine 1), "or" nearly so, "question" the other way.
    let row = |v: f32, k: usize| -> Vec<f32> { (0..d).map(|j| if j == k { v } else { 0.01 * v }).collect() };
    for (token, values) in [(to, row(1.0, 0)), (be, row(2.0, 0)), (or, row(1.0, 1)), (question, row(-1.0, 0))] {
        model.params.embedding[token * d..][..d].copy_from_slice(&values);
    }
    let unk = row(5.0, 0);
    model.params.embedding[..d].copy_from_slice(&unk);
    let found = neighbors(&model, "To", model.vocab.len()).unwrap();
    assert_eq!(found.len(), model.vocab.len() - 2, "every token but the word and <unk>");
    assert_eq!(found[0].token, "be");
    assert!((found[0].similarity - 1.0).abs() < 1e-6, "{found:?}");
    assert_eq!(found.last().unwrap().token, "question");
    assert!((found.last().unwrap().similarity + 1.0).abs() < 1e-6);
    assert!(!found.iter().any(|n| n.token == "to" || n.token == "<unk>"));
    assert!(found.windows(2).all(|w| w[0].similarity >= w[1].similarity));

    let err = |word: &str| neighbors(&model, word, 5).unwrap_err().to_string();
    assert!(err("xyzzy").contains("not in the model's vocabulary"), "{}", err("xyzzy"));
    assert!(err("to be").contains("2 tokens"), "{}", err("to be"));
    assert!(neighbors(&model, "to", 0).is_err());
}

#[test]
fn neighbors_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.safetensors");
    let run = textnet(&train_args(&shakespeare(), &out, &["--epochs", "1", "--quiet"]));
    assert!(run.status.success());
    let model = out.to_str().unwrap();
    let o = textnet(&["neighbors", "--model", model, "--top", "5", "--json", "king"]);
    let r = report(&o);
    assert_eq!(r["neighbors"].as_array().unwrap().len(), 5, "{r}");
    let text = textnet(&["neighbors", "--model", model, "--top", "3", "king"]);
    assert_eq!(String::from_utf8_lossy(&text.stdout).lines().count(), 3);
    fails_with(&textnet(&["neighbors", "--model", model, "xyzzy"]), &["\"xyzzy\" is not in the model's vocabulary"]);
}
