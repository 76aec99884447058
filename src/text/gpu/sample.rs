//! The single-sample step (fused/text_sample.cu): sample_forward, sample_backward and sample_update, with
//! a step's W2 update left pending for the next step's sample_forward (or sample_flush) to apply.

use super::{GpuTrainer, TextLayout};
use crate::device::{Gpu, launch::Arg, launch::Kernel};
use anyhow::{Context, Result};
use cudarc::driver::CudaSlice;

pub(super) struct SampleKernels {
    pub(super) forward: Kernel,
    pub(super) backward: Kernel,
    pub(super) update: Kernel,
    pub(super) flush: Kernel,
}

/// State between single-sample steps (fused/text_sample.cu): a step's W2 update is applied by the next
/// step's sample_forward, or by sample_flush.
pub struct SampleBuffers {
    /// `[G][H]` each sample_forward block's Σ exp(logit − max_b)·W2 row.
    pub partials: CudaSlice<f32>,
    /// `[2][G]` softmax partials (max, Σexp), alternate steps in alternate halves.
    pub stats: CudaSlice<f32>,
    /// `[G]` PendingStep records (4 words each: pending flag, target, lr, which half of `stats`).
    pub records: CudaSlice<u32>,
    /// `[G][H]` h of the pending step, one copy per block.
    pub h_pending: CudaSlice<f32>,
    /// `[⌈H / SAMPLE_UNITS⌉][D]` each sample_backward block's share of dx.
    pub dx_shares: CudaSlice<f32>,
    /// `[H]` `W2[target]` as the step's logits used it.
    pub w2_target: CudaSlice<f32>,
    /// `[N][D]` the next sample's embedding rows before the step's update (sample_backward → sample_update).
    pub next_rows: CudaSlice<f32>,
}

impl GpuTrainer {
    fn sample_kernels(&mut self) -> Result<&SampleKernels> {
        if self.sample.is_none() {
            let s = self.shape;
            let module = self.gpu.module(&super::layout::module_request("text_sample", s, None))?;
            let kernels = SampleKernels {
                forward: Gpu::function(&module, "sample_forward")?,
                backward: Gpu::function(&module, "sample_backward")?,
                update: Gpu::function(&module, "sample_update")?,
                flush: Gpu::function(&module, "sample_flush")?,
            };
            let (l, max) = (&self.layout, self.gpu.max_shared_optin);
            let reserve = |f: &Kernel, bytes: &dyn Fn(&TextLayout) -> usize, flag| {
                self.gpu.reserve_shared(f, bytes(l), l.flag_at_fault(bytes, max, flag))
            };
            reserve(&kernels.forward, &|l| l.sample_forward_shared(), "--hidden")?;
            reserve(&kernels.backward, &|l| l.sample_backward_shared(), "--embed")?;
            reserve(&kernels.update, &|l| l.sample_update_shared(), "--embed")?;
            for f in [&kernels.forward, &kernels.backward, &kernels.update] {
                self.gpu.prefer_shared_carveout(f)?;
            }
            self.sample = Some(kernels);
        }
        Ok(self.sample.as_ref().unwrap())
    }

    /// Whether a step of `batch` samples takes fused/text_sample.cu.
    pub fn sample_path(&self, batch: usize) -> bool {
        batch == 1 && self.layout.sample_fits && self.optimizer.is_none() && self.bf16.is_none()
    }

    /// Single-sample kernel 1: the pending step's W2/b2 update, then logits, softmax partials and the
    /// partial sums U_b; records the step as pending. z1 must be in place (text_hidden or the previous
    /// step's sample_update).
    pub fn launch_sample_forward(&mut self, offset: usize, lr: f32, programmatic: bool) -> Result<()> {
        self.ensure_capacity(1)?;
        let func = self.sample_kernels()?.forward.clone();
        let (g, p, b, sb, l) = (&*self.gpu, &self.params, &self.buffers, &self.sample_buffers, &self.layout);
        let args = [
            Arg::buf(g, &p.w2),
            Arg::buf(g, &p.b2),
            Arg::buf(g, &b.z1),
            Arg::buf(g, &self.tokens),
            Arg::buf(g, &self.positions),
            Arg::buf(g, &self.cursor),
            Arg::u32(offset as u32),
            Arg::f32(lr),
            Arg::i32(self.shape.vocab as i32),
            Arg::i32(l.rows_per_block as i32),
            Arg::buf(g, &sb.records),
            Arg::buf(g, &sb.h_pending),
            Arg::buf(g, &b.logits),
            Arg::buf(g, &sb.stats),
            Arg::buf(g, &sb.partials),
            Arg::buf(g, &sb.w2_target),
        ];
        let shared = l.sample_forward_shared() as u32;
        g.launch(&func, (l.grid as u32, 1), shared, programmatic, &args)?;
        self.w2_pending = true;
        Ok(())
    }

    /// Single-sample kernel 2: normaliser, loss, dh, W1/b1 update, dx; a copy of the next sample's
    /// embedding rows for sample_update.
    pub fn launch_sample_backward(&mut self, offset: usize, lr: f32, programmatic: bool) -> Result<()> {
        let func = self.sample_kernels()?.backward.clone();
        let (g, p, b, sb, l) = (&*self.gpu, &self.params, &self.buffers, &self.sample_buffers, &self.layout);
        let args = [
            Arg::buf(g, &p.w1),
            Arg::buf(g, &p.b1),
            Arg::buf(g, &b.x),
            Arg::buf(g, &b.z1),
            Arg::buf(g, &b.logits),
            Arg::buf(g, &sb.records),
            Arg::buf(g, &sb.stats),
            Arg::buf(g, &sb.partials),
            Arg::buf(g, &sb.w2_target),
            Arg::i32(l.grid as i32),
            Arg::buf(g, &self.tokens),
            Arg::buf(g, &self.positions),
            Arg::buf(g, &self.cursor),
            Arg::u32(offset as u32),
            Arg::u32(self.positions.len() as u32),
            Arg::i32(self.shape.context as i32),
            Arg::buf(g, &p.embedding),
            Arg::f32(lr),
            Arg::buf(g, &b.dh),
            Arg::buf(g, &sb.dx_shares),
            Arg::buf(g, &self.loss_sum),
            Arg::buf(g, &sb.next_rows),
        ];
        let shared = l.sample_backward_shared() as u32;
        g.launch(&func, (l.sample_backward_grid() as u32, 1), shared, programmatic, &args)
    }

    /// Single-sample kernel 3: the embedding update, then x and z1 of the next sample.
    pub fn launch_sample_update(&mut self, offset: usize, lr: f32, programmatic: bool) -> Result<()> {
        let func = self.sample_kernels()?.update.clone();
        let (g, p, b, sb, l) = (&*self.gpu, &self.params, &self.buffers, &self.sample_buffers, &self.layout);
        let args = [
            Arg::buf(g, &p.embedding),
            Arg::buf(g, &p.w1),
            Arg::buf(g, &p.b1),
            Arg::buf(g, &b.x),
            Arg::buf(g, &b.z1),
            Arg::buf(g, &sb.dx_shares),
            Arg::buf(g, &sb.next_rows),
            Arg::buf(g, &self.tokens),
            Arg::buf(g, &self.positions),
            Arg::u32(self.positions.len() as u32),
            Arg::buf(g, &self.cursor),
            Arg::u32(offset as u32),
            Arg::i32(self.shape.context as i32),
            Arg::f32(lr),
        ];
        let shared = l.sample_update_shared() as u32;
        g.launch(&func, (l.update_grid as u32, 1), shared, programmatic, &args)
    }

    /// The last sample_forward's softmax partials `[G]` (max, Σexp), from the half of the `[2][G]` array its
    /// records name.
    pub fn sample_stats(&self) -> Result<Vec<f32>> {
        let (sb, g) = (&self.sample_buffers, self.layout.grid);
        let parity = self.gpu.stream.clone_dtoh(&sb.records)?[3] as usize;
        Ok(self.download(&sb.stats)?[parity * 2 * g..][..2 * g].to_vec())
    }

    /// Applies the last single-sample step's pending W2/b2 update (sample_flush) and clears the records, so
    /// that W2 and b2 in device memory are current. Every path that reads W2 other than sample_forward calls
    /// this first (the chunked and tiled steps, evaluation, `params`), and so does a reallocation of the
    /// step buffers; a no-op when nothing is pending. Consecutive single-sample runs need none between them.
    pub fn settle_w2(&mut self) -> Result<()> {
        if !self.w2_pending {
            return Ok(());
        }
        let func = self.sample_kernels()?.flush.clone();
        let (g, p, b, sb, l) = (&*self.gpu, &self.params, &self.buffers, &self.sample_buffers, &self.layout);
        let args = [
            Arg::buf(g, &p.w2),
            Arg::buf(g, &p.b2),
            Arg::buf(g, &sb.records),
            Arg::buf(g, &sb.h_pending),
            Arg::buf(g, &sb.stats),
            Arg::buf(g, &b.logits),
            Arg::i32(self.shape.vocab as i32),
            Arg::i32(l.rows_per_block as i32),
        ];
        g.launch(&func, (l.grid as u32, 1), 0, false, &args)?;
        self.gpu.stream.memset_zeros(&mut self.sample_buffers.records).context("clearing the pending-step records")?;
        self.w2_pending = false;
        Ok(())
    }

    /// The three single-sample kernels (fused/text_sample.cu); z1 must be in place. `programmatic`: the
    /// kernel before is the previous step's sample_update.
    pub(super) fn launch_sample_step(&mut self, offset: usize, lr: f32, programmatic: bool) -> Result<()> {
        self.launch_sample_forward(offset, lr, programmatic)?;
        self.launch_sample_backward(offset, lr, true)?;
        self.launch_sample_update(offset, lr, true)
    }
}
