//! Matrix products through `cpu::gemm`: `matmul` of [.., m, k] by [.., k, n] (batched over equal leading
//! axes, or with one operand of two axes shared by every batch), and `linear` in PyTorch's layout,
//! y = x·wᵀ + b with w [out, in], over the last axis of x.
//!
//! Backward: dA = dC·Bᵀ, dB = Aᵀ·dC (summed over the batches that share an operand, in batch order).
//! `linear` is `ops::dense`, the dense layer's CPU twin (its db the column sums of dy, row by row).

use super::cuda::{self, Place, ops as device};
use super::error::{Error, Result};
use super::tensor::{Storage, Tensor};
use crate::ops::cpu::{Mat, Real, gemm};
use crate::ops::dense::{DenseGrads, DenseShape, WeightGrad, dense_backward, dense_forward};
use std::sync::Arc;

impl<F: Real> Tensor<F> {
    /// The matrix product over the last two axes, batched over the leading ones.
    pub fn matmul(&self, other: &Tensor<F>) -> Result<Tensor<F>> {
        let refuse = |problem| Err(Error::shapes("matmul", self.shape(), other.shape(), problem));
        let (a, b) = (self.shape(), other.shape());
        if a.len() < 2 || b.len() < 2 {
            return refuse("do not multiply: each needs two axes or more");
        }
        let ((m, k), (k_b, n)) = ((a[a.len() - 2], a[a.len() - 1]), (b[b.len() - 2], b[b.len() - 1]));
        if k != k_b {
            return refuse("do not multiply");
        }
        let (lead_a, lead_b) = (&a[..a.len() - 2], &b[..b.len() - 2]);
        let lead = match (lead_a.is_empty(), lead_b.is_empty()) {
            (_, true) => lead_a,
            (true, false) => lead_b,
            (false, false) if lead_a == lead_b => lead_a,
            _ => return refuse("do not multiply: their leading (batch) axes differ"),
        };
        let batches: usize = lead.iter().product();
        // The element offset of batch `i` in each operand; 0 for one shared by every batch.
        let step_a = if lead_a.is_empty() { 0 } else { m * k };
        let step_b = if lead_b.is_empty() { 0 } else { k * n };
        let shape = [lead, &[m, n]].concat();
        if let Place::Device(gpu) = cuda::place_of("matmul", &[self, other])? {
            return device::matmul(&gpu, (self, other), (m, k, n), batches, (step_a, step_b), shape);
        }
        let (values_a, values_b) = (self.storage(), other.storage());
        let mut out = vec![F::zero(); batches * m * n];
        for (i, c) in out.chunks_exact_mut((m * n).max(1)).enumerate().take(batches) {
            let a = Mat::rows_of(&values_a.host()[i * step_a..], m, k);
            gemm(a, Mat::rows_of(&values_b.host()[i * step_b..], k, n), F::zero(), c);
        }
        let (count_a, count_b) = (self.numel(), other.numel());
        let backward = move |grad: &[F], needs: &[bool]| {
            let (x, y) = (values_a.host(), values_b.host());
            let mut grad_a = needs[0].then(|| vec![F::zero(); count_a]);
            let mut grad_b = needs[1].then(|| vec![F::zero(); count_b]);
            for i in 0..batches {
                let g = Mat::rows_of(&grad[i * m * n..], m, n);
                if let Some(grad_a) = grad_a.as_mut() {
                    let y = Mat::rows_of(&y[i * step_b..], k, n);
                    gemm(g, y.t(), F::one(), &mut grad_a[i * step_a..][..m * k]);
                }
                if let Some(grad_b) = grad_b.as_mut() {
                    let x = Mat::rows_of(&x[i * step_a..], m, k);
                    gemm(x.t(), g, F::one(), &mut grad_b[i * step_b..][..k * n]);
                }
            }
            Ok(vec![grad_a, grad_b])
        };
        Ok(Tensor::from_op("matmul", Arc::new(Storage::Host(out)), shape, &[self, other], Box::new(backward)))
    }
}

/// y = x·wᵀ + b over the last axis of `x`: x `[.., in]`, `weight` `[out, in]`, `bias` `[out]`.
pub fn linear<F: Real>(x: &Tensor<F>, weight: &Tensor<F>, bias: Option<&Tensor<F>>) -> Result<Tensor<F>> {
    let [outputs, inputs] = *weight.shape() else {
        return Err(Error::shape("linear", weight.shape(), "is not a weight of two axes [out, in]"));
    };
    if x.shape().last() != Some(&inputs) {
        let problem = "do not multiply: the input's last axis must be the weight's second ([out, in])";
        return Err(Error::shapes("linear", x.shape(), weight.shape(), problem));
    }
    if let Some(bias) = bias
        && bias.shape() != [outputs]
    {
        return Err(Error::shapes("linear", weight.shape(), bias.shape(), "do not match: the bias must be [out]"));
    }
    let lead = &x.shape()[..x.rank() - 1];
    let dense = DenseShape { rows: lead.iter().product(), inputs, outputs };
    let rows = dense.rows;
    let shape = [lead, &[outputs]].concat();
    let operands: Vec<&Tensor<F>> = [Some(x), Some(weight), bias].into_iter().flatten().collect();
    if let Place::Device(gpu) = cuda::place_of("linear", &operands)? {
        return device::linear(&gpu, (x, weight, bias), (rows, inputs, outputs), shape);
    }
    let (values_x, values_w) = (x.storage(), weight.storage());
    let mut out = vec![F::zero(); dense.rows * outputs];
    let bias_values = bias.map(Tensor::storage);
    dense_forward(dense, values_x.host(), values_w.host(), bias_values.as_deref().map(Storage::host), &mut out);
    let backward = move |grad: &[F], needs: &[bool]| {
        let mut grad_x = needs[0].then(|| vec![F::zero(); dense.rows * inputs]);
        let mut grad_w = needs[1].then(|| vec![F::zero(); outputs * inputs]);
        let mut grad_b = needs.get(2).copied().unwrap_or(false).then(|| vec![F::zero(); outputs]);
        let grads = DenseGrads {
            weight: grad_w.as_deref_mut().map(|g| (g, WeightGrad::Write)),
            bias: grad_b.as_deref_mut(),
            input: grad_x.as_deref_mut(),
        };
        dense_backward(dense, values_x.host(), values_w.host(), grad, grads);
        Ok([grad_x, grad_w].into_iter().chain((needs.len() == 3).then_some(grad_b)).collect())
    };
    Ok(Tensor::from_op("linear", Arc::new(Storage::Host(out)), shape, &operands, Box::new(backward)))
}
