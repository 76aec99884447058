//! `nn`: tensors with reverse-mode autograd, the ops a model is written with, modules and optimizers —
//! the engine meant to sit below every pipeline (so far the host side, in f32 or f64).
//!
//! A [`Tensor`] holds its elements in a [`Storage`] (host memory now) with a row-major shape. An op on
//! tensors that require gradients records itself; [`Tensor::backward`] then walks the record back and
//! accumulates each parameter's gradient in [`Tensor::grad`]. [`no_grad`] turns recording off.
//!
//! | file | what |
//! |---|---|
//! | `tensor` | the tensor, its storage, leaves and parameters, `no_grad`, `detach` |
//! | `autograd` | `backward`: the topological walk, gradient accumulation, freeing the graph |
//! | `elementwise` | `add`, `sub`, `mul`, `div` broadcast, scalar forms; `relu`, `gelu`, `tanh`, `sigmoid`, `exp`, `log`, `neg` |
//! | `reduce` | `sum`, `mean` over an axis or all; `softmax`, `log_softmax` |
//! | `matmul` | `matmul` (batched), `linear` |
//! | `losses` | `cross_entropy` (fused, with an index to ignore), `mse` |
//! | `layout` | `reshape`/`view`, `transpose` |
//! | `layout` | `permute`, `narrow`/`slice`, `cat` |
//! | `conv` | `conv2d`, `max_pool2d` (the math: `ops::conv`) |
//! | `modules`, `optim` | `Module` and its layers (one file each under `modules/`); `Sgd` |
//!
//! The math of each op is the CPU twin's in `ops` (activations, losses, the optimizer's update, dense
//! layers, convolution and pooling) or `cpu::gemm`; every sum runs in a fixed order, so a run repeats to the bit.
//!
//! ```
//! use textnet::nn::{Tensor, linear};
//! # fn main() -> textnet::nn::Result<()> {
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let w = Tensor::parameter(vec![0.5, -1.0, 0.25, 2.0], &[2, 2])?;
//! let loss = linear(&x, &w, None)?.relu().sum_all();
//! loss.backward()?;
//! assert_eq!(w.grad().unwrap().to_vec(), [0.0, 0.0, 4.0, 6.0]);
//! # Ok(())
//! # }
//! ```

mod autograd;
mod conv;
mod elementwise;
mod error;
mod layout;
mod losses;
mod matmul;
pub mod modules;
pub mod optim;
mod reduce;
mod shape;
mod tensor;

pub use conv::{conv2d, max_pool2d};
pub use error::{Error, Result};
pub use layout::cat;
pub use matmul::linear;
pub use modules::{Conv2d, MaxPool2d};
pub use modules::{Linear, Module};
pub use optim::Sgd;
pub use tensor::{NoGradGuard, Storage, Tensor, is_grad_enabled, no_grad};
