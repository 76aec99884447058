//! The training corpus: a UTF-8 text file, read into memory and tokenized in one pass into a stream of
//! vocabulary ids, and the split of that stream into training and validation samples.
//!
//! Input that is not UTF-8 is rejected with the byte offset of the first invalid byte rather than
//! decoded lossily: a wrong encoding would silently train a model on replacement characters.

use super::tokenizer::Tokenizer;
use super::vocab::Vocab;
use anyhow::{Context, Result, bail};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// How a corpus is turned into ids.
#[derive(Clone, Copy, Debug)]
pub struct CorpusOptions {
    /// How text is split into tokens.
    pub tokenizer: Tokenizer,
    /// Vocabulary cap, `<unk>` included.
    pub max_vocab: usize,
    /// Use only the first this many tokens (the vocabulary is built from those alone).
    pub max_tokens: Option<usize>,
}

/// A tokenized corpus.
#[derive(Clone, Debug)]
pub struct Corpus {
    /// Built from the tokens used (training and validation part alike).
    pub vocab: Vocab,
    /// The token stream as vocabulary ids.
    pub tokens: Vec<u32>,
    /// How many tokens fell outside the vocabulary cap and became `<unk>`.
    pub unknown: usize,
    /// Whether `max_tokens` cut the corpus short.
    pub truncated: bool,
}

impl Corpus {
    /// Reads and tokenizes the corpus file at `path`; `-` reads standard input to its end.
    pub fn read(path: &Path, options: CorpusOptions) -> Result<Corpus> {
        let mut bytes = crate::io::fsutil::read_input(path, "corpus")?;
        // A byte-order mark is no text: left in, it would become a token of its own.
        if bytes.starts_with(UTF8_BOM) {
            bytes.drain(..UTF8_BOM.len());
        }
        if bytes.is_empty() {
            bail!("corpus {} is empty", crate::io::fsutil::shown(path));
        }
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            let offset = e.valid_up_to();
            anyhow::anyhow!(
                "corpus {} is not UTF-8 text: invalid byte 0x{:02X} at byte offset {offset} (convert it to UTF-8 first)",
                crate::io::fsutil::shown(path),
                bytes[offset]
            )
        })?;
        Corpus::from_text(text, options).with_context(|| format!("corpus {}", crate::io::fsutil::shown(path)))
    }

    /// The corpus in the ids of `vocab` (a saved model's), tokens outside it becoming `<unk>`.
    pub fn in_vocabulary(self, vocab: &Vocab) -> Corpus {
        let ids: Vec<u32> = self.vocab.tokens().iter().map(|t| vocab.id(t)).collect();
        let mut tokens = self.tokens;
        tokens.iter_mut().for_each(|t| *t = ids[*t as usize]);
        let unknown = tokens.iter().filter(|&&t| t == super::vocab::UNK_ID).count();
        Corpus { vocab: vocab.clone(), tokens, unknown, truncated: self.truncated }
    }

    /// Tokenizes `text`: one pass interns each distinct token under a provisional id and records the
    /// stream; the vocabulary is then built from the counts and the stream renumbered.
    pub fn from_text(text: &str, options: CorpusOptions) -> Result<Corpus> {
        if text.is_empty() {
            bail!("the text is empty");
        }
        let limit = options.max_tokens.unwrap_or(usize::MAX);
        let mut interned: HashMap<Cow<str>, u32> = HashMap::new();
        let mut counts: Vec<u64> = Vec::new();
        let mut stream: Vec<u32> = Vec::new();
        let mut pieces = options.tokenizer.tokens(text);
        for token in pieces.by_ref().take(limit) {
            if stream.len() == u32::MAX as usize {
                bail!("the corpus has more than {} tokens; use --max-tokens to take a part of it", u32::MAX);
            }
            let next_id = counts.len() as u32;
            let id = *interned.entry(token).or_insert(next_id);
            if id == next_id {
                counts.push(0);
            }
            counts[id as usize] += 1;
            stream.push(id);
        }
        if stream.is_empty() {
            bail!("the text has no tokens (only whitespace)");
        }
        let truncated = stream.len() == limit && pieces.next().is_some();

        let vocab =
            Vocab::from_counts(interned.iter().map(|(t, &id)| (t.as_ref(), counts[id as usize])), options.max_vocab)?;
        let mut renumber = vec![0u32; counts.len()];
        for (token, &id) in &interned {
            renumber[id as usize] = vocab.id(token);
        }
        let mut tokens = stream;
        tokens.iter_mut().for_each(|id| *id = renumber[*id as usize]);
        let unknown = tokens.iter().filter(|&&id| id == super::vocab::UNK_ID).count();
        Ok(Corpus { vocab, tokens, unknown, truncated })
    }
}

/// Which samples train and which validate, by the position of their target token. The last 10% of the
/// tokens (rounded up) are held out: samples whose target falls there validate, the rest train. A sample
/// needs `context` tokens before its target, so targets start at position `context`; if the held-out
/// part would leave no training sample it shrinks to keep one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// Target positions of the training samples.
    pub train: Vec<u32>,
    /// Target positions of the validation samples.
    pub val: Vec<u32>,
    /// First held-out token position: `train` targets lie before it, `val` targets from it on.
    pub val_start: usize,
}

impl Split {
    /// The split of a corpus of `n_tokens` tokens for a model of `context` context tokens.
    pub fn new(n_tokens: usize, context: usize) -> Result<Split> {
        if n_tokens > u32::MAX as usize {
            bail!("the corpus has more than {} tokens; use --max-tokens to take a part of it", u32::MAX);
        }
        if n_tokens < context.saturating_add(2) {
            bail!(
                "the corpus has {n_tokens} tokens but --context {context} needs at least {} (context + 2: one \
                 training and one validation sample)",
                context.saturating_add(2)
            );
        }
        let val_start = (n_tokens - n_tokens.div_ceil(10)).max(context + 1);
        Ok(Split {
            train: (context as u32..val_start as u32).collect(),
            val: (val_start as u32..n_tokens as u32).collect(),
            val_start,
        })
    }
}
