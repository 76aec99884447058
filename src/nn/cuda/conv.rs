//! The device forward and backward of `conv2d` and `max_pool2d`, launching the images section of
//! `fused/nn.cu`: the twins of the host paths in `nn/conv.rs` (their math `ops::conv`), which check the
//! arguments first and call in here when the operands live on a GPU.
//!
//! conv2d in fp32 is three implicit products (`nn_conv2d_{tile}` and its gradients): the output is weight
//! `[O, C·KH·KW]` times the matrix of every sample's windows, `[C·KH·KW, N·OH·OW]`, whose elements the
//! product stages straight from the input, and it stores each result in `[N, O, OH, OW]` order with the
//! bias added. The input's gradient is the product of the weight and the output gradient read at the
//! positions each input element reaches; the weight's gradient and the bias's are one product of the output
//! gradient and the windows with a column of ones, over the positions cut into slices that the launch adds
//! in order. Each product's sums run in a fixed order, so a run repeats to the bit. Where a convolution has
//! few result channels and a band of its image fits in shared memory, each of the three takes the direct
//! kernels instead (`direct_conv.rs`), which stage the band once a block rather than element by element.
//!
//! In bf16 (a device whose products round to bf16) conv2d keeps the explicit path: `nn_im2col` lays every
//! window of every sample out as a column, col `[C·KH·KW, N·OH·OW]` (0 in the padding), and weight ·
//! col is the output with its first two axes swapped, `[O, N, OH·OW]`, which a gather puts in order. The
//! backward swaps the output gradient's axes the same way (dY) and multiplies: ∂weight = dY·colᵀ, ∂col =
//! weightᵀ·dY, which `nn_col2im` folds back onto the input, each input element summing its taps in a fixed
//! order. The bias is added along the channels by one broadcast launch, and its gradient is dY's rows
//! summed (`nn_sum_rows`, a block a channel, a fixed tree).
//!
//! max_pool2d keeps each window's winner (its place in the window) from the forward; the backward gives
//! each input element the sum of the outputs it won, in the host's order, so both match the host's bits.

use super::direct_conv::WindowFusion;
use super::fusion::{Extra, Producer, Want};
use super::ops::{
    UNARY_RELU, add_broadcast, buffer, gather, grid_of, int, optional, product, slices_for, sum_axis, sum_slices,
};
use super::{CONV_TILES, Device, DeviceBuffer, direct_conv};
use crate::device::kernel_struct::kernel_struct;
use crate::device::launch::{Arg, StructArg};
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

kernel_struct! {
    /// A divisor with its magic number (`Divisor` in fused/nn.cu): n / d = ⌊n · mul / 2^(32 + shift)⌋ for
    /// 0 ≤ n < 2³¹, mul = ⌈2^(31 + ⌈log₂ d⌉) / d⌉ and shift = ⌈log₂ d⌉ − 1; d = 1 divides by returning n.
    struct Divisor {
        d: i32,
        mul: u32,
        shift: u32,
    }
}

impl Divisor {
    /// `d` and its magic number; 0 and 1 need none (a size of 0 is never divided by: nothing is indexed).
    fn of(d: i32) -> Divisor {
        if d <= 1 {
            return Divisor { d, mul: 0, shift: 0 };
        }
        let log = 32 - (d as u32 - 1).leading_zeros(); // ⌈log₂ d⌉
        let mul = (1u64 << (31 + log)).div_ceil(d as u64);
        Divisor { d, mul: mul as u32, shift: log - 1 }
    }

    /// n / d as the kernels compute it (`divide`), for 0 ≤ n < 2³¹.
    #[cfg(test)]
    fn divide(self, n: i32) -> i32 {
        if self.d == 1 { n } else { ((n as u64 * self.mul as u64) >> 32 >> self.shift) as i32 }
    }
}

kernel_struct! {
    /// The sizes of one convolution over `samples` images (`ConvShape` in fused/nn.cu); each `by_x` divides
    /// by x.
    struct ConvShape {
        samples: i32,
        channels: i32,
        height: i32,
        width: i32,
        out_channels: i32,
        kernel_h: i32,
        kernel_w: i32,
        stride: i32,
        padding: i32,
        out_h: i32,
        out_w: i32,
        by_kernel_w: Divisor,
        by_kernel_hw: Divisor,
        by_out_w: Divisor,
        by_positions: Divisor,
        by_width: Divisor,
        by_image: Divisor,
        by_stride: Divisor,
    }
}

impl ConvShape {
    /// The sizes of `conv` over `samples` images, or the error naming `op` when a count the kernels index
    /// (an input, an output, the taps, the weight) does not fit an int.
    fn of(op: &'static str, conv: &Conv2dShape, samples: usize) -> Result<ConvShape> {
        let (positions, image) = (conv.out_height * conv.out_width, conv.height * conv.width);
        count(op, &[samples, conv.channels, image])?;
        count(op, &[samples, conv.out_channels, positions])?;
        count(op, &[conv.out_channels, conv.taps() + 1])?;
        count(op, &[conv.out_channels, conv.kernel_h, conv.kernel_w, conv.channels])?;
        // A listed element's column base runs past the tensor by up to a padded row of the kernel's reach.
        let reach = (conv.padding.saturating_mul(2)).saturating_add(conv.kernel_h.max(conv.kernel_w) + 1);
        let row = conv.width.max(conv.out_width).saturating_add(reach);
        let largest = (samples.saturating_mul(conv.channels.saturating_mul(image)))
            .max(samples.saturating_mul(conv.out_channels.saturating_mul(positions)));
        let past = largest.saturating_add(reach.saturating_mul(row));
        if i32::try_from(past).is_err() || i32::try_from(conv.height.max(conv.width).saturating_add(reach)).is_err() {
            return Err(Error::device(op, "has more elements with its padding than a kernel's int can index"));
        }
        let divisor = |n: usize| int(op, n).map(Divisor::of);
        Ok(ConvShape {
            samples: int(op, samples)?,
            channels: int(op, conv.channels)?,
            height: int(op, conv.height)?,
            width: int(op, conv.width)?,
            out_channels: int(op, conv.out_channels)?,
            kernel_h: int(op, conv.kernel_h)?,
            kernel_w: int(op, conv.kernel_w)?,
            stride: int(op, conv.stride)?,
            padding: int(op, conv.padding)?,
            out_h: int(op, conv.out_height)?,
            out_w: int(op, conv.out_width)?,
            by_kernel_w: divisor(conv.kernel_w)?,
            by_kernel_hw: divisor(conv.kernel_h * conv.kernel_w)?,
            by_out_w: divisor(conv.out_width)?,
            by_positions: divisor(positions)?,
            by_width: divisor(conv.width)?,
            by_image: divisor(image)?,
            by_stride: divisor(conv.stride)?,
        })
    }
}

/// How many taps a conv product lists in shared memory (fused/nn.cu's CONV_TAP_TABLE), 16 bytes each
/// (`ConvTap`); a product of more divides its indices instead.
const CONV_TAP_TABLE: usize = 2048;

/// The dynamic shared memory of a conv product in `tile` whose operand has `taps` taps to list (0: none).
fn conv_shared(device: &Device, tile: usize, taps: usize) -> u32 {
    let listed = if taps <= CONV_TAP_TABLE { taps * 16 } else { 0 };
    device.conv_shared[tile] + listed as u32
}

/// The place in [`CONV_TILES`] of the tile for a product of `rows` rows (channels): the first that covers
/// them, else the largest.
fn conv_tile(rows: usize) -> usize {
    CONV_TILES.iter().position(|&(bm, ..)| bm >= rows).unwrap_or(CONV_TILES.len() - 1)
}

/// The grid of a conv product of `rows` × `columns` results in `tile`, `slices` of them, or the error naming
/// `op` when it is more blocks than a launch takes.
fn conv_grid(op: &'static str, tile: usize, sizes: (usize, usize), slices: usize) -> Result<(u32, u32)> {
    launch_grid(op, grid_of(CONV_TILES[tile], sizes, slices))
}

/// A conv launch's grid (x, y) as a launch takes it, or the error naming `op` when it is more blocks than
/// that.
pub(super) fn launch_grid(op: &'static str, (x, y): (usize, usize)) -> Result<(u32, u32)> {
    if y > 65_535 {
        return Err(Error::device(op, format!("needs {y} rows of blocks, more than a launch takes (65,535)")));
    }
    Ok((int(op, x)? as u32, y as u32))
}

/// The convolution of `x` `[N, C, H, W]` by `weight` `[O, C, KH, KW]` plus `bias` `[O]`, of the sizes
/// `conv` over `samples` = N, into `shape` `[N, O, OH, OW]`: implicit products in fp32, im2col's in bf16.
pub(crate) fn conv2d<F: Real>(
    device: &Arc<Device>,
    operands: (&Tensor<F>, &Tensor<F>, Option<&Tensor<F>>),
    conv: &Conv2dShape,
    samples: usize,
    shape: Vec<usize>,
) -> Result<Tensor<F>> {
    if device.bf16_products() {
        conv2d_im2col(device, operands, conv, samples, shape)
    } else {
        conv2d_fp32(device, operands, conv, samples, shape)
    }
}

/// Whether the add that is producer `add` of the step has a ReLU reading its output.
fn wants_relu(device: &Device, add: usize) -> bool {
    device.wants_of(add).iter().any(|w| matches!(w, Want::Activation { code: UNARY_RELU, bf16: false, .. }))
}

/// The buffers a direct convolution's stores fill beside its result for the readers its producer recorded
/// (capture-time fusion): a ReLU's output, and for a residual sum, the other operand and the sum.
struct ForwardFusion {
    activated: DeviceBuffer,
    residual: Option<(DeviceBuffer, DeviceBuffer)>,
}

impl ForwardFusion {
    /// What the window walk's stores do.
    fn window(&self) -> WindowFusion<'_> {
        match &self.residual {
            Some((other, sum)) => WindowFusion::ResidualRelu { residual: other, sum, out: &self.activated },
            None => WindowFusion::Relu { out: &self.activated },
        }
    }

    /// Hands the results to the readers of `out`, the result of the convolution `op`.
    fn attach_to(self, device: &Device, op: &'static str, out: &DeviceBuffer) {
        match self.residual {
            Some((other, sum)) => {
                let writes = device.in_place_writes.load(std::sync::atomic::Ordering::Relaxed);
                out.attach(Extra::Residual { other: other.downgrade(), writes, sum, activated: self.activated });
            }
            None => out.attach(Extra::Activation { code: UNARY_RELU, out: self.activated, by: op }),
        }
    }
}

/// The ReLU a reader of `out` wanted, into a buffer of its own; or a residual sum with another producer's
/// output, still live, that an add wanted for the ReLU reading it; or nothing.
fn forward_fusion(
    device: &Arc<Device>,
    op: &'static str,
    producer: Option<&Producer>,
    out: &DeviceBuffer,
) -> Result<Option<ForwardFusion>> {
    let relu = producer.and_then(Producer::activation) == Some((UNARY_RELU, false));
    let residual = producer.and_then(Producer::residual).filter(|_| !relu);
    let residual = residual.filter(|&(_, add)| wants_relu(device, add));
    let residual = residual.and_then(|(other, _)| device.made_output(other)).filter(|o| o.len == out.len);
    if !relu && residual.is_none() {
        return Ok(None);
    }
    let residual = match residual {
        Some(other) => Some((other, device.alloc(op, out.len)?)),
        None => None,
    };
    Ok(Some(ForwardFusion { activated: device.alloc(op, out.len)?, residual }))
}

/// `conv2d` in fp32: each of its three products direct where a band of the image fits (direct_conv.rs),
/// else an implicit product (the module's doc).
fn conv2d_fp32<F: Real>(
    device: &Arc<Device>,
    (x, weight, bias): (&Tensor<F>, &Tensor<F>, Option<&Tensor<F>>),
    conv: &Conv2dShape,
    samples: usize,
    shape: Vec<usize>,
) -> Result<Tensor<F>> {
    const NAME: &str = "conv2d";
    let sizes = StructArg::of(&ConvShape::of(NAME, conv, samples)?);
    let (outputs, columns) = (conv.out_channels, samples * conv.out_height * conv.out_width);
    let (xb, wb) = (buffer(x), buffer(weight));
    let producer = device.producer(NAME);
    let out = device.alloc(NAME, outputs * columns)?;
    let kernels = device.conv_kernels();
    let sms = device.gpu.sm_count as usize;
    if let Some(plan) = direct_conv::forward_plan(NAME, conv, samples, sms, kernels)? {
        let fused = forward_fusion(device, NAME, producer.as_ref(), &out)?;
        let fusion = fused.as_ref().map_or(WindowFusion::None, ForwardFusion::window);
        direct_conv::launch_windows(device, NAME, &plan, (&xb, &wb, bias.map(buffer).as_ref()), (&out, fusion))?;
        if let Some(fused) = fused {
            fused.attach_to(device, NAME, &out);
        }
    } else {
        let tile = conv_tile(outputs);
        let grid = conv_grid(NAME, tile, (outputs, columns), 1)?;
        let args = [device.arg(&xb), device.arg(&wb), optional(device, bias.map(buffer).as_ref()), device.arg(&out)];
        let shared = conv_shared(device, tile, conv.taps());
        device.launch_struct(NAME, &device.kernels.conv[tile], (grid, shared), &sizes, &args)?;
    }
    out.made_by_producer(producer.as_ref());
    let (device_, conv) = (Arc::clone(device), *conv);
    let with_bias = bias.is_some();
    let backward = move |grad: &DeviceBuffer, needs: &[bool]| {
        let d = &device_;
        // The weight gradient first, on the backward's second stream (branch.rs): the input gradients'
        // chain goes on beside it.
        let wants_bias = with_bias && needs[2];
        let (dw, db) = if needs[1] || wants_bias {
            let (dw, db) = d.on_branch(&[grad, &xb], || {
                conv2d_grad_weight(d, (grad, &xb), (&sizes, &conv, samples), (wants_bias, kernels))
            })?;
            (needs[1].then_some(dw), db)
        } else {
            (None, None)
        };
        let dx = if needs[0] {
            Some(conv2d_grad_input(d, (grad, &wb, &xb), (&sizes, &conv, samples), kernels)?)
        } else {
            None
        };
        Ok([dx, dw].into_iter().chain(with_bias.then_some(db)).collect())
    };
    let inputs: Vec<&Tensor<F>> = [Some(x), Some(weight), bias].into_iter().flatten().collect();
    Ok(Tensor::from_device_op(NAME, out, shape, &inputs, Box::new(backward)))
}

/// The input's gradient `[N, C, H, W]` of a convolution of the sizes `conv` over `samples` images from the output
/// gradient `dy` and the weight `w`: direct where `kernels` has direct kernels and they fit, else the product of
/// the weight and `dy` read at the positions each input element reaches. Direct, it has the gradient `x` has
/// from its other readers added, and is then times the slope of the ReLU that made `x`, where the backward
/// offers them (backward_fusion.rs).
fn conv2d_grad_input(
    device: &Arc<Device>,
    (dy, w, x): (&DeviceBuffer, &DeviceBuffer, &DeviceBuffer),
    (sizes, conv, samples): (&StructArg, &Conv2dShape, usize),
    kernels: direct_conv::ConvKernels,
) -> Result<DeviceBuffer> {
    const NAME: &str = "conv2d";
    let dx = device.alloc(NAME, samples * conv.input_len())?;
    let sms = device.gpu.sm_count as usize;
    if let Some(plan) = direct_conv::input_grad_plan(NAME, conv, samples, sms, kernels)? {
        // The addend first: a slope offered with one is taken only after it.
        let addend = device.take_addend(NAME, x);
        let relu = device.take_slope(NAME, x, |code| code == UNARY_RELU).is_some();
        let fusion = WindowFusion::Gradient { addend: addend.as_ref(), relu_out: relu.then_some(x) };
        direct_conv::launch_windows(device, NAME, &plan, (dy, w, None), (&dx, fusion))?;
        return Ok(dx);
    }
    let tile = conv_tile(conv.channels);
    let grid = conv_grid(NAME, tile, (conv.channels, samples * conv.height * conv.width), 1)?;
    let args = [device.arg(dy), device.arg(w), device.arg(&dx)];
    // The taps are listed at stride 1 only (fused/nn.cu's conv2d_grad_input).
    let listed = if conv.stride == 1 { conv.out_channels * conv.kernel_h * conv.kernel_w } else { 0 };
    let shared = conv_shared(device, tile, listed);
    device.launch_struct(NAME, &device.kernels.conv_grad_input[tile], (grid, shared), sizes, &args)?;
    Ok(dx)
}

/// The weight's gradient `[O, C·KH·KW]` of a convolution of the sizes `conv` over `samples` images, and the bias's
/// `[O]` when `with_bias`: direct where `kernels` has direct kernels and they fit, a slice a band of an image,
/// else one product of the output gradient `dy` and the windows of `x`, over the positions cut into slices enough
/// to give every SM blocks; the slices' results then added in order.
fn conv2d_grad_weight(
    device: &Arc<Device>,
    (dy, x): (&DeviceBuffer, &DeviceBuffer),
    (sizes, conv, samples): (&StructArg, &Conv2dShape, usize),
    (with_bias, kernels): (bool, direct_conv::ConvKernels),
) -> Result<(DeviceBuffer, Option<DeviceBuffer>)> {
    const NAME: &str = "conv2d";
    let (outputs, taps) = (conv.out_channels, conv.taps());
    let sms = device.gpu.sm_count as usize;
    let plan = direct_conv::weight_grad_plan(NAME, conv, samples, sms, (with_bias, kernels))?;
    let (dw_parts, db_parts, slices) = match plan {
        Some(plan) => direct_conv::grad_weight_slices(device, NAME, &plan, (dy, x), (outputs, taps, with_bias))?,
        None => implicit_grad_weight_slices(device, (dy, x), (sizes, conv, samples), with_bias)?,
    };
    if slices == 1 {
        return Ok((dw_parts, db_parts));
    }
    let dw = device.alloc(NAME, outputs * taps)?;
    let db = if db_parts.is_some() { Some(device.alloc(NAME, outputs)?) } else { None };
    sum_slices(device, NAME, (&dw_parts, &dw), db_parts.as_ref().zip(db.as_ref()), slices)?;
    Ok((dw, db))
}

/// The implicit product of the weight gradient over the positions cut into slices: each slice's dw `[O,
/// C·KH·KW]` and db `[O]` (`with_bias`), and the number of slices.
fn implicit_grad_weight_slices(
    device: &Arc<Device>,
    (dy, x): (&DeviceBuffer, &DeviceBuffer),
    (sizes, conv, samples): (&StructArg, &Conv2dShape, usize),
    with_bias: bool,
) -> Result<(DeviceBuffer, Option<DeviceBuffer>, usize)> {
    const NAME: &str = "conv2d";
    let (outputs, taps) = (conv.out_channels, conv.taps());
    let (columns, depth) = (taps + with_bias as usize, samples * conv.out_height * conv.out_width);
    let tile = conv_tile(outputs);
    let (bm, bn, ..) = CONV_TILES[tile];
    let tiles = columns.div_ceil(bn) * outputs.div_ceil(bm);
    let (per_slice, slices) = weight_grad_slices(depth, tiles, device.gpu.sm_count as usize);
    let dw_parts = device.alloc(NAME, slices * outputs * taps)?;
    let db_parts = if with_bias { Some(device.alloc(NAME, slices * outputs)?) } else { None };
    let grid = conv_grid(NAME, tile, (outputs, columns), slices)?;
    let args = [
        device.arg(dy),
        device.arg(x),
        device.arg(&dw_parts),
        optional(device, db_parts.as_ref()),
        Arg::i32(int(NAME, per_slice)?),
    ];
    let shared = conv_shared(device, tile, taps);
    device.launch_struct(NAME, &device.kernels.conv_grad_weight[tile], (grid, shared), sizes, &args)?;
    Ok((dw_parts, db_parts, slices))
}

/// How the weight gradient's product of `tiles` tiles cuts its `depth` positions on `sms` SMs: (positions a
/// slice, slices), slices enough for 4 blocks an SM (`slices_for`), each 256 positions deep or more, the last
/// one the shorter and none empty.
fn weight_grad_slices(depth: usize, tiles: usize, sms: usize) -> (usize, usize) {
    let per_slice = depth.div_ceil(slices_for(sms, tiles, depth, (4, 256))).max(1);
    (per_slice, depth.div_ceil(per_slice).max(1))
}

/// `conv2d` through an explicit col (the module's doc): the bf16 path.
fn conv2d_im2col<F: Real>(
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
    // Windows that tile the input take a thread a window in the backward, else a thread an input element.
    let tiled = pool.stride == pool.kernel
        && pool.padding == 0
        && (pool.out_height * pool.kernel, pool.out_width * pool.kernel) == (pool.height, pool.width);
    // A ReLU's output is kept for the backward, which may take its slope (backward_fusion); no other input.
    let relu_out = Some(buffer(x)).filter(|b| b.slope_extra().is_some_and(|(code, _)| code == UNARY_RELU));
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        let d = &device_;
        let dx = d.alloc(NAME, input_count as usize)?;
        let (kernel, threads) = if tiled {
            (&d.kernels.max_pool_grad_tiled, output_count)
        } else {
            (&d.kernels.max_pool_grad, input_count)
        };
        // Where a ReLU made x and the pool is its one reader, dx is the ReLU's input's gradient (backward_fusion).
        let relu = relu_out.as_ref().filter(|x| d.take_slope(NAME, x, |code| code == UNARY_RELU).is_some());
        let args = [d.arg(grad), d.arg(&won), optional(d, relu), d.arg(&dx), Arg::i32(threads)];
        let args = [&args[..], &sizes].concat();
        d.launch(NAME, kernel, d.blocks_for(threads as usize), 0, &args)?;
        Ok(vec![Some(dx)])
    };
    Ok(Tensor::from_device_op(NAME, out, shape, &[x], Box::new(backward)))
}

#[cfg(test)]
mod tests {
    use super::{CONV_TAP_TABLE, ConvShape, Divisor, weight_grad_slices};
    use crate::device::compile::kernel_constants;
    use crate::device::kernel_struct::assert_kernel_layout;

    #[test]
    fn the_divisors_divide_as_integer_division() {
        let mut divisors: Vec<i32> = (1..=3000).collect();
        for k in 12..31 {
            divisors.extend([(1 << k) - 1, 1 << k, (1 << k) + 1, (1 << k) / 3 * 2 + 1]);
        }
        divisors.push(i32::MAX);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for d in divisors {
            let v = Divisor::of(d);
            let mut numerators = vec![0, 1, d - 1, d, i32::MAX, i32::MAX - 1, i32::MAX / d * d, (i32::MAX / d * d) - 1];
            for _ in 0..64 {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                numerators.push((state >> 33) as i32);
            }
            for n in numerators.into_iter().filter(|&n| n >= 0) {
                assert_eq!(v.divide(n), n / d, "{n} / {d} with {v:?}");
            }
        }
    }

    #[test]
    fn the_weight_gradients_slices_cover_the_positions_once() {
        for depth in [0, 1, 255, 256, 511, 6272, 99_991, 100_352, 1 << 24] {
            for (tiles, sms) in [(1, 132), (3, 132), (1, 1), (600, 132)] {
                let (per_slice, slices) = weight_grad_slices(depth, tiles, sms);
                let shape = format!("{depth} positions, {tiles} tiles, {sms} SMs: {slices} × {per_slice}");
                assert!(slices * per_slice >= depth, "{shape}: positions left out");
                assert!(depth == 0 || (slices - 1) * per_slice < depth, "{shape}: an empty slice");
                assert!(slices == 1 || per_slice >= 256, "{shape}: a slice under 256 deep");
                assert!(slices * tiles <= (4 * sms).max(tiles), "{shape}: more blocks than 4 an SM");
            }
        }
    }

    #[test]
    fn the_conv_sizes_are_the_kernel_files() {
        assert_kernel_layout::<Divisor>("nn", &[]);
        assert_kernel_layout::<ConvShape>("nn", &[]);
        let kernel = kernel_constants("nn", &[], &["CONV_TAP_TABLE", "sizeof(ConvTap)", "alignof(ConvTap)"]).unwrap();
        assert_eq!(kernel, [CONV_TAP_TABLE as i64, 16, 16]);
    }
}
