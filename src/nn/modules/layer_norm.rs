//! `LayerNorm`: `layer_norm` over the last axis with a learned scale and shift, as PyTorch's
//! `nn.LayerNorm(D)`: weight ones, bias zeros, ε 1e-5; without `elementwise_affine`, neither.

use super::Module;
use crate::nn::error::{Error, Result};
use crate::nn::norm::layer_norm;
use crate::nn::tensor::Tensor;
use crate::ops::cpu::Real;
use crate::ops::layernorm::LN_EPS;

/// Each row of the last axis normalised, then scaled by `weight` and shifted by `bias`.
#[derive(Clone, Debug)]
pub struct LayerNorm<F: Real = f32> {
    /// `[D]`, ones at first; None without `elementwise_affine`.
    pub weight: Option<Tensor<F>>,
    /// `[D]`, zeros at first; None without `elementwise_affine`.
    pub bias: Option<Tensor<F>>,
    /// Added to the variance, 1e-5 unless set.
    pub eps: f64,
    width: usize,
}

impl<F: Real> LayerNorm<F> {
    /// A layer over a last axis of `width`, with weight (ones) and bias (zeros) when `elementwise_affine`.
    pub fn new(width: usize, elementwise_affine: bool) -> Result<Self> {
        let (weight, bias) = if elementwise_affine {
            (
                Some(Tensor::parameter(vec![F::one(); width], &[width])?),
                Some(Tensor::parameter(vec![F::zero(); width], &[width])?),
            )
        } else {
            (None, None)
        };
        Ok(LayerNorm { weight, bias, eps: LN_EPS, width })
    }

    /// D, the size of the last axis it normalises.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The layer with `eps` in place of 1e-5.
    pub fn with_eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }
}

impl<F: Real> Module<F> for LayerNorm<F> {
    fn forward(&self, x: &Tensor<F>) -> Result<Tensor<F>> {
        if x.shape().last() != Some(&self.width) {
            let problem = "do not match: the input's last axis must be the layer's width (second)";
            return Err(Error::shapes("LayerNorm", x.shape(), &[self.width], problem));
        }
        layer_norm(x, self.weight.as_ref(), self.bias.as_ref(), self.eps)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<F>)> {
        let weight = self.weight.iter().map(|w| ("weight".to_string(), w.clone()));
        weight.chain(self.bias.iter().map(|b| ("bias".to_string(), b.clone()))).collect()
    }
}
