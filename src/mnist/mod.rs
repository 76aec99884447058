//! The MNIST / Fashion-MNIST classifier pipeline.
pub mod cli;
