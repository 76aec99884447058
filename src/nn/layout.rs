//! Ops that move elements without arithmetic: `reshape` (`view`), which keeps the row-major order;
//! `permute` of the axes and its special case `transpose` of two, which write the elements out in the new
//! order (tensors stay contiguous); `narrow` (`slice`), a run of indices along one axis; and `cat`, tensors
//! joined along one axis.
//!
//! Each backward moves the gradient back the same way: the inverse permutation; the run's gradient in
//! place among zeros; the output's gradient cut into the pieces'. Nothing is summed, so nothing rounds.

use super::cuda::{self, Place, ops as device};
use super::error::{Error, Result};
use super::shape::{around, axis_index, contiguous_strides, for_each_offset};
use super::tensor::{Storage, Tensor, element_count};
use crate::ops::cpu::Real;
use std::ops::Range;
use std::sync::Arc;

/// The elements of a contiguous tensor of `shape` with its axes in the order `axes` (output axis i is
/// input axis `axes[i]`), and the new shape.
fn permuted<F: Real>(values: &[F], shape: &[usize], axes: &[usize]) -> (Vec<F>, Vec<usize>) {
    let out_shape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let strides = contiguous_strides(shape);
    let strides: Vec<usize> = axes.iter().map(|&a| strides[a]).collect();
    let mut out = vec![F::zero(); values.len()];
    for_each_offset(&out_shape, [&strides], |i, [from]| out[i] = values[from]);
    (out, out_shape)
}

/// `x` with its axes in the order `axes` (each an index from the front), recorded as `op`.
fn permute_op<F: Real>(op: &'static str, x: &Tensor<F>, axes: Vec<usize>) -> Result<Tensor<F>> {
    let mut inverse = vec![0; axes.len()];
    axes.iter().enumerate().for_each(|(i, &a)| inverse[a] = i);
    if let Place::Device(gpu) = cuda::place_of(op, &[x])? {
        // Output axis i reads input axis axes[i]; the gradient goes back through the inverse order.
        let (input_strides, shape): (Vec<usize>, Vec<usize>) =
            (contiguous_strides(x.shape()), axes.iter().map(|&a| x.shape()[a]).collect());
        let strides = axes.iter().map(|&a| input_strides[a]).collect();
        let grad_strides = contiguous_strides(&shape);
        let back = inverse.iter().map(|&i| grad_strides[i]).collect();
        return device::reorder(&gpu, op, x, (shape, strides), back);
    }
    let (out, shape) = permuted(x.storage().host(), x.shape(), &axes);
    let out_shape = shape.clone();
    let backward = move |grad: &[F], _needs: &[bool]| Ok(vec![Some(permuted(grad, &out_shape, &inverse).0)]);
    Ok(Tensor::from_op(op, Arc::new(Storage::Host(out)), shape, &[x], Box::new(backward)))
}

/// Elements `range` along `axis` of `x`, recorded as `op`.
fn narrow_op<F: Real>(op: &'static str, x: &Tensor<F>, axis: isize, range: Range<usize>) -> Result<Tensor<F>> {
    let axis = axis_index(op, x.shape(), axis)?;
    let (outer, n, inner) = around(x.shape(), axis);
    if range.start > range.end || range.end > n {
        let problem = format!("has no elements {}..{} along axis {axis} (of size {n})", range.start, range.end);
        return Err(Error::shape(op, x.shape(), problem));
    }
    let (start, len) = (range.start, range.end - range.start);
    let mut shape = x.shape().to_vec();
    shape[axis] = len;
    if let Place::Device(gpu) = cuda::place_of(op, &[x])? {
        return cuda::shape_ops::narrow(&gpu, op, x, (outer, n, inner), range, shape);
    }
    let values = x.storage();
    let out: Vec<F> =
        (0..outer).flat_map(|o| &values.host()[(o * n + start) * inner..][..len * inner]).copied().collect();
    let backward = move |grad: &[F], _needs: &[bool]| {
        let mut grad_x = vec![F::zero(); outer * n * inner];
        for (o, part) in grad.chunks_exact((len * inner).max(1)).take(outer).enumerate() {
            grad_x[(o * n + start) * inner..][..len * inner].copy_from_slice(part);
        }
        Ok(vec![Some(grad_x)])
    };
    Ok(Tensor::from_op(op, Arc::new(Storage::Host(out)), shape, &[x], Box::new(backward)))
}

impl<F: Real> Tensor<F> {
    /// The same elements in `shape`, which must hold as many.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor<F>> {
        if element_count(shape) != Some(self.numel()) {
            return Err(Error::shapes("reshape", self.shape(), shape, "hold different numbers of elements"));
        }
        if let Place::Device(_) = cuda::place_of("reshape", &[self])? {
            return Ok(device::reshape(self, shape.to_vec()));
        }
        let backward = |grad: &[F], _needs: &[bool]| Ok(vec![Some(grad.to_vec())]);
        Ok(Tensor::from_op("reshape", self.storage(), shape.to_vec(), &[self], Box::new(backward)))
    }

    /// `reshape` (tensors here are always contiguous, so every view is a reshape).
    pub fn view(&self, shape: &[usize]) -> Result<Tensor<F>> {
        self.reshape(shape)
    }

    /// Axes `a` and `b` (negative: from the end) swapped.
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor<F>> {
        let (a, b) = (axis_index("transpose", self.shape(), a)?, axis_index("transpose", self.shape(), b)?);
        let mut axes: Vec<usize> = (0..self.rank()).collect();
        axes.swap(a, b);
        permute_op("transpose", self, axes)
    }

    /// The axes in the order `axes` (PyTorch's `permute`): output axis i is input axis `axes[i]`
    /// (negative: from the end); every axis must appear once.
    pub fn permute(&self, axes: &[isize]) -> Result<Tensor<F>> {
        let order = axes.iter().map(|&a| axis_index("permute", self.shape(), a)).collect::<Result<Vec<usize>>>()?;
        let mut seen = vec![false; self.rank()];
        if order.len() != self.rank() || order.iter().any(|&a| std::mem::replace(&mut seen[a], true)) {
            let problem = format!("cannot take the axes {axes:?}: each of its {} axes must appear once", self.rank());
            return Err(Error::shape("permute", self.shape(), problem));
        }
        permute_op("permute", self, order)
    }

    /// `len` elements from `start` along `axis` (negative: from the end), as PyTorch's `narrow`.
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor<F>> {
        narrow_op("narrow", self, axis, start..start.saturating_add(len))
    }

    /// Elements `range` along `axis` (negative: from the end): `x[.., range, ..]`, `narrow` as a range.
    pub fn slice(&self, axis: isize, range: Range<usize>) -> Result<Tensor<F>> {
        narrow_op("slice", self, axis, range)
    }
}

/// `tensors` joined along `axis` (negative: from the end), as PyTorch's `cat`: each of the same rank, with
/// the same sizes off that axis (a piece may be empty along it).
pub fn cat<F: Real>(tensors: &[&Tensor<F>], axis: isize) -> Result<Tensor<F>> {
    let first = tensors.first().ok_or_else(|| Error::value("cat", "needs at least one tensor to join"))?;
    let axis = axis_index("cat", first.shape(), axis)?;
    let off_axis = |shape: &[usize]| [&shape[..axis], &shape[axis + 1..]].concat();
    for t in &tensors[1..] {
        if t.rank() != first.rank() || off_axis(t.shape()) != off_axis(first.shape()) {
            return Err(Error::shapes("cat", first.shape(), t.shape(), "differ off the axis they are joined along"));
        }
    }
    let (outer, _, inner) = around(first.shape(), axis);
    let lengths: Vec<usize> = tensors.iter().map(|t| t.shape()[axis]).collect();
    let mut shape = first.shape().to_vec();
    shape[axis] = lengths.iter().sum();
    if let Place::Device(gpu) = cuda::place_of("cat", tensors)? {
        return cuda::shape_ops::cat(&gpu, tensors, (outer, inner), lengths, shape);
    }
    // Each piece as (outer, its length along the axis × inner) blocks, one after the other in each block of
    // the output.
    let widths: Vec<usize> = lengths.iter().map(|len| len * inner).collect();
    let total: usize = widths.iter().sum();
    let values: Vec<Arc<Storage<F>>> = tensors.iter().map(|t| t.storage()).collect();
    let mut out = Vec::with_capacity(outer * total);
    for o in 0..outer {
        for (piece, &width) in values.iter().zip(&widths) {
            out.extend_from_slice(&piece.host()[o * width..][..width]);
        }
    }
    let backward = move |grad: &[F], needs: &[bool]| {
        let mut grads: Vec<Option<Vec<F>>> =
            needs.iter().zip(&widths).map(|(&need, &width)| need.then(|| Vec::with_capacity(outer * width))).collect();
        for block in grad.chunks_exact(total.max(1)).take(outer) {
            let mut at = 0;
            for (grad_piece, &width) in grads.iter_mut().zip(&widths) {
                if let Some(grad_piece) = grad_piece {
                    grad_piece.extend_from_slice(&block[at..][..width]);
                }
                at += width;
            }
        }
        Ok(grads)
    };
    Ok(Tensor::from_op("cat", Arc::new(Storage::Host(out)), shape, tensors, Box::new(backward)))
}
