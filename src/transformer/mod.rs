//! The character-level Transformer (`textnet transformer`): a GPT-style decoder over a corpus's
//! characters, trained with AdamW. The character vocabulary, the corpus split and the training and
//! validation windows `data`, the CPU reference of the model (forward, backward, training) `model`, the
//! model file `modelfile`.

pub mod data;
pub mod model;
pub mod modelfile;
