//! The MNIST classifier on a CUDA GPU. Both splits, the parameters, the gradient and the optimizer state
//! (with its step count) live in device memory; every optimizer step is the three kernels of
//! `fused/mnist.cu`. An epoch's steps are captured once as a CUDA graph and replayed every epoch after
//! that epoch's sample order is uploaded, so an epoch costs one graph launch. The host reads back the
//! summed training loss once per epoch, and the test loss and predicted classes once per evaluation.

use super::idx::Split;
use super::model::{self, Activation, MlpParams, MlpShape, Workspace};
use super::optim::{self, OptimConfig, OptimKind};
use super::{CpuTrainer, Evaluation, MnistTrainer};
use crate::device::Gpu;
use crate::check::{Check, Group, Plan, rel_error};
use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaFunction, CudaGraph, CudaSlice, LaunchConfig, PushKernelArg};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use std::sync::Arc;
use std::time::Instant;

const THREADS: usize = 256;
/// mnist_forward's block tile, samples × hidden units, and its register tile (FWD_BM, FWD_BN, FWD_TM,
/// FWD_TN in fused/mnist.cu).
const FORWARD_TILE: (usize, usize) = (8, 8);
const FORWARD_REGISTER_TILE: (usize, usize) = (2, 2);
/// mnist_backward's block tile, rows × columns × samples per stage, and its register tile (BWD_*).
const BACKWARD_TILE: (usize, usize, usize) = (16, 64, 64);
const BACKWARD_REGISTER_TILE: (usize, usize) = (4, 4);
/// Test samples per mnist_evaluate launch: the whole (Fashion-)MNIST test split in one.
const EVAL_CHUNK: usize = 10_000;

/// Floats of shared memory one `gemm_tile` needs: `GemmTile<BM, BN, BK, TM, TN>::SHARED_FLOATS` in
/// fused/gemm.cuh (k-major stages padded by one float per row, or the split-k partial tiles).
pub fn gemm_shared_floats(bm: usize, bn: usize, bk: usize, tm: usize, tn: usize) -> usize {
    let ksplit = THREADS / ((bm / tm) * (bn / tn));
    let stages = bk * (bm + 1 + bn + 1);
    let partials = if ksplit > 1 { ksplit * bm * bn } else { 0 };
    stages.max(partials)
}

/// Grids and shared memory of the three kernels for one model shape.
#[derive(Clone, Copy, Debug)]
pub struct MnistLayout {
    pub shape: MlpShape,
    /// Dynamic shared memory of mnist_forward / mnist_evaluate: the tile's gemm stages, then the output
    /// layer's activations, W2 and dlogits.
    pub forward_shared: usize,
    pub backward_shared: usize,
    /// Blocks of mnist_backward: [∂W1 | ∂b1] tiles, then [∂W2 | ∂b2] tiles. Also the number of Σg² partials.
    pub backward_grid: usize,
    pub update_grid: usize,
}

impl MnistLayout {
    pub fn new(shape: MlpShape, sm_count: usize) -> MnistLayout {
        let MlpShape { inputs: i, hidden: h, classes: c, .. } = shape;
        let f = std::mem::size_of::<f32>();
        let (fm, fn_) = FORWARD_TILE;
        let gemm = gemm_shared_floats(fm, fn_, i, FORWARD_REGISTER_TILE.0, FORWARD_REGISTER_TILE.1);
        let output_layer = (fm + c) * h + fm * c;
        let (bm, bn, bk) = BACKWARD_TILE;
        let tiles = |rows: usize, cols: usize| rows.div_ceil(bm) * cols.div_ceil(bn);
        MnistLayout {
            shape,
            forward_shared: gemm.max(output_layer) * f,
            backward_shared: gemm_shared_floats(bm, bn, bk, BACKWARD_REGISTER_TILE.0, BACKWARD_REGISTER_TILE.1) * f,
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

fn activation_code(a: Activation) -> i32 {
    match a {
        Activation::Relu => 0,
        Activation::Sigmoid => 1,
        Activation::Tanh => 2,
    }
}

fn optim_code(kind: OptimKind) -> i32 {
    match kind {
        OptimKind::Sgd => 0,
        OptimKind::Momentum => 1,
        OptimKind::Adam => 2,
    }
}

fn launch_config(grid: (u32, u32), shared: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid.0, grid.1, 1), block_dim: (THREADS as u32, 1, 1), shared_mem_bytes: shared as u32 }
}

struct DeviceSplit {
    images: CudaSlice<f32>,
    labels: CudaSlice<u8>,
    len: usize,
}

/// Per-step intermediates, sized for `capacity` samples.
pub struct StepBuffers {
    pub capacity: usize,
    /// [B][H] activations a.
    pub act: CudaSlice<f32>,
    /// [B][C] (p − onehot)/B.
    pub dlogits: CudaSlice<f32>,
    /// [B][H] ∂loss/∂z1.
    pub dz1: CudaSlice<f32>,
    /// mnist_forward's finished-block counter per sample tile; zero between launches.
    pub tickets: CudaSlice<u32>,
}

struct Kernels {
    forward: CudaFunction,
    evaluate: CudaFunction,
    backward: CudaFunction,
    update: CudaFunction,
    advance: CudaFunction,
}

struct CapturedEpoch {
    samples: usize,
    batch: usize,
    graph: CudaGraph,
}

pub struct GpuTrainer {
    gpu: Arc<Gpu>,
    pub shape: MlpShape,
    pub optim: OptimConfig,
    pub layout: MnistLayout,
    kernels: Kernels,
    /// Flat parameters, gradient, and optimizer state (momentum velocity or Adam's moments), all in the
    /// layout of `MlpParams::flat`.
    pub params: CudaSlice<f32>,
    pub grad: CudaSlice<f32>,
    pub m: CudaSlice<f32>,
    pub v: CudaSlice<f32>,
    /// Optimizer steps taken.
    pub step: CudaSlice<u32>,
    /// [backward_grid] Σg² of each mnist_backward block (written when clipping).
    pub norm_partials: CudaSlice<f32>,
    update_ticket: CudaSlice<u32>,
    train: DeviceSplit,
    test: DeviceSplit,
    test_labels: Vec<u8>,
    order: CudaSlice<u32>,
    cursor: CudaSlice<u32>,
    pub buffers: StepBuffers,
    loss_sum: CudaSlice<f64>,
    /// [test samples] predicted class of each.
    predicted: CudaSlice<u8>,
    captured: Option<CapturedEpoch>,
}

impl GpuTrainer {
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
        let module = gpu.module("mnist", &[("MNIST_I", shape.inputs as i64), ("MNIST_C", shape.classes as i64)])?;
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
        let (b, h, act, off) =
            (batch as i32, self.shape.hidden as i32, activation_code(self.shape.activation), offset as u32);
        let cfg = launch_config(self.layout.forward_grid(batch), self.layout.forward_shared);
        let buf = &mut self.buffers;
        let mut launch = self.gpu.stream.launch_builder(&self.kernels.forward);
        launch.arg(&self.train.images).arg(&self.train.labels).arg(&self.order).arg(&self.cursor).arg(&off);
        launch.arg(&b).arg(&h).arg(&act).arg(&self.params);
        launch.arg(&mut buf.act).arg(&mut buf.dlogits).arg(&mut buf.dz1).arg(&mut self.loss_sum).arg(&mut buf.tickets);
        unsafe { launch.launch(cfg) }.context("launching mnist_forward")?;
        Ok(())
    }

    /// Kernel 2: the gradient (and its Σg² partials when clipping).
    pub fn launch_backward(&mut self, batch: usize, offset: usize) -> Result<()> {
        let (b, h, off) = (batch as i32, self.shape.hidden as i32, offset as u32);
        let want_norm = (self.optim.clip_norm > 0.0) as i32;
        let cfg = launch_config((self.layout.backward_grid as u32, 1), self.layout.backward_shared);
        let buf = &self.buffers;
        let mut launch = self.gpu.stream.launch_builder(&self.kernels.backward);
        launch.arg(&self.train.images).arg(&self.order).arg(&self.cursor).arg(&off).arg(&b).arg(&h);
        launch.arg(&buf.act).arg(&buf.dlogits).arg(&buf.dz1).arg(&mut self.grad).arg(&want_norm);
        launch.arg(&mut self.norm_partials);
        unsafe { launch.launch(cfg) }.context("launching mnist_backward")?;
        Ok(())
    }

    /// Kernel 3: one optimizer step over every parameter.
    pub fn launch_update(&mut self) -> Result<()> {
        let o = self.optim;
        let (n, kind, partials) =
            (self.shape.param_count() as i32, optim_code(o.kind), self.layout.backward_grid as i32);
        let cfg = launch_config((self.layout.update_grid as u32, 1), 0);
        let mut launch = self.gpu.stream.launch_builder(&self.kernels.update);
        launch.arg(&mut self.params).arg(&self.grad).arg(&mut self.m).arg(&mut self.v).arg(&n).arg(&kind);
        launch.arg(&o.lr).arg(&o.momentum).arg(&o.beta1).arg(&o.beta2).arg(&o.eps).arg(&o.weight_decay);
        launch
            .arg(&o.clip_norm)
            .arg(&self.norm_partials)
            .arg(&partials)
            .arg(&mut self.step)
            .arg(&mut self.update_ticket);
        unsafe { launch.launch(cfg) }.context("launching mnist_update")?;
        Ok(())
    }

    pub fn launch_advance(&mut self, samples: usize) -> Result<()> {
        let samples = samples as u32;
        let mut launch = self.gpu.stream.launch_builder(&self.kernels.advance);
        launch.arg(&mut self.cursor).arg(&samples);
        unsafe { launch.launch(LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 }) }
            .context("launching mnist_advance")?;
        Ok(())
    }

    /// One optimizer step: the three kernels.
    pub fn launch_step(&mut self, batch: usize, offset: usize) -> Result<()> {
        self.launch_forward(batch, offset)?;
        self.launch_backward(batch, offset)?;
        self.launch_update()
    }

    /// Evaluation over test samples first .. first + batch: predicted classes and the summed loss.
    pub fn launch_evaluate(&mut self, first: usize, batch: usize) -> Result<()> {
        let (first, b, h, act) =
            (first as u32, batch as i32, self.shape.hidden as i32, activation_code(self.shape.activation));
        let cfg = launch_config(self.layout.forward_grid(batch), self.layout.forward_shared);
        let buf = &mut self.buffers;
        let mut launch = self.gpu.stream.launch_builder(&self.kernels.evaluate);
        launch.arg(&self.test.images).arg(&self.test.labels).arg(&first).arg(&b).arg(&h).arg(&act).arg(&self.params);
        launch.arg(&mut buf.act).arg(&mut self.predicted).arg(&mut self.loss_sum).arg(&mut buf.tickets);
        unsafe { launch.launch(cfg) }.context("launching mnist_evaluate")?;
        Ok(())
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

    pub fn synchronize(&self) -> Result<()> {
        self.gpu.stream.synchronize().context("an MNIST kernel failed")
    }

    pub fn zero_loss(&mut self) -> Result<()> {
        self.gpu.stream.memcpy_htod(&[0f64], &mut self.loss_sum)?;
        Ok(())
    }

    pub fn read_loss(&self) -> Result<f64> {
        Ok(self.gpu.stream.clone_dtoh(&self.loss_sum).context("an MNIST kernel failed")?[0])
    }

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

    fn params(&mut self) -> Result<MlpParams> {
        Ok(MlpParams { shape: self.shape, flat: self.download(&self.params)? })
    }
}

// ---------------------------------------------------------------------------------------------------
// selftest

/// `n` random images of `inputs` pixels in [0,1] with random labels below `classes`.
fn random_split(n: usize, shape: MlpShape, rng: &mut StdRng) -> Split {
    Split {
        images: (0..n * shape.inputs).map(|_| rng.random::<f32>()).collect(),
        labels: (0..n).map(|_| rng.random_range(0..shape.classes as u32) as u8).collect(),
        pixels: shape.inputs,
    }
}

/// Xavier-initialised parameters with non-zero biases.
fn random_params(shape: MlpShape, rng: &mut StdRng) -> MlpParams {
    let mut p = MlpParams::init(shape, rng.random());
    let (h, i, c) = (shape.hidden, shape.inputs, shape.classes);
    let flat = &mut p.flat;
    flat[h * i..h * i + h].iter_mut().for_each(|b| *b = rng.random_range(-0.2..0.2));
    flat[h * i + h + c * h..].iter_mut().for_each(|b| *b = rng.random_range(-0.2..0.2));
    p
}

fn shape_label(s: MlpShape, batch: usize) -> String {
    format!("I={} H={} C={} {} B={batch}", s.inputs, s.hidden, s.classes, s.activation.name())
}

/// Each MNIST kernel and whole training steps against the CPU reference (see `textnet selftest`).
pub fn selftest_checks(gpu: &Arc<Gpu>, plan: &Plan) -> Result<Vec<Check>> {
    let modules = |inputs: usize, classes: usize| ("mnist", vec![("MNIST_I", inputs as i64), ("MNIST_C", classes as i64)]);
    crate::device::precompile(gpu.compute_capability, &[modules(784, 10), modules(50, 7)]);
    let mut checks = Vec::new();
    if plan.wants(Group::Kernels) {
        checks.extend(all_kernel_checks(gpu, &mut plan.rng("mnist kernels"))?);
    }
    if !plan.wants(Group::Training) {
        return Ok(checks);
    }
    let mut rng = plan.rng("mnist training");
    for TrainingCase { shape, optim, samples, batch } in training_cases() {
        checks.push(training_check(gpu, shape, optim, samples, batch, TRAINING_EPOCHS, &mut rng)?);
    }
    Ok(checks)
}

/// A whole training run to compare: model shape, optimizer, random training images and images a step.
#[derive(Clone, Copy, Debug)]
pub struct TrainingCase {
    pub shape: MlpShape,
    pub optim: OptimConfig,
    pub samples: usize,
    pub batch: usize,
}

/// Epochs of each training check.
pub const TRAINING_EPOCHS: usize = 10;

/// Every activation with every optimizer, 10 epochs of 10 steps (100 steps). Random labels make this
/// training chaotic: a difference at the rounding level can grow. The learning rates are those at which,
/// on the CPU, noise of 1e-6 added to the parameters after every step stays below 2e-4 after 100 steps
/// (64 seeds each); the defaults grow it past 1e-3 for tanh with SGD or momentum. ReLU with momentum runs
/// at 5e-4, where its units stay on their side of the kink (at 0.005 most problems crossed it).
pub fn training_cases() -> Vec<TrainingCase> {
    use Activation::{Relu, Sigmoid, Tanh};
    use OptimKind::{Adam, Momentum, Sgd};
    let config =
        |kind, lr, weight_decay, clip_norm| OptimConfig { lr, weight_decay, clip_norm, ..OptimConfig::new(kind) };
    [
        (Relu, config(Adam, 1e-4, 0.0, 0.0), 128, 640, 64),
        (Relu, config(Sgd, 0.005, 1e-3, 1.0), 48, 630, 64),
        (Relu, config(Momentum, 5e-4, 0.0, 0.0), 48, 69, 7),
        (Sigmoid, config(Sgd, 0.02, 0.0, 0.0), 48, 500, 50),
        (Sigmoid, config(Momentum, 0.005, 1e-3, 0.5), 48, 999, 100),
        (Sigmoid, config(Adam, 1e-3, 0.0, 0.0), 48, 10, 1),
        (Tanh, config(Sgd, 0.02, 0.0, 0.0), 48, 95, 10),
        (Tanh, config(Momentum, 0.005, 0.0, 0.0), 48, 320, 32),
        (Tanh, config(Adam, 1e-3, 1e-4, 0.5), 100, 600, 64),
    ]
    .into_iter()
    .map(|(activation, optim, hidden, samples, batch)| TrainingCase {
        shape: MlpShape { inputs: 784, hidden, classes: 10, activation },
        optim,
        samples,
        batch,
    })
    .collect()
}

/// Each MNIST kernel alone on several shapes and activations, and the optimizer updates.
fn all_kernel_checks(gpu: &Arc<Gpu>, rng: &mut StdRng) -> Result<Vec<Check>> {
    let shape = |inputs, hidden, classes, activation| MlpShape { inputs, hidden, classes, activation };
    let mut checks = Vec::new();
    for (s, batch, test) in [
        (shape(784, 128, 10, Activation::Relu), 64, 1000),
        (shape(784, 100, 10, Activation::Sigmoid), 13, 77),
        (shape(784, 37, 10, Activation::Tanh), 1, 5),
        // Odd input and class counts, a wide hidden layer, and a test split of two evaluation launches.
        (shape(50, 300, 7, Activation::Relu), 200, EVAL_CHUNK + 37),
    ] {
        checks.extend(kernel_checks(gpu, s, batch, test, rng)?);
    }
    checks.extend(update_checks(gpu, shape(784, 128, 10, Activation::Relu), rng)?);
    Ok(checks)
}

/// mnist_forward, mnist_backward and mnist_evaluate alone on fresh random inputs, each against the CPU
/// reference, outputs poisoned before each run.
fn kernel_checks(gpu: &Arc<Gpu>, s: MlpShape, batch: usize, n_test: usize, rng: &mut StdRng) -> Result<Vec<Check>> {
    const TOL: f64 = 1e-5;
    let label = shape_label(s, batch);
    let check =
        |kernel: &str, rel_error: f64| Check { kernel: kernel.into(), shape: label.clone(), rel_error, tolerance: TOL };
    let (h, c) = (s.hidden, s.classes);
    let n_train = 2 * batch + 20;
    let train = random_split(n_train, s, rng);
    let test = random_split(n_test, s, rng);
    let p = random_params(s, rng);
    // Samples may repeat within a batch; the step reads order[cursor + offset ..].
    let order: Vec<u32> = (0..n_train).map(|_| rng.random_range(0..n_train as u32)).collect();
    let (cursor, offset) = (3, 5);
    let rows = &order[cursor + offset..][..batch];

    let mut ws = Workspace::default();
    let loss = model::forward(&p, &train, rows, &mut ws);
    let act = ws.a[..batch * h].to_vec();
    let z1 = ws.z1[..batch * h].to_vec();
    let mut grad = vec![0f32; s.param_count()];
    model::backward(&p, &train, rows, &mut ws, &mut grad);
    let dlogits = ws.probs[..batch * c].to_vec();
    let dz1 = ws.dz1[..batch * h].to_vec();

    let optim = OptimConfig { clip_norm: 1.0, ..OptimConfig::new(OptimKind::Adam) };
    let mut t = GpuTrainer::new(gpu.clone(), p.clone(), optim, &train, &test)?;
    t.ensure_capacity(batch)?;
    t.set_order(&order)?;
    t.set_cursor(cursor)?;
    t.poison_outputs()?;
    t.zero_loss()?;
    t.launch_forward(batch, offset)?;
    t.synchronize()?;
    let b = &t.buffers;
    let gpu_dz1 = t.download(&b.dz1)?[..batch * h].to_vec();
    // ReLU′ jumps at z = 0: where the CPU's z1 is within rounding of 0 the two sides may pick different
    // slopes, so those entries are left out of the comparison.
    let near_kink = |k: usize| s.activation == Activation::Relu && z1[k].abs() < 1e-5;
    let masked =
        |v: &[f32]| -> Vec<f32> { v.iter().enumerate().map(|(k, &x)| if near_kink(k) { 0.0 } else { x }).collect() };
    let mut out = vec![
        check("mnist_forward a", rel_error(&t.download(&b.act)?[..batch * h], &act)),
        check("mnist_forward dlogits", rel_error(&t.download(&b.dlogits)?[..batch * c], &dlogits)),
        check("mnist_forward dz1", rel_error(&masked(&gpu_dz1), &masked(&dz1))),
        check("mnist_forward loss", rel_error(&[t.read_loss()? as f32], &[loss as f32])),
    ];

    // mnist_backward from the CPU's intermediates, so that it is checked alone.
    let buf = &mut t.buffers;
    gpu.stream.memcpy_htod(&act, &mut buf.act.slice_mut(..act.len()))?;
    gpu.stream.memcpy_htod(&dlogits, &mut buf.dlogits.slice_mut(..dlogits.len()))?;
    gpu.stream.memcpy_htod(&dz1, &mut buf.dz1.slice_mut(..dz1.len()))?;
    t.launch_backward(batch, offset)?;
    t.synchronize()?;
    let gpu_grad = t.download(&t.grad)?;
    let (got, want) = (s.split(&gpu_grad), s.split(&grad));
    out.push(check("mnist_backward ∂W1", rel_error(got.w1, want.w1)));
    out.push(check("mnist_backward ∂b1", rel_error(got.b1, want.b1)));
    out.push(check("mnist_backward ∂W2", rel_error(got.w2, want.w2)));
    out.push(check("mnist_backward ∂b2", rel_error(got.b2, want.b2)));
    let partials: f64 = t.download(&t.norm_partials)?.iter().map(|&x| x as f64).sum();
    let squares: f64 = grad.iter().map(|&g| g as f64 * g as f64).sum();
    out.push(check("mnist_backward Σg² partials", rel_error(&[partials as f32], &[squares as f32])));

    // mnist_evaluate over the whole test split.
    let mut cpu_loss = 0.0;
    let mut cpu_probs = Vec::with_capacity(n_test * c);
    let mut cpu_predicted = Vec::with_capacity(n_test);
    let all: Vec<u32> = (0..n_test as u32).collect();
    for chunk in all.chunks(256) {
        cpu_loss += model::forward(&p, &test, chunk, &mut ws);
        cpu_probs.extend_from_slice(&ws.probs[..chunk.len() * c]);
        cpu_predicted.extend_from_slice(&ws.predicted[..chunk.len()]);
    }
    let (gpu_loss, gpu_predicted) = t.evaluate_raw()?;
    // A prediction differs only if the CPU's probabilities of the two classes are not a near tie.
    let differ = (0..n_test)
        .filter(|&k| {
            let (mine, theirs) = (gpu_predicted[k] as usize, cpu_predicted[k] as usize);
            mine >= c || cpu_probs[k * c + theirs] - cpu_probs[k * c + mine] > 1e-5
        })
        .count();
    out.push(check("mnist_evaluate loss", rel_error(&[gpu_loss as f32], &[cpu_loss as f32])));
    out.push(Check {
        kernel: "mnist_evaluate predictions (share differing)".into(),
        shape: format!("{label} test={n_test}"),
        rel_error: differ as f64 / n_test as f64,
        tolerance: 0.0,
    });
    Ok(out)
}

/// mnist_update alone for each optimizer against `optim::update`, at step 7, with weight decay and a clip
/// that binds (and Adam once without either). At lr 0.5 the parameter deltas are far above the rounding
/// of the parameters themselves.
fn update_checks(gpu: &Arc<Gpu>, s: MlpShape, rng: &mut StdRng) -> Result<Vec<Check>> {
    const TOL: f64 = 1e-5;
    let n = s.param_count();
    let mut out = Vec::new();
    // The gradient's norm is about 180: a clip of 20 binds.
    let configs = [
        (OptimKind::Sgd, 0.01, 20.0),
        (OptimKind::Momentum, 0.01, 20.0),
        (OptimKind::Adam, 0.01, 20.0),
        (OptimKind::Adam, 0.0, 0.0),
    ];
    for (kind, weight_decay, clip_norm) in configs {
        let optim = OptimConfig { lr: 0.5, weight_decay, clip_norm, ..OptimConfig::new(kind) };
        let params: Vec<f32> = (0..n).map(|_| rng.random_range(-0.2..0.2)).collect();
        let grad: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let m: Vec<f32> = (0..n).map(|_| rng.random_range(-0.1..0.1)).collect();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(0.0..0.01)).collect();
        let steps_taken = 6u32;

        let norm = optim::global_norm(&grad);
        let scalars = optim.step_scalars(steps_taken as u64 + 1, norm);
        let (mut want_params, mut want_m, mut want_v) = (params.clone(), m.clone(), v.clone());
        optim::update(kind, &scalars, &mut want_params, &grad, &mut want_m, &mut want_v);

        let split = random_split(1, s, rng);
        let mut t = GpuTrainer::new(gpu.clone(), MlpParams { shape: s, flat: params.clone() }, optim, &split, &split)?;
        let count = t.layout.backward_grid;
        let mut partials = vec![0f32; count];
        for (k, g) in grad.iter().enumerate() {
            partials[k % count] += g * g;
        }
        gpu.stream.memcpy_htod(&grad, &mut t.grad)?;
        gpu.stream.memcpy_htod(&m, &mut t.m)?;
        gpu.stream.memcpy_htod(&v, &mut t.v)?;
        gpu.stream.memcpy_htod(&partials, &mut t.norm_partials)?;
        gpu.stream.memcpy_htod(&[steps_taken], &mut t.step)?;
        t.launch_update()?;
        t.synchronize()?;
        let delta = |after: &[f32]| -> Vec<f32> { params.iter().zip(after).map(|(b, a)| a - b).collect() };
        let mut what = optim.describe();
        if clip_norm > 0.0 {
            what += &format!(" (‖g‖ {norm:.2})");
        }
        let label = format!("{what}, n={n}");
        let row = |kernel: String, rel_error: f64| Check { kernel, shape: label.clone(), rel_error, tolerance: TOL };
        out.push(row(
            format!("mnist_update {} Δθ", kind.name()),
            rel_error(&delta(&t.download(&t.params)?), &delta(&want_params)),
        ));
        if kind != OptimKind::Sgd {
            out.push(row(format!("mnist_update {} m", kind.name()), rel_error(&t.download(&t.m)?, &want_m)));
        }
        if kind == OptimKind::Adam {
            out.push(row(format!("mnist_update {} v", kind.name()), rel_error(&t.download(&t.v)?, &want_v)));
        }
        let step = t.download(&t.step)?[0];
        out.push(row(
            format!("mnist_update {} step count", kind.name()),
            if step == steps_taken + 1 { 0.0 } else { f64::INFINITY },
        ));
    }
    Ok(out)
}

/// The smallest kink ratio (`check::kink_ratio`) a ReLU training problem's reference run may reach: the GPU
/// drifts from the reference by about a relative 1e-7 over a run, ten thousand times less.
pub const TRAINING_MARGIN: f64 = 1e-3;

/// The relative error a training check accepts. Over 200 seeds the worst case measured 1.1e-5 (tanh with
/// Adam, whose step divides by √v and so magnifies rounding where v is small), every other below 2e-6.
pub const TRAINING_TOLERANCE: f64 = 1e-3;

/// A training check's problem: random images and labels, a 97-image test split, initial parameters and
/// the shuffle seed. With ReLU every hidden unit starts firmly on or off for every image: its bias puts
/// W1[j]·x + b1[j] 5 to 7 away from 0 at the mean image, where images move it by about 0.4 and the
/// check's 100 steps by far less than 5.
pub fn training_problem(s: MlpShape, samples: usize, rng: &mut StdRng) -> (Split, Split, MlpParams, u64) {
    let train = random_split(samples, s, rng);
    let test = random_split(97, s, rng);
    let mut p = random_params(s, rng);
    if s.activation == Activation::Relu {
        let mean: Vec<f32> = (0..s.inputs).map(|k| (0..samples).map(|r| train.image(r as u32)[k]).sum::<f32>() / samples as f32).collect();
        let (i, h) = (s.inputs, s.hidden);
        let (w1, b1) = p.flat.split_at_mut(h * i);
        for (j, b) in b1[..h].iter_mut().enumerate() {
            let at_mean: f32 = w1[j * i..][..i].iter().zip(&mean).map(|(w, x)| w * x).sum();
            *b = -at_mean + rng.random_range(5.0..7.0) * if rng.random() { 1.0 } else { -1.0 };
        }
    }
    (train, test, p, rng.random())
}

/// `epochs` epochs of `samples` random images, `batch` a step, trained by the GPU through the production
/// path (a CUDA graph per epoch) and by the CPU reference from the same start and sample order: the losses
/// of every epoch, the final test loss and the parameters within TRAINING_TOLERANCE relative. A ReLU problem is drawn
/// again (at most MAX_DRAWS times) while the reference run comes within TRAINING_MARGIN of the kink.
/// The GPU measured within 2e-6 of the reference over 40 seeds of every case.
fn training_check(
    gpu: &Arc<Gpu>,
    s: MlpShape,
    optim: OptimConfig,
    samples: usize,
    batch: usize,
    epochs: usize,
    rng: &mut StdRng,
) -> Result<Check> {
    use super::train::{self, Schedule};
    const MAX_DRAWS: usize = 8;
    let steps = epochs * samples.div_ceil(batch);
    let label = format!("{} N={samples}", shape_label(s, batch));
    let mut draws = 0;
    let (train_split, test_split, p, schedule, cpu, cpu_history, cpu_eval) = loop {
        draws += 1;
        let (train_split, test_split, p, seed) = training_problem(s, samples, rng);
        let (train_split, test_split) = (Arc::new(train_split), Arc::new(test_split));
        let schedule = Schedule { epochs, batch, seed };
        let mut cpu = CpuTrainer::new(p.clone(), optim, train_split.clone(), test_split.clone());
        cpu.kink_margin = Some(f64::INFINITY);
        let (cpu_history, cpu_eval) = train::run(&mut cpu, samples, schedule, &mut ())?;
        if cpu.kink_margin.is_some_and(|m| m >= TRAINING_MARGIN) {
            break (train_split, test_split, p, schedule, cpu, cpu_history, cpu_eval);
        }
        if draws == MAX_DRAWS {
            return Ok(Check {
                kernel: format!("{steps} steps {}: no problem of {draws} stayed {TRAINING_MARGIN:e} clear of ReLU's kink", optim.describe()),
                shape: label,
                rel_error: f64::INFINITY,
                tolerance: TRAINING_TOLERANCE,
            });
        }
    };
    let mut gpu_trainer = GpuTrainer::new(gpu.clone(), p, optim, &train_split, &test_split)?;
    let (gpu_history, gpu_eval) = train::run(&mut gpu_trainer, samples, schedule, &mut ())?;

    let losses = |h: &[train::EpochStats]| -> Vec<f32> {
        h.iter().flat_map(|e| [e.train_loss as f32, e.test_loss as f32]).collect()
    };
    // rel_error is never NaN (a non-finite value gives infinity), so `>` picks the worst.
    let mut worst = (rel_error(&losses(&gpu_history), &losses(&cpu_history)), "loss");
    let final_loss = rel_error(&[gpu_eval.loss as f32], &[cpu_eval.loss as f32]);
    if final_loss > worst.0 {
        worst = (final_loss, "test loss");
    }
    let got = gpu_trainer.params()?;
    let (a, b) = (s.split(&got.flat), s.split(&cpu.params.flat));
    for (name, x, y) in [("w1", a.w1, b.w1), ("b1", a.b1, b.b1), ("w2", a.w2, b.w2), ("b2", a.b2, b.b2)] {
        let err = rel_error(x, y);
        if err > worst.0 {
            worst = (err, name);
        }
    }
    let drawn = if draws > 1 { format!(" ({draws} problems drawn)") } else { String::new() };
    Ok(Check {
        kernel: format!("{steps} steps (graph) {}, worst: {}{drawn}", optim.describe(), worst.1),
        shape: label,
        rel_error: worst.0,
        tolerance: TRAINING_TOLERANCE,
    })
}

// ---------------------------------------------------------------------------------------------------
// bench

/// The benchmark's configuration: the PyTorch baseline (benches/torch_mnist.py) trains the same.
const BENCH_EPOCHS: usize = 10;
const BENCH_BATCH: usize = 64;
const BENCH_HIDDEN: usize = 128;

/// `textnet bench mnist`: 10 epochs of Fashion-MNIST (batch 64, Adam 1e-3, 784 → 128 relu → 10) with the
/// data on the GPU, evaluating the test split after each epoch, as `textnet mnist` does. Reports the wall
/// time of the 10 epochs (the first run includes capturing the epoch's graph), per-epoch wall and device
/// times, test accuracy, and a per-step breakdown. Repeats from fresh parameters; reports the median.
pub fn bench(gpu: &Arc<Gpu>, args: &crate::bench::BenchArgs) -> Result<()> {
    use super::data::{self, Dataset};
    use crate::bench::{median, time_on_device};
    let repeats = args.repeats.max(1);
    let load_start = Instant::now();
    let data = data::load(Dataset::Fashion, None, &|note| eprintln!("{note}"))?;
    let load_s = load_start.elapsed().as_secs_f64();
    let shape = MlpShape {
        inputs: super::idx::PIXELS,
        hidden: BENCH_HIDDEN,
        classes: super::idx::CLASSES,
        activation: Activation::Relu,
    };
    let optim = OptimConfig::new(OptimKind::Adam);
    let params = MlpParams::init(shape, 0);
    let upload_start = Instant::now();
    let mut trainer = GpuTrainer::new(gpu.clone(), params.clone(), optim, &data.train, &data.test)?;
    trainer.synchronize()?;
    let setup_s = upload_start.elapsed().as_secs_f64();
    let n_train = data.train.len();
    let steps_per_epoch = n_train.div_ceil(BENCH_BATCH);

    let mut runs = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        trainer.reset(&params)?;
        trainer.synchronize()?;
        let mut rng = StdRng::seed_from_u64(0);
        let mut order: Vec<u32> = (0..n_train as u32).collect();
        let start = Instant::now();
        let mut epochs = Vec::with_capacity(BENCH_EPOCHS);
        let mut capture_ms = 0.0;
        let mut last = None;
        for epoch in 1..=BENCH_EPOCHS {
            let epoch_start = Instant::now();
            order.shuffle(&mut rng);
            if epoch == 1 {
                let captured = Instant::now();
                trainer.prepare_epoch(n_train, BENCH_BATCH)?;
                capture_ms = captured.elapsed().as_secs_f64() * 1e3;
            }
            trainer.set_order(&order)?;
            trainer.zero_loss()?;
            let train_ms = time_on_device(gpu, || trainer.enqueue_epoch(n_train, BENCH_BATCH))?;
            let train_loss = trainer.read_loss()? / n_train as f64;
            let mut eval = None;
            let eval_ms = time_on_device(gpu, || {
                eval = Some(trainer.evaluate()?);
                Ok(())
            })?;
            let eval = eval.unwrap();
            epochs.push(serde_json::json!({
                "epoch": epoch,
                "wall_ms": epoch_start.elapsed().as_secs_f64() * 1e3,
                "train_device_ms": train_ms,
                "eval_device_ms": eval_ms,
                "train_loss": train_loss,
                "test_loss": eval.mean_loss(),
                "test_accuracy": eval.accuracy(),
            }));
            last = Some(eval);
        }
        let total_s = start.elapsed().as_secs_f64();
        let eval = last.unwrap();
        let train_device_ms: f64 = epochs.iter().map(|e| e["train_device_ms"].as_f64().unwrap()).sum();
        runs.push(serde_json::json!({
            "total_s": total_s,
            "graph_capture_ms": capture_ms,
            "train_device_ms": train_device_ms,
            "us_per_step": train_device_ms * 1e3 / (BENCH_EPOCHS * steps_per_epoch) as f64,
            "test_accuracy": eval.accuracy(),
            "test_loss": eval.mean_loss(),
            "epochs": epochs,
        }));
    }
    let field = |key: &str| -> Vec<f64> { runs.iter().map(|r| r[key].as_f64().unwrap()).collect() };
    let totals = field("total_s");
    let us_per_step = median(&field("us_per_step"));

    // Each kernel alone: a graph of 128 launches of it on a full batch, replayed.
    trainer.set_order(&(0..n_train as u32).collect::<Vec<_>>())?;
    trainer.launch_step(BENCH_BATCH, 0)?;
    let mut per_kernel = Vec::new();
    for (name, which) in [("mnist_forward", 0), ("mnist_backward", 1), ("mnist_update", 2)] {
        let graph = trainer.capture(|t| {
            for _ in 0..128 {
                match which {
                    0 => t.launch_forward(BENCH_BATCH, 0)?,
                    1 => t.launch_backward(BENCH_BATCH, 0)?,
                    _ => t.launch_update()?,
                }
            }
            Ok(())
        })?;
        let times = crate::bench::time_graph_launches(gpu, &graph, 128, repeats)?;
        per_kernel.push(serde_json::json!({"kernel": name, "us_median": median(&times), "us": times}));
    }
    let layout = trainer.layout;
    let (fx, fy) = layout.forward_grid(BENCH_BATCH);
    let steps = BENCH_EPOCHS * steps_per_epoch;
    let bytes = layout.bytes_per_step(BENCH_BATCH);
    let flops = layout.flops_per_step(BENCH_BATCH);
    let out = serde_json::json!({
        "device": gpu.describe(),
        "dataset": Dataset::Fashion.title(),
        "data_dir": data.dir.display().to_string(),
        "train_samples": n_train,
        "test_samples": data.test.len(),
        "model": format!("{} → {} relu → {}", shape.inputs, shape.hidden, shape.classes),
        "optimizer": optim.describe(),
        "batch": BENCH_BATCH,
        "epochs": BENCH_EPOCHS,
        "load_s": load_s,
        "setup_s": setup_s,
        "total_s": median(&totals),
        "total_s_runs": totals,
        "test_accuracy": runs.last().unwrap()["test_accuracy"],
        "us_per_step": us_per_step,
        "breakdown": {
            "steps": steps,
            "kernels_per_step": 3,
            "graph_nodes_per_epoch": GpuTrainer::graph_nodes(n_train, BENCH_BATCH),
            "graph_launches": BENCH_EPOCHS,
            "eval_launches_per_epoch": data.test.len().div_ceil(EVAL_CHUNK),
            "grids": {
                "mnist_forward": [fx, fy],
                "mnist_backward": layout.backward_grid,
                "mnist_update": layout.update_grid,
            },
            "shared_bytes": {"mnist_forward": layout.forward_shared, "mnist_backward": layout.backward_shared},
            "bytes_per_step": bytes,
            "flops_per_step": flops,
            "gflops_per_s": flops / (us_per_step * 1e3),
            "per_kernel": per_kernel,
            "resources (name, registers, local bytes)": trainer.kernel_resources(),
        },
        "runs": runs,
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "Fashion-MNIST {} on {}: batch {BENCH_BATCH}, {}, {BENCH_EPOCHS} epochs",
            out["model"].as_str().unwrap(),
            gpu.describe(),
            optim.describe()
        );
        for (k, r) in runs.iter().enumerate() {
            println!(
                "run {}: {:.3} s for {BENCH_EPOCHS} epochs (graph capture {:.1} ms), {:.2} µs/step on the device, test accuracy {:.2}%",
                k + 1,
                r["total_s"].as_f64().unwrap(),
                r["graph_capture_ms"].as_f64().unwrap(),
                r["us_per_step"].as_f64().unwrap(),
                100.0 * r["test_accuracy"].as_f64().unwrap()
            );
        }
        println!(
            "{:>5} {:>10} {:>14} {:>13} {:>11} {:>9}",
            "epoch", "wall ms", "train dev. ms", "eval dev. ms", "train loss", "test acc"
        );
        for e in runs[0]["epochs"].as_array().unwrap() {
            println!(
                "{:>5} {:>10.2} {:>14.2} {:>13.2} {:>11.4} {:>8.2}%",
                e["epoch"],
                e["wall_ms"].as_f64().unwrap(),
                e["train_device_ms"].as_f64().unwrap(),
                e["eval_device_ms"].as_f64().unwrap(),
                e["train_loss"].as_f64().unwrap(),
                100.0 * e["test_accuracy"].as_f64().unwrap()
            );
        }
        println!(
            "median {:.3} s for {BENCH_EPOCHS} epochs; {steps} steps × 3 kernels, {} graph nodes per epoch; \
             {:.2} MB and {:.1} MFLOP per step",
            median(&totals),
            GpuTrainer::graph_nodes(n_train, BENCH_BATCH),
            bytes / 1e6,
            flops / 1e6
        );
        for k in &per_kernel {
            println!("{k}");
        }
        println!("resources (name, registers, local bytes): {:?}", trainer.kernel_resources());
    }
    Ok(())
}
