//! The device forward and backward of `causal_self_attention` (`nn/attention.rs`): the kernels of
//! `fused/nn_attention.cu`, a module per (sequence length, head size) compiled on first use (those sizes
//! are the kernels' template arguments). At `Precision::Bf16`, with a head size that is a multiple of 16,
//! the flash kernels on the tensor cores; otherwise the fp32 ones. Neither keeps the T×T probabilities:
//! the backward rebuilds them from each row's log-sum-exp.

use super::ops::{buffer, filled, int};
use super::{Device, DeviceBuffer};
use crate::device::kernel_struct::{Address, DropoutArgs};
use crate::device::launch::StructArg;
use crate::device::precision::Precision;
use crate::device::{Gpu, compile::ModuleRequest, launch::Arg};
use crate::nn::error::{Error, Result};
use crate::nn::tensor::Tensor;
use crate::ops::THREADS_PER_BLOCK;
use crate::ops::attention::{AttentionSizes, FlashSizes};
use crate::ops::cpu::Real;
use std::sync::Arc;

const NAME: &str = "causal_self_attention";

/// The module of the attention kernels for sequences of `time` and heads of `head_size`.
pub fn module_request(time: usize, head_size: usize) -> ModuleRequest {
    ("nn_attention", vec![("NN_T", time as i64), ("NN_HS", head_size as i64)])
}

/// Dropout on the attention probabilities: the site's per-run seed (`ops::dropout::site_seed`), the word
/// in device memory holding this call's step (forward and backward read it), and the mask's threshold
/// and scale.
pub(crate) struct AttentionDrop {
    pub(crate) site_seed: u32,
    pub(crate) step: DeviceBuffer,
    pub(crate) threshold: u32,
    pub(crate) scale: f32,
}

/// The flash kernels' blocks of one kind per (sequence, head), and their forward and backward shared memory.
fn flash_bytes(time: usize, head_size: usize) -> (u32, u32, u32) {
    let sizes = FlashSizes { t: time, hs: head_size };
    (sizes.blocks() as u32, sizes.forward_bytes() as u32, sizes.backward_bytes() as u32)
}

/// Causal self-attention of `qkv` (`[batch, time, 3·heads·head_size]`, packed as nn_attention.cu says) on
/// the device: y `[batch, time, heads·head_size]`.
pub(crate) fn causal_self_attention<F: Real>(
    device: &Arc<Device>,
    qkv: &Tensor<F>,
    (batch, time, heads, head_size): (usize, usize, usize, usize),
    drop: Option<AttentionDrop>,
) -> Result<Tensor<F>> {
    let gpu = &device.gpu;
    let width = heads * head_size;
    let rows = batch * time;
    int(NAME, rows * 3 * width)?;
    let block_heads = batch * heads;
    let flash = device.precision() == Precision::Bf16 && head_size.is_multiple_of(16);
    let module = gpu.module(&module_request(time, head_size)).map_err(|e| Error::device(NAME, format!("{e:#}")))?;
    let function = |name: &str| Gpu::function(&module, name).map_err(|e| Error::device(NAME, format!("{e:#}")));
    let reserve = |kernel: &crate::device::launch::Kernel, bytes: u32| {
        gpu.reserve_shared(kernel, bytes as usize, "the sequence length or head size")
            .map_err(|e| Error::value(NAME, format!("{e:#}")))
    };
    let fp32_sizes = AttentionSizes { t: time, hs: head_size, warps: THREADS_PER_BLOCK as usize / 32 };
    let chunks = time.div_ceil(fp32_sizes.key_chunk());
    let (blocks, forward_bytes, backward_bytes) = if flash {
        flash_bytes(time, head_size)
    } else {
        (1, 4 * fp32_sizes.forward_floats() as u32, 4 * fp32_sizes.backward_floats() as u32)
    };
    let (forward, backward) = if flash {
        (function("nn_flash_forward")?, function("nn_flash_backward")?)
    } else {
        (function("nn_attention_forward")?, function("nn_attention_backward")?)
    };
    reserve(&forward, forward_bytes)?;
    reserve(&backward, backward_bytes)?;
    let dropout = StructArg::of(&match &drop {
        Some(d) => DropoutArgs {
            step: Address::reinterpret(gpu, d.step.slice()),
            seed: d.site_seed,
            threshold: d.threshold,
            scale: d.scale,
        },
        None => DropoutArgs::off(),
    });
    let sizes = [Arg::i32(int(NAME, heads)?), Arg::i32(int(NAME, width)?)];
    let qkv_buffer = buffer(qkv);
    let (y, lse) = (device.alloc(NAME, rows * width)?, device.alloc(NAME, block_heads * time)?);
    let args = [&[device.arg(&qkv_buffer), device.arg(&y), device.arg(&lse)][..], &sizes].concat();
    let grid = (int(NAME, block_heads)? as u32, blocks);
    device.launch_struct(NAME, &forward, (grid, forward_bytes), &dropout, &args)?;
    let (device_, y_saved) = (Arc::clone(device), y.clone());
    let backward = move |grad: &DeviceBuffer, _needs: &[bool]| {
        // The step word the mask was drawn from stays alive (and unchanged) until the backward redraws it.
        let _step_word = &drop;
        let d = &device_;
        let dqkv = d.alloc(NAME, rows * 3 * width)?;
        let inputs = [d.arg(&qkv_buffer), d.arg(&y_saved), d.arg(grad), d.arg(&lse), d.arg(&dqkv)];
        if flash {
            let args = [&inputs[..], &sizes].concat();
            d.launch_struct(NAME, &backward, ((block_heads as u32, 2 * blocks), backward_bytes), &dropout, &args)?;
        } else {
            // Each key chunk's share of dq, and a ticket per (sequence, head) that the kernel zeroes after use.
            let dq_part = d.alloc(NAME, chunks * rows * width)?;
            let tickets = filled(d, NAME, block_heads, 0.0)?;
            let scratch = [Arg::i32(int(NAME, rows)?), d.arg(&dq_part), d.arg(&tickets)];
            let args = [&inputs[..], &sizes, &scratch].concat();
            d.launch_struct(NAME, &backward, (((block_heads * chunks) as u32, 1), backward_bytes), &dropout, &args)?;
        }
        Ok(vec![Some(dqkv)])
    };
    let shape = vec![batch, time, width];
    Ok(Tensor::from_device_op(NAME, y, shape, &[qkv], Box::new(backward)))
}
