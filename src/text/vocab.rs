//! The vocabulary: token strings ↔ ids. Id 0 is `<unk>`; the other ids go to the most frequent tokens,
//! by count descending then token ascending (byte order), so the same corpus always gives the same ids.
//! Tokens beyond the cap map to `<unk>`.

use anyhow::{Result, bail};
use std::collections::HashMap;

/// The string of id 0, which every token outside the vocabulary maps to. The tokenizer never produces
/// it (`<`, `unk` and `>` are separate word-boundary pieces).
pub const UNK: &str = "<unk>";
/// The id of `UNK`.
pub const UNK_ID: u32 = 0;

#[derive(Clone, Debug, PartialEq, Eq)]
/// The vocabulary: each token's id and each id's token.
pub struct Vocab {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
}

impl Vocab {
    /// Keeps the `max_vocab − 1` most frequent tokens (the cap counts `<unk>`). Zero counts are dropped;
    /// a token spelled `<unk>` is folded into id 0.
    pub fn from_counts<S: AsRef<str>>(counts: impl IntoIterator<Item = (S, u64)>, max_vocab: usize) -> Result<Vocab> {
        if max_vocab < 2 {
            bail!("--max-vocab must be at least 2 (<unk> and one token), got {max_vocab}");
        }
        let mut ranked: Vec<(S, u64)> =
            counts.into_iter().filter(|(token, count)| *count > 0 && token.as_ref() != UNK).collect();
        ranked.sort_unstable_by(|(ta, ca), (tb, cb)| cb.cmp(ca).then_with(|| ta.as_ref().cmp(tb.as_ref())));
        ranked.truncate(max_vocab - 1);
        let tokens = std::iter::once(UNK.to_string()).chain(ranked.iter().map(|(t, _)| t.as_ref().to_string()));
        Vocab::from_tokens(tokens.collect())
    }

    /// A vocabulary in id order, as stored in a model file: `<unk>` first, no duplicates.
    pub fn from_tokens(tokens: Vec<String>) -> Result<Vocab> {
        if tokens.first().map(String::as_str) != Some(UNK) {
            bail!("the vocabulary must start with {UNK}");
        }
        if tokens.len() > u32::MAX as usize {
            bail!("vocabulary of {} entries is too large", tokens.len());
        }
        let mut ids = HashMap::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate() {
            if ids.insert(token.clone(), id as u32).is_some() {
                bail!("the vocabulary lists {token:?} twice");
            }
        }
        Ok(Vocab { tokens, ids })
    }

    /// Number of tokens, `<unk>` included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Never true: `<unk>` is always there.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The id of `token`, if it is in the vocabulary.
    pub fn get(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    /// The id of `token`, `<unk>` when it is not in the vocabulary.
    pub fn id(&self, token: &str) -> u32 {
        self.get(token).unwrap_or(UNK_ID)
    }

    /// The token string of `id`. Panics when `id` is out of range.
    pub fn token(&self, id: u32) -> &str {
        &self.tokens[id as usize]
    }

    /// All token strings in id order.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }
}
