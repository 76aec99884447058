//! The tiled step for large batches (fused/text_batch.cu): text_batch_forward, text_batch_backward and
//! text_batch_update over gemm_128 tiles, and text_batch_optimize for momentum and Adam; with
//! `--precision bf16`, text_batch_hidden_bf16, text_batch_logits_bf16, text_batch_dlogits_bf16 and
//! text_batch_backward_bf16 (the three V×H products on the bf16 tensor cores) in place of the first two.

use super::super::model::TextShape;
use super::GpuTrainer;
use super::layout::{B_SLICE, F32, SLICE, TILE, TILED_BACKWARD_EXTRA, W2_UPDATE_BLOCKS};
use crate::device::precision::Precision;
use crate::device::{Gpu, compile::has_wgmma, launch::Arg, launch::Kernel, launch::StructArg};
use crate::ops::THREADS_PER_BLOCK;
use crate::ops::gemm::{G128_STAGED_FLOATS, bf16_tile_shared_floats};
use crate::ops::optim::{OptimConfig, OptimKind};
use anyhow::{Context, Result, bail};
use cudarc::driver::CudaSlice;
use std::sync::Arc;

/// The bf16 tile's edge (`Bf16Tile::BM`, `BN`) and the multiple of k its ∂H splits take.
const BF16_TILE: usize = 128;
const BF16_SPLIT_MULTIPLE: usize = 64;
/// The most parts ∂H's product splits V into.
const MAX_DH_SPLITS: usize = 8;

pub(super) struct TiledKernels {
    forward: Kernel,
    backward: Kernel,
    update: Kernel,
    hidden_bf16: Kernel,
    logits_bf16: Kernel,
    dlogits_bf16: Kernel,
    backward_bf16: Kernel,
    round_w2: Kernel,
}

/// What `--precision bf16` adds to the tiled step: W2's bf16 copy (kept by the update kernels) and the
/// step's bf16 operands and ∂H parts, sized for `capacity` samples.
pub(super) struct Bf16State {
    pub(super) w2: CudaSlice<u16>,
    pub(super) capacity: usize,
    /// `[B][H]` h's bf16 copy.
    pub(super) hidden: CudaSlice<u16>,
    /// `[B][ldg]` G = (softmax − onehot)/B, rows of V rounded up to 8.
    pub(super) dlogits: CudaSlice<u16>,
    /// `[splits][B][H]` ∂H's parts over the splits of V.
    pub(super) dh_parts: CudaSlice<f32>,
}

impl Bf16State {
    /// G's row stride: V rounded up to whole 16-byte rows.
    fn ldg(vocab: usize) -> usize {
        vocab.next_multiple_of(8)
    }

    /// The ∂H product's split of V: vocabulary rows per split (a multiple of the tile's k) and the
    /// number of splits. A ∂W2 tile sums over the batch (K = B); splitting V into about V / B ranges
    /// gives the ∂H tiles about as much work each, and the two kinds together about one wave.
    fn dh_split(vocab: usize, batch: usize) -> (usize, usize) {
        let splits = (vocab as f64 / batch.max(1) as f64).round().clamp(1.0, MAX_DH_SPLITS as f64) as usize;
        let split_k = vocab.div_ceil(splits).next_multiple_of(BF16_SPLIT_MULTIPLE);
        (split_k, vocab.div_ceil(split_k))
    }

    /// Fills the step's bf16 buffers with NaN (bf16 0x7fc0, f32 NaN); W2's copy stays.
    pub(super) fn poison(&mut self, stream: &Arc<cudarc::driver::CudaStream>) -> Result<()> {
        for buf in [&mut self.hidden, &mut self.dlogits] {
            stream.memcpy_htod(&vec![0x7fc0u16; buf.len()], buf)?;
        }
        stream.memcpy_htod(&vec![f32::NAN; self.dh_parts.len()], &mut self.dh_parts)?;
        Ok(())
    }

    fn alloc(gpu: &Gpu, s: TextShape, capacity: usize, w2: CudaSlice<u16>) -> Result<Bf16State> {
        let stream = &gpu.stream;
        let room = "GPU out of memory for the bf16 step buffers";
        Ok(Bf16State {
            w2,
            capacity,
            hidden: stream.alloc_zeros::<u16>(capacity * s.hidden).context(room)?,
            dlogits: stream.alloc_zeros::<u16>(capacity * Self::ldg(s.vocab)).context(room)?,
            // Room for the most parts: a smaller batch than `capacity` splits V more often.
            dh_parts: stream.alloc_zeros::<f32>(MAX_DH_SPLITS * capacity * s.hidden).context(room)?,
        })
    }
}

/// What `--optim momentum` or `adam` adds to the tiled step: text_batch_optimize, the optimizer state over
/// the parameters as one vector (E, W1, b1, W2, b2), and the dense embedding gradient.
pub(super) struct OptimizerState {
    /// The optimizer's settings as text_batch_optimize takes them (not the rate, the step's), built once.
    settings: StructArg,
    kernel: Kernel,
    pub(super) m: CudaSlice<f32>,
    pub(super) v: CudaSlice<f32>,
    pub(super) grad_embedding: CudaSlice<f32>,
    pub(super) step: CudaSlice<u32>,
    pub(super) ticket: CudaSlice<u32>,
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
            self.refresh_buffers();
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
            settings: StructArg::of(&config.kernel_settings()),
            kernel,
            m: stream.alloc_zeros::<f32>(count).context(room)?,
            v: stream.alloc_zeros::<f32>(count).context(room)?,
            grad_embedding: stream.alloc_zeros::<f32>(s.vocab * s.embed).context(room)?,
            step: stream.alloc_zeros::<u32>(1)?,
            ticket: stream.alloc_zeros::<u32>(1)?,
        });
        self.refresh_buffers();
        self.captured = None;
        Ok(())
    }

    /// Runs the tiled step's products at `precision` from here on: fp32 (gemm_128) or bf16 (Bf16Tile). At
    /// bf16 every step, whatever its size, takes the tiled path (`text::check_precision`: no TF32).
    pub fn use_precision(&mut self, precision: Precision) -> Result<()> {
        super::super::check_precision(precision)?;
        match precision {
            Precision::Fp32 | Precision::Tf32 => self.bf16 = None,
            Precision::Bf16 => {
                if self.bf16.is_some() {
                    return Ok(());
                }
                if self.gpu.compute_capability < (8, 0) {
                    bail!("--precision bf16 needs a GPU with bf16 tensor cores (compute capability 8.0 or later)");
                }
                if self.layout.tiled_hidden_shared() > self.gpu.max_shared_optin {
                    bail!("--embed {} is too large for the bf16 step's shared memory", self.shape.embed);
                }
                self.settle_w2()?;
                let n = self.shape.vocab * self.shape.hidden;
                let w2 = self.gpu.stream.alloc_zeros::<u16>(n).context("GPU out of memory for W2's bf16 copy")?;
                let state = Bf16State::alloc(&self.gpu, self.shape, self.buffers.capacity, w2)?;
                let round = self.tiled_kernels()?.round_w2.clone();
                let g = &*self.gpu;
                let args = [Arg::buf(g, &self.params.w2), Arg::buf(g, &state.w2), Arg::i32(n as i32)];
                g.launch(&round, ((n.div_ceil(THREADS_PER_BLOCK as usize)).clamp(1, 1024) as u32, 1), 0, false, &args)?;
                self.bf16 = Some(state);
            }
        }
        self.refresh_buffers();
        self.captured = None;
        Ok(())
    }

    /// W2's bf16 copy (bf16 bits), which the bf16 products read; None at fp32.
    pub fn w2_bf16_copy(&self) -> Result<Option<Vec<u16>>> {
        self.bf16.as_ref().map(|b| self.gpu.stream.clone_dtoh(&b.w2).context("copying from the GPU")).transpose()
    }

    /// Grows the bf16 step buffers to `capacity` samples (the step buffers' capacity).
    pub(super) fn ensure_bf16_capacity(&mut self, capacity: usize) -> Result<()> {
        if let Some(state) = self.bf16.take_if(|b| b.capacity < capacity) {
            self.bf16 = Some(Bf16State::alloc(&self.gpu, self.shape, capacity, state.w2)?);
            self.refresh_buffers();
        }
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
                hidden_bf16: Gpu::function(&module, "text_batch_hidden_bf16")?,
                logits_bf16: Gpu::function(&module, "text_batch_logits_bf16")?,
                dlogits_bf16: Gpu::function(&module, "text_batch_dlogits_bf16")?,
                backward_bf16: Gpu::function(&module, "text_batch_backward_bf16")?,
                round_w2: Gpu::function(&module, "text_batch_round_w2")?,
            };
            let stage = 2 * G128_STAGED_FLOATS * F32;
            let bf16_tile = bf16_tile_shared_floats(has_wgmma(self.gpu.compute_capability)) * F32;
            self.gpu.reserve_shared(&kernels.logits_bf16, bf16_tile, "--hidden")?;
            self.gpu.reserve_shared(&kernels.backward_bf16, bf16_tile, "--hidden")?;
            if self.layout.tiled_hidden_shared() <= self.gpu.max_shared_optin {
                self.gpu.reserve_shared(&kernels.hidden_bf16, self.layout.tiled_hidden_shared(), "--embed")?;
            }
            if self.layout.tiled_fits {
                self.gpu.reserve_shared(&kernels.forward, self.layout.tiled_forward_shared(), "--hidden")?;
            }
            self.gpu.reserve_shared(&kernels.backward, stage + TILED_BACKWARD_EXTRA * F32, "--hidden")?;
            self.gpu.reserve_shared(&kernels.update, stage, "--hidden")?;
            self.tiled = Some(kernels);
        }
        Ok(self.tiled.as_ref().unwrap())
    }

    /// One step of `batch` samples at rate `lr` through fused/text_batch.cu's kernels: at fp32 its three
    /// kernels (and text_batch_optimize with an optimizer), at bf16 four products kernels, then the same
    /// update.
    pub fn launch_tiled_step(&mut self, batch: usize, offset: usize, lr: f32) -> Result<()> {
        self.ensure_capacity(batch)?;
        self.settle_w2()?;
        let dh_parts = match self.bf16 {
            Some(_) => self.launch_bf16_products(batch, offset)?,
            None => {
                self.launch_fp32_products(batch, offset)?;
                1
            }
        };
        self.launch_tiled_update(batch, offset, lr, dh_parts)
    }

    /// text_batch_forward and text_batch_backward: logits, softmax, loss, ∂W2, ∂b2 and ∂H (in b.dh).
    fn launch_fp32_products(&mut self, batch: usize, offset: usize) -> Result<()> {
        let k = self.tiled_kernels()?;
        let (forward, backward) = (k.forward.clone(), k.backward.clone());
        if !self.layout.tiled_fits {
            // Says which flag to lower.
            self.gpu.reserve_shared(&forward, self.layout.tiled_forward_shared(), "--hidden")?;
        }
        let (g, p, l, table) = (&*self.gpu, &self.params, &self.layout, &self.buffer_table);
        let TextShape { vocab: v, hidden: h, context: n, .. } = self.shape;
        let (off, vi, bi) = (Arg::u32(offset as u32), Arg::i32(v as i32), Arg::i32(batch as i32));
        let stage = (2 * G128_STAGED_FLOATS * F32) as u32;
        let (v_tiles, s_tiles, h_tiles) = (l.vocab_tiles(), batch.div_ceil(TILE), h.div_ceil(TILE));
        // text_batch_forward: one block per SM, each sample tile's vocabulary tiles split into groups.
        let groups = (g.sm_count as usize / s_tiles).clamp(1, v_tiles);
        // z1 holds h = ReLU(z1) on this path (text_batch_backward and text_batch_update read it).
        let grid = (groups as u32, s_tiles as u32);
        let args = [off, vi, Arg::i32(n as i32), bi, Arg::buf(g, &p.w1), Arg::buf(g, &p.b1)];
        g.launch_with_struct(&forward, (grid, l.tiled_forward_shared() as u32, false), table, &args)?;

        // Regions of SLICE samples × SLICE vocabulary rows, each with SLICE/TILE × h_tiles blocks of two kinds.
        let blocks = batch.div_ceil(SLICE) * v.div_ceil(SLICE) * 2 * (SLICE / TILE) * h_tiles;
        let shared = stage + (TILED_BACKWARD_EXTRA * F32) as u32;
        g.launch_with_struct(&backward, ((blocks as u32, 1), shared, false), table, &[off, vi, bi])?;
        Ok(())
    }

    /// The bf16 products (text_batch_hidden_bf16, _logits_bf16, _dlogits_bf16, _backward_bf16): loss,
    /// ∂W2, ∂b2 and ∂H's parts; returns how many parts.
    fn launch_bf16_products(&mut self, batch: usize, offset: usize) -> Result<i32> {
        let k = self.tiled_kernels()?;
        let (hidden, logits, dlogits, backward) =
            (k.hidden_bf16.clone(), k.logits_bf16.clone(), k.dlogits_bf16.clone(), k.backward_bf16.clone());
        let (g, p, b, l, table) = (&*self.gpu, &self.params, &self.buffers, &self.layout, &self.buffer_table);
        let Some(bf) = self.bf16.as_ref() else { bail!("internal: the bf16 step without its buffers") };
        let TextShape { vocab: v, hidden: h, context: n, .. } = self.shape;
        let (off, vi, bi) = (Arg::u32(offset as u32), Arg::i32(v as i32), Arg::i32(batch as i32));
        let ldg = Arg::i32(Bf16State::ldg(v) as i32);
        let tile_shared = (bf16_tile_shared_floats(has_wgmma(g.compute_capability)) * F32) as u32;
        let (s_tiles, h_tiles) = (batch.div_ceil(TILE), h.div_ceil(TILE));

        let grid = (h_tiles as u32, s_tiles as u32);
        g.launch_with_struct(
            &hidden,
            (grid, l.tiled_hidden_shared() as u32, false),
            table,
            &[off, Arg::i32(n as i32), bi, Arg::buf(g, &p.w1), Arg::buf(g, &p.b1)],
        )?;

        let args = [Arg::buf(g, &bf.hidden), Arg::buf(g, &bf.w2), Arg::buf(g, &p.b2), Arg::buf(g, &b.logits), vi, bi];
        let grid = (v.div_ceil(BF16_TILE) as u32, batch.div_ceil(BF16_TILE) as u32);
        g.launch(&logits, grid, tile_shared, false, &args)?;

        g.launch_with_struct(&dlogits, ((batch as u32, 1), 0, false), table, &[off, vi, ldg, bi])?;

        let (split_k, splits) = Bf16State::dh_split(v, batch);
        let hb = h.div_ceil(BF16_TILE);
        let blocks = v.div_ceil(BF16_TILE) * hb + splits * batch.div_ceil(BF16_TILE) * hb;
        let args = [ldg, vi, bi, Arg::i32(split_k as i32)];
        g.launch_with_struct(&backward, ((blocks as u32, 1), tile_shared, false), table, &args)?;
        Ok(splits as i32)
    }

    /// text_batch_update (and text_batch_optimize with an optimizer): ∂x, ∂W1, ∂b1 from ∂H's `dh_parts`
    /// parts (the bf16 step's, or b.dh), then every update; at bf16 also W2's bf16 copy.
    fn launch_tiled_update(&mut self, batch: usize, offset: usize, lr: f32, dh_parts: i32) -> Result<()> {
        let update = self.tiled_kernels()?.update.clone();
        let (g, b, table) = (&*self.gpu, &self.buffers, &self.buffer_table);
        let TextShape { vocab: v, embed: d, hidden: h, context: n } = self.shape;
        let vi = Arg::i32(v as i32);
        let stage = (2 * G128_STAGED_FLOATS * F32) as u32;
        let (s_tiles, h_tiles) = (batch.div_ceil(TILE), h.div_ceil(TILE));
        // ∂H is the bf16 step's parts where the table holds them (text_batch_update reads dh_parts then).
        let args = [
            Arg::u32(offset as u32),
            vi,
            Arg::i32(n as i32),
            Arg::i32(batch as i32),
            Arg::f32(lr),
            Arg::i32(W2_UPDATE_BLOCKS as i32),
            Arg::i32(dh_parts),
        ];
        let blocks =
            s_tiles * d.div_ceil(TILE) + h_tiles * (d + 1).div_ceil(TILE) * batch.div_ceil(B_SLICE) + W2_UPDATE_BLOCKS;
        g.launch_with_struct(&update, ((blocks as u32, 1), stage, false), table, &args)?;

        let Some(o) = &self.optimizer else { return Ok(()) };
        // The optimizer's settings by value (text_batch_optimize does not clip); the rate is the step's.
        let blocks = (self.shape.parameter_count() as usize)
            .div_ceil(THREADS_PER_BLOCK as usize * 8)
            .clamp(1, 4 * g.sm_count as usize);
        let args = [vi, Arg::f32(lr), Arg::buf(g, &b.grad_w2), Arg::buf(g, &b.grad_b2)];
        g.launch_with_structs(&o.kernel, ((blocks as u32, 1), 0, false), &[table, &o.settings], &args)
    }
}
