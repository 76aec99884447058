//! The device forward and backward of `narrow` (`slice`) and `cat`, launching the shapes section of
//! `fused/nn.cu`: the twins of the host paths in `nn/layout.rs`, which check the arguments first and call
//! in here when the operands live on a GPU.
//!
//! Both see each tensor as (outer, axis, inner) around the axis they work along, so every copy is a run
//! of indices along the middle axis moved between two such tensors (`nn_copy_run`): narrow's forward and
//! cat's backward take a piece out of the whole, cat's forward puts each piece into it. Narrow's backward
//! puts the gradient among zeros (`nn_pad_run`). Nothing is summed, so the results are the host's bits.

use super::ops::{buffer, int};
use super::{Device, DeviceBuffer};
use crate::device::launch::Arg;
use crate::nn::error::{Error, Result};
use crate::nn::tensor::Tensor;
use crate::ops::cpu::Real;
use std::ops::Range;
use std::sync::Arc;

/// outer · n · inner as a kernel's int: the elements of the larger tensor of a copy, which bounds every
/// index the kernels compute.
fn whole(op: &'static str, (outer, n, inner): (usize, usize, usize)) -> Result<i32> {
    let count = outer.checked_mul(n).and_then(|c| c.checked_mul(inner));
    int(op, count.ok_or_else(|| Error::device(op, "has more elements than memory can address"))?)
}

/// Copies `len` indices of the middle axis from `from` (that axis `from_n` long, the run at `from_start`)
/// to `to` (`to_n` long, at `to_start`), both seen as (outer, ·, inner); the caller checked the larger
/// tensor's size with `whole`.
#[allow(clippy::too_many_arguments)]
fn copy_run(
    device: &Device,
    op: &'static str,
    (from, to): (&DeviceBuffer, &DeviceBuffer),
    (outer, inner, len): (usize, usize, usize),
    (from_n, from_start): (usize, usize),
    (to_n, to_start): (usize, usize),
) -> Result<()> {
    let count = outer * len * inner;
    let sizes = [count, inner, len, from_n, from_start, to_n, to_start].map(|v| Arg::i32(v as i32));
    let args = [&[device.arg(from), device.arg(to)][..], &sizes].concat();
    device.launch(op, &device.kernels.copy_run, device.blocks_for(count), 0, &args)
}

/// Indices `range` along the middle axis of `x` seen as (outer, n, inner), in `shape`, recorded as `op`
/// (`narrow` or `slice`); its backward puts the gradient back among zeros.
pub(crate) fn narrow<F: Real>(
    device: &Arc<Device>,
    op: &'static str,
    x: &Tensor<F>,
    (outer, n, inner): (usize, usize, usize),
    range: Range<usize>,
    shape: Vec<usize>,
) -> Result<Tensor<F>> {
    let count = whole(op, (outer, n, inner))?;
    let (start, len) = (range.start, range.len());
    let out = device.alloc(op, outer * len * inner)?;
    copy_run(device, op, (&buffer(x), &out), (outer, inner, len), (n, start), (len, 0))?;
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        let dx = device_.alloc(op, outer * n * inner)?;
        let args = [device_.arg(grad), device_.arg(&dx)];
        let sizes = [count, inner as i32, n as i32, start as i32, len as i32].map(Arg::i32);
        let args = [&args[..], &sizes].concat();
        device_.launch(op, &device_.kernels.pad_run, device_.blocks_for(outer * n * inner), 0, &args)?;
        Ok(vec![Some(dx)])
    };
    Ok(Tensor::from_device_op(op, out, shape, &[x], Box::new(backward)))
}

/// `tensors` joined along the middle axis of each seen as (outer, its length, inner), in `shape`; each
/// piece's gradient is its run of the output's.
pub(crate) fn cat<F: Real>(
    device: &Arc<Device>,
    tensors: &[&Tensor<F>],
    (outer, inner): (usize, usize),
    lengths: Vec<usize>,
    shape: Vec<usize>,
) -> Result<Tensor<F>> {
    const NAME: &str = "cat";
    let total: usize = lengths
        .iter()
        .try_fold(0usize, |sum, &len| sum.checked_add(len))
        .ok_or_else(|| Error::device(NAME, "has more elements than memory can address"))?;
    whole(NAME, (outer, total, inner))?;
    let out = device.alloc(NAME, outer * total * inner)?;
    let starts: Vec<usize> = lengths.iter().scan(0, |at, &len| Some(std::mem::replace(at, *at + len))).collect();
    for ((piece, &len), &start) in tensors.iter().zip(&lengths).zip(&starts) {
        copy_run(device, NAME, (&buffer(piece), &out), (outer, inner, len), (len, 0), (total, start))?;
    }
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, needs: &[bool]| {
        let mut grads = Vec::with_capacity(lengths.len());
        for ((&need, &len), &start) in needs.iter().zip(&lengths).zip(&starts) {
            if !need {
                grads.push(None);
                continue;
            }
            let piece = device_.alloc(NAME, outer * len * inner)?;
            copy_run(&device_, NAME, (grad, &piece), (outer, inner, len), (total, start), (len, 0))?;
            grads.push(Some(piece));
        }
        Ok(grads)
    };
    Ok(Tensor::from_device_op(NAME, out, shape, tensors, Box::new(backward)))
}
