//! The text model on a CUDA GPU: parameters, the token stream and each epoch's sample order stay in
//! device memory; every SGD step is three kernels: those of `fused/text_sample.cu` for one sample (where
//! the shape allows), those of `fused/text.cu` for a few samples and those of `fused/text_batch.cu`
//! (tiled matrix products) from TILED_MIN_BATCH samples on; runs of steps are captured once as a CUDA
//! graph and replayed, so a step costs three graph nodes instead of three launches. The host reads back
//! only the summed loss, once per `train` call. A learning-rate schedule's steps, each at a rate of its
//! own, are launched one by one instead (`enqueue_scheduled` says why).
//!
//! This file holds the trainer, its buffers and the step dispatch; `layout` how the kernels split the
//! work, and `sample`, `chunked` and `tiled` the launches of the three paths.

use super::TextTrainer;
use super::model::{EvalSums, TextParams, TextShape};
use crate::device::{Gpu, launch::Arg, launch::Kernel, launch::StructArg};
use anyhow::{Context, Result};
use cudarc::driver::{CudaGraph, CudaSlice};
use std::collections::HashMap;
use std::sync::Arc;

mod buffers;
mod chunked;
mod layout;
mod sample;
mod tiled;

use layout::{EVAL_BATCH, GRAPH_STEPS, TILE};
pub use layout::{MAX_EMBED, MAX_HIDDEN, TILED_MIN_BATCH, TextLayout, max_chunk, modules};
use sample::{SampleBuffers, SampleKernels};
use tiled::{Bf16State, OptimizerState, TiledKernels};

/// Device copies of the five parameter tensors.
pub struct DeviceParams {
    /// Embedding E, `[V][D]` row-major.
    pub embedding: CudaSlice<f32>,
    /// Hidden weights W1, `[H][D]` row-major.
    pub w1: CudaSlice<f32>,
    /// Hidden biases b1, `[H]`.
    pub b1: CudaSlice<f32>,
    /// Output weights W2, `[V][H]` row-major.
    pub w2: CudaSlice<f32>,
    /// Output biases b2, `[V]`.
    pub b2: CudaSlice<f32>,
}

/// Per-step intermediates, sized for `capacity` samples.
pub struct StepBuffers {
    /// Samples the buffers hold.
    pub capacity: usize,
    /// `[B][D]` mean context embedding x of each sample.
    pub x: CudaSlice<f32>,
    /// `[B][H]` hidden pre-activations z1.
    pub z1: CudaSlice<f32>,
    /// `[B][V]` logits.
    pub logits: CudaSlice<f32>,
    /// `[B][G]` softmax partials, (max, Σexp) as two floats.
    pub stats: CudaSlice<f32>,
    /// `[B][H]` ∂loss/∂h, summed with atomics by text_backward's blocks (text_forward zeroes it), and the
    /// tiled path's ∂H.
    pub dh: CudaSlice<f32>,
    /// `[B]` evaluation: how many logits beat the target's (its rank).
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
    /// Tiled path: b2's gradient, `[V]`.
    pub grad_b2: CudaSlice<f32>,
    /// Tiled path: W1's gradient, `[H][D]`.
    pub grad_w1: CudaSlice<f32>,
    /// Tiled path: b1's gradient, `[H]`.
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

struct CapturedSteps {
    batch: usize,
    lr: f32,
    graph: CudaGraph,
}

/// The text model's trainer on a CUDA GPU: parameters, corpus and sample positions in device memory.
pub struct GpuTrainer {
    gpu: Arc<Gpu>,
    shape: TextShape,
    /// How the kernels split the work for this shape and GPU.
    pub layout: TextLayout,
    /// Kernels compiled for each chunk size in use (TEXT_SB).
    kernels: HashMap<usize, Kernels>,
    /// fused/text_batch.cu, compiled on the first large batch.
    tiled: Option<TiledKernels>,
    /// fused/text_sample.cu, compiled on the first single-sample step.
    sample: Option<SampleKernels>,
    /// Buffers of the single-sample path (fused/text_sample.cu).
    pub sample_buffers: SampleBuffers,
    /// A single-sample step's W2/b2 update is still pending on the stream (see SampleBuffers).
    w2_pending: bool,
    /// The parameters.
    pub params: DeviceParams,
    tokens: CudaSlice<u32>,
    /// Sample positions; every entry, also past the uploaded ones, is a valid position (text_update reads
    /// the next step's samples when it forms their hidden layer).
    positions: CudaSlice<u32>,
    cursor: CudaSlice<u32>,
    /// Per-step intermediates.
    pub buffers: StepBuffers,
    loss_sum: CudaSlice<f64>,
    hit_counts: CudaSlice<u64>,
    captured: Option<CapturedSteps>,
    /// Set for --optim momentum or adam: every step then takes the tiled path and this update.
    optimizer: Option<OptimizerState>,
    /// Set for --precision bf16: every step then takes the tiled path's bf16 products.
    bf16: Option<Bf16State>,
    /// Every buffer above as the kernels take them (`TextBuffers`), rebuilt whenever one is allocated.
    buffer_table: StructArg,
}

impl GpuTrainer {
    /// Uploads `params` and the corpus `tokens` to `gpu` and loads the kernels; errors when the kernels cannot take the
    /// shape.
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
        let mut trainer = GpuTrainer {
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
            bf16: None,
            buffer_table: StructArg::new(&[]),
        };
        trainer.refresh_buffers();
        Ok(trainer)
    }

    /// The kernels for steps of `batch` samples, compiled on first use.
    fn kernels_for(&mut self, batch: usize) -> Result<&Kernels> {
        let chunk = self.layout.chunk(batch);
        if !self.kernels.contains_key(&chunk) {
            let s = self.shape;
            let module = self.gpu.module(&layout::module_request("text", s, Some(chunk)))?;
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
            self.refresh_buffers();
        }
        self.ensure_bf16_capacity(self.buffers.capacity)
    }

    /// Uploads a sample order and rewinds the device cursor to its start.
    pub fn set_positions(&mut self, positions: &[u32]) -> Result<()> {
        if positions.len() > self.positions.len() {
            self.captured = None;
            self.positions = self.gpu.stream.clone_htod(&vec![self.shape.context as u32; positions.len()])?;
            self.refresh_buffers();
        }
        let stream = &self.gpu.stream;
        stream.memcpy_htod(positions, &mut self.positions.slice_mut(..positions.len()))?;
        stream.memcpy_htod(&[0u32], &mut self.cursor)?;
        Ok(())
    }

    /// One SGD step: the three kernels, each overlapping the tail of the one before it (large batches: the
    /// three tiled kernels).
    /// `after_step`: the previous kernels on the stream are a step of the same size, whose text_update
    /// formed this step's hidden layer; otherwise text_hidden forms it first.
    pub fn launch_step(&mut self, batch: usize, offset: usize, lr: f32, after_step: bool) -> Result<()> {
        if self.layout.tiled(batch) || self.optimizer.is_some() || self.bf16.is_some() {
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

    /// Captures whatever `enqueue` launches on the trainer's stream as one CUDA graph.
    pub fn capture(&mut self, enqueue: impl FnOnce(&mut Self) -> Result<()>) -> Result<CudaGraph> {
        let stream = self.gpu.stream.clone();
        crate::device::launch::capture_graph(&stream, self, enqueue)
    }

    /// One step of `batch` samples per entry of `rates`, step k at `rates[k]`, followed by the cursor
    /// advance: what a training graph holds. Single samples: each step's sample_update forms the next
    /// sample's hidden layer, also across the cursor advance, so the first step starts from the z1 that
    /// the steps before (or text_hidden) left; larger batches form it with text_hidden first.
    fn enqueue_steps(&mut self, batch: usize, rates: &[f32]) -> Result<()> {
        let sample = self.sample_path(batch);
        for (step, &lr) in rates.iter().enumerate() {
            if sample {
                self.launch_sample_step(step, lr, step > 0)?;
            } else {
                self.launch_step(batch, step * batch, lr, step > 0)?;
            }
        }
        self.launch_advance(rates.len() * batch)
    }

    /// GRAPH_STEPS steps of `batch` samples at `lr`, followed by the cursor advance; a replay starts from
    /// the z1 the previous one (or, before the first, text_hidden) left.
    fn capture_steps(&mut self, batch: usize, lr: f32) -> Result<CudaGraph> {
        self.capture(|t| t.enqueue_steps(batch, &[lr; GRAPH_STEPS]))
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

    /// Enqueues training over the uploaded positions, step k at `rates[k]` (one rate per step; the last
    /// step may be shorter), every step launched rather than replayed from a graph, without reading
    /// anything back.
    ///
    /// Why not a graph: the kernels take the learning rate as an argument, which a captured graph bakes
    /// in, so a graph replays steps at one rate. A call at one rate (the constant schedule, the default)
    /// takes `enqueue_training`: exactly the kernels, arguments and graphs it always ran. Reading the rate
    /// from device memory instead would change those kernels and put a load into the single-sample step,
    /// which is bound by latency (~10 µs a step), for every run. A schedule's steps are launched one by
    /// one, the kernels and their order as in a graph (`enqueue_steps`), so only scheduled runs pay: host
    /// launch time, measured by `bench text` ("a rate per step").
    pub fn enqueue_scheduled(&mut self, samples: usize, batch: usize, rates: &[f32]) -> Result<()> {
        super::check_rates(samples, batch, rates)?;
        let batch = batch.max(1);
        let steps = samples / batch;
        self.ensure_capacity(batch)?;
        if !self.sample_path(batch) {
            self.settle_w2()?;
        } else if steps > 0 {
            self.launch_hidden(1, 0)?;
        }
        for group in rates[..steps].chunks(GRAPH_STEPS) {
            self.enqueue_steps(batch, group)?;
        }
        let rest = samples % batch;
        if rest > 0 {
            self.ensure_capacity(rest)?;
            self.launch_step(rest, 0, rates[steps], false)?;
            self.launch_advance(rest)?;
        }
        Ok(())
    }

    /// Waits for the queued kernels; an error names a failed text kernel.
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.stream.synchronize().context("a text kernel failed")
    }

    /// Zeroes the summed training loss.
    pub fn zero_loss(&mut self) -> Result<()> {
        self.gpu.stream.memcpy_htod(&[0f64], &mut self.loss_sum)?;
        Ok(())
    }

    /// The summed training loss since `zero_loss`.
    pub fn read_loss(&self) -> Result<f64> {
        Ok(self.gpu.stream.clone_dtoh(&self.loss_sum).context("a text kernel failed")?[0])
    }

    /// Copies a device buffer to the host.
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
        if let Some(bf) = &mut self.bf16 {
            bf.poison(&s)?;
        }
        Ok(())
    }
}

impl TextTrainer for GpuTrainer {
    fn train_steps(&mut self, positions: &[u32], batch: usize, rates: &[f32]) -> Result<f64> {
        super::check_rates(positions.len(), batch, rates)?;
        let batch = batch.max(1);
        self.set_positions(positions)?;
        self.zero_loss()?;
        match rates.split_first() {
            // Every step at one rate: the graphs (see enqueue_scheduled).
            Some((&lr, rest)) if rest.iter().all(|&r| r == lr) => {
                self.enqueue_training(positions.len(), batch, lr, true)?
            }
            _ => self.enqueue_scheduled(positions.len(), batch, rates)?,
        }
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
            let (g, table) = (&*self.gpu, &self.buffer_table);
            let args = [Arg::u32(0), Arg::i32(v), Arg::i32(b as i32), Arg::i32(rows)];
            g.launch_with_struct(&rank_fn, ((grid as u32, 1), 0, false), table, &args)?;
            let args = [Arg::u32(0), Arg::i32(v), Arg::i32(b as i32), Arg::i32(grid)];
            g.launch_with_struct(&finish_fn, ((1, 1), 0, false), table, &args)?;
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
