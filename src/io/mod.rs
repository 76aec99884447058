//! Files: writing them safely and reading inputs (`fsutil`), the model files every pipeline writes
//! (`tensorfile`, with their kind read from the metadata alone: `modelkind`), ONNX graphs (`onnx`), and the
//! limits checked before anything large is read or allocated (`resources`).

pub mod fsutil;
pub mod modelkind;
pub mod onnx;
pub mod resources;
pub mod tensorfile;
