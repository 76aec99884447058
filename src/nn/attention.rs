//! `scaled_dot_product_attention`, PyTorch's `F.scaled_dot_product_attention(q, k, v, is_causal=causal)`
//! for q, k, v of one shape `[B, H, T, D]`: softmax(q·kᵀ/√D)·v for each batch and head, over every key, or
//! over keys 0..=i for query i when `causal`. The math is the twin's, `ops::attention::sdp_attention` and
//! its backward (fused/attention.cuh's, whose kernels are causal only): each sequence's q, k and v are
//! packed into the twin's layout, one row of [q heads | k heads | v heads] per position, and its output and
//! gradients unpacked back to `[H, T, D]`. The twin keeps each sequence's probabilities `[H, T, T]` for
//! the backward, as does this op.
//!
//! k and v must have q's T as well as its B, H and D (the twin attends within one sequence): a different
//! number of keys (cross-attention) is refused.
//!
//! On a GPU (`cuda::layers`) the tensors stay in `[B, H, T, D]`: a warp per query row computes its scores,
//! probabilities (kept `[B·H·T, T]`) and output, and the backward sums each key's gradients over the query
//! rows in order, with no atomics.

use super::cuda::{self, Place, layers as device};
use super::error::{Error, Result};
use super::tensor::{Storage, Tensor};
use crate::ops::attention::{AttentionDropout, attention, attention_backward, sdp_attention, sdp_attention_backward};
use crate::ops::cpu::Real;
use std::sync::Arc;

const OP: &str = "scaled_dot_product_attention";

/// The sizes of q, k and v past the batch axis, `[H, T, D]`.
#[derive(Clone, Copy)]
struct Sizes {
    heads: usize,
    time: usize,
    dims: usize,
}

impl Sizes {
    /// Calls `visit(from, to)` for each head h and position t of sequence `b`: `from` the offset of the D
    /// values of (b, h, t) in a `[B, H, T, D]` tensor, `to` the offset of head h's D values in position t's
    /// row of `parts` packed tensors (`[T][parts·H·D]`, part 0).
    fn rows(self, b: usize, parts: usize, mut visit: impl FnMut(usize, usize)) {
        let width = self.heads * self.dims;
        for h in 0..self.heads {
            for t in 0..self.time {
                visit(((b * self.heads + h) * self.time + t) * self.dims, t * parts * width + h * self.dims);
            }
        }
    }

    /// Sequence `b` of each of `tensors` (`[B, H, T, D]`), packed into the twin's layout `[T][n·H·D]`.
    fn pack<F: Real>(self, b: usize, tensors: &[&[F]]) -> Vec<F> {
        let (parts, width, d) = (tensors.len(), self.heads * self.dims, self.dims);
        let mut packed = vec![F::zero(); self.time * parts * width];
        self.rows(b, parts, |from, to| {
            for (part, tensor) in tensors.iter().enumerate() {
                packed[to + part * width..][..d].copy_from_slice(&tensor[from..][..d]);
            }
        });
        packed
    }

    /// `pack`'s inverse: `packed` (`[T][n·H·D]`) written into sequence `b` of each of `tensors`.
    fn unpack<F: Real>(self, b: usize, packed: &[F], tensors: &mut [&mut [F]]) {
        let (parts, width, d) = (tensors.len(), self.heads * self.dims, self.dims);
        self.rows(b, parts, |from, to| {
            for (part, tensor) in tensors.iter_mut().enumerate() {
                tensor[from..][..d].copy_from_slice(&packed[to + part * width..][..d]);
            }
        });
    }
}

/// softmax(q·kᵀ/√D)·v over the last two axes of q, k, v (`[B, H, T, D]` each), keys after the query masked
/// out when `causal`.
pub fn scaled_dot_product_attention<F: Real>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    causal: bool,
) -> Result<Tensor<F>> {
    let [batch, heads, time, dims] = *q.shape() else {
        return Err(Error::shape(OP, q.shape(), "is not [batch, heads, time, dims]"));
    };
    let others = [
        (k, "differ: k must have q's shape [batch, heads, time, dims]"),
        (v, "differ: v must have q's shape [batch, heads, time, dims]"),
    ];
    for (other, problem) in others {
        if other.shape() != q.shape() {
            return Err(Error::shapes(OP, q.shape(), other.shape(), problem));
        }
    }
    let sizes = Sizes { heads, time, dims };
    if let Place::Device(gpu) = cuda::place_of(OP, &[q, k, v])? {
        return device::attention(&gpu, (q, k, v), (batch, heads, time, dims), causal);
    }
    let (values_q, values_k, values_v) = (q.storage(), k.storage(), v.storage());
    let count = q.numel();
    let mut out = vec![F::zero(); count];
    // Each sequence's packed q, k, v and probabilities, kept for the backward.
    let mut saved = Vec::with_capacity(batch);
    for b in 0..batch {
        let qkv = sizes.pack(b, &[values_q.host(), values_k.host(), values_v.host()]);
        let (y, att) = sdp_attention(&qkv, time, heads, dims, causal, None);
        sizes.unpack(b, &y, &mut [&mut out]);
        saved.push((qkv, att));
    }
    let backward = move |grad: &[F], _needs: &[bool]| {
        let (mut grad_q, mut grad_k, mut grad_v) =
            (vec![F::zero(); count], vec![F::zero(); count], vec![F::zero(); count]);
        for (b, (qkv, att)) in saved.iter().enumerate() {
            let d_y = sizes.pack(b, &[grad]);
            let (_, _, d_qkv) = sdp_attention_backward(qkv, att, &d_y, time, heads, dims, causal, None);
            sizes.unpack(b, &d_qkv, &mut [&mut grad_q, &mut grad_k, &mut grad_v]);
        }
        Ok(vec![Some(grad_q), Some(grad_k), Some(grad_v)])
    };
    Ok(Tensor::from_op(OP, Arc::new(Storage::Host(out)), q.shape().to_vec(), &[q, k, v], Box::new(backward)))
}

/// Causal self-attention of packed rows, nanoGPT's `CausalSelfAttention` between its two linear layers in
/// one op (flash-attn's `flash_attn_qkvpacked_func`): `qkv` is `[B, T, 3C]`, each position's
/// `c_attn(x)` row [q | k | v] with head h at columns h·C/heads.. of each third, and the result `[B, T, C]`
/// has the heads side by side, as `y.transpose(1, 2).view(B, T, C)` after
/// `scaled_dot_product_attention(q, k, v, is_causal=True)` on the split heads. With `dropout` in training
/// (nanoGPT's `attn_dropout`), the probabilities are dropped by that layer's mask of its next step,
/// element ((b·heads + h)·T + t)·T + u.
///
/// The math is the twin's (`ops::attention::attention` and its backward, the Transformer's); on a GPU
/// (`cuda::attention`) the Transformer's attention kernels run on the tensors as they lie, in bf16 on the
/// tensor cores at `Precision::Bf16` (head sizes a multiple of 16), without the split and transposes'
/// copies and without keeping the T×T probabilities.
pub fn causal_self_attention<F: Real>(
    qkv: &Tensor<F>,
    heads: usize,
    dropout: Option<&super::Dropout>,
) -> Result<Tensor<F>> {
    const OP: &str = "causal_self_attention";
    let [batch, time, packed] = *qkv.shape() else {
        return Err(Error::shape(OP, qkv.shape(), "is not [batch, time, 3·embedding]"));
    };
    if heads == 0 || !packed.is_multiple_of(3 * heads) {
        let problem = format!("has a last axis that does not split into q, k and v of {heads} heads each");
        return Err(Error::shape(OP, qkv.shape(), problem));
    }
    if dropout.is_some_and(|d| d.p() == 1.0) {
        return Err(Error::value(OP, "dropout on the attention probabilities takes p < 1"));
    }
    let (width, head_size) = (packed / 3, packed / 3 / heads);
    if let Place::Device(gpu) = cuda::place_of(OP, &[qkv])? {
        let drop = match dropout {
            Some(layer) => layer.next_device_mask(&gpu)?.map(|(site_seed, step, threshold, scale)| {
                cuda::attention::AttentionDrop { site_seed, step, threshold, scale }
            }),
            None => None,
        };
        return cuda::attention::causal_self_attention(&gpu, qkv, (batch, time, heads, head_size), drop);
    }
    let mask = dropout.and_then(|layer| layer.next_mask());
    let drop = move |b: usize| mask.map(|mask| AttentionDropout { mask, first: b * heads * time * time, block: time });
    let values = qkv.storage();
    let sequence = time * packed;
    let mut out = Vec::with_capacity(batch * time * width);
    let mut saved = Vec::with_capacity(batch);
    for (b, rows) in values.host().chunks(sequence.max(1)).take(batch).enumerate() {
        let (y, probabilities) = attention(rows, time, heads, head_size, drop(b).as_ref());
        out.extend(y);
        saved.push(probabilities);
    }
    let backward = move |grad: &[F], _needs: &[bool]| {
        let mut grad_qkv = Vec::with_capacity(batch * sequence);
        for (b, probabilities) in saved.iter().enumerate() {
            let rows = &values.host()[b * sequence..][..sequence];
            let d_y = &grad[b * time * width..][..time * width];
            let (_, _, d_qkv) = attention_backward(rows, probabilities, d_y, time, heads, head_size, drop(b).as_ref());
            grad_qkv.extend(d_qkv);
        }
        Ok(vec![Some(grad_qkv)])
    };
    let shape = vec![batch, time, width];
    Ok(Tensor::from_op(OP, Arc::new(Storage::Host(out)), shape, &[qkv], Box::new(backward)))
}
