//! The commands of textnet itself, which take any pipeline's model or loop over `pipelines::ALL`:
//! `bench`, `selftest`, `generate`, `eval`, `classify` and `export`. Each pipeline's own commands live in its folder.

pub mod bench;
pub mod classify;
pub mod eval;
pub mod export;
pub mod generate;
pub mod selftest;
