//! `Linear`: y = x·wᵀ + b, initialised as PyTorch's `nn.Linear` (`cpu::linear_init`).

use super::{Module, require_grads, uniform_init, weight_and_bias};
use crate::nn::error::{Error, Result};
use crate::nn::matmul::linear;
use crate::nn::tensor::Tensor;
use crate::ops::cpu::{Real, SeededRng};

/// y = x·wᵀ + b over the last axis of x: `weight` `[out, in]`, `bias` `[out]`.
#[derive(Clone, Debug)]
pub struct Linear<F: Real = f32> {
    /// `[out, in]`.
    pub weight: Tensor<F>,
    /// `[out]`, if the layer has one.
    pub bias: Option<Tensor<F>>,
}

impl<F: Real> Linear<F> {
    /// A layer of `inputs` → `outputs` drawn from `rng` as PyTorch's `nn.Linear`: weight, then bias, each
    /// U(−1/√inputs, 1/√inputs).
    pub fn new(inputs: usize, outputs: usize, bias: bool, rng: &mut SeededRng) -> Result<Self> {
        let weight = Tensor::parameter(uniform_init(outputs * inputs, inputs, rng), &[outputs, inputs])?;
        let bias = if bias { Some(Tensor::parameter(uniform_init(outputs, inputs, rng), &[outputs])?) } else { None };
        Ok(Linear { weight, bias })
    }

    /// A layer of the given parameters, which are marked as requiring gradients.
    pub fn from_parameters(weight: Tensor<F>, bias: Option<Tensor<F>>) -> Result<Self> {
        let [outputs, _] = *weight.shape() else {
            return Err(Error::shape("Linear", weight.shape(), "is not a weight of two axes [out, in]"));
        };
        if let Some(bias) = &bias
            && bias.shape() != [outputs]
        {
            return Err(Error::shapes("Linear", weight.shape(), bias.shape(), "do not match: the bias must be [out]"));
        }
        require_grads(&weight, bias.as_ref())?;
        Ok(Linear { weight, bias })
    }

    /// The width of the input.
    pub fn inputs(&self) -> usize {
        self.weight.shape()[1]
    }

    /// The width of the output.
    pub fn outputs(&self) -> usize {
        self.weight.shape()[0]
    }
}

impl<F: Real> Module<F> for Linear<F> {
    fn forward(&self, x: &Tensor<F>) -> Result<Tensor<F>> {
        linear(x, &self.weight, self.bias.as_ref())
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<F>)> {
        weight_and_bias(&self.weight, self.bias.as_ref())
    }
}
