//! `MaxPool2d`: `nn::max_pool2d` as a layer (PyTorch's `nn.MaxPool2d`), with no parameters.

use super::Module;
use crate::nn::conv::max_pool2d;
use crate::nn::error::Result;
use crate::nn::tensor::Tensor;
use crate::ops::cpu::Real;

/// The max over each `kernel`×`kernel` window of x `[N, C, H, W]`, windows `stride` apart, the input
/// padded by `padding` (−∞) on every side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2d {
    /// Window side.
    pub kernel: usize,
    /// Step between windows, both axes.
    pub stride: usize,
    /// −∞ added on each side, both axes (at most half the kernel).
    pub padding: usize,
}

impl MaxPool2d {
    /// Windows of `kernel`×`kernel` side by side (stride = kernel, no padding: PyTorch's defaults).
    pub fn new(kernel: usize) -> Self {
        MaxPool2d { kernel, stride: kernel, padding: 0 }
    }

    /// The same windows `stride` apart.
    pub fn with_stride(self, stride: usize) -> Self {
        MaxPool2d { stride, ..self }
    }

    /// The same windows over the input padded by `padding` on every side.
    pub fn with_padding(self, padding: usize) -> Self {
        MaxPool2d { padding, ..self }
    }
}

impl<F: Real> Module<F> for MaxPool2d {
    fn forward(&self, x: &Tensor<F>) -> Result<Tensor<F>> {
        max_pool2d(x, self.kernel, self.stride, self.padding)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<F>)> {
        Vec::new()
    }
}
