//! textnet: small neural networks trained with hand-written fused CUDA kernels (compiled at run time by
//! NVRTC), each pipeline with a plain CPU reference of the same math.

pub mod bench;
pub mod check;
pub mod checkpoint;
pub mod console;
pub mod cpu;
pub mod device;
pub mod fsutil;
mod fused_source;
pub mod interrupt;
pub mod mnist;
pub mod report;
pub mod resources;
pub mod sales;
pub mod selftest;
pub mod tensorfile;
pub mod text;
pub mod timing;
pub mod xor;
