//! The text model on a CUDA GPU: parameters, the token stream and each epoch's sample order stay in
//! device memory; every SGD step is the three kernels of `fused/text.cu`; runs of steps are captured once
//! as a CUDA graph and replayed, so a step costs three graph nodes instead of three launches. The host
//! reads back only the summed loss, once per `train` call.

use super::TextTrainer;
use super::model::{EvalSums, TextParams, TextShape};
use crate::device::Gpu;
use anyhow::{Context, Result, bail};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaFunction, CudaGraph, CudaSlice, LaunchConfig, PushKernelArg};
use std::sync::Arc;

const THREADS: u32 = 256;
const WARPS: usize = 8;
/// Samples per evaluation launch.
const EVAL_BATCH: usize = 256;
/// Steps captured in one CUDA graph.
const GRAPH_STEPS: usize = 128;
/// The kernels keep per-lane register arrays of H/32 and D/32 values.
pub const MAX_HIDDEN: usize = 2048;
pub const MAX_EMBED: usize = 1024;

/// How the kernels split the work, derived from the model shape and the device.
#[derive(Clone, Copy, Debug)]
pub struct TextLayout {
    /// Samples each kernel handles together (TEXT_SB).
    pub chunk: usize,
    /// Vocabulary rows per block of text_forward / text_backward.
    pub rows_per_block: usize,
    /// Blocks of text_forward / text_backward (G).
    pub grid: usize,
    /// Blocks of text_update (one hidden row per warp).
    pub update_grid: usize,
    pub forward_shared: usize,
    pub backward_shared: usize,
    pub update_shared: usize,
}

impl TextLayout {
    pub fn new(shape: TextShape, sm_count: usize, max_shared: usize) -> Result<TextLayout> {
        let TextShape { vocab: v, embed: d, hidden: h, .. } = shape;
        if h > MAX_HIDDEN {
            bail!("--hidden {h} is above the GPU kernels' limit of {MAX_HIDDEN}; lower --hidden or use --device cpu");
        }
        if d > MAX_EMBED {
            bail!("--embed {d} is above the GPU kernels' limit of {MAX_EMBED}; lower --embed or use --device cpu");
        }
        let f = std::mem::size_of::<f32>();
        let chunk = (2048 / h).clamp(1, 8);
        // text_backward's shared memory: hs, dh [chunk][H], dl [chunk][R], gw2 [R][H], gb2 [R].
        let fixed = 2 * chunk * h * f;
        let per_row = (h + 1 + chunk) * f;
        let fit_rows = max_shared.saturating_sub(fixed) / per_row;
        if fit_rows == 0 {
            bail!(
                "--hidden {h} needs more shared memory per block than this GPU has ({} KB); lower --hidden",
                max_shared / 1024
            );
        }
        let rows_per_block = v.div_ceil(sm_count).min(fit_rows).max(1);
        Ok(TextLayout {
            chunk,
            rows_per_block,
            grid: v.div_ceil(rows_per_block),
            update_grid: h.div_ceil(WARPS),
            forward_shared: chunk * (d + h) * f,
            backward_shared: fixed + rows_per_block * per_row,
            update_shared: (2 * chunk * d + chunk * WARPS) * f,
        })
    }
}

fn blocks(count: usize, shared: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (count as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: shared as u32 }
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
    /// [B][G] softmax partials, (max, Σexp) as two floats.
    pub stats: CudaSlice<f32>,
    /// [B][G][H] partial ∂loss/∂h of each block.
    pub dh_partial: CudaSlice<f32>,
    pub rank: CudaSlice<u32>,
    /// [B][D] dx summed over text_update's blocks; zero between steps.
    pub dx_sum: CudaSlice<f32>,
    /// text_update's finished-block counter; zero between steps.
    pub ticket: CudaSlice<u32>,
}

struct Kernels {
    forward: CudaFunction,
    backward: CudaFunction,
    update: CudaFunction,
    advance: CudaFunction,
    eval_rank: CudaFunction,
    eval_finish: CudaFunction,
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
    kernels: Kernels,
    pub params: DeviceParams,
    tokens: CudaSlice<u32>,
    positions: CudaSlice<u32>,
    cursor: CudaSlice<u32>,
    pub buffers: StepBuffers,
    loss_sum: CudaSlice<f64>,
    hit_counts: CudaSlice<u64>,
    captured: Option<CapturedSteps>,
}

impl GpuTrainer {
    pub fn new(gpu: Arc<Gpu>, params: &TextParams, tokens: Arc<[u32]>) -> Result<GpuTrainer> {
        let shape = params.shape;
        let layout = TextLayout::new(shape, gpu.sm_count as usize, gpu.max_shared_optin)?;
        let module = gpu.module(
            "text",
            &[("TEXT_D", shape.embed as i64), ("TEXT_H", shape.hidden as i64), ("TEXT_SB", layout.chunk as i64)],
        )?;
        let load = |name: &str| Gpu::function(&module, name);
        let kernels = Kernels {
            forward: load("text_forward")?,
            backward: load("text_backward")?,
            update: load("text_update")?,
            advance: load("text_advance")?,
            eval_rank: load("text_eval_rank")?,
            eval_finish: load("text_eval_finish")?,
        };
        gpu.reserve_shared(&kernels.forward, layout.forward_shared, "--hidden or --embed")?;
        gpu.reserve_shared(&kernels.backward, layout.backward_shared, "--hidden")?;
        gpu.reserve_shared(&kernels.update, layout.update_shared, "--embed")?;

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
        Ok(GpuTrainer {
            positions: stream.alloc_zeros::<u32>(1)?,
            cursor: stream.alloc_zeros::<u32>(1)?,
            loss_sum: stream.alloc_zeros::<f64>(1)?,
            hit_counts: stream.alloc_zeros::<u64>(2)?,
            gpu,
            shape,
            layout,
            kernels,
            params,
            tokens,
            buffers,
            captured: None,
        })
    }

    fn alloc_buffers(gpu: &Gpu, shape: TextShape, layout: &TextLayout, capacity: usize) -> Result<StepBuffers> {
        let s = &gpu.stream;
        let TextShape { vocab: v, embed: d, hidden: h, .. } = shape;
        let g = layout.grid;
        let alloc = |n: usize| s.alloc_zeros::<f32>(n).context("GPU out of memory for the step buffers");
        Ok(StepBuffers {
            capacity,
            x: alloc(capacity * d)?,
            z1: alloc(capacity * h)?,
            logits: alloc(capacity * v)?,
            stats: alloc(capacity * g * 2)?,
            dh_partial: alloc(capacity * g * h)?,
            rank: s.alloc_zeros::<u32>(capacity)?,
            dx_sum: alloc(capacity * d)?,
            ticket: s.alloc_zeros::<u32>(1)?,
        })
    }

    fn ensure_capacity(&mut self, batch: usize) -> Result<()> {
        if batch > self.buffers.capacity {
            self.captured = None;
            self.buffers = Self::alloc_buffers(&self.gpu, self.shape, &self.layout, batch)?;
        }
        Ok(())
    }

    /// Uploads a sample order and rewinds the device cursor to its start.
    pub fn set_positions(&mut self, positions: &[u32]) -> Result<()> {
        if positions.len() > self.positions.len() {
            self.captured = None;
            self.positions = self.gpu.stream.alloc_zeros::<u32>(positions.len())?;
        }
        let stream = &self.gpu.stream;
        stream.memcpy_htod(positions, &mut self.positions.slice_mut(..positions.len()))?;
        stream.memcpy_htod(&[0u32], &mut self.cursor)?;
        Ok(())
    }

    /// Kernel 1 for `batch` samples starting `offset` past the cursor.
    pub fn launch_forward(&mut self, batch: usize, offset: usize) -> Result<()> {
        let (v, n, rows) = (self.shape.vocab as i32, self.shape.context as i32, self.layout.rows_per_block as i32);
        let (b, off) = (batch as i32, offset as u32);
        let cfg = blocks(self.layout.grid, self.layout.forward_shared);
        let p = &self.params;
        let buf = &mut self.buffers;
        let mut launch = self.gpu.stream.launch_builder(&self.kernels.forward);
        launch.arg(&p.embedding).arg(&p.w1).arg(&p.b1).arg(&p.w2).arg(&p.b2);
        launch.arg(&self.tokens).arg(&self.positions).arg(&self.cursor).arg(&off);
        launch.arg(&v).arg(&n).arg(&b).arg(&rows);
        launch.arg(&mut buf.x).arg(&mut buf.z1).arg(&mut buf.logits).arg(&mut buf.stats);
        unsafe { launch.launch(cfg) }.context("launching text_forward")?;
        Ok(())
    }

    /// Kernel 2: softmax normalisation, W2/b2 update, dh partials, loss.
    pub fn launch_backward(&mut self, batch: usize, offset: usize, lr: f32) -> Result<()> {
        let (v, rows) = (self.shape.vocab as i32, self.layout.rows_per_block as i32);
        let (b, off) = (batch as i32, offset as u32);
        let cfg = blocks(self.layout.grid, self.layout.backward_shared);
        let p = &mut self.params;
        let buf = &mut self.buffers;
        let mut launch = self.gpu.stream.launch_builder(&self.kernels.backward);
        launch.arg(&mut p.w2).arg(&mut p.b2).arg(&buf.logits).arg(&buf.stats).arg(&buf.z1);
        launch.arg(&self.tokens).arg(&self.positions).arg(&self.cursor).arg(&off);
        launch.arg(&v).arg(&b).arg(&rows).arg(&lr);
        launch.arg(&mut buf.dh_partial).arg(&mut self.loss_sum);
        unsafe { launch.launch(cfg) }.context("launching text_backward")?;
        Ok(())
    }

    /// Kernel 3: W1/b1 update and the embedding rows of the context tokens.
    pub fn launch_update(&mut self, batch: usize, offset: usize, lr: f32) -> Result<()> {
        let (n, g) = (self.shape.context as i32, self.layout.grid as i32);
        let (b, off) = (batch as i32, offset as u32);
        let cfg = blocks(self.layout.update_grid, self.layout.update_shared);
        let p = &mut self.params;
        let buf = &mut self.buffers;
        let mut launch = self.gpu.stream.launch_builder(&self.kernels.update);
        launch.arg(&mut p.embedding).arg(&mut p.w1).arg(&mut p.b1);
        launch.arg(&buf.x).arg(&buf.z1).arg(&buf.dh_partial);
        launch.arg(&self.tokens).arg(&self.positions).arg(&self.cursor).arg(&off);
        launch.arg(&n).arg(&b).arg(&g).arg(&lr).arg(&mut buf.dx_sum).arg(&mut buf.ticket);
        unsafe { launch.launch(cfg) }.context("launching text_update")?;
        Ok(())
    }

    pub fn launch_advance(&mut self, samples: usize) -> Result<()> {
        let samples = samples as u32;
        let mut launch = self.gpu.stream.launch_builder(&self.kernels.advance);
        launch.arg(&mut self.cursor).arg(&samples);
        unsafe { launch.launch(LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 }) }
            .context("launching text_advance")?;
        Ok(())
    }

    /// One SGD step: the three kernels.
    pub fn launch_step(&mut self, batch: usize, offset: usize, lr: f32) -> Result<()> {
        self.launch_forward(batch, offset)?;
        self.launch_backward(batch, offset, lr)?;
        self.launch_update(batch, offset, lr)
    }

    /// Captures whatever `enqueue` launches on the trainer's stream as one CUDA graph.
    pub fn capture(&mut self, enqueue: impl FnOnce(&mut Self) -> Result<()>) -> Result<CudaGraph> {
        let stream = self.gpu.stream.clone();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let enqueued = enqueue(self);
        let graph = stream.end_capture(CUgraphInstantiate_flags(0));
        enqueued?;
        let graph = graph.context("capturing kernels as a CUDA graph")?;
        graph.context("CUDA graph capture produced no graph")
    }

    /// GRAPH_STEPS steps of `batch` samples followed by the cursor advance.
    fn capture_steps(&mut self, batch: usize, lr: f32) -> Result<CudaGraph> {
        self.capture(|t| {
            for step in 0..GRAPH_STEPS {
                t.launch_step(batch, step * batch, lr)?;
            }
            t.launch_advance(GRAPH_STEPS * batch)
        })
    }

    /// Registers and local (spill) bytes per thread of each kernel, from the driver.
    pub fn kernel_resources(&self) -> Vec<(&'static str, i32, i32)> {
        let k = &self.kernels;
        [("text_forward", &k.forward), ("text_backward", &k.backward), ("text_update", &k.update)]
            .into_iter()
            .map(|(name, f)| (name, f.num_regs().unwrap_or(-1), f.local_size_bytes().unwrap_or(-1)))
            .collect()
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
    pub fn enqueue_training(&mut self, samples: usize, batch: usize, lr: f32, use_graph: bool) -> Result<()> {
        self.ensure_capacity(batch)?;
        let steps = samples / batch;
        let mut done = 0;
        if use_graph {
            for _ in 0..steps / GRAPH_STEPS {
                self.graph_for(batch, lr)?.launch().context("replaying the training graph")?;
                done += GRAPH_STEPS;
            }
        }
        for _ in done..steps {
            self.launch_step(batch, 0, lr)?;
            self.launch_advance(batch)?;
        }
        let rest = samples % batch;
        if rest > 0 {
            self.launch_step(rest, 0, lr)?;
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
        for buf in [&mut b.x, &mut b.z1, &mut b.logits, &mut b.stats, &mut b.dh_partial] {
            let nan = vec![f32::NAN; buf.len()];
            s.memcpy_htod(&nan, buf)?;
        }
        Ok(())
    }

    pub fn stream_handle(&self) -> &Arc<cudarc::driver::CudaStream> {
        &self.gpu.stream
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
        let (v, g, rows) = (self.shape.vocab as i32, self.layout.grid as i32, self.layout.rows_per_block as i32);
        for chunk in positions.chunks(EVAL_BATCH) {
            let b = chunk.len() as i32;
            let off = 0u32;
            self.launch_forward(chunk.len(), 0)?;
            let buf = &mut self.buffers;
            let mut launch = self.gpu.stream.launch_builder(&self.kernels.eval_rank);
            launch.arg(&buf.logits).arg(&self.tokens).arg(&self.positions).arg(&self.cursor).arg(&off);
            launch.arg(&v).arg(&b).arg(&rows).arg(&mut buf.rank);
            unsafe { launch.launch(blocks(self.layout.grid, 0)) }.context("launching text_eval_rank")?;
            let mut launch = self.gpu.stream.launch_builder(&self.kernels.eval_finish);
            launch.arg(&buf.logits).arg(&buf.stats).arg(&self.tokens).arg(&self.positions).arg(&self.cursor);
            launch.arg(&off).arg(&v).arg(&b).arg(&g).arg(&mut buf.rank).arg(&mut self.loss_sum);
            launch.arg(&mut self.hit_counts);
            unsafe { launch.launch(blocks(1, 0)) }.context("launching text_eval_finish")?;
            self.launch_advance(chunk.len())?;
        }
        let counts = self.gpu.stream.clone_dtoh(&self.hit_counts).context("a text evaluation kernel failed")?;
        Ok(EvalSums { samples: positions.len() as u64, loss: self.read_loss()?, top1: counts[0], top5: counts[1] })
    }

    fn params(&mut self) -> Result<TextParams> {
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
