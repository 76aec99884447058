//! The text model on a CUDA GPU: parameters, the token stream and each epoch's sample order stay in
//! device memory; every SGD step is three kernels: those of `fused/text_sample.cu` for one sample (where
//! the shape allows), those of `fused/text.cu` for a few samples and those of `fused/text_batch.cu`
//! (tiled matrix products) from TILED_MIN_BATCH samples on; runs of steps
//! are captured once as a CUDA graph and replayed, so a step costs three graph nodes instead of three
//! launches. The host reads back only the summed loss, once per `train` call.

use super::TextTrainer;
use super::model::{EvalSums, TextParams, TextShape};
use crate::device::{Arg, Gpu, Kernel, THREADS_PER_BLOCK};
use crate::ops::gemm::{G128_BK, G128_LD, G128_STAGED_FLOATS};
use crate::ops::optim::{OptimConfig, OptimKind};
use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaGraph, CudaSlice};
use std::collections::HashMap;
use std::sync::Arc;

const WARPS: usize = 8;
/// Steps of at least this many samples take the tiled-matmul kernels of `fused/text_batch.cu`.
pub const TILED_MIN_BATCH: usize = 64;
/// Tile edge, text_batch_backward's K per block and text_batch_update's samples per ∂W1 block of
/// fused/text_batch.cu (TILE, SLICE, B_SLICE).
const TILE: usize = 128;
const SLICE: usize = 1024;
const B_SLICE: usize = 128;
/// Floats of text_batch_backward's shared memory after its two staged operands: the ∂W2 blocks' sample
/// records [SLICE] (4 floats each) and ∂b2 sums [WARPS][TILE].
const TILED_BACKWARD_EXTRA: usize = 4 * SLICE + WARPS * TILE;
/// Blocks of text_batch_update that apply the W2 update.
const W2_UPDATE_BLOCKS: usize = 132;
/// Samples per evaluation launch.
const EVAL_BATCH: usize = 256;
/// Most samples a text.cu kernel handles together for `shape` (TEXT_SB).
pub fn max_chunk(shape: TextShape) -> usize {
    (2048 / shape.hidden.max(1)).min(2048 / shape.embed.max(1)).clamp(1, 8)
}

/// The kernel modules a trainer of `shape` compiles for steps of `batch` samples (see `device::precompile`).
pub fn modules(shape: TextShape, batch: usize) -> Vec<crate::device::ModuleRequest> {
    let (d, h) = (("TEXT_D", shape.embed as i64), ("TEXT_H", shape.hidden as i64));
    let mut out = vec![("text_sample", vec![d, h]), ("text_batch", vec![d, h])];
    for chunk in [1, batch.clamp(1, max_chunk(shape))] {
        out.push(("text", vec![d, h, ("TEXT_SB", chunk as i64)]));
    }
    out
}

/// Steps captured in one CUDA graph.
const GRAPH_STEPS: usize = 128;
/// Bytes of W2 rows text_forward / text_backward stage in shared memory at once (a block's rows for the
/// benchmark shape, 63 × 256 floats, fit in one tile).
const W2_TILE_BYTES: usize = 72 * 1024;
/// text_update forms the whole dx in every block (W1 staged in shared memory) when its shared memory stays
/// under this, leaving room beside it on the SM for the step's other kernels.
const UPDATE_WHOLE_DX_SHARED: usize = 112 * 1024;
/// Hidden units per sample_backward block (HS in fused/text_sample.cu).
const SAMPLE_UNITS: usize = 16;
/// sample_forward's static __shared__ arrays (three of WARPS entries: 128 bytes), which count against the
/// same per-block limit as its dynamic shared memory.
const SAMPLE_FORWARD_STATIC_SHARED: usize = 128;
/// The kernels keep per-lane register arrays of H/32 and D/32 values.
pub const MAX_HIDDEN: usize = 2048;
pub const MAX_EMBED: usize = 1024;

/// How the kernels split the work, derived from the model shape and the device.
#[derive(Clone, Copy, Debug)]
pub struct TextLayout {
    pub shape: TextShape,
    /// Most samples a kernel handles together (TEXT_SB); a step of B samples uses min(B, max_chunk).
    pub max_chunk: usize,
    /// Vocabulary rows per block of text_forward / text_backward.
    pub rows_per_block: usize,
    /// W2 rows of a block staged in shared memory at once (≤ rows_per_block).
    pub tile_rows: usize,
    /// Blocks of text_forward / text_backward (G).
    pub grid: usize,
    /// Blocks of text_update (one hidden row per warp).
    pub update_grid: usize,
    /// Whether text_batch_forward's tiles fit the device's shared memory (else large batches also take
    /// the chunked kernels).
    pub tiled_fits: bool,
    /// Whether single-sample steps take fused/text_sample.cu (H a multiple of 4, a block's W2 rows in
    /// shared memory at once); else fused/text.cu.
    pub sample_fits: bool,
}

const F32: usize = std::mem::size_of::<f32>();

impl TextLayout {
    pub fn new(shape: TextShape, sm_count: usize, max_shared: usize) -> Result<TextLayout> {
        let TextShape { vocab: v, embed: d, hidden: h, .. } = shape;
        if h > MAX_HIDDEN {
            bail!("--hidden {h} is above the GPU kernels' limit of {MAX_HIDDEN}; lower --hidden or use --device cpu");
        }
        if d > MAX_EMBED {
            bail!("--embed {d} is above the GPU kernels' limit of {MAX_EMBED}; lower --embed or use --device cpu");
        }
        let max_chunk = max_chunk(shape);
        let mut layout = TextLayout {
            shape,
            max_chunk,
            rows_per_block: 1,
            tile_rows: 1,
            grid: v,
            update_grid: h.div_ceil(WARPS),
            tiled_fits: false,
            sample_fits: false,
        };
        layout.tiled_fits = layout.tiled_forward_shared() <= max_shared;
        // Rows per block: the vocabulary spread over every SM, fewer where text_backward's shared memory
        // (a tile of W2 rows, and its W2 gradient rows when B > SB) would not fit.
        let tile_cap = (W2_TILE_BYTES / (h * F32)).max(1);
        let fixed = ((1 + WARPS) * max_chunk * h + tile_cap * (h + 1)) * F32;
        let fit_rows = max_shared.saturating_sub(fixed) / ((h + 1 + max_chunk) * F32);
        if fit_rows == 0 {
            bail!(
                "--hidden {h} needs more shared memory per block than this GPU has ({} KB); lower --hidden",
                max_shared / 1024
            );
        }
        layout.rows_per_block = v.div_ceil(sm_count).min(fit_rows).max(1);
        layout.tile_rows = layout.rows_per_block.min(tile_cap);
        layout.grid = v.div_ceil(layout.rows_per_block);
        layout.sample_fits = h % 4 == 0 && layout.sample_forward_shared() + SAMPLE_FORWARD_STATIC_SHARED <= max_shared;
        Ok(layout)
    }

    /// The flag to name when `bytes` of shared memory per block exceed `max_shared`: `--context` where a
    /// one-token context would fit, else `flag`.
    pub fn flag_at_fault(
        &self,
        bytes: &dyn Fn(&TextLayout) -> usize,
        max_shared: usize,
        flag: &'static str,
    ) -> &'static str {
        let one_token = TextLayout { shape: TextShape { context: 1, ..self.shape }, ..*self };
        if bytes(self) > max_shared && bytes(&one_token) <= max_shared { "--context" } else { flag }
    }

    /// Whether a step of `batch` samples takes the tiled kernels.
    pub fn tiled(&self, batch: usize) -> bool {
        batch >= TILED_MIN_BATCH && self.tiled_fits
    }

    /// text_batch_forward: hT `[H][LD]` and xT `[D][LD]` (H and D rounded up to whole chunks), one staged
    /// operand.
    pub fn tiled_forward_shared(&self) -> usize {
        let (h, d) = (self.shape.hidden.next_multiple_of(G128_BK), self.shape.embed.next_multiple_of(G128_BK));
        ((h + d) * G128_LD + G128_STAGED_FLOATS) * F32
    }

    /// Vocabulary tiles of text_batch_forward.
    pub fn vocab_tiles(&self) -> usize {
        self.shape.vocab.div_ceil(TILE)
    }

    pub fn chunk(&self, batch: usize) -> usize {
        batch.clamp(1, self.max_chunk)
    }

    /// text_hidden: xs `[chunk][D]`, context tokens `[chunk][N]`.
    pub fn hidden_shared(&self, chunk: usize) -> usize {
        chunk * (self.shape.embed + self.shape.context) * F32
    }

    /// text_forward: W2 tile `[tile_rows][H]`, hs `[chunk][H]`, b2 tile `[tile_rows]`.
    pub fn forward_shared(&self, chunk: usize) -> usize {
        (self.tile_rows * (self.shape.hidden + 1) + chunk * self.shape.hidden) * F32
    }

    /// W2 and b2 tiles [tile_rows][H + 1], hs `[chunk][H]`, dh_warp `[WARPS][chunk][H]`, dl `[chunk][R]`, and
    /// for batches above the chunk gw2 `[R][H]` and gb2 `[R]`.
    pub fn backward_shared(&self, chunk: usize, batch_above_chunk: bool) -> usize {
        let (h, r) = (self.shape.hidden, self.rows_per_block);
        let tile = self.tile_rows * (h + 1);
        (tile + (1 + WARPS) * chunk * h + chunk * r + if batch_above_chunk { r * (h + 1) } else { 0 }) * F32
    }

    /// sample_forward: hs `[H]`, hp `[H]`, the block's W2 rows `[R][LD]`, bs, ls, es [R rounded up to 4].
    pub fn sample_forward_shared(&self) -> usize {
        let (h, r) = (self.shape.hidden, self.rows_per_block);
        let ld = h.next_multiple_of(32) + 16; // LD in fused/text_sample.cu
        (2 * h + r * ld + 3 * r.next_multiple_of(4)) * F32
    }

    /// Blocks of sample_backward: SAMPLE_UNITS hidden units each.
    pub fn sample_backward_grid(&self) -> usize {
        self.shape.hidden.div_ceil(SAMPLE_UNITS)
    }

    /// sample_backward: W1 rows `[HS][D]`, xs `[D]`, scale `[G]`, sums `[THREADS/HS][HS]`, dz `[HS]`.
    pub fn sample_backward_shared(&self) -> usize {
        let threads = THREADS_PER_BLOCK as usize;
        (SAMPLE_UNITS * self.shape.embed + self.shape.embed + self.grid + threads + SAMPLE_UNITS) * F32
    }

    /// sample_update: context `[N]`, next context `[N]`, next rows `[N][D]`, delta `[D]`, xn `[D]`.
    pub fn sample_update_shared(&self) -> usize {
        let TextShape { embed: d, context: n, .. } = self.shape;
        (2 * n + n * d + 2 * d) * F32
    }

    /// Whether every text_update block (compiled for `chunk`) forms the whole dx and the next step's z1 of its
    /// rows, rather than the last block forming the next step's hidden layer (steps of one chunk only).
    pub fn update_whole_dx(&self, chunk: usize) -> bool {
        self.update_shared(chunk, true) <= UPDATE_WHOLE_DX_SHARED
    }

    /// text_update: W1 `[H][D]` with `whole_dx`, xs `[chunk][D]`, dx_warp `[WARPS][chunk][D]`, dz `[chunk][WARPS]`,
    /// this and the next step's context tokens `[chunk][N]`, and with `whole_dx` the next step's embedding rows
    /// `[chunk][N][D]` and dz1 of every hidden row `[chunk][H]`.
    pub fn update_shared(&self, chunk: usize, whole_dx: bool) -> usize {
        let TextShape { embed: d, hidden: h, context: n, .. } = self.shape;
        let whole = if whole_dx { chunk * n * d + chunk * h + h * d } else { 0 };
        ((1 + WARPS) * chunk * d + chunk * WARPS + 2 * chunk * n + whole) * F32
    }
}

/// Device copies of the five parameter tensors.
pub struct DeviceParams {
    pub embedding: CudaSlice<f32>,
    pub w1: CudaSlice<f32>,
    pub b1: CudaSlice<f32>,
    pub w2: CudaSlice<f32>,
    pub b2: CudaSlice<f32>,
}

/// Per-step intermediates, sized for `capacity` samples.
pub struct StepBuffers {
    pub capacity: usize,
    pub x: CudaSlice<f32>,
    pub z1: CudaSlice<f32>,
    pub logits: CudaSlice<f32>,
    /// `[B][G]` softmax partials, (max, Σexp) as two floats.
    pub stats: CudaSlice<f32>,
    /// `[B][H]` ∂loss/∂h, summed with atomics by text_backward's blocks (text_forward zeroes it), and the
    /// tiled path's ∂H.
    pub dh: CudaSlice<f32>,
    pub rank: CudaSlice<u32>,
    /// `[B][D]` dx summed over text_update's blocks; text_forward zeroes it.
    pub dx_sum: CudaSlice<f32>,
    /// text_update's finished-block counter; zero between steps.
    pub ticket: CudaSlice<u32>,
    /// Tiled path: `[B]` (max, 1/Σexp) of each sample's softmax.
    pub norm: CudaSlice<f32>,
    /// Tiled path: text_batch_forward's finished-block counter per sample tile.
    pub tile_tickets: CudaSlice<u32>,
    /// Tiled path: gradients between text_batch_backward / text_batch_update (W1's zero between steps).
    pub grad_w2: CudaSlice<f32>,
    pub grad_b2: CudaSlice<f32>,
    pub grad_w1: CudaSlice<f32>,
    pub grad_b1: CudaSlice<f32>,
}

struct Kernels {
    hidden: Kernel,
    forward: Kernel,
    backward: Kernel,
    update: Kernel,
    advance: Kernel,
    eval_rank: Kernel,
    eval_finish: Kernel,
}

struct SampleKernels {
    forward: Kernel,
    backward: Kernel,
    update: Kernel,
    flush: Kernel,
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

struct TiledKernels {
    forward: Kernel,
    backward: Kernel,
    update: Kernel,
}

/// What `--optim momentum` or `adam` adds to the tiled step: text_batch_optimize, the optimizer state over
/// the parameters as one vector (E, W1, b1, W2, b2), and the dense embedding gradient.
struct OptimizerState {
    config: OptimConfig,
    kernel: Kernel,
    m: CudaSlice<f32>,
    v: CudaSlice<f32>,
    grad_embedding: CudaSlice<f32>,
    step: CudaSlice<u32>,
    ticket: CudaSlice<u32>,
}

struct CapturedSteps {
    batch: usize,
    lr: f32,
    graph: CudaGraph,
}

pub struct GpuTrainer {
    gpu: Arc<Gpu>,
    shape: TextShape,
    pub layout: TextLayout,
    /// Kernels compiled for each chunk size in use (TEXT_SB).
    kernels: HashMap<usize, Kernels>,
    /// fused/text_batch.cu, compiled on the first large batch.
    tiled: Option<TiledKernels>,
    /// fused/text_sample.cu, compiled on the first single-sample step.
    sample: Option<SampleKernels>,
    pub sample_buffers: SampleBuffers,
    /// A single-sample step's W2/b2 update is still pending on the stream (see SampleBuffers).
    w2_pending: bool,
    pub params: DeviceParams,
    tokens: CudaSlice<u32>,
    /// Sample positions; every entry, also past the uploaded ones, is a valid position (text_update reads
    /// the next step's samples when it forms their hidden layer).
    positions: CudaSlice<u32>,
    cursor: CudaSlice<u32>,
    pub buffers: StepBuffers,
    loss_sum: CudaSlice<f64>,
    hit_counts: CudaSlice<u64>,
    captured: Option<CapturedSteps>,
    /// Set for --optim momentum or adam: every step then takes the tiled path and this update.
    optimizer: Option<OptimizerState>,
}

impl GpuTrainer {
    pub fn new(gpu: Arc<Gpu>, params: &TextParams, tokens: Arc<[u32]>) -> Result<GpuTrainer> {
        let shape = params.shape;
        let layout = TextLayout::new(shape, gpu.sm_count as usize, gpu.max_shared_optin)?;
        let stream = gpu.stream.clone();
        let upload = |host: &[f32]| stream.clone_htod(host).context("copying the model to the GPU");
        let params = DeviceParams {
            embedding: upload(&params.embedding)?,
            w1: upload(&params.w1)?,
            b1: upload(&params.b1)?,
            w2: upload(&params.w2)?,
            b2: upload(&params.b2)?,
        };
        let tokens = stream.clone_htod(&tokens[..]).context("copying the token stream to the GPU")?;
        let buffers = Self::alloc_buffers(&gpu, shape, &layout, EVAL_BATCH)?;
        let (g, h) = (layout.grid, shape.hidden);
        let sample_buffers = SampleBuffers {
            partials: stream.alloc_zeros::<f32>(g * h).context("GPU out of memory")?,
            stats: stream.alloc_zeros::<f32>(2 * g * 2)?,
            records: stream.alloc_zeros::<u32>(4 * g)?,
            h_pending: stream.alloc_zeros::<f32>(g * h)?,
            dx_shares: stream.alloc_zeros::<f32>(layout.sample_backward_grid() * shape.embed)?,
            w2_target: stream.alloc_zeros::<f32>(h)?,
            next_rows: stream.alloc_zeros::<f32>(shape.context * shape.embed)?,
        };
        Ok(GpuTrainer {
            positions: stream.clone_htod(&[shape.context as u32])?,
            cursor: stream.alloc_zeros::<u32>(1)?,
            loss_sum: stream.alloc_zeros::<f64>(1)?,
            hit_counts: stream.alloc_zeros::<u64>(2)?,
            gpu,
            shape,
            layout,
            kernels: HashMap::new(),
            tiled: None,
            sample: None,
            sample_buffers,
            w2_pending: false,
            params,
            tokens,
            buffers,
            captured: None,
            optimizer: None,
        })
    }

    /// Trains with `config` from here on instead of the fused SGD update: every step, whatever its size,
    /// goes through fused/text_batch.cu and then text_batch_optimize (optim.cuh). SGD keeps the fused paths.
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
        let module = self.gpu.module("text_batch", &[("TEXT_D", s.embed as i64), ("TEXT_H", s.hidden as i64)])?;
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

    /// The kernels for steps of `batch` samples, compiled on first use.
    fn kernels_for(&mut self, batch: usize) -> Result<&Kernels> {
        let chunk = self.layout.chunk(batch);
        if !self.kernels.contains_key(&chunk) {
            let s = self.shape;
            let module = self.gpu.module(
                "text",
                &[("TEXT_D", s.embed as i64), ("TEXT_H", s.hidden as i64), ("TEXT_SB", chunk as i64)],
            )?;
            let load = |name: &str| Gpu::function(&module, name);
            let kernels = Kernels {
                hidden: load("text_hidden")?,
                forward: load("text_forward")?,
                backward: load("text_backward")?,
                update: load("text_update")?,
                advance: load("text_advance")?,
                eval_rank: load("text_eval_rank")?,
                eval_finish: load("text_eval_finish")?,
            };
            let (l, max) = (&self.layout, self.gpu.max_shared_optin);
            let reserve = |f: &Kernel, bytes: &dyn Fn(&TextLayout) -> usize, flag| {
                self.gpu.reserve_shared(f, bytes(l), l.flag_at_fault(bytes, max, flag))
            };
            reserve(&kernels.hidden, &|l| l.hidden_shared(chunk), "--embed")?;
            reserve(&kernels.forward, &|l| l.forward_shared(chunk), "--hidden")?;
            reserve(&kernels.backward, &|l| l.backward_shared(chunk, true), "--hidden")?;
            reserve(&kernels.update, &|l| l.update_shared(chunk, l.update_whole_dx(chunk)), "--embed")?;
            for f in [&kernels.hidden, &kernels.forward, &kernels.backward, &kernels.update] {
                self.gpu.prefer_shared_carveout(f)?;
            }
            self.kernels.insert(chunk, kernels);
        }
        Ok(&self.kernels[&chunk])
    }

    fn sample_kernels(&mut self) -> Result<&SampleKernels> {
        if self.sample.is_none() {
            let s = self.shape;
            let module = self.gpu.module("text_sample", &[("TEXT_D", s.embed as i64), ("TEXT_H", s.hidden as i64)])?;
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
        batch == 1 && self.layout.sample_fits && self.optimizer.is_none()
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

    fn tiled_kernels(&mut self) -> Result<&TiledKernels> {
        if self.tiled.is_none() {
            let s = self.shape;
            let module = self.gpu.module("text_batch", &[("TEXT_D", s.embed as i64), ("TEXT_H", s.hidden as i64)])?;
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

    /// One SGD step of `batch` samples through fused/text_batch.cu's three kernels.
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
        let c = o.config;
        let args = [
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
            Arg::i32(c.kind.kernel_code()),
            Arg::f32(c.lr),
            Arg::f32(c.momentum),
            Arg::f32(c.beta1),
            Arg::f32(c.beta2),
            Arg::f32(c.eps),
            Arg::f32(c.weight_decay),
            Arg::buf(g, &o.step),
            Arg::buf(g, &o.ticket),
        ];
        let blocks = (self.shape.parameter_count() as usize)
            .div_ceil(THREADS_PER_BLOCK as usize * 8)
            .clamp(1, 4 * g.sm_count as usize);
        g.launch(&o.kernel, (blocks as u32, 1), 0, false, &args)
    }

    fn alloc_buffers(gpu: &Gpu, shape: TextShape, layout: &TextLayout, capacity: usize) -> Result<StepBuffers> {
        let s = &gpu.stream;
        let TextShape { vocab: v, embed: d, hidden: h, .. } = shape;
        let g = layout.grid;
        let capacity = capacity.max(1);
        let alloc = |n: usize| s.alloc_zeros::<f32>(n).context("GPU out of memory for the step buffers");
        Ok(StepBuffers {
            capacity,
            x: alloc(capacity * d)?,
            z1: alloc(capacity * h)?,
            logits: alloc(capacity * v)?,
            stats: alloc(capacity * g.max(layout.vocab_tiles()) * 2)?,
            dh: alloc(capacity * h)?,
            rank: s.alloc_zeros::<u32>(capacity)?,
            dx_sum: alloc(capacity * d)?,
            ticket: s.alloc_zeros::<u32>(1)?,
            norm: alloc(capacity * 2)?,
            tile_tickets: s.alloc_zeros::<u32>(capacity.div_ceil(TILE))?,
            grad_w2: alloc(v * h)?,
            grad_b2: alloc(v)?,
            grad_w1: alloc(h * d)?,
            grad_b1: alloc(h)?,
        })
    }

    /// Grows the step buffers to hold `batch` samples (a no-op when they already do).
    pub fn ensure_capacity(&mut self, batch: usize) -> Result<()> {
        if batch > self.buffers.capacity {
            self.settle_w2()?; // a pending update's logits live in the buffers being replaced
            self.captured = None;
            self.buffers = Self::alloc_buffers(&self.gpu, self.shape, &self.layout, batch)?;
        }
        Ok(())
    }

    /// Uploads a sample order and rewinds the device cursor to its start.
    pub fn set_positions(&mut self, positions: &[u32]) -> Result<()> {
        if positions.len() > self.positions.len() {
            self.captured = None;
            self.positions = self.gpu.stream.clone_htod(&vec![self.shape.context as u32; positions.len()])?;
        }
        let stream = &self.gpu.stream;
        stream.memcpy_htod(positions, &mut self.positions.slice_mut(..positions.len()))?;
        stream.memcpy_htod(&[0u32], &mut self.cursor)?;
        Ok(())
    }

    /// x and z1 of `batch` samples starting `offset` past the cursor, where no text_update formed them.
    pub fn launch_hidden(&mut self, batch: usize, offset: usize) -> Result<()> {
        self.ensure_capacity(batch)?;
        let chunk = self.layout.chunk(batch);
        let func = self.kernels_for(batch)?.hidden.clone();
        let (g, p, b) = (&*self.gpu, &self.params, &self.buffers);
        let args = [
            Arg::buf(g, &p.embedding),
            Arg::buf(g, &p.w1),
            Arg::buf(g, &p.b1),
            Arg::buf(g, &self.tokens),
            Arg::buf(g, &self.positions),
            Arg::buf(g, &self.cursor),
            Arg::u32(offset as u32),
            Arg::i32(self.shape.context as i32),
            Arg::i32(batch as i32),
            Arg::buf(g, &b.x),
            Arg::buf(g, &b.z1),
        ];
        let blocks = batch.div_ceil(chunk) as u32;
        g.launch(&func, (blocks, 1), self.layout.hidden_shared(chunk) as u32, false, &args)
    }

    /// Kernel 1 for `batch` samples, whose z1 is in place (text_hidden or the previous step's text_update).
    /// `programmatic`: may overlap the kernel before it (only when that is a step kernel, never text_advance
    /// or a copy).
    pub fn launch_forward(&mut self, batch: usize, programmatic: bool) -> Result<()> {
        self.ensure_capacity(batch)?;
        self.settle_w2()?;
        let chunk = self.layout.chunk(batch);
        let func = self.kernels_for(batch)?.forward.clone();
        let (g, p, b) = (&*self.gpu, &self.params, &self.buffers);
        let l = &self.layout;
        let args = [
            Arg::buf(g, &p.w2),
            Arg::buf(g, &p.b2),
            Arg::buf(g, &b.z1),
            Arg::i32(self.shape.vocab as i32),
            Arg::i32(batch as i32),
            Arg::i32(l.rows_per_block as i32),
            Arg::i32(l.tile_rows as i32),
            Arg::buf(g, &b.logits),
            Arg::buf(g, &b.stats),
            Arg::buf(g, &b.dh),
            Arg::buf(g, &b.dx_sum),
        ];
        g.launch(&func, (l.grid as u32, 1), l.forward_shared(chunk) as u32, programmatic, &args)
    }

    /// Kernel 2: softmax normalisation, W2/b2 update, dh partials, loss.
    pub fn launch_backward(&mut self, batch: usize, offset: usize, lr: f32, programmatic: bool) -> Result<()> {
        self.settle_w2()?;
        let chunk = self.layout.chunk(batch);
        let func = self.kernels_for(batch)?.backward.clone();
        let (g, p, b) = (&*self.gpu, &self.params, &self.buffers);
        let l = &self.layout;
        let args = [
            Arg::buf(g, &p.w2),
            Arg::buf(g, &p.b2),
            Arg::buf(g, &b.logits),
            Arg::buf(g, &b.stats),
            Arg::buf(g, &b.z1),
            Arg::buf(g, &self.tokens),
            Arg::buf(g, &self.positions),
            Arg::buf(g, &self.cursor),
            Arg::u32(offset as u32),
            Arg::i32(self.shape.vocab as i32),
            Arg::i32(batch as i32),
            Arg::i32(l.rows_per_block as i32),
            Arg::i32(l.tile_rows as i32),
            Arg::f32(lr),
            Arg::buf(g, &b.dh),
            Arg::buf(g, &self.loss_sum),
        ];
        let shared = l.backward_shared(chunk, batch > chunk);
        g.launch(&func, (l.grid as u32, 1), shared as u32, programmatic, &args)
    }

    /// Kernel 3: W1/b1 update and the embedding rows of the context tokens; then x and z1 of the next
    /// `batch` samples.
    pub fn launch_update(&mut self, batch: usize, offset: usize, lr: f32, programmatic: bool) -> Result<()> {
        let chunk = self.layout.chunk(batch);
        let func = self.kernels_for(batch)?.update.clone();
        let (g, p, b) = (&*self.gpu, &self.params, &self.buffers);
        let l = &self.layout;
        let args = [
            Arg::buf(g, &p.embedding),
            Arg::buf(g, &p.w1),
            Arg::buf(g, &p.b1),
            Arg::buf(g, &b.x),
            Arg::buf(g, &b.z1),
            Arg::buf(g, &b.dh),
            Arg::buf(g, &self.tokens),
            Arg::buf(g, &self.positions),
            Arg::u32(self.positions.len() as u32),
            Arg::buf(g, &self.cursor),
            Arg::u32(offset as u32),
            Arg::i32(self.shape.context as i32),
            Arg::i32(batch as i32),
            Arg::f32(lr),
            Arg::i32(l.update_whole_dx(chunk) as i32),
            Arg::buf(g, &b.dx_sum),
            Arg::buf(g, &b.ticket),
        ];
        let shared = l.update_shared(chunk, l.update_whole_dx(chunk)) as u32;
        g.launch(&func, (l.update_grid as u32, 1), shared, programmatic, &args)
    }

    pub fn launch_advance(&mut self, samples: usize) -> Result<()> {
        let func = self.kernels_for(1)?.advance.clone();
        let args = [Arg::buf(&self.gpu, &self.cursor), Arg::u32(samples as u32)];
        self.gpu.launch(&func, (1, 1), 0, false, &args)
    }

    /// One SGD step: the three kernels, each overlapping the tail of the one before it (large batches: the
    /// three tiled kernels).
    /// `after_step`: the previous kernels on the stream are a step of the same size, whose text_update
    /// formed this step's hidden layer; otherwise text_hidden forms it first.
    pub fn launch_step(&mut self, batch: usize, offset: usize, lr: f32, after_step: bool) -> Result<()> {
        if self.layout.tiled(batch) || self.optimizer.is_some() {
            return self.launch_tiled_step(batch, offset, lr);
        }
        if !after_step {
            self.launch_hidden(batch, offset)?;
        }
        if self.sample_path(batch) {
            return self.launch_sample_step(offset, lr, after_step);
        }
        self.launch_forward(batch, after_step)?;
        self.launch_backward(batch, offset, lr, true)?;
        self.launch_update(batch, offset, lr, true)
    }

    /// The three single-sample kernels (fused/text_sample.cu); z1 must be in place. `programmatic`: the
    /// kernel before is the previous step's sample_update.
    fn launch_sample_step(&mut self, offset: usize, lr: f32, programmatic: bool) -> Result<()> {
        self.launch_sample_forward(offset, lr, programmatic)?;
        self.launch_sample_backward(offset, lr, true)?;
        self.launch_sample_update(offset, lr, true)
    }

    /// Captures whatever `enqueue` launches on the trainer's stream as one CUDA graph.
    pub fn capture(&mut self, enqueue: impl FnOnce(&mut Self) -> Result<()>) -> Result<CudaGraph> {
        let stream = self.gpu.stream.clone();
        crate::device::capture_graph(&stream, self, enqueue)
    }

    /// GRAPH_STEPS steps of `batch` samples followed by the cursor advance.
    /// Single samples: each step's sample_update forms the next sample's hidden layer, also across the
    /// cursor advance, so the graph starts from the z1 that the previous replay (or, before the first,
    /// text_hidden) left; larger batches form it with text_hidden at the start of each replay.
    fn capture_steps(&mut self, batch: usize, lr: f32) -> Result<CudaGraph> {
        let sample = self.sample_path(batch);
        self.capture(|t| {
            for step in 0..GRAPH_STEPS {
                if sample {
                    t.launch_sample_step(step, lr, step > 0)?;
                } else {
                    t.launch_step(batch, step * batch, lr, step > 0)?;
                }
            }
            t.launch_advance(GRAPH_STEPS * batch)
        })
    }

    /// Registers and local (spill) bytes per thread of each kernel and chunk size, from the driver.
    pub fn kernel_resources(&self) -> Vec<(&'static str, usize, i32, i32)> {
        let mut rows = Vec::new();
        for (chunk, k) in &self.kernels {
            for (name, f) in [
                ("text_hidden", &k.hidden),
                ("text_forward", &k.forward),
                ("text_backward", &k.backward),
                ("text_update", &k.update),
            ] {
                rows.push((name, *chunk, f.num_regs().unwrap_or(-1), f.local_size_bytes().unwrap_or(-1)));
            }
        }
        if let Some(k) = &self.sample {
            for (name, f) in
                [("sample_forward", &k.forward), ("sample_backward", &k.backward), ("sample_update", &k.update)]
            {
                rows.push((name, 1, f.num_regs().unwrap_or(-1), f.local_size_bytes().unwrap_or(-1)));
            }
        }
        rows
    }

    fn graph_for(&mut self, batch: usize, lr: f32) -> Result<&CudaGraph> {
        let reuse = matches!(&self.captured, Some(c) if c.batch == batch && c.lr == lr);
        if !reuse {
            self.captured = None;
            let graph = self.capture_steps(batch, lr)?;
            graph.upload()?;
            self.captured = Some(CapturedSteps { batch, lr, graph });
        }
        Ok(&self.captured.as_ref().unwrap().graph)
    }

    /// Enqueues training over the uploaded positions without reading anything back.
    /// A single-sample run leaves the last step's W2 update pending (see settle_w2).
    pub fn enqueue_training(&mut self, samples: usize, batch: usize, lr: f32, use_graph: bool) -> Result<()> {
        self.ensure_capacity(batch)?;
        if !self.sample_path(batch) {
            self.settle_w2()?; // before a graph is captured: a flush must not become part of it
        }
        let steps = samples / batch;
        let mut done = 0;
        if use_graph {
            if self.sample_path(batch) && steps >= GRAPH_STEPS {
                self.launch_hidden(1, 0)?;
            }
            for _ in 0..steps / GRAPH_STEPS {
                self.graph_for(batch, lr)?.launch().context("replaying the training graph")?;
                done += GRAPH_STEPS;
            }
        }
        for _ in done..steps {
            self.launch_step(batch, 0, lr, false)?;
            self.launch_advance(batch)?;
        }
        let rest = samples % batch;
        if rest > 0 {
            self.ensure_capacity(rest)?;
            self.launch_step(rest, 0, lr, false)?;
            self.launch_advance(rest)?;
        }
        Ok(())
    }

    pub fn synchronize(&self) -> Result<()> {
        self.gpu.stream.synchronize().context("a text kernel failed")
    }

    pub fn zero_loss(&mut self) -> Result<()> {
        self.gpu.stream.memcpy_htod(&[0f64], &mut self.loss_sum)?;
        Ok(())
    }

    pub fn read_loss(&self) -> Result<f64> {
        Ok(self.gpu.stream.clone_dtoh(&self.loss_sum).context("a text kernel failed")?[0])
    }

    pub fn download(&self, buffer: &CudaSlice<f32>) -> Result<Vec<f32>> {
        self.gpu.stream.clone_dtoh(buffer).context("copying from the GPU")
    }

    /// Fills every step buffer with NaN, so a value a kernel fails to write cannot pass a check.
    pub fn poison_buffers(&mut self) -> Result<()> {
        let s = self.gpu.stream.clone();
        let b = &mut self.buffers;
        let sb = &mut self.sample_buffers;
        for buf in [
            &mut b.x,
            &mut b.z1,
            &mut b.logits,
            &mut b.stats,
            &mut b.dh,
            &mut b.norm,
            &mut b.grad_w2,
            &mut b.grad_b2,
            &mut sb.partials,
            &mut sb.h_pending,
            &mut sb.dx_shares,
            &mut sb.w2_target,
        ] {
            let nan = vec![f32::NAN; buf.len()];
            s.memcpy_htod(&nan, buf)?;
        }
        Ok(())
    }
}

impl TextTrainer for GpuTrainer {
    fn train(&mut self, positions: &[u32], batch: usize, lr: f32) -> Result<f64> {
        self.set_positions(positions)?;
        self.zero_loss()?;
        self.enqueue_training(positions.len(), batch.max(1), lr, true)?;
        self.read_loss()
    }

    fn evaluate(&mut self, positions: &[u32]) -> Result<EvalSums> {
        self.set_positions(positions)?;
        self.zero_loss()?;
        self.gpu.stream.memcpy_htod(&[0u64, 0], &mut self.hit_counts)?;
        let (v, grid, rows) = (self.shape.vocab as i32, self.layout.grid as i32, self.layout.rows_per_block as i32);
        for chunk in positions.chunks(EVAL_BATCH) {
            let b = chunk.len();
            self.launch_hidden(b, 0)?;
            self.launch_forward(b, false)?;
            let k = self.kernels_for(b)?;
            let (rank_fn, finish_fn) = (k.eval_rank.clone(), k.eval_finish.clone());
            let (g, buf) = (&*self.gpu, &self.buffers);
            let (tokens, positions, cursor) =
                (Arg::buf(g, &self.tokens), Arg::buf(g, &self.positions), Arg::buf(g, &self.cursor));
            let args = [
                Arg::buf(g, &buf.logits),
                tokens,
                positions,
                cursor,
                Arg::u32(0),
                Arg::i32(v),
                Arg::i32(b as i32),
                Arg::i32(rows),
                Arg::buf(g, &buf.rank),
            ];
            g.launch(&rank_fn, (grid as u32, 1), 0, false, &args)?;
            let args = [
                Arg::buf(g, &buf.logits),
                Arg::buf(g, &buf.stats),
                tokens,
                positions,
                cursor,
                Arg::u32(0),
                Arg::i32(v),
                Arg::i32(b as i32),
                Arg::i32(grid),
                Arg::buf(g, &buf.rank),
                Arg::buf(g, &self.loss_sum),
                Arg::buf(g, &self.hit_counts),
            ];
            g.launch(&finish_fn, (1, 1), 0, false, &args)?;
            self.launch_advance(b)?;
        }
        let counts = self.gpu.stream.clone_dtoh(&self.hit_counts).context("a text evaluation kernel failed")?;
        Ok(EvalSums { samples: positions.len() as u64, loss: self.read_loss()?, top1: counts[0], top5: counts[1] })
    }

    fn params(&mut self) -> Result<TextParams> {
        self.settle_w2()?;
        let p = &self.params;
        Ok(TextParams {
            shape: self.shape,
            embedding: self.download(&p.embedding)?,
            w1: self.download(&p.w1)?,
            b1: self.download(&p.b1)?,
            w2: self.download(&p.w2)?,
            b2: self.download(&p.b2)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::kernel_constants;

    #[test]
    fn sizes_match_the_kernel_files() {
        let batch = kernel_constants("text_batch", &[], &["TILE", "SLICE", "B_SLICE", "WARPS"]).unwrap();
        assert_eq!(batch, [TILE, SLICE, B_SLICE, WARPS].map(|v| v as i64));
        let sample = kernel_constants("text_sample", &[], &["HS"]).unwrap();
        assert_eq!(sample, [SAMPLE_UNITS as i64]);
    }
}
