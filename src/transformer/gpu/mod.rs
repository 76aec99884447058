//! The Transformer's GPU trainer: the kernels of fused/transformer.cu launched step after step, many
//! steps to a CUDA graph. Parameters, AdamW's moments, the training and validation ids and every
//! activation stay on the device; the host uploads each graph's batch offsets and reads its losses back.
//! This file holds the trainer, its buffers and what it offers; `step` the launches of one step.
//!
//! The kernels take their buffers as parameters, not as one struct of the step's buffers as the text
//! kernels take `TextBuffers`: the compiler gives `__restrict__` its meaning on parameters only, and these
//! kernels' code rests on it. With their buffers in a struct (compute_90a, TF_C=384 TF_HS=64 TF_T=256;
//! ld.global.nc / other ld.global / st.global / instructions), tf_adamw's loop lost its four-way unrolling
//! (14/19/22/639 -> 2/3/4/302, and 5/10/14/415 with only the step count, ticket, clipping factor and bf16
//! copy in the struct); tf_embed_layernorm (72/1/50/724 -> 50/1/38/806) and tf_embedding_backward
//! (31/8/14/912 -> 11/8/4/579) lost the versions of their loops that `__ldg`, inline assembly, is not
//! copied into. Their read-only buffers as parameters again brought those loads back, leaving the struct
//! only their outputs; tf_classifier kept its code but would move three pointers of twelve arguments.
//! tf_layernorm_backward and tf_linear_backward_bf16 run once per LayerNorm and per linear layer on that
//! layer's buffers, and their loads sit in fused/layernorm.cuh (shared with fused/nn.cu) and the gemm
//! headers, which would need `__ldg` of their own to keep them.

pub mod flash;
pub mod parallel;
mod step;
mod update;

use parallel::Shard;

use super::data::Corpus;
use super::model::{Config, Layout};
use crate::device::kernel_struct::{Address, DropoutArgs};
use crate::device::launch::StructArg;
use crate::device::precision::Precision;
use crate::device::tma::{TmaOperand, TmaTile};
use crate::device::{Gpu, compile::ModuleRequest, compile::has_wgmma, launch::Arg, launch::Kernel};
use crate::ops::THREADS_PER_BLOCK;
use crate::ops::attention::AttentionSizes;
use crate::ops::dropout::{micro_seed, site_seed};
use crate::ops::gemm::{G128_STAGED_FLOATS, bf16_tile_shared_floats, tile_shared_floats};
use crate::ops::optim::OptimConfig;
use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaGraph, CudaModule, CudaSlice, DevicePtr};
use flash::{FlashAttention, FlashSizes};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

const THREADS: usize = THREADS_PER_BLOCK as usize;
const WARPS: usize = THREADS / 32;
/// The linear kernels' tiles at one precision (`LinearTiles<P>` and `Wgrad<P>` in fused/transformer.cu):
/// forward and dx tiles of bm rows × bn columns, weight-gradient tiles of wg_bm × wg_bn over row slices (the
/// bias gradient from a column of ones after the input's, or from dy's chunks as the first column of tiles
/// reads them), and the dynamic shared memory of either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LinearTiles {
    bm: usize,
    bn: usize,
    wg_bm: usize,
    wg_bn: usize,
    ones_column: bool,
    shared_bytes: usize,
}

/// fp32: gemm_128's 128 × 128 for all three products, the bias gradient summed from dy's staged chunks.
const FP32_TILES: LinearTiles = LinearTiles {
    bm: 128,
    bn: 128,
    wg_bm: 128,
    wg_bn: 128,
    ones_column: false,
    shared_bytes: 4 * 2 * G128_STAGED_FLOATS,
};

/// TF32, and fp32 in steps too small for gemm_128 (`GpuTransformer::small_tiles`): gemm_tile_tf32's or
/// gemm_tile's 32 × 64 (forward, dx) and 32 × 32 (weight gradients), k chunks of 32.
const SMALL_TILES: LinearTiles = LinearTiles {
    bm: 32,
    bn: 64,
    wg_bm: 32,
    wg_bn: 32,
    ones_column: true,
    shared_bytes: 4 * max(tile_shared_floats(32, 64, 32, 2, 4), tile_shared_floats(32, 32, 32, 2, 2)),
};

/// bf16: 128 × 128 for all three products, gemm_tile_bf16_wgmma's three stages of 64 k where the kernels
/// have `wgmma` (`device::compile::has_wgmma`), else gemm_tile_bf16_async's four stages of 32 k.
const fn bf16_tiles(wgmma: bool) -> LinearTiles {
    let shared_bytes = 4 * bf16_tile_shared_floats(wgmma);
    LinearTiles { bm: 128, bn: 128, wg_bm: 128, wg_bn: 128, ones_column: false, shared_bytes }
}

impl LinearTiles {
    /// The tiles at `precision` on a GPU with `wgmma` or without; `small`: fp32 on the small tiles.
    fn of(precision: Precision, wgmma: bool, small: bool) -> LinearTiles {
        match precision {
            Precision::Fp32 if small => SMALL_TILES,
            Precision::Fp32 => FP32_TILES,
            Precision::Tf32 => SMALL_TILES,
            Precision::Bf16 => bf16_tiles(wgmma),
        }
    }

    /// Weight-gradient tiles of a layer of `out_features` × `in_features` (and its ones column).
    fn wgrad_tiles(&self, out_features: usize, in_features: usize) -> usize {
        out_features.div_ceil(self.wg_bm) * (in_features + self.ones_column as usize).div_ceil(self.wg_bn)
    }

    /// Tiles of a forward product of `rows` rows into `out_features` columns.
    fn forward_tiles(&self, rows: usize, out_features: usize) -> usize {
        rows.div_ceil(self.bm) * out_features.div_ceil(self.bn)
    }

    /// Floats of partial sums a weight gradient of `tiles` tiles in `slices` row slices leaves: each block's
    /// tile, and without the ones column a bias sum per block of the first column of tiles.
    fn partial_floats(&self, out_features: usize, tiles: usize, slices: usize) -> usize {
        let bias = if self.ones_column { 0 } else { out_features.div_ceil(self.wg_bm) * slices * self.wg_bm };
        tiles * slices * self.wg_bm * self.wg_bn + bias
    }
}
/// Rows of a step an SM from which the fp32 products take gemm_128's 128 × 128 tiles (half a row tile an
/// SM; the default model's 2048 rows on 132 SMs take the small tiles: 0.43 ms a step against 0.76).
const LARGE_TILE_ROWS_PER_SM: usize = 64;
/// Rows of a step per slice of tf_embedding_backward's token sums (EMB_SLICE_ROWS).
const EMBEDDING_SLICE_ROWS: usize = 512;
/// Rows per warp of tf_layernorm_backward: 8 once that still gives a block an SM (nanoGPT's 16384 rows:
/// 8.91 ms a step against 9.27 at 4), else 4 (the default model's 2048 rows: 0.395 ms against 0.400 at 8).
fn ln_rows_per_warp(rows: usize, sm_count: usize) -> usize {
    if rows >= WARPS * 8 * sm_count { 8 } else { 4 }
}

const fn max(a: usize, b: usize) -> usize {
    if a > b { a } else { b }
}

struct Kernels {
    embed_layernorm: Kernel,
    residual_layernorm: Kernel,
    linear_forward: Kernel,
    linear_forward_small: Kernel,
    linear_forward_halves: Kernel,
    linear_forward_bf16: Kernel,
    attention_forward: Kernel,
    classifier: Kernel,
    linear_backward: Kernel,
    linear_backward_small: Kernel,
    linear_backward_bf16: Kernel,
    layernorm_backward: Kernel,
    attention_backward: Kernel,
    embedding_backward: Kernel,
    dropout_backward: Kernel,
    grad_norm: Kernel,
    clip_scale: Kernel,
    adamw: Kernel,
    round_bf16: Kernel,
    accumulate: Kernel,
    /// tf_linear_forward_tma_128x128: the bf16 forward products on the TMA pipeline ([`TMA_TILE`]), where
    /// the GPU has `wgmma`, unless `TEXTNET_TMA=0`.
    linear_forward_tma: Option<Kernel>,
}

/// Which GEMMs a trainer's products run on where it has a choice: training keeps `Default`, the checks take
/// each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tiles {
    /// The trainer's own choice.
    Default,
    /// fp32 on gemm_128 whatever the size.
    Large,
    /// bf16 forward products on gemm_tile_bf16_wgmma rather than the TMA pipeline.
    NoTma,
}

/// An activation a linear layer reads: fp32 (the fp32 and TF32 products' operand), and its bf16 copy
/// (the bf16 products'). In bf16 the fp32 one is only written for the kernel checks.
struct Operand {
    fp32: CudaSlice<f32>,
    bf16: CudaSlice<u16>,
}

/// One block's saved activations over the N rows of a step.
struct BlockActs {
    x: CudaSlice<f32>,
    ln1: Operand,
    ln1_stats: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    lse: CudaSlice<f32>,
    y: Operand,
    attn_out: CudaSlice<f32>,
    x_attn: CudaSlice<f32>,
    ln2: Operand,
    ln2_stats: CudaSlice<f32>,
    u: CudaSlice<f32>,
    gelu: Operand,
    mlp_out: CudaSlice<f32>,
}

/// Activations and gradients of one step of `batch` sequences.
struct StepBuffers {
    batch: usize,
    blocks: Vec<BlockActs>,
    x_final: CudaSlice<f32>,
    lnf: Operand,
    lnf_stats: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    row_loss: CudaSlice<f32>,
    d_res: CudaSlice<f32>,
    d_ln: CudaSlice<f32>,
    d_u: CudaSlice<f32>,
    d_y: CudaSlice<f32>,
    d_qkv: CudaSlice<f32>,
    /// The bf16 products' dy operands: the logits' gradient (rows of `logits_ld`), a residual branch's
    /// gradient, the MLP's pre-activation gradient and dqkv.
    d_logits_bf16: CudaSlice<u16>,
    d_branch_bf16: CudaSlice<u16>,
    d_u_bf16: CudaSlice<u16>,
    d_qkv_bf16: CudaSlice<u16>,
    linear_partials: CudaSlice<f32>,
    /// A ticket per tile of the linear layers' weight gradients, or of the fp32 forward products in
    /// halves of k (`GpuTransformer::forward_halves`).
    linear_tickets: CudaSlice<u32>,
    /// The second half's tile of the fp32 forward products in halves of k (rows × the widest such layer).
    linear_other_half: CudaSlice<f32>,
    ln_partials: CudaSlice<f32>,
    /// tf_attention_backward's dq shares (one N × C per key chunk) and a ticket per (sequence, head).
    dq_part: CudaSlice<f32>,
    attention_tickets: CudaSlice<u32>,
    /// tf_embedding_backward's per-slice token sums (V × slices × C) and a ticket per token.
    embedding_partials: CudaSlice<f32>,
    embedding_tickets: CudaSlice<u32>,
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
    /// The parameters rounded to bf16, what the bf16 products read as weights: written by
    /// `set_precision` and then by every AdamW step in bf16.
    params_bf16: CudaSlice<u16>,
    /// Whether a bf16 forward pass also writes the fp32 activations `ForwardOut` reports (the checks').
    fp32_activations: bool,
    /// The products' GEMMs where there is a choice (the checks set them).
    tiles: Tiles,
    grad: CudaSlice<f32>,
    /// Micro-batches a step's gradient is summed over (--grad-accum), and the sum of a step's micro-batches
    /// before its last (allocated when there are more than one).
    grad_accum: usize,
    grad_sum: CudaSlice<f32>,
    /// The micro-batch of its step that the launches being enqueued are for: their dropout masks' seed.
    micro: Cell<usize>,
    /// AdamW's moments: of every parameter, or with ZeRO-1 of this replica's shard alone.
    m: CudaSlice<f32>,
    v: CudaSlice<f32>,
    /// ZeRO-1 (`set_zero`): the shard of the flat parameters whose update this replica makes; the
    /// parameters and the gradient are then padded to the ranks' shards (`Shard::padded`). None: every
    /// parameter's update, on every replica.
    shard: Option<Shard>,
    /// ‖grad‖₂² as tf_grad_norm leaves it: of this replica's shard under ZeRO-1, until the ranks' sum.
    norm_sq: CudaSlice<f64>,
    step: CudaSlice<u32>,
    tickets: CudaSlice<u32>,
    train: CudaSlice<u32>,
    val: CudaSlice<u32>,
    n_train: usize,
    /// Batch offsets of the steps of one graph, `batch` per micro-batch, `grad_accum` micro-batches a step.
    offsets: CudaSlice<u32>,
    /// The summed loss of each step of a graph (a step's rows added in order).
    losses: CudaSlice<f64>,
    buffers: StepBuffers,
    /// (steps, batch) and the graph of that many steps.
    captured: Option<(usize, usize, CudaGraph)>,
    /// The arithmetic of the linear layers' products and of attention.
    precision: Precision,
    /// The kernel module, and its bf16 attention kernels once `--precision bf16` asks for them.
    module: Arc<CudaModule>,
    flash: Option<FlashAttention>,
    /// Dropout's probability in training (0: none) and the seed of its masks.
    dropout: f32,
    dropout_seed: u32,
    /// The learning rate of each step of a graph.
    rates: CudaSlice<f32>,
    /// Clipping's factor of the current step, and tf_grad_norm's per-block partial sums.
    grad_scale: CudaSlice<f32>,
    norm_partials: CudaSlice<f64>,
    /// What the kernels read as the bias of a model without biases (zeros), and where they write its
    /// gradient (discarded): max(V, 4C) floats each.
    no_bias: CudaSlice<f32>,
    no_bias_grad: CudaSlice<f32>,
    /// With tied weights, the head's share of tok_emb's gradient, `[V][C]`, which tf_embedding_backward adds.
    head_grad: CudaSlice<f32>,
    /// The TMA products' tensor maps, each encoded once for its buffer, shape and box (a map is a function
    /// of those alone, so one stays valid while its buffer lives; graphs bake them in by value).
    tma_maps: Mutex<HashMap<TmaOperand, [u8; 128]>>,
}

/// The tile of the TMA products (fused/transformer.cu's TF_LINEAR_TMA): not `TmaTile::choose`'s pick, as
/// with the Transformer's epilogues the 128×256 tile ran 3–9× slower than 128×128 under ncu
/// (benches/results/2026-11-29-h200-5dec4ca/ncu.txt), where the bare product ran as fast; and with the
/// epilogue by rows, a larger tile's staged results would leave shared memory for one or two stages.
const TMA_TILE: TmaTile = TmaTile::M128N128;

/// Stages of the TMA products (fused/transformer.cu's TF_TMA_STAGES): fewer than `TMA_TILE.stages()`, as
/// each consumer's rows are staged after them for the epilogue by rows.
const TMA_STAGES: usize = 4;

/// Dynamic shared bytes of the TMA products (`TmaByRows<GemmTma<128, 128, TF_TMA_STAGES>>::SHARED_BYTES`):
/// the stages of 64 k, 1 KB of alignment, two mbarriers a stage, and each consumer's half of the tile in
/// fp32 rows of BN + 8.
fn tma_shared_bytes() -> usize {
    let (bm, bn) = TMA_TILE.shape();
    TMA_STAGES * (bm + bn) * 64 * 2 + 1024 + 2 * TMA_STAGES * 8 + bm * (bn + 8) * 4
}

/// Whether the bf16 forward products run on the TMA pipeline where the GPU has `wgmma`: unless
/// `TEXTNET_TMA=0` (read once). With their results by rows they are faster than gemm_tile_bf16_wgmma's in
/// the step (benches/results/2026-12-02-h200-ce2d60d). The dx products stay in tf_linear_backward_bf16 beside
/// the weight gradients' tiles: apart, on the TMA pipeline, the two launches took longer than the one.
fn tma_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os("TEXTNET_TMA").is_none_or(|v| v != "0"))
}

/// Tickets: one for the classifier, one for layernorm_backward, one for AdamW, then the linear tiles'.
const TICKET_CLASSIFIER: usize = 0;
const TICKET_LAYERNORM: usize = 1;
const TICKET_ADAMW: usize = 2;
const TICKET_NORM: usize = 3;

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
        let mut kernels = Kernels {
            embed_layernorm: load("tf_embed_layernorm")?,
            residual_layernorm: load("tf_residual_layernorm")?,
            linear_forward: load("tf_linear_forward")?,
            linear_forward_small: load("tf_linear_forward_small")?,
            linear_forward_halves: load("tf_linear_forward_halves")?,
            linear_forward_bf16: load("tf_linear_forward_bf16")?,
            attention_forward: load("tf_attention_forward")?,
            classifier: load("tf_classifier")?,
            linear_backward: load("tf_linear_backward")?,
            linear_backward_small: load("tf_linear_backward_small")?,
            linear_backward_bf16: load("tf_linear_backward_bf16")?,
            layernorm_backward: load("tf_layernorm_backward")?,
            attention_backward: load("tf_attention_backward")?,
            embedding_backward: load("tf_embedding_backward")?,
            dropout_backward: load("tf_dropout_backward")?,
            grad_norm: load("tf_grad_norm")?,
            clip_scale: load("tf_clip_scale")?,
            adamw: load("tf_adamw")?,
            round_bf16: load("tf_round_bf16")?,
            accumulate: load("tf_accumulate")?,
            linear_forward_tma: None,
        };
        if has_wgmma(gpu.compute_capability) && tma_enabled() {
            let (bm, bn) = TMA_TILE.shape();
            let kernel = load(&format!("tf_linear_forward_tma_{bm}x{bn}"))?;
            gpu.reserve_shared(&kernel, tma_shared_bytes(), "--embed")?;
            kernels.linear_forward_tma = Some(kernel);
        }
        let sizes = AttentionSizes { t: config.block, hs: config.head_size(), warps: WARPS };
        let attention_forward_shared = 4 * sizes.forward_floats();
        let attention_backward_shared = 4 * sizes.backward_floats();
        gpu.reserve_shared(&kernels.attention_forward, attention_forward_shared, "--block")?;
        gpu.reserve_shared(&kernels.attention_backward, attention_backward_shared, "--block")?;
        gpu.reserve_shared(&kernels.linear_forward, FP32_TILES.shared_bytes, "--embed")?;
        gpu.reserve_shared(&kernels.linear_forward_halves, FP32_TILES.shared_bytes, "--embed")?;
        gpu.reserve_shared(&kernels.linear_backward, FP32_TILES.shared_bytes, "--embed")?;
        gpu.reserve_shared(&kernels.linear_forward_small, SMALL_TILES.shared_bytes, "--embed")?;
        gpu.reserve_shared(&kernels.linear_backward_small, SMALL_TILES.shared_bytes, "--embed")?;
        let bf16 = bf16_tiles(has_wgmma(gpu.compute_capability));
        gpu.reserve_shared(&kernels.linear_forward_bf16, bf16.shared_bytes, "--embed")?;
        gpu.reserve_shared(&kernels.linear_backward_bf16, bf16.shared_bytes, "--embed")?;
        let stream = gpu.stream.clone();
        let n = layout.len();
        let upload_f32 = |v: &[f32]| -> Result<CudaSlice<f32>> { Ok(stream.clone_htod(v)?) };
        let buffers = Self::alloc_buffers(&gpu, &config, 1)?;
        Ok(GpuTransformer {
            params: upload_f32(params)?,
            params_bf16: stream.alloc_zeros(n)?,
            fp32_activations: false,
            tiles: Tiles::Default,
            grad: stream.alloc_zeros(n)?,
            grad_accum: 1,
            grad_sum: stream.alloc_zeros(1)?,
            micro: Cell::new(0),
            m: stream.alloc_zeros(n)?,
            v: stream.alloc_zeros(n)?,
            shard: None,
            norm_sq: stream.alloc_zeros(1)?,
            step: stream.alloc_zeros(1)?,
            tickets: stream.alloc_zeros(4)?,
            train: stream.clone_htod(&corpus.train)?,
            val: stream.clone_htod(&corpus.val)?,
            n_train: corpus.train.len(),
            offsets: stream.alloc_zeros(1)?,
            losses: stream.alloc_zeros(1)?,
            buffers,
            captured: None,
            precision: Precision::Fp32,
            module,
            flash: None,
            dropout: 0.0,
            dropout_seed: 0,
            rates: stream.alloc_zeros(1)?,
            grad_scale: stream.clone_htod(&[1.0f32])?,
            norm_partials: stream.alloc_zeros(Self::norm_blocks(&gpu, n))?,
            no_bias: stream.alloc_zeros(config.vocab.max(config.ffn()))?,
            no_bias_grad: stream.alloc_zeros(config.vocab.max(config.ffn()))?,
            head_grad: stream.alloc_zeros(if config.tie_weights { config.vocab * config.embed } else { 1 })?,
            tma_maps: Mutex::new(HashMap::new()),
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
        let h = |len: usize| -> Result<CudaSlice<u16>> { Ok(s.alloc_zeros::<u16>(len.max(1))?) };
        let operand = |len: usize| -> Result<Operand> { Ok(Operand { fp32: z(len)?, bf16: h(len)? }) };
        let mut blocks = Vec::with_capacity(c.layers);
        for _ in 0..c.layers {
            blocks.push(BlockActs {
                x: z(rows * e)?,
                ln1: operand(rows * e)?,
                ln1_stats: z(2 * rows)?,
                qkv: z(rows * 3 * e)?,
                lse: z(batch * c.heads * c.block)?,
                y: operand(rows * e)?,
                attn_out: z(rows * e)?,
                x_attn: z(rows * e)?,
                ln2: operand(rows * e)?,
                ln2_stats: z(2 * rows)?,
                u: z(rows * f)?,
                gelu: operand(rows * f)?,
                mlp_out: z(rows * e)?,
            });
        }
        // The largest linear backward at either tile size: its weight-gradient tiles, and those times their
        // row slices, in floats of partial tiles.
        let layers = [(3 * e, e), (e, e), (f, e), (e, f), (v, e)];
        let (mut max_tiles, mut max_partials) = (1, 1);
        for t in [FP32_TILES, SMALL_TILES, bf16_tiles(has_wgmma(gpu.compute_capability))] {
            for &(o, i) in &layers {
                let tiles = t.wgrad_tiles(o, i);
                max_tiles = max_tiles.max(tiles);
                let slices = Self::slices(gpu, tiles, t.wg_bm * t.wg_bn, rows);
                max_partials = max_partials.max(t.partial_floats(o, tiles, slices));
            }
        }
        let mut max_halved = 1;
        for &(o, i) in &layers {
            if Self::forward_halves(gpu, rows, o, i) {
                max_tiles = max_tiles.max(FP32_TILES.forward_tiles(rows, o));
                max_halved = max_halved.max(o);
            }
        }
        Ok(StepBuffers {
            batch,
            blocks,
            x_final: z(rows * e)?,
            lnf: operand(rows * e)?,
            lnf_stats: z(2 * rows)?,
            logits: z(rows * v)?,
            row_loss: z(rows)?,
            d_res: z(rows * e)?,
            d_ln: z(rows * e)?,
            d_u: z(rows * f)?,
            d_y: z(rows * e)?,
            d_qkv: z(rows * 3 * e)?,
            d_logits_bf16: h(rows * Self::logits_ld(c))?,
            d_branch_bf16: h(rows * e)?,
            d_u_bf16: h(rows * f)?,
            d_qkv_bf16: h(rows * 3 * e)?,
            linear_partials: z(max_partials)?,
            linear_tickets: s.alloc_zeros(max_tiles)?,
            linear_other_half: z(rows * max_halved)?,
            ln_partials: z(rows.div_ceil(WARPS * ln_rows_per_warp(rows, gpu.sm_count as usize)) * 2 * e)?,
            dq_part: z(Self::key_chunks(c) * rows * e)?,
            attention_tickets: s.alloc_zeros(batch * c.heads)?,
            embedding_partials: z(v * rows.div_ceil(EMBEDDING_SLICE_ROWS) * e)?,
            embedding_tickets: s.alloc_zeros(v)?,
        })
    }

    /// The row stride of the logits' bf16 gradient: the vocabulary rounded up to 8, so that its rows start
    /// 16-byte aligned for the products' copies.
    fn logits_ld(c: &Config) -> usize {
        c.vocab.next_multiple_of(8)
    }

    /// tf_grad_norm's grid: about two blocks per SM, each over at least THREADS·4 elements.
    fn norm_blocks(gpu: &Gpu, n: usize) -> usize {
        n.div_ceil(THREADS * 4).clamp(1, 2 * gpu.sm_count as usize)
    }

    fn key_chunks(c: &Config) -> usize {
        c.block.div_ceil(AttentionSizes { t: c.block, hs: c.head_size(), warps: WARPS }.key_chunk())
    }

    /// Whether this step's fp32 products run on the small tiles: under LARGE_TILE_ROWS_PER_SM rows an SM,
    /// too few 128-row tiles to fill the GPU (unless `Tiles::Large`).
    fn small_tiles(&self) -> bool {
        self.tiles != Tiles::Large && self.rows() < LARGE_TILE_ROWS_PER_SM * self.gpu.sm_count as usize
    }

    /// Runs the products on `tiles` where there is a choice (for the checks).
    pub fn set_tiles(&mut self, tiles: Tiles) {
        if self.tiles != tiles {
            self.captured = None;
            self.tiles = tiles;
        }
    }

    /// Whether the fp32 forward product of a layer without GELU runs in halves of k
    /// (tf_linear_forward_halves): when its tiles would fill under two waves of two blocks an SM and each
    /// half still has 512 of k. At nanoGPT's shape the MLP projection (k 1536) went 0.70 → 0.55 ms; the
    /// attention projection and the head (k 384) got slower in halves (0.191 → 0.198 and 0.066 → 0.076 ms).
    fn forward_halves(gpu: &Gpu, rows: usize, out_features: usize, in_features: usize) -> bool {
        FP32_TILES.forward_tiles(rows, out_features) < 4 * gpu.sm_count as usize && in_features >= 1024
    }

    /// Row slices per weight-gradient tile of `tile_floats` floats: about two blocks per SM over all tiles
    /// (the dx tiles of the same launch fill the rest), each slice at least 32 rows, and at most 1 MB of
    /// partial tiles for the last block of a tile to add (one block's reads, which the whole step waits for).
    fn slices(gpu: &Gpu, tiles: usize, tile_floats: usize, rows: usize) -> usize {
        let most = rows.div_ceil(32).min((1 << 18) / tile_floats).max(1);
        (2 * gpu.sm_count as usize).div_ceil(tiles.max(1)).clamp(1, most)
    }

    /// The arithmetic of the linear layers' products and of attention (fp32 by default). bf16 attention
    /// runs on the tensor cores in head-size steps of 16.
    pub fn set_precision(&mut self, precision: Precision) -> Result<()> {
        if precision == Precision::Bf16 {
            if self.flash.is_none() {
                let sizes = FlashSizes { t: self.config.block, hs: self.config.head_size() };
                self.flash = Some(FlashAttention::new(&self.gpu, &self.module, sizes).context("--precision bf16")?);
            }
            // The weights' bf16 copy, which AdamW keeps from here on (steps at other precisions do not).
            self.enqueue_round_bf16()?;
        }
        if self.precision != precision {
            self.captured = None;
            self.precision = precision;
        }
        Ok(())
    }

    /// Trains with dropout `p` (in [0, 1)) at the places `model::Dropout` lists, its masks drawn from
    /// `seed` and the device's step counter, as `CpuTrainer::with_dropout`.
    pub fn set_dropout(&mut self, p: f32, seed: u32) {
        if (self.dropout, self.dropout_seed) != (p, seed) {
            self.captured = None;
            (self.dropout, self.dropout_seed) = (p, seed);
        }
    }

    /// Sums each step's gradient over `micro_batches` micro-batches (`--grad-accum`, at least 1), as
    /// `CpuTrainer::accumulated_step`: a step then takes `micro_batches` times the batch `train_steps` is
    /// given, one micro-batch's activations at a time.
    pub fn set_grad_accum(&mut self, micro_batches: usize) -> Result<()> {
        if micro_batches == 0 {
            bail!("internal: a step of 0 micro-batches");
        }
        if micro_batches != self.grad_accum {
            self.captured = None;
            self.grad_accum = micro_batches;
            let len = if micro_batches > 1 { self.layout.len() } else { 1 };
            self.grad_sum = self.gpu.stream.alloc_zeros(len)?;
        }
        Ok(())
    }

    /// ZeRO-1 as rank `rank` of `ranks`: this replica updates only its shard of the parameters, whose AdamW
    /// moments are all it keeps ([`Shard`]); [`parallel::Replicas`] reduce-scatters the gradient before the
    /// update and all-gathers the parameters after it. Called before the first step (the moments start at 0).
    pub fn set_zero(&mut self, rank: usize, ranks: usize) -> Result<()> {
        let n = self.layout.len();
        let shard = Shard::new(n, rank, ranks);
        let stream = self.gpu.stream.clone();
        let mut params = stream.alloc_zeros(shard.padded())?;
        stream.memcpy_dtod(&self.params, &mut params.slice_mut(..n))?;
        self.params = params;
        self.grad = stream.alloc_zeros(shard.padded())?;
        self.m = stream.alloc_zeros(shard.per.max(1))?;
        self.v = stream.alloc_zeros(shard.per.max(1))?;
        self.shard = Some(shard);
        self.captured = None;
        Ok(())
    }

    /// The bf16 attention kernels when the step runs in bf16; None runs fused/attention.cuh's fp32 ones.
    fn flash_attention(&self) -> Option<&FlashAttention> {
        self.flash.as_ref().filter(|_| self.precision == Precision::Bf16)
    }

    /// The kernel arguments of dropout site `site` (seed, step counter, threshold, scale); off
    /// (threshold 0) outside `training` or without dropout.
    /// Dropout site `site`'s arguments in this micro-batch: off when not `training` or without dropout.
    fn dropout_site(&self, site: usize, training: bool) -> DropoutArgs {
        if !training {
            return DropoutArgs::off();
        }
        let seed = site_seed(micro_seed(self.dropout_seed, self.micro.get()), site);
        DropoutArgs::site(Address::of(&self.gpu, &self.step), seed, self.dropout)
    }

    fn ensure_batch(&mut self, batch: usize) -> Result<()> {
        if self.buffers.batch != batch {
            self.captured = None;
            self.buffers = Self::alloc_buffers(&self.gpu, &self.config, batch)?;
            // Maps of the old buffers' addresses: never read again (a key names a buffer's shape too).
            self.tma_maps.get_mut().unwrap_or_else(|p| p.into_inner()).clear();
        }
        Ok(())
    }

    fn ptr<T>(&self, slice: &CudaSlice<T>) -> u64 {
        let (p, _) = slice.device_ptr(&self.gpu.stream);
        p
    }

    /// Where tensor `name` starts in the flat parameter vector (a tied head's weight is tok_emb's), None
    /// for one the model has none of.
    fn offset_of(&self, name: &str) -> Option<usize> {
        let name = if name == "head.weight" { super::model::head_weight(&self.config) } else { name };
        self.layout.get(name).map(|t| t.offset)
    }

    /// Tensor `name` of `of` (the parameters or their gradient), or `absent` for a bias the model has
    /// none of.
    fn tensor(&self, of: &CudaSlice<f32>, name: &str, absent: &CudaSlice<f32>) -> Arg {
        match self.offset_of(name) {
            Some(offset) => Arg::Ptr(self.ptr(of) + 4 * offset as u64),
            None if !self.config.bias && name.ends_with(".bias") => self.buf(absent),
            None => panic!("internal: no tensor {name}"),
        }
    }

    fn param(&self, name: &str) -> Arg {
        self.tensor(&self.params, name, &self.no_bias)
    }

    /// Weight `name`'s bf16 copy.
    fn param_bf16(&self, name: &str) -> Arg {
        let offset = self.offset_of(name).unwrap_or_else(|| panic!("internal: no tensor {name}"));
        Arg::Ptr(self.ptr(&self.params_bf16) + 2 * offset as u64)
    }

    /// Where the backward pass writes tensor `name`'s gradient: a tied head's into `head_grad`.
    fn grad_of(&self, name: &str) -> Arg {
        if name == "head.weight" && self.config.tie_weights {
            return self.buf(&self.head_grad);
        }
        self.tensor(&self.grad, name, &self.no_bias_grad)
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

    /// `launch` of a kernel of a dropout site: `dropout` its first parameter, `args` the rest.
    fn launch_site(
        &self,
        kernel: &Kernel,
        blocks: usize,
        shared: usize,
        dropout: DropoutArgs,
        args: &[Arg],
    ) -> Result<()> {
        let blocks = (blocks as u32, 1);
        self.gpu.launch_with_struct(kernel, (blocks, shared as u32, false), &StructArg::of(&dropout), args)
    }

    fn check_offsets(&self, offsets: &[u32], len: usize, what: &str) -> Result<()> {
        let limit = len.saturating_sub(self.config.block + 1);
        if let Some(&bad) = offsets.iter().find(|&&o| o as usize > limit) {
            bail!("internal: {what} offset {bad} is past {limit}");
        }
        Ok(())
    }

    /// Buffers for `steps` steps of micro-batches of `batch` sequences: activations, and each step's
    /// offsets, loss and rate.
    fn reserve_steps(&mut self, steps: usize, batch: usize) -> Result<()> {
        self.ensure_batch(batch)?;
        let windows = steps * self.grad_accum * batch;
        if self.offsets.len() < windows || self.losses.len() < steps || self.rates.len() < steps {
            self.captured = None;
            self.offsets = self.gpu.stream.alloc_zeros(windows)?;
            self.losses = self.gpu.stream.alloc_zeros(steps)?;
            self.rates = self.gpu.stream.alloc_zeros(steps)?;
        }
        Ok(())
    }

    /// The gradient vector's parts in the order the backward pass finishes them (`written` of
    /// `enqueue_backward_in_buckets`): the final LayerNorm and the head, each block from the last, then
    /// the embeddings (which take a tied head's gradient too).
    fn gradient_buckets(&self) -> Vec<std::ops::Range<usize>> {
        let c = &self.config;
        let block_start = |l: usize| self.offset_of(&format!("blocks.{l}.ln1.weight")).expect("every block has ln1");
        let tail = self.offset_of("ln_f.weight").expect("the model has ln_f");
        let mut buckets = Vec::with_capacity(c.layers + 2);
        buckets.push(tail..self.layout.len());
        for l in (0..c.layers).rev() {
            buckets.push(block_start(l)..if l + 1 < c.layers { block_start(l + 1) } else { tail });
        }
        buckets.push(0..block_start(0));
        buckets
    }

    /// Captures the CUDA graph of `steps` training steps of micro-batches of `batch` sequences
    /// (`train_steps` does it on first use; a bench calls it first so that the capture is not timed).
    pub fn prepare(&mut self, steps: usize, batch: usize) -> Result<()> {
        self.reserve_steps(steps, batch)?;
        if !matches!(&self.captured, Some((s, b, _)) if *s == steps && *b == batch) {
            self.captured = None;
            let stream = self.gpu.stream.clone();
            let graph = crate::device::launch::capture_graph(&stream, self, |t| {
                for s in 0..steps {
                    t.enqueue_step(s)?;
                }
                Ok(())
            })?;
            self.captured = Some((steps, batch, graph));
        }
        Ok(())
    }

    /// Trains len(offsets) / (k·batch) steps of k = `set_grad_accum`'s micro-batches of `batch` sequences
    /// (the offsets of step s at [s·k·batch, (s+1)·k·batch), micro-batch after micro-batch) as one CUDA
    /// graph, captured on first use for this many steps, step s at learning rate `rates[s]`. Returns each
    /// step's mean loss.
    pub fn train_steps(&mut self, offsets: &[u32], batch: usize, rates: &[f32]) -> Result<Vec<f64>> {
        let windows = self.grad_accum * batch;
        if batch == 0 || offsets.is_empty() || !offsets.len().is_multiple_of(windows) {
            bail!("internal: {} offsets for steps of {windows}", offsets.len());
        }
        self.check_offsets(offsets, self.n_train, "training")?;
        let steps = offsets.len() / windows;
        if rates.len() != steps {
            bail!("internal: {} learning rates for {steps} steps", rates.len());
        }
        self.prepare(steps, batch)?;
        let stream = self.gpu.stream.clone();
        let mut view = self.offsets.slice_mut(..offsets.len());
        stream.memcpy_htod(offsets, &mut view).context("copying batch offsets to the GPU")?;
        let mut view = self.rates.slice_mut(..steps);
        stream.memcpy_htod(rates, &mut view).context("copying learning rates to the GPU")?;
        stream.memset_zeros(&mut self.losses)?;
        let (_, _, graph) = self.captured.as_ref().expect("captured above");
        graph.launch().context("replaying the Transformer's training graph")?;
        let sums = stream.clone_dtoh(&self.losses).context("a Transformer training kernel failed")?;
        let rows = (windows * self.config.block) as f64;
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
            let (val, windows, sum) = (self.buf(&self.val), self.buf(&window_offsets), self.buf(&sum_dev));
            self.enqueue_forward(val, windows, 0.0, counted, sum, false)?;
            rows += counted;
        }
        let sum = stream.clone_dtoh(&sum_dev).context("a Transformer evaluation kernel failed")?;
        Ok(sum[0] / rows.max(1) as f64)
    }

    /// The parameters, copied back.
    pub fn params(&self) -> Result<Vec<f32>> {
        Ok(self.gpu.stream.clone_dtoh(&self.params.slice(..self.layout.len()))?)
    }

    /// The gradient of the last step.
    pub fn gradient(&self) -> Result<Vec<f32>> {
        Ok(self.gpu.stream.clone_dtoh(&self.grad.slice(..self.layout.len()))?)
    }

    /// Forward and backward of one training batch (offsets into the training ids), no update, every
    /// output poisoned with NaN first: what the kernel checks compare with `model::forward` / `backward`
    /// (with dropout, the next step's masks).
    pub fn forward_backward_alone(&mut self, offsets: &[u32]) -> Result<ForwardOut> {
        let batch = offsets.len();
        self.check_offsets(offsets, self.n_train, "training")?;
        self.ensure_batch(batch)?;
        let stream = self.gpu.stream.clone();
        let poison =
            |buf: &mut CudaSlice<f32>| -> Result<()> { Ok(stream.memcpy_htod(&vec![f32::NAN; buf.len()], buf)?) };
        {
            let b = &mut self.buffers;
            let poison_bf16 = |buf: &mut CudaSlice<u16>| -> Result<()> {
                Ok(stream.memcpy_htod(&vec![0xffffu16; buf.len()], buf)?) // a NaN's bits
            };
            for a in &mut b.blocks {
                for buf in [&mut a.x, &mut a.qkv, &mut a.x_attn, &mut a.u] {
                    poison(buf)?;
                }
                for op in [&mut a.ln1, &mut a.y, &mut a.ln2, &mut a.gelu] {
                    poison(&mut op.fp32)?;
                    poison_bf16(&mut op.bf16)?;
                }
            }
            for buf in [&mut b.lnf.fp32, &mut b.logits, &mut b.row_loss, &mut b.d_res] {
                poison(buf)?;
            }
            poison_bf16(&mut b.lnf.bf16)?;
            for buf in [&mut b.d_logits_bf16, &mut b.d_branch_bf16, &mut b.d_u_bf16, &mut b.d_qkv_bf16] {
                poison_bf16(buf)?;
            }
        }
        poison(&mut self.grad)?;
        let dev_offsets: CudaSlice<u32> = stream.clone_htod(offsets)?;
        let sum: CudaSlice<f64> = stream.alloc_zeros(1)?;
        let scale = 1.0 / self.rows() as f32;
        self.fp32_activations = true;
        let forward = self.enqueue_forward(
            self.buf(&self.train),
            self.buf(&dev_offsets),
            scale,
            self.rows(),
            self.buf(&sum),
            true,
        );
        self.fp32_activations = false;
        forward?;
        let get = |buf: &CudaSlice<f32>| -> Result<Vec<f32>> {
            stream.clone_dtoh(buf).context("a Transformer forward kernel failed")
        };
        let b = &self.buffers;
        let mut out = ForwardOut::default();
        for a in &b.blocks {
            out.x.push(get(&a.x)?);
            out.ln1.push(get(&a.ln1.fp32)?);
            out.qkv.push(get(&a.qkv)?);
            out.y.push(get(&a.y.fp32)?);
            out.x_attn.push(get(&a.x_attn)?);
            out.ln2.push(get(&a.ln2.fp32)?);
            out.u.push(get(&a.u)?);
            out.gelu.push(get(&a.gelu.fp32)?);
        }
        out.xf = get(&b.lnf.fp32)?;
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
    use crate::device::compile::kernel_constants;

    #[test]
    fn sizes_match_the_kernel_file() {
        let mut expressions = Vec::new();
        for p in ["FP32", "TF32", "BF16", "FP32_SMALL"] {
            for field in ["BM", "BN", "WG_BM", "WG_BN", "SHARED_FLOATS * 4"] {
                expressions.push(format!("LinearTiles<{p}>::{field}"));
            }
            expressions.push(format!("(int)Wgrad<{p}>::ONES_COLUMN"));
        }
        expressions.push("EMB_SLICE_ROWS".to_string());
        expressions.push("TF_TMA_STAGES".to_string());
        expressions.push("TmaByRows<GemmTma<128, 128, TF_TMA_STAGES>>::SHARED_BYTES".to_string());
        let expressions: Vec<&str> = expressions.iter().map(String::as_str).collect();
        // kernel_constants compiles for sm_90a, whose kernels have wgmma.
        let kernel = kernel_constants("transformer", &[], &expressions).unwrap();
        let mut mirror = Vec::new();
        for (p, small) in
            [(Precision::Fp32, false), (Precision::Tf32, false), (Precision::Bf16, false), (Precision::Fp32, true)]
        {
            let t = LinearTiles::of(p, true, small);
            mirror.extend([t.bm, t.bn, t.wg_bm, t.wg_bn, t.shared_bytes, t.ones_column as usize]);
        }
        mirror.push(EMBEDDING_SLICE_ROWS);
        assert_eq!(TMA_TILE.shape(), (128, 128), "the test names TF_LINEAR_TMA(128, 128)");
        mirror.extend([TMA_STAGES, tma_shared_bytes()]);
        assert_eq!(kernel, mirror.iter().map(|&v| v as i64).collect::<Vec<_>>());
    }
}
