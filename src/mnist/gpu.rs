//! The MNIST classifier on a CUDA GPU. Both splits, the parameters, the gradient and the optimizer state
//! (with its step count) live in device memory; every optimizer step is the three kernels of
//! `fused/mnist.cu`. An epoch's steps are captured once as a CUDA graph and replayed every epoch after
//! that epoch's sample order is uploaded, so an epoch costs one graph launch. The host reads back the
//! summed training loss once per epoch, and the test loss and predicted classes once per evaluation.

use super::idx::Split;
use super::model::{MlpParams, MlpShape};
use super::{Evaluation, MnistTrainer};
use crate::device::{Arg, Gpu, Kernel, ModuleRequest, THREADS_PER_BLOCK};
use crate::ops::optim::OptimConfig;
use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaGraph, CudaSlice};
use std::sync::Arc;

const THREADS: usize = THREADS_PER_BLOCK as usize;
/// mnist_forward's block tile, samples × hidden units, and its register tile (FWD_BM, FWD_BN, FWD_TM,
/// FWD_TN in fused/mnist.cu).
const FORWARD_TILE: (usize, usize) = (8, 8);
const FORWARD_REGISTER_TILE: (usize, usize) = (2, 2);
/// mnist_backward's block tile, rows × columns × samples per stage, and its register tile (BWD_*).
const BACKWARD_TILE: (usize, usize, usize) = (16, 64, 64);
const BACKWARD_REGISTER_TILE: (usize, usize) = (4, 4);
/// Test samples per mnist_evaluate launch: the whole (Fashion-)MNIST test split in one.
pub(crate) const EVAL_CHUNK: usize = 10_000;

/// Grids and shared memory of the three kernels for one model shape.
#[derive(Clone, Copy, Debug)]
pub struct MnistLayout {
    /// The model's sizes.
    pub shape: MlpShape,
    /// Dynamic shared memory of mnist_forward / mnist_evaluate: the tile's gemm stages, then the output
    /// layer's activations, W2 and dlogits.
    pub forward_shared: usize,
    /// Dynamic shared memory of mnist_backward, in bytes.
    pub backward_shared: usize,
    /// Blocks of mnist_backward: [∂W1 | ∂b1] tiles, then [∂W2 | ∂b2] tiles. Also the number of Σg² partials.
    pub backward_grid: usize,
    /// Blocks of the update kernel.
    pub update_grid: usize,
}

impl MnistLayout {
    /// The layout for `shape` on a GPU of `sm_count` multiprocessors.
    pub fn new(shape: MlpShape, sm_count: usize) -> MnistLayout {
        let MlpShape { inputs: i, hidden: h, classes: c, .. } = shape;
        let f = std::mem::size_of::<f32>();
        let (fm, fn_) = FORWARD_TILE;
        let gemm = crate::ops::gemm::tile_shared_floats(fm, fn_, i, FORWARD_REGISTER_TILE.0, FORWARD_REGISTER_TILE.1);
        let output_layer = (fm + c) * h + fm * c;
        let (bm, bn, bk) = BACKWARD_TILE;
        let tiles = |rows: usize, cols: usize| rows.div_ceil(bm) * cols.div_ceil(bn);
        MnistLayout {
            shape,
            forward_shared: gemm.max(output_layer) * f,
            backward_shared: crate::ops::gemm::tile_shared_floats(
                bm,
                bn,
                bk,
                BACKWARD_REGISTER_TILE.0,
                BACKWARD_REGISTER_TILE.1,
            ) * f,
            backward_grid: tiles(h, i + 1) + tiles(c, h + 1),
            update_grid: shape.param_count().div_ceil(THREADS).min(4 * sm_count).max(1),
        }
    }

    /// mnist_forward's grid for `batch` samples: (hidden tiles, sample tiles).
    pub fn forward_grid(&self, batch: usize) -> (u32, u32) {
        (self.shape.hidden.div_ceil(FORWARD_TILE.1) as u32, batch.div_ceil(FORWARD_TILE.0) as u32)
    }

    /// Rough traffic of one training step in bytes: the batch's images (read by kernels 1 and 2), the
    /// weights (kernel 1), a and dz1 written and read, the gradient written, and the optimizer's pass
    /// (parameters, gradient, and for Adam two moments read; parameters and moments written).
    pub fn bytes_per_step(&self, batch: usize) -> f64 {
        let MlpShape { inputs: i, hidden: h, .. } = self.shape;
        let p = self.shape.param_count();
        4.0 * (2 * batch * i + p + 4 * batch * h + p + 7 * p) as f64
    }

    /// FLOPs of one training step: the two big products (forward and ∂W1), the output layer both ways,
    /// and about a dozen per parameter in the update.
    pub fn flops_per_step(&self, batch: usize) -> f64 {
        let MlpShape { inputs: i, hidden: h, classes: c, .. } = self.shape;
        let b = batch as f64;
        let (i, h, c) = (i as f64, h as f64, c as f64);
        2.0 * b * h * i
            + 2.0 * b * h * (i + 1.0)
            + 3.0 * 2.0 * b * c * (h + 1.0)
            + 12.0 * self.shape.param_count() as f64
    }
}

struct DeviceSplit {
    images: CudaSlice<f32>,
    labels: CudaSlice<u8>,
    len: usize,
}

/// Per-step intermediates, sized for `capacity` samples.
pub struct StepBuffers {
    /// Samples the buffers hold.
    pub capacity: usize,
    /// `[B][H]` activations a.
    pub act: CudaSlice<f32>,
    /// `[B][C]` (p − onehot)/B.
    pub dlogits: CudaSlice<f32>,
    /// `[B][H]` ∂loss/∂z1.
    pub dz1: CudaSlice<f32>,
    /// mnist_forward's finished-block counter per sample tile; zero between launches.
    pub tickets: CudaSlice<u32>,
}

struct Kernels {
    forward: Kernel,
    evaluate: Kernel,
    backward: Kernel,
    update: Kernel,
    advance: Kernel,
}

struct CapturedEpoch {
    samples: usize,
    batch: usize,
    graph: CudaGraph,
}

/// The MLP trainer on a CUDA GPU: both splits, the parameters and the optimizer state in device memory.
pub struct GpuTrainer {
    gpu: Arc<Gpu>,
    /// The model's sizes.
    pub shape: MlpShape,
    /// The optimizer and its hyper-parameters.
    pub optim: OptimConfig,
    /// Grids and shared memory of the kernels.
    pub layout: MnistLayout,
    kernels: Kernels,
    /// Flat parameters, gradient, and optimizer state (momentum velocity or Adam's moments), all in the
    /// layout of `MlpParams::flat`.
    pub params: CudaSlice<f32>,
    /// Gradient of the mean batch loss.
    pub grad: CudaSlice<f32>,
    /// Momentum's velocity or Adam's first moment.
    pub m: CudaSlice<f32>,
    /// Adam's second moment.
    pub v: CudaSlice<f32>,
    /// Optimizer steps taken.
    pub step: CudaSlice<u32>,
    /// `[backward_grid]` Σg² of each mnist_backward block (written when clipping).
    pub norm_partials: CudaSlice<f32>,
    update_ticket: CudaSlice<u32>,
    train: DeviceSplit,
    test: DeviceSplit,
    test_labels: Vec<u8>,
    order: CudaSlice<u32>,
    cursor: CudaSlice<u32>,
    /// Per-step intermediates.
    pub buffers: StepBuffers,
    loss_sum: CudaSlice<f64>,
    /// [test samples] predicted class of each.
    predicted: CudaSlice<u8>,
    captured: Option<CapturedEpoch>,
}

/// The kernel module a trainer of `shape` compiles.
pub fn module_request(shape: MlpShape) -> ModuleRequest {
    ("mnist", vec![("MNIST_I", shape.inputs as i64), ("MNIST_C", shape.classes as i64)])
}

impl GpuTrainer {
    /// Uploads the splits and the parameters to `gpu` and loads the kernels for `params.shape`.
    pub fn new(
        gpu: Arc<Gpu>,
        params: MlpParams,
        optim: OptimConfig,
        train: &Split,
        test: &Split,
    ) -> Result<GpuTrainer> {
        let shape = params.shape;
        for split in [train, test] {
            if split.pixels != shape.inputs {
                bail!("the images have {} pixels but the model takes {} inputs", split.pixels, shape.inputs);
            }
        }
        let layout = MnistLayout::new(shape, gpu.sm_count as usize);
        let module = gpu.module(&module_request(shape))?;
        let load = |name: &str| Gpu::function(&module, name);
        let kernels = Kernels {
            forward: load("mnist_forward")?,
            evaluate: load("mnist_evaluate")?,
            backward: load("mnist_backward")?,
            update: load("mnist_update")?,
            advance: load("mnist_advance")?,
        };
        gpu.reserve_shared(&kernels.forward, layout.forward_shared, "--hidden")?;
        gpu.reserve_shared(&kernels.evaluate, layout.forward_shared, "--hidden")?;
        gpu.reserve_shared(&kernels.backward, layout.backward_shared, "--hidden")?;

        let stream = gpu.stream.clone();
        let upload_split = |split: &Split, what: &str| -> Result<DeviceSplit> {
            Ok(DeviceSplit {
                images: stream
                    .clone_htod(&split.images)
                    .with_context(|| format!("copying the {what} images to the GPU"))?,
                labels: stream
                    .clone_htod(&split.labels)
                    .with_context(|| format!("copying the {what} labels to the GPU"))?,
                len: split.len(),
            })
        };
        let train_split = upload_split(train, "training")?;
        let test_split = upload_split(test, "test")?;
        let n = shape.param_count();
        let zeros = |len: usize| stream.alloc_zeros::<f32>(len.max(1)).context("GPU out of memory for the model");
        let buffers = Self::alloc_buffers(&gpu, shape, test.len().clamp(1, EVAL_CHUNK))?;
        Ok(GpuTrainer {
            params: stream.clone_htod(&params.flat).context("copying the model to the GPU")?,
            grad: zeros(n)?,
            m: zeros(n)?,
            v: zeros(n)?,
            step: stream.alloc_zeros::<u32>(1)?,
            norm_partials: zeros(layout.backward_grid)?,
            update_ticket: stream.alloc_zeros::<u32>(1)?,
            order: stream.alloc_zeros::<u32>(train.len().max(1))?,
            cursor: stream.alloc_zeros::<u32>(1)?,
            loss_sum: stream.alloc_zeros::<f64>(1)?,
            predicted: stream.alloc_zeros::<u8>(test.len().max(1))?,
            test_labels: test.labels.clone(),
            train: train_split,
            test: test_split,
            buffers,
            gpu,
            shape,
            optim,
            layout,
            kernels,
            captured: None,
        })
    }

    fn alloc_buffers(gpu: &Gpu, shape: MlpShape, capacity: usize) -> Result<StepBuffers> {
        let s = &gpu.stream;
        let alloc = |n: usize| s.alloc_zeros::<f32>(n).context("GPU out of memory for the step buffers");
        Ok(StepBuffers {
            capacity,
            act: alloc(capacity * shape.hidden)?,
            dlogits: alloc(capacity * shape.classes)?,
            dz1: alloc(capacity * shape.hidden)?,
            tickets: s.alloc_zeros::<u32>(capacity.div_ceil(FORWARD_TILE.0))?,
        })
    }

    /// Makes the step buffers hold `batch` samples (dropping a captured graph that used the old ones).
    pub fn ensure_capacity(&mut self, batch: usize) -> Result<()> {
        if batch.div_ceil(FORWARD_TILE.0) > 65_535 {
            bail!("--batch {batch} is above the GPU kernels' limit of {}", 65_535 * FORWARD_TILE.0);
        }
        if batch > self.buffers.capacity {
            self.captured = None;
            self.buffers = Self::alloc_buffers(&self.gpu, self.shape, batch)?;
        }
        Ok(())
    }

    /// Uploads a sample order (indices into the training split) and rewinds the device cursor.
    pub fn set_order(&mut self, order: &[u32]) -> Result<()> {
        if order.len() > self.order.len() {
            self.captured = None;
            self.order = self.gpu.stream.alloc_zeros::<u32>(order.len())?;
        }
        self.gpu.stream.memcpy_htod(order, &mut self.order.slice_mut(..order.len()))?;
        self.set_cursor(0)
    }

    /// Sets the device cursor: the position in the uploaded order where the next step starts.
    pub fn set_cursor(&mut self, cursor: usize) -> Result<()> {
        self.gpu.stream.memcpy_htod(&[cursor as u32], &mut self.cursor)?;
        Ok(())
    }

    /// New parameters, zeroed optimizer state and step count (a captured graph stays valid).
    pub fn reset(&mut self, params: &MlpParams) -> Result<()> {
        let s = self.gpu.stream.clone();
        s.memcpy_htod(&params.flat, &mut self.params)?;
        s.memset_zeros(&mut self.m)?;
        s.memset_zeros(&mut self.v)?;
        s.memset_zeros(&mut self.step)?;
        Ok(())
    }

    /// Kernel 1 for `batch` samples starting `offset` past the cursor.
    pub fn launch_forward(&mut self, batch: usize, offset: usize) -> Result<()> {
        let g = &*self.gpu;
        let buf = &self.buffers;
        let args = [
            Arg::buf(g, &self.train.images),
            Arg::buf(g, &self.train.labels),
            Arg::buf(g, &self.order),
            Arg::buf(g, &self.cursor),
            Arg::u32(offset as u32),
            Arg::i32(batch as i32),
            Arg::i32(self.shape.hidden as i32),
            Arg::i32(self.shape.activation.kernel_code()),
            Arg::buf(g, &self.params),
            Arg::buf(g, &buf.act),
            Arg::buf(g, &buf.dlogits),
            Arg::buf(g, &buf.dz1),
            Arg::buf(g, &self.loss_sum),
            Arg::buf(g, &buf.tickets),
        ];
        let grid = self.layout.forward_grid(batch);
        g.launch(&self.kernels.forward, grid, self.layout.forward_shared as u32, false, &args)
    }

    /// Kernel 2: the gradient (and its Σg² partials when clipping).
    pub fn launch_backward(&mut self, batch: usize, offset: usize) -> Result<()> {
        let g = &*self.gpu;
        let buf = &self.buffers;
        let args = [
            Arg::buf(g, &self.train.images),
            Arg::buf(g, &self.order),
            Arg::buf(g, &self.cursor),
            Arg::u32(offset as u32),
            Arg::i32(batch as i32),
            Arg::i32(self.shape.hidden as i32),
            Arg::buf(g, &buf.act),
            Arg::buf(g, &buf.dlogits),
            Arg::buf(g, &buf.dz1),
            Arg::buf(g, &self.grad),
            Arg::i32((self.optim.clip_norm > 0.0) as i32),
            Arg::buf(g, &self.norm_partials),
        ];
        let grid = (self.layout.backward_grid as u32, 1);
        g.launch(&self.kernels.backward, grid, self.layout.backward_shared as u32, false, &args)
    }

    /// Kernel 3: one optimizer step over every parameter.
    pub fn launch_update(&mut self) -> Result<()> {
        let g = &*self.gpu;
        let o = self.optim;
        let args = [
            &[
                Arg::buf(g, &self.params),
                Arg::buf(g, &self.grad),
                Arg::buf(g, &self.m),
                Arg::buf(g, &self.v),
                Arg::i32(self.shape.param_count() as i32),
            ][..],
            &o.kernel_args(),
            &[
                Arg::buf(g, &self.norm_partials),
                Arg::i32(self.layout.backward_grid as i32),
                Arg::buf(g, &self.step),
                Arg::buf(g, &self.update_ticket),
            ],
        ]
        .concat();
        g.launch(&self.kernels.update, (self.layout.update_grid as u32, 1), 0, false, &args)
    }

    /// Moves the device cursor `samples` samples on.
    pub fn launch_advance(&mut self, samples: usize) -> Result<()> {
        let args = [Arg::buf(&self.gpu, &self.cursor), Arg::u32(samples as u32)];
        self.gpu.launch_sized(&self.kernels.advance, (1, 1), 1, 0, false, &args)
    }

    /// One optimizer step: the three kernels.
    pub fn launch_step(&mut self, batch: usize, offset: usize) -> Result<()> {
        self.launch_forward(batch, offset)?;
        self.launch_backward(batch, offset)?;
        self.launch_update()
    }

    /// Evaluation over test samples first .. first + batch: predicted classes and the summed loss.
    pub fn launch_evaluate(&mut self, first: usize, batch: usize) -> Result<()> {
        let g = &*self.gpu;
        let buf = &self.buffers;
        let args = [
            Arg::buf(g, &self.test.images),
            Arg::buf(g, &self.test.labels),
            Arg::u32(first as u32),
            Arg::i32(batch as i32),
            Arg::i32(self.shape.hidden as i32),
            Arg::i32(self.shape.activation.kernel_code()),
            Arg::buf(g, &self.params),
            Arg::buf(g, &buf.act),
            Arg::buf(g, &self.predicted),
            Arg::buf(g, &self.loss_sum),
            Arg::buf(g, &buf.tickets),
        ];
        let grid = self.layout.forward_grid(batch);
        g.launch(&self.kernels.evaluate, grid, self.layout.forward_shared as u32, false, &args)
    }

    /// Captures whatever `enqueue` launches on the trainer's stream as one CUDA graph.
    pub fn capture(&mut self, enqueue: impl FnOnce(&mut Self) -> Result<()>) -> Result<CudaGraph> {
        let stream = self.gpu.stream.clone();
        crate::device::capture_graph(&stream, self, enqueue)
    }

    /// Steps over `samples` samples, `batch` at a time (the last step takes the rest), then the cursor
    /// advance.
    fn enqueue_steps(&mut self, samples: usize, batch: usize) -> Result<()> {
        let mut offset = 0;
        while offset < samples {
            let b = batch.min(samples - offset);
            self.launch_step(b, offset)?;
            offset += b;
        }
        self.launch_advance(samples)
    }

    /// Graph nodes of an epoch: three kernels per step and the cursor advance.
    pub fn graph_nodes(samples: usize, batch: usize) -> usize {
        3 * samples.div_ceil(batch) + 1
    }

    /// Captures (once per epoch size and batch) and uploads the epoch's graph.
    pub fn prepare_epoch(&mut self, samples: usize, batch: usize) -> Result<()> {
        self.ensure_capacity(batch.min(samples))?;
        let reuse = matches!(&self.captured, Some(c) if c.samples == samples && c.batch == batch);
        if !reuse {
            self.captured = None;
            let graph = self.capture(|t| t.enqueue_steps(samples, batch))?;
            graph.upload()?;
            self.captured = Some(CapturedEpoch { samples, batch, graph });
        }
        Ok(())
    }

    /// Enqueues one epoch over the uploaded order as one graph launch, without reading anything back.
    pub fn enqueue_epoch(&mut self, samples: usize, batch: usize) -> Result<()> {
        self.prepare_epoch(samples, batch)?;
        self.captured.as_ref().unwrap().graph.launch().context("replaying the epoch's graph")?;
        Ok(())
    }

    /// Registers and local (spill) bytes per thread of each kernel, from the driver.
    pub fn kernel_resources(&self) -> Vec<(&'static str, i32, i32)> {
        let k = &self.kernels;
        [("mnist_forward", &k.forward), ("mnist_backward", &k.backward), ("mnist_update", &k.update)]
            .into_iter()
            .map(|(name, f)| (name, f.num_regs().unwrap_or(-1), f.local_size_bytes().unwrap_or(-1)))
            .collect()
    }

    /// Waits for the queued kernels; an error names a failed MNIST kernel.
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.stream.synchronize().context("an MNIST kernel failed")
    }

    /// Zeroes the summed training loss.
    pub fn zero_loss(&mut self) -> Result<()> {
        self.gpu.stream.memcpy_htod(&[0f64], &mut self.loss_sum)?;
        Ok(())
    }

    /// The summed training loss since `zero_loss`.
    pub fn read_loss(&self) -> Result<f64> {
        Ok(self.gpu.stream.clone_dtoh(&self.loss_sum).context("an MNIST kernel failed")?[0])
    }

    /// Copies a device buffer to the host.
    pub fn download<T: cudarc::driver::DeviceRepr>(&self, buffer: &CudaSlice<T>) -> Result<Vec<T>> {
        self.gpu.stream.clone_dtoh(buffer).context("copying from the GPU")
    }

    /// Fills every kernel output with NaN (predicted classes with 255), so a value a kernel fails to
    /// write cannot pass a check.
    pub fn poison_outputs(&mut self) -> Result<()> {
        let s = self.gpu.stream.clone();
        let b = &mut self.buffers;
        for buf in [&mut b.act, &mut b.dlogits, &mut b.dz1, &mut self.grad, &mut self.norm_partials] {
            s.memcpy_htod(&vec![f32::NAN; buf.len()], buf)?;
        }
        s.memcpy_htod(&vec![255u8; self.predicted.len()], &mut self.predicted)?;
        Ok(())
    }

    /// Loss summed over the test split and each test sample's predicted class.
    pub fn evaluate_raw(&mut self) -> Result<(f64, Vec<u8>)> {
        self.zero_loss()?;
        let n = self.test.len;
        let mut first = 0;
        while first < n {
            let b = EVAL_CHUNK.min(n - first);
            self.ensure_capacity(b)?;
            self.launch_evaluate(first, b)?;
            first += b;
        }
        let predicted = self.download(&self.predicted).context("an MNIST evaluation kernel failed")?;
        Ok((self.read_loss()?, predicted))
    }
}

impl MnistTrainer for GpuTrainer {
    fn train_epoch(&mut self, order: &[u32], batch: usize, progress: &mut dyn FnMut(usize)) -> Result<f64> {
        if batch == 0 {
            bail!("the batch size must be at least 1");
        }
        if let Some(&bad) = order.iter().find(|&&i| i as usize >= self.train.len) {
            bail!("sample index {bad} is outside the training split ({} samples)", self.train.len);
        }
        if order.is_empty() {
            return Ok(0.0);
        }
        self.set_order(order)?;
        self.zero_loss()?;
        self.enqueue_epoch(order.len(), batch)?;
        let loss = self.read_loss()?;
        progress(order.len());
        Ok(loss)
    }

    fn evaluate(&mut self) -> Result<Evaluation> {
        let (loss, predicted) = self.evaluate_raw()?;
        let mut eval = Evaluation::new(self.shape.classes);
        for (&truth, &guess) in self.test_labels.iter().zip(&predicted) {
            eval.record(truth as usize, guess as usize);
        }
        eval.loss = loss;
        Ok(eval)
    }

    fn params(&mut self) -> Result<super::Classifier> {
        Ok(super::Classifier::Mlp(MlpParams { shape: self.shape, flat: self.download(&self.params)? }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::kernel_constants;

    #[test]
    fn sizes_match_the_kernel_file() {
        let tiles = ["FWD_BM", "FWD_BN", "FWD_TM", "FWD_TN", "BWD_BM", "BWD_BN", "BWD_BK", "BWD_TM", "BWD_TN"];
        let kernel = kernel_constants("mnist", &[], &tiles).unwrap();
        let ((fm, fn_), (ftm, ftn)) = (FORWARD_TILE, FORWARD_REGISTER_TILE);
        let ((bm, bn, bk), (btm, btn)) = (BACKWARD_TILE, BACKWARD_REGISTER_TILE);
        assert_eq!(kernel, [fm, fn_, ftm, ftn, bm, bn, bk, btm, btn].map(|v| v as i64));
        for (inputs, classes) in [(784, 10), (50, 7)] {
            let defines = [("MNIST_I", inputs), ("MNIST_C", classes)];
            let kernel = kernel_constants("mnist", &defines, &["ForwardTile::SHARED_FLOATS"]).unwrap();
            let shape = MlpShape {
                inputs: inputs as usize,
                hidden: 1,
                classes: classes as usize,
                activation: crate::ops::activations::Activation::Relu,
            };
            let forward_gemm = crate::ops::gemm::tile_shared_floats(fm, fn_, shape.inputs, ftm, ftn);
            assert_eq!(kernel, [forward_gemm as i64], "I = {inputs}");
            assert!(MnistLayout::new(shape, 132).forward_shared >= forward_gemm * 4);
        }
    }
}
