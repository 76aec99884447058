//! The text model's device buffers as the kernels of fused/text.cu and text_batch.cu take them:
//! `TextBuffers`, one struct declared in fused/text_buffers.cuh, built when the buffers are allocated
//! (`refresh_buffers`) and passed as each kernel's first parameter, in place of a list of pointers spelled
//! out per launch. text_advance keeps its two parameters, the cursor and a count, and the single-sample
//! kernels of text_sample.cu keep their buffers as parameters (fused/text_buffers.cuh says why).
//!
//! By value, not written to device memory and passed as one pointer: a by-value struct lives in the
//! launch's parameter space, so a kernel reads a buffer's address from the constant bank exactly as it
//! read a pointer parameter, where a struct in device memory would put one more dependent global load
//! before a kernel's first load of each buffer. Its 264 bytes go with every launch (or once into a
//! captured graph), where the 5 to 18 pointers it replaces were 40 to 144 bytes; the driver's host time
//! per launch did not grow with a struct's bytes on an H200 (a 336-byte struct launched as fast as 16
//! pointers).
//!
//! The struct's pointers carry no `__restrict__`, so NVRTC no longer infers the read-only loads
//! (`ld.global.nc`) a kernel's restrict parameters gave it: each kernel names its buffers as restrict
//! locals (which keeps their aliasing) and reads the buffers it only reads through `__ldg`, never one that
//! the same launch writes (those it reads through L2, `__ldcg`, or with plain loads, as before).
//! text_batch_logits_bf16 keeps its buffers as parameters: its loads sit in fused/gemm_wgmma.cuh. So do a
//! few buffers whose loads sit in a loop the compiler copies, which it does not do with `__ldg` (W1 and b1
//! of text_batch_forward and text_batch_hidden_bf16, ∂W2 and ∂b2 of text_batch_optimize).

use super::GpuTrainer;
use crate::device::kernel_struct::{Address, Opaque, kernel_struct};
use crate::device::launch::StructArg;

kernel_struct! {
    /// The text model's buffers as fused/text_buffers.cuh declares them: parameters, corpus, step buffers
    /// and those of the optimizer and bf16 steps (null where a step is not in use).
    pub struct TextBuffers {
        /// Embedding E, `[V][D]`.
        pub embedding: Address<f32>,
        /// Hidden weights W1, `[H][D]`.
        pub w1: Address<f32>,
        /// Hidden biases b1, `[H]`.
        pub b1: Address<f32>,
        /// Output weights W2, `[V][H]`.
        pub w2: Address<f32>,
        /// Output biases b2, `[V]`.
        pub b2: Address<f32>,
        /// The token stream.
        pub tokens: Address<u32>,
        /// The sample order.
        pub positions: Address<u32>,
        /// The device cursor into `positions`.
        pub cursor: Address<u32>,
        /// `StepBuffers::x`.
        pub x: Address<f32>,
        /// `StepBuffers::z1` (h = ReLU(z1) on the tiled path).
        pub z1: Address<f32>,
        /// `StepBuffers::logits`.
        pub logits: Address<f32>,
        /// `StepBuffers::stats`.
        pub stats: Address<f32>,
        /// `StepBuffers::dh`.
        pub dh: Address<f32>,
        /// `StepBuffers::rank`.
        pub rank: Address<u32>,
        /// `StepBuffers::dx_sum`.
        pub dx_sum: Address<f32>,
        /// `StepBuffers::ticket`.
        pub ticket: Address<u32>,
        /// `StepBuffers::norm`.
        pub norm: Address<f32>,
        /// `StepBuffers::tile_tickets`.
        pub tile_tickets: Address<u32>,
        /// `StepBuffers::grad_w2`.
        pub grad_w2: Address<f32>,
        /// `StepBuffers::grad_b2`.
        pub grad_b2: Address<f32>,
        /// `StepBuffers::grad_w1`.
        pub grad_w1: Address<f32>,
        /// `StepBuffers::grad_b1`.
        pub grad_b1: Address<f32>,
        /// The summed training loss.
        pub loss_sum: Address<f64>,
        /// Evaluation's top-1 and top-5 hits.
        pub hit_counts: Address<u64>,
        /// The optimizer's first moments over E, W1, b1, W2, b2 as one vector.
        pub m: Address<f32>,
        /// Its second moments.
        pub v: Address<f32>,
        /// The dense embedding gradient, `[V][D]`.
        pub grad_embedding: Address<f32>,
        /// Optimizer steps taken.
        pub step: Address<u32>,
        /// text_batch_optimize's finished-block counter.
        pub optimizer_ticket: Address<u32>,
        /// W2's bf16 copy, `[V][H]`.
        pub w2_bf16: Address<Opaque>,
        /// h's bf16 copy, `[B][H]`.
        pub hidden_bf16: Address<Opaque>,
        /// G = (softmax − onehot)/B in bf16, `[B][ldg]`.
        pub dlogits: Address<Opaque>,
        /// ∂H's parts over the splits of V, `[splits][B][H]`.
        pub dh_parts: Address<f32>,
    }
}

impl GpuTrainer {
    /// Rebuilds the kernels' `TextBuffers` from the buffers as they are now: after any is allocated.
    pub(super) fn refresh_buffers(&mut self) {
        let g = &*self.gpu;
        let (p, b) = (&self.params, &self.buffers);
        let optimizer = self.optimizer.as_ref();
        let bf16 = self.bf16.as_ref();
        let table = TextBuffers {
            embedding: Address::of(g, &p.embedding),
            w1: Address::of(g, &p.w1),
            b1: Address::of(g, &p.b1),
            w2: Address::of(g, &p.w2),
            b2: Address::of(g, &p.b2),
            tokens: Address::of(g, &self.tokens),
            positions: Address::of(g, &self.positions),
            cursor: Address::of(g, &self.cursor),
            x: Address::of(g, &b.x),
            z1: Address::of(g, &b.z1),
            logits: Address::of(g, &b.logits),
            stats: Address::of(g, &b.stats),
            dh: Address::of(g, &b.dh),
            rank: Address::of(g, &b.rank),
            dx_sum: Address::of(g, &b.dx_sum),
            ticket: Address::of(g, &b.ticket),
            norm: Address::of(g, &b.norm),
            tile_tickets: Address::of(g, &b.tile_tickets),
            grad_w2: Address::of(g, &b.grad_w2),
            grad_b2: Address::of(g, &b.grad_b2),
            grad_w1: Address::of(g, &b.grad_w1),
            grad_b1: Address::of(g, &b.grad_b1),
            loss_sum: Address::of(g, &self.loss_sum),
            hit_counts: Address::of(g, &self.hit_counts),
            m: optimizer.map_or(Address::NULL, |o| Address::of(g, &o.m)),
            v: optimizer.map_or(Address::NULL, |o| Address::of(g, &o.v)),
            grad_embedding: optimizer.map_or(Address::NULL, |o| Address::of(g, &o.grad_embedding)),
            step: optimizer.map_or(Address::NULL, |o| Address::of(g, &o.step)),
            optimizer_ticket: optimizer.map_or(Address::NULL, |o| Address::of(g, &o.ticket)),
            w2_bf16: bf16.map_or(Address::NULL, |b| Address::reinterpret(g, &b.w2)),
            hidden_bf16: bf16.map_or(Address::NULL, |b| Address::reinterpret(g, &b.hidden)),
            dlogits: bf16.map_or(Address::NULL, |b| Address::reinterpret(g, &b.dlogits)),
            dh_parts: bf16.map_or(Address::NULL, |b| Address::of(g, &b.dh_parts)),
        };
        self.buffer_table = StructArg::of(&table);
    }
}

#[cfg(test)]
mod tests {
    use super::TextBuffers;
    use crate::device::kernel_struct::assert_kernel_layout;

    #[test]
    fn text_buffers_are_laid_out_as_text_buffers_cuh_declares_them() {
        // Both kernel files whose kernels take the struct, as each compiles it.
        for unit in ["text_batch", "text"] {
            assert_kernel_layout::<TextBuffers>(unit, &[]);
        }
    }
}
