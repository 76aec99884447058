//! The character-level Transformer (`textnet transformer`): a GPT-style decoder over a corpus's
//! characters, trained with AdamW. The character vocabulary, the corpus split and the training and
//! validation windows `data`; the CPU reference of the model (forward, backward, training) `model`; the
//! GPU trainer over fused/transformer.cu `gpu`; its selftest checks `checks` and `bench`.

pub mod bench;
pub mod checks;
pub mod data;
pub mod gpu;
pub mod model;
