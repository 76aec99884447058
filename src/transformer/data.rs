//! The transformer's data: a character vocabulary built from the corpus, the corpus as ids split into a
//! training and a validation part, and where the training batches and the validation windows start.
//!
//! Id 0 is the unknown character (shown as U+FFFD); ids 1.. go to the corpus's characters by count
//! descending, ties by code point ascending, the `max_vocab − 1` most frequent kept. A U+FFFD in the
//! corpus itself is counted as the unknown id rather than given an id of its own (two ids would print
//! alike). The first floor(0.9·n) ids train, the rest validate. A window at offset o takes the inputs
//! `ids[o..o+T]` and the targets `ids[o+1..o+T+1]`.

use crate::ops::cpu::SeededRng;
use anyhow::{Result, anyhow, bail};
use rand::{RngExt, SeedableRng};
use std::collections::HashMap;
use std::path::Path;

/// The character of id 0, which every character outside the vocabulary maps to.
pub const UNKNOWN: char = '\u{FFFD}';
/// The id of `UNKNOWN`.
pub const UNKNOWN_ID: u32 = 0;

/// Validation windows at most (see `val_offsets`).
pub const MAX_VAL_WINDOWS: usize = 256;

/// Characters ↔ ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CharVocab {
    chars: Vec<char>,
    ids: HashMap<char, u32>,
}

impl CharVocab {
    /// The vocabulary of `text` capped at `max_vocab` ids, the unknown id included.
    pub fn from_text(text: &str, max_vocab: usize) -> Result<CharVocab> {
        if max_vocab < 2 {
            bail!("--vocab must be at least 2 (the unknown id and one character), got {max_vocab}");
        }
        let mut counts: HashMap<char, u64> = HashMap::new();
        for c in text.chars().filter(|&c| c != UNKNOWN) {
            *counts.entry(c).or_insert(0) += 1;
        }
        let mut ranked: Vec<(char, u64)> = counts.into_iter().collect();
        ranked.sort_unstable_by(|(ca, na), (cb, nb)| nb.cmp(na).then(ca.cmp(cb)));
        ranked.truncate(max_vocab - 1);
        CharVocab::from_chars(std::iter::once(UNKNOWN).chain(ranked.into_iter().map(|(c, _)| c)).collect())
    }

    /// A vocabulary in id order, as a model file stores it: U+FFFD first, no character twice.
    pub fn from_chars(chars: Vec<char>) -> Result<CharVocab> {
        if chars.first() != Some(&UNKNOWN) {
            bail!("the vocabulary must start with the unknown character U+FFFD");
        }
        if chars.len() < 2 {
            bail!("the vocabulary must hold at least one character besides the unknown one");
        }
        let mut ids = HashMap::with_capacity(chars.len());
        for (id, &c) in chars.iter().enumerate() {
            if ids.insert(c, id as u32).is_some() {
                bail!("the vocabulary lists {c:?} twice");
            }
        }
        Ok(CharVocab { chars, ids })
    }

    /// Number of ids, the unknown one included.
    pub fn len(&self) -> usize {
        self.chars.len()
    }

    /// Never true: the unknown id is always there.
    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    /// The id of `c`, `UNKNOWN_ID` when it is not in the vocabulary.
    pub fn id(&self, c: char) -> u32 {
        self.ids.get(&c).copied().unwrap_or(UNKNOWN_ID)
    }

    /// The ids of `text`'s characters and how many of them are unknown.
    pub fn encode(&self, text: &str) -> (Vec<u32>, usize) {
        let ids: Vec<u32> = text.chars().map(|c| self.id(c)).collect();
        let unknown = ids.iter().filter(|&&id| id == UNKNOWN_ID).count();
        (ids, unknown)
    }

    /// The characters of `ids`; an id outside the vocabulary shows as U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter().map(|&id| self.chars.get(id as usize).copied().unwrap_or(UNKNOWN)).collect()
    }

    /// All characters in id order (U+FFFD first), as a model file stores them.
    pub fn chars(&self) -> &[char] {
        &self.chars
    }
}

/// A corpus as ids, split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corpus {
    /// The characters and their ids.
    pub vocab: CharVocab,
    /// The training part, as ids.
    pub train: Vec<u32>,
    /// The held-out validation part, as ids.
    pub val: Vec<u32>,
    /// How many characters became the unknown id (outside the cap, or U+FFFD).
    pub unknown: usize,
}

impl Corpus {
    /// Reads the corpus file at `path` (see `from_bytes`).
    pub fn load(path: &Path, max_vocab: usize, block: usize) -> Result<Corpus> {
        let bytes = crate::io::fsutil::read_input(path, "corpus")?;
        Corpus::from_bytes(&bytes, &format!("corpus {}", crate::io::fsutil::shown(path)), max_vocab, block)
    }

    /// The corpus `bytes` (UTF-8 text; `what` names it in messages, e.g. "corpus data/tiny.txt") with its
    /// own vocabulary of at most `max_vocab` ids; both parts must hold `block` + 1 ids.
    pub fn from_bytes(bytes: &[u8], what: &str, max_vocab: usize, block: usize) -> Result<Corpus> {
        let text = utf8(bytes, what)?;
        if !text.is_empty() && text.chars().all(|c| c == UNKNOWN) {
            bail!(
                "{what} holds only U+FFFD replacement characters, which read as the unknown character: no text to learn"
            );
        }
        let vocab = CharVocab::from_text(text, max_vocab)?;
        Corpus::with_vocab(bytes, what, vocab, block)
    }

    /// The corpus `bytes` in the ids of `vocab` (a saved model's).
    pub fn with_vocab(bytes: &[u8], what: &str, vocab: CharVocab, block: usize) -> Result<Corpus> {
        let (mut train, unknown) = vocab.encode(utf8(bytes, what)?);
        let n = train.len();
        if n > u32::MAX as usize {
            bail!("{what} has more than {} characters", u32::MAX);
        }
        let val = train.split_off(n * 9 / 10);
        if train.len().min(val.len()) < block.saturating_add(1) {
            bail!(
                "{what} has {n} characters: its training part ({}) and validation part ({}) must each hold --block + 1 = \
                 {} characters; give a longer corpus or a smaller --block",
                train.len(),
                val.len(),
                block.saturating_add(1)
            );
        }
        Ok(Corpus { vocab, train, val, unknown })
    }
}

impl Corpus {
    /// The validation loss of the unigram model: each character predicted by its frequency in the
    /// training part (add-one smoothed over the vocabulary), whatever came before. A Transformer no
    /// better than this learned nothing.
    pub fn unigram_loss(&self) -> f64 {
        let mut counts = vec![1.0f64; self.vocab.len()];
        for &id in &self.train {
            counts[id as usize] += 1.0;
        }
        let total: f64 = counts.iter().sum();
        let loss: f64 = self.val.iter().map(|&id| (total / counts[id as usize]).ln()).sum();
        loss / self.val.len().max(1) as f64
    }
}

/// `bytes` as text: not empty, and UTF-8 (else the offset of the first invalid byte).
pub fn utf8<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str> {
    if bytes.is_empty() {
        bail!("{what} is empty");
    }
    std::str::from_utf8(bytes).map_err(|e| {
        let offset = e.valid_up_to();
        anyhow!(
            "{what} is not UTF-8 text: invalid byte 0x{:02X} at byte offset {offset} (convert it to UTF-8 first)",
            bytes[offset]
        )
    })
}

/// `batch` window offsets drawn uniformly in `[0, n − block − 1]`, for a part of `n` ids (n ≥ block + 1).
pub fn train_offsets(rng: &mut SeededRng, n: usize, block: usize, batch: usize) -> Vec<u32> {
    assert!(n > block, "a part of {n} ids has no window of {block} + 1");
    let last = (n - block - 1) as u32;
    (0..batch).map(|_| rng.random_range(0..=last)).collect()
}

/// The validation windows of a part of `n_val` ids: o_i = i·stride, stride = max(block, (n_val − block −
/// 1) / 256), while o_i + block + 1 ≤ n_val and i < 256.
pub fn val_offsets(n_val: usize, block: usize) -> Vec<u32> {
    let stride = block.max(n_val.saturating_sub(block + 1) / MAX_VAL_WINDOWS);
    (0..MAX_VAL_WINDOWS).map(|i| i * stride).take_while(|&o| o + block < n_val).map(|o| o as u32).collect()
}

/// The windows of `--eval-iters N`: N·batch offsets drawn uniformly in the validation part of `n_val` ids
/// (as nanoGPT's `estimate_loss` draws them) from `seed`, the same at every evaluation of a run so that
/// its checkpoints compare on the same windows.
pub fn sampled_val_offsets(n_val: usize, block: usize, windows: usize, seed: u64) -> Vec<u32> {
    // A stream of its own: the training batches draw from `seed` itself.
    let mut rng = SeededRng::seed_from_u64(seed ^ 0x5eed_e7a1_5eed_e7a1);
    train_offsets(&mut rng, n_val, block, windows)
}

/// The inputs `ids[o..o+block]` and the targets `ids[o+1..o+block+1]` of the windows at `offsets`, one
/// window after another.
pub fn windows(ids: &[u32], offsets: &[u32], block: usize) -> (Vec<u32>, Vec<u32>) {
    let mut inputs = Vec::with_capacity(offsets.len() * block);
    let mut targets = Vec::with_capacity(offsets.len() * block);
    for &o in offsets {
        let o = o as usize;
        inputs.extend_from_slice(&ids[o..o + block]);
        targets.extend_from_slice(&ids[o + 1..o + block + 1]);
    }
    (inputs, targets)
}
