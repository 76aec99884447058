//! Word-level tokenizer: Unicode word boundaries (UAX #29, `split_word_bounds`), whitespace-only pieces
//! dropped, so words, numbers and each punctuation mark are tokens. Lowercased unless the model was
//! trained with `--keep-case`; the setting travels in the model file so `predict` splits text the same way.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use unicode_segmentation::UnicodeSegmentation;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// How text is split into tokens.
pub struct Tokenizer {
    /// Whether text is lowercased first.
    pub lowercase: bool,
}

impl Default for Tokenizer {
    fn default() -> Self {
        Tokenizer { lowercase: true }
    }
}

/// The unicode-segmentation release whose word boundaries the tokenizer uses (its Unicode version fixes
/// where boundaries fall; `tests/it/text_modelfile.rs` checks this against Cargo.lock).
pub const SEGMENTATION_VERSION: &str = "1.13.3";

impl Tokenizer {
    /// How a model file names the tokenizer, so a reimplementation needs nothing else: the algorithm, the
    /// library release, what is dropped and the case rule.
    pub fn description(&self) -> String {
        format!(
            "UAX #29 word boundaries (unicode-segmentation {SEGMENTATION_VERSION}, split_word_bounds); pieces that are \
             all whitespace dropped; {}",
            if self.lowercase { "lowercased with str::to_lowercase" } else { "case kept" }
        )
    }

    /// The tokens of `text`, in order. Tokens borrow from `text` unless lowercasing changed them.
    pub fn tokens<'a>(&self, text: &'a str) -> impl Iterator<Item = Cow<'a, str>> {
        let lowercase = self.lowercase;
        text.split_word_bounds().filter(|piece| !piece.chars().all(char::is_whitespace)).map(move |piece| {
            if lowercase && changes_when_lowercased(piece) {
                Cow::Owned(piece.to_lowercase())
            } else {
                Cow::Borrowed(piece)
            }
        })
    }
}

/// Whether `str::to_lowercase` would change `s` (uppercase and titlecase letters alike), so unchanged
/// pieces stay borrowed.
fn changes_when_lowercased(s: &str) -> bool {
    s.chars().any(|c| {
        let mut lower = c.to_lowercase();
        lower.next() != Some(c) || lower.next().is_some()
    })
}
