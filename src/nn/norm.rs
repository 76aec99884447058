//! `layer_norm` over the last axis, PyTorch's `F.layer_norm(x, (D,), weight, bias, eps)`: each row of D
//! values less its mean, over √(σ² + ε) (σ² the biased variance), times `weight` and plus `bias` when
//! given. Forward and backward are `ops::layernorm`'s (the twin of fused/layernorm.cuh), with ε chosen by
//! the caller; an absent weight or bias runs the twin with ones or zeros, which changes no value (·1 and
//! +0 are exact). The weight's and bias's gradients sum over rows in row order. On a GPU the kernels of
//! `fused/nn.cu` compute the same (`cuda::layers`), the mean and 1/σ of each row kept for the backward.

use super::cuda::{self, Place, layers as device};
use super::error::{Error, Result};
use super::tensor::{Storage, Tensor};
use crate::ops::constant;
use crate::ops::cpu::Real;
use crate::ops::layernorm::{layer_norm_backward, layer_norm_rows_eps};
use std::sync::Arc;

const OP: &str = "layer_norm";

/// LayerNorm of `x` over its last axis (D): `weight` and `bias` are `[D]` when given; `eps` (≥ 0) is added
/// to the variance (PyTorch's default is 1e-5).
pub fn layer_norm<F: Real>(
    x: &Tensor<F>,
    weight: Option<&Tensor<F>>,
    bias: Option<&Tensor<F>>,
    eps: f64,
) -> Result<Tensor<F>> {
    let width = *x.shape().last().ok_or_else(|| Error::shape(OP, x.shape(), "has no last axis to normalise over"))?;
    let affine = [
        (weight, "do not match: the weight must be [D], D the input's last axis"),
        (bias, "do not match: the bias must be [D], D the input's last axis"),
    ];
    for (parameter, problem) in affine {
        if let Some(parameter) = parameter
            && parameter.shape() != [width]
        {
            return Err(Error::shapes(OP, x.shape(), parameter.shape(), problem));
        }
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::value(OP, format!("eps must be a finite number ≥ 0, got {eps}")));
    }
    let operands: Vec<&Tensor<F>> = [Some(x), weight, bias].into_iter().flatten().collect();
    if let Place::Device(gpu) = cuda::place_of(OP, &operands)? {
        // ε in f32, as the host twin rounds it for an f32 tensor.
        return device::layer_norm(&gpu, (x, weight, bias), width, eps as f32);
    }
    let w = weight.map_or_else(|| vec![F::one(); width], Tensor::to_vec);
    let b = bias.map_or_else(|| vec![F::zero(); width], Tensor::to_vec);
    let values = x.storage();
    // A last axis of size 0 leaves no element and no row to normalise (the twin walks rows of D values).
    let (out, mean, rstd) =
        if width == 0 { Default::default() } else { layer_norm_rows_eps(values.host(), &w, &b, constant(eps)) };
    let (has_weight, has_bias) = (weight.is_some(), bias.is_some());
    let backward = move |grad: &[F], _needs: &[bool]| {
        let (mut grad_w, mut grad_b) = (vec![F::zero(); width], vec![F::zero(); width]);
        let grad_x = if width == 0 {
            Vec::new()
        } else {
            layer_norm_backward(values.host(), &mean, &rstd, &w, grad, &mut grad_w, &mut grad_b)
        };
        let mut grads = vec![Some(grad_x)];
        grads.extend(has_weight.then_some(Some(grad_w)));
        grads.extend(has_bias.then_some(Some(grad_b)));
        Ok(grads)
    };
    let inputs: Vec<&Tensor<F>> = [Some(x), weight, bias].into_iter().flatten().collect();
    Ok(Tensor::from_op(OP, Arc::new(Storage::Host(out)), x.shape().to_vec(), &inputs, Box::new(backward)))
}
