//! Sampling from a Transformer model file for `textnet generate`: the prompt's characters (those outside
//! the vocabulary read as the unknown id), then one character at a time from the logits after the last
//! `block` characters, on the CPU. Without a prompt, the context is a newline, as nanoGPT's sample.py
//! starts.

use super::data::UNKNOWN_ID;
use super::model;
use super::modelfile::TransformerModel;
use crate::ops::sampling::{Generator, Prompt};
use anyhow::Result;

/// The context of an unconditional sample (not printed).
pub const START: &str = "\n";

/// A Transformer ready to sample from.
pub struct TransformerGenerator {
    model: TransformerModel,
}

impl Generator for TransformerGenerator {
    fn logits(&mut self, ids: &[u32]) -> Vec<f32> {
        model::next_logits(&self.model.config, &self.model.params, ids)
    }

    fn unknown_id(&self) -> u32 {
        UNKNOWN_ID
    }

    fn unit(&self) -> &'static str {
        "character"
    }

    fn piece(&self, id: u32, _before: &str) -> String {
        self.model.vocab.decode(&[id])
    }

    /// The prompt's characters, shown as given.
    fn read_prompt(&self, text: &str) -> Result<Prompt> {
        Ok(if text.is_empty() {
            // A vocabulary without a newline reads it as the unknown id, which is then the start.
            Prompt { ids: self.model.vocab.encode(START).0, shown: String::new(), unknown: 0 }
        } else {
            let (ids, unknown) = self.model.vocab.encode(text);
            Prompt { ids, shown: text.to_string(), unknown }
        })
    }
}

/// `generate`'s hook: a Transformer file's bytes.
pub fn open(bytes: &[u8]) -> Result<Box<dyn Generator>> {
    Ok(Box::new(TransformerGenerator { model: TransformerModel::from_bytes(bytes)? }))
}
