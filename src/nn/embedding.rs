//! `embedding`, PyTorch's `F.embedding(ids, weight, padding_idx)`: row `id` of the weight `[V, D]` for each
//! id, in the ids' shape with D appended. Ids are integers given beside the tensor (tensors here hold
//! floats), each checked against 0..V.
//!
//! Backward: the weight's gradient is zero but for the rows looked up, each the sum of the output
//! gradients of its ids, added in the ids' order (a fixed order, so repeated ids round the same way every
//! run). The `padding_idx` row gets no gradient, as PyTorch's. On a GPU (`cuda::layers`) the ids go up as
//! ints, and each element of the weight's gradient sums its ids' rows in the same order.

use super::cuda::{self, Place, layers as device};
use super::error::{Error, Result};
use super::tensor::{Storage, Tensor, element_count};
use crate::ops::cpu::Real;
use std::fmt::{Debug, Display};
use std::sync::Arc;

const OP: &str = "embedding";

/// The index in `shape` of the element at row-major offset `flat`.
fn position(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (i, &size) in index.iter_mut().zip(shape).rev() {
        *i = flat % size.max(1);
        flat /= size.max(1);
    }
    index
}

/// The error for the id at row-major offset `flat` of `ids_shape` (`id` as given: an integer, or the float
/// it was read from), `problem` what is wrong with it.
pub(crate) fn bad_id(id: impl Debug, flat: usize, ids_shape: &[usize], problem: impl Display) -> Error {
    Error::value(OP, format!("id {id:?} at position {:?} {problem}", position(flat, ids_shape)))
}

/// `bad_id` for an id that is not a row of a weight of `rows` rows.
pub(crate) fn not_a_row(id: impl Debug, flat: usize, ids_shape: &[usize], rows: usize) -> Error {
    bad_id(id, flat, ids_shape, format_args!("is not a row of the weight's 0..{rows}"))
}

/// `padding_idx` as a row of a weight of `rows` rows: a negative one counts from the end, as PyTorch's.
pub(crate) fn padding_row(padding_idx: i64, rows: usize) -> Result<usize> {
    let from_front = if padding_idx < 0 { padding_idx + rows as i64 } else { padding_idx };
    usize::try_from(from_front).ok().filter(|&row| row < rows).ok_or_else(|| {
        Error::value(OP, format!("padding_idx {padding_idx} is not a row of the weight (-{rows}..{rows})"))
    })
}

/// The rows of `weight` (`[V, D]`) at `ids`, in shape `ids_shape` + `[D]`; `ids` hold `ids_shape`'s element
/// count, row-major, each in 0..V. The row `padding_idx` (negative: from the end) gets no gradient.
pub fn embedding<F: Real>(
    weight: &Tensor<F>,
    ids: &[i64],
    ids_shape: &[usize],
    padding_idx: Option<i64>,
) -> Result<Tensor<F>> {
    let [rows, dims] = *weight.shape() else {
        return Err(Error::shape(OP, weight.shape(), "is not a weight of two axes [num_embeddings, embedding_dim]"));
    };
    match element_count(ids_shape) {
        Some(count) if count == ids.len() => {}
        Some(count) => {
            return Err(Error::shape(OP, ids_shape, format!("holds {count} ids, but {} were given", ids.len())));
        }
        None => return Err(Error::shape(OP, ids_shape, "has more elements than memory can address")),
    }
    let padding = padding_idx.map(|p| padding_row(p, rows)).transpose()?;
    let looked_up = (ids.iter().enumerate())
        .map(|(flat, &id)| {
            usize::try_from(id).ok().filter(|&row| row < rows).ok_or_else(|| not_a_row(id, flat, ids_shape, rows))
        })
        .collect::<Result<Vec<usize>>>()?;
    let shape = [ids_shape, &[dims]].concat();
    if let Place::Device(gpu) = cuda::place_of(OP, &[weight])? {
        return device::embedding(&gpu, weight, looked_up, (rows, dims), padding, shape);
    }
    let values = weight.storage();
    let table = values.host();
    let out: Vec<F> = looked_up.iter().flat_map(|&row| &table[row * dims..][..dims]).copied().collect();
    let backward = move |grad: &[F], _needs: &[bool]| {
        let mut grad_w = vec![F::zero(); rows * dims];
        for (&row, from) in looked_up.iter().zip(grad.chunks_exact(dims.max(1))) {
            if Some(row) != padding {
                let to = &mut grad_w[row * dims..][..dims];
                to.iter_mut().zip(from).for_each(|(t, &g)| *t = *t + g);
            }
        }
        Ok(vec![Some(grad_w)])
    };
    Ok(Tensor::from_op(OP, Arc::new(Storage::Host(out)), shape, &[weight], Box::new(backward)))
}
