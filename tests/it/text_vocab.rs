//! Tokenizer, vocabulary, corpus reading and the train/validation split.

use textnet::text::corpus::{Corpus, CorpusOptions, Split};
use textnet::text::tokenizer::Tokenizer;
use textnet::text::train::{spread_subset, unigram_loss};
use textnet::text::vocab::{UNK, UNK_ID, Vocab};

fn tokens(tokenizer: Tokenizer, text: &str) -> Vec<String> {
    tokenizer.tokens(text).map(|t| t.into_owned()).collect()
}

fn options(max_vocab: usize) -> CorpusOptions {
    CorpusOptions { tokenizer: Tokenizer::default(), max_vocab, max_tokens: None }
}

#[test]
fn words_and_punctuation_are_tokens_whitespace_is_not() {
    let text = "Hello,  world!\n\tIt's 3.14 -- O'er\r\nthe HILL.";
    assert_eq!(
        tokens(Tokenizer::default(), text),
        ["hello", ",", "world", "!", "it's", "3.14", "-", "-", "o'er", "the", "hill", "."]
    );
    assert_eq!(tokens(Tokenizer { lowercase: false }, "Hello, WORLD")[..], ["Hello", ",", "WORLD"]);
    assert_eq!(tokens(Tokenizer::default(), "ÜBER Straße ΣΟΦΙΑ")[..], ["über", "straße", "σοφια"]);
    assert!(tokens(Tokenizer::default(), " \n\t\r\n ").is_empty());
    // `<unk>` in the text is three pieces, never the reserved token.
    assert_eq!(tokens(Tokenizer::default(), "<unk>")[..], ["<", "unk", ">"]);
}

#[test]
fn vocabulary_orders_by_count_then_token_and_caps_with_unk() {
    let counts = [("b", 3u64), ("a", 3), ("c", 5), ("d", 1), ("e", 0)];
    let vocab = Vocab::from_counts(counts, 3).unwrap();
    assert_eq!(vocab.tokens(), [UNK, "c", "a"]);
    assert_eq!((vocab.id("c"), vocab.id("a")), (1, 2));
    assert_eq!((vocab.id("b"), vocab.id("d"), vocab.id("never seen")), (UNK_ID, UNK_ID, UNK_ID));
    assert_eq!(vocab.get("b"), None);

    let all = Vocab::from_counts(counts, 100).unwrap();
    assert_eq!(all.tokens(), [UNK, "c", "a", "b", "d"], "zero counts are dropped");
    assert_eq!(Vocab::from_counts(counts, 2).unwrap().tokens(), [UNK, "c"]);

    for too_small in [0, 1] {
        let err = Vocab::from_counts(counts, too_small).unwrap_err().to_string();
        assert!(err.contains("--max-vocab must be at least 2"), "{err}");
    }
}

#[test]
fn vocabulary_from_a_model_file_must_start_with_unk_and_not_repeat() {
    let ok = Vocab::from_tokens(vec![UNK.into(), "the".into()]).unwrap();
    assert_eq!(ok.id("the"), 1);
    assert!(Vocab::from_tokens(vec!["the".into(), UNK.into()]).is_err());
    assert!(Vocab::from_tokens(vec![]).is_err());
    assert!(Vocab::from_tokens(vec![UNK.into(), "a".into(), "a".into()]).is_err());
}

#[test]
fn corpus_ids_follow_the_vocabulary_and_are_deterministic() {
    let text = "the cat saw the dog . The dog saw the cat . a bird !";
    let first = Corpus::from_text(text, options(4)).unwrap();
    // the ×4, then cat/dog/saw/. ×2 (ties in token order): the cap of 4 keeps <unk>, the, ".", cat.
    assert_eq!(first.vocab.tokens(), [UNK, "the", ".", "cat"]);
    let ids: Vec<&str> = first.tokens.iter().map(|&id| first.vocab.token(id)).collect();
    assert_eq!(ids[..6], ["the", "cat", UNK, "the", UNK, "."]);
    assert_eq!(first.unknown, first.tokens.iter().filter(|&&t| t == UNK_ID).count());
    assert_eq!(first.unknown, 7);
    assert!(!first.truncated);
    // Hash maps iterate in a different order in every instance; the result must not.
    for _ in 0..5 {
        let again = Corpus::from_text(text, options(4)).unwrap();
        assert_eq!((&again.vocab, &again.tokens), (&first.vocab, &first.tokens));
    }

    let cased =
        Corpus::from_text(text, CorpusOptions { tokenizer: Tokenizer { lowercase: false }, ..options(100) }).unwrap();
    assert!(cased.vocab.get("The").is_some() && cased.vocab.get("the").is_some());
    assert_eq!(Corpus::from_text(text, options(100)).unwrap().vocab.get("The"), None);
}

#[test]
fn max_tokens_takes_a_prefix_and_builds_the_vocabulary_from_it() {
    let corpus = Corpus::from_text("a b c d e f", CorpusOptions { max_tokens: Some(3), ..options(100) }).unwrap();
    assert_eq!(corpus.tokens.len(), 3);
    assert!(corpus.truncated);
    assert_eq!(corpus.vocab.tokens(), [UNK, "a", "b", "c"]);
    let exact = Corpus::from_text("a b c", CorpusOptions { max_tokens: Some(3), ..options(100) }).unwrap();
    assert!(!exact.truncated);
}

#[test]
fn empty_and_blank_text_are_errors() {
    assert!(Corpus::from_text("", options(10)).unwrap_err().to_string().contains("empty"));
    assert!(Corpus::from_text(" \n \t", options(10)).unwrap_err().to_string().contains("no tokens"));
}

#[test]
fn corpus_file_must_be_utf8_and_not_empty() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("latin1.txt");
    std::fs::write(&bad, b"caf\xc3\xa9 ok, na\xefve text").unwrap();
    let err = format!("{:#}", Corpus::read(&bad, options(10)).unwrap_err());
    assert!(err.contains("not UTF-8") && err.contains("0xEF at byte offset 12"), "{err}");

    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, b"").unwrap();
    let err = format!("{:#}", Corpus::read(&empty, options(10)).unwrap_err());
    assert!(err.contains("is empty"), "{err}");

    let err = format!("{:#}", Corpus::read(&dir.path().join("missing.txt"), options(10)).unwrap_err());
    assert!(err.contains("cannot open corpus"), "{err}");

    let good = dir.path().join("good.txt");
    std::fs::write(&good, "café ok").unwrap();
    assert_eq!(Corpus::read(&good, options(10)).unwrap().vocab.tokens(), [UNK, "café", "ok"]);
}

#[test]
fn last_tenth_of_the_tokens_validates() {
    let split = Split::new(100, 3).unwrap();
    assert_eq!(split.val_start, 90);
    assert_eq!(split.train, (3..90).collect::<Vec<u32>>());
    assert_eq!(split.val, (90..100).collect::<Vec<u32>>());
    // The held-out part rounds up, and shrinks to leave one training sample.
    assert_eq!(Split::new(101, 3).unwrap().val_start, 90);
    let smallest = Split::new(5, 3).unwrap();
    assert_eq!((smallest.train, smallest.val), (vec![3], vec![4]));
    let long_context = Split::new(22, 20).unwrap();
    assert_eq!((long_context.train, long_context.val), (vec![20], vec![21]));
    let err = Split::new(4, 3).unwrap_err().to_string();
    assert!(err.contains("4 tokens") && err.contains("at least 5"), "{err}");
}

#[test]
fn validation_cap_spreads_over_the_held_out_part() {
    let all: Vec<u32> = (100..200).collect();
    assert_eq!(spread_subset(&all, 0), all);
    assert_eq!(spread_subset(&all, 500), all);
    assert_eq!(spread_subset(&all, 4), [100, 125, 150, 175]);
}

#[test]
fn unigram_baseline_uses_training_counts_with_add_one() {
    // Training tokens (before position 4): id 1 ×3, id 2 ×1; vocabulary of 3 ids.
    let tokens = [1, 1, 2, 1, 2, 0];
    let loss = unigram_loss(&tokens, 4, 3, &[4, 5]);
    let expected = -((2.0f64 / 7.0).ln() + (1.0f64 / 7.0).ln()) / 2.0;
    assert!((loss - expected).abs() < 1e-12, "{loss} vs {expected}");
}
