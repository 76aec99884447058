//! Ops that move elements without arithmetic: `reshape` (`view`), which keeps the row-major order, and
//! `transpose` of two axes, which writes the elements out in the new order (tensors stay contiguous).

use super::cuda::{self, Place, ops as device};
use super::error::{Error, Result};
use super::shape::{axis_index, contiguous_strides, for_each_offset};
use super::tensor::{Storage, Tensor, element_count};
use crate::cpu::Real;
use std::sync::Arc;

/// The elements of a contiguous tensor of `shape` with axes `a` and `b` swapped, and the new shape.
fn swap_axes<F: Real>(values: &[F], shape: &[usize], a: usize, b: usize) -> (Vec<F>, Vec<usize>) {
    let mut out_shape = shape.to_vec();
    out_shape.swap(a, b);
    let mut strides = contiguous_strides(shape);
    strides.swap(a, b);
    let mut out = vec![F::zero(); values.len()];
    for_each_offset(&out_shape, [&strides], |i, [from]| out[i] = values[from]);
    (out, out_shape)
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
        if let Place::Device(gpu) = cuda::place_of("transpose", &[self])? {
            let mut shape = self.shape().to_vec();
            shape.swap(a, b);
            let mut strides = contiguous_strides(self.shape());
            strides.swap(a, b);
            // The gradient, of the output's shape, read back in the input's order: the same swap.
            let mut back = contiguous_strides(&shape);
            back.swap(a, b);
            return device::reorder(&gpu, "transpose", self, (shape, strides), back);
        }
        let (out, shape) = swap_axes(self.storage().host(), self.shape(), a, b);
        let out_shape = shape.clone();
        let backward = move |grad: &[F], _needs: &[bool]| Ok(vec![Some(swap_axes(grad, &out_shape, a, b).0)]);
        Ok(Tensor::from_op("transpose", Arc::new(Storage::Host(out)), shape, &[self], Box::new(backward)))
    }
}
