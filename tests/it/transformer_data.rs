//! The transformer's data rules: the character vocabulary's order, cap and unknown id, the 90/10 split,
//! the one-line errors, and where training batches and validation windows start.

use rand::SeedableRng;
use textnet::ops::cpu::SeededRng;
use textnet::transformer::data::{CharVocab, Corpus, UNKNOWN, train_offsets, val_offsets, windows};

#[test]
fn ids_go_by_count_then_code_point() {
    // a ×5, b ×2, r ×2, c ×1, d ×1
    let vocab = CharVocab::from_text("abracadabra", 256).unwrap();
    assert_eq!(vocab.chars(), [UNKNOWN, 'a', 'b', 'r', 'c', 'd']);
    assert_eq!(vocab.len(), 6);
    let (ids, unknown) = vocab.encode("abracadabra");
    assert_eq!(ids, [1, 2, 3, 1, 4, 1, 5, 1, 2, 3, 1]);
    assert_eq!(unknown, 0);
    assert_eq!(vocab.decode(&ids), "abracadabra");
    // Characters of several bytes count as one; ties by code point: 'z' (U+7A) before 'é' (U+E9).
    let vocab = CharVocab::from_text("éz\u{1F600}éz", 256).unwrap();
    assert_eq!(vocab.chars(), [UNKNOWN, 'z', 'é', '\u{1F600}']);
}

#[test]
fn the_cap_counts_the_unknown_id_and_the_rest_map_to_it() {
    let vocab = CharVocab::from_text("abracadabra", 3).unwrap();
    assert_eq!(vocab.chars(), [UNKNOWN, 'a', 'b']);
    let (ids, unknown) = vocab.encode("abracadabra!");
    assert_eq!(ids, [1, 2, 0, 1, 0, 1, 0, 1, 2, 0, 1, 0]);
    assert_eq!(unknown, 5);
    assert_eq!(vocab.decode(&ids[..4]), "ab\u{FFFD}a");
    assert_eq!(vocab.decode(&[7]), "\u{FFFD}");
    // A U+FFFD in the text is the unknown id, not a character of its own.
    let vocab = CharVocab::from_text("a\u{FFFD}\u{FFFD}\u{FFFD}", 256).unwrap();
    assert_eq!(vocab.chars(), [UNKNOWN, 'a']);
    assert_eq!(vocab.encode("\u{FFFD}a"), (vec![0, 1], 1));
    let err = CharVocab::from_text("abc", 1).unwrap_err().to_string();
    assert!(err.contains("--vocab must be at least 2"), "{err}");
}

#[test]
fn a_saved_vocabulary_reads_back_and_a_bad_one_is_refused() {
    let vocab = CharVocab::from_text("hello, world", 256).unwrap();
    assert_eq!(CharVocab::from_chars(vocab.chars().to_vec()).unwrap(), vocab);
    assert!(CharVocab::from_chars(vec!['a', UNKNOWN]).is_err());
    assert!(CharVocab::from_chars(vec![UNKNOWN]).is_err());
    let err = CharVocab::from_chars(vec![UNKNOWN, 'a', 'a']).unwrap_err().to_string();
    assert!(err.contains("twice"), "{err}");
}

#[test]
fn the_first_ninety_percent_train() {
    let text: String = (0..100).map(|i| (b'a' + (i % 7) as u8) as char).collect();
    let corpus = Corpus::from_bytes(text.as_bytes(), "corpus t", 256, 8).unwrap();
    assert_eq!((corpus.train.len(), corpus.val.len()), (90, 10));
    let (all, _) = corpus.vocab.encode(&text);
    assert_eq!([corpus.train.as_slice(), corpus.val.as_slice()].concat(), all);
    // floor(0.9 · 25) = 22; the vocabulary comes from the whole text, validation part included.
    let text = "aaaaaaaaaaaaaaaaaaaaaaxyz";
    let corpus = Corpus::from_bytes(text.as_bytes(), "corpus t", 256, 2).unwrap();
    assert_eq!((corpus.train.len(), corpus.val.len()), (22, 3));
    assert_eq!(corpus.vocab.chars(), [UNKNOWN, 'a', 'x', 'y', 'z']);
    assert_eq!(corpus.val, [2, 3, 4]);
    let capped = Corpus::from_bytes(text.as_bytes(), "corpus t", 3, 2).unwrap();
    assert_eq!((capped.val.clone(), capped.unknown), (vec![2, 0, 0], 2));
    // Another model's vocabulary.
    let other = Corpus::with_vocab(b"zzza", "corpus u", corpus.vocab.clone(), 0).unwrap();
    assert_eq!((other.train, other.val, other.unknown), (vec![4, 4, 4], vec![1], 0));
}

/// Every error is one line and names its cause.
fn error(bytes: &[u8], block: usize) -> String {
    let err = format!("{:#}", Corpus::from_bytes(bytes, "corpus data/x.txt", 256, block).unwrap_err());
    assert!(!err.contains('\n'), "{err}");
    err
}

#[test]
fn bad_corpora_get_one_line_errors() {
    let err = error(b"abc\xffdef", 1);
    assert!(err.contains("corpus data/x.txt is not UTF-8") && err.contains("0xFF at byte offset 3"), "{err}");
    let mut bytes = "é".repeat(10).into_bytes();
    bytes.push(0xC3); // a character cut short
    assert!(error(&bytes, 1).contains("byte offset 20"));
    assert_eq!(error(b"", 1), "corpus data/x.txt is empty");
    // 25 characters: 22 train, 3 validate; block 3 needs 4 in each part.
    let err = error(&[b'a'; 25], 3);
    assert!(err.contains("validation part (3)") && err.ends_with("give a longer corpus or a smaller --block"), "{err}");
    assert!(Corpus::from_bytes(&[b'a'; 25], "c", 256, 2).is_ok());
}

#[test]
fn load_reads_a_file_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.txt");
    std::fs::write(&path, "hello transformer, hello world").unwrap();
    let corpus = Corpus::load(&path, 256, 2).unwrap();
    assert_eq!(corpus.train.len() + corpus.val.len(), 30);
    std::fs::write(&path, b"\xfe").unwrap();
    let err = format!("{:#}", Corpus::load(&path, 256, 2).unwrap_err());
    assert!(err.starts_with(&format!("corpus {} is not UTF-8", path.display())), "{err}");
    let err = format!("{:#}", Corpus::load(&dir.path().join("missing.txt"), 256, 2).unwrap_err());
    assert!(err.contains("cannot open corpus"), "{err}");
}

#[test]
fn training_offsets_cover_their_whole_range() {
    let mut rng = SeededRng::seed_from_u64(1);
    let offsets = train_offsets(&mut rng, 20, 5, 2000);
    assert_eq!(offsets.len(), 2000);
    // n − block − 1 = 14: the last window's targets end at the last id.
    assert_eq!((offsets.iter().min(), offsets.iter().max()), (Some(&0), Some(&14)));
    assert_eq!(train_offsets(&mut SeededRng::seed_from_u64(1), 20, 5, 2000), offsets);
    assert_eq!(train_offsets(&mut rng, 6, 5, 3), [0, 0, 0]);
}

#[test]
fn validation_windows_follow_the_spec() {
    // stride max(T, (n − T − 1) / 256), o + T + 1 ≤ n, at most 256.
    assert_eq!(val_offsets(100, 10), (0..9).map(|i| i * 10).collect::<Vec<u32>>());
    assert_eq!(val_offsets(11, 10), [0]);
    assert!(val_offsets(10, 10).is_empty());
    assert_eq!(val_offsets(1000, 64), (0..15).map(|i| i * 64).collect::<Vec<u32>>());
    let many = val_offsets(100_000, 64);
    assert_eq!((many.len(), many[1], many[255]), (256, 390, 255 * 390));
    // 256 windows exactly when the last one's targets end at the last id; one id fewer, 255.
    let n = 255 * 64 + 65;
    assert_eq!((val_offsets(n, 64).len(), val_offsets(n, 64)[255] as usize + 64 + 1), (256, n));
    assert_eq!(val_offsets(n - 1, 64).len(), 255);
}

#[test]
fn windows_pair_inputs_with_the_next_ids() {
    let ids: Vec<u32> = (10..20).collect();
    let (inputs, targets) = windows(&ids, &[0, 6], 3);
    assert_eq!(inputs, [10, 11, 12, 16, 17, 18]);
    assert_eq!(targets, [11, 12, 13, 17, 18, 19]);
}
