//! The sales trainer on the GPU (fused/sales.cu, whose header says why one block runs an epoch): the
//! splits are uploaded once, standardised on the device with statistics from its reduction kernels, and
//! an epoch is three launches (gather the shuffled rows, train every step, nothing else) and one 8-byte
//! read of the summed loss.

use super::data::{Dataset, Split, Stats};
use super::model::{Evaluation, SalesParams, SalesShape};
use super::train::SalesTrainer;
use crate::device::{Arg, Gpu, Kernel, ModuleRequest};
use crate::ops::optim::OptimConfig;
use anyhow::{Context, Result, bail};
use cudarc::driver::CudaSlice;
use std::sync::Arc;

const THREADS: usize = crate::device::THREADS_PER_BLOCK as usize;
/// Row chunks of the statistics' first kernel (grid: chunks × columns).
const STAT_CHUNKS: usize = 64;

/// Floats of dynamic shared memory of `sales_train_epoch`: parameters, two optimizer moments and each row
/// group's gradient (GROUPS × P), rounded to whole float4s, then two staged batches of rows padded to
/// whole float4s, and their targets (fused/sales.cu).
pub fn train_shared_floats(shape: SalesShape, batch: usize) -> usize {
    let SalesShape { inputs: n, hidden: h } = shape;
    let group = if h >= 32 { 32 } else { h.next_power_of_two() };
    let groups = THREADS / group;
    let p = shape.param_count();
    (3 * p + groups * p).div_ceil(4) * 4 + 2 * batch * (n.div_ceil(4) * 4 + 1)
}

struct Kernels {
    partials: Kernel,
    stats: Kernel,
    normalize: Kernel,
    gather: Kernel,
    train: Kernel,
    evaluate: Kernel,
}

/// The kernel module a trainer of `shape` compiles.
pub fn module_request(shape: SalesShape) -> ModuleRequest {
    ("sales", vec![("SALES_N", shape.inputs as i64), ("SALES_H", shape.hidden as i64)])
}

/// One split on the device: rows × features, and the target.
pub struct DeviceSplit {
    /// Features, rows × features, row-major.
    pub x: CudaSlice<f32>,
    /// The target of each row.
    pub y: CudaSlice<f32>,
    /// Number of rows.
    pub rows: usize,
}

impl DeviceSplit {
    fn upload(gpu: &Gpu, split: &Split) -> Result<DeviceSplit> {
        let stream = &gpu.stream;
        let room = "GPU out of memory for the table";
        Ok(DeviceSplit {
            x: stream.clone_htod(&pad(&split.x)).context(room)?,
            y: stream.clone_htod(&pad(&split.y)).context(room)?,
            rows: split.rows,
        })
    }
}

/// A device buffer may not be empty.
fn pad(v: &[f32]) -> Vec<f32> {
    if v.is_empty() { vec![0.0] } else { v.to_vec() }
}

fn grid(count: usize, gpu: &Gpu) -> u32 {
    count.div_ceil(THREADS).clamp(1, 4 * gpu.sm_count as usize) as u32
}

/// The regressor's trainer on a CUDA GPU: both splits, the parameters and the optimizer state in device memory.
pub struct GpuSales {
    gpu: Arc<Gpu>,
    kernels: Kernels,
    shape: SalesShape,
    optim: OptimConfig,
    stats: Stats,
    /// The training split.
    pub train: DeviceSplit,
    /// The test split.
    pub test: DeviceSplit,
    /// The current epoch's rows in training order.
    epoch: DeviceSplit,
    order: CudaSlice<u32>,
    params: CudaSlice<f32>,
    m: CudaSlice<f32>,
    v: CudaSlice<f32>,
    step: CudaSlice<u32>,
    loss_sum: CudaSlice<f64>,
    eval_partials: CudaSlice<f64>,
    eval_ticket: CudaSlice<u32>,
    eval_result: CudaSlice<f64>,
    /// The batch `sales_train_epoch` has opted in to shared memory for.
    reserved_batch: usize,
}

impl GpuSales {
    /// Uploads both splits of `data` (in the file's units), computes the training split's statistics on the
    /// GPU (unless `stats`, a resumed model's, are given) and standardises both splits with them there.
    pub fn new(
        gpu: Arc<Gpu>,
        data: &Dataset,
        params: SalesParams,
        optim: OptimConfig,
        stats: Option<Stats>,
    ) -> Result<GpuSales> {
        optim.validate()?;
        let shape = params.shape;
        shape.validate()?;
        if data.features() != shape.inputs {
            bail!("the model has {} inputs but the table gives {} features", shape.inputs, data.features());
        }
        if data.train.rows > i32::MAX as usize / shape.inputs.max(1) || data.test.rows > i32::MAX as usize {
            bail!("the table has more rows than the GPU kernels count to");
        }
        let module = gpu.module(&module_request(shape))?;
        let load = |name: &str| Gpu::function(&module, name);
        let kernels = Kernels {
            partials: load("sales_column_partials")?,
            stats: load("sales_column_stats")?,
            normalize: load("sales_normalize")?,
            gather: load("sales_gather")?,
            train: load("sales_train_epoch")?,
            evaluate: load("sales_evaluate")?,
        };
        gpu.reserve_shared(&kernels.evaluate, shape.param_count() * 4, "--hidden")?;
        let stream = gpu.stream.clone();
        let p = shape.param_count();
        let train = DeviceSplit::upload(&gpu, &data.train)?;
        let test = DeviceSplit::upload(&gpu, &data.test)?;
        let epoch = DeviceSplit {
            x: stream.alloc_zeros::<f32>(train.x.len())?,
            y: stream.alloc_zeros::<f32>(train.y.len())?,
            rows: train.rows,
        };
        let eval_blocks = grid(data.test.rows.max(data.train.rows), &gpu) as usize;
        let mut t = GpuSales {
            order: stream.alloc_zeros::<u32>(train.rows.max(1))?,
            params: stream.clone_htod(&params.flat).context("copying the model to the GPU")?,
            m: stream.alloc_zeros::<f32>(p)?,
            v: stream.alloc_zeros::<f32>(p)?,
            step: stream.alloc_zeros::<u32>(1)?,
            loss_sum: stream.alloc_zeros::<f64>(1)?,
            eval_partials: stream.alloc_zeros::<f64>(2 * eval_blocks)?,
            eval_ticket: stream.alloc_zeros::<u32>(1)?,
            eval_result: stream.alloc_zeros::<f64>(2)?,
            stats: Stats { feature_mean: vec![], feature_std: vec![], target_mean: 0.0, target_std: 1.0 },
            reserved_batch: 0,
            gpu,
            kernels,
            shape,
            optim,
            train,
            test,
            epoch,
        };
        t.stats = match stats {
            Some(stats) => stats,
            None => t.compute_stats()?,
        };
        for which in [true, false] {
            t.normalize(which)?;
        }
        Ok(t)
    }

    /// Mean and std of every column of the (raw) training split, by the two-pass reduction kernels.
    fn compute_stats(&mut self) -> Result<Stats> {
        let stream = self.gpu.stream.clone();
        let n = self.shape.inputs;
        let (rows, cols) = (self.train.rows as i32, n as i32);
        let partials = stream.alloc_zeros::<f64>(STAT_CHUNKS * (n + 1))?;
        let mean = stream.alloc_zeros::<f64>(n + 1)?;
        let mean_out = stream.clone_htod(&vec![f32::NAN; n + 1])?;
        let std_out = stream.clone_htod(&vec![f32::NAN; n + 1])?;
        let g = &*self.gpu;
        for pass in [1i32, 2] {
            // The first pass sums the values, the second their squared distances from the mean.
            let mean_in = if pass == 1 { Arg::Ptr(0) } else { Arg::buf(g, &mean) };
            let args = [Arg::buf(g, &self.train.x), Arg::buf(g, &self.train.y), Arg::i32(rows), Arg::i32(cols)];
            let args = [&args[..], &[mean_in, Arg::buf(g, &partials)]].concat();
            g.launch(&self.kernels.partials, (STAT_CHUNKS as u32, n as u32 + 1), 0, false, &args)?;
            let args = [
                Arg::buf(g, &partials),
                Arg::i32(STAT_CHUNKS as i32),
                Arg::i32(rows),
                Arg::i32(pass),
                Arg::buf(g, &mean),
                Arg::buf(g, &mean_out),
                Arg::buf(g, &std_out),
            ];
            g.launch(&self.kernels.stats, (n as u32 + 1, 1), 0, false, &args)?;
        }
        let mean = stream.clone_dtoh(&mean_out).context("sales statistics failed")?;
        let std = stream.clone_dtoh(&std_out)?;
        Ok(Stats {
            feature_mean: mean[..n].to_vec(),
            feature_std: std[..n].to_vec(),
            target_mean: mean[n],
            target_std: std[n],
        })
    }

    /// Standardises the training split (`train`) or the test split in place.
    fn normalize(&mut self, train: bool) -> Result<()> {
        let stream = self.gpu.stream.clone();
        let s = &self.stats;
        let mean: Vec<f32> = s.feature_mean.iter().copied().chain([s.target_mean]).collect();
        let std: Vec<f32> = s.feature_std.iter().copied().chain([s.target_std]).collect();
        let (mean, std) = (stream.clone_htod(&mean)?, stream.clone_htod(&std)?);
        let split = if train { &self.train } else { &self.test };
        let g = &*self.gpu;
        let blocks = grid(split.rows * (self.shape.inputs + 1), g);
        let args = [
            Arg::buf(g, &split.x),
            Arg::buf(g, &split.y),
            Arg::i32(split.rows as i32),
            Arg::i32(self.shape.inputs as i32),
            Arg::buf(g, &mean),
            Arg::buf(g, &std),
        ];
        g.launch(&self.kernels.normalize, (blocks, 1), 0, false, &args)
    }

    /// Host copies of a standardised split (the selftest compares them with the CPU's).
    pub fn download(&self, train: bool) -> Result<(Vec<f32>, Vec<f32>)> {
        let split = if train { &self.train } else { &self.test };
        let stream = &self.gpu.stream;
        let mut x = stream.clone_dtoh(&split.x).context("copying from the GPU")?;
        let mut y = stream.clone_dtoh(&split.y)?;
        x.truncate(split.rows * self.shape.inputs);
        y.truncate(split.rows);
        Ok((x, y))
    }

    /// Queues one epoch over `order`: the gather and the training kernel. The summed loss lands in
    /// `loss_sum`.
    pub fn enqueue_epoch(&mut self, order: &[u32], batch: usize) -> Result<()> {
        if batch == 0 || batch > i32::MAX as usize {
            bail!("the batch size must be at least 1");
        }
        if order.len() != self.train.rows {
            bail!("an epoch's order must list each of the {} training rows once, got {}", self.train.rows, order.len());
        }
        if let Some(&bad) = order.iter().find(|&&i| i as usize >= self.train.rows) {
            bail!("row index {bad} is outside the training split ({} rows)", self.train.rows);
        }
        let batch = batch.min(self.train.rows.max(1));
        let shared = train_shared_floats(self.shape, batch) * 4;
        if batch != self.reserved_batch {
            self.gpu.reserve_shared(&self.kernels.train, shared, "--batch or --hidden")?;
            self.reserved_batch = batch;
        }
        let stream = self.gpu.stream.clone();
        if self.train.rows == 0 {
            return Ok(());
        }
        stream.memcpy_htod(order, &mut self.order).context("copying the epoch's order to the GPU")?;
        let g = &*self.gpu;
        let rows = self.train.rows as i32;
        let blocks = grid(self.train.rows * self.shape.inputs, g);
        let args = [
            Arg::buf(g, &self.train.x),
            Arg::buf(g, &self.train.y),
            Arg::buf(g, &self.order),
            Arg::i32(rows),
            Arg::i32(self.shape.inputs as i32),
            Arg::buf(g, &self.epoch.x),
            Arg::buf(g, &self.epoch.y),
        ];
        g.launch(&self.kernels.gather, (blocks, 1), 0, false, &args)?;

        let o = self.optim;
        let args = [
            &[
                Arg::buf(g, &self.epoch.x),
                Arg::buf(g, &self.epoch.y),
                Arg::i32(rows),
                Arg::i32(batch as i32),
                Arg::buf(g, &self.params),
                Arg::buf(g, &self.m),
                Arg::buf(g, &self.v),
                Arg::buf(g, &self.step),
            ][..],
            &o.kernel_args(),
            &[Arg::buf(g, &self.loss_sum)],
        ]
        .concat();
        g.launch(&self.kernels.train, (1, 1), shared as u32, false, &args)
    }

    /// Squared- and absolute-error sums (standardised) of the model over a split.
    fn error_sums(&mut self, train: bool) -> Result<(f64, f64)> {
        let stream = self.gpu.stream.clone();
        stream.memcpy_htod(&[f64::NAN, f64::NAN], &mut self.eval_result)?;
        let split = if train { &self.train } else { &self.test };
        if split.rows == 0 {
            return Ok((0.0, 0.0));
        }
        let g = &*self.gpu;
        let args = [
            Arg::buf(g, &split.x),
            Arg::buf(g, &split.y),
            Arg::i32(split.rows as i32),
            Arg::buf(g, &self.params),
            Arg::buf(g, &self.eval_partials),
            Arg::buf(g, &self.eval_ticket),
            Arg::buf(g, &self.eval_result),
        ];
        let shared = (self.shape.param_count() * 4) as u32;
        g.launch(&self.kernels.evaluate, (grid(split.rows, g), 1), shared, false, &args)?;
        let sums = stream.clone_dtoh(&self.eval_result).context("sales_evaluate failed")?;
        Ok((sums[0], sums[1]))
    }

    /// The model on every row of the training split (standardised MSE, MAE in target units).
    pub fn evaluate_train(&mut self) -> Result<Evaluation> {
        let rows = self.train.rows;
        let (se, ae) = self.error_sums(true)?;
        Ok(self.evaluation(rows, se, ae))
    }

    fn evaluation(&self, rows: usize, se: f64, ae: f64) -> Evaluation {
        let n = rows.max(1) as f64;
        Evaluation { rows, mse: se / n, mae: ae / n * self.stats.target_std as f64 }
    }
}

impl SalesTrainer for GpuSales {
    fn stats(&self) -> &Stats {
        &self.stats
    }

    fn train_epoch(&mut self, order: &[u32], batch: usize) -> Result<f64> {
        self.gpu.stream.memcpy_htod(&[f64::NAN], &mut self.loss_sum)?;
        self.enqueue_epoch(order, batch)?;
        let loss = self.gpu.stream.clone_dtoh(&self.loss_sum).context("sales_train_epoch failed")?;
        Ok(if self.train.rows == 0 { 0.0 } else { loss[0] })
    }

    fn evaluate_test(&mut self) -> Result<Evaluation> {
        let rows = self.test.rows;
        let (se, ae) = self.error_sums(false)?;
        Ok(self.evaluation(rows, se, ae))
    }

    fn params(&mut self) -> Result<SalesParams> {
        let flat = self.gpu.stream.clone_dtoh(&self.params).context("copying the model from the GPU")?;
        Ok(SalesParams { shape: self.shape, flat })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::kernel_constants;

    #[test]
    fn sizes_match_the_kernel_file() {
        for (inputs, hidden, batch) in [(19, 32, 64), (3, 5, 7), (40, 100, 1), (1, 1, 256)] {
            let defines = [("SALES_N", inputs as i64), ("SALES_H", hidden as i64)];
            let expression = format!("PARTIAL_END + 2 * {batch} * (NP + 1)");
            let kernel = kernel_constants("sales", &defines, &["P", &expression]).unwrap();
            let shape = SalesShape { inputs, hidden };
            let mirror = [shape.param_count(), train_shared_floats(shape, batch)];
            assert_eq!(kernel, mirror.map(|v| v as i64), "N = {inputs}, H = {hidden}, B = {batch}");
        }
    }
}
