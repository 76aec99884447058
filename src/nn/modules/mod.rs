//! Building blocks with parameters, as `torch.nn`'s: a [`Module`] maps a tensor to a tensor and names its
//! parameters as PyTorch does (`weight`, `bias`; `0.weight` inside a container), so that a `state_dict`
//! saved here loads into the same PyTorch model and back.
//!
//! | file | modules |
//! |---|---|
//! | `linear` | `Linear` |
//! | `embedding` | `Embedding` |
//! | `layer_norm` | `LayerNorm` |
//! | `dropout` | `Dropout` |
//! | `conv2d` | `Conv2d` |
//! | `max_pool2d` | `MaxPool2d` |
//! | `container` | `Sequential`, `ModuleList` |

mod container;
mod conv2d;
mod dropout;
mod embedding;
mod layer_norm;
mod linear;
mod max_pool2d;

pub use container::{ModuleList, Sequential};
pub use conv2d::Conv2d;
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use layer_norm::LayerNorm;
pub use linear::Linear;
pub use max_pool2d::MaxPool2d;

use super::tensor::Tensor;
use crate::ops::cpu::{Real, SeededRng, linear_init};

/// `count` values drawn from `rng` as PyTorch initialises a layer of fan-in `fan_in` (`nn.Linear`'s and
/// `nn.Conv2d`'s weight and bias): U(−1/√fan_in, 1/√fan_in), drawn in f32 (`cpu::linear_init`).
fn uniform_init<F: Real>(count: usize, fan_in: usize, rng: &mut SeededRng) -> Vec<F> {
    let mut values = vec![0f32; count];
    linear_init(&mut values, fan_in, rng);
    values.into_iter().map(|v| F::from(v).unwrap_or_else(F::nan)).collect()
}

/// Marks a layer's weight and its bias, if any, as requiring gradients.
fn require_grads<F: Real>(weight: &Tensor<F>, bias: Option<&Tensor<F>>) -> crate::nn::Result<()> {
    std::iter::once(weight).chain(bias).try_for_each(|parameter| parameter.set_requires_grad(true))
}

/// `weight` then `bias`, if any, under those names.
fn weight_and_bias<F: Real>(weight: &Tensor<F>, bias: Option<&Tensor<F>>) -> Vec<(String, Tensor<F>)> {
    let weight = ("weight".to_string(), weight.clone());
    std::iter::once(weight).chain(bias.map(|b| ("bias".to_string(), b.clone()))).collect()
}

/// A layer or a model: a forward map and the parameters it trains.
pub trait Module<F: Real = f32> {
    /// The output for input `x`.
    fn forward(&self, x: &Tensor<F>) -> crate::nn::Result<Tensor<F>>;

    /// The parameters under PyTorch's names (`weight`, `bias`; a container prefixes its children's with
    /// their names, `0.weight`), in a fixed order.
    fn named_parameters(&self) -> Vec<(String, Tensor<F>)>;

    /// The parameters, in `named_parameters`' order (for an optimizer).
    fn parameters(&self) -> Vec<Tensor<F>> {
        self.named_parameters().into_iter().map(|(_, p)| p).collect()
    }

    /// Forgets every parameter's accumulated gradient.
    fn zero_grad(&self) {
        self.parameters().iter().for_each(Tensor::zero_grad);
    }

    /// Switches training behaviour (dropout draws masks) on or off (`eval`), as PyTorch's `train(mode)`;
    /// a container passes it to its children. Modules that behave the same either way ignore it.
    fn set_training(&self, _training: bool) {}
}

/// A child's `named_parameters` under the child's name, as a parent module names them: `weight` of the
/// child `attn` becomes `attn.weight` (a parent of that parent prefixes again: `blocks.0.attn.weight`).
pub fn prefixed<F: Real>(child: &str, named: Vec<(String, Tensor<F>)>) -> Vec<(String, Tensor<F>)> {
    named.into_iter().map(|(name, p)| (format!("{child}.{name}"), p)).collect()
}
