//! The optimizer's and `clip_grad_norm`'s launches: many tensors a launch, as PyTorch's multi-tensor
//! (foreach / fused) Adam and `clip_grad_norm_`, where one launch per parameter (and one to count its step)
//! ran before. Each launch takes a table of tensors by value, its first kernel parameter (`UpdateTable` or
//! `ChunkTable` of fused/nn.cu, written byte by byte in their C layout by `table`), and runs a block per (tensor,
//! chunk); a list longer than a table takes a launch per table.
//!
//! - [`update_tensors`]: per table, `nn_update_tensors` (optim.cuh's update of every element, as the
//!   host's `ops::optim::update`, chunks of `UPDATE_CHUNK`), whose last block advances each parameter's
//!   step count.
//! - [`clip_norm`]: `nn_sum_squares_chunks` (Σg² of each chunk in f32, a fixed tree, into a slot of its
//!   own), then `nn_clip_factor` (the slots summed in f64, in a fixed order, by one block: the norm and the
//!   factor); [`scale_tensors`]: `nn_scale_chunks`, each gradient times the factor.
//!
//! The clip's chunk size, `TENSOR_CHUNK`, is a constant, so the clip's slots, and so its norm, repeat to the bit on any GPU.

use super::ops::int;
use super::table::{Field, address, field, first_blocks, float_value, int_value, table_bytes};
use super::{Device, DeviceBuffer, Ticket};
use crate::device::{launch::Arg, launch::StructArg};
use crate::nn::error::{Error, Result};
use crate::ops::optim::{OptimKind, StepScalars};
use std::sync::Arc;

/// Elements a block of the clip's kernels takes (TENSOR_CHUNK in fused/nn.cu).
pub(crate) const TENSOR_CHUNK: usize = 8192;

/// Elements a block of the update takes (UPDATE_CHUNK).
pub(super) const UPDATE_CHUNK: usize = 1024;
/// Parameters an optimizer launch takes (UPDATE_TABLE_TENSORS).
const UPDATE_TABLE_TENSORS: usize = 64;
/// Gradients a clip launch takes (CHUNK_TABLE_TENSORS).
const CHUNK_TABLE_TENSORS: usize = 128;

/// fused/nn.cu's `UpdateTable`.
pub(super) const UPDATE_TABLE: [Field; 10] = [
    field("theta", 8, UPDATE_TABLE_TENSORS),
    field("grad", 8, UPDATE_TABLE_TENSORS),
    field("m", 8, UPDATE_TABLE_TENSORS),
    field("v", 8, UPDATE_TABLE_TENSORS),
    field("steps", 8, UPDATE_TABLE_TENSORS),
    field("n", 4, UPDATE_TABLE_TENSORS),
    field("lr_scale", 4, UPDATE_TABLE_TENSORS),
    field("weight_decay", 4, UPDATE_TABLE_TENSORS),
    field("first_block", 4, UPDATE_TABLE_TENSORS + 1),
    field("count", 4, 1),
];

/// fused/nn.cu's `ChunkTable`.
pub(super) const CHUNK_TABLE: [Field; 6] = [
    field("x", 8, CHUNK_TABLE_TENSORS),
    field("out", 8, CHUNK_TABLE_TENSORS),
    field("n", 4, CHUNK_TABLE_TENSORS),
    field("times", 4, CHUNK_TABLE_TENSORS),
    field("first_block", 4, CHUNK_TABLE_TENSORS + 1),
    field("count", 4, 1),
];

/// `items` cut into runs of at most `capacity`, a new run also where an item's `key` is already in the
/// current one (so that a launch per run sees the writes of the run before it in order).
fn runs<T>(items: &[T], capacity: usize, key: impl Fn(&T) -> u64) -> Vec<&[T]> {
    let mut runs = Vec::new();
    let mut start = 0;
    for (i, item) in items.iter().enumerate() {
        if i - start == capacity || items[start..i].iter().any(|earlier| key(earlier) == key(item)) {
            runs.push(&items[start..i]);
            start = i;
        }
    }
    if start < items.len() {
        runs.push(&items[start..]);
    }
    runs
}

/// One parameter of an optimizer step on the device: θ (updated in place), its gradient, the optimizer's
/// moments (those the kind keeps), its step count (one float, advanced by the step) and its group's
/// settings.
pub(crate) struct UpdateEntry {
    pub(crate) theta: DeviceBuffer,
    pub(crate) grad: DeviceBuffer,
    pub(crate) moments: (Option<DeviceBuffer>, Option<DeviceBuffer>),
    pub(crate) steps: DeviceBuffer,
    pub(crate) lr_scale: f32,
    pub(crate) weight_decay: f32,
}

/// One optimizer step of every parameter of `entries` (`fused/optim.cuh`'s update, of `kind` with the
/// scalars `s` but the rate base_lr[0]·lr_scale and Adam's bias corrections from each step count, both
/// read on the device): per table of up to 64 parameters, one launch updating θ and the moments in place
/// and advancing the step counts. A θ listed twice waits for the next table.
pub(crate) fn update_tensors(
    device: &Arc<Device>,
    kind: OptimKind,
    s: &StepScalars,
    base_lr: &DeviceBuffer,
    entries: &[UpdateEntry],
) -> Result<()> {
    const NAME: &str = "optimizer step";
    for e in entries {
        let (n, (m, v)) = (e.theta.len(), kind.buffer_lens(e.theta.len()));
        let lens =
            (e.grad.len(), e.moments.0.as_ref().map_or(0, |b| b.len()), e.moments.1.as_ref().map_or(0, |b| b.len()));
        if lens != (n, m, v) {
            let problem = format!("a parameter of {n} elements came with a gradient, m and v of {lens:?}");
            return Err(Error::device(NAME, problem));
        }
    }
    for run in runs(entries, UPDATE_TABLE_TENSORS, |e| e.theta.address()) {
        let first = first_blocks(NAME, run.iter().map(|e| e.theta.len()), UPDATE_CHUNK)?;
        let blocks = *first.last().expect("first_blocks starts at 0");
        let buffers = |pick: fn(&UpdateEntry) -> Option<&DeviceBuffer>| -> Vec<u64> {
            run.iter().map(|e| address(pick(e))).collect()
        };
        let floats = |pick: fn(&UpdateEntry) -> f32| -> Vec<u64> { run.iter().map(|e| float_value(pick(e))).collect() };
        let values = [
            buffers(|e| Some(&e.theta)),
            buffers(|e| Some(&e.grad)),
            buffers(|e| e.moments.0.as_ref()),
            buffers(|e| e.moments.1.as_ref()),
            buffers(|e| Some(&e.steps)),
            run.iter().map(|e| int_value(NAME, e.theta.len())).collect::<Result<_>>()?,
            floats(|e| e.lr_scale),
            floats(|e| e.weight_decay),
            first,
            vec![run.len() as u64],
        ];
        let table = StructArg::new(&table_bytes(&UPDATE_TABLE, &values));
        if blocks == 0 {
            device.launch_struct(NAME, &device.kernels.count_steps, ((1, 1), 0), &table, &[])?;
            continue;
        }
        let mut args = vec![Arg::i32(kind.kernel_code()), device.arg(base_lr)];
        args.extend([s.momentum, s.beta1, s.beta2, s.eps, s.grad_scale].map(Arg::f32));
        args.push(device.ticket(Ticket::Update));
        device.launch_struct(NAME, &device.kernels.update_tensors, ((blocks as u32, 1), 0), &table, &args)?;
    }
    Ok(())
}

/// A `ChunkTable` of gradients, each read from `x`, written to `out` (0: not written) `times` times
/// scaled; and its blocks.
fn chunk_table(op: &'static str, rows: &[(&DeviceBuffer, u64, usize)]) -> Result<(StructArg, u32)> {
    let first = first_blocks(op, rows.iter().map(|(x, _, _)| x.len()), TENSOR_CHUNK)?;
    let blocks = *first.last().expect("first_blocks starts at 0") as u32;
    let values = [
        rows.iter().map(|(x, _, _)| x.address()).collect(),
        rows.iter().map(|&(_, out, _)| out).collect(),
        rows.iter().map(|(x, _, _)| int_value(op, x.len())).collect::<Result<_>>()?,
        rows.iter().map(|&(_, _, times)| int_value(op, times)).collect::<Result<_>>()?,
        first,
        vec![rows.len() as u64],
    ];
    Ok((StructArg::new(&table_bytes(&CHUNK_TABLE, &values)), blocks))
}

/// `clip_grad_norm`'s norm and factor on the device, with nothing read back (so a captured step clips
/// too): Σg² of each chunk of each gradient in f32 by one block into a slot of its own (slots in the order
/// of `grads`, a gradient's chunks in order), then by one block the global norm √Σ over the slots in f64
/// (each thread a strided run of slots in order, then a fixed tree) and the factor
/// `ops::optim::clip_scale` gives. Returns (norm, factor), a float each.
pub(crate) fn clip_norm(
    device: &Arc<Device>,
    grads: &[DeviceBuffer],
    max_norm: f32,
) -> Result<(DeviceBuffer, DeviceBuffer)> {
    const NAME: &str = "clip_grad_norm";
    let slots: usize = grads.iter().map(|g| g.len().div_ceil(TENSOR_CHUNK)).sum();
    let partials = device.alloc(NAME, slots)?;
    let mut first_slot = 0;
    for run in grads.chunks(CHUNK_TABLE_TENSORS) {
        let rows: Vec<_> = run.iter().map(|g| (g, 0, 1)).collect();
        let (table, blocks) = chunk_table(NAME, &rows)?;
        if blocks > 0 {
            let args = [device.arg(&partials), Arg::i32(int(NAME, first_slot)?)];
            device.launch_struct(NAME, &device.kernels.sum_squares_chunks, ((blocks, 1), 0), &table, &args)?;
        }
        first_slot += blocks as usize;
    }
    let (norm, factor) = (device.alloc(NAME, 1)?, device.alloc(NAME, 1)?);
    let args = [
        device.arg(&partials),
        Arg::i32(int(NAME, slots)?),
        Arg::f32(max_norm),
        device.arg(&norm),
        device.arg(&factor),
    ];
    device.launch(NAME, &device.kernels.clip_factor, (1, 1), 0, &args)?;
    Ok((norm, factor))
}

/// A gradient the clip scales: read from `x`, written `times` times scaled (a parameter listed that often)
/// to `out`, or back into `x` when none.
pub(crate) struct ScaleEntry {
    pub(crate) x: DeviceBuffer,
    pub(crate) out: Option<DeviceBuffer>,
    pub(crate) times: usize,
}

/// Every gradient of `entries` times `factor` (a float on the device, `clip_norm`'s), a launch per table of
/// up to 128. An entry written in place must be the only one holding its buffer.
pub(crate) fn scale_tensors(device: &Arc<Device>, entries: &[ScaleEntry], factor: &DeviceBuffer) -> Result<()> {
    const NAME: &str = "clip_grad_norm";
    for e in entries {
        if let Some(out) = &e.out
            && out.len() != e.x.len()
        {
            let problem = format!("a gradient of {} elements scaled into a buffer of {}", e.x.len(), out.len());
            return Err(Error::device(NAME, problem));
        }
    }
    for run in entries.chunks(CHUNK_TABLE_TENSORS) {
        let rows: Vec<_> = run.iter().map(|e| (&e.x, address(Some(e.out.as_ref().unwrap_or(&e.x))), e.times)).collect();
        let (table, blocks) = chunk_table(NAME, &rows)?;
        if blocks > 0 {
            device.launch_struct(
                NAME,
                &device.kernels.scale_chunks,
                ((blocks, 1), 0),
                &table,
                &[device.arg(factor)],
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_cut_when_full_or_when_a_key_repeats() {
        let items = [1u64, 2, 3, 4, 5, 6, 7];
        let lens = |runs: Vec<&[u64]>| runs.iter().map(|r| r.len()).collect::<Vec<_>>();
        assert_eq!(lens(runs(&items, 3, |&k| k)), [3, 3, 1]);
        assert_eq!(lens(runs(&items, 7, |&k| k)), [7]);
        assert_eq!(lens(runs(&[1, 2, 1, 3, 3], 4, |&k| k)), [2, 2, 1]);
        assert!(runs(&[] as &[u64], 4, |&k| k).is_empty());
    }
}
