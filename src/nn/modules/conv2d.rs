//! `Conv2d`: the 2-D convolution of `nn::conv2d` with its weight and bias, initialised as PyTorch's
//! `nn.Conv2d`.

use super::{Module, require_grads, uniform_init, weight_and_bias};
use crate::nn::conv::conv2d;
use crate::nn::error::{Error, Result};
use crate::nn::tensor::Tensor;
use crate::ops::cpu::{Real, SeededRng};

/// y = conv2d(x, weight) + bias over x `[N, C, H, W]`: `weight` `[O, C, KH, KW]`, `bias` `[O]`, a stride
/// and zero padding on every side.
#[derive(Clone, Debug)]
pub struct Conv2d<F: Real = f32> {
    /// `[O, C, KH, KW]`.
    pub weight: Tensor<F>,
    /// `[O]`, if the layer has one.
    pub bias: Option<Tensor<F>>,
    /// Step between windows, both axes.
    pub stride: usize,
    /// Zeros added on each side, both axes.
    pub padding: usize,
}

impl<F: Real> Conv2d<F> {
    /// A layer of `in_channels` → `out_channels` with a `kernel`×`kernel` kernel drawn from `rng` as
    /// PyTorch's `nn.Conv2d`: weight, then bias, each U(−1/√fan_in, 1/√fan_in), fan_in = C·KH·KW.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        (stride, padding): (usize, usize),
        bias: bool,
        rng: &mut SeededRng,
    ) -> Result<Self> {
        let fan_in = in_channels * kernel * kernel;
        let shape = [out_channels, in_channels, kernel, kernel];
        let weight = Tensor::parameter(uniform_init(out_channels * fan_in, fan_in, rng), &shape)?;
        let bias = if bias {
            Some(Tensor::parameter(uniform_init(out_channels, fan_in, rng), &[out_channels])?)
        } else {
            None
        };
        Self::from_parameters(weight, bias, stride, padding)
    }

    /// A layer of the given parameters (any kernel, KH×KW), which are marked as requiring gradients.
    pub fn from_parameters(weight: Tensor<F>, bias: Option<Tensor<F>>, stride: usize, padding: usize) -> Result<Self> {
        let [out_channels, _, _, _] = *weight.shape() else {
            return Err(Error::shape("Conv2d", weight.shape(), "is not a weight of four axes [O, C, KH, KW]"));
        };
        if let Some(bias) = &bias
            && bias.shape() != [out_channels]
        {
            return Err(Error::shapes("Conv2d", weight.shape(), bias.shape(), "do not match: the bias must be [O]"));
        }
        if stride == 0 {
            return Err(Error::value("Conv2d", "the stride must be 1 or more"));
        }
        require_grads(&weight, bias.as_ref())?;
        Ok(Conv2d { weight, bias, stride, padding })
    }

    /// Input channels C.
    pub fn in_channels(&self) -> usize {
        self.weight.shape()[1]
    }

    /// Output channels O.
    pub fn out_channels(&self) -> usize {
        self.weight.shape()[0]
    }
}

impl<F: Real> Module<F> for Conv2d<F> {
    fn forward(&self, x: &Tensor<F>) -> Result<Tensor<F>> {
        conv2d(x, &self.weight, self.bias.as_ref(), self.stride, self.padding)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<F>)> {
        weight_and_bias(&self.weight, self.bias.as_ref())
    }
}
