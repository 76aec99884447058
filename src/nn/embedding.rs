//! `embedding`, PyTorch's `F.embedding(ids, weight, padding_idx)`: row `id` of the weight `[V, D]` for each
//! id, in the ids' shape with D appended. Ids are integers given beside the tensor (tensors here hold
//! floats), each checked against 0..V.
//!
//! Backward: the weight's gradient is zero but for the rows looked up, each the sum of the output
//! gradients of its ids, added in the ids' order (a fixed order, so repeated ids round the same way every
//! run). The `padding_idx` row gets no gradient, as PyTorch's. On a GPU (`cuda::layers`) the ids go up as
//! ints, and each element of the weight's gradient sums its ids' rows in the same order.
//!
//! `index_rows`, PyTorch's `x[ids]` for a tensor of int64 ids: the same gather, with x's first axis as the
//! table's rows and the rest of its axes as one row (`index_rows_tensor` takes the ids in a tensor, on the
//! GPU where they stay there).

use super::cuda::{self, Place, layers as device};
use super::error::{Error, Result};
use super::tensor::{Storage, Tensor, element_count};
use crate::ops::cpu::Real;
use std::fmt::{Debug, Display};
use std::sync::Arc;

const OP: &str = "embedding";
/// The op `index_rows` reports as (Python's `x[ids]`).
const INDEX_OP: &str = "index";

/// The index in `shape` of the element at row-major offset `flat`.
fn position(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (i, &size) in index.iter_mut().zip(shape).rev() {
        *i = flat % size.max(1);
        flat /= size.max(1);
    }
    index
}

/// `op`'s error for the id at row-major offset `flat` of `ids_shape` (`id` as given: an integer, or the
/// float it was read from), `problem` what is wrong with it.
fn id_error(op: &'static str, id: impl Debug, flat: usize, ids_shape: &[usize], problem: impl Display) -> Error {
    Error::value(op, format!("id {id:?} at position {:?} {problem}", position(flat, ids_shape)))
}

/// `embedding`'s error for the id at row-major offset `flat` of `ids_shape` (`id` as given: an integer, or
/// the float it was read from), `problem` what is wrong with it.
pub(crate) fn bad_id(id: impl Debug, flat: usize, ids_shape: &[usize], problem: impl Display) -> Error {
    id_error(OP, id, flat, ids_shape, problem)
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

/// An error of `op` unless `ids` hold `ids_shape`'s element count.
fn count_of(op: &'static str, ids: &[i64], ids_shape: &[usize]) -> Result<()> {
    match element_count(ids_shape) {
        Some(count) if count == ids.len() => Ok(()),
        Some(count) => Err(Error::shape(op, ids_shape, format!("holds {count} ids, but {} were given", ids.len()))),
        None => Err(Error::shape(op, ids_shape, "has more elements than memory can address")),
    }
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
    count_of(OP, ids, ids_shape)?;
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

/// `index_rows`' error for the id at row-major offset `flat` of `ids_shape`, out of the range of an axis
/// of `rows` (`-rows..rows`).
fn out_of_range(id: impl Debug, flat: usize, ids_shape: &[usize], rows: usize) -> Error {
    id_error(INDEX_OP, id, flat, ids_shape, format_args!("is out of range for axis 0 of size {rows}"))
}

/// `x`'s first axis and the element count of the others, as the rows and the row width of a table; an
/// error for a scalar, which has no rows.
fn as_rows<F: Real>(x: &Tensor<F>) -> Result<(usize, usize)> {
    let Some((&rows, rest)) = x.shape().split_first() else {
        return Err(Error::shape(INDEX_OP, x.shape(), "has no axis 0 to index"));
    };
    // The element count of `x`'s shape fits, so the rest's does.
    Ok((rows, rest.iter().product()))
}

/// `x` as the table `[rows, width]` of `as_rows` (itself when it has two axes; else a reshape, through
/// which the gradient flows back).
fn table<F: Real>(x: &Tensor<F>, (rows, width): (usize, usize)) -> Result<Tensor<F>> {
    if x.rank() == 2 { Ok(x.clone()) } else { x.reshape(&[rows, width]) }
}

/// `x[ids]` for int64 ids, as PyTorch's (`torch.index_select(x, 0, ids)`, which also takes negative ids):
/// the slice `x[id]` along the first axis for each id, in shape `ids_shape` + `x.shape()[1..]` (`ids` hold
/// `ids_shape`'s element count, row-major). A negative id counts from the end; an id out of `-rows..rows`
/// is an error (`Error::Value`) naming it, its position and the axis's size. The gradient of `x` is zero
/// but for the slices looked up, each the sum of the output gradients of its ids, added in the ids' order
/// (`embedding`'s backward, on `x` seen as a table of rows). On a GPU the ids go up as `embedding`'s.
pub fn index_rows<F: Real>(x: &Tensor<F>, ids: &[i64], ids_shape: &[usize]) -> Result<Tensor<F>> {
    let (rows, width) = as_rows(x)?;
    count_of(INDEX_OP, ids, ids_shape)?;
    let size = i64::try_from(rows).unwrap_or(i64::MAX);
    let looked_up = (ids.iter().enumerate())
        .map(|(flat, &id)| {
            let row = if id < 0 { id.checked_add(size) } else { Some(id) };
            row.filter(|row| (0..size).contains(row)).ok_or_else(|| out_of_range(id, flat, ids_shape, rows))
        })
        .collect::<Result<Vec<i64>>>()?;
    let rows_out = embedding(&table(x, (rows, width))?, &looked_up, ids_shape, None)?;
    let shape = [ids_shape, &x.shape()[1..]].concat();
    if rows_out.shape() == shape { Ok(rows_out) } else { rows_out.reshape(&shape) }
}

/// `index_rows` with the ids in the tensor `ids` (whole numbers held as floats, in its shape). On a GPU,
/// where both tensors must live, the ids are read where they are and never copied back (a captured step
/// reads each replay's), so they are not checked: an id that is not a row of `x` (negative, `rows` or
/// past, not whole) gives a slice of NaN, as `Embedding::forward`'s. On the host each id must be a whole
/// number and is checked as `index_rows`'s (a negative one counts from the end). `x` keeps its flags: it
/// need not be a leaf, and gets a gradient only when it requires one.
pub fn index_rows_tensor<F: Real>(x: &Tensor<F>, ids: &Tensor<F>) -> Result<Tensor<F>> {
    let (rows, width) = as_rows(x)?;
    if let Place::Device(gpu) = cuda::place_of(INDEX_OP, &[x, ids])? {
        let shape = [ids.shape(), &x.shape()[1..]].concat();
        return device::embedding_ids(&gpu, (&table(x, (rows, width))?, ids), (rows, width), None, shape);
    }
    let whole = (ids.to_vec().into_iter().enumerate())
        .map(|(flat, id)| {
            if !id.is_finite() || id.fract() != F::zero() {
                return Err(id_error(INDEX_OP, id, flat, ids.shape(), "is not an integer"));
            }
            id.to_i64().ok_or_else(|| out_of_range(id, flat, ids.shape(), rows))
        })
        .collect::<Result<Vec<i64>>>()?;
    index_rows(x, &whole, ids.shape())
}
