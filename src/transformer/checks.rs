//! The Transformer's selftest checks against the CPU reference (`model.rs`), on random ids with every
//! parameter drawn at random (LayerNorm gains around 1, biases and offsets around 0, so that no term is
//! trivially 1 or 0):
//!
//! - kernels: one batch's forward pass, stage by stage (each block's residual stream, LN1, qkv,
//!   attention output, the stream after attention, LN2, the FFN's pre-activation and GELU; LN_f, the
//!   losses and dlogits), then its backward pass: every parameter tensor's gradient, written over NaN,
//!   and the gradient of the embeddings' sum; in fp32 at 1e-4, and with the linear layers in TF32 on the
//!   tensor cores against the same fp32 reference at TF32_TOLERANCE;
//! - dropout: the same forward and backward with dropout 0.2 at all four places, which holds only when
//!   the GPU draws the CPU's masks bit for bit (a mask off by one element moves its row by ~1/(1 − p));
//!   the second shape also without biases and with the head tied to tok_emb (the head's gradient added
//!   into tok_emb's);
//! - training: 100 AdamW steps through the production path (CUDA graphs of 50 steps) against
//!   `CpuTrainer` on the same batches: every tensor (the key bias aside, see `worst_tensor`) and the
//!   steps' losses; then again with dropout, a cosine schedule after a warm-up, clipping at a norm most
//!   steps exceed (the device's step counter, rate array and norm reduction), no biases and tied weights;
//! - repeat: 20 steps twice from the same start give the same bits.
//!
//! The model has no kink (GELU, LayerNorm and softmax are smooth), so no draw needs redrawing: the GPU
//! and the reference differ by rounding only, amplified by AdamW where a gradient is near zero.

use super::data::{self, CharVocab, Corpus, UNKNOWN};
use super::gpu::{GpuTransformer, Tiles, module_request};
use super::model::{self, Config, CpuTrainer, Dropout, Layout};
use crate::device::precision::Precision;
use crate::device::{Gpu, compile::ModuleRequest};
use crate::harness::check::{Check, Group, Plan, rel_error, worst};
use crate::ops::cpu::SeededRng;
use crate::ops::dropout::DropoutKey;
use crate::ops::gemm::{bf16_value, round_bf16};
use crate::ops::optim::{LrSchedule, LrScheduleKind, OptimConfig, OptimKind};
use anyhow::Result;
use rand::RngExt;
use rand_distr::{Distribution, Normal};
use std::sync::Arc;

/// Largest relative error of a kernel's fp32 result against the CPU reference.
pub const KERNEL_TOLERANCE: f64 = 1e-4;
/// On the tensor cores (`--precision tf32|bf16`) each product's operands are rounded (unit roundoff u:
/// 2⁻¹¹ for TF32, 2⁻⁸ for bf16), 2u a product. A stage of the checked models sits behind at most about ten
/// chained products (two blocks of five, and the head), so its norm-wise error stays below 20u: 9.8e-3
/// for TF32 and 7.8e-2 for bf16. fp32 keeps KERNEL_TOLERANCE.
pub fn tensor_core_tolerance(precision: Precision) -> f64 {
    match precision {
        Precision::Fp32 => KERNEL_TOLERANCE,
        p => 20.0 * p.unit_roundoff(),
    }
}
/// Largest relative error of a whole training run against the CPU reference.
pub const TRAINING_TOLERANCE: f64 = 1e-3;
const TRAINING_STEPS: usize = 100;
/// The dropout of the dropout checks, and its seed.
const DROPOUT: f32 = 0.2;
const DROPOUT_SEED: u32 = 7;

/// (config, batch) of the kernel checks: a small model with two heads of 16, a block of 150 (the
/// attention backward's three key chunks, the last one partial, and heads of 32; its 600 rows make two
/// slices of the token-embedding gradient), a wide one (its MLP projection, k = 1024, runs the fp32
/// forward product in halves of k), and the default one.
fn kernel_shapes(quick: bool) -> Vec<(Config, usize)> {
    let mut shapes = vec![
        (Config { vocab: 37, block: 16, embed: 32, heads: 2, layers: 2, bias: true, tie_weights: false }, 3),
        (Config { vocab: 29, block: 150, embed: 64, heads: 2, layers: 1, bias: true, tie_weights: false }, 4),
        (Config { vocab: 29, block: 32, embed: 256, heads: 4, layers: 1, bias: true, tie_weights: false }, 3),
    ];
    if !quick {
        shapes
            .push((Config { vocab: 65, block: 64, embed: 64, heads: 4, layers: 2, bias: true, tie_weights: false }, 4));
    }
    shapes
}

/// The training checks' model.
const TRAINING_SHAPE: Config =
    Config { vocab: 23, block: 16, embed: 32, heads: 4, layers: 2, bias: true, tie_weights: false };
const TRAINING_BATCH: usize = 4;

fn label(c: &Config, batch: usize) -> String {
    let arch = format!("{}{}", if c.bias { "" } else { " no-bias" }, if c.tie_weights { " tied" } else { "" });
    format!("V={} T={} C={} NH={} L={} B={batch}{arch}", c.vocab, c.block, c.embed, c.heads, c.layers)
}

/// `label`, and the precision unless fp32.
fn label_at(c: &Config, batch: usize, precision: Precision) -> String {
    match precision {
        Precision::Fp32 => label(c, batch),
        p => format!("{} {}", label(c, batch), p.name()),
    }
}

/// A corpus of random ids over `config.vocab` characters.
pub fn random_corpus(config: &Config, len: usize, rng: &mut SeededRng) -> Corpus {
    let chars: Vec<char> = std::iter::once(UNKNOWN)
        .chain((0..config.vocab as u32 - 1).map(|i| char::from_u32(0x41 + i).unwrap_or('?')))
        .collect();
    let vocab = CharVocab::from_chars(chars).expect("distinct characters");
    let mut ids = || -> Vec<u32> { (0..len).map(|_| rng.random_range(0..config.vocab as u32)).collect() };
    let (train, val) = (ids(), ids());
    Corpus { vocab, train, val, unknown: 0 }
}

/// Parameters with every tensor random: weights N(0, 0.1), biases N(0, 0.05), LayerNorm gains N(1, 0.1).
pub fn random_params(config: &Config, rng: &mut SeededRng) -> Vec<f32> {
    let layout = Layout::new(config);
    let mut params = vec![0.0f32; layout.len()];
    for t in layout.tensors() {
        let (mean, sd) = if t.name.contains("ln") && t.name.ends_with("weight") {
            (1.0, 0.1)
        } else if t.name.ends_with("bias") {
            (0.0, 0.05)
        } else {
            (0.0, 0.1)
        };
        let normal = Normal::new(mean, sd).expect("a valid normal");
        for p in &mut params[t.range()] {
            *p = normal.sample(rng);
        }
    }
    params
}

/// AdamW with ten times the default decay, so that 100 steps shrink the weights by a relative 1e-2
/// and a wrong decay shows.
fn adamw() -> OptimConfig {
    OptimConfig { weight_decay: 0.1, ..OptimConfig::new(OptimKind::AdamW) }
}

/// The worst relative error over the tensors of `layout` and the tensor's name. With `skip_key_bias`,
/// the key third of each qkv bias is left out: adding a constant to every key's score leaves the softmax
/// unchanged, so its exact gradient is zero and what the GPU and the reference compute there is rounding;
/// Adam scales that to steps of ±lr, a random walk that two correct implementations do not share.
fn worst_tensor(layout: &Layout, got: &[f32], want: &[f32], skip_key_bias: bool) -> (f64, String) {
    worst(layout.tensors().iter().map(|t| {
        let (got, want) = (&got[t.range()], &want[t.range()]);
        let e = if skip_key_bias && t.name.ends_with("attn.qkv.bias") {
            let third = t.len() / 3;
            let without_keys = |v: &[f32]| -> Vec<f32> { v[..third].iter().chain(&v[2 * third..]).copied().collect() };
            rel_error(&without_keys(got), &without_keys(want))
        } else {
            rel_error(got, want)
        };
        (t.name.clone(), e)
    }))
}

/// The kernel modules the checks compile (`--quick` too: its tensor-core checks take the larger kernel shapes).
pub fn modules(_plan: &Plan) -> Vec<ModuleRequest> {
    let configs = kernel_shapes(false).into_iter().map(|(config, _)| config).chain([TRAINING_SHAPE, REPEAT_SHAPE]);
    configs.map(|config| module_request(&config)).chain(flash_modules()).collect()
}

/// The selftest checks of fused/transformer.cu against the CPU reference.
pub fn selftest_checks(gpu: &Arc<Gpu>, plan: &Plan) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    if plan.wants(Group::Kernels) {
        out.extend(flash_attention_checks(gpu, &mut plan.rng("transformer bf16 attention"))?);
        let mut rng = plan.rng("transformer kernels");
        // fp32 on the tiles these small steps take, and on gemm_128 (which steps of 64 rows an SM take).
        for (config, batch) in kernel_shapes(plan.quick) {
            for tiles in [Tiles::Default, Tiles::Large] {
                out.extend(kernel_checks(gpu, config, batch, Precision::Fp32, tiles, &mut rng)?);
            }
        }
        let (config, batch) = kernel_shapes(false).pop().expect("the default shape");
        out.extend(kernel_checks(gpu, config, batch, Precision::Tf32, Tiles::Default, &mut rng)?);
        // bf16 at the default shape and at the block of 150 (attention tiles cut short, heads of 32), the
        // forward products on the TMA pipeline where the GPU has it and on gemm_tile_bf16_wgmma.
        for (config, batch) in [kernel_shapes(false)[1], (config, batch)] {
            for tiles in [Tiles::Default, Tiles::NoTma] {
                out.extend(kernel_checks(gpu, config, batch, Precision::Bf16, tiles, &mut rng)?);
            }
        }
    }
    if plan.wants(Group::Kernels) {
        let mut rng = plan.rng("transformer dropout");
        // The second shape without biases and with the head tied to tok_emb, also in bf16 (whose
        // LayerNorm backward passes draw the branches' masks themselves).
        for (i, (config, batch)) in kernel_shapes(true).into_iter().enumerate() {
            let config = if i == 1 { Config { bias: false, tie_weights: true, ..config } } else { config };
            out.extend(dropout_checks(gpu, config, batch, Precision::Fp32, &mut rng)?);
            if i == 1 {
                out.extend(dropout_checks(gpu, config, batch, Precision::Bf16, &mut rng)?);
            }
        }
    }
    if plan.wants(Group::Training) {
        let mut rng = plan.rng("transformer training");
        out.push(training_check(gpu, &mut rng, Regime::Plain)?);
        out.push(training_check(gpu, &mut rng, Regime::Regularized)?);
        out.push(training_check(gpu, &mut rng, Regime::Accumulated)?);
    }
    if plan.wants(Group::Repeat) {
        let mut rng = plan.rng("transformer repeat");
        out.extend(repeat_check(gpu, &mut rng)?);
    }
    Ok(out)
}

/// One batch of fresh random data through a fresh random model, on the CPU in fp32 (forward and backward,
/// with the masks of `dropout` at the trainer's first step when given) and on the GPU at `precision`
/// (the trainer kept for its gradient).
struct BatchRun {
    want: model::Forward<f32>,
    want_back: model::Backward<f32>,
    trainer: GpuTransformer,
    got: super::gpu::ForwardOut,
}

fn batch_run(
    gpu: &Arc<Gpu>,
    config: Config,
    batch: usize,
    precision: Precision,
    tiles: Tiles,
    dropout: bool,
    rng: &mut SeededRng,
) -> Result<BatchRun> {
    let corpus = random_corpus(&config, 40 * config.block, rng);
    let params = random_params(&config, rng);
    let offsets = data::train_offsets(rng, corpus.train.len(), config.block, batch);
    let (tokens, targets) = data::windows(&corpus.train, &offsets, config.block);
    // A fresh trainer's step counter is 0: its first step's masks.
    let masks = dropout.then_some(Dropout { p: DROPOUT, key: DropoutKey { seed: DROPOUT_SEED, step: 0 } });
    let want = model::forward::<f32>(&config, &params, &tokens, batch, Some(&targets), masks);
    let want_back = model::backward(&config, &params, &want, &targets);
    let mut trainer = GpuTransformer::new(gpu.clone(), config, &params, adamw(), &corpus)?;
    if dropout {
        trainer.set_dropout(DROPOUT, DROPOUT_SEED);
    }
    trainer.set_precision(precision)?;
    trainer.set_tiles(tiles);
    let got = trainer.forward_backward_alone(&offsets)?;
    Ok(BatchRun { want, want_back, trainer, got })
}

/// Forward stage by stage and backward (every gradient) of one batch at `precision` on `tiles`, against
/// the same fp32 reference at `tensor_core_tolerance(precision)`.
pub fn kernel_checks(
    gpu: &Arc<Gpu>,
    config: Config,
    batch: usize,
    precision: Precision,
    tiles: Tiles,
    rng: &mut SeededRng,
) -> Result<Vec<Check>> {
    let BatchRun { want: f, want_back: back, trainer, got } =
        batch_run(gpu, config, batch, precision, tiles, false, rng)?;
    let label = match tiles {
        Tiles::Default => "",
        Tiles::Large => " gemm_128",
        Tiles::NoTma => " no TMA",
    };
    let shape = format!("{}{label}", label_at(&config, batch, precision));
    let tolerance = tensor_core_tolerance(precision);
    let mut out = Vec::new();
    let mut check = |kernel: String, got: &[f32], want: &[f32]| {
        out.push(Check { kernel, shape: shape.clone(), rel_error: rel_error(got, want), tolerance });
    };
    for (l, want) in f.blocks.iter().enumerate() {
        check(format!("transformer block {l} x (embed/residual)"), &got.x[l], &want.x);
        check(format!("transformer block {l} ln1"), &got.ln1[l], &want.ln1);
        check(format!("transformer block {l} qkv"), &got.qkv[l], &want.qkv);
        check(format!("transformer block {l} attention y"), &got.y[l], &want.y);
        check(format!("transformer block {l} x after attention"), &got.x_attn[l], &want.x_attn);
        check(format!("transformer block {l} ln2"), &got.ln2[l], &want.ln2);
        check(format!("transformer block {l} fc pre-activation"), &got.u[l], &want.u);
        check(format!("transformer block {l} gelu"), &got.gelu[l], &want.gelu);
    }
    check("transformer ln_f".into(), &got.xf, &f.xf);
    check("transformer classifier losses".into(), &got.losses, &f.losses);
    check("transformer classifier dlogits".into(), &got.d_logits, &back.d_logits);
    let grad = trainer.gradient()?;
    let layout = Layout::new(&config);
    let (e, name) = worst_tensor(&layout, &grad, &back.grad, false);
    out.push(Check {
        kernel: format!("transformer backward, worst: ∂{name}"),
        shape: shape.clone(),
        rel_error: e,
        tolerance,
    });
    let d_embed = trainer.embedding_sum_gradient()?;
    out.push(Check {
        kernel: "transformer backward ∂(tok_emb + pos_emb)".into(),
        shape,
        rel_error: rel_error(&d_embed, &back.blocks[0].d_x),
        tolerance,
    });
    Ok(out)
}

/// One batch's forward (the stages dropout touches: the embeddings' sum, each block's attention output
/// and both residual sums, and the losses) and backward (every gradient) with dropout `DROPOUT` at its
/// first step and at `precision`, against the fp32 CPU reference drawing the same masks.
pub fn dropout_checks(
    gpu: &Arc<Gpu>,
    config: Config,
    batch: usize,
    precision: Precision,
    rng: &mut SeededRng,
) -> Result<Vec<Check>> {
    let BatchRun { want: f, want_back: back, trainer, got } =
        batch_run(gpu, config, batch, precision, Tiles::Default, true, rng)?;
    let shape = format!("{} dropout {DROPOUT}", label_at(&config, batch, precision));
    let tolerance = tensor_core_tolerance(precision);
    let mut out = Vec::new();
    let mut check = |kernel: String, got: &[f32], want: &[f32]| {
        out.push(Check { kernel, shape: shape.clone(), rel_error: rel_error(got, want), tolerance });
    };
    for (l, want) in f.blocks.iter().enumerate() {
        check(format!("transformer dropout block {l} x (embed/residual)"), &got.x[l], &want.x);
        check(format!("transformer dropout block {l} attention y"), &got.y[l], &want.y);
        check(format!("transformer dropout block {l} x after attention"), &got.x_attn[l], &want.x_attn);
    }
    check("transformer dropout classifier losses".into(), &got.losses, &f.losses);
    let (e, name) = worst_tensor(&Layout::new(&config), &trainer.gradient()?, &back.grad, false);
    out.push(Check {
        kernel: format!("transformer dropout backward, worst: ∂{name}"), shape, rel_error: e, tolerance
    });
    Ok(out)
}

/// Offsets of `batches` training batches.
fn batches(corpus: &Corpus, config: &Config, batches: usize, rng: &mut SeededRng) -> Vec<u32> {
    (0..batches).flat_map(|_| data::train_offsets(rng, corpus.train.len(), config.block, TRAINING_BATCH)).collect()
}

/// What a training check trains with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// AdamW at a constant rate.
    Plain,
    /// Dropout `DROPOUT`, 10 warm-up steps then a cosine from 1e-3 to 1e-4, clipping at a global norm of 0.05
    /// (below most steps' gradient norms at the start), no biases and the head tied to tok_emb.
    Regularized,
    /// `Regularized`'s dropout, schedule and clipping (of the summed gradient), with biases, each step's
    /// gradient summed over `ACCUMULATED_MICRO_BATCHES` micro-batches (`--grad-accum`): the first one's
    /// copy, the middle ones' sums and the last one's add, each micro-batch with its own masks.
    Accumulated,
}

/// Micro-batches a step of the `Accumulated` training check.
const ACCUMULATED_MICRO_BATCHES: usize = 3;

/// 100 AdamW steps, GPU (graphs of 50 steps) against the CPU reference on the same batches.
pub fn training_check(gpu: &Arc<Gpu>, rng: &mut SeededRng, regime: Regime) -> Result<Check> {
    let (regularized, micro_batches) = match regime {
        Regime::Plain => (false, 1),
        Regime::Regularized => (true, 1),
        Regime::Accumulated => (true, ACCUMULATED_MICRO_BATCHES),
    };
    let config = match regime {
        Regime::Regularized => Config { bias: false, tie_weights: true, ..TRAINING_SHAPE },
        _ => TRAINING_SHAPE,
    };
    let corpus = random_corpus(&config, 60 * config.block, rng);
    let params = model::init(&config, rng.random());
    let offsets = batches(&corpus, &config, TRAINING_STEPS * micro_batches, rng);
    let optim = OptimConfig { clip_norm: if regularized { 0.05 } else { 0.0 }, ..adamw() };
    let schedule = if regularized {
        LrSchedule { kind: LrScheduleKind::Cosine, warmup: 10, min_lr: 1e-4 }
    } else {
        LrSchedule::default()
    };
    let rates = schedule.rates(optim.lr, TRAINING_STEPS);
    let dropout = if regularized { DROPOUT } else { 0.0 };
    let mut gpu_trainer = GpuTransformer::new(gpu.clone(), config, &params, optim, &corpus)?;
    gpu_trainer.set_dropout(dropout, DROPOUT_SEED);
    gpu_trainer.set_grad_accum(micro_batches)?;
    let step_windows = micro_batches * TRAINING_BATCH;
    let mut gpu_losses = Vec::new();
    for (part, rates) in offsets.chunks(50 * step_windows).zip(rates.chunks(50)) {
        gpu_losses.extend(gpu_trainer.train_steps(part, TRAINING_BATCH, rates)?);
    }
    let mut cpu = CpuTrainer::new(config, params, optim)?.with_dropout(dropout, DROPOUT_SEED);
    let mut cpu_losses = Vec::new();
    for (o, &rate) in offsets.chunks(step_windows).zip(&rates) {
        let (tokens, targets) = data::windows(&corpus.train, o, config.block);
        cpu.optimizer.config.lr = rate;
        cpu_losses.push(cpu.accumulated_step(&tokens, &targets, TRAINING_BATCH, micro_batches));
    }
    let got = gpu_trainer.params()?;
    let (mut e, mut name) = worst_tensor(&Layout::new(&config), &got, &cpu.params, true);
    let gpu_losses: Vec<f32> = gpu_losses.iter().map(|&l| l as f32).collect();
    let loss_error = rel_error(&gpu_losses, &cpu_losses);
    if loss_error.is_nan() || loss_error > e {
        (e, name) = (loss_error, "the steps' losses".into());
    }
    Ok(Check {
        kernel: format!(
            "transformer {TRAINING_STEPS} steps (graph) {}{}{}{}, worst: {name}",
            optim.describe(),
            if regularized { format!(", dropout {DROPOUT}, ") } else { String::new() },
            schedule.describe(),
            if micro_batches > 1 { format!(", {micro_batches} micro-batches a step") } else { String::new() }
        ),
        shape: label(&config, TRAINING_BATCH),
        rel_error: e,
        tolerance: TRAINING_TOLERANCE,
    })
}

/// The repeat check's model.
const REPEAT_SHAPE: Config =
    Config { vocab: 65, block: 64, embed: 64, heads: 4, layers: 2, bias: true, tie_weights: false };

/// The repeat check: 20 training steps twice from the same start must give the same bits.
pub fn repeat_check(gpu: &Arc<Gpu>, rng: &mut SeededRng) -> Result<Vec<Check>> {
    let config = REPEAT_SHAPE;
    let corpus = random_corpus(&config, 40 * config.block, rng);
    let params = model::init(&config, rng.random());
    let offsets: Vec<u32> =
        (0..20).flat_map(|_| data::train_offsets(rng, corpus.train.len(), config.block, 32)).collect();
    let mut out = Vec::new();
    let runs_at =
        [(Precision::Fp32, false), (Precision::Fp32, true), (Precision::Tf32, false), (Precision::Bf16, false)];
    for (precision, large_tiles) in runs_at {
        let mut runs = Vec::new();
        for _ in 0..2 {
            let mut t = GpuTransformer::new(gpu.clone(), config, &params, adamw(), &corpus)?;
            t.set_precision(precision)?;
            t.set_tiles(if large_tiles { Tiles::Large } else { Tiles::Default });
            t.train_steps(&offsets, 32, &[adamw().lr; 20])?;
            runs.push(t.params()?);
        }
        let same = runs[0].iter().zip(&runs[1]).all(|(a, b)| a.to_bits() == b.to_bits());
        let tiles = if large_tiles { " on gemm_128" } else { "" };
        let kernel = format!("transformer 20 steps twice at {}{tiles}: the same bits", precision.name());
        out.push(Check::holds(kernel, label(&config, 32), same));
    }
    Ok(out)
}

/// The bf16 attention kernels' tolerance against the CPU twin in f64. Rounding to bf16 (to nearest even)
/// moves an operand by a relative error uniform in ±u, u = 2⁻⁸, of RMS u/√3; a product of two rounded
/// operands is off by a relative RMS √2·u/√3 ≈ 0.82u, and so is a sum of such products relative to the
/// root sum of squares of its terms (the roundings are independent), which for these random inputs is
/// the size of the sum. Along the deepest chain, dk = Σ_t ds·q and dq = Σ_u ds·k with ds = p·(dp − D):
/// s = q·k/√hs (|s| about 1, so 0.82u absolute, which exp turns into 0.82u relative in p), dp = dy·v
/// (0.82u), D = dy·y with y = p·v (p, v rounded again: about 1.2u), dp − D (about 1.4u), ds rounded for
/// the last product and q or k rounded (0.58u each): about 1.8u ≈ 7.0e-3 in RMS. The tolerance is four
/// times that, 8u = 2⁻⁵ ≈ 3.1e-2, for rows where a few large scores make p peaked.
pub fn flash_tolerance() -> f64 {
    8.0 * Precision::Bf16.unit_roundoff()
}

/// One shape of the bf16 attention checks: a model's block, width and heads, `batch` sequences of `len`
/// positions, and the dropout probability on the attention probabilities.
struct FlashShape {
    block: usize,
    embed: usize,
    heads: usize,
    batch: usize,
    len: usize,
    dropout: f32,
}

/// The default model (heads of 16), and heads of 64 at a block of 200 (neither a multiple of the 64-wide
/// tile nor of the 128-row block): whole sequences, 77 positions (an evaluation's shorter sequence), and
/// with dropout 0.2.
const FLASH_SHAPES: [FlashShape; 4] = [
    FlashShape { block: 64, embed: 64, heads: 4, batch: 3, len: 64, dropout: 0.0 },
    FlashShape { block: 200, embed: 128, heads: 2, batch: 2, len: 200, dropout: 0.0 },
    FlashShape { block: 200, embed: 128, heads: 2, batch: 2, len: 77, dropout: 0.0 },
    FlashShape { block: 200, embed: 128, heads: 2, batch: 2, len: 200, dropout: 0.2 },
];

fn flash_config(s: &FlashShape) -> Config {
    Config { vocab: 2, block: s.block, embed: s.embed, heads: s.heads, layers: 1, bias: true, tie_weights: false }
}

/// The modules of the bf16 attention checks.
fn flash_modules() -> Vec<ModuleRequest> {
    FLASH_SHAPES.iter().map(|s| module_request(&flash_config(s))).collect()
}

/// The bf16 attention kernels at each of FLASH_SHAPES.
pub fn flash_attention_checks(gpu: &Arc<Gpu>, rng: &mut SeededRng) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    for shape in &FLASH_SHAPES {
        out.extend(flash_attention_check(gpu, shape, rng)?);
    }
    Ok(out)
}

/// lse_t = max + log Σ exp of the scores of row t of each head, `[heads][n]`.
fn reference_lse(qkv: &[f64], n: usize, heads: usize, hs: usize) -> Vec<f64> {
    let c = heads * hs;
    let mut lse = Vec::with_capacity(heads * n);
    for h in 0..heads {
        for t in 0..n {
            let q = &qkv[t * 3 * c + h * hs..][..hs];
            let scores: Vec<f64> = (0..=t)
                .map(|u| q.iter().zip(&qkv[u * 3 * c + c + h * hs..][..hs]).map(|(a, b)| a * b).sum::<f64>())
                .map(|s| s / (hs as f64).sqrt())
                .collect();
            let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
            lse.push(max + scores.iter().map(|s| (s - max).exp()).sum::<f64>().ln());
        }
    }
    lse
}

/// Forward and backward of the bf16 attention kernels on fresh random q, k, v and dy (outputs poisoned
/// with NaN first), against `attention` and `attention_backward` in f64: y, lse, dq, dk, dv.
fn flash_attention_check(gpu: &Arc<Gpu>, s: &FlashShape, rng: &mut SeededRng) -> Result<Vec<Check>> {
    use super::gpu::flash::{FlashAttention, FlashSizes};
    use crate::device::kernel_struct::{Address, DropoutArgs};
    use crate::device::launch::Arg;
    use crate::ops::attention::{AttentionDropout, attention, attention_backward};
    use crate::ops::dropout::{Mask, dropout_scale, dropout_threshold, mix32};
    let config = flash_config(s);
    let (t, c, heads, hs, len) = (s.block, s.embed, s.heads, config.head_size(), s.len);
    let module = gpu.module(&module_request(&config))?;
    let flash = FlashAttention::new(gpu, &module, FlashSizes { t, hs })?;
    let n = s.batch * t;
    let normal = Normal::new(0.0f32, 1.0).expect("a valid normal");
    let qkv: Vec<f32> = (0..n * 3 * c).map(|_| normal.sample(rng)).collect();
    let dy: Vec<f32> = (0..n * c).map(|_| normal.sample(rng)).collect();
    let stream = &gpu.stream;
    let (qkv_dev, dy_dev) = (stream.clone_htod(&qkv)?, stream.clone_htod(&dy)?);
    let y_dev = stream.clone_htod(&vec![f32::NAN; n * c])?;
    let lse_dev = stream.clone_htod(&vec![f32::NAN; s.batch * heads * t])?;
    let dqkv_dev = stream.clone_htod(&vec![f32::NAN; n * 3 * c])?;
    // The bf16 copies of y and dqkv that the bf16 linear layers read, poisoned with a NaN's bits.
    let y_bf16_dev = stream.clone_htod(&vec![0xffffu16; n * c])?;
    let dqkv_bf16_dev = stream.clone_htod(&vec![0xffffu16; n * 3 * c])?;
    // The kernels draw the mask from a site seed and the device's step counter, as in training.
    let (seed, step) = (rng.random::<u32>(), rng.random_range(0..1000u32));
    let step_dev = stream.clone_htod(&[step])?;
    let mask = (s.dropout > 0.0).then(|| Mask {
        key: mix32(seed.wrapping_add(step)),
        threshold: dropout_threshold(s.dropout),
        scale: dropout_scale(s.dropout),
    });
    let dropout = DropoutArgs::site(Address::of(gpu, &step_dev), seed, s.dropout);
    let buf = |b: &cudarc::driver::CudaSlice<f32>| Arg::buf(gpu, b);
    let y_pair = [buf(&y_dev), Arg::buf(gpu, &y_bf16_dev)];
    flash.forward(gpu, buf(&qkv_dev), y_pair, buf(&lse_dev), s.batch, heads, len, dropout)?;
    let dqkv_bf16 = Arg::buf(gpu, &dqkv_bf16_dev);
    let args = [buf(&qkv_dev), buf(&y_dev), buf(&dy_dev), buf(&lse_dev), buf(&dqkv_dev), dqkv_bf16];
    flash.backward(gpu, args, s.batch, heads, len, dropout)?;
    let y_got = stream.clone_dtoh(&y_dev)?;
    let lse_got = stream.clone_dtoh(&lse_dev)?;
    let dqkv_got = stream.clone_dtoh(&dqkv_dev)?;
    let (y_bf16_got, dqkv_bf16_got) = (stream.clone_dtoh(&y_bf16_dev)?, stream.clone_dtoh(&dqkv_bf16_dev)?);

    // [y, lse, dq, dk, dv], each (got, want) over the first len positions of every sequence; then the bf16
    // copies of y and dqkv against the fp32 outputs rounded.
    let mut pairs: [(Vec<f32>, Vec<f32>); 7] = Default::default();
    for b in 0..s.batch {
        let rows = b * t..b * t + len;
        for (i, (copy, of, width)) in
            [(&y_bf16_got, &y_got, c), (&dqkv_bf16_got, &dqkv_got, 3 * c)].into_iter().enumerate()
        {
            let span = rows.start * width..rows.end * width;
            pairs[5 + i].0.extend(copy[span.clone()].iter().map(|&h| bf16_value(h)));
            pairs[5 + i].1.extend(of[span].iter().map(|&x| round_bf16(x)));
        }
        let wide = |v: &[f32], width: usize| -> Vec<f64> {
            v[rows.start * width..rows.end * width].iter().map(|&x| x as f64).collect()
        };
        let (qkv_b, dy_b) = (wide(&qkv, 3 * c), wide(&dy, c));
        let drop = mask.map(|mask| AttentionDropout { mask, first: b * heads * t * t, block: t });
        let (y, att) = attention(&qkv_b, len, heads, hs, drop.as_ref());
        let (_, _, dqkv) = attention_backward(&qkv_b, &att, &dy_b, len, heads, hs, drop.as_ref());
        let lse = reference_lse(&qkv_b, len, heads, hs);
        let narrow = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        pairs[0].0.extend(&y_got[rows.start * c..rows.end * c]);
        pairs[0].1.extend(narrow(&y));
        for h in 0..heads {
            pairs[1].0.extend(&lse_got[(b * heads + h) * t..][..len]);
            pairs[1].1.extend(narrow(&lse[h * len..][..len]));
        }
        for (i, pair) in pairs[2..5].iter_mut().enumerate() {
            for r in 0..len {
                pair.0.extend(&dqkv_got[(rows.start + r) * 3 * c + i * c..][..c]);
                pair.1.extend(narrow(&dqkv[r * 3 * c + i * c..][..c]));
            }
        }
    }
    let dropout = if s.dropout > 0.0 { format!(" dropout {}", s.dropout) } else { String::new() };
    let shape = format!("T={t} len={len} C={c} NH={heads} HS={hs} B={}{dropout}", s.batch);
    // The copies are the outputs rounded once: bit for bit, tolerance 0.
    let names = ["y", "lse", "dq", "dk", "dv", "y's bf16 copy", "dqkv's bf16 copy"];
    Ok(names
        .iter()
        .zip(&pairs)
        .enumerate()
        .map(|(i, (name, (got, want)))| Check {
            kernel: format!("transformer bf16 flash attention {name}"),
            shape: shape.clone(),
            rel_error: rel_error(got, want),
            tolerance: if i < 5 { flash_tolerance() } else { 0.0 },
        })
        .collect())
}
