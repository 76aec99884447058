//! `dropout`, PyTorch's `F.dropout(x, p, training)`: in training, each element kept with probability
//! 1 − p and scaled by 1/(1 − p), or zeroed; outside training (or at p = 0) the input itself. The mask is
//! `ops::dropout`'s (the twin of fused/dropout.cuh), a hash of (seed, step, site, element) with element the
//! row-major index, so a kernel draws the same mask, the same key repeats it to the bit, and the backward
//! recomputes it instead of keeping it. The scale is the twin's, 1/(1 − p) rounded once to f32 as the
//! kernels receive it (in an f64 tensor too).
//!
//! p = 1 is allowed, as in PyTorch: every element becomes 0 in training (its gradient too). The twin has
//! no mask for it (its threshold stops at u32::MAX and 1/(1 − p) is infinite), so that case zeroes all.
//!
//! On a GPU (`cuda::layers`) the kernel takes the host's key, threshold and scale, so both draw the same
//! mask and give the same bits.

use super::cuda::{self, Place, layers as device};
use super::error::{Error, Result};
use super::tensor::{Storage, Tensor};
use crate::ops::cpu::Real;
use crate::ops::dropout::{DropoutKey, Mask};
use std::sync::Arc;

const OP: &str = "dropout";

/// The probability `p` if it is one dropout takes (0 ≤ p ≤ 1).
pub(crate) fn checked_probability(p: f32) -> Result<f32> {
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(Error::value(OP, format!("the probability must be in [0, 1], got {p}")))
    }
}

/// `x` with dropout of probability `p` (0 ≤ p ≤ 1) when `training`: the mask of site `site` (one place in
/// a network that drops values) in step `step` of the run seeded `seed`. Not training, or p = 0: `x` itself.
pub fn dropout<F: Real>(x: &Tensor<F>, p: f32, training: bool, seed: u32, step: u32, site: usize) -> Result<Tensor<F>> {
    checked_probability(p)?;
    let Some(mask) = Mask::new(training.then_some(DropoutKey { seed, step }), site, p) else {
        return Ok(x.clone());
    };
    let all_dropped = p == 1.0;
    if let Place::Device(gpu) = cuda::place_of(OP, &[x])? {
        return device::dropout(&gpu, x, mask, all_dropped);
    }
    let factor = move |element: usize| -> F {
        if all_dropped { F::zero() } else { F::from(mask.factor(element)).unwrap_or_else(F::nan) }
    };
    let out: Vec<F> = x.storage().host().iter().enumerate().map(|(e, &v)| v * factor(e)).collect();
    let backward = move |grad: &[F], _needs: &[bool]| {
        Ok(vec![Some(grad.iter().enumerate().map(|(e, &g)| g * factor(e)).collect())])
    };
    Ok(Tensor::from_op(OP, Arc::new(Storage::Host(out)), x.shape().to_vec(), &[x], Box::new(backward)))
}
