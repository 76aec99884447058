//! The character-level Transformer (`textnet transformer`): a GPT-style decoder over a corpus's
//! characters, trained with AdamW. The character vocabulary, the corpus split and the training and
//! validation windows `data`; the CPU reference of the model (forward, backward, training) `model`; the
//! GPU trainer over fused/transformer.cu `gpu`; the model file `modelfile`; the command `cli`; sampling
//! for `textnet generate` `generate`; selftest checks `checks` and `bench`.

pub mod bench;
pub mod checks;
pub mod cli;
pub mod data;
pub mod generate;
pub mod gpu;
pub mod model;
pub mod modelfile;
