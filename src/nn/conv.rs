//! Image ops in PyTorch's layout and semantics, computed by `ops::conv` (the CPU twin of the conv and pool
//! kernels): `conv2d` of x `[N, C, H, W]` by a weight `[O, C, KH, KW]` (cross-correlation, as
//! `torch.nn.functional.conv2d`) with an optional bias `[O]`, a stride and zero padding on every side; and
//! `max_pool2d` of x `[N, C, H, W]` over square windows with a stride and padding that counts as −∞.
//!
//! Max pooling takes the first largest element of each window in row-major window order (ties go to the
//! first, as PyTorch's CPU kernel), and its backward sends each output's gradient to that element alone.
//! One difference from PyTorch: a NaN never wins a window (as in the kernels), where PyTorch's would
//! propagate it.
//!
//! Sums run in a fixed order (see `ops::conv`); the weight's and bias's gradients add the samples in
//! order, so a run repeats to the bit. On device tensors `cuda::conv` computes both: the max pool to the
//! host's bits, the convolution as one product over the batch (its sums in another fixed order).

use super::cuda::{self, Place};
use super::error::{Error, Result};
use super::tensor::{Storage, Tensor, element_count};
use crate::ops::conv::{Conv2dShape, ConvGrads, MaxPool2dShape};
use crate::ops::cpu::Real;
use std::sync::Arc;

/// The four axes of an `[N, C, H, W]` input, or the error naming `op`.
fn batch_of_images<F: Real>(op: &'static str, x: &Tensor<F>) -> Result<[usize; 4]> {
    <[usize; 4]>::try_from(x.shape())
        .map_err(|_| Error::shape(op, x.shape(), "is not a batch of images of four axes [N, C, H, W]"))
}

/// The error for a kernel or window of `kh`×`kw` that does not fit `x` padded by `padding`.
fn too_small<F: Real>(op: &'static str, x: &Tensor<F>, padding: usize, (kh, kw): (usize, usize), what: &str) -> Error {
    Error::shape(op, x.shape(), format!("padded by {padding} is smaller than the {kh}×{kw} {what}"))
}

/// `[N] ++ rest`, or the error for an output with more elements than memory can address.
fn output_shape(op: &'static str, batch: usize, rest: [usize; 3]) -> Result<Vec<usize>> {
    let shape = vec![batch, rest[0], rest[1], rest[2]];
    match element_count(&shape) {
        Some(_) => Ok(shape),
        None => Err(Error::shape(op, &shape, "has more elements than memory can address")),
    }
}

/// The 2-D convolution of `x` `[N, C, H, W]` by `weight` `[O, C, KH, KW]`, plus `bias` `[O]`: `stride`
/// between windows and `padding` zeros on every side, both axes. Output `[N, O, OH, OW]`, OH = (H +
/// 2·padding − KH) / stride + 1 (and OW alike).
pub fn conv2d<F: Real>(
    x: &Tensor<F>,
    weight: &Tensor<F>,
    bias: Option<&Tensor<F>>,
    stride: usize,
    padding: usize,
) -> Result<Tensor<F>> {
    let [n, channels, height, width] = batch_of_images("conv2d", x)?;
    let [out_channels, weight_channels, kh, kw] = <[usize; 4]>::try_from(weight.shape())
        .map_err(|_| Error::shape("conv2d", weight.shape(), "is not a weight of four axes [O, C, KH, KW]"))?;
    if weight_channels != channels {
        let problem = "do not match: the input's channels (axis 1) must be the weight's (axis 1)";
        return Err(Error::shapes("conv2d", x.shape(), weight.shape(), problem));
    }
    if let Some(bias) = bias
        && bias.shape() != [out_channels]
    {
        return Err(Error::shapes("conv2d", weight.shape(), bias.shape(), "do not match: the bias must be [O]"));
    }
    if stride == 0 {
        return Err(Error::value("conv2d", "the stride must be 1 or more"));
    }
    if kh == 0 || kw == 0 {
        return Err(Error::shape("conv2d", weight.shape(), "has an empty kernel"));
    }
    let conv = Conv2dShape::new((channels, height, width), out_channels, (kh, kw), stride, padding)
        .ok_or_else(|| too_small("conv2d", x, padding, (kh, kw), "kernel"))?;
    let shape = output_shape("conv2d", n, [out_channels, conv.out_height, conv.out_width])?;
    let operands: Vec<&Tensor<F>> = [Some(x), Some(weight), bias].into_iter().flatten().collect();
    if let Place::Device(gpu) = cuda::place_of("conv2d", &operands)? {
        return cuda::conv::conv2d(&gpu, (x, weight, bias), &conv, n, shape);
    }
    let (values_x, values_w) = (x.storage(), weight.storage());
    let bias_values = bias.map(Tensor::storage);
    let (sample_in, sample_out) = (conv.input_len(), conv.output_len());
    let mut out = vec![F::zero(); n * sample_out];
    let x_samples = &values_x.host()[..n * sample_in];
    conv.forward_samples(x_samples, values_w.host(), bias_values.as_deref().map(Storage::host), &mut out);
    let backward = move |grad: &[F], needs: &[bool]| {
        let mut grad_x = needs[0].then(|| vec![F::zero(); n * sample_in]);
        let mut grad_w = needs[1].then(|| vec![F::zero(); conv.weight_len()]);
        let mut grad_b = needs.get(2).copied().unwrap_or(false).then(|| vec![F::zero(); out_channels]);
        let grads =
            ConvGrads { weight: grad_w.as_deref_mut(), bias: grad_b.as_deref_mut(), input: grad_x.as_deref_mut() };
        conv.backward_samples(&values_x.host()[..n * sample_in], values_w.host(), &grad[..n * sample_out], grads);
        Ok([grad_x, grad_w].into_iter().chain((needs.len() == 3).then_some(grad_b)).collect())
    };
    Ok(Tensor::from_op("conv2d", Arc::new(Storage::Host(out)), shape, &operands, Box::new(backward)))
}

/// The max over each `kernel`×`kernel` window of `x` `[N, C, H, W]`, windows `stride` apart over the input
/// padded by `padding` (at most half the kernel) on every side with −∞. Output `[N, C, OH, OW]`, OH = (H +
/// 2·padding − kernel) / stride + 1 (and OW alike).
pub fn max_pool2d<F: Real>(x: &Tensor<F>, kernel: usize, stride: usize, padding: usize) -> Result<Tensor<F>> {
    let [n, channels, height, width] = batch_of_images("max_pool2d", x)?;
    if kernel == 0 || stride == 0 {
        return Err(Error::value(
            "max_pool2d",
            format!("the kernel ({kernel}) and the stride ({stride}) must be 1 or more"),
        ));
    }
    if padding > kernel / 2 {
        let problem = format!("the padding ({padding}) must be at most half the kernel ({kernel})");
        return Err(Error::value("max_pool2d", problem));
    }
    let pool = MaxPool2dShape::new((channels, height, width), kernel, stride, padding)
        .ok_or_else(|| too_small("max_pool2d", x, padding, (kernel, kernel), "window"))?;
    if u32::try_from(pool.input_len()).is_err() {
        return Err(Error::shape("max_pool2d", x.shape(), "has more than 2³² elements in an image"));
    }
    let shape = output_shape("max_pool2d", n, [channels, pool.out_height, pool.out_width])?;
    if let Place::Device(gpu) = cuda::place_of("max_pool2d", &[x])? {
        return cuda::conv::max_pool2d(&gpu, x, &pool, n, shape);
    }
    let values = x.storage();
    let (sample_in, sample_out) = (pool.input_len(), pool.output_len());
    let mut out = vec![F::zero(); n * sample_out];
    let mut winners = vec![0u32; n * sample_out];
    let samples = values.host().chunks_exact(sample_in.max(1)).zip(out.chunks_exact_mut(sample_out.max(1)));
    for ((x, y), winners) in samples.zip(winners.chunks_exact_mut(sample_out.max(1))).take(n) {
        pool.forward(x, y, winners);
    }
    let backward = move |grad: &[F], _needs: &[bool]| {
        let mut grad_x = vec![F::zero(); n * sample_in];
        for s in 0..n {
            let (dy, won) = (&grad[s * sample_out..][..sample_out], &winners[s * sample_out..][..sample_out]);
            pool.backward(dy, won, &mut grad_x[s * sample_in..][..sample_in]);
        }
        Ok(vec![Some(grad_x)])
    };
    Ok(Tensor::from_op("max_pool2d", Arc::new(Storage::Host(out)), shape, &[x], Box::new(backward)))
}
