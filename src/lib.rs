//! textnet: small neural networks trained with hand-written fused CUDA kernels (compiled at run time by
//! NVRTC), each pipeline with a plain CPU reference of the same math.
//!
//! The `textnet` command is the usual way in (see the README). As a library, each pipeline is a module
//! listed in [`pipelines::ALL`]: [`text`] (the next-token model), [`mnist`] (MLP and CNN), [`xor`],
//! [`sales`] (tabular regression), [`transformer`] (the character-level Transformer), [`fit`] (a network
//! written as layers) and [`matmul`]. A pipeline has its CPU reference in `model`, its GPU trainer in
//! `gpu`, its command in `cli`, its selftest checks in `checks` and its bench in `bench`. Below them stand
//! the shared rooms: [`ops`], the maths (the CPU twins of the shared kernels in `fused/*.cuh`); [`nn`], the
//! engine built on them (tensors with autograd, modules and optimizers, as PyTorch's; and [`nn::stack`],
//! the layer stacks that `fit`, `mnist`'s MLP, `sales` and the Python package train); [`datasets`];
//! [`device`] (the GPU, NVRTC and the launch); [`io`] (files); [`harness`] (the run every training
//! command follows, its report and checks); and [`commands`], textnet's own commands, which loop over
//! the pipelines. [`nn`]'s page shows a backward pass, [`nn::stack`]'s a network built from its layers.
//!
//! Train the text model on the CPU, save it, load it and predict:
//!
//! ```
//! use std::sync::Arc;
//! use textnet::text::corpus::{Corpus, CorpusOptions};
//! use textnet::text::model::{TextParams, TextShape};
//! use textnet::text::modelfile::TextModel;
//! use textnet::text::{CpuTrainer, TextTrainer, predict, tokenizer::Tokenizer};
//!
//! # fn main() -> anyhow::Result<()> {
//! let tokenizer = Tokenizer::default();
//! let text = "to be or not to be, that is the question. to be is to do. to do is to be.";
//! let corpus = Corpus::from_text(text, CorpusOptions { tokenizer, max_vocab: 100, max_tokens: None })?;
//! let shape = TextShape { vocab: corpus.vocab.len(), embed: 8, hidden: 16, context: 2 };
//! let tokens: Arc<[u32]> = corpus.tokens.clone().into();
//! // A sample is the position of its target token; its context is the two tokens before it.
//! let positions: Vec<u32> = (2..tokens.len() as u32).collect();
//! let mut trainer = CpuTrainer::new(TextParams::init(shape, 1), tokens);
//! for _ in 0..50 {
//!     trainer.train(&positions, 1, 0.1)?; // single-sample SGD at lr 0.1
//! }
//! let model = TextModel { params: trainer.params()?, tokenizer, vocab: corpus.vocab };
//! let path = std::env::temp_dir().join("textnet-doc-example.safetensors");
//! model.save(&path)?;
//! let model = TextModel::load(&path)?;
//! let next = predict::predict(&model, "to be", 3, false)?;
//! println!("after \"to be\": {:?}", next.top.iter().map(|c| (&c.token, c.probability)).collect::<Vec<_>>());
//! # std::fs::remove_file(&path)?;
//! # Ok(())
//! # }
//! ```
//!
//! On a GPU, `text::gpu::GpuTrainer::new(gpu, &params, tokens)` (a `device::Gpu` from
//! `device::select`) trains through the same [`text::TextTrainer`] trait with the fused kernels.

#![warn(missing_docs)]

/// textnet's version (Cargo's), as reports, model files and the rendezvous of a run's processes give it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub mod commands;
pub mod datasets;
pub mod device;
pub mod fit;
pub mod harness;
pub mod io;
pub mod matmul;
pub mod mnist;
pub mod nn;
pub mod ops;
pub mod pipeline;
pub mod pipelines;
pub mod sales;
pub mod text;
pub mod transformer;
pub mod xor;
