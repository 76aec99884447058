//! The device forward and backward of `conv2d` and `max_pool2d`, launching the images section of
//! `fused/nn.cu`: the twins of the host paths in `nn/conv.rs` (their math `ops::conv`), which check the
//! arguments first and call in here when the operands live on a GPU.
//!
//! conv2d is one product for the whole batch: `nn_im2col` lays every window of every sample out as a
//! column, col `[C·KH·KW, N·OH·OW]` (0 in the padding), and weight `[O, C·KH·KW]` · col is the output with
//! its first two axes swapped, `[O, N, OH·OW]`, which a gather puts in order. The backward swaps the
//! output gradient's axes the same way (dY) and multiplies: ∂weight = dY·colᵀ (col recomputed from the
//! input), ∂col = weightᵀ·dY, which `nn_col2im` folds back onto the input, each input element summing its
//! taps in a fixed order. The bias is added along the channels by one broadcast launch, and its gradient is
//! dY's rows summed (`nn_sum_rows`, a block a channel, a fixed tree): a generic broadcast's gradient
//! would walk the batch's every position from one thread a channel.
//!
//! max_pool2d keeps each window's winner (its place in the window) from the forward; the backward gives
//! each input element the sum of the outputs it won, in the host's order, so both match the host's bits.

use super::ops::{add_broadcast, buffer, gather, int, product, sum_axis};
use super::{Device, DeviceBuffer};
use crate::device::launch::Arg;
use crate::nn::error::{Error, Result};
use crate::nn::tensor::Tensor;
use crate::ops::conv::{Conv2dShape, MaxPool2dShape};
use crate::ops::cpu::Real;
use std::sync::Arc;

/// The largest col a convolution keeps from its forward for its backward's weight gradient (a larger one is
/// made again there, from the input).
const KEPT_COL_BYTES: usize = 256 << 20;

/// The product of `factors` as a kernel's int, or the error naming `op`.
fn count(op: &'static str, factors: &[usize]) -> Result<i32> {
    let n = factors.iter().try_fold(1usize, |n, &f| n.checked_mul(f));
    int(op, n.ok_or_else(|| Error::device(op, "has more elements than memory can address"))?)
}

/// The sizes `nn_im2col` and `nn_col2im` take after the count: samples, C, H, W, KH, KW, stride, padding,
/// OH, OW. Checks that a padded row or column index fits an int (the kernels compute them).
fn conv_sizes(op: &'static str, conv: &Conv2dShape, samples: usize) -> Result<Vec<Arg>> {
    let padded = |size: usize| conv.padding.checked_mul(2).and_then(|p| p.checked_add(size));
    for size in [padded(conv.height), padded(conv.width)] {
        int(op, size.ok_or_else(|| Error::device(op, "has a padding past what memory can address"))?)?;
    }
    let sizes = [samples, conv.channels, conv.height, conv.width, conv.kernel_h, conv.kernel_w];
    let sizes = sizes.into_iter().chain([conv.stride, conv.padding, conv.out_height, conv.out_width]);
    sizes.map(|v| int(op, v).map(Arg::i32)).collect()
}

/// col `[C·KH·KW, samples·OH·OW]` of the input `x` (`col_count` elements, checked).
fn im2col(device: &Arc<Device>, x: &DeviceBuffer, col_count: i32, sizes: &[Arg]) -> Result<DeviceBuffer> {
    const NAME: &str = "conv2d";
    let col = device.alloc(NAME, col_count as usize)?;
    let args = [&[device.arg(x), device.arg(&col), Arg::i32(col_count)][..], sizes].concat();
    device.launch(NAME, &device.kernels.im2col, device.blocks_for(col_count as usize), 0, &args)?;
    Ok(col)
}

/// The convolution of `x` `[N, C, H, W]` by `weight` `[O, C, KH, KW]` plus `bias` `[O]`, of the sizes
/// `conv` over `samples` = N, into `shape` `[N, O, OH, OW]`.
pub(crate) fn conv2d<F: Real>(
    device: &Arc<Device>,
    (x, weight, bias): (&Tensor<F>, &Tensor<F>, Option<&Tensor<F>>),
    conv: &Conv2dShape,
    samples: usize,
    shape: Vec<usize>,
) -> Result<Tensor<F>> {
    const NAME: &str = "conv2d";
    let sizes = conv_sizes(NAME, conv, samples)?;
    let (outputs, taps, positions) = (conv.out_channels, conv.taps(), conv.out_height * conv.out_width);
    let columns = count(NAME, &[samples, positions])? as usize;
    let col_count = count(NAME, &[taps, columns])?;
    count(NAME, &[outputs, columns])?;
    let input_count = count(NAME, &[samples, conv.input_len()])?;
    let (xb, wb) = (buffer(x), buffer(weight));
    let col = im2col(device, &xb, col_count, &sizes)?;
    let swapped = product(device, NAME, (&wb, &col), (outputs, columns, taps), 1, (0, 0), (false, false))?;
    // [O, N, P] → [N, O, P]: output (s, o, p) reads o·N·P + s·P + p.
    let unbiased = gather(device, NAME, &swapped, &[samples, outputs, positions], &[positions, columns, 1])?;
    let four = [samples, outputs, conv.out_height, conv.out_width];
    let out = match bias {
        Some(bias) => add_broadcast(device, NAME, (&unbiased, &buffer(bias)), &four, [false, true, false, false])?,
        None => unbiased,
    };
    // The backward's col: this one while it is small (one launch and a pass over it fewer), else made again.
    let kept_col = (col_count as usize * size_of::<f32>() <= KEPT_COL_BYTES).then_some(col);
    let device_ = Arc::clone(device);
    let with_bias = bias.is_some();
    let backward = move |grad: &DeviceBuffer, needs: &[bool]| {
        let d = &device_;
        // dY [O, N·P]: (o, s, p) reads s·O·P + o·P + p.
        let dy = gather(d, NAME, grad, &[outputs, samples, positions], &[positions, outputs * positions, 1])?;
        let dx = if needs[0] {
            let dcol = product(d, NAME, (&wb, &dy), (taps, columns, outputs), 1, (0, 0), (true, false))?;
            let dx = d.alloc(NAME, input_count as usize)?;
            let args = [&[d.arg(&dcol), d.arg(&dx), Arg::i32(input_count)][..], &sizes].concat();
            d.launch(NAME, &d.kernels.col2im, d.blocks_for(input_count as usize), 0, &args)?;
            Some(dx)
        } else {
            None
        };
        let dw = if needs[1] {
            let col = match &kept_col {
                Some(col) => col.clone(),
                None => im2col(d, &xb, col_count, &sizes)?,
            };
            Some(product(d, NAME, (&dy, &col), (outputs, taps, columns), 1, (0, 0), (false, true))?)
        } else {
            None
        };
        let mut grads = vec![dx, dw];
        if with_bias {
            grads.push(if needs[2] { Some(sum_axis(d, NAME, &dy, (outputs, columns, 1), 1.0)?) } else { None });
        }
        Ok(grads)
    };
    let inputs: Vec<&Tensor<F>> = [Some(x), Some(weight), bias].into_iter().flatten().collect();
    Ok(Tensor::from_device_op(NAME, out, shape, &inputs, Box::new(backward)))
}

/// The max pool of `x` `[N, C, H, W]` of the sizes `pool` over `samples` = N, into `shape` `[N, C, OH,
/// OW]`.
pub(crate) fn max_pool2d<F: Real>(
    device: &Arc<Device>,
    x: &Tensor<F>,
    pool: &MaxPool2dShape,
    samples: usize,
    shape: Vec<usize>,
) -> Result<Tensor<F>> {
    const NAME: &str = "max_pool2d";
    // A winner's place in its window, ky·kernel + kx, is kept as a float: exact below 2^24.
    if pool.kernel.checked_mul(pool.kernel).is_none_or(|places| places > 1 << 24) {
        let problem = format!("a {0}×{0} window is more than the GPU kernel can index (2^24 places)", pool.kernel);
        return Err(Error::device(NAME, problem));
    }
    let input_count = count(NAME, &[samples, pool.input_len()])?;
    let output_count = count(NAME, &[samples, pool.output_len()])?;
    let sizes = [pool.height, pool.width, pool.kernel, pool.stride, pool.padding, pool.out_height, pool.out_width];
    let sizes = sizes.into_iter().map(|v| int(NAME, v).map(Arg::i32)).collect::<Result<Vec<Arg>>>()?;
    let (out, won) = (device.alloc(NAME, output_count as usize)?, device.alloc(NAME, output_count as usize)?);
    let args = [device.arg(&buffer(x)), device.arg(&out), device.arg(&won), Arg::i32(output_count)];
    let args = [&args[..], &sizes].concat();
    device.launch(NAME, &device.kernels.max_pool, device.blocks_for(output_count as usize), 0, &args)?;
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        let d = &device_;
        let dx = d.alloc(NAME, input_count as usize)?;
        let args = [&[d.arg(grad), d.arg(&won), d.arg(&dx), Arg::i32(input_count)][..], &sizes].concat();
        d.launch(NAME, &d.kernels.max_pool_grad, d.blocks_for(input_count as usize), 0, &args)?;
        Ok(vec![Some(dx)])
    };
    Ok(Tensor::from_device_op(NAME, out, shape, &[x], Box::new(backward)))
}
