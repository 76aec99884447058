//! The device forward and backward of the layers' ops — `layer_norm`, `embedding`, `dropout` and
//! `scaled_dot_product_attention` — launching the layers section of `fused/nn.cu`: the twins of the host
//! paths in `nn/norm.rs`, `embedding.rs`, `dropout.rs` and `attention.rs`, which check their arguments
//! first and call in here when the operands live on a GPU. Every sum runs in a fixed order with no
//! atomics: a sum over rows (LayerNorm's weight and bias, an embedding row's ids, attention's keys and
//! values over queries) is one thread's loop, in the host's order.

use super::fusion::{DropoutSite, Extra, NormParams, Want};
use super::ops::{bf16_buffer, buffer, int, optional, rows_per_part, sum_axis, warp_row_blocks};
use super::{Device, DeviceBuffer};
use crate::device::launch::Arg;
use crate::nn::error::Result;
use crate::nn::tensor::Tensor;
use crate::ops::cpu::Real;
use crate::ops::dropout::Mask;
use std::sync::Arc;

/// LayerNorm of `x` over rows of `width` with ε `eps`; `weight` and `bias` (`[width]`) are optional.
pub(crate) fn layer_norm<F: Real>(
    device: &Arc<Device>,
    (x, weight, bias): (&Tensor<F>, Option<&Tensor<F>>, Option<&Tensor<F>>),
    width: usize,
    eps: f32,
) -> Result<Tensor<F>> {
    const NAME: &str = "layer_norm";
    let rows = x.numel().checked_div(width).unwrap_or(0);
    let (rows_arg, width_arg) = (Arg::i32(int(NAME, rows)?), Arg::i32(int(NAME, width)?));
    let (xb, wb, bb) = (buffer(x), weight.map(buffer), bias.map(buffer));
    let producer = device.producer(NAME);
    let params = NormParams::new(wb.as_ref(), bb.as_ref(), eps, width);
    let reader = producer.as_ref().map_or(usize::MAX, |p| p.number);
    device.want(&xb, Want::LayerNorm { params, reader, bf16: false });
    let (out, mean, rstd) = match xb.layer_norm_extra((wb.as_ref(), bb.as_ref()), eps, width) {
        Some(made) => {
            device.fused("add → layer_norm: the sum and its norm in one kernel".into());
            made
        }
        None => {
            let (out, mean, rstd) =
                (device.alloc(NAME, x.numel())?, device.alloc(NAME, rows)?, device.alloc(NAME, rows)?);
            let copy = producer
                .as_ref()
                .is_some_and(|p| p.bf16())
                .then(|| bf16_buffer(device, NAME, x.numel()))
                .transpose()?;
            let no = Arg::Ptr(0);
            let (w_arg, b_arg) = (optional(device, wb.as_ref()), optional(device, bb.as_ref()));
            let args = [device.arg(&xb), no, no, w_arg, b_arg, device.arg(&out), optional(device, copy.as_ref())];
            let args =
                [&args[..], &[device.arg(&mean), device.arg(&rstd), rows_arg, width_arg, Arg::f32(eps)]].concat();
            device.launch(NAME, &device.kernels.layer_norm, warp_row_blocks(rows), 0, &args)?;
            if let Some(copy) = copy {
                out.attach(Extra::Bf16(copy));
            }
            (out, mean, rstd)
        }
    };
    out.made_by_producer(producer.as_ref());
    let (device_, has_bias) = (Arc::clone(device), bias.is_some());
    let backward = move |grad: &DeviceBuffer, needs: &[bool]| {
        let d = &device_;
        let (x_arg, mean_arg, rstd_arg) = (d.arg(&xb), d.arg(&mean), d.arg(&rstd));
        let dx = if needs[0] {
            let dx = d.alloc(NAME, rows * width)?;
            let args =
                [x_arg, optional(d, wb.as_ref()), mean_arg, rstd_arg, d.arg(grad), d.arg(&dx), rows_arg, width_arg];
            d.launch(NAME, &d.kernels.layer_norm_grad, warp_row_blocks(rows), 0, &args)?;
            Some(dx)
        } else {
            None
        };
        // needs: x's, then the weight's and the bias's when given.
        let want_weight = wb.is_some() && needs[1];
        let want_bias = has_bias && needs[needs.len() - 1];
        // Sums over the rows, in parts of rows that `sum_axis` then adds in order (a thread per column alone
        // would walk every row).
        let per_part = rows_per_part(rows, width);
        let parts = rows.div_ceil(per_part).max(1);
        let part = |want: bool| if want { d.alloc(NAME, parts * width).map(Some) } else { Ok(None) };
        let (dw_parts, db_parts) = (part(want_weight)?, part(want_bias)?);
        if want_weight || want_bias {
            let (dw_arg, db_arg) = (optional(d, dw_parts.as_ref()), optional(d, db_parts.as_ref()));
            let args = [x_arg, mean_arg, rstd_arg, d.arg(grad), dw_arg, db_arg, rows_arg, width_arg];
            let args = [&args[..], &[Arg::i32(int(NAME, per_part)?)]].concat();
            d.launch(NAME, &d.kernels.layer_norm_grad_affine, d.blocks_for(parts * width), 0, &args)?;
        }
        let total = |p: Option<DeviceBuffer>| p.map(|p| sum_axis(d, NAME, &p, (1, parts, width), 1.0)).transpose();
        let (dw, db) = (total(dw_parts)?, total(db_parts)?);
        let mut grads = vec![dx];
        grads.extend(wb.is_some().then_some(dw));
        grads.extend(has_bias.then_some(db));
        Ok(grads)
    };
    let inputs: Vec<&Tensor<F>> = [Some(x), weight, bias].into_iter().flatten().collect();
    Ok(Tensor::from_device_op(NAME, out, x.shape().to_vec(), &inputs, Box::new(backward)))
}

/// The positions of `ids` grouped by row, for `nn_embedding_grad`: `starts` (rows + 1 offsets) and
/// `positions`, row v's at `starts[v]..starts[v + 1]` in ascending order (a counting sort); the ids equal
/// to `padding` are left out, so that row's gradient is 0.
fn positions_by_row(ids: &[usize], rows: usize, padding: Option<usize>) -> (Vec<i32>, Vec<i32>) {
    let counted = |id: usize| Some(id) != padding;
    let mut starts = vec![0i32; rows + 1];
    for &id in ids.iter().filter(|&&id| counted(id)) {
        starts[id + 1] += 1;
    }
    for row in 0..rows {
        starts[row + 1] += starts[row];
    }
    let mut next = starts.clone();
    let mut positions = vec![0i32; starts[rows] as usize];
    for (position, &id) in ids.iter().enumerate().filter(|&(_, &id)| counted(id)) {
        positions[next[id] as usize] = position as i32;
        next[id] += 1;
    }
    (starts, positions)
}

/// The rows of `weight` (`[rows, dims]`) at `ids` (each checked to be a row), in `shape`; the `padding`
/// row gets no gradient.
pub(crate) fn embedding<F: Real>(
    device: &Arc<Device>,
    weight: &Tensor<F>,
    ids: Vec<usize>,
    (rows, dims): (usize, usize),
    padding: Option<usize>,
    shape: Vec<usize>,
) -> Result<Tensor<F>> {
    const NAME: &str = "embedding";
    let count = ids.len();
    let (rows_arg, dims_arg, count_arg) =
        (Arg::i32(int(NAME, rows)?), Arg::i32(int(NAME, dims)?), Arg::i32(int(NAME, count)?));
    // The kernels index the output and the weight's gradient with an int.
    int(NAME, count * dims)?;
    int(NAME, rows * dims)?;
    let codes: Vec<i32> = ids.iter().map(|&id| id as i32).collect();
    let codes = device.upload_i32(NAME, &codes)?;
    let out = device.alloc(NAME, count * dims)?;
    let args = [device.arg(&buffer(weight)), Arg::buf(&device.gpu, &codes), device.arg(&out), count_arg, dims_arg];
    device.launch(NAME, &device.kernels.embedding, device.blocks_for(count * dims), 0, &args)?;
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        let d = &device_;
        let (starts, positions) = positions_by_row(&ids, rows, padding);
        let (starts, positions) = (d.upload_i32(NAME, &starts)?, d.upload_i32(NAME, &positions)?);
        let dw = d.alloc(NAME, rows * dims)?;
        let args = [Arg::buf(&d.gpu, &starts), Arg::buf(&d.gpu, &positions), d.arg(grad), d.arg(&dw)];
        let args = [&args[..], &[rows_arg, dims_arg]].concat();
        d.launch(NAME, &d.kernels.embedding_grad, d.blocks_for(rows * dims), 0, &args)?;
        Ok(vec![Some(dw)])
    };
    Ok(Tensor::from_device_op(NAME, out, shape, &[weight], Box::new(backward)))
}

/// The rows of `weight` (`[rows, dims]`) at the ids `ids` holds as floats on the device (a captured step
/// reads each replay's), in `shape`; an id that is not a row gives a row of NaN (checking it on the host
/// would read the ids back). The `padding` row gets no gradient.
pub(crate) fn embedding_ids<F: Real>(
    device: &Arc<Device>,
    (weight, ids): (&Tensor<F>, &Tensor<F>),
    (rows, dims): (usize, usize),
    padding: Option<usize>,
    shape: Vec<usize>,
) -> Result<Tensor<F>> {
    const NAME: &str = "embedding";
    let count = ids.numel();
    let (rows_arg, dims_arg, count_arg) =
        (Arg::i32(int(NAME, rows)?), Arg::i32(int(NAME, dims)?), Arg::i32(int(NAME, count)?));
    int(NAME, count * dims)?;
    int(NAME, rows * dims)?;
    let padding_arg = Arg::i32(padding.map_or(Ok(-1), |p| int(NAME, p))?);
    let codes = buffer(ids);
    let out = device.alloc(NAME, count * dims)?;
    let args = [device.arg(&buffer(weight)), device.arg(&codes), device.arg(&out), count_arg, rows_arg, dims_arg];
    device.launch(NAME, &device.kernels.embedding_ids, device.blocks_for(count * dims), 0, &args)?;
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        let d = &device_;
        let (per_part, parts) = id_parts(count, rows * dims);
        let sums = d.alloc(NAME, parts * rows * dims)?;
        let args = [d.arg(&codes), d.arg(grad), d.arg(&sums), count_arg, rows_arg, dims_arg, padding_arg];
        let args = [&args[..], &[Arg::i32(int(NAME, per_part)?), Arg::i32(int(NAME, parts)?)]].concat();
        d.launch(NAME, &d.kernels.embedding_ids_grad, d.blocks_for(parts * rows * dims), 0, &args)?;
        let dw = if parts > 1 { sum_axis(d, NAME, &sums, (1, parts, rows * dims), 1.0)? } else { sums };
        Ok(vec![Some(dw)])
    };
    Ok(Tensor::from_device_op(NAME, out, shape, &[weight], Box::new(backward)))
}

/// The parts of the ids `nn_embedding_ids_grad` sums each in one thread, as (ids a part, parts): parts of
/// 128 ids, as many as keep the partial sums under 2^24 floats.
fn id_parts(count: usize, outputs: usize) -> (usize, usize) {
    let parts = (count / 128).min((1 << 24) / outputs.max(1)).max(1);
    let per_part = count.div_ceil(parts).max(1);
    (per_part, count.div_ceil(per_part).max(1))
}

/// `input` times the factors of `mask` (each element's scale or 0; every one 0 when `all_dropped`), in a
/// new buffer: dropout's forward, and its backward on the gradient.
fn masked(device: &Arc<Device>, input: &DeviceBuffer, mask: Mask, all_dropped: bool) -> Result<DeviceBuffer> {
    const NAME: &str = "dropout";
    // p = 1: the mask's scale is infinite; a scale of 0 makes every factor 0, as the host's.
    let scale = if all_dropped { 0.0 } else { mask.scale };
    let out = device.alloc(NAME, input.len())?;
    let args = [device.arg(input), device.arg(&out), Arg::i32(int(NAME, input.len())?)];
    let args = [&args[..], &[Arg::u32(mask.key), Arg::u32(mask.threshold), Arg::f32(scale)]].concat();
    device.launch(NAME, &device.kernels.dropout, device.blocks_for(input.len()), 0, &args)?;
    Ok(out)
}

/// Dropout of `x` by `mask` (the host's, so both draw the same elements); p = 1 when `all_dropped`.
pub(crate) fn dropout<F: Real>(
    device: &Arc<Device>,
    x: &Tensor<F>,
    mask: Mask,
    all_dropped: bool,
) -> Result<Tensor<F>> {
    if device.is_capturing() {
        // The mask's step is a kernel argument from the host: a graph would replay one mask for every step.
        let problem = "its mask's step comes from the host, so a captured step would reuse one mask (the Dropout \
                       layer counts its steps on the device): the step runs op by op";
        return Err(crate::nn::Error::device("dropout", problem));
    }
    let out = masked(device, &buffer(x), mask, all_dropped)?;
    let device_ = Arc::clone(device);
    let backward =
        move |grad: &DeviceBuffer, _needs: &[bool]| Ok(vec![Some(masked(&device_, grad, mask, all_dropped)?)]);
    Ok(Tensor::from_device_op("dropout", out, x.shape().to_vec(), &[x], Box::new(backward)))
}

/// `input` times the factors of the mask under the key in device memory `key`, in a new buffer.
fn masked_by_key(
    device: &Arc<Device>,
    input: &DeviceBuffer,
    key: &DeviceBuffer,
    (threshold, scale): (u32, f32),
) -> Result<DeviceBuffer> {
    const NAME: &str = "dropout";
    let out = device.alloc(NAME, input.len())?;
    let args = [device.arg(input), device.arg(&out), Arg::i32(int(NAME, input.len())?), device.arg(key)];
    let args = [&args[..], &[Arg::u32(threshold), Arg::f32(scale)]].concat();
    device.launch(NAME, &device.kernels.dropout_keyed, device.blocks_for(input.len()), 0, &args)?;
    Ok(out)
}

/// Dropout of `x` with the mask of the step counted on the device: `step` (one word, the `Dropout`
/// layer's) is read and advanced by the GPU, so each replay of a captured step draws the next step's mask,
/// the same one `ops::dropout::Mask` gives for that step on the host. `site_seed` is
/// `ops::dropout::site_seed`; threshold and scale are the mask's (scale 0 when p = 1).
pub(crate) fn dropout_counted<F: Real>(
    device: &Arc<Device>,
    x: &Tensor<F>,
    step: &DeviceBuffer,
    site_seed: u32,
    (threshold, scale): (u32, f32),
) -> Result<Tensor<F>> {
    const NAME: &str = "dropout";
    let input = buffer(x);
    let site = DropoutSite { step: step.downgrade(), site_seed, threshold, scale };
    device.want(&input, Want::Dropout(site));
    let (out, key) = match input.dropout_extra(step, site_seed, (threshold, scale)) {
        Some(fused) => {
            device.fused("linear → dropout: the mask in the product's epilogue".into());
            fused
        }
        None => {
            let key = draw_key(device, step, site_seed)?;
            (masked_by_key(device, &input, &key, (threshold, scale))?, key)
        }
    };
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        Ok(vec![Some(masked_by_key(&device_, grad, &key, (threshold, scale))?)])
    };
    Ok(Tensor::from_device_op(NAME, out, x.shape().to_vec(), &[x], Box::new(backward)))
}

/// A new word holding the key of the dropout at `site_seed` in the step counted by `step`, which advances
/// by one (`nn_dropout_draw`).
pub(crate) fn draw_key(device: &Arc<Device>, step: &DeviceBuffer, site_seed: u32) -> Result<DeviceBuffer> {
    const NAME: &str = "dropout";
    let key = device.alloc(NAME, 1)?;
    let args = [Arg::u32(site_seed), device.arg(step), device.arg(&key)];
    device.launch(NAME, &device.kernels.dropout_draw, (1, 1), 0, &args)?;
    device.drew_mask();
    Ok(key)
}

/// A new word holding the value of the step counter `step`, which advances by one (`nn_take_step`).
pub(crate) fn take_step(device: &Arc<Device>, step: &DeviceBuffer) -> Result<DeviceBuffer> {
    device.drew_mask();
    let taken = device.alloc("dropout", 1)?;
    device.launch("dropout", &device.kernels.take_step, (1, 1), 0, &[device.arg(step), device.arg(&taken)])?;
    Ok(taken)
}

/// softmax(q·kᵀ/√D)·v for q, k, v `[batch, heads, time, dims]` (checked equal), keys after the query masked
/// when `causal`; the probabilities `[batch·heads·time, time]` are kept for the backward.
pub(crate) fn attention<F: Real>(
    device: &Arc<Device>,
    (q, k, v): (&Tensor<F>, &Tensor<F>, &Tensor<F>),
    (batch, heads, time, dims): (usize, usize, usize, usize),
    causal: bool,
) -> Result<Tensor<F>> {
    const NAME: &str = "scaled_dot_product_attention";
    let rows = batch * heads * time;
    let count = rows * dims;
    let (rows_arg, count_arg) = (Arg::i32(int(NAME, rows)?), Arg::i32(int(NAME, count)?));
    let sizes = [Arg::i32(int(NAME, time)?), Arg::i32(int(NAME, dims)?)];
    // 1/√D as the twin computes it in f32 (ops::attention::sdp_attention).
    let scale = Arg::f32(1.0 / (dims as f32).sqrt());
    let causal = Arg::i32(causal as i32);
    let (qb, kb, vb) = (buffer(q), buffer(k), buffer(v));
    let (out, probabilities) = (device.alloc(NAME, count)?, device.alloc(NAME, rows * time)?);
    let args = [device.arg(&qb), device.arg(&kb), device.arg(&vb), device.arg(&out), device.arg(&probabilities)];
    let args = [&args[..], &[rows_arg], &sizes, &[scale, causal]].concat();
    device.launch(NAME, &device.kernels.attention, warp_row_blocks(rows), 0, &args)?;
    let device_ = Arc::clone(device);
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        let d = &device_;
        let scores_grad = d.alloc(NAME, rows * time)?;
        let (dq, dk, dv) = (d.alloc(NAME, count)?, d.alloc(NAME, count)?, d.alloc(NAME, count)?);
        let args = [d.arg(&kb), d.arg(&vb), d.arg(&probabilities), d.arg(grad), d.arg(&scores_grad), d.arg(&dq)];
        let args = [&args[..], &[rows_arg], &sizes, &[scale, causal]].concat();
        d.launch(NAME, &d.kernels.attention_grad_q, warp_row_blocks(rows), 0, &args)?;
        let args = [d.arg(&qb), d.arg(&probabilities), d.arg(&scores_grad), d.arg(grad), d.arg(&dk), d.arg(&dv)];
        let args = [&args[..], &[count_arg], &sizes, &[causal]].concat();
        d.launch(NAME, &d.kernels.attention_grad_kv, d.blocks_for(count), 0, &args)?;
        Ok(vec![Some(dq), Some(dk), Some(dv)])
    };
    Ok(Tensor::from_device_op(NAME, out, q.shape().to_vec(), &[q, k, v], Box::new(backward)))
}

#[cfg(test)]
mod tests {
    use super::positions_by_row;

    #[test]
    fn positions_are_grouped_by_row_in_ascending_order_without_padding() {
        let ids = [2, 0, 2, 3, 0, 2];
        let (starts, positions) = positions_by_row(&ids, 4, None);
        assert_eq!(starts, [0, 2, 2, 5, 6]);
        assert_eq!(positions, [1, 4, 0, 2, 5, 3]);
        let (starts, positions) = positions_by_row(&ids, 4, Some(2));
        assert_eq!(starts, [0, 2, 2, 2, 3]);
        assert_eq!(positions, [1, 4, 3]);
        assert_eq!(positions_by_row(&[], 1, None), (vec![0, 0], vec![]));
    }
}
