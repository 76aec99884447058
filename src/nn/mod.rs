//! `nn`: tensors with reverse-mode autograd, the ops a model is written with, modules and optimizers —
//! the engine meant to sit below every pipeline. Tensors live on the host (f32 or f64) or on a GPU (f32,
//! `Tensor::to_device`), where each op launches its kernel of `fused/nn.cu`.
//!
//! A [`Tensor`] holds its elements in a [`Storage`] (host or device memory) with a row-major shape. An op on
//! tensors that require gradients records itself; [`Tensor::backward`] then walks the record back and
//! accumulates each parameter's gradient in [`Tensor::grad`]. [`no_grad`] turns recording off.
//!
//! | file | what |
//! |---|---|
//! | `tensor` | the tensor, its storage (host or device), leaves and parameters, `no_grad`, `detach` |
//! | `cuda` | the device: `Device`, `DeviceBuffer`, placement, each op's kernels (`fused/nn.cu`) |
//! | `autograd` | `backward`: the topological walk, gradient accumulation, freeing the graph |
//! | `elementwise` | `add`, `sub`, `mul`, `div` broadcast, scalar forms; `relu`, `gelu`, `tanh`, `sigmoid`, `exp`, `log`, `neg` |
//! | `reduce` | `sum`, `mean` over an axis or all; `softmax`, `log_softmax` |
//! | `matmul` | `matmul` (batched), `linear` |
//! | `losses` | `cross_entropy` (fused, with an index to ignore), `mse` |
//! | `norm` | `layer_norm` over the last axis |
//! | `embedding` | `embedding`: rows of a table by id; `index_rows` (`x[ids]`), the same along a tensor's first axis |
//! | `dropout` | `dropout`, its mask the kernels' hash |
//! | `attention` | `scaled_dot_product_attention`, causal or not; `causal_self_attention` on packed q, k, v |
//! | `layout` | `reshape`/`view`, `transpose`, `permute`, `narrow`/`slice`, `cat` |
//! | `conv` | `conv2d`, `max_pool2d` (the math: `ops::conv`) |
//! | `modules` | `Module` and its layers (one file each under `modules/`); `Sequential`, `ModuleList` |
//! | `optim` | `Optimizer` (SGD, momentum, Adam, AdamW) over parameter groups, `Scheduler`, `clip_grad_norm` |
//! | `state` | `state_dict`, saved to and loaded from safetensors |
//! | `stack` | layer stacks: a network fixed by a list of layers, trained by per-spec fused kernels (below) |
//!
//! Two engines live here, side by side, on the same CPU twins of `ops`. The tensors above are general: any
//! program of ops, differentiated from its record, captured into a CUDA graph when asked. `stack` is the
//! fast path for the common case, a plain stack of layers (`Linear(784, 128), ReLU, Linear(128, 10)`):
//! its forward, backward and update are written per layer kind in `fused/fit.cu` and compiled per spec,
//! so a small model trains at a few launches a step, or one an epoch. `textnet fit`, `mnist`'s MLP,
//! `sales` and the Python package's `Sequential` train on `stack`; neither engine imports the other.
//!
//! The math of each op is the CPU twin's in `ops` (activations, losses, layernorm, dropout, attention, the
//! optimizer's update, dense layers, convolution and pooling) or `cpu::gemm`; every sum runs in a fixed order, so a run repeats to the bit.
//!
//! ```
//! use textnet::nn::{Tensor, linear};
//! # fn main() -> textnet::nn::Result<()> {
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//! let w = Tensor::parameter(vec![0.5, -1.0, 0.25, 2.0], &[2, 2])?;
//! let loss = linear(&x, &w, None)?.relu()?.sum_all()?;
//! loss.backward()?;
//! assert_eq!(w.grad().unwrap().to_vec(), [0.0, 0.0, 4.0, 6.0]);
//! # Ok(())
//! # }
//! ```

mod attention;
mod autograd;
pub mod bench;
pub mod checks;
mod conv;
pub mod cuda;
mod dropout;
mod elementwise;
mod embedding;
mod error;
mod layout;
mod losses;
mod matmul;
pub mod modules;
mod norm;
pub mod optim;
mod reduce;
mod shape;
pub mod stack;
mod state;
mod tensor;

pub use attention::{causal_self_attention, scaled_dot_product_attention};
pub use conv::{conv2d, max_pool2d};
pub use cuda::capture::CapturedStep;
pub use cuda::{Device, DeviceBuffer};
pub use dropout::dropout;
pub use embedding::{embedding, index_rows, index_rows_tensor};
pub use error::{Error, Result};
pub use layout::cat;
pub use matmul::linear;
pub use modules::{Conv2d, MaxPool2d};
pub use modules::{Dropout, Embedding, LayerNorm};
pub use modules::{Linear, Module};
pub use modules::{ModuleList, Sequential, prefixed};
pub use norm::layer_norm;
pub use optim::{Optimizer, ParamGroup, Scheduler, clip_grad_norm, decay_groups};
pub use state::{StateDict, load_state_dict, load_state_dict_file, read_state_dict, save_state_dict, state_dict};
pub use tensor::{NoGradGuard, Storage, Tensor, is_grad_enabled, no_grad};
