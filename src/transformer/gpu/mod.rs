//! The Transformer's GPU trainer: the kernels of fused/transformer.cu launched step after step, many
//! steps to a CUDA graph. Parameters, AdamW's moments, the training and validation ids and every
//! activation stay on the device; the host uploads each graph's batch offsets and reads its losses back.
//! This file holds the trainer, its buffers and what it offers; `step` the launches of one step.

mod step;

use super::data::Corpus;
use super::model::{Config, Layout};
use crate::device::{Arg, Gpu, Kernel, ModuleRequest, THREADS_PER_BLOCK};
use crate::ops::attention::AttentionSizes;
use crate::ops::gemm::tile_shared_floats;
use crate::ops::optim::OptimConfig;
use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaGraph, CudaSlice, DevicePtr};
use std::sync::Arc;

const THREADS: usize = THREADS_PER_BLOCK as usize;
const WARPS: usize = THREADS / 32;
/// The linear kernels' output tile (LIN_BM × LIN_BN × LIN_BK with a LIN_TM × LIN_TN register tile) and
/// weight-gradient tile (WG_BM = WG_BN = WG_BK, WG_TM = WG_TN) in fused/transformer.cu.
const LINEAR_TILE: [usize; 5] = [32, 64, 32, 2, 4];
const WG_TILE: usize = 32;
const WG_REGISTER_TILE: usize = 2;
/// gemm_tile's dynamic shared memory for the linear kernels: the larger of the two tiles'
/// (LIN_SHARED_FLOATS).
const LINEAR_SHARED_BYTES: usize = 4 * max(
    tile_shared_floats(LINEAR_TILE[0], LINEAR_TILE[1], LINEAR_TILE[2], LINEAR_TILE[3], LINEAR_TILE[4]),
    tile_shared_floats(WG_TILE, WG_TILE, WG_TILE, WG_REGISTER_TILE, WG_REGISTER_TILE),
);
/// Rows per block of tf_layernorm_backward (WARPS × LN_ROWS_PER_WARP).
const LN_ROWS_PER_BLOCK: usize = WARPS * 4;

const fn max(a: usize, b: usize) -> usize {
    if a > b { a } else { b }
}

struct Kernels {
    embed_layernorm: Kernel,
    residual_layernorm: Kernel,
    linear_forward: Kernel,
    attention_forward: Kernel,
    classifier: Kernel,
    linear_backward: Kernel,
    layernorm_backward: Kernel,
    attention_backward: Kernel,
    embedding_backward: Kernel,
    adamw: Kernel,
}

/// One block's saved activations over the N rows of a step.
struct BlockActs {
    x: CudaSlice<f32>,
    ln1: CudaSlice<f32>,
    ln1_stats: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    lse: CudaSlice<f32>,
    y: CudaSlice<f32>,
    attn_out: CudaSlice<f32>,
    x_attn: CudaSlice<f32>,
    ln2: CudaSlice<f32>,
    ln2_stats: CudaSlice<f32>,
    u: CudaSlice<f32>,
    gelu: CudaSlice<f32>,
    mlp_out: CudaSlice<f32>,
}

/// Activations and gradients of one step of `batch` sequences.
struct StepBuffers {
    batch: usize,
    blocks: Vec<BlockActs>,
    x_final: CudaSlice<f32>,
    lnf: CudaSlice<f32>,
    lnf_stats: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    row_loss: CudaSlice<f32>,
    d_res: CudaSlice<f32>,
    d_ln: CudaSlice<f32>,
    d_u: CudaSlice<f32>,
    d_y: CudaSlice<f32>,
    d_qkv: CudaSlice<f32>,
    linear_partials: CudaSlice<f32>,
    linear_tickets: CudaSlice<u32>,
    ln_partials: CudaSlice<f32>,
    /// tf_attention_backward's dq shares (one N × C per key chunk) and a ticket per (sequence, head).
    dq_part: CudaSlice<f32>,
    attention_tickets: CudaSlice<u32>,
}

/// The kernel module a trainer of `config` compiles.
pub fn module_request(config: &Config) -> ModuleRequest {
    let defines = [("TF_C", config.embed), ("TF_HS", config.head_size()), ("TF_T", config.block)];
    ("transformer", defines.map(|(name, value)| (name, value as i64)).to_vec())
}

/// What a GPU forward pass of one batch left, as `model::Forward` lays it out (for the kernel checks).
#[derive(Debug, Default)]
pub struct ForwardOut {
    /// Each block's residual stream entering it, `[B·T][C]`.
    pub x: Vec<Vec<f32>>,
    /// Each block's LN1 output, `[B·T][C]`.
    pub ln1: Vec<Vec<f32>>,
    /// Each block's q, k, v, `[B·T][3C]`.
    pub qkv: Vec<Vec<f32>>,
    /// Each block's attention heads' outputs before the projection, `[B·T][C]`.
    pub y: Vec<Vec<f32>>,
    /// Each block's residual stream after attention, `[B·T][C]`.
    pub x_attn: Vec<Vec<f32>>,
    /// Each block's LN2 output, `[B·T][C]`.
    pub ln2: Vec<Vec<f32>>,
    /// Each block's MLP pre-activation, `[B·T][F]`.
    pub u: Vec<Vec<f32>>,
    /// Each block's GELU output, `[B·T][F]`.
    pub gelu: Vec<Vec<f32>>,
    /// The final LayerNorm's output, `[B·T][C]`.
    pub xf: Vec<f32>,
    /// (softmax − onehot)/N after the classifier.
    pub d_logits: Vec<f32>,
    /// Loss at each position, `[B·T]`.
    pub losses: Vec<f32>,
}

/// The Transformer's trainer on a CUDA GPU: parameters, optimizer state and corpus in device memory.
pub struct GpuTransformer {
    gpu: Arc<Gpu>,
    /// The model's sizes.
    pub config: Config,
    layout: Layout,
    optim: OptimConfig,
    kernels: Kernels,
    attention_forward_shared: usize,
    attention_backward_shared: usize,
    params: CudaSlice<f32>,
    grad: CudaSlice<f32>,
    m: CudaSlice<f32>,
    v: CudaSlice<f32>,
    step: CudaSlice<u32>,
    tickets: CudaSlice<u32>,
    train: CudaSlice<u32>,
    val: CudaSlice<u32>,
    n_train: usize,
    /// Batch offsets of the steps of one graph, `batch` per step.
    offsets: CudaSlice<u32>,
    /// The summed loss of each step of a graph (a step's rows added in order).
    losses: CudaSlice<f64>,
    buffers: StepBuffers,
    /// (steps, batch) and the graph of that many steps.
    captured: Option<(usize, usize, CudaGraph)>,
    /// The linear layers' products on the tensor cores (TF32).
    tf32: bool,
}

/// Tickets: one for the classifier, one for layernorm_backward, one for AdamW, then the linear tiles'.
const TICKET_CLASSIFIER: usize = 0;
const TICKET_LAYERNORM: usize = 1;
const TICKET_ADAMW: usize = 2;

impl GpuTransformer {
    /// Uploads `params` (flat, in `Layout` order) and `corpus` to `gpu` and loads the kernels for `config`.
    pub fn new(
        gpu: Arc<Gpu>,
        config: Config,
        params: &[f32],
        optim: OptimConfig,
        corpus: &Corpus,
    ) -> Result<GpuTransformer> {
        config.validate()?;
        optim.validate()?;
        if !config.embed.is_multiple_of(32) {
            bail!("the GPU trainer needs --embed to be a multiple of 32, got {}", config.embed);
        }
        let layout = Layout::new(&config);
        if params.len() != layout.len() {
            bail!("internal: {} parameters for a model of {}", params.len(), layout.len());
        }
        let module = gpu.module(&module_request(&config))?;
        let load = |name: &str| Gpu::function(&module, name);
        let kernels = Kernels {
            embed_layernorm: load("tf_embed_layernorm")?,
            residual_layernorm: load("tf_residual_layernorm")?,
            linear_forward: load("tf_linear_forward")?,
            attention_forward: load("tf_attention_forward")?,
            classifier: load("tf_classifier")?,
            linear_backward: load("tf_linear_backward")?,
            layernorm_backward: load("tf_layernorm_backward")?,
            attention_backward: load("tf_attention_backward")?,
            embedding_backward: load("tf_embedding_backward")?,
            adamw: load("tf_adamw")?,
        };
        let sizes = AttentionSizes { t: config.block, hs: config.head_size(), warps: WARPS };
        let attention_forward_shared = 4 * sizes.forward_floats();
        let attention_backward_shared = 4 * sizes.backward_floats();
        gpu.reserve_shared(&kernels.attention_forward, attention_forward_shared, "--block")?;
        gpu.reserve_shared(&kernels.attention_backward, attention_backward_shared, "--block")?;
        gpu.reserve_shared(&kernels.linear_forward, LINEAR_SHARED_BYTES, "--embed")?;
        gpu.reserve_shared(&kernels.linear_backward, LINEAR_SHARED_BYTES, "--embed")?;
        let stream = gpu.stream.clone();
        let n = layout.len();
        let upload_f32 = |v: &[f32]| -> Result<CudaSlice<f32>> { Ok(stream.clone_htod(v)?) };
        let buffers = Self::alloc_buffers(&gpu, &config, 1)?;
        Ok(GpuTransformer {
            params: upload_f32(params)?,
            grad: stream.alloc_zeros(n)?,
            m: stream.alloc_zeros(n)?,
            v: stream.alloc_zeros(n)?,
            step: stream.alloc_zeros(1)?,
            tickets: stream.alloc_zeros(3)?,
            train: stream.clone_htod(&corpus.train)?,
            val: stream.clone_htod(&corpus.val)?,
            n_train: corpus.train.len(),
            offsets: stream.alloc_zeros(1)?,
            losses: stream.alloc_zeros(1)?,
            buffers,
            captured: None,
            tf32: false,
            attention_forward_shared,
            attention_backward_shared,
            kernels,
            layout,
            optim,
            config,
            gpu,
        })
    }

    fn alloc_buffers(gpu: &Gpu, c: &Config, batch: usize) -> Result<StepBuffers> {
        let s = &gpu.stream;
        let rows = batch * c.block;
        let (e, f, v) = (c.embed, c.ffn(), c.vocab);
        let z = |len: usize| -> Result<CudaSlice<f32>> { Ok(s.alloc_zeros::<f32>(len.max(1))?) };
        let mut blocks = Vec::with_capacity(c.layers);
        for _ in 0..c.layers {
            blocks.push(BlockActs {
                x: z(rows * e)?,
                ln1: z(rows * e)?,
                ln1_stats: z(2 * rows)?,
                qkv: z(rows * 3 * e)?,
                lse: z(batch * c.heads * c.block)?,
                y: z(rows * e)?,
                attn_out: z(rows * e)?,
                x_attn: z(rows * e)?,
                ln2: z(rows * e)?,
                ln2_stats: z(2 * rows)?,
                u: z(rows * f)?,
                gelu: z(rows * f)?,
                mlp_out: z(rows * e)?,
            });
        }
        // The largest linear backward: its weight-gradient tiles, and those times their row slices.
        let tiles: Vec<usize> = [(3 * e, e), (e, e), (f, e), (e, f), (v, e)]
            .iter()
            .map(|&(o, i)| o.div_ceil(WG_TILE) * (i + 1).div_ceil(WG_TILE))
            .collect();
        let max_tiles = tiles.iter().copied().max().unwrap_or(1);
        let max_blocks = tiles.iter().map(|&t| t * Self::slices(gpu, t, rows)).max().unwrap_or(1);
        Ok(StepBuffers {
            batch,
            blocks,
            x_final: z(rows * e)?,
            lnf: z(rows * e)?,
            lnf_stats: z(2 * rows)?,
            logits: z(rows * v)?,
            row_loss: z(rows)?,
            d_res: z(rows * e)?,
            d_ln: z(rows * e)?,
            d_u: z(rows * f)?,
            d_y: z(rows * e)?,
            d_qkv: z(rows * 3 * e)?,
            linear_partials: z(max_blocks * WG_TILE * WG_TILE)?,
            linear_tickets: s.alloc_zeros(max_tiles)?,
            ln_partials: z(rows.div_ceil(LN_ROWS_PER_BLOCK) * 2 * e)?,
            dq_part: z(Self::key_chunks(c) * rows * e)?,
            attention_tickets: s.alloc_zeros(batch * c.heads)?,
        })
    }

    fn key_chunks(c: &Config) -> usize {
        c.block.div_ceil(AttentionSizes { t: c.block, hs: c.head_size(), warps: WARPS }.key_chunk())
    }

    /// Row slices per weight-gradient tile: about two blocks per SM over all tiles, each slice at least
    /// 32 rows.
    fn slices(gpu: &Gpu, tiles: usize, rows: usize) -> usize {
        (2 * gpu.sm_count as usize).div_ceil(tiles.max(1)).clamp(1, rows.div_ceil(32).max(1))
    }

    /// Runs the linear layers' products on the tensor cores in TF32 (operands rounded to a 10-bit
    /// mantissa, fp32 accumulation), or in fp32 (the default).
    pub fn set_tf32(&mut self, on: bool) {
        if self.tf32 != on {
            self.captured = None;
            self.tf32 = on;
        }
    }

    fn ensure_batch(&mut self, batch: usize) -> Result<()> {
        if self.buffers.batch != batch {
            // tf_embedding_backward stages the step's tokens in shared memory.
            self.gpu.reserve_shared(
                &self.kernels.embedding_backward,
                4 * batch * self.config.block,
                "--batch or --block",
            )?;
            self.captured = None;
            self.buffers = Self::alloc_buffers(&self.gpu, &self.config, batch)?;
        }
        Ok(())
    }

    fn ptr<T>(&self, slice: &CudaSlice<T>) -> u64 {
        let (p, _) = slice.device_ptr(&self.gpu.stream);
        p
    }

    /// Parameter tensor `name` (or its gradient) as a kernel argument.
    fn tensor(&self, of: &CudaSlice<f32>, name: &str) -> Arg {
        let t = self.layout.get(name).unwrap_or_else(|| panic!("internal: no tensor {name}"));
        Arg::Ptr(self.ptr(of) + 4 * t.offset as u64)
    }

    fn param(&self, name: &str) -> Arg {
        self.tensor(&self.params, name)
    }

    fn grad_of(&self, name: &str) -> Arg {
        self.tensor(&self.grad, name)
    }

    fn buf<T>(&self, slice: &CudaSlice<T>) -> Arg {
        Arg::Ptr(self.ptr(slice))
    }

    fn rows(&self) -> usize {
        self.buffers.batch * self.config.block
    }

    fn launch(&self, kernel: &Kernel, blocks: usize, shared: usize, args: &[Arg]) -> Result<()> {
        self.gpu.launch(kernel, (blocks as u32, 1), shared as u32, false, args)
    }

    fn check_offsets(&self, offsets: &[u32], len: usize, what: &str) -> Result<()> {
        let limit = len.saturating_sub(self.config.block + 1);
        if let Some(&bad) = offsets.iter().find(|&&o| o as usize > limit) {
            bail!("internal: {what} offset {bad} is past {limit}");
        }
        Ok(())
    }

    /// Captures the CUDA graph of `steps` training steps of `batch` sequences (`train_steps` does it on
    /// first use; a bench calls it first so that the capture is not timed).
    pub fn prepare(&mut self, steps: usize, batch: usize) -> Result<()> {
        self.ensure_batch(batch)?;
        if self.offsets.len() < steps * batch || self.losses.len() < steps {
            self.captured = None;
            self.offsets = self.gpu.stream.alloc_zeros(steps * batch)?;
            self.losses = self.gpu.stream.alloc_zeros(steps)?;
        }
        if !matches!(&self.captured, Some((s, b, _)) if *s == steps && *b == batch) {
            self.captured = None;
            let stream = self.gpu.stream.clone();
            let graph = crate::device::capture_graph(&stream, self, |t| {
                for s in 0..steps {
                    let offsets = Arg::Ptr(t.ptr(&t.offsets) + 4 * (s * batch) as u64);
                    let loss = Arg::Ptr(t.ptr(&t.losses) + 8 * s as u64);
                    t.enqueue_step(offsets, loss)?;
                }
                Ok(())
            })?;
            self.captured = Some((steps, batch, graph));
        }
        Ok(())
    }

    /// Trains len(offsets) / batch steps (the offsets of step s at [s·batch, (s+1)·batch)) as one CUDA
    /// graph, captured on first use for this many steps. Returns each step's mean loss.
    pub fn train_steps(&mut self, offsets: &[u32], batch: usize) -> Result<Vec<f64>> {
        if batch == 0 || offsets.is_empty() || !offsets.len().is_multiple_of(batch) {
            bail!("internal: {} offsets for batch {batch}", offsets.len());
        }
        self.check_offsets(offsets, self.n_train, "training")?;
        let steps = offsets.len() / batch;
        self.prepare(steps, batch)?;
        let stream = self.gpu.stream.clone();
        let mut view = self.offsets.slice_mut(..offsets.len());
        stream.memcpy_htod(offsets, &mut view).context("copying batch offsets to the GPU")?;
        stream.memset_zeros(&mut self.losses)?;
        let (_, _, graph) = self.captured.as_ref().expect("captured above");
        graph.launch().context("replaying the Transformer's training graph")?;
        let sums = stream.clone_dtoh(&self.losses).context("a Transformer training kernel failed")?;
        let rows = (batch * self.config.block) as f64;
        Ok(sums[..steps].iter().map(|s| s / rows).collect())
    }

    /// Mean loss over the validation windows at `offsets`, `batch` windows at a time (the last batch may
    /// hold fewer).
    pub fn val_loss(&mut self, offsets: &[u32], batch: usize) -> Result<f64> {
        self.check_offsets(offsets, self.val.len(), "validation")?;
        self.ensure_batch(batch)?;
        let stream = self.gpu.stream.clone();
        let sum_dev: CudaSlice<f64> = stream.alloc_zeros(1)?;
        let mut window_offsets: CudaSlice<u32> = stream.alloc_zeros(batch)?;
        let mut rows = 0usize;
        for chunk in offsets.chunks(batch) {
            // A short last chunk repeats its first window to fill the batch; only its own rows count.
            let mut padded = chunk.to_vec();
            padded.resize(batch, chunk[0]);
            stream.memcpy_htod(&padded, &mut window_offsets)?;
            let counted = chunk.len() * self.config.block;
            self.enqueue_forward(self.buf(&self.val), self.buf(&window_offsets), 0.0, counted, self.buf(&sum_dev))?;
            rows += counted;
        }
        let sum = stream.clone_dtoh(&sum_dev).context("a Transformer evaluation kernel failed")?;
        Ok(sum[0] / rows.max(1) as f64)
    }

    /// The parameters, copied back.
    pub fn params(&self) -> Result<Vec<f32>> {
        Ok(self.gpu.stream.clone_dtoh(&self.params)?)
    }

    /// The gradient of the last step.
    pub fn gradient(&self) -> Result<Vec<f32>> {
        Ok(self.gpu.stream.clone_dtoh(&self.grad)?)
    }

    /// Forward and backward of one training batch (offsets into the training ids), no update, every
    /// output poisoned with NaN first: what the kernel checks compare with `model::forward` / `backward`.
    pub fn forward_backward_alone(&mut self, offsets: &[u32]) -> Result<ForwardOut> {
        let batch = offsets.len();
        self.check_offsets(offsets, self.n_train, "training")?;
        self.ensure_batch(batch)?;
        let stream = self.gpu.stream.clone();
        let poison =
            |buf: &mut CudaSlice<f32>| -> Result<()> { Ok(stream.memcpy_htod(&vec![f32::NAN; buf.len()], buf)?) };
        {
            let b = &mut self.buffers;
            for a in &mut b.blocks {
                for buf in
                    [&mut a.x, &mut a.ln1, &mut a.qkv, &mut a.y, &mut a.x_attn, &mut a.ln2, &mut a.u, &mut a.gelu]
                {
                    poison(buf)?;
                }
            }
            for buf in [&mut b.lnf, &mut b.logits, &mut b.row_loss, &mut b.d_res] {
                poison(buf)?;
            }
        }
        poison(&mut self.grad)?;
        let dev_offsets: CudaSlice<u32> = stream.clone_htod(offsets)?;
        let sum: CudaSlice<f64> = stream.alloc_zeros(1)?;
        let scale = 1.0 / self.rows() as f32;
        self.enqueue_forward(self.buf(&self.train), self.buf(&dev_offsets), scale, self.rows(), self.buf(&sum))?;
        let get = |buf: &CudaSlice<f32>| -> Result<Vec<f32>> {
            stream.clone_dtoh(buf).context("a Transformer forward kernel failed")
        };
        let b = &self.buffers;
        let mut out = ForwardOut::default();
        for a in &b.blocks {
            out.x.push(get(&a.x)?);
            out.ln1.push(get(&a.ln1)?);
            out.qkv.push(get(&a.qkv)?);
            out.y.push(get(&a.y)?);
            out.x_attn.push(get(&a.x_attn)?);
            out.ln2.push(get(&a.ln2)?);
            out.u.push(get(&a.u)?);
            out.gelu.push(get(&a.gelu)?);
        }
        out.xf = get(&b.lnf)?;
        out.d_logits = get(&b.logits)?;
        out.losses = get(&b.row_loss)?;
        self.enqueue_backward(self.buf(&dev_offsets))?;
        stream.synchronize().context("a Transformer backward kernel failed")?;
        Ok(out)
    }

    /// The residual stream's gradient left by the last backward pass (d of the embeddings' sum).
    pub fn embedding_sum_gradient(&self) -> Result<Vec<f32>> {
        Ok(self.gpu.stream.clone_dtoh(&self.buffers.d_res)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::kernel_constants;

    #[test]
    fn sizes_match_the_kernel_file() {
        let names = ["LIN_BM", "LIN_BN", "LIN_BK", "LIN_TM", "LIN_TN", "WG_BM", "WG_BN", "WG_BK", "WG_TM", "WG_TN"];
        let mut expressions = names.to_vec();
        expressions.extend(["LIN_SHARED_FLOATS * 4", "WARPS * LN_ROWS_PER_WARP"]);
        let kernel = kernel_constants("transformer", &[], &expressions).unwrap();
        let [bm, bn, bk, tm, tn] = LINEAR_TILE;
        let (wg, wt) = (WG_TILE, WG_REGISTER_TILE);
        let mirror = [bm, bn, bk, tm, tn, wg, wg, wg, wt, wt, LINEAR_SHARED_BYTES, LN_ROWS_PER_BLOCK];
        assert_eq!(kernel, mirror.map(|v| v as i64));
    }
}
