//! A training step around its passes (step.rs): its micro-batches (`--grad-accum`: each one's forward and
//! backward, their gradients summed in order by tf_accumulate) and its update (clipping's norm, AdamW, the
//! weights' bf16 copy), whole or, under ZeRO-1, as the pieces `parallel.rs` puts between the ranks'
//! collectives.

use super::step::NULL;
use super::{GpuTransformer, THREADS, TICKET_ADAMW, TICKET_NORM};
use crate::device::launch::Arg;
use anyhow::Result;
use std::ops::Range;

impl GpuTransformer {
    /// The AdamW update at the rate at `rate` (device memory), after clipping's norm when clipping, of the
    /// parameters this replica updates. Under ZeRO-1 the steps go one by one between the ranks'
    /// collectives instead ([`Self::enqueue_grad_norm`], [`Self::enqueue_clip_scale`],
    /// [`Self::enqueue_adamw`]).
    pub(super) fn enqueue_update(&self, rate: Arg) -> Result<()> {
        self.enqueue_grad_norm()?;
        self.enqueue_adamw(rate)
    }

    /// The parameters whose update this replica makes: all of them, or its ZeRO-1 shard.
    fn updated(&self) -> Range<usize> {
        self.shard.map_or(0..self.layout.len(), |s| s.range())
    }

    /// When clipping, tf_grad_norm over the gradient of the parameters this replica updates: clipping's
    /// factor, and ‖·‖₂² in `norm_sq` (under ZeRO-1 the shard's, for the ranks to add).
    pub(super) fn enqueue_grad_norm(&self) -> Result<()> {
        let clip = self.optim.clip_norm;
        if clip <= 0.0 {
            return Ok(());
        }
        let range = self.updated();
        self.launch(
            &self.kernels.grad_norm,
            self.norm_partials.len(),
            0,
            &[
                Arg::Ptr(self.ptr(&self.grad) + 4 * range.start as u64),
                Arg::i32(range.len() as i32),
                Arg::f32(clip),
                self.buf(&self.norm_partials),
                Arg::Ptr(self.ptr(&self.tickets) + 4 * TICKET_NORM as u64),
                self.buf(&self.grad_scale),
                self.buf(&self.norm_sq),
            ],
        )
    }

    /// When clipping under ZeRO-1, clipping's factor from `norm_sq` once it holds the sum of every rank's
    /// shard's.
    pub(super) fn enqueue_clip_scale(&self) -> Result<()> {
        let clip = self.optim.clip_norm;
        if clip <= 0.0 {
            return Ok(());
        }
        self.launch(
            &self.kernels.clip_scale,
            1,
            0,
            &[self.buf(&self.norm_sq), Arg::f32(clip), self.buf(&self.grad_scale)],
        )
    }

    /// AdamW at the rate at `rate` over the parameters this replica updates, the gradient times clipping's
    /// factor when clipping (the moments from their start under ZeRO-1, which hold the shard's alone).
    pub(super) fn enqueue_adamw(&self, rate: Arg) -> Result<()> {
        let o = &self.optim;
        let range = self.updated();
        let (start, n) = (range.start as u64, range.len());
        let moments = if self.shard.is_some() { 0 } else { 4 * start };
        let blocks = n.div_ceil(THREADS * 4).clamp(1, 4 * self.gpu.sm_count as usize);
        self.launch(
            &self.kernels.adamw,
            blocks,
            0,
            &[
                Arg::Ptr(self.ptr(&self.params) + 4 * start),
                Arg::Ptr(self.ptr(&self.grad) + 4 * start),
                Arg::Ptr(self.ptr(&self.m) + moments),
                Arg::Ptr(self.ptr(&self.v) + moments),
                Arg::i32(n as i32),
                rate,
                Arg::f32(o.beta1),
                Arg::f32(o.beta2),
                Arg::f32(o.eps),
                Arg::f32(o.weight_decay),
                if o.clip_norm > 0.0 { self.buf(&self.grad_scale) } else { Arg::Ptr(0) },
                self.buf(&self.step),
                Arg::Ptr(self.ptr(&self.tickets) + 4 * TICKET_ADAMW as u64),
                if self.bf16() { Arg::Ptr(self.ptr(&self.params_bf16) + 2 * start) } else { NULL },
            ],
        )
    }

    /// The parameters' bf16 copy, rounded from all of them: before the first bf16 step, and under ZeRO-1
    /// in bf16 after the ranks' shards are gathered (AdamW wrote this replica's shard's alone).
    pub(super) fn enqueue_round_bf16(&self) -> Result<()> {
        let n = self.layout.len();
        let args = [self.buf(&self.params), self.buf(&self.params_bf16), Arg::i32(n as i32)];
        self.launch(&self.kernels.round_bf16, n.div_ceil(THREADS).min(4 * self.gpu.sm_count as usize), 0, &args)
    }

    /// Step `s` of the graph's uploads (its offsets, rate and loss slot): its micro-batches, then the update.
    pub(super) fn enqueue_step(&self, s: usize) -> Result<()> {
        self.enqueue_micro_batches(s, &mut |t, offsets| t.enqueue_whole_backward(offsets))?;
        self.enqueue_update(self.step_rate(s))
    }

    /// The learning rate of step `s` of the graph's uploads (device memory).
    pub(super) fn step_rate(&self, s: usize) -> Arg {
        Arg::Ptr(self.ptr(&self.rates) + 4 * s as u64)
    }

    /// The last micro-batch's backward, the others' gradient sum added: the step's whole gradient.
    pub(super) fn enqueue_whole_backward(&self, offsets: Arg) -> Result<()> {
        self.enqueue_backward(offsets)?;
        self.enqueue_add_sum(0..self.layout.len())
    }

    /// The forward and backward passes of step `s`'s `grad_accum` micro-batches of a batch each (their
    /// offsets one after another in the graph's uploads), each micro-batch's loss scaled for the step's
    /// mean and added to the step's loss slot: the last micro-batch's backward is `last_backward`, the sum
    /// of the others (tf_accumulate) left in `grad_sum` for it to add. With one micro-batch, just its passes.
    pub(super) fn enqueue_micro_batches(
        &self,
        s: usize,
        last_backward: &mut dyn FnMut(&Self, Arg) -> Result<()>,
    ) -> Result<()> {
        let k = self.grad_accum;
        let offsets = self.ptr(&self.offsets) + 4 * (s * k * self.buffers.batch) as u64;
        let loss_sum = Arg::Ptr(self.ptr(&self.losses) + 8 * s as u64);
        let scale = 1.0 / (k * self.rows()) as f32;
        for j in 0..k {
            self.micro.set(j);
            let micro_offsets = Arg::Ptr(offsets + 4 * (j * self.buffers.batch) as u64);
            self.enqueue_forward(self.buf(&self.train), micro_offsets, scale, self.rows(), loss_sum, true)?;
            if j + 1 == k {
                last_backward(self, micro_offsets)?;
            } else {
                self.enqueue_backward(micro_offsets)?;
                self.enqueue_accumulate(j == 0)?;
            }
        }
        self.micro.set(0);
        Ok(())
    }

    /// tf_accumulate over the whole gradient: `grad_sum` = `grad` when `first`, else `grad_sum` += `grad`.
    /// Adding the sum into the last micro-batch's gradient is [`Self::enqueue_add_sum`].
    fn enqueue_accumulate(&self, first: bool) -> Result<()> {
        let (sum, g) = (self.ptr(&self.grad_sum), self.ptr(&self.grad));
        self.launch_accumulate((sum, g), 0..self.layout.len(), first)
    }

    /// `grad` += `grad_sum` over the gradient's elements `range`: the last micro-batch's gradient takes the
    /// others' sum (a step of one micro-batch has none).
    pub(super) fn enqueue_add_sum(&self, range: Range<usize>) -> Result<()> {
        if self.grad_accum == 1 {
            return Ok(());
        }
        let (grad, sum) = (self.ptr(&self.grad), self.ptr(&self.grad_sum));
        self.launch_accumulate((grad, sum), range, false)
    }

    fn launch_accumulate(&self, (sum, g): (u64, u64), range: Range<usize>, first: bool) -> Result<()> {
        let at = 4 * range.start as u64;
        let n = range.len();
        self.launch(
            &self.kernels.accumulate,
            n.div_ceil(THREADS).clamp(1, 4 * self.gpu.sm_count as usize),
            0,
            &[Arg::Ptr(sum + at), Arg::Ptr(g + at), Arg::i32(n as i32), Arg::i32(first as i32)],
        )
    }
}
