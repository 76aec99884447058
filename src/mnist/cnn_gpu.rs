//! The CNN trainer on the GPU: fused/mnist_cnn.cu's three kernels per step (see its header), both splits
//! resident on the device, an epoch's steps captured once as a CUDA graph and replayed over each epoch's
//! order and learning rates, the loss read once per epoch.

use super::Evaluation;
use super::cnn::{CnnParams, CnnShape};
use super::idx::Split;
use crate::device::kernel_struct::{Address, kernel_struct};
use crate::device::launch::{Arg, Kernel, StructArg};
use crate::device::{Gpu, compile::ModuleRequest};
use crate::ops::optim::OptimConfig;
use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaGraph, CudaSlice};
use std::sync::Arc;

const THREADS: usize = crate::ops::THREADS_PER_BLOCK as usize;
/// Threads of a block of cnn_forward, cnn_evaluate and cnn_backward (a block per image; CNN_IMAGE_THREADS).
const IMAGE_THREADS: u32 = 1024;
/// cnn_update's blocks per conv channel (SLICES in fused/mnist_cnn.cu).
const CONV_SLICES: usize = 32;
/// Test images per evaluation launch (a block each).
const EVAL_CHUNK: usize = 10_000;

/// The kernels' buffer and shared-memory sizes for `shape` (mirroring fused/mnist_cnn.cu).
struct Sizes {
    pix: usize,
    p1: usize,
    z2: usize,
    flat: usize,
    forward_shared: usize,
    backward_shared: usize,
    update_blocks: usize,
}

impl Sizes {
    fn of(s: CnnShape) -> Sizes {
        let (s1, s2) = (s.side, s.side / 2);
        let (pix, p1, z2, flat) = (s1 * s1, s.c1 * s2 * s2, s.c2 * s2 * s2, s.flat());
        let conv_params = s.c1 * 9 + s.c1 + s.c2 * s.c1 * 9 + s.c2;
        let fc_params = s.param_count() - conv_params;
        Sizes {
            pix,
            p1,
            z2,
            flat,
            forward_shared: 4 * (pix + conv_params + p1 + flat + s.fc + (p1 + flat).div_ceil(4)),
            backward_shared: 4 * (s.fc + flat + z2 + s.c2 * s.c1 * 9 + flat + p1),
            update_blocks: (s.c1 + s.c2) * CONV_SLICES + fc_params.div_ceil(THREADS),
        }
    }
}

/// The -D sizes fused/mnist_cnn.cu is compiled with for `shape`.
/// The kernel module a trainer of `shape` compiles.
pub fn module_request(shape: CnnShape) -> ModuleRequest {
    let defines = vec![
        ("CNN_SIDE", shape.side as i64),
        ("CNN_C1", shape.c1 as i64),
        ("CNN_C2", shape.c2 as i64),
        ("CNN_FC", shape.fc as i64),
        ("CNN_CLASSES", shape.classes as i64),
        ("CNN_IMAGE_THREADS", IMAGE_THREADS as i64),
    ];
    ("mnist_cnn", defines)
}

kernel_struct! {
    /// The arguments of cnn_forward, cnn_evaluate and cnn_backward (`CnnArgs` in fused/mnist_cnn.cu).
    struct CnnArgs {
        params: Address<f32>,
        images: Address<f32>,
        labels: Address<u8>,
        order: Address<u32>,
        offset: i32,
        batch: i32,
        p1: Address<f32>,
        arg1: Address<u8>,
        f: Address<f32>,
        arg2: Address<u8>,
        h: Address<f32>,
        dlogits: Address<f32>,
        loss: Address<f32>,
        dh: Address<f32>,
        dz2: Address<f32>,
        dz1: Address<f32>,
        predicted: Address<u8>,
    }
}

struct Kernels {
    forward: Kernel,
    backward: Kernel,
    update: Kernel,
    evaluate: Kernel,
}

/// What one step keeps per image between its kernels, for `capacity` images.
struct StepBuffers {
    capacity: usize,
    p1: CudaSlice<f32>,
    arg1: CudaSlice<u8>,
    f: CudaSlice<f32>,
    arg2: CudaSlice<u8>,
    h: CudaSlice<f32>,
    dlogits: CudaSlice<f32>,
    loss: CudaSlice<f32>,
    dh: CudaSlice<f32>,
    dz2: CudaSlice<f32>,
    dz1: CudaSlice<f32>,
    predicted: CudaSlice<u8>,
}

struct DeviceSplit {
    images: CudaSlice<f32>,
    labels: CudaSlice<u8>,
    len: usize,
}

/// The CNN trainer on a CUDA GPU: both splits, the parameters and the optimizer state in device memory.
pub struct GpuCnn {
    gpu: Arc<Gpu>,
    shape: CnnShape,
    sizes: Sizes,
    optim: OptimConfig,
    kernels: Kernels,
    params: CudaSlice<f32>,
    /// The last step's gradient of the batch mean loss (every element written each step).
    pub grad: CudaSlice<f32>,
    m: CudaSlice<f32>,
    v: CudaSlice<f32>,
    norm_partials: CudaSlice<f32>,
    /// Per conv channel and slice, cnn_update's partial gradient sums (conv2's C1·9 + 1 floats each).
    conv_partials: CudaSlice<f32>,
    channel_tickets: CudaSlice<u32>,
    step: CudaSlice<u32>,
    ticket: CudaSlice<u32>,
    loss_sum: CudaSlice<f64>,
    order: CudaSlice<u32>,
    /// The epoch's learning rate of each step; step k's cnn_update reads entry k.
    rates: CudaSlice<f32>,
    train: DeviceSplit,
    test: DeviceSplit,
    test_labels: Vec<u8>,
    buffers: StepBuffers,
    /// An epoch's steps for (samples, batch), replayed each epoch.
    captured: Option<(usize, usize, CudaGraph)>,
}

impl GpuCnn {
    /// Uploads the splits and the parameters to `gpu` and loads the kernels for `params.shape`.
    pub fn new(gpu: Arc<Gpu>, params: CnnParams, optim: OptimConfig, train: &Split, test: &Split) -> Result<GpuCnn> {
        optim.validate()?;
        let shape = params.shape;
        shape.validate()?;
        if train.pixels != shape.side * shape.side || test.pixels != train.pixels {
            bail!("the CNN takes {0}×{0} images", shape.side);
        }
        let module = gpu.module(&module_request(shape))?;
        let load = |name: &str| Gpu::function(&module, name);
        let kernels = Kernels {
            forward: load("cnn_forward")?,
            backward: load("cnn_backward")?,
            update: load("cnn_update")?,
            evaluate: load("cnn_evaluate")?,
        };
        let sizes = Sizes::of(shape);
        gpu.reserve_shared(&kernels.forward, sizes.forward_shared, "the CNN's size")?;
        gpu.reserve_shared(&kernels.evaluate, sizes.forward_shared, "the CNN's size")?;
        gpu.reserve_shared(&kernels.backward, sizes.backward_shared, "the CNN's size")?;
        let stream = gpu.stream.clone();
        let upload = |split: &Split, what: &str| -> Result<DeviceSplit> {
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
        let n = shape.param_count();
        let zeros = |len: usize| stream.alloc_zeros::<f32>(len.max(1)).context("GPU out of memory for the model");
        Ok(GpuCnn {
            params: stream.clone_htod(&params.flat).context("copying the model to the GPU")?,
            grad: zeros(n)?,
            m: zeros(n)?,
            v: zeros(n)?,
            norm_partials: zeros(sizes.update_blocks)?,
            conv_partials: zeros((shape.c1 + shape.c2) * CONV_SLICES * (shape.c1 * 9 + 1).max(10))?,
            channel_tickets: stream.alloc_zeros::<u32>(shape.c1 + shape.c2)?,
            step: stream.alloc_zeros::<u32>(1)?,
            ticket: stream.alloc_zeros::<u32>(1)?,
            loss_sum: stream.alloc_zeros::<f64>(1)?,
            order: stream.alloc_zeros::<u32>(train.len().max(1))?,
            rates: stream.alloc_zeros::<f32>(train.len().max(1))?,
            train: upload(train, "training")?,
            test: upload(test, "test")?,
            test_labels: test.labels.clone(),
            buffers: Self::alloc_buffers(&gpu, shape, &sizes, EVAL_CHUNK.min(test.len().max(1)).max(64))?,
            gpu,
            shape,
            sizes,
            optim,
            kernels,
            captured: None,
        })
    }

    fn alloc_buffers(gpu: &Gpu, s: CnnShape, z: &Sizes, capacity: usize) -> Result<StepBuffers> {
        let st = &gpu.stream;
        let room = "GPU out of memory for the step buffers";
        let f32s = |n: usize| st.alloc_zeros::<f32>(capacity * n).context(room);
        let bytes = |n: usize| st.alloc_zeros::<u8>(capacity * n).context(room);
        Ok(StepBuffers {
            capacity,
            p1: f32s(z.p1)?,
            arg1: bytes(z.p1)?,
            f: f32s(z.flat)?,
            arg2: bytes(z.flat)?,
            h: f32s(s.fc)?,
            dlogits: f32s(s.classes)?,
            loss: f32s(1)?,
            dh: f32s(s.fc)?,
            dz2: f32s(z.z2)?,
            dz1: f32s(s.c1 * z.pix)?,
            predicted: bytes(1)?,
        })
    }

    fn ensure_capacity(&mut self, batch: usize) -> Result<()> {
        if batch > 65_535 {
            bail!("--batch {batch} is above the CNN kernels' limit of 65535");
        }
        if batch > self.buffers.capacity {
            self.captured = None;
            self.buffers = Self::alloc_buffers(&self.gpu, self.shape, &self.sizes, batch)?;
        }
        Ok(())
    }

    /// Queues one optimizer step on the `batch` images order[offset..], at the rate of entry `step` of the
    /// uploaded rates.
    pub fn enqueue_step(&mut self, batch: usize, offset: usize, step: usize) -> Result<()> {
        self.launch_forward(batch, offset)?;
        self.launch_backward(batch)?;
        self.launch_update(batch, offset, step)
    }

    /// The image kernels' arguments for `batch` images of `split`, starting at `offset` (of the order for a
    /// step, of the split for an evaluation).
    fn image_args(&self, split: &DeviceSplit, offset: usize, batch: usize) -> StructArg {
        let (g, b) = (&*self.gpu, &self.buffers);
        StructArg::of(&CnnArgs {
            params: Address::of(g, &self.params),
            images: Address::of(g, &split.images),
            labels: Address::of(g, &split.labels),
            order: Address::of(g, &self.order),
            offset: offset as i32,
            batch: batch as i32,
            p1: Address::of(g, &b.p1),
            arg1: Address::of(g, &b.arg1),
            f: Address::of(g, &b.f),
            arg2: Address::of(g, &b.arg2),
            h: Address::of(g, &b.h),
            dlogits: Address::of(g, &b.dlogits),
            loss: Address::of(g, &b.loss),
            dh: Address::of(g, &b.dh),
            dz2: Address::of(g, &b.dz2),
            dz1: Address::of(g, &b.dz1),
            predicted: Address::of(g, &b.predicted),
        })
    }

    /// Launches one of the image kernels (a block of IMAGE_THREADS per image) on `batch` images.
    fn launch_images(&self, kernel: &Kernel, batch: usize, shared: usize, args: &StructArg) -> Result<()> {
        self.gpu.launch_struct(kernel, ((batch as u32, 1), IMAGE_THREADS, shared as u32, false), args)
    }

    fn launch_forward(&self, batch: usize, offset: usize) -> Result<()> {
        let args = self.image_args(&self.train, offset, batch);
        self.launch_images(&self.kernels.forward, batch, self.sizes.forward_shared, &args)
    }

    fn launch_backward(&self, batch: usize) -> Result<()> {
        let args = self.image_args(&self.train, 0, batch);
        self.launch_images(&self.kernels.backward, batch, self.sizes.backward_shared, &args)
    }

    fn launch_update(&self, batch: usize, offset: usize, step: usize) -> Result<()> {
        let (g, b) = (&*self.gpu, &self.buffers);
        // The optimizer's settings by value; the rate from the uploaded rates (a graph bakes in the address,
        // the host writes the epoch's rates there).
        let settings = StructArg::of(&self.optim.kernel_settings());
        let rate = Arg::from(Address::of(g, &self.rates).element(step));
        let args = [
            Arg::buf(g, &self.params),
            Arg::buf(g, &self.grad),
            Arg::buf(g, &self.m),
            Arg::buf(g, &self.v),
            Arg::buf(g, &self.train.images),
            Arg::buf(g, &self.order),
            Arg::i32(offset as i32),
            Arg::i32(batch as i32),
            Arg::buf(g, &b.p1),
            Arg::buf(g, &b.f),
            Arg::buf(g, &b.h),
            Arg::buf(g, &b.dlogits),
            Arg::buf(g, &b.dh),
            Arg::buf(g, &b.dz2),
            Arg::buf(g, &b.dz1),
            Arg::buf(g, &b.loss),
            rate,
            Arg::buf(g, &self.norm_partials),
            Arg::buf(g, &self.conv_partials),
            Arg::buf(g, &self.channel_tickets),
            Arg::buf(g, &self.step),
            Arg::buf(g, &self.ticket),
            Arg::buf(g, &self.loss_sum),
        ];
        let blocks = (self.sizes.update_blocks as u32, 1);
        g.launch_with_struct(&self.kernels.update, (blocks, 0, false), &settings, &args)
    }

    /// cnn_forward alone on the images `order` (one batch), its outputs poisoned with NaN first: per image
    /// p1, f, h, dlogits and the loss, as `cnn::intermediates` lays them out.
    pub fn forward_alone(&mut self, order: &[u32]) -> Result<super::cnn::Intermediates> {
        let batch = order.len();
        self.ensure_capacity(batch)?;
        self.set_order(order)?;
        let stream = self.gpu.stream.clone();
        let b = &mut self.buffers;
        for buf in [&mut b.p1, &mut b.f, &mut b.h, &mut b.dlogits, &mut b.loss] {
            stream.memcpy_htod(&vec![f32::NAN; buf.len()], buf)?;
        }
        self.launch_forward(batch, 0)?;
        let z = &self.sizes;
        let get = |buf: &CudaSlice<f32>, per: usize| -> Result<Vec<f32>> {
            let mut v = stream.clone_dtoh(buf).context("cnn_forward failed")?;
            v.truncate(batch * per);
            Ok(v)
        };
        let b = &self.buffers;
        Ok(super::cnn::Intermediates {
            p1: get(&b.p1, z.p1)?,
            f: get(&b.f, z.flat)?,
            h: get(&b.h, self.shape.fc)?,
            dlogits: get(&b.dlogits, self.shape.classes)?,
            loss: get(&b.loss, 1)?,
            ..Default::default()
        })
    }

    /// cnn_backward alone on what the last `forward_alone` of `batch` images left: per image dh, dz2 and
    /// dz1, poisoned with NaN first.
    pub fn backward_alone(&mut self, batch: usize) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        let stream = self.gpu.stream.clone();
        let b = &mut self.buffers;
        for buf in [&mut b.dh, &mut b.dz2, &mut b.dz1] {
            stream.memcpy_htod(&vec![f32::NAN; buf.len()], buf)?;
        }
        self.launch_backward(batch)?;
        let get = |buf: &CudaSlice<f32>, per: usize| -> Result<Vec<f32>> {
            let mut v = stream.clone_dtoh(buf).context("cnn_backward failed")?;
            v.truncate(batch * per);
            Ok(v)
        };
        let b = &self.buffers;
        Ok((get(&b.dh, self.shape.fc)?, get(&b.dz2, self.sizes.z2)?, get(&b.dz1, self.shape.c1 * self.sizes.pix)?))
    }

    /// A CUDA graph of `launches` launches of one kernel (0 forward, 1 backward, 2 update) on the first
    /// `batch` images of the training split, for timing each kernel alone.
    pub fn kernel_graph(&mut self, kernel: usize, batch: usize, launches: usize) -> Result<cudarc::driver::CudaGraph> {
        self.ensure_capacity(batch)?;
        self.set_order(&(0..batch as u32).collect::<Vec<_>>())?;
        self.set_rates(&[self.optim.lr])?;
        self.enqueue_step(batch, 0, 0)?;
        let stream = self.gpu.stream.clone();
        crate::device::launch::capture_graph(&stream, self, |t| {
            for _ in 0..launches {
                match kernel {
                    0 => t.launch_forward(batch, 0)?,
                    1 => t.launch_backward(batch)?,
                    _ => t.launch_update(batch, 0, 0)?,
                }
            }
            Ok(())
        })
    }

    fn enqueue_steps(&mut self, samples: usize, batch: usize) -> Result<()> {
        let (mut offset, mut step) = (0, 0);
        while offset < samples {
            let b = batch.min(samples - offset);
            self.enqueue_step(b, offset, step)?;
            offset += b;
            step += 1;
        }
        Ok(())
    }

    /// Uploads `order` (indices into the training split) for the next steps.
    pub fn set_order(&mut self, order: &[u32]) -> Result<()> {
        if let Some(&bad) = order.iter().find(|&&i| i as usize >= self.train.len) {
            bail!("sample index {bad} is outside the training split ({} samples)", self.train.len);
        }
        if order.len() > self.order.len() {
            self.captured = None;
            self.order = self.gpu.stream.alloc_zeros::<u32>(order.len())?;
        }
        let mut view = self.order.slice_mut(..order.len());
        self.gpu.stream.memcpy_htod(order, &mut view).context("copying the sample order to the GPU")?;
        Ok(())
    }

    /// Uploads the learning rate of each of the next steps.
    pub fn set_rates(&mut self, rates: &[f32]) -> Result<()> {
        if rates.len() > self.rates.len() {
            self.captured = None;
            self.rates = self.gpu.stream.alloc_zeros::<f32>(rates.len())?;
        }
        let mut view = self.rates.slice_mut(..rates.len());
        self.gpu.stream.memcpy_htod(rates, &mut view).context("copying the learning rates to the GPU")?;
        Ok(())
    }

    /// One epoch over `order`, `batch` images a step, step k at learning rate `rates[k]`, as one CUDA
    /// graph (captured on the first epoch of this size). Returns the summed per-image loss.
    pub fn train_epoch(&mut self, order: &[u32], batch: usize, rates: &[f32]) -> Result<f64> {
        if batch == 0 {
            bail!("the batch size must be at least 1");
        }
        if rates.len() != order.len().div_ceil(batch) {
            bail!("internal: {} learning rates for {} steps", rates.len(), order.len().div_ceil(batch));
        }
        let batch = batch.min(order.len().max(1));
        self.ensure_capacity(batch)?;
        self.set_order(order)?;
        self.set_rates(rates)?;
        self.gpu.stream.memset_zeros(&mut self.loss_sum)?;
        let samples = order.len();
        let reuse = matches!(&self.captured, Some((s, b, _)) if *s == samples && *b == batch);
        if !reuse {
            self.captured = None;
            let stream = self.gpu.stream.clone();
            let graph = crate::device::launch::capture_graph(&stream, self, |t| t.enqueue_steps(samples, batch))?;
            self.captured = Some((samples, batch, graph));
        }
        let (_, _, graph) = self.captured.as_ref().expect("captured above");
        graph.launch().context("replaying the CNN training graph")?;
        let loss = self.gpu.stream.clone_dtoh(&self.loss_sum).context("a CNN training kernel failed")?;
        Ok(loss[0])
    }

    /// Loss and confusion matrix over the test split.
    pub fn evaluate(&mut self) -> Result<Evaluation> {
        let mut eval = Evaluation::new(self.shape.classes);
        let n = self.test.len;
        let mut first = 0;
        while first < n {
            let count = EVAL_CHUNK.min(n - first);
            self.ensure_capacity(count)?;
            let args = self.image_args(&self.test, first, count);
            self.launch_images(&self.kernels.evaluate, count, self.sizes.forward_shared, &args)?;
            let (g, b) = (&*self.gpu, &self.buffers);
            let loss = g.stream.clone_dtoh(&b.loss).context("a CNN evaluation kernel failed")?;
            let predicted = g.stream.clone_dtoh(&b.predicted)?;
            for k in 0..count {
                eval.loss += loss[k] as f64;
                eval.record(self.test_labels[first + k] as usize, predicted[k] as usize);
            }
            first += count;
        }
        Ok(eval)
    }

    /// The parameters, copied back from the GPU.
    pub fn cnn_params(&self) -> Result<CnnParams> {
        let flat = self.gpu.stream.clone_dtoh(&self.params).context("copying the model from the GPU")?;
        Ok(CnnParams { shape: self.shape, flat })
    }

    /// The last step's gradient.
    pub fn gradient(&self) -> Result<Vec<f32>> {
        self.gpu.stream.clone_dtoh(&self.grad).context("copying the gradient from the GPU")
    }

    /// Fills the gradient with NaN (the checks poison it before a step).
    pub fn poison_gradient(&mut self) -> Result<()> {
        let nan = vec![f32::NAN; self.grad.len()];
        self.gpu.stream.memcpy_htod(&nan, &mut self.grad)?;
        Ok(())
    }
}

impl crate::harness::run::Trainer for GpuCnn {
    type Params = super::Classifier;
    type Evaluation = Evaluation;

    fn train_epoch(
        &mut self,
        order: &[u32],
        batch: usize,
        rates: &[f32],
        progress: &mut dyn FnMut(usize, f64),
    ) -> Result<f64> {
        let loss = GpuCnn::train_epoch(self, order, batch, rates)?;
        progress(order.len(), loss);
        Ok(loss)
    }

    fn evaluate(&mut self, split: usize) -> Result<Evaluation> {
        super::test_split_only(split)?;
        GpuCnn::evaluate(self)
    }

    fn params(&mut self) -> Result<super::Classifier> {
        Ok(super::Classifier::Cnn(self.cnn_params()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::compile::kernel_constants;
    use crate::device::kernel_struct::assert_kernel_layout;

    #[test]
    fn the_argument_struct_is_the_kernel_files() {
        assert_kernel_layout::<CnnArgs>("mnist_cnn", &module_request(CnnShape::MNIST).1);
    }

    #[test]
    fn sizes_match_the_kernel_file() {
        let odd = CnnShape { side: 12, c1: 3, c2: 5, fc: 7, classes: 4 };
        for shape in [CnnShape::MNIST, odd] {
            let expressions =
                ["PIX", "P1", "Z2", "FLAT", "FORWARD_SHARED_FLOATS * 4", "BACKWARD_SHARED_FLOATS * 4", "SLICES"];
            let kernel = kernel_constants("mnist_cnn", &module_request(shape).1, &expressions).unwrap();
            let s = Sizes::of(shape);
            let mirror = [s.pix, s.p1, s.z2, s.flat, s.forward_shared, s.backward_shared, CONV_SLICES];
            assert_eq!(kernel, mirror.map(|v| v as i64), "{shape:?}");
        }
    }
}
