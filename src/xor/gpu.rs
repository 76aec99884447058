//! The XOR run on the GPU: the whole of it in one launch of fused/xor.cu (see its header for why).

use super::model::{MAX_HIDDEN, XorParams};
use crate::device::{Gpu, compile::ModuleRequest, launch::Arg, launch::Kernel};
use anyhow::{Context, Result, bail};
use cudarc::driver::CudaSlice;
use std::sync::Arc;

/// The kernel module (`fused/xor.cu` takes no sizes).
pub const MODULE: ModuleRequest = ("xor", Vec::new());

/// The parameters on the device and the compiled kernel.
pub struct GpuXor {
    gpu: Arc<Gpu>,
    kernel: Kernel,
    activation: crate::ops::activations::Activation,
    w1: CudaSlice<f32>,
    b1: CudaSlice<f32>,
    w2: CudaSlice<f32>,
    b2: CudaSlice<f32>,
}

impl GpuXor {
    /// Uploads `p` to `gpu` and loads the kernel; errors when the hidden width is 0 or above MAX_HIDDEN.
    pub fn new(gpu: Arc<Gpu>, p: &XorParams) -> Result<GpuXor> {
        if p.hidden() == 0 || p.hidden() > MAX_HIDDEN {
            bail!("--hidden must be between 1 and {MAX_HIDDEN} on the GPU, got {}", p.hidden());
        }
        let module = gpu.module(&MODULE)?;
        let kernel = Gpu::function(&module, "xor_train")?;
        let stream = &gpu.stream;
        let upload = |v: &[f32]| stream.clone_htod(v).context("copying the model to the GPU");
        Ok(GpuXor {
            w1: upload(&p.w1)?,
            b1: upload(&p.b1)?,
            w2: upload(&p.w2)?,
            b2: upload(&[p.b2])?,
            activation: p.activation,
            kernel,
            gpu,
        })
    }

    /// Queues one SGD epoch per entry of `rates` (device memory, epoch k at `rates[k]`) in one launch;
    /// the loss of every `report_every`-th epoch goes to `losses` (at least ⌈epochs / report_every⌉ long).
    pub fn enqueue(&mut self, rates: &CudaSlice<f32>, report_every: usize, losses: &mut CudaSlice<f32>) -> Result<()> {
        let hidden = self.b1.len();
        let threads = hidden.div_ceil(32) * 32;
        let g = &*self.gpu;
        let args = [
            Arg::buf(g, &self.w1),
            Arg::buf(g, &self.b1),
            Arg::buf(g, &self.w2),
            Arg::buf(g, &self.b2),
            Arg::i32(hidden as i32),
            Arg::i32(self.activation.kernel_code()),
            Arg::i32(rates.len() as i32),
            Arg::buf(g, rates),
            Arg::i32(report_every.max(1) as i32),
            Arg::buf(g, losses),
        ];
        g.launch_sized(&self.kernel, (1, 1), threads as u32, 0, false, &args)
    }

    /// One epoch per entry of `rates`, epoch k at learning rate `rates[k]`; returns the recorded losses
    /// (poisoned with NaN first, so an unwritten one shows).
    pub fn train(&mut self, rates: &[f32], report_every: usize) -> Result<Vec<f32>> {
        let epochs = rates.len();
        if epochs > i32::MAX as usize {
            bail!("--epochs {epochs} is more than the GPU kernel counts to");
        }
        if epochs == 0 {
            return Ok(Vec::new());
        }
        let reports = epochs.div_ceil(report_every.max(1));
        let stream = self.gpu.stream.clone();
        let mut losses = stream.clone_htod(&vec![f32::NAN; reports])?;
        let rates = stream.clone_htod(rates).context("copying the learning rates to the GPU")?;
        self.enqueue(&rates, report_every, &mut losses)?;
        stream.clone_dtoh(&losses).context("xor_train failed")
    }

    /// A host copy of the parameters.
    pub fn params(&self) -> Result<XorParams> {
        let stream = &self.gpu.stream;
        let get = |v: &CudaSlice<f32>| stream.clone_dtoh(v).context("copying from the GPU");
        Ok(XorParams {
            activation: self.activation,
            w1: get(&self.w1)?,
            b1: get(&self.b1)?,
            w2: get(&self.w2)?,
            b2: get(&self.b2)?[0],
        })
    }
}
