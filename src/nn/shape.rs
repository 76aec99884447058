//! Shapes: NumPy's broadcasting rule, the strides that read a tensor as broadcast into a larger shape (0
//! along a broadcast axis), a walk over every element of a shape with the offsets of its operands, and
//! axes counted from the end (`-1` the last).

use super::error::{Error, Result};

/// The shape `a` and `b` broadcast to: aligned at their last axes, each pair of sizes equal or one of
/// them 1. None when they do not broadcast.
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let size = |shape: &[usize], axis: usize| {
        let pad = rank - shape.len();
        if axis < pad { 1 } else { shape[axis - pad] }
    };
    (0..rank)
        .map(|axis| match (size(a, axis), size(b, axis)) {
            (x, y) if x == y || y == 1 => Some(x),
            (1, y) => Some(y),
            _ => None,
        })
        .collect()
}

/// Row-major strides of a contiguous tensor of `shape`.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut step = 1;
    for (stride, &size) in strides.iter_mut().zip(shape).rev() {
        *stride = step;
        step *= size;
    }
    strides
}

/// The strides (one per axis of `out`) that read a contiguous tensor of `shape` as broadcast into `out`:
/// 0 along the axes `shape` lacks or has of size 1.
pub(crate) fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let pad = out.len() - shape.len();
    let own = contiguous_strides(shape);
    (0..out.len()).map(|axis| if axis < pad || shape[axis - pad] == 1 { 0 } else { own[axis - pad] }).collect()
}

/// Calls `visit(i, offsets)` for every element `i` of `out` in row-major order, `offsets[k]` the offset
/// in operand k under `strides[k]`.
pub(crate) fn for_each_offset<const N: usize>(
    out: &[usize],
    strides: [&[usize]; N],
    mut visit: impl FnMut(usize, [usize; N]),
) {
    let total: usize = out.iter().product();
    let mut index = vec![0usize; out.len()];
    let mut offsets = [0usize; N];
    for i in 0..total {
        visit(i, offsets);
        for axis in (0..out.len()).rev() {
            index[axis] += 1;
            offsets.iter_mut().zip(&strides).for_each(|(o, s)| *o += s[axis]);
            if index[axis] < out[axis] {
                break;
            }
            offsets.iter_mut().zip(&strides).for_each(|(o, s)| *o -= s[axis] * out[axis]);
            index[axis] = 0;
        }
    }
}

/// `shape` seen as (outer, axis, inner) around `axis`: element (o, k, i) at (o·n + k)·inner + i.
pub(crate) fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product())
}

/// `axis` of `shape` as an index from the front; a negative one counts from the end (-1 is the last).
pub(crate) fn axis_index(op: &'static str, shape: &[usize], axis: isize) -> Result<usize> {
    let rank = shape.len() as isize;
    let from_front = if axis < 0 { axis + rank } else { axis };
    if (0..rank).contains(&from_front) {
        Ok(from_front as usize)
    } else {
        Err(Error::shape(op, shape, format!("has no axis {axis} ({} axes)", shape.len())))
    }
}
