//! The CPU twin of the dense layer (fused/fit.cu's dense family, `FIT_OP 1`, and fused/transformer.cu's
//! `tf_linear_forward`/`tf_linear_backward`): y = x·wᵀ + b over rows, in PyTorch's `Linear` layout
//! (w `[out][in]`, b `[out]`), and its backward, through `crate::ops::cpu::gemm` (one thread, the same shapes
//! giving the same rounding).
//!
//! The forward writes the bias into every row (or zeros) and adds x·wᵀ to it. The backward forms
//! dw = dyᵀ·x (written over the gradient or added to it), db = dy's column sums taken row after row,
//! and dx = dy·w.
//!
//! Not every dense layer is this one: the MNIST CNN's two fully connected layers fold each output over
//! its inputs in order (`mnist::cnn`), a different order of sums from `gemm`'s blocks.

use crate::ops::cpu::{Mat, Real, gemm};

/// The sizes of a dense layer over a batch: `rows` inputs of `inputs` values, `outputs` values each out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseShape {
    /// Rows (samples, or positions) in the batch.
    pub rows: usize,
    /// Values per input row (the weight's second axis).
    pub inputs: usize,
    /// Values per output row (the weight's first axis).
    pub outputs: usize,
}

/// Whether a backward's weight gradient replaces what its buffer held or adds to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightGrad {
    /// dw = dyᵀ·x (the buffer's old values are not read).
    Write,
    /// dw += dyᵀ·x (a weight used by several sequences, or shared with another tensor).
    Add,
}

/// Which gradients a dense backward forms (each None when not wanted).
pub struct DenseGrads<'a, F> {
    /// The weight's `[out][in]`, written or added to as the `WeightGrad` says.
    pub weight: Option<(&'a mut [F], WeightGrad)>,
    /// The bias's `[out]`, added to.
    pub bias: Option<&'a mut [F]>,
    /// The input's `[rows][in]`, written.
    pub input: Option<&'a mut [F]>,
}

/// y (`rows × outputs`) = x (`rows × inputs`)·wᵀ + b, into `out`.
pub fn dense_forward<F: Real>(shape: DenseShape, x: &[F], w: &[F], b: Option<&[F]>, out: &mut [F]) {
    let DenseShape { rows, inputs, outputs } = shape;
    match b {
        Some(b) => out.chunks_exact_mut(outputs.max(1)).for_each(|row| row.copy_from_slice(b)),
        None => out.iter_mut().for_each(|v| *v = F::zero()),
    }
    gemm(Mat::rows_of(x, rows, inputs), Mat::rows_of(w, outputs, inputs).t(), F::one(), &mut out[..rows * outputs]);
}

/// The backward of `dense_forward` from its input `x`, weight `w` and output gradient `d_out`.
pub fn dense_backward<F: Real>(shape: DenseShape, x: &[F], w: &[F], d_out: &[F], grads: DenseGrads<'_, F>) {
    let DenseShape { rows, inputs, outputs } = shape;
    let dy = Mat::rows_of(d_out, rows, outputs);
    if let Some((gw, how)) = grads.weight {
        let beta = if how == WeightGrad::Add { F::one() } else { F::zero() };
        gemm(dy.t(), Mat::rows_of(x, rows, inputs), beta, gw);
    }
    if let Some(gb) = grads.bias {
        for row in d_out.chunks_exact(outputs.max(1)).take(rows) {
            gb.iter_mut().zip(row).for_each(|(g, &d)| *g = *g + d);
        }
    }
    if let Some(dx) = grads.input {
        gemm(dy, Mat::rows_of(w, outputs, inputs), F::zero(), dx);
    }
}
