//! Each op's device forward and backward: the kernels of `fused/nn.cu` launched over device buffers, the
//! twins of the host loops in `nn/elementwise.rs`, `reduce.rs`, `matmul.rs`, `losses.rs` and `layout.rs`
//! (which validate the shapes first and call in here when their operands live on a GPU).
//!
//! A backward keeps the device buffers it reads (the inputs' snapshots, the output, a loss's saved
//! gradient), as the host closures keep their vectors.

use super::fusion::{CrossEntropyOut, CrossEntropySite, Extra, NormParams, Producer, Want};
use super::layers::draw_key;
use super::weight_grads::WeightGradJob;
use super::{Device, DeviceBuffer, FP32_TILES, TINY_TILE, Ticket, logit_block_rows};
use crate::device::launch::Arg;
use crate::nn::error::{Error, Result};
use crate::nn::shape::{broadcast_strides, contiguous_strides};
use crate::nn::tensor::{Storage, Tensor};
use crate::ops::cpu::Real;
use std::sync::Arc;

/// Kernel codes of fused/nn.cu (OP_* and UNARY_*).
pub(crate) const OP_ADD: i32 = 0;
pub(crate) const OP_SUB: i32 = 1;
pub(crate) const OP_MUL: i32 = 2;
pub(crate) const OP_DIV: i32 = 3;
pub(crate) const UNARY_RELU: i32 = 0;
pub(crate) const UNARY_SIGMOID: i32 = 1;
pub(crate) const UNARY_TANH: i32 = 2;
pub(crate) const UNARY_GELU: i32 = 3;
pub(crate) const UNARY_EXP: i32 = 4;
pub(crate) const UNARY_LOG: i32 = 5;
pub(crate) const UNARY_NEG: i32 = 6;
const UNARY_NONE: i32 = -1;
/// The widest rows of logits `nn_linear_cross_entropy` takes (its LINEAR_CROSS_ENTROPY_CLASSES).
const LINEAR_CROSS_ENTROPY_CLASSES: usize = 64;
/// The `row_scale` that has `nn_linear_cross_entropy` count the rows not ignored itself, every block over
/// all targets, and scale d by one over that count (its LINEAR_CROSS_ENTROPY_COUNT_ROWS).
const LINEAR_CROSS_ENTROPY_COUNT_ROWS: f32 = 0.0;
/// The most rows it counts so (its LINEAR_CROSS_ENTROPY_COUNTED_ROWS): each block reads every target.
const LINEAR_CROSS_ENTROPY_COUNTED_ROWS: usize = 8192;

/// The device buffer of a tensor that `place_of` found on the device.
pub(super) fn buffer<F: Real>(tensor: &Tensor<F>) -> DeviceBuffer {
    match &*tensor.storage() {
        Storage::Device(buffer) => buffer.clone(),
        Storage::Host(_) => panic!("internal: a device op was given a host tensor"),
    }
}

/// A size as a kernel's `int`, or an error naming the op when it does not fit.
pub(super) fn int(op: &'static str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::device(op, format!("{n} elements are more than a kernel's int indexes")))
}

/// An output shape and one stride list per operand (0 along broadcast axes), merged to at most four axes:
/// neighbours merge where every operand walks them as one (contiguously, or both broadcast).
fn four_axes(op: &'static str, shape: &[usize], strides: &[Vec<usize>]) -> Result<([i32; 4], Vec<[i32; 4]>)> {
    let mut dims: Vec<usize> = Vec::new();
    let mut merged: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for (axis, &size) in shape.iter().enumerate() {
        if size == 1 {
            continue;
        }
        let joins = !dims.is_empty()
            && strides.iter().zip(&merged).all(|(s, m)| {
                let last = *m.last().expect("merged in step with dims");
                s[axis] * size == last || (s[axis] == 0 && last == 0)
            });
        if joins {
            *dims.last_mut().expect("non-empty") *= size;
            merged.iter_mut().zip(strides).for_each(|(m, s)| *m.last_mut().expect("non-empty") = s[axis]);
        } else {
            dims.push(size);
            merged.iter_mut().zip(strides).for_each(|(m, s)| m.push(s[axis]));
        }
    }
    if dims.len() > 4 {
        return Err(Error::device(op, format!("the shape {shape:?} broadcasts over more than four separate axes")));
    }
    let pad = 4 - dims.len();
    let mut out_dims = [1i32; 4];
    for (i, &d) in dims.iter().enumerate() {
        out_dims[pad + i] = int(op, d)?;
    }
    let mut out_strides = Vec::new();
    for m in merged {
        let mut s = [0i32; 4];
        for (i, &v) in m.iter().enumerate() {
            s[pad + i] = int(op, v)?;
        }
        out_strides.push(s);
    }
    Ok((out_dims, out_strides))
}

fn words(values: &[i32]) -> impl Iterator<Item = Arg> + '_ {
    values.iter().map(|&v| Arg::i32(v))
}

/// `nn_binary` over `n` outputs of the four axes `dims`, each operand read through its strides.
pub(super) fn launch_binary(
    device: &Arc<Device>,
    name: &'static str,
    code: i32,
    (a, b): (&DeviceBuffer, &DeviceBuffer),
    n: usize,
    (dims, strides): ([i32; 4], [[i32; 4]; 2]),
) -> Result<DeviceBuffer> {
    let out = device.alloc(name, n)?;
    let head = [Arg::i32(code), device.arg(a), device.arg(b), device.arg(&out), Arg::i32(int(name, n)?)];
    let [d, s, t] = [dims, strides[0], strides[1]].map(|w| w.map(Arg::i32));
    let args: [Arg; 17] = std::array::from_fn(|i| match i {
        0..5 => head[i],
        5..9 => d[i - 5],
        9..13 => s[i - 9],
        _ => t[i - 13],
    });
    device.launch(name, &device.kernels.binary, device.blocks_for(n), 0, &args)?;
    Ok(out)
}

/// a + b of `n` elements each, and its ReLU, which the sum's output carries for the ReLU that reads it
/// (capture-time fusion: `nn_add_relu`).
fn add_relu(
    device: &Arc<Device>,
    name: &'static str,
    (a, b): (&DeviceBuffer, &DeviceBuffer),
    n: usize,
) -> Result<DeviceBuffer> {
    let (out, activated) = (device.alloc(name, n)?, device.alloc(name, n)?);
    let args = [device.arg(a), device.arg(b), device.arg(&out), device.arg(&activated), Arg::i32(int(name, n)?)];
    device.launch(name, &device.kernels.add_relu, device.blocks_for(n), 0, &args)?;
    out.attach(Extra::Activation { code: UNARY_RELU, out: activated, by: name });
    Ok(out)
}

/// a + b of `n` elements each, with the op that reads it, when its `producer` recorded one: the LayerNorm,
/// or the ReLU, made by the convolution that made one operand (which took the other into its stores) or
/// here (`nn_add_relu`). None: a plain sum. Records what this add wants of its operands' producers.
fn fused_sum(
    device: &Arc<Device>,
    name: &'static str,
    producer: Option<&Producer>,
    (x, y): (&DeviceBuffer, &DeviceBuffer),
    n: usize,
) -> Result<Option<DeviceBuffer>> {
    let norm = producer.and_then(Producer::layer_norm).filter(|(p, _)| p.width > 0 && n.is_multiple_of(p.width));
    let norm = norm.and_then(|(params, with_bf16)| Some((params.buffers(device)?, params, with_bf16)));
    let relu = norm.is_none() && producer.and_then(Producer::activation) == Some((UNARY_RELU, false));
    if let Some(reader) = producer.map(|p| p.number) {
        for (mine, other) in [(x, y), (y, x)] {
            if let Some(other) = other.made_by() {
                device.want(mine, Want::Residual { other, reader });
            }
        }
    }
    let summed = relu.then(|| x.residual_extra(y).or_else(|| y.residual_extra(x))).flatten();
    Ok(match (norm, summed) {
        (Some((buffers, params, with_bf16)), _) => {
            Some(add_layer_norm(device, (x, y), n, (params, buffers), with_bf16)?)
        }
        (None, Some((sum, activated))) => {
            device.fused("conv2d → add → relu: the residual sum and its ReLU in the convolution's stores".into());
            sum.attach(Extra::Activation { code: UNARY_RELU, out: activated, by: name });
            Some(sum)
        }
        (None, None) if relu => Some(add_relu(device, name, (x, y), n)?),
        (None, None) => None,
    })
}

/// a + b, with a contiguous of `shape` (four axes) and b holding only the axes where `kept` is true (a
/// bias along the channels: [false, true, false, false]); one launch, recorded for no backward (the op
/// calling it gives b its gradient).
pub(super) fn add_broadcast(
    device: &Arc<Device>,
    name: &'static str,
    (a, b): (&DeviceBuffer, &DeviceBuffer),
    shape: &[usize; 4],
    kept: [bool; 4],
) -> Result<DeviceBuffer> {
    let b_shape = shape.iter().zip(kept).map(|(&d, k)| if k { d } else { 1 }).collect::<Vec<_>>();
    let b_strides = contiguous_strides(&b_shape).iter().zip(kept).map(|(&s, k)| if k { s } else { 0 }).collect();
    let (dims, strides) = four_axes(name, shape, &[contiguous_strides(shape), b_strides])?;
    launch_binary(device, name, OP_ADD, (a, b), shape.iter().product(), (dims, [strides[0], strides[1]]))
}

/// `a op b` broadcast to `shape`.
pub(crate) fn binary<F: Real>(
    device: &Arc<Device>,
    name: &'static str,
    code: i32,
    (a, b): (&Tensor<F>, &Tensor<F>),
    shape: Vec<usize>,
) -> Result<Tensor<F>> {
    let n: usize = shape.iter().product();
    // Operands of the output's shape walk it as one axis (what four_axes would merge them into), without
    // the strides' arithmetic: an eager op's host time is most of its time.
    let (dims, operand_strides) = if a.shape() == shape.as_slice() && b.shape() == shape.as_slice() {
        ([1, 1, 1, int(name, n)?], vec![[0, 0, 0, 1]; 2])
    } else {
        let strides = [broadcast_strides(a.shape(), &shape), broadcast_strides(b.shape(), &shape)];
        four_axes(name, &shape, &strides)?
    };
    let (x, y) = (buffer(a), buffer(b));
    let counts = [a.numel(), b.numel()];
    // A sum of two operands of one shape may be made with the op that reads it (capture-time fusion).
    let producer = if code == OP_ADD && counts == [n, n] { device.producer(name) } else { None };
    let out = match fused_sum(device, name, producer.as_ref(), (&x, &y), n)? {
        Some(out) => out,
        None => launch_binary(device, name, code, (&x, &y), n, (dims, [operand_strides[0], operand_strides[1]]))?,
    };
    out.made_by_producer(producer.as_ref());
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, needs: &[bool]| {
        let mut grads = Vec::new();
        for which in 0..2 {
            if !needs[which] {
                grads.push(None);
                continue;
            }
            // An operand of a sum (or the first of a difference) that was not broadcast gets the gradient
            // itself: gradients are never changed in place, so sharing the buffer is safe.
            if counts[which] == n && (code == OP_ADD || (code == OP_SUB && which == 0)) {
                grads.push(Some(grad.clone()));
                continue;
            }
            let g = device_.alloc(name, counts[which])?;
            let mut args = vec![Arg::i32(code), Arg::i32(which as i32), device_.arg(&x), device_.arg(&y)];
            args.extend([device_.arg(grad), device_.arg(&g), Arg::i32(counts[which] as i32)]);
            args.extend(words(&dims).chain(words(&operand_strides[0])).chain(words(&operand_strides[1])));
            device_.launch(name, &device_.kernels.binary_grad, device_.blocks_for(counts[which]), 0, &args)?;
            grads.push(Some(g));
        }
        Ok(grads)
    };
    Ok(Tensor::from_device_op(name, out, shape, &[a, b], Box::new(backward)))
}

/// a + b (n elements each) in a new buffer, made by `nn_layer_norm` with the LayerNorm of the sum that a
/// reader wanted (`params`, whose weight and bias are `buffers`; its bf16 copy too when `with_bf16`),
/// attached to the sum for that reader.
fn add_layer_norm(
    device: &Arc<Device>,
    (a, b): (&DeviceBuffer, &DeviceBuffer),
    n: usize,
    (params, (weight, bias)): (NormParams, (Option<DeviceBuffer>, Option<DeviceBuffer>)),
    with_bf16: bool,
) -> Result<DeviceBuffer> {
    const NAME: &str = "add";
    let rows = n / params.width;
    let (sum, y) = (device.alloc(NAME, n)?, device.alloc(NAME, n)?);
    let (mean, rstd) = (device.alloc(NAME, rows)?, device.alloc(NAME, rows)?);
    let copy = if with_bf16 { Some(bf16_buffer(device, NAME, n)?) } else { None };
    let args = [device.arg(a), device.arg(b), device.arg(&sum), optional(device, weight.as_ref())];
    let more = [optional(device, bias.as_ref()), device.arg(&y), optional(device, copy.as_ref()), device.arg(&mean)];
    let sizes = [device.arg(&rstd), Arg::i32(int(NAME, rows)?), Arg::i32(int(NAME, params.width)?)];
    let args = [&args[..], &more, &sizes, &[Arg::f32(params.eps)]].concat();
    device.launch(NAME, &device.kernels.layer_norm, warp_row_blocks(rows), 0, &args)?;
    if let Some(copy) = copy {
        y.attach(Extra::Bf16(copy));
    }
    sum.attach(Extra::LayerNorm { params, y, mean, rstd });
    Ok(sum)
}

/// `x op value` (`value op x` when `reversed`), a scalar kept on the host side of the launch.
pub(crate) fn scalar<F: Real>(
    device: &Arc<Device>,
    name: &'static str,
    code: i32,
    x: &Tensor<F>,
    value: f32,
    reversed: bool,
) -> Result<Tensor<F>> {
    let n = x.numel();
    let input = buffer(x);
    let out = device.alloc(name, n)?;
    let args = [Arg::i32(code), Arg::i32(reversed as i32), device.arg(&input), Arg::f32(value)];
    let args = [&args[..], &[device.arg(&out), Arg::i32(int(name, n)?)]].concat();
    device.launch(name, &device.kernels.scalar, device.blocks_for(n), 0, &args)?;
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        let dx = device_.alloc(name, n)?;
        let args = [Arg::i32(code), Arg::i32(reversed as i32), device_.arg(&input), Arg::f32(value)];
        let args = [&args[..], &[device_.arg(grad), device_.arg(&dx), Arg::i32(n as i32)]].concat();
        device_.launch(name, &device_.kernels.scalar_grad, device_.blocks_for(n), 0, &args)?;
        Ok(vec![Some(dx)])
    };
    Ok(Tensor::from_device_op(name, out, x.shape().to_vec(), &[x], Box::new(backward)))
}

/// A unary map (UNARY_* code) elementwise.
pub(crate) fn unary<F: Real>(device: &Arc<Device>, name: &'static str, code: i32, x: &Tensor<F>) -> Result<Tensor<F>> {
    let n = x.numel();
    let input = buffer(x);
    let producer = device.producer(name);
    let reader = producer.as_ref().map_or(usize::MAX, |p| p.number);
    device.want(&input, Want::Activation { code, reader, bf16: false });
    let out = match input.activation_extra(code) {
        Some((out, by)) => {
            device.fused(format!("{by} → {name}: the activation in {by}'s epilogue"));
            out
        }
        None => {
            let out = device.alloc(name, n)?;
            let args = [Arg::i32(code), device.arg(&input), device.arg(&out), Arg::i32(int(name, n)?)];
            device.launch(name, &device.kernels.unary, device.blocks_for(n), 0, &args)?;
            out
        }
    };
    out.made_by_producer(producer.as_ref());
    out.attach(Extra::Slope { code, input: input.downgrade() });
    let (device_, output) = (Arc::clone(device), out.clone());
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        let dx = device_.alloc(name, n)?;
        let args = [Arg::i32(code), device_.arg(&input), device_.arg(&output), device_.arg(grad)];
        let args = [&args[..], &[device_.arg(&dx), Arg::i32(n as i32)]].concat();
        device_.launch(name, &device_.kernels.unary_grad, device_.blocks_for(n), 0, &args)?;
        Ok(vec![Some(dx)])
    };
    Ok(Tensor::from_device_op(name, out, x.shape().to_vec(), &[x], Box::new(backward)))
}

/// Σ (or the mean) along the middle axis of x seen as (outer, n, inner), into `shape`.
pub(crate) fn reduce<F: Real>(
    device: &Arc<Device>,
    name: &'static str,
    x: &Tensor<F>,
    (outer, n, inner): (usize, usize, usize),
    mean: bool,
    shape: Vec<usize>,
) -> Result<Tensor<F>> {
    let scale = if mean { 1.0 / n as f32 } else { 1.0 };
    let out = sum_axis(device, name, &buffer(x), (outer, n, inner), scale)?;
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        let count = outer * n * inner;
        let dx = device_.alloc(name, count)?;
        let args = [device_.arg(grad), device_.arg(&dx), Arg::i32(outer as i32), Arg::i32(n as i32)];
        let args = [&args[..], &[Arg::i32(inner as i32), Arg::f32(scale)]].concat();
        device_.launch(name, &device_.kernels.expand_axis, device_.blocks_for(count), 0, &args)?;
        Ok(vec![Some(dx)])
    };
    Ok(Tensor::from_device_op(name, out, shape, &[x], Box::new(backward)))
}

/// Rows a thread sums in the first pass of a sum over an axis of `n` into `outputs` sums, or `n` for one
/// pass: parts enough for about 64k threads when the outputs alone are fewer, of 32 rows or more.
pub(super) fn rows_per_part(n: usize, outputs: usize) -> usize {
    const THREADS_WANTED: usize = 1 << 16;
    let parts = (THREADS_WANTED / outputs.max(1)).clamp(1, (n / 32).max(1));
    n.div_ceil(parts).max(1)
}

/// scale · Σ along the middle axis of `x` (outer, n, inner): a block a row when the axis is the last,
/// else a thread an output — after a first pass over parts of the axis when it is long and the outputs few
/// (`rows_per_part`), whose parts are then added in order.
pub(super) fn sum_axis(
    device: &Arc<Device>,
    name: &'static str,
    x: &DeviceBuffer,
    (outer, n, inner): (usize, usize, usize),
    scale: f32,
) -> Result<DeviceBuffer> {
    let out = device.alloc(name, outer * inner)?;
    sum_axis_into(device, name, x, (outer, n, inner), scale, &out)?;
    Ok(out)
}

/// `sum_axis` into `out` (outer·inner elements).
pub(super) fn sum_axis_into(
    device: &Arc<Device>,
    name: &'static str,
    x: &DeviceBuffer,
    (outer, n, inner): (usize, usize, usize),
    scale: f32,
    out: &DeviceBuffer,
) -> Result<()> {
    if inner == 1 {
        let args = [device.arg(x), device.arg(out), Arg::i32(int(name, n)?), Arg::f32(scale)];
        return device.launch(name, &device.kernels.sum_rows, (int(name, outer.max(1))? as u32, 1), 0, &args);
    }
    let outputs = outer * inner;
    let per_part = rows_per_part(n, outputs);
    let (x, (outer, n, inner)) = if per_part < n {
        let parts = n.div_ceil(per_part);
        let partial = device.alloc(name, parts * outputs)?;
        let args = [device.arg(x), device.arg(&partial), Arg::i32(int(name, outer)?), Arg::i32(int(name, n)?)];
        let args = [&args[..], &[Arg::i32(int(name, inner)?), Arg::i32(int(name, per_part)?)]].concat();
        device.launch(name, &device.kernels.sum_axis_parts, device.blocks_for(parts * outputs), 0, &args)?;
        (partial, (1, parts, outputs))
    } else {
        (x.clone(), (outer, n, inner))
    };
    let args = [device.arg(&x), device.arg(out), Arg::i32(int(name, outer)?), Arg::i32(int(name, n)?)];
    let args = [&args[..], &[Arg::i32(int(name, inner)?), Arg::f32(scale)]].concat();
    device.launch(name, &device.kernels.sum_axis, device.blocks_for(outer * inner), 0, &args)
}

/// A weight gradient's `slices` slices added (`nn_sum_slices`, one launch): `dw_parts` `[slices, dw.len]` into
/// `dw`, and `db_parts` `[slices, db.len]` into `db` where both are given.
pub(super) fn sum_slices(
    device: &Arc<Device>,
    name: &'static str,
    (dw_parts, dw): (&DeviceBuffer, &DeviceBuffer),
    db: Option<(&DeviceBuffer, &DeviceBuffer)>,
    slices: usize,
) -> Result<()> {
    /// fused/nn.cu's SUM_SLICES_COLUMNS: the columns a block adds.
    const COLUMNS: usize = 8;
    let width = dw.len() + db.map_or(0, |(_, db)| db.len());
    let args = [
        device.arg(dw_parts),
        device.arg(dw),
        Arg::i32(int(name, dw.len())?),
        optional(device, db.map(|(parts, _)| parts)),
        optional(device, db.map(|(_, db)| db)),
        Arg::i32(int(name, width - dw.len())?),
        Arg::i32(int(name, slices)?),
    ];
    let blocks = (int(name, width.div_ceil(COLUMNS).max(1))? as u32, 1);
    device.launch(name, &device.kernels.sum_slices, blocks, 0, &args)
}

/// Blocks of `nn_softmax_rows` and `nn_cross_entropy`: a warp a row, eight a block.
pub(super) fn warp_row_blocks(rows: usize) -> (u32, u32) {
    (rows.div_ceil(8).max(1) as u32, 1)
}

/// softmax (or log_softmax when `log`) over the last axis, rows of `n`.
pub(crate) fn softmax<F: Real>(
    device: &Arc<Device>,
    name: &'static str,
    x: &Tensor<F>,
    n: usize,
    log: bool,
) -> Result<Tensor<F>> {
    let rows = x.numel() / n.max(1);
    let out = device.alloc(name, x.numel())?;
    let args = [device.arg(&buffer(x)), device.arg(&out), Arg::i32(int(name, rows)?), Arg::i32(int(name, n)?)];
    let args = [&args[..], &[Arg::i32(log as i32)]].concat();
    device.launch(name, &device.kernels.softmax_rows, warp_row_blocks(rows), 0, &args)?;
    let (device_, output) = (Arc::clone(device), out.clone());
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        let dx = device_.alloc(name, rows * n)?;
        let args = [device_.arg(&output), device_.arg(grad), device_.arg(&dx), Arg::i32(rows as i32)];
        let args = [&args[..], &[Arg::i32(n as i32), Arg::i32(log as i32)]].concat();
        device_.launch(name, &device_.kernels.softmax_rows_grad, warp_row_blocks(rows), 0, &args)?;
        Ok(vec![Some(dx)])
    };
    Ok(Tensor::from_device_op(name, out, x.shape().to_vec(), &[x], Box::new(backward)))
}

/// One product C = op(A)·op(B) per batch: M×N results, K deep, A read at z·stride_a, B at z·stride_b; on
/// the bf16 tensor cores when the device's precision says so (each operand rounded once first).
#[allow(clippy::too_many_arguments)]
fn matmul_into(
    device: &Arc<Device>,
    name: &'static str,
    (a, b, c): (&DeviceBuffer, &DeviceBuffer, &DeviceBuffer),
    (m, n, k): (usize, usize, usize),
    batches: usize,
    (stride_a, stride_b): (usize, usize),
    (trans_a, trans_b): (bool, bool),
) -> Result<()> {
    if device.bf16_products() {
        let (a16, b16) = (rounded_bf16(name, a)?, rounded_bf16(name, b)?);
        return product_bf16(
            device,
            name,
            (&a16, &b16, c),
            (m, n, k),
            batches,
            (stride_a, stride_b),
            (trans_a, trans_b),
            None,
        );
    }
    let slices = if batches == 1 { fp32_k_slices(device, (m, n), k) } else { 1 };
    if slices > 1 {
        // Each slice of k a batch (nn_matmul's ld), then the slices' products summed in order.
        let part = k / slices;
        let (step_a, step_b) = (if trans_a { part * m } else { part }, if trans_b { part } else { part * n });
        let parts = device.alloc(name, slices * m * n)?;
        launch_matmul(device, name, (a, b, &parts), (m, n, part, k), slices, (step_a, step_b), (trans_a, trans_b))?;
        return sum_axis_into(device, name, &parts, (1, slices, m * n), 1.0, c);
    }
    launch_matmul(device, name, (a, b, c), (m, n, k, k), batches, (stride_a, stride_b), (trans_a, trans_b))
}

/// How many slices of k an fp32 product of one m×n result over `k` is cut into: `k_slices` for its
/// smallest tile's grid, but a number of slices that divides k (nn_matmul's slices are equal); 1 when none
/// does.
fn fp32_k_slices(device: &Device, (m, n): (usize, usize), k: usize) -> usize {
    let (x, y) = grid_of(FP32_TILES[TINY_TILE], (m, n), 1);
    (1..=k_slices(device, x * y, k, 4)).rev().find(|&s| k.is_multiple_of(s)).unwrap_or(1)
}

/// One launch of `nn_matmul`: `batches` products of m×n over `k`, k-contiguous operands' rows `ld` long.
fn launch_matmul(
    device: &Arc<Device>,
    name: &'static str,
    (a, b, c): (&DeviceBuffer, &DeviceBuffer, &DeviceBuffer),
    (m, n, k, ld): (usize, usize, usize, usize),
    batches: usize,
    (stride_a, stride_b): (usize, usize),
    (trans_a, trans_b): (bool, bool),
) -> Result<()> {
    let (tile, blocks) = fp32_tile(device, name, (m, n), batches)?;
    let mut sizes = [m, n, k, ld, stride_a, stride_b].map(|v| int(name, v)).into_iter().collect::<Result<Vec<_>>>()?;
    sizes.extend([trans_a as i32, trans_b as i32]);
    let args = [&[device.arg(a), device.arg(b), device.arg(c)][..], &words(&sizes).collect::<Vec<_>>()].concat();
    device.launch(name, &device.kernels.matmul[tile], blocks, device.gemm_shared[tile], &args)
}

/// The tile of an fp32 product of `batches` M×N results (its place in [`FP32_TILES`]) and its grid
/// (⌈N/BN⌉, ⌈M/BM⌉·batches): the largest tile whose grid has a block for every SM, else the smallest, so
/// that a product of few outputs over a long k still runs on every SM.
pub(super) fn fp32_tile(
    device: &Device,
    name: &'static str,
    (m, n): (usize, usize),
    batches: usize,
) -> Result<(usize, (u32, u32))> {
    let tile = filling_tile(device, |t| {
        let (x, y) = grid_of(t, (m, n), batches);
        x * y
    });
    Ok((tile, fp32_grid(name, tile, (m, n), batches)?))
}

/// The grid (⌈N/BN⌉, ⌈M/BM⌉·batches) of `batches` M×N products in `tile`.
pub(super) fn grid_of((bm, bn, ..): Fp32Tile, (m, n): (usize, usize), batches: usize) -> (usize, usize) {
    (n.div_ceil(bn).max(1), m.div_ceil(bm).max(1) * batches.max(1))
}

/// `grid_of` the fp32 tile at `tile`, as a launch's grid.
fn fp32_grid(name: &'static str, tile: usize, sizes: (usize, usize), batches: usize) -> Result<(u32, u32)> {
    let (x, y) = grid_of(FP32_TILES[tile], sizes, batches);
    Ok((int(name, x)? as u32, int(name, y)? as u32))
}

/// An fp32 product tile: rows, columns, depth staged, rows a thread, columns a thread.
type Fp32Tile = (usize, usize, usize, usize, usize);

/// The place in [`FP32_TILES`] of the largest tile for which `blocks` (a launch's blocks with that tile)
/// gives every SM a block, else the smallest's.
fn filling_tile(device: &Device, blocks: impl Fn(Fp32Tile) -> usize) -> usize {
    filling_tile_waves(device, 1, blocks)
}

/// [`filling_tile`] for a launch that gives every SM `waves` blocks.
fn filling_tile_waves(device: &Device, waves: usize, blocks: impl Fn(Fp32Tile) -> usize) -> usize {
    let sms = device.gpu.sm_count as usize;
    FP32_TILES.iter().position(|&t| blocks(t) >= waves * sms).unwrap_or(TINY_TILE)
}

/// The address of an optional buffer, null when absent (a kernel's optional operand).
pub(super) fn optional(device: &Device, buffer: Option<&DeviceBuffer>) -> Arg {
    buffer.map_or(Arg::Ptr(0), |b| device.arg(b))
}

/// A buffer for `n` bf16 values, two to a float.
pub(super) fn bf16_buffer(device: &Arc<Device>, name: &'static str, n: usize) -> Result<DeviceBuffer> {
    device.alloc(name, n.div_ceil(2))
}

/// `x` rounded to bf16 (to nearest even) in a new buffer, two values to a float: a bf16 product's operand.
fn rounded_bf16(name: &'static str, x: &DeviceBuffer) -> Result<DeviceBuffer> {
    let device = x.device();
    let out = bf16_buffer(device, name, x.len())?;
    let args = [device.arg(x), device.arg(&out), Arg::i32(int(name, x.len())?)];
    device.launch(name, &device.kernels.to_bf16, device.blocks_for(x.len()), 0, &args)?;
    Ok(out)
}

/// The slices of k a product of `tiles` tiles is cut into: 1 when its tiles give every SM `per_sm` blocks or
/// k is short; otherwise enough for about `per_sm` blocks an SM, each slice 512 deep or more. The bf16
/// products (`nn_product_bf16`'s split k) take 2 an SM, the fp32 ones, whose small tiles wait on memory
/// more, 4.
fn k_slices(device: &Device, tiles: usize, k: usize, per_sm: usize) -> usize {
    slices_for(device.gpu.sm_count as usize, tiles, k, (per_sm, 512))
}

/// The slices of a depth `k` a product of `tiles` tiles on `sms` SMs is cut into: enough for about `per_sm`
/// blocks an SM, each `min_depth` deep or more; 1 when the tiles alone give every SM that many or k is short.
pub(super) fn slices_for(sms: usize, tiles: usize, k: usize, (per_sm, min_depth): (usize, usize)) -> usize {
    (per_sm * sms).div_ceil(tiles.max(1)).min(k / min_depth).max(1)
}

/// How `product_bf16` splits k: the slices and each one's depth (a whole number of the tile's 64-deep
/// chunks; one slice of all of k when unsplit). A product with a bias is never split.
fn bf16_split(device: &Device, (m, n, k): (usize, usize, usize), batches: usize, bias: bool) -> (usize, usize) {
    const TILE: usize = 128;
    let tiles = n.div_ceil(TILE).max(1) * m.div_ceil(TILE).max(1) * batches.max(1);
    let slices = if bias { 1 } else { k_slices(device, tiles, k, 2) };
    let k_per = if slices > 1 { k.div_ceil(slices).div_ceil(64) * 64 } else { k.max(1) };
    (k.div_ceil(k_per).max(1), k_per)
}

/// A linear layer's dx = dy·W in bf16 (`rows`×`inputs` results over `outputs`, unsplit), times the slope of
/// the activation `code` of `pre` that made the layer's input `x` (`nn_product_bf16_{act}_slope`).
fn product_bf16_slope(
    device: &Arc<Device>,
    (dy16, w16, dx): (&DeviceBuffer, &DeviceBuffer, &DeviceBuffer),
    (rows, inputs, outputs): (usize, usize, usize),
    (code, pre, x): (i32, &DeviceBuffer, &DeviceBuffer),
) -> Result<()> {
    const NAME: &str = "linear";
    let blocks = (int(NAME, inputs.div_ceil(128).max(1))? as u32, int(NAME, rows.div_ceil(128).max(1))? as u32);
    let args = [device.arg(dy16), device.arg(w16), device.arg(dx), device.arg(pre), device.arg(x)];
    let sizes = [int(NAME, rows)?, int(NAME, inputs)?, int(NAME, outputs)?];
    let args = [&args[..], &words(&sizes).collect::<Vec<_>>()].concat();
    let kernel = &device.kernels.product_bf16_slope[code as usize];
    device.launch(NAME, kernel, blocks, device.gemm_shared_bf16, &args)
}

/// `matmul_into`'s product from operands rounded to bf16 (`rounded_bf16`'s; strides in bf16 elements),
/// plus `bias` (of N, added in fp32) when given: `nn_product_bf16`, 128 × 128 tiles. A product of few
/// tiles over a long k (a weight's gradient over the batch's rows) is split in k, its slices' partial
/// products then added in order.
#[allow(clippy::too_many_arguments)]
fn product_bf16(
    device: &Arc<Device>,
    name: &'static str,
    (a16, b16, c): (&DeviceBuffer, &DeviceBuffer, &DeviceBuffer),
    (m, n, k): (usize, usize, usize),
    batches: usize,
    (stride_a, stride_b): (usize, usize),
    (trans_a, trans_b): (bool, bool),
    bias: Option<&DeviceBuffer>,
) -> Result<()> {
    const TILE: usize = 128;
    let (slices, k_per) = bf16_split(device, (m, n, k), batches, bias.is_some());
    let partial = if slices > 1 { Some(device.alloc(name, slices * batches * m * n)?) } else { None };
    let row_blocks = m.div_ceil(TILE).max(1) * batches.max(1) * slices;
    let blocks = (int(name, n.div_ceil(TILE).max(1))? as u32, int(name, row_blocks)? as u32);
    let out = partial.as_ref().unwrap_or(c);
    let mut args = vec![device.arg(a16), device.arg(b16), device.arg(out), optional(device, bias)];
    for size in [m, n, k, stride_a, stride_b, batches.max(1), k_per] {
        args.push(Arg::i32(int(name, size)?));
    }
    let kernel = &device.kernels.product_bf16[2 * trans_a as usize + trans_b as usize];
    device.launch(name, kernel, blocks, device.gemm_shared_bf16, &args)?;
    if let Some(partial) = partial {
        sum_axis_into(device, name, &partial, (1, slices, batches * m * n), 1.0, c)?;
    }
    Ok(())
}

/// A new buffer holding `matmul_into`'s products (batches·M·N results).
#[allow(clippy::too_many_arguments)]
pub(super) fn product(
    device: &Arc<Device>,
    name: &'static str,
    (a, b): (&DeviceBuffer, &DeviceBuffer),
    (m, n, k): (usize, usize, usize),
    batches: usize,
    strides: (usize, usize),
    trans: (bool, bool),
) -> Result<DeviceBuffer> {
    let c = device.alloc(name, batches * m * n)?;
    matmul_into(device, name, (a, b, &c), (m, n, k), batches, strides, trans)?;
    Ok(c)
}

/// The batched product of `matmul`: [batches, m, k] by [batches, k, n], an operand with `step` 0 shared.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul<F: Real>(
    device: &Arc<Device>,
    (a, b): (&Tensor<F>, &Tensor<F>),
    (m, k, n): (usize, usize, usize),
    batches: usize,
    (step_a, step_b): (usize, usize),
    shape: Vec<usize>,
) -> Result<Tensor<F>> {
    const NAME: &str = "matmul";
    let (x, y) = (buffer(a), buffer(b));
    let out = product(device, NAME, (&x, &y), (m, n, k), batches, (step_a, step_b), (false, false))?;
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, needs: &[bool]| {
        // dA = dC·Bᵀ; dB = Aᵀ·dC. A shared operand's gradient sums over the batches: the batches then
        // stack into one product's rows (B shared: dB = A_allᵀ·dC_all) or, for a shared A, into its depth.
        let grad_a = if !needs[0] {
            None
        } else if step_a == 0 && batches > 1 {
            // dA = Σ_z dC_z·B_zᵀ: [m, batches·n]·[batches·n, k] with the batches side by side in k.
            let stacked = stack_batches(&device_, grad, batches, m, n)?;
            let b_rows = transpose_batches(&device_, &y, batches, k, n)?;
            Some(product(&device_, NAME, (&stacked, &b_rows), (m, k, batches * n), 1, (0, 0), (false, false))?)
        } else {
            Some(product(&device_, NAME, (grad, &y), (m, k, n), batches, (m * n, step_b), (false, true))?)
        };
        let grad_b = if !needs[1] {
            None
        } else if step_b == 0 && batches > 1 {
            // dB = Σ_z A_zᵀ·dC_z = A_allᵀ·dC_all over the stacked rows (A batched, contiguous).
            Some(product(&device_, NAME, (&x, grad), (k, n, batches * m), 1, (0, 0), (true, false))?)
        } else {
            Some(product(&device_, NAME, (&x, grad), (k, n, m), batches, (step_a, m * n), (true, false))?)
        };
        Ok(vec![grad_a, grad_b])
    };
    Ok(Tensor::from_device_op(NAME, out, shape, &[a, b], Box::new(backward)))
}

/// [batches, m, n] as [m, batches·n] (each batch's columns side by side).
fn stack_batches(device: &Arc<Device>, x: &DeviceBuffer, batches: usize, m: usize, n: usize) -> Result<DeviceBuffer> {
    // out[i, z·n + j] = x[z, i, j]: out axes (m, batches, n) read with strides (n, m·n, 1).
    gather(device, "matmul", x, &[m, batches, n], &[n, m * n, 1])
}

/// [batches, k, n] as [batches·n, k] (each batch transposed, stacked).
fn transpose_batches(
    device: &Arc<Device>,
    x: &DeviceBuffer,
    batches: usize,
    k: usize,
    n: usize,
) -> Result<DeviceBuffer> {
    // out[z·n + j, i] = x[z, i, j]: out axes (batches, n, k) read with strides (k·n, 1, n).
    gather(device, "matmul", x, &[batches, n, k], &[k * n, 1, n])
}

/// out[e] = x[offset of e] for an output of `shape` read through `strides` (up to four axes after merging).
pub(crate) fn gather(
    device: &Arc<Device>,
    name: &'static str,
    x: &DeviceBuffer,
    shape: &[usize],
    strides: &[usize],
) -> Result<DeviceBuffer> {
    let n: usize = shape.iter().product();
    let (dims, s) = four_axes(name, shape, &[strides.to_vec()])?;
    let out = device.alloc(name, n)?;
    let mut args = vec![device.arg(x), device.arg(&out), Arg::i32(int(name, n)?)];
    args.extend(words(&dims).chain(words(&s[0])));
    device.launch(name, &device.kernels.gather, device.blocks_for(n), 0, &args)?;
    Ok(out)
}

/// `x` with its elements reordered to `shape` through `strides` (a transpose), and the backward that reads
/// the gradient back through `back_strides` into `x`'s shape.
pub(crate) fn reorder<F: Real>(
    device: &Arc<Device>,
    name: &'static str,
    x: &Tensor<F>,
    (shape, strides): (Vec<usize>, Vec<usize>),
    back_strides: Vec<usize>,
) -> Result<Tensor<F>> {
    let out = gather(device, name, &buffer(x), &shape, &strides)?;
    let (device_, in_shape) = (Arc::clone(device), x.shape().to_vec());
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        Ok(vec![Some(gather(&device_, name, grad, &in_shape, &back_strides)?)])
    };
    Ok(Tensor::from_device_op(name, out, shape, &[x], Box::new(backward)))
}

/// The same elements in another shape (no copy), whose gradient is the output's.
pub(crate) fn reshape<F: Real>(x: &Tensor<F>, shape: Vec<usize>) -> Tensor<F> {
    let backward = |grad: &DeviceBuffer, _needs: &[bool]| Ok(vec![Some(grad.clone())]);
    Tensor::from_device_op("reshape", buffer(x), shape, &[x], Box::new(backward))
}

/// y = x·wᵀ + b: x as [rows, inputs], w [outputs, inputs], the bias added in the product's epilogue. In
/// bf16, x and w are rounded once and their copies kept for the backward, whose two products share the
/// gradient's one rounded copy.
pub(crate) fn linear<F: Real>(
    device: &Arc<Device>,
    (x, weight, bias): (&Tensor<F>, &Tensor<F>, Option<&Tensor<F>>),
    (rows, inputs, outputs): (usize, usize, usize),
    shape: Vec<usize>,
) -> Result<Tensor<F>> {
    const NAME: &str = "linear";
    let (xb, wb) = (buffer(x), buffer(weight));
    let bias_buffer = bias.map(buffer);
    let producer = device.producer(NAME);
    let out = device.alloc(NAME, rows * outputs)?;
    let rounded = if device.bf16_products() {
        device.want(&xb, Want::Bf16);
        let x16 = match xb.bf16_extra() {
            Some(copy) => {
                device.fused("→ linear: the bf16 operand written by the op that made it".into());
                copy
            }
            None => rounded_bf16(NAME, &xb)?,
        };
        Some((x16, rounded_bf16(NAME, &wb)?))
    } else {
        None
    };
    // The activation a reader wanted (capture-time fusion), into a buffer of its own: `out` keeps x·Wᵀ + b.
    let bf16_epilogue = |code: i32| usize::try_from(code).ok().and_then(|c| device.kernels.product_bf16_act.get(c));
    let activation = producer
        .as_ref()
        .and_then(Producer::activation)
        .filter(|&(code, _)| rounded.is_none() || bf16_epilogue(code).is_some());
    let activated = activation.map(|_| device.alloc(NAME, rows * outputs)).transpose()?;
    // Or the dropout a reader wanted: its key drawn now, `out` dropped into a buffer of its own.
    let dropout = match (activation, producer.as_ref().and_then(Producer::dropout)) {
        (None, Some(site)) => match site.step.upgrade(device) {
            Some(step) => {
                let key = draw_key(device, &step, site.site_seed)?;
                Some((site, device.alloc(NAME, rows * outputs)?, key))
            }
            None => None,
        },
        _ => None,
    };
    // Or the cross-entropy a reader wanted, of logits no wider than nn_linear_cross_entropy's rows, against
    // targets in one of the step's inputs.
    let wanted = producer.as_ref().and_then(Producer::cross_entropy);
    let cross_entropy = match (&rounded, activation, &dropout, wanted.map(|w| (w, device.step_input(w.input)))) {
        (None, None, None, Some((site, Some(targets))))
            if (site.rows, site.classes) == (rows, outputs)
                && outputs <= LINEAR_CROSS_ENTROPY_CLASSES
                && (site.row_scale != LINEAR_CROSS_ENTROPY_COUNT_ROWS || rows <= LINEAR_CROSS_ENTROPY_COUNTED_ROWS) =>
        {
            Some((site, targets, cross_entropy_buffers(device, rows, outputs)?))
        }
        _ => None,
    };
    // With x needing a gradient, the loss kernel also forms this layer's dx as nn_linear_grad's tile would
    // (times the slope of the activation that made x, where the backward may take it): the backward then
    // launches dW and db only.
    let bias_needs_grad = bias.is_some_and(|b| b.requires_grad());
    let fused_dx = match (&cross_entropy, xb.slope_extra()) {
        (Some((.., ce)), slope) if slope.is_some() || x.requires_grad() => {
            let tile = linear_grad_tile(device, (rows, inputs, outputs), bias_needs_grad);
            Some(FusedDx { dx: device.alloc(NAME, rows * inputs)?, d: ce.d.clone(), slope, tile })
        }
        _ => None,
    };
    let drop_args = match &dropout {
        Some((site, dropped, key)) => {
            [device.arg(dropped), device.arg(key), Arg::u32(site.threshold), Arg::f32(site.scale)]
        }
        None => [Arg::Ptr(0), Arg::Ptr(0), Arg::u32(0), Arg::f32(0.0)],
    };
    let bias_arg = optional(device, bias_buffer.as_ref());
    let bf16_blocks = || -> Result<(u32, u32)> {
        Ok((int(NAME, outputs.div_ceil(128).max(1))? as u32, int(NAME, rows.div_ceil(128).max(1))? as u32))
    };
    let sizes = [int(NAME, rows)?, int(NAME, outputs)?, int(NAME, inputs)?];
    match (&rounded, activation, &activated) {
        (Some((x16, w16)), Some((code, with_bf16)), Some(activated)) => {
            let copy = if with_bf16 { Some(bf16_buffer(device, NAME, rows * outputs)?) } else { None };
            let args = [device.arg(x16), device.arg(w16), device.arg(&out), bias_arg];
            let more =
                [device.arg(activated), optional(device, copy.as_ref()), Arg::Ptr(0), Arg::u32(0), Arg::f32(0.0)];
            let args = [&args[..], &more, &words(&sizes).collect::<Vec<_>>()].concat();
            let kernel = bf16_epilogue(code).expect("filtered above");
            device.launch(NAME, kernel, bf16_blocks()?, device.gemm_shared_bf16, &args)?;
            if let Some(copy) = copy {
                activated.attach(Extra::Bf16(copy));
            }
        }
        (Some((x16, w16)), _, _) if dropout.is_some() => {
            let [dropped, key, threshold, scale] = drop_args;
            let args = [device.arg(x16), device.arg(w16), device.arg(&out), bias_arg, dropped, Arg::Ptr(0)];
            let args = [&args[..], &[key, threshold, scale], &words(&sizes).collect::<Vec<_>>()].concat();
            device.launch(
                NAME,
                &device.kernels.product_bf16_dropout,
                bf16_blocks()?,
                device.gemm_shared_bf16,
                &args,
            )?;
        }
        (Some((x16, w16)), _, _) => {
            let operands = (x16, w16, &out);
            product_bf16(
                device,
                NAME,
                operands,
                (rows, outputs, inputs),
                1,
                (0, 0),
                (false, true),
                bias_buffer.as_ref(),
            )?;
        }
        (None, None, _) if cross_entropy.is_some() => {
            let (site, (_, targets), ce) = cross_entropy.as_ref().expect("matched");
            let (tile, _) = fp32_tile(device, NAME, (rows, outputs), 1)?;
            let row_blocks = int(NAME, rows.div_ceil(logit_block_rows(tile)))? as u32;
            let args = [device.arg(&xb), device.arg(&wb), bias_arg, device.arg(&out), Arg::i32(sizes[2])];
            let sizes = [Arg::i32(sizes[0]), Arg::i32(sizes[1]), Arg::f32(site.ignore), Arg::f32(site.row_scale)];
            let dx_args = match &fused_dx {
                Some(f) => {
                    let (code, pre) = f.slope.as_ref().map_or((UNARY_NONE, None), |(code, pre)| (*code, Some(pre)));
                    [device.arg(&f.dx), optional(device, pre), Arg::i32(code), Arg::i32(tile_ksplit(f.tile))]
                }
                None => [Arg::Ptr(0), Arg::Ptr(0), Arg::i32(0), Arg::i32(1)],
            };
            let outputs = cross_entropy_outputs(device, ce, sizes);
            let args = [&args[..], &[Arg::Ptr(*targets)], &outputs, &dx_args].concat();
            let kernel = &device.kernels.linear_cross_entropy[tile];
            device.launch(NAME, kernel, (row_blocks, 1), device.logits_shared[tile], &args)?;
        }
        (None, _, _) => {
            // nn_linear writes the pre-activation to z and act(z) to y.
            let (z, y, code) = match (&activated, activation) {
                (Some(activated), Some((code, _))) => (device.arg(&out), device.arg(activated), code),
                _ => (Arg::Ptr(0), device.arg(&out), UNARY_NONE),
            };
            let (tile, blocks) = fp32_tile(device, NAME, (rows, outputs), 1)?;
            let args = [device.arg(&xb), device.arg(&wb), bias_arg, z, y];
            let args =
                [&args[..], &words(&[sizes[0], sizes[1], sizes[2], code]).collect::<Vec<_>>(), &drop_args].concat();
            device.launch(NAME, &device.kernels.linear[tile], blocks, device.gemm_shared[tile], &args)?;
        }
    }
    if let (Some(activated), Some((code, _))) = (activated, activation) {
        out.attach(Extra::Activation { code, out: activated, by: NAME });
    }
    if let Some((site, dropped, key)) = dropout {
        out.attach(Extra::Dropout { site, out: dropped, key });
    }
    if let Some((site, (targets, _), ce)) = cross_entropy {
        let writes = device.in_place_writes.load(std::sync::atomic::Ordering::Relaxed);
        out.attach(Extra::CrossEntropy { site, targets, writes, out: ce });
    }
    out.made_by_producer(producer.as_ref());
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, needs: &[bool]| {
        let sizes = (rows, inputs, outputs);
        match &rounded {
            None => linear_backward_fp32(&device_, grad, needs, (&xb, &wb), sizes, fused_dx.as_ref()),
            Some(rounded) => linear_backward_bf16(&device_, grad, needs, (&xb, rounded), sizes),
        }
    };
    let inputs_of: Vec<&Tensor<F>> = [Some(x), Some(weight), bias].into_iter().flatten().collect();
    Ok(Tensor::from_device_op(NAME, out, shape, &inputs_of, Box::new(backward)))
}

/// A linear layer's backward in fp32 (dx = dy·W; dW = dyᵀ·x; db = Σ rows of dy): dx from the loss kernel
/// when it formed it (`fused_dx`), else one launch of the three, or of those needed.
fn linear_backward_fp32(
    d: &Arc<Device>,
    grad: &DeviceBuffer,
    needs: &[bool],
    (xb, wb): (&DeviceBuffer, &DeviceBuffer),
    sizes: (usize, usize, usize),
    fused_dx: Option<&FusedDx>,
) -> Result<Vec<Option<DeviceBuffer>>> {
    const NAME: &str = "linear";
    let (rows, inputs, outputs) = sizes;
    let bias_needed = needs.len() == 3 && needs[2];
    // dx from the loss kernel, when the loss's gradient d reached this layer as it is, the tile is the one
    // linear_grad takes now and, where the kernel took an activation's slope, that slope is offered.
    let formed_dx = fused_dx.as_ref().filter(|f| {
        needs[0]
            && grad.same_elements(&f.d)
            && f.tile == linear_grad_tile(d, sizes, bias_needed)
            && f.slope.as_ref().is_none_or(|(code, _)| d.take_slope(NAME, xb, |c| c == *code).is_some())
    });
    let (dx, dw, db) = match (needs[0], needs[1] || bias_needed) {
        (true, true) if formed_dx.is_some() => {
            let f = formed_dx.expect("matched");
            if d.is_fusing() {
                d.fused("linear ← cross_entropy: dx by the loss kernel's blocks, no launch of its own".into());
            }
            // dW and db in linear_grad's tile too: the bits of its dW tiles.
            let (dw, db) = linear_grad_weight(d, NAME, grad, xb, sizes, bias_needed, Some(f.tile))?;
            (Some(f.dx.clone()), Some(dw), db)
        }
        (true, true) => {
            // dx times the slope of the activation that made x, when the backward offers it.
            let slope = d.take_slope(NAME, xb, |_| true);
            let (dx, dw, db) = linear_grad(d, (grad, xb, wb), sizes, bias_needed, slope)?;
            (Some(dx), Some(dw), db)
        }
        (false, true) => {
            let (dw, db) = linear_grad_weight(d, NAME, grad, xb, sizes, bias_needed, None)?;
            (None, Some(dw), db)
        }
        (wants_dx, false) => {
            let dx = || product(d, NAME, (grad, wb), (rows, inputs, outputs), 1, (0, 0), (false, false));
            (wants_dx.then(dx).transpose()?, None, None)
        }
    };
    let mut grads = vec![dx, dw.filter(|_| needs[1])];
    if needs.len() == 3 {
        grads.push(db);
    }
    Ok(grads)
}

/// A linear layer's backward on the bf16 tensor cores: dy rounded once, dx (times the slope of the
/// activation before, when offered and the product runs unsplit) and dW as products of the rounded
/// operands, db summed in fp32.
fn linear_backward_bf16(
    d: &Arc<Device>,
    grad: &DeviceBuffer,
    needs: &[bool],
    (xb, (x16, w16)): (&DeviceBuffer, &(DeviceBuffer, DeviceBuffer)),
    (rows, inputs, outputs): (usize, usize, usize),
) -> Result<Vec<Option<DeviceBuffer>>> {
    const NAME: &str = "linear";
    let dy16 = rounded_bf16(NAME, grad)?;
    let dx = |_| -> Result<DeviceBuffer> {
        let dx = d.alloc(NAME, rows * inputs)?;
        let operands = (&dy16, w16, &dx);
        // dx times the slope of the activation that made x, when the backward offers it and the product
        // runs unsplit (a kernel per activation).
        let unsplit = bf16_split(d, (rows, inputs, outputs), 1, false).0 == 1;
        let fuses = |code: i32| unsplit && usize::try_from(code).is_ok_and(|c| c < d.kernels.product_bf16_slope.len());
        match d.take_slope(NAME, xb, fuses) {
            Some((code, pre)) => product_bf16_slope(d, operands, (rows, inputs, outputs), (code, &pre, xb))?,
            None => product_bf16(d, NAME, operands, (rows, inputs, outputs), 1, (0, 0), (false, false), None)?,
        }
        Ok(dx)
    };
    let dw = |_| -> Result<DeviceBuffer> {
        let dw = d.alloc(NAME, outputs * inputs)?;
        let operands = (&dy16, x16, &dw);
        product_bf16(d, NAME, operands, (outputs, inputs, rows), 1, (0, 0), (true, false), None)?;
        Ok(dw)
    };
    let mut grads = vec![needs[0].then_some(()).map(dx).transpose()?, needs[1].then_some(()).map(dw).transpose()?];
    if needs.len() == 3 {
        grads.push(if needs[2] { Some(sum_axis(d, NAME, grad, (1, rows, outputs), 1.0)?) } else { None });
    }
    Ok(grads)
}

/// A linear layer's dW = dyᵀ·x and, with `bias`, db = Σ rows of dy, in one fp32 product
/// (`nn_linear_grad_weight`: x with a column of ones appended, db its last column of results), deferred
/// to launch with the next layer's (`weight_grads`). The tile is `fp32_tile`'s for the product, or `tile`.
fn linear_grad_weight(
    device: &Arc<Device>,
    name: &'static str,
    dy: &DeviceBuffer,
    x: &DeviceBuffer,
    (rows, inputs, outputs): (usize, usize, usize),
    bias: bool,
    tile: Option<usize>,
) -> Result<(DeviceBuffer, Option<DeviceBuffer>)> {
    let dw = device.alloc(name, outputs * inputs)?;
    let db = if bias { Some(device.alloc(name, outputs)?) } else { None };
    let product = (outputs, inputs + bias as usize);
    let (tile, grid) = match tile {
        Some(tile) => (tile, fp32_grid(name, tile, product, 1)?),
        None => fp32_tile(device, name, product, 1)?,
    };
    let (dy, x, sizes) = (dy.clone(), x.clone(), (rows, outputs, inputs));
    device.defer_weight_grad(WeightGradJob { dy, x, dw: dw.clone(), db: db.clone(), sizes, tile, grid });
    Ok((dw, db))
}

/// A linear layer's dx = dy·W, dW = dyᵀ·x and, with `bias`, db = Σ rows of dy, in one fp32 launch
/// (`nn_linear_grad`: dx's tiles, then dW's with db as their last column), its tile the largest whose
/// grid of both fills the GPU. With `slope` (x is the activation `code` of `pre`), dx is `pre`'s gradient:
/// dy·W times the activation's slope.
fn linear_grad(
    device: &Arc<Device>,
    (dy, x, w): (&DeviceBuffer, &DeviceBuffer, &DeviceBuffer),
    (rows, inputs, outputs): (usize, usize, usize),
    bias: bool,
    slope: Option<(i32, DeviceBuffer)>,
) -> Result<(DeviceBuffer, DeviceBuffer, Option<DeviceBuffer>)> {
    const NAME: &str = "linear";
    let (dx, dw) = (device.alloc(NAME, rows * inputs)?, device.alloc(NAME, outputs * inputs)?);
    let db = if bias { Some(device.alloc(NAME, outputs)?) } else { None };
    let tile = linear_grad_tile(device, (rows, inputs, outputs), bias);
    let grid = (int(NAME, linear_grad_blocks((rows, inputs, outputs), bias, FP32_TILES[tile]))? as u32, 1);
    let args = [device.arg(dy), device.arg(x), device.arg(w), device.arg(&dx), device.arg(&dw)];
    let sizes = [int(NAME, rows)?, int(NAME, outputs)?, int(NAME, inputs)?];
    let (pre, code) = match &slope {
        Some((code, pre)) => (Some(pre), *code),
        None => (None, UNARY_NONE),
    };
    let slope_args = [optional(device, pre), Arg::i32(code)];
    let args = [&args[..], &[optional(device, db.as_ref())], &words(&sizes).collect::<Vec<_>>(), &slope_args].concat();
    device.launch(NAME, &device.kernels.linear_grad[tile], grid, device.gemm_shared[tile], &args)?;
    Ok((dx, dw, db))
}

/// nn_linear_grad's blocks in `tile`: dx's tiles, then dW's with db as their last column.
fn linear_grad_blocks((rows, inputs, outputs): (usize, usize, usize), bias: bool, (bm, bn, ..): Fp32Tile) -> usize {
    inputs.div_ceil(bn) * rows.div_ceil(bm) + (inputs + bias as usize).div_ceil(bn) * outputs.div_ceil(bm)
}

/// The tile nn_linear_grad takes: the largest whose grid of both products gives every SM two blocks. One
/// wave was not enough where a product is shallow: the ResNet example's head (128 rows, 3136 inputs, 10
/// outputs) took the 64 × 64 tile in 148 blocks, its dW tiles six-sevenths padding, and its step ran 342 µs
/// against 336 µs on the 16 × 16 tile's 1765 blocks.
fn linear_grad_tile(device: &Device, sizes: (usize, usize, usize), bias: bool) -> usize {
    filling_tile_waves(device, 2, |tile| linear_grad_blocks(sizes, bias, tile))
}

/// The thread groups that split k in the fp32 tile at `tile` (gemm_tile's KSPLIT).
fn tile_ksplit(tile: usize) -> i32 {
    let (bm, bn, _, tm, tn) = FP32_TILES[tile];
    (crate::ops::THREADS_PER_BLOCK as usize / ((bm / tm) * (bn / tn))) as i32
}

/// A linear layer's dx formed by the loss kernel after it (`nn_linear_cross_entropy`'s dx): d·W, times the
/// slope of the activation `code` of `pre` that made x where `slope` is given, as nn_linear_grad's `tile`
/// forms it, for the loss's gradient `d`.
struct FusedDx {
    dx: DeviceBuffer,
    d: DeviceBuffer,
    slope: Option<(i32, DeviceBuffer)>,
    tile: usize,
}

/// The mean cross-entropy of `rows` rows of `classes` logits against `targets` (class ids as floats, on
/// the device), over the rows whose id is not `ignore` (NaN: none), counted on the device, so that a
/// captured step takes each replay's targets. In a captured step the linear layer that made the logits
/// may have computed it already (capture-time fusion): then nothing launches here.
pub(crate) fn cross_entropy<F: Real>(
    device: &Arc<Device>,
    logits: &Tensor<F>,
    targets: &DeviceBuffer,
    ignore: f32,
    (rows, classes): (usize, usize),
) -> Result<Tensor<F>> {
    const NAME: &str = "cross_entropy";
    let input = buffer(logits);
    // Without an id to ignore every row counts, so the kernel divides the gradient by the rows itself.
    // With one, the linear layer that forms the logits in a capture counts the rows itself
    // (LINEAR_CROSS_ENTROPY_COUNT_ROWS); this kernel, a warp a row, cannot, so its d is softmax − onehot
    // and the backward divides by the count the last block wrote. Where d is the mean's gradient, the seed
    // of a backward from the loss, its word `one` (an upstream gradient of 1), gets d as it is.
    let every_row_counts = ignore.is_nan();
    let row_scale = if every_row_counts { 1.0 / rows.max(1) as f32 } else { 1.0 };
    let fused_scale = if every_row_counts { row_scale } else { LINEAR_CROSS_ENTROPY_COUNT_ROWS };
    let site = (device.step_input_of(targets)).map(|input| CrossEntropySite {
        input,
        rows,
        classes,
        ignore,
        row_scale: fused_scale,
    });
    if let Some(site) = site {
        device.want(&input, Want::CrossEntropy(site));
    }
    let (out, mean_gradient) = match site.and_then(|site| input.cross_entropy_extra(targets, &site)) {
        Some(out) => {
            device.fused(format!("linear → {NAME}: the loss by the blocks that formed the logits"));
            (out, true)
        }
        None => {
            let out = cross_entropy_buffers(device, rows, classes)?;
            let args = [device.arg(&input), device.arg(targets)];
            let sizes =
                [Arg::i32(int(NAME, rows)?), Arg::i32(int(NAME, classes)?), Arg::f32(ignore), Arg::f32(row_scale)];
            let args = [&args[..], &cross_entropy_outputs(device, &out, sizes)].concat();
            device.launch(NAME, &device.kernels.cross_entropy, warp_row_blocks(rows), 0, &args)?;
            (out, every_row_counts)
        }
    };
    let CrossEntropyOut { loss, d, count, one, .. } = out;
    loss.attach(Extra::Seed(one.clone()));
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        if mean_gradient && grad.address() == one.address() {
            return Ok(vec![Some(d.clone())]);
        }
        let divisor = (!mean_gradient).then_some(&count);
        Ok(vec![Some(scale_by(&device_, NAME, &d, grad, divisor, 1.0)?)])
    };
    Ok(Tensor::from_device_op(NAME, loss, Vec::new(), &[logits], Box::new(backward)))
}

/// New buffers for what a cross-entropy of `rows` rows of `classes` writes.
fn cross_entropy_buffers(device: &Arc<Device>, rows: usize, classes: usize) -> Result<CrossEntropyOut> {
    const NAME: &str = "cross_entropy";
    Ok(CrossEntropyOut {
        losses: device.alloc(NAME, rows)?,
        d: device.alloc(NAME, rows * classes)?,
        counted: device.alloc(NAME, rows)?,
        loss: device.alloc(NAME, 1)?,
        count: device.alloc(NAME, 1)?,
        one: device.alloc(NAME, 1)?,
    })
}

/// The arguments a cross-entropy kernel takes after its logits (and their sizes): `targets`' place is the
/// caller's; here the outputs around `sizes` (rows, classes, ignore, row_scale) as nn_cross_entropy and
/// nn_linear_cross_entropy both order them: losses, d, counted, sizes, then the mean's words and ticket.
fn cross_entropy_outputs(device: &Device, out: &CrossEntropyOut, sizes: [Arg; 4]) -> Vec<Arg> {
    let [rows, classes, ignore, row_scale] = sizes;
    vec![
        device.arg(&out.losses),
        device.arg(&out.d),
        device.arg(&out.counted),
        rows,
        classes,
        ignore,
        row_scale,
        device.arg(&out.loss),
        device.arg(&out.count),
        device.arg(&out.one),
        device.ticket(Ticket::CrossEntropy),
    ]
}

/// saved · (1 / divisor[0]) · (scale · upstream[0]) (no divisor: 1), in a new buffer.
fn scale_by(
    device: &Arc<Device>,
    name: &'static str,
    saved: &DeviceBuffer,
    upstream: &DeviceBuffer,
    divisor: Option<&DeviceBuffer>,
    scale: f32,
) -> Result<DeviceBuffer> {
    let out = device.alloc(name, saved.len())?;
    let divisor = optional(device, divisor);
    let args = [device.arg(saved), device.arg(upstream), divisor, Arg::f32(scale), device.arg(&out)];
    let args = [&args[..], &[Arg::i32(int(name, saved.len())?)]].concat();
    device.launch(name, &device.kernels.scale_by, device.blocks_for(saved.len()), 0, &args)?;
    Ok(out)
}

/// The gradient 1 that a backward from the scalar in `output` starts with: the word its op wrote for it,
/// or a new one filled by a kernel (no copy from the host, so a captured step can hold it).
pub(crate) fn seed(output: &DeviceBuffer) -> Result<DeviceBuffer> {
    match output.seed_extra() {
        Some(one) => Ok(one),
        None => filled(output.device(), "backward", 1, 1.0),
    }
}

/// A buffer of `n` copies of `value`, by a kernel (a backward's seed; no copy from the host, so a captured
/// step can hold it).
pub(crate) fn filled(device: &Arc<Device>, name: &'static str, n: usize, value: f32) -> Result<DeviceBuffer> {
    let out = device.alloc(name, n)?;
    let args = [device.arg(&out), Arg::f32(value), Arg::i32(int(name, n)?)];
    device.launch(name, &device.kernels.fill, device.blocks_for(n), 0, &args)?;
    Ok(out)
}

/// The mean of (y − t)² over `n` elements; the shapes were checked equal.
pub(crate) fn mse<F: Real>(device: &Arc<Device>, y: &Tensor<F>, t: &Tensor<F>) -> Result<Tensor<F>> {
    const NAME: &str = "mse";
    let n = y.numel();
    let count = int(NAME, n)?;
    let line = ([1, 1, 1, count.max(1)], [0, 0, 0, 1]);
    let elementwise = |code: i32, a: &DeviceBuffer, b: &DeviceBuffer| {
        launch_binary(device, NAME, code, (a, b), n, (line.0, [line.1; 2]))
    };
    let diff = elementwise(OP_SUB, &buffer(y), &buffer(t))?;
    let squares = elementwise(OP_MUL, &diff, &diff)?;
    let loss = sum_axis(device, NAME, &squares, (1, n, 1), 1.0 / n as f32)?;
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, needs: &[bool]| {
        let scale = 2.0 / n as f32;
        let dy = if needs[0] { Some(scale_by(&device_, NAME, &diff, grad, None, scale)?) } else { None };
        let dt = if needs[1] { Some(scale_by(&device_, NAME, &diff, grad, None, -scale)?) } else { None };
        Ok(vec![dy, dt])
    };
    Ok(Tensor::from_device_op(NAME, loss, Vec::new(), &[y, t], Box::new(backward)))
}

#[cfg(test)]
mod tests {
    use crate::device::compile::kernel_constants;

    #[test]
    fn the_fused_cross_entropys_widest_row_is_the_kernels() {
        let names = ["LINEAR_CROSS_ENTROPY_CLASSES", "LINEAR_CROSS_ENTROPY_COUNTED_ROWS", "LOGIT_ROWS"];
        let kernel = kernel_constants("nn", &[], &names);
        let counted_rows = super::LINEAR_CROSS_ENTROPY_COUNTED_ROWS as i64;
        let tiny_rows = super::logit_block_rows(super::TINY_TILE) as i64;
        assert_eq!(kernel.unwrap(), [super::LINEAR_CROSS_ENTROPY_CLASSES as i64, counted_rows, tiny_rows]);
        let kernel = kernel_constants("nn", &[], &["LINEAR_CROSS_ENTROPY_COUNT_ROWS == 0.0f"]).unwrap();
        assert_eq!(kernel, [i64::from(super::LINEAR_CROSS_ENTROPY_COUNT_ROWS == 0.0)]);
    }

    #[test]
    fn each_tiles_k_split_is_the_kernels() {
        let expressions: Vec<String> = (super::FP32_TILES.iter())
            .map(|(bm, bn, bk, tm, tn)| format!("GemmTile<{bm}, {bn}, {bk}, {tm}, {tn}>::KSPLIT"))
            .collect();
        let expressions: Vec<&str> = expressions.iter().map(String::as_str).collect();
        let kernel = kernel_constants("nn", &[], &expressions).unwrap();
        assert_eq!(kernel, [0, 1, 2].map(|tile| i64::from(super::tile_ksplit(tile))));
    }
}
