//! Reductions: `sum` and `mean` over one axis (keeping it as size 1 or dropping it) or over all elements,
//! and `softmax` and `log_softmax` over the last axis (the row softmax of `cpu::softmax_in_place`).
//!
//! Each sum runs along its axis from index 0 up, so the same shapes give the same rounding.

use super::cuda::{self, Place, ops as device};
use super::error::{Error, Result};
use super::shape::{around, axis_index};
use super::tensor::{Storage, Tensor};
use crate::ops::cpu::{Real, softmax_in_place};
use std::sync::Arc;

/// The sum (or mean, when `mean`) of `x` along `axis`, None for all elements.
fn reduce<F: Real>(
    op: &'static str,
    x: &Tensor<F>,
    axis: Option<isize>,
    keepdim: bool,
    mean: bool,
) -> Result<Tensor<F>> {
    let (shape, (outer, n, inner)) = match axis {
        Some(axis) => {
            let axis = axis_index(op, x.shape(), axis)?;
            let mut shape = x.shape().to_vec();
            if keepdim {
                shape[axis] = 1;
            } else {
                shape.remove(axis);
            }
            (shape, around(x.shape(), axis))
        }
        None => (if keepdim { vec![1; x.rank()] } else { Vec::new() }, (1, x.numel(), 1)),
    };
    if let Place::Device(gpu) = cuda::place_of(op, &[x])? {
        return device::reduce(&gpu, op, x, (outer, n, inner), mean, shape);
    }
    let values = x.storage();
    let x_values = values.host();
    let mut out = vec![F::zero(); outer * inner];
    for o in 0..outer {
        let sums = &mut out[o * inner..][..inner];
        for k in 0..n {
            let row = &x_values[(o * n + k) * inner..][..inner];
            sums.iter_mut().zip(row).for_each(|(s, &v)| *s = *s + v);
        }
    }
    let count = F::from(n).unwrap_or_else(F::nan);
    if mean {
        out.iter_mut().for_each(|s| *s = *s / count);
    }
    let backward = move |grad: &[F], _needs: &[bool]| {
        let mut grad_x = vec![F::zero(); outer * n * inner];
        for o in 0..outer {
            let from = &grad[o * inner..][..inner];
            for k in 0..n {
                let to = &mut grad_x[(o * n + k) * inner..][..inner];
                to.iter_mut().zip(from).for_each(|(t, &g)| *t = if mean { g / count } else { g });
            }
        }
        Ok(vec![Some(grad_x)])
    };
    Ok(Tensor::from_op(op, Arc::new(Storage::Host(out)), shape, &[x], Box::new(backward)))
}

/// The length of the last axis, the one softmax normalises; an error for a scalar.
fn last_axis<F: Real>(op: &'static str, x: &Tensor<F>) -> Result<usize> {
    x.shape().last().copied().ok_or_else(|| Error::shape(op, x.shape(), "has no last axis to normalise over"))
}

impl<F: Real> Tensor<F> {
    /// The sum along `axis` (negative: from the end), kept as size 1 when `keepdim`.
    pub fn sum(&self, axis: isize, keepdim: bool) -> Result<Tensor<F>> {
        reduce("sum", self, Some(axis), keepdim, false)
    }

    /// The sum of every element, shape `[]`.
    pub fn sum_all(&self) -> Result<Tensor<F>> {
        reduce("sum", self, None, false, false)
    }

    /// The mean along `axis` (negative: from the end), kept as size 1 when `keepdim`.
    pub fn mean(&self, axis: isize, keepdim: bool) -> Result<Tensor<F>> {
        reduce("mean", self, Some(axis), keepdim, true)
    }

    /// The mean of every element, shape `[]` (NaN for no elements, as PyTorch's).
    pub fn mean_all(&self) -> Result<Tensor<F>> {
        reduce("mean", self, None, false, true)
    }

    /// softmax over the last axis: e^(x − max) / Σ e^(x − max) along each row.
    pub fn softmax(&self) -> Result<Tensor<F>> {
        // dx = y ⊙ (g − Σ g·y) along each row.
        let backward = |y: &[F], g: &[F], dx: &mut [F]| {
            let dot = y.iter().zip(g).fold(F::zero(), |s, (&y, &g)| s + y * g);
            dx.iter_mut().zip(y.iter().zip(g)).for_each(|(d, (&y, &g))| *d = y * (g - dot));
        };
        let forward = |row: &mut [F]| {
            softmax_in_place(row);
        };
        by_rows("softmax", self, forward, backward)
    }

    /// log softmax over the last axis: x − max − ln Σ e^(x − max) along each row.
    pub fn log_softmax(&self) -> Result<Tensor<F>> {
        let mut scratch = Vec::new();
        let forward = |row: &mut [F]| {
            scratch.clear();
            scratch.extend_from_slice(row);
            let (max, sum) = softmax_in_place(&mut scratch);
            let log_sum = sum.ln();
            row.iter_mut().for_each(|v| *v = *v - max - log_sum);
        };
        // dx = g − softmax · Σ g along each row, softmax = e^y.
        let backward = |y: &[F], g: &[F], dx: &mut [F]| {
            let total = g.iter().fold(F::zero(), |s, &g| s + g);
            dx.iter_mut().zip(y.iter().zip(g)).for_each(|(d, (&y, &g))| *d = g - y.exp() * total);
        };
        by_rows("log_softmax", self, forward, backward)
    }
}

/// An op on each row of `x`'s last axis, in place (`forward`), whose backward reads a row of its output
/// y and of the gradient g and writes the row of dx (`backward`): softmax and log softmax.
fn by_rows<F: Real>(
    op: &'static str,
    x: &Tensor<F>,
    forward: impl FnMut(&mut [F]),
    backward: fn(&[F], &[F], &mut [F]),
) -> Result<Tensor<F>> {
    let classes = last_axis(op, x)?.max(1);
    if let Place::Device(gpu) = cuda::place_of(op, &[x])? {
        return device::softmax(&gpu, op, x, classes, op == "log_softmax");
    }
    let mut out = x.to_vec();
    out.chunks_exact_mut(classes).for_each(forward);
    let output = Arc::new(Storage::Host(out));
    let saved = Arc::clone(&output);
    let rows_backward = move |grad: &[F], _needs: &[bool]| {
        let mut grad_x = vec![F::zero(); grad.len()];
        let rows = saved.host().chunks_exact(classes).zip(grad.chunks_exact(classes));
        for ((y, g), dx) in rows.zip(grad_x.chunks_exact_mut(classes)) {
            backward(y, g, dx);
        }
        Ok(vec![Some(grad_x)])
    };
    Ok(Tensor::from_op(op, output, x.shape().to_vec(), &[x], Box::new(rows_backward)))
}
