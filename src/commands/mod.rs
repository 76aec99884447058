//! The commands of textnet itself, which take any pipeline's model or loop over `pipelines::ALL`:
//! `bench`, `selftest`, `generate`, `eval`, `classify` (with `classifier`, how it sees an image model) and
//! `export`. Each pipeline's own commands live in its folder.

pub mod bench;
pub mod classifier;
pub mod classify;
pub mod eval;
pub mod export;
pub mod generate;
pub mod selftest;
