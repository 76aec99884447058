//! The Transformer's selftest checks against the CPU reference (`model.rs`), on random ids with every
//! parameter drawn at random (LayerNorm gains around 1, biases and offsets around 0, so that no term is
//! trivially 1 or 0):
//!
//! - kernels: one batch's forward pass, stage by stage (each block's residual stream, LN1, qkv,
//!   attention output, the stream after attention, LN2, the FFN's pre-activation and GELU; LN_f, the
//!   losses and dlogits), then its backward pass: every parameter tensor's gradient, written over NaN,
//!   and the gradient of the embeddings' sum; in fp32 at 1e-4, and with the linear layers in TF32 on the
//!   tensor cores against the same fp32 reference at TF32_TOLERANCE;
//! - training: 100 AdamW steps through the production path (CUDA graphs of 50 steps) against
//!   `CpuTrainer` on the same batches: every tensor (the key bias aside, see `worst_tensor`) and the
//!   steps' losses;
//! - repeat: 20 steps twice from the same start give the same bits.
//!
//! The model has no kink (GELU, LayerNorm and softmax are smooth), so no draw needs redrawing: the GPU
//! and the reference differ by rounding only, amplified by AdamW where a gradient is near zero.

use super::data::{self, CharVocab, Corpus, UNKNOWN};
use super::gpu::{GpuTransformer, module_request};
use super::model::{self, Config, CpuTrainer, Layout};
use crate::check::{Check, Group, Plan, rel_error, worst};
use crate::cpu::SeededRng;
use crate::device::{Gpu, ModuleRequest};
use crate::ops::optim::{OptimConfig, OptimKind};
use anyhow::Result;
use rand::RngExt;
use rand_distr::{Distribution, Normal};
use std::sync::Arc;

/// Largest relative error of a kernel's fp32 result against the CPU reference.
pub const KERNEL_TOLERANCE: f64 = 1e-4;
/// With --tf32 the linear layers' operands are rounded to a 10-bit mantissa (relative 2⁻¹¹ ≈ 4.9e-4 each).
pub const TF32_TOLERANCE: f64 = 1e-2;
/// Largest relative error of a whole training run against the CPU reference.
pub const TRAINING_TOLERANCE: f64 = 1e-3;
const TRAINING_STEPS: usize = 100;

/// (config, batch) of the kernel checks: a small model with two heads of 16, a block of 150 (the
/// attention backward's three key chunks, the last one partial, and heads of 32), and the default one.
fn kernel_shapes(quick: bool) -> Vec<(Config, usize)> {
    let mut shapes = vec![
        (Config { vocab: 37, block: 16, embed: 32, heads: 2, layers: 2 }, 3),
        (Config { vocab: 29, block: 150, embed: 64, heads: 2, layers: 1 }, 2),
    ];
    if !quick {
        shapes.push((Config { vocab: 65, block: 64, embed: 64, heads: 4, layers: 2 }, 4));
    }
    shapes
}

/// The training checks' model.
const TRAINING_SHAPE: Config = Config { vocab: 23, block: 16, embed: 32, heads: 4, layers: 2 };
const TRAINING_BATCH: usize = 4;

fn label(c: &Config, batch: usize) -> String {
    format!("V={} T={} C={} NH={} L={} B={batch}", c.vocab, c.block, c.embed, c.heads, c.layers)
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

/// The kernel modules the checks compile (`--quick` too: its TF32 checks take the largest kernel shape).
pub fn modules(_plan: &Plan) -> Vec<ModuleRequest> {
    let configs = kernel_shapes(false).into_iter().map(|(config, _)| config).chain([TRAINING_SHAPE, REPEAT_SHAPE]);
    configs.map(|config| module_request(&config)).collect()
}

/// The selftest checks of fused/transformer.cu against the CPU reference.
pub fn selftest_checks(gpu: &Arc<Gpu>, plan: &Plan) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    if plan.wants(Group::Kernels) {
        let mut rng = plan.rng("transformer kernels");
        for (config, batch) in kernel_shapes(plan.quick) {
            out.extend(kernel_checks(gpu, config, batch, false, &mut rng)?);
        }
        let (config, batch) = kernel_shapes(false).pop().expect("the default shape");
        out.extend(kernel_checks(gpu, config, batch, true, &mut rng)?);
    }
    if plan.wants(Group::Training) {
        let mut rng = plan.rng("transformer training");
        out.push(training_check(gpu, &mut rng)?);
    }
    if plan.wants(Group::Repeat) {
        let mut rng = plan.rng("transformer repeat");
        out.push(repeat_check(gpu, &mut rng)?);
    }
    Ok(out)
}

/// Forward stage by stage and backward (every gradient) of one batch; with `tf32`, the linear layers on
/// the tensor cores, against the same fp32 reference at TF32_TOLERANCE.
pub fn kernel_checks(
    gpu: &Arc<Gpu>,
    config: Config,
    batch: usize,
    tf32: bool,
    rng: &mut SeededRng,
) -> Result<Vec<Check>> {
    let corpus = random_corpus(&config, 40 * config.block, rng);
    let params = random_params(&config, rng);
    let offsets = data::train_offsets(rng, corpus.train.len(), config.block, batch);
    let (tokens, targets) = data::windows(&corpus.train, &offsets, config.block);
    let f = model::forward::<f32>(&config, &params, &tokens, batch, Some(&targets));
    let back = model::backward(&config, &params, &f, &targets);

    let mut trainer = GpuTransformer::new(gpu.clone(), config, &params, adamw(), &corpus)?;
    trainer.set_tf32(tf32);
    let got = trainer.forward_backward_alone(&offsets)?;
    let (shape, tolerance) = if tf32 {
        (format!("{} tf32", label(&config, batch)), TF32_TOLERANCE)
    } else {
        (label(&config, batch), KERNEL_TOLERANCE)
    };
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

/// Offsets of `steps` training batches.
fn batches(corpus: &Corpus, config: &Config, steps: usize, rng: &mut SeededRng) -> Vec<u32> {
    (0..steps).flat_map(|_| data::train_offsets(rng, corpus.train.len(), config.block, TRAINING_BATCH)).collect()
}

/// 100 AdamW steps, GPU (graphs of 50 steps) against the CPU reference on the same batches.
pub fn training_check(gpu: &Arc<Gpu>, rng: &mut SeededRng) -> Result<Check> {
    let config = TRAINING_SHAPE;
    let corpus = random_corpus(&config, 60 * config.block, rng);
    let params = model::init(&config, rng.random());
    let offsets = batches(&corpus, &config, TRAINING_STEPS, rng);
    let mut gpu_trainer = GpuTransformer::new(gpu.clone(), config, &params, adamw(), &corpus)?;
    let mut gpu_losses = Vec::new();
    for part in offsets.chunks(50 * TRAINING_BATCH) {
        gpu_losses.extend(gpu_trainer.train_steps(part, TRAINING_BATCH)?);
    }
    let mut cpu = CpuTrainer::new(config, params, adamw())?;
    let mut cpu_losses = Vec::new();
    for o in offsets.chunks(TRAINING_BATCH) {
        let (tokens, targets) = data::windows(&corpus.train, o, config.block);
        cpu_losses.push(cpu.step(&tokens, &targets, TRAINING_BATCH));
    }
    let got = gpu_trainer.params()?;
    let (mut e, mut name) = worst_tensor(&Layout::new(&config), &got, &cpu.params, true);
    let gpu_losses: Vec<f32> = gpu_losses.iter().map(|&l| l as f32).collect();
    let loss_error = rel_error(&gpu_losses, &cpu_losses);
    if loss_error.is_nan() || loss_error > e {
        (e, name) = (loss_error, "the steps' losses".into());
    }
    Ok(Check {
        kernel: format!("transformer {TRAINING_STEPS} steps (graph) {}, worst: {name}", adamw().describe()),
        shape: label(&config, TRAINING_BATCH),
        rel_error: e,
        tolerance: TRAINING_TOLERANCE,
    })
}

/// The repeat check's model.
const REPEAT_SHAPE: Config = Config { vocab: 65, block: 64, embed: 64, heads: 4, layers: 2 };

/// The repeat check: 20 training steps twice from the same start must give the same bits.
pub fn repeat_check(gpu: &Arc<Gpu>, rng: &mut SeededRng) -> Result<Check> {
    let config = REPEAT_SHAPE;
    let corpus = random_corpus(&config, 40 * config.block, rng);
    let params = model::init(&config, rng.random());
    let offsets: Vec<u32> =
        (0..20).flat_map(|_| data::train_offsets(rng, corpus.train.len(), config.block, 32)).collect();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut t = GpuTransformer::new(gpu.clone(), config, &params, adamw(), &corpus)?;
        t.train_steps(&offsets, 32)?;
        runs.push(t.params()?);
    }
    let same = runs[0].iter().zip(&runs[1]).all(|(a, b)| a.to_bits() == b.to_bits());
    Ok(Check {
        kernel: "transformer 20 steps twice: the same bits".into(),
        shape: label(&config, 32),
        rel_error: if same { 0.0 } else { f64::INFINITY },
        tolerance: 0.0,
    })
}
