//! The CPU trainer for batches: the text model's SGD step for B samples at once as matrix products
//! (`matrixmultiply`'s sgemm, their rows shared out over rayon's threads), and a batched evaluation.
//!
//! Why: the single-sample reference (`model.rs`) is a chain of dot products and AXPYs, one sample at a
//! time on one core; on the whole Shakespeare corpus (V = 8192) that is about 600 samples a second on
//! the 2-core development machine, over two hours for the default five epochs. A batch turns the three
//! V×H passes of a step (logits, ∂W2, ∂h) into matrix products on SIMD FMA kernels, on every core. The
//! math is the reference's: `gradients` returns the same `Grads` as `model::backward` (up to the order
//! of the sums), and a step is `model::train_step`'s. `model.rs` stays the oracle;
//! tests/it/text_cpu_batch.rs holds this file to it.
//!
//! For B samples with inputs X (B×D, the mean of each sample's context embeddings):
//! ```text
//! Z1 = X·W1ᵀ + b1,  Hd = ReLU(Z1)                               B×H
//! L  = Hd·W2ᵀ + b2,  G = (softmax(L) − onehot(target)) / B       B×V (G = ∂ mean loss / ∂L)
//! ∂W2 = Gᵀ·Hd,  ∂b2 = Σ_rows G,  ∂Hd = G·W2                      V×H, V, B×H
//! ∂Z1 = ∂Hd ⊙ [Z1 > 0],  ∂W1 = ∂Z1ᵀ·X,  ∂b1 = Σ_rows ∂Z1,  ∂X = ∂Z1·W1
//! ∂E[t] += ∂X[s] / N  for each of sample s's N context tokens t
//! ```
//! then θ ← θ − lr·∂θ, all gradients taken from the parameters before the step; only the embedding rows
//! of the batch's contexts change, as in the reference.
//!
//! Batches of B samples at lr ≈ B × the single-sample rate follow single-sample SGD's validation loss
//! epoch for epoch on the corpus (BENCHMARKS.md, "CPU fallback"), which is why `textnet train` uses this
//! trainer with batch 256 on the CPU by default (`cli.rs`); `measure` times a few steps so the command
//! can say how long the run will take before it starts.

use super::TextTrainer;
use super::model::{EvalSums, Grads, TextParams, TextShape, context_of};
use crate::device::precision::Precision;
use crate::ops::cpu::{Mat, gemm, top_k};
use crate::ops::gemm::round_bf16;
use anyhow::{Result, bail};
use rayon::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Samples per forward pass when evaluating (the logits of a chunk are chunk × V floats).
pub const EVAL_CHUNK: usize = 512;

/// `gemm` with C's rows shared out over rayon's threads (each element's sum is the same however the
/// rows are split).
fn par_gemm(a: Mat<f32>, b: Mat<f32>, beta: f32, c: &mut [f32]) {
    let (m, n) = (a.rows, b.cols);
    let threads = rayon::current_num_threads().max(1);
    let rows = m.div_ceil(threads).max(1);
    if threads == 1 || m < 2 || n == 0 {
        return gemm(a, b, beta, c);
    }
    c.par_chunks_mut(rows * n).enumerate().for_each(|(i, part)| {
        let start = i * rows;
        gemm(a.slice_rows(start, part.len() / n), b, beta, part);
    });
}

/// The step's buffers, kept between steps (sized for the largest batch seen).
#[derive(Default)]
struct Work {
    /// B×D inputs: the mean of each sample's context embeddings.
    x: Vec<f32>,
    /// B×H pre-activations, B×H activations.
    z1: Vec<f32>,
    h: Vec<f32>,
    /// B×V logits, turned into ∂(mean loss)/∂logits in place.
    logits: Vec<f32>,
    /// B×H ∂/∂z1 (∂/∂h through the ReLU mask).
    dz1: Vec<f32>,
    /// bf16 steps: Hd and W2 rounded to bf16 (as f32), the operands of the three V×H products.
    h_bf16: Vec<f32>,
    w2_bf16: Vec<f32>,
    targets: Vec<u32>,
    /// Per sample: loss (training), or loss and top-1/top-5 hits (evaluation).
    rows: Vec<(f32, bool, bool)>,
}

impl Work {
    fn size(&mut self, s: TextShape, b: usize) {
        let fit = |v: &mut Vec<f32>, n: usize| v.resize(n, 0.0);
        fit(&mut self.x, b * s.embed);
        fit(&mut self.z1, b * s.hidden);
        fit(&mut self.h, b * s.hidden);
        fit(&mut self.logits, b * s.vocab);
        fit(&mut self.dz1, b * s.hidden);
    }
}

/// Gradient buffers of the shape's size (`Grads` as `model::backward` returns it).
fn zero_grads(s: TextShape, b: usize) -> Grads {
    Grads {
        w1: vec![0.0; s.hidden * s.embed],
        b1: vec![0.0; s.hidden],
        w2: vec![0.0; s.vocab * s.hidden],
        b2: vec![0.0; s.vocab],
        dh: vec![0.0; b * s.hidden],
        dx: vec![0.0; b * s.embed],
    }
}

/// The forward pass of the samples whose targets sit at `positions`: `w.x`, `w.z1`, `w.h` and the
/// logits in `w.logits`, all row-major, one row per sample. At bf16 the logits are the product of Hd
/// and W2 rounded to bf16 (left in `w.h_bf16`, `w.w2_bf16`), with fp32 sums, as the GPU's bf16 step.
fn forward(p: &TextParams, tokens: &[u32], positions: &[u32], w: &mut Work, precision: Precision) {
    let TextShape { vocab: v, embed: d, hidden: h, context: n } = p.shape;
    let b = positions.len();
    w.size(p.shape, b);
    w.x[..b * d].par_chunks_mut(d).zip(positions).for_each(|(x, &pos)| {
        super::model::embed_context(p, context_of(tokens, pos, n), x);
    });
    let (x, z1, hd) = (&w.x[..b * d], &mut w.z1[..b * h], &mut w.h[..b * h]);
    z1.chunks_mut(h).for_each(|row| row.copy_from_slice(&p.b1));
    par_gemm(Mat::rows_of(x, b, d), Mat::rows_of(&p.w1, h, d).t(), 1.0, z1);
    hd.iter_mut().zip(z1.iter()).for_each(|(a, &z)| *a = z.max(0.0));
    let logits = &mut w.logits[..b * v];
    logits.par_chunks_mut(v).for_each(|row| row.copy_from_slice(&p.b2));
    if precision == Precision::Bf16 {
        w.h_bf16.clear();
        w.h_bf16.extend(hd.iter().map(|&x| round_bf16(x)));
        w.w2_bf16.clear();
        w.w2_bf16.extend(p.w2.iter().map(|&x| round_bf16(x)));
        par_gemm(Mat::rows_of(&w.h_bf16, b, h), Mat::rows_of(&w.w2_bf16, v, h).t(), 1.0, logits);
    } else {
        par_gemm(Mat::rows_of(hd, b, h), Mat::rows_of(&p.w2, v, h).t(), 1.0, logits);
    }
}

/// eˣ for x ≤ 0 (what a softmax takes after subtracting the maximum), within 2 ulp of `f32::exp`
/// down to x = −87 (below that ~1e-38 or less): Cephes' `expf` (2ᵏ·eʳ, |r| ≤ ln 2 / 2, a degree-6
/// polynomial), free of branches and calls so a loop of it vectorizes; libm's `expf` per element took
/// a fifth of a step.
#[inline]
pub fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Round to nearest by adding and subtracting 1.5·2²³.
    const ROUND: f32 = 12_582_912.0;
    let x = x.max(-87.0);
    let k = (x * LOG2E + ROUND) - ROUND;
    let r = x - k * LN2_HI - k * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e_r = p * r * r + r + 1.0;
    e_r * f32::from_bits(((k as i32 + 127) as u32) << 23)
}

/// Replaces `row` by exp(row − max) and returns the max and Σ exp(row − max).
fn exp_shifted(row: &mut [f32]) -> (f32, f32) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    row.iter_mut().for_each(|l| *l = exp_nonpositive(*l - max));
    // Eight running sums, as `cpu::dot`, so the sum vectorizes too.
    let mut acc = [0f32; 8];
    let chunks = row.chunks_exact(8);
    let rest: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for k in 0..8 {
            acc[k] += c[k];
        }
    }
    (max, acc.iter().sum::<f32>() + rest)
}

/// Forward and backward over the samples at `positions`: fills `g` with the gradients of their mean
/// loss (all parameters read as they are, none updated) and returns the summed loss. At bf16 the three
/// V×H products read bf16 operands (Hd, W2 and G rounded; fp32 sums), the GPU's bf16 step
/// (fused/text_batch.cu); everything else is the fp32 step's.
fn gradients_into(
    p: &TextParams,
    tokens: &[u32],
    positions: &[u32],
    w: &mut Work,
    g: &mut Grads,
    precision: Precision,
) -> f64 {
    let TextShape { vocab: v, embed: d, hidden: h, .. } = p.shape;
    let b = positions.len();
    let bf16 = precision == Precision::Bf16;
    forward(p, tokens, positions, w, precision);
    w.targets.clear();
    w.targets.extend(positions.iter().map(|&pos| tokens[pos as usize]));
    // G = (softmax − onehot) / B in place of the logits, and each sample's loss.
    let inv_b = 1.0 / b as f32;
    w.rows.resize(b, (0.0, false, false));
    w.logits[..b * v].par_chunks_mut(v).zip(&w.targets).zip(&mut w.rows[..b]).for_each(|((row, &t), out)| {
        let target = row[t as usize];
        let (max, sum) = exp_shifted(row);
        out.0 = max + sum.ln() - target;
        let scale = inv_b / sum;
        row.iter_mut().for_each(|q| *q *= scale);
        row[t as usize] -= inv_b;
        if bf16 {
            row.iter_mut().for_each(|q| *q = round_bf16(*q));
        }
    });
    let loss: f64 = w.rows[..b].iter().map(|r| r.0 as f64).sum();
    let (x, z1, hd, gl) = (&w.x[..b * d], &w.z1[..b * h], &w.h[..b * h], &w.logits[..b * v]);

    // ∂b2: column sums of G, in sample order; ∂W2 = Gᵀ·Hd; ∂Hd = G·W2 (the old W2).
    let threads = rayon::current_num_threads().max(1);
    g.b2.par_chunks_mut(v.div_ceil(threads).max(1)).enumerate().for_each(|(i, part)| {
        let start = i * v.div_ceil(threads).max(1);
        part.fill(0.0);
        for row in gl.chunks(v) {
            part.iter_mut().zip(&row[start..]).for_each(|(s, &x)| *s += x);
        }
    });
    let (h_op, w2_op) = if bf16 { (&w.h_bf16[..b * h], &w.w2_bf16[..]) } else { (hd, &p.w2[..]) };
    par_gemm(Mat::rows_of(gl, b, v).t(), Mat::rows_of(h_op, b, h), 0.0, &mut g.w2);
    g.dh.resize(b * h, 0.0);
    par_gemm(Mat::rows_of(gl, b, v), Mat::rows_of(w2_op, v, h), 0.0, &mut g.dh);

    // Through the ReLU: ∂Z1, ∂b1, ∂W1 = ∂Z1ᵀ·X, ∂X = ∂Z1·W1 (the old W1).
    let dz1 = &mut w.dz1[..b * h];
    dz1.iter_mut().zip(&g.dh).zip(z1).for_each(|((o, &dh), &z)| *o = if z > 0.0 { dh } else { 0.0 });
    g.b1.fill(0.0);
    for row in dz1.chunks(h) {
        g.b1.iter_mut().zip(row).for_each(|(s, &x)| *s += x);
    }
    gemm(Mat::rows_of(dz1, b, h).t(), Mat::rows_of(x, b, d), 0.0, &mut g.w1);
    g.dx.resize(b * d, 0.0);
    gemm(Mat::rows_of(dz1, b, h), Mat::rows_of(&p.w1, h, d), 0.0, &mut g.dx);
    loss
}

/// The gradients of the mean loss over the samples at `positions` and their summed loss: what
/// `model::backward` computes for the same samples, as batched matrix products.
pub fn gradients(p: &TextParams, tokens: &[u32], positions: &[u32]) -> (Grads, f64) {
    gradients_at(p, tokens, positions, Precision::Fp32)
}

/// `gradients` with the three V×H products at `precision` (fp32, or bf16 as the GPU's bf16 step).
pub fn gradients_at(p: &TextParams, tokens: &[u32], positions: &[u32], precision: Precision) -> (Grads, f64) {
    let mut g = zero_grads(p.shape, positions.len());
    let loss = gradients_into(p, tokens, positions, &mut Work::default(), &mut g, precision);
    (g, loss)
}

/// θ ← θ − lr·g over a dense tensor, its elements shared out over the threads.
fn par_sgd(theta: &mut [f32], g: &[f32], lr: f32) {
    theta.par_chunks_mut(1 << 14).zip(g.par_chunks(1 << 14)).for_each(|(t, g)| crate::ops::cpu::axpy(-lr, g, t));
}

/// Loss and top-1/top-5 hits over `positions`, in chunks of `EVAL_CHUNK` samples.
fn evaluate_with(p: &TextParams, tokens: &[u32], positions: &[u32], w: &mut Work) -> EvalSums {
    let v = p.shape.vocab;
    let mut sums = EvalSums::default();
    for chunk in positions.chunks(EVAL_CHUNK) {
        forward(p, tokens, chunk, w, Precision::Fp32);
        w.rows.resize(chunk.len(), (0.0, false, false));
        w.logits[..chunk.len() * v].par_chunks_mut(v).zip(chunk).zip(&mut w.rows[..chunk.len()]).for_each(
            |((row, &pos), out)| {
                let target = tokens[pos as usize] as usize;
                let best = top_k(row, 5);
                let logit = row[target];
                let (max, sum) = exp_shifted(row);
                *out = (max + sum.ln() - logit, best.first() == Some(&target), best.contains(&target));
            },
        );
        for &(loss, top1, top5) in &w.rows[..chunk.len()] {
            sums.samples += 1;
            sums.loss += loss as f64;
            sums.top1 += top1 as u64;
            sums.top5 += top5 as u64;
        }
    }
    sums
}

/// The batched CPU trainer: SGD steps of whole batches, on all of rayon's threads; at bf16 the twin of
/// the GPU's bf16 step (evaluation stays fp32 on both).
pub struct BatchTrainer {
    params: TextParams,
    tokens: Arc<[u32]>,
    work: Work,
    grads: Grads,
    precision: Precision,
}

impl BatchTrainer {
    /// A trainer of `params` on the corpus `tokens`.
    pub fn new(params: TextParams, tokens: Arc<[u32]>) -> BatchTrainer {
        Self::at(params, tokens, Precision::Fp32)
    }

    /// A trainer whose three V×H products run at `precision` (fp32 or bf16; TF32 is not offered).
    pub fn at(params: TextParams, tokens: Arc<[u32]>, precision: Precision) -> BatchTrainer {
        let grads = zero_grads(params.shape, 0);
        BatchTrainer { params, tokens, work: Work::default(), grads, precision }
    }

    /// One SGD step on the samples at `positions` (what `model::train_step` does); returns their summed
    /// loss.
    pub fn step(&mut self, positions: &[u32], lr: f32) -> f64 {
        let loss =
            gradients_into(&self.params, &self.tokens, positions, &mut self.work, &mut self.grads, self.precision);
        let (p, g) = (&mut self.params, &self.grads);
        par_sgd(&mut p.w2, &g.w2, lr);
        par_sgd(&mut p.b2, &g.b2, lr);
        par_sgd(&mut p.w1, &g.w1, lr);
        par_sgd(&mut p.b1, &g.b1, lr);
        // The embedding rows in sample order, as the reference: a token in several contexts gets each
        // share in turn.
        let (d, n) = (p.shape.embed, p.shape.context);
        let scale = -lr / n as f32;
        for (s, &pos) in positions.iter().enumerate() {
            for &t in context_of(&self.tokens, pos, n) {
                crate::ops::cpu::axpy(scale, &g.dx[s * d..][..d], &mut p.embedding[t as usize * d..][..d]);
            }
        }
        loss
    }
}

impl TextTrainer for BatchTrainer {
    fn train_steps(&mut self, positions: &[u32], batch: usize, rates: &[f32]) -> Result<f64> {
        super::check_rates(positions.len(), batch, rates)?;
        Ok(positions.chunks(batch.max(1)).zip(rates).map(|(step, &lr)| self.step(step, lr)).sum())
    }

    fn evaluate(&mut self, positions: &[u32]) -> Result<EvalSums> {
        Ok(evaluate_with(&self.params, &self.tokens, positions, &mut self.work))
    }

    fn params(&mut self) -> Result<TextParams> {
        Ok(self.params.clone())
    }
}

/// The most samples `measure` trains.
const MEASURED_SAMPLES: usize = 4096;

/// How fast a trainer went over a few of the run's own samples.
#[derive(Clone, Copy, Debug)]
pub struct Speed {
    /// Training samples per second.
    pub train_samples_per_s: f64,
    /// Evaluation samples per second.
    pub eval_samples_per_s: f64,
}

impl Speed {
    /// Seconds for `epochs` epochs of `train` samples, each followed by evaluating `val` samples.
    pub fn estimate_s(&self, epochs: usize, train: usize, val: usize) -> f64 {
        epochs as f64 * (train as f64 / self.train_samples_per_s + val as f64 / self.eval_samples_per_s)
    }
}

/// Times `trainer` (a throwaway copy: it is trained) on the first samples of `train` after one untimed
/// warm-up step, for about `budget` or `MEASURED_SAMPLES` samples, whichever comes first (a small model
/// is timed in milliseconds), then its evaluation on the first `EVAL_CHUNK` of `val`.
pub fn measure(
    trainer: &mut dyn TextTrainer,
    train: &[u32],
    val: &[u32],
    batch: usize,
    lr: f32,
    budget: Duration,
) -> Result<Speed> {
    if train.is_empty() {
        bail!("internal: nothing to time");
    }
    let batch = batch.clamp(1, train.len());
    let mut steps = train.chunks(batch).cycle();
    // Warm first (caches, the allocator, rayon's threads): timing a cold trainer overstated a run by half.
    let warming = Instant::now();
    while warming.elapsed() < budget / 2 {
        trainer.train(steps.next().unwrap_or_default(), batch, lr)?;
    }
    let started = Instant::now();
    let mut samples = 0;
    while samples == 0 || (started.elapsed() < budget && samples < MEASURED_SAMPLES) {
        let step = steps.next().unwrap_or_default();
        trainer.train(step, batch, lr)?;
        samples += step.len();
    }
    let train_samples_per_s = samples as f64 / started.elapsed().as_secs_f64();
    let part = &val[..val.len().min(EVAL_CHUNK)];
    let started = Instant::now();
    trainer.evaluate(part)?;
    let eval_samples_per_s = part.len().max(1) as f64 / started.elapsed().as_secs_f64().max(1e-9);
    Ok(Speed { train_samples_per_s, eval_samples_per_s })
}
