//! The tiled step for large batches (fused/text_batch.cu): text_batch_forward, text_batch_backward and
//! text_batch_update over gemm_128 tiles, and text_batch_optimize for momentum and Adam.

use super::super::model::TextShape;
use super::GpuTrainer;
use super::layout::{B_SLICE, F32, SLICE, TILE, TILED_BACKWARD_EXTRA, W2_UPDATE_BLOCKS};
use crate::device::THREADS_PER_BLOCK;
use crate::device::{Arg, Gpu, Kernel};
use crate::ops::gemm::G128_STAGED_FLOATS;
use crate::ops::optim::{OptimConfig, OptimKind};
use anyhow::{Context, Result, bail};
use cudarc::driver::CudaSlice;

pub(super) struct TiledKernels {
    forward: Kernel,
    backward: Kernel,
    update: Kernel,
}

/// What `--optim momentum` or `adam` adds to the tiled step: text_batch_optimize, the optimizer state over
/// the parameters as one vector (E, W1, b1, W2, b2), and the dense embedding gradient.
pub(super) struct OptimizerState {
    config: OptimConfig,
    kernel: Kernel,
    m: CudaSlice<f32>,
    v: CudaSlice<f32>,
    grad_embedding: CudaSlice<f32>,
    step: CudaSlice<u32>,
    ticket: CudaSlice<u32>,
}

impl GpuTrainer {
    /// Trains with `config` from here on instead of the fused SGD update: every step, whatever its size,
    /// goes through fused/text_batch.cu and then text_batch_optimize (optim.cuh), at the step's rate (which
    /// replaces `config.lr`). SGD keeps the fused paths.
    pub fn use_optimizer(&mut self, config: OptimConfig) -> Result<()> {
        config.validate()?;
        if config.clip_norm > 0.0 {
            bail!("--clip-norm is not available for the text model");
        }
        if config.kind == OptimKind::Sgd {
            self.optimizer = None;
            return Ok(());
        }
        self.settle_w2()?;
        let s = self.shape;
        let module = self.gpu.module(&super::layout::module_request("text_batch", s, None))?;
        let kernel = Gpu::function(&module, "text_batch_optimize")?;
        let stream = &self.gpu.stream;
        let count = s.parameter_count() as usize;
        let room = "GPU out of memory for the optimizer state";
        self.optimizer = Some(OptimizerState {
            config,
            kernel,
            m: stream.alloc_zeros::<f32>(count).context(room)?,
            v: stream.alloc_zeros::<f32>(count).context(room)?,
            grad_embedding: stream.alloc_zeros::<f32>(s.vocab * s.embed).context(room)?,
            step: stream.alloc_zeros::<u32>(1)?,
            ticket: stream.alloc_zeros::<u32>(1)?,
        });
        self.captured = None;
        Ok(())
    }

    fn tiled_kernels(&mut self) -> Result<&TiledKernels> {
        if self.tiled.is_none() {
            let s = self.shape;
            let module = self.gpu.module(&super::layout::module_request("text_batch", s, None))?;
            let kernels = TiledKernels {
                forward: Gpu::function(&module, "text_batch_forward")?,
                backward: Gpu::function(&module, "text_batch_backward")?,
                update: Gpu::function(&module, "text_batch_update")?,
            };
            let stage = 2 * G128_STAGED_FLOATS * F32;
            self.gpu.reserve_shared(&kernels.forward, self.layout.tiled_forward_shared(), "--hidden")?;
            self.gpu.reserve_shared(&kernels.backward, stage + TILED_BACKWARD_EXTRA * F32, "--hidden")?;
            self.gpu.reserve_shared(&kernels.update, stage, "--hidden")?;
            self.tiled = Some(kernels);
        }
        Ok(self.tiled.as_ref().unwrap())
    }

    /// One step of `batch` samples at rate `lr` through fused/text_batch.cu's three kernels (and
    /// text_batch_optimize with an optimizer).
    pub fn launch_tiled_step(&mut self, batch: usize, offset: usize, lr: f32) -> Result<()> {
        self.ensure_capacity(batch)?;
        self.settle_w2()?;
        let k = self.tiled_kernels()?;
        let (forward, backward, update) = (k.forward.clone(), k.backward.clone(), k.update.clone());
        let (g, p, b, l) = (&*self.gpu, &self.params, &self.buffers, &self.layout);
        let TextShape { vocab: v, embed: d, hidden: h, context: n } = self.shape;
        let (tokens, positions, cursor, off) = (
            Arg::buf(g, &self.tokens),
            Arg::buf(g, &self.positions),
            Arg::buf(g, &self.cursor),
            Arg::u32(offset as u32),
        );
        let (vi, bi) = (Arg::i32(v as i32), Arg::i32(batch as i32));
        let stage = (2 * G128_STAGED_FLOATS * F32) as u32;
        let (v_tiles, s_tiles, h_tiles) = (l.vocab_tiles(), batch.div_ceil(TILE), h.div_ceil(TILE));
        // text_batch_forward: one block per SM, each sample tile's vocabulary tiles split into groups.
        let groups = (g.sm_count as usize / s_tiles).clamp(1, v_tiles);

        let args = [
            Arg::buf(g, &p.embedding),
            Arg::buf(g, &p.w1),
            Arg::buf(g, &p.b1),
            Arg::buf(g, &p.w2),
            Arg::buf(g, &p.b2),
            tokens,
            positions,
            cursor,
            off,
            vi,
            Arg::i32(n as i32),
            bi,
            Arg::buf(g, &b.x),
            Arg::buf(g, &b.z1),
            Arg::buf(g, &b.dh),
            Arg::buf(g, &b.logits),
            Arg::buf(g, &b.stats),
            Arg::buf(g, &b.norm),
            Arg::buf(g, &b.tile_tickets),
            Arg::buf(g, &self.loss_sum),
            Arg::buf(g, &b.grad_w2),
            Arg::buf(g, &b.grad_b2),
        ];
        // b.z1 holds h = ReLU(z1) on this path (text_batch_backward and text_batch_update read it).
        let grid = (groups as u32, s_tiles as u32);
        g.launch(&forward, grid, l.tiled_forward_shared() as u32, false, &args)?;

        let args = [
            Arg::buf(g, &p.w2),
            Arg::buf(g, &b.logits),
            Arg::buf(g, &b.norm),
            Arg::buf(g, &b.z1),
            tokens,
            positions,
            cursor,
            off,
            vi,
            bi,
            Arg::buf(g, &b.grad_w2),
            Arg::buf(g, &b.grad_b2),
            Arg::buf(g, &b.dh),
        ];
        // Regions of SLICE samples × SLICE vocabulary rows, each with SLICE/TILE × h_tiles blocks of two kinds.
        let blocks = batch.div_ceil(SLICE) * v.div_ceil(SLICE) * 2 * (SLICE / TILE) * h_tiles;
        let shared = stage + (TILED_BACKWARD_EXTRA * F32) as u32;
        g.launch(&backward, (blocks as u32, 1), shared, false, &args)?;

        let args = [
            Arg::buf(g, &p.embedding),
            Arg::buf(g, &p.w1),
            Arg::buf(g, &p.b1),
            Arg::buf(g, &p.w2),
            Arg::buf(g, &p.b2),
            Arg::buf(g, &b.x),
            Arg::buf(g, &b.z1),
            Arg::buf(g, &b.dh),
            Arg::buf(g, &b.grad_w2),
            Arg::buf(g, &b.grad_b2),
            Arg::buf(g, &b.grad_w1),
            Arg::buf(g, &b.grad_b1),
            tokens,
            positions,
            cursor,
            off,
            vi,
            Arg::i32(n as i32),
            bi,
            Arg::f32(lr),
            Arg::i32(W2_UPDATE_BLOCKS as i32),
            Arg::buf(g, &b.ticket),
            self.optimizer.as_ref().map_or(Arg::Ptr(0), |o| Arg::buf(g, &o.grad_embedding)),
        ];
        let blocks =
            s_tiles * d.div_ceil(TILE) + h_tiles * (d + 1).div_ceil(TILE) * batch.div_ceil(B_SLICE) + W2_UPDATE_BLOCKS;
        g.launch(&update, (blocks as u32, 1), stage, false, &args)?;

        let Some(o) = &self.optimizer else { return Ok(()) };
        // kernel_args: kind, lr, momentum, beta1, beta2, eps, weight_decay (the first seven); the rate is
        // the step's.
        let optim = o.config.kernel_args();
        let args = [
            &[
                Arg::buf(g, &p.embedding),
                Arg::buf(g, &p.w1),
                Arg::buf(g, &p.b1),
                Arg::buf(g, &p.w2),
                Arg::buf(g, &p.b2),
                Arg::buf(g, &o.grad_embedding),
                Arg::buf(g, &b.grad_w1),
                Arg::buf(g, &b.grad_b1),
                Arg::buf(g, &b.grad_w2),
                Arg::buf(g, &b.grad_b2),
                Arg::buf(g, &o.m),
                Arg::buf(g, &o.v),
                vi,
            ][..],
            &[optim[0], Arg::f32(lr)],
            &optim[2..7],
            &[Arg::buf(g, &o.step), Arg::buf(g, &o.ticket)],
        ]
        .concat();
        let blocks = (self.shape.parameter_count() as usize)
            .div_ceil(THREADS_PER_BLOCK as usize * 8)
            .clamp(1, 4 * g.sm_count as usize);
        g.launch(&o.kernel, (blocks as u32, 1), 0, false, &args)
    }
}
