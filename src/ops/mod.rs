//! The shared operations below every pipeline: the CPU twin of each shared kernel header in `fused/`, and
//! the sizes those kernels need from the launch code (`THREADS_PER_BLOCK` among them). The maths alone:
//! neither the command line (its flags are `harness::args`) nor the device (`device::launch` turns an
//! `OptimConfig` into kernel arguments). A pipeline's CPU reference is built from these, as
//! its kernels are built from the headers, so the two stay the same math.
//!
//! | module | twin of | what |
//! |---|---|---|
//! | [`activations`] | `activations.cuh` | ReLU, sigmoid, tanh with their derivatives; GELU |
//! | [`losses`] | `losses.cuh` | softmax cross-entropy, squared error |
//! | [`layernorm`] | `layernorm.cuh` | LayerNorm forward and backward (`_eps`: another ε) |
//! | [`attention`] | `attention.cuh` | multi-head self-attention forward and backward, causal (or not) |
//! | [`dropout`] | `dropout.cuh` | dropout's mask as a hash of (seed, step, site, element) |
//! | [`optim`] | `optim.cuh` | SGD, momentum, Adam, AdamW, weight decay, clipping |
//! | [`gemm`] | `gemm.cuh` | the tiles' shared-memory sizes (the products themselves: [`cpu::gemm`]) |
//! | [`mlp`] | (no kernel) | a two-layer perceptron's parameters as views of one flat vector (MNIST MLP, sales) |
//! | [`conv`] | the conv and pool kernels of `fit.cu`, `mnist_cnn.cu` | 2-D convolution, max pool; their backward |
//! | [`dense`] | the dense kernels of `fit.cu`, `transformer.cu` | y = x·wᵀ + b and its backward (`cpu::gemm`) |
//! | [`cpu`] | (no kernel) | what the references share: products through `matrixmultiply`, `nn.Linear`'s initialisation, the seeded generator |
//! | [`sampling`] | (no kernel) | drawing a token (temperature, top-k, top-p) and a continuation, for `generate` |

pub mod activations;
pub mod attention;
pub mod conv;
pub mod cpu;
pub mod dense;
pub mod dropout;
pub mod gemm;
pub mod layernorm;
pub mod losses;
pub mod mlp;
pub mod optim;
pub mod sampling;

use num_traits::Float;

/// Threads per block of every fused kernel (THREADS in fused/common.cuh).
pub const THREADS_PER_BLOCK: u32 = 256;

/// `v` in the float type `F`.
pub fn constant<F: Float>(v: f64) -> F {
    F::from(v).expect("a float constant")
}
