//! `predict` on a model file's settings: the context window, unknown words, and the errors.

use crate::common::text::tiny_model;
use textnet::text::predict::predict;

#[test]
fn uses_the_last_context_tokens_and_reports_unknown_ones() {
    let model = tiny_model();
    let p = predict(&model, "Whether TIS xyzzy the", 4, false).unwrap();
    assert_eq!(p.context, ["tis", "xyzzy", "the"]);
    assert_eq!(p.dropped, 1);
    assert_eq!(p.model_context, 3);
    assert_eq!(p.unknown, ["xyzzy"]);
    assert_eq!(p.top.len(), 4);
    assert!(p.top.windows(2).all(|w| w[0].probability >= w[1].probability));
    for c in &p.top {
        assert_eq!(model.vocab.token(c.id), c.token);
    }
}

#[test]
fn a_short_context_is_used_as_it_is() {
    let model = tiny_model();
    let p = predict(&model, "question", 3, false).unwrap();
    assert_eq!((p.context.len(), p.dropped, p.model_context), (1, 0, 3));
}

#[test]
fn top_k_beyond_the_vocabulary_lists_every_token_once() {
    let model = tiny_model();
    let p = predict(&model, "to be", 10_000, true).unwrap();
    assert_eq!(p.top.len(), model.vocab.len());
    let total: f32 = p.top.iter().map(|c| c.probability).sum();
    assert!((total - 1.0).abs() < 1e-5);
}

#[test]
fn empty_unknown_only_and_zero_top_are_errors() {
    let model = tiny_model();
    let err = predict(&model, " \n ", 5, false).unwrap_err().to_string();
    assert!(err.contains("no tokens"), "{err}");
    let err = predict(&model, "xyzzy plugh", 5, false).unwrap_err().to_string();
    assert!(err.contains("none of the context tokens") && err.contains("\"plugh\""), "{err}");
    let err = predict(&model, "to be", 0, false).unwrap_err().to_string();
    assert!(err.contains("--top"), "{err}");
}
