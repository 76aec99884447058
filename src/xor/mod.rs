//! The XOR pipeline (roadmap phase 3b): Linear(2, H) → activation → Linear(H, 1), mean squared error,
//! full-batch SGD on the four XOR points. CPU reference `model`, GPU trainer `gpu` (fused/xor.cu: the whole
//! run in one launch), selftest checks `checks`, the model file `modelfile`, the `textnet xor` command `cli`.

pub mod bench;
pub mod checks;
pub mod cli;
pub mod gpu;
pub mod model;
pub mod modelfile;
