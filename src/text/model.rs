//! The text model and its CPU reference: the oracle for the GPU kernels in `fused/text.cu` and the
//! no-GPU fallback. The code is shaped like the kernels (forward → dlogits → row-wise W2 pass that both
//! forms dh from the old W2 and the W2 gradient → W1 rows → embedding rows) so the two read side by side.
//!
//! x      = mean of `E[t]` over the N context tokens            (D)
//! z1     = W1·x + b1,  h = ReLU(z1)                           (H)
//! logits = W2·h + b2,  p = softmax(logits)                    (V)
//! loss   = −log `p[target]`
//!
//! Layouts are row-major: E is V×D, W1 is H×D, W2 is V×H.

use crate::ops::cpu::SeededRng;
use crate::ops::cpu::{axpy, dot, top_k};
use anyhow::{Result, bail};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal, Uniform};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// The text model's sizes.
pub struct TextShape {
    /// Vocabulary size V, `<unk>` included.
    pub vocab: usize,
    /// Embedding width D.
    pub embed: usize,
    /// Hidden units H.
    pub hidden: usize,
    /// Context tokens N per prediction.
    pub context: usize,
}

impl TextShape {
    /// Ok when the sizes are usable, otherwise the error line.
    pub fn validate(&self) -> Result<()> {
        if self.vocab < 2 {
            bail!("the vocabulary needs at least 2 entries (<unk> and one token), got {}", self.vocab);
        }
        if self.embed == 0 || self.hidden == 0 || self.context == 0 {
            bail!("--embed, --hidden and --context must be at least 1");
        }
        if self.vocab > u32::MAX as usize / 2 {
            bail!("vocabulary of {} entries is too large", self.vocab);
        }
        Ok(())
    }

    /// Number of parameters (saturating).
    pub fn parameter_count(&self) -> u64 {
        let [v, d, h] = [self.vocab, self.embed, self.hidden].map(|n| n as u64);
        v.saturating_mul(d)
            .saturating_add(h.saturating_mul(d))
            .saturating_add(h)
            .saturating_add(v.saturating_mul(h))
            .saturating_add(v)
    }

    /// Host memory a training run on `tokens` tokens takes at its peak, beyond the corpus already read.
    /// The parameters exist four times on the CPU (the trainer's, the last good epoch's, and while saving
    /// the model file's tensor bytes and serialized bytes) and three times with a GPU trainer, which
    /// keeps none on the host; a CPU step of `batch` samples adds their forward values, ∂h and ∂x (its
    /// dense gradients are smaller than the two copies that exist only while saving); the token stream
    /// is copied once for the trainer and the training positions once for the shuffle.
    pub fn training_memory(&self, batch: usize, tokens: usize, on_cpu: bool) -> crate::io::resources::MemoryNeed {
        let [v, d, h, b] = [self.vocab, self.embed, self.hidden, batch].map(|n| n as u64);
        let copies: u64 = if on_cpu { 4 } else { 3 };
        let per_sample = 2 * d + 3 * h + 2 * v;
        let activations = if on_cpu { b.saturating_mul(per_sample).saturating_mul(4) } else { 0 };
        crate::io::resources::MemoryNeed {
            parts: vec![
                (
                    "parameters and their copies",
                    copies.saturating_mul(self.parameter_count()).saturating_mul(4),
                    "--embed, --hidden or --max-vocab",
                ),
                ("a batch's activations", activations, "--batch"),
                ("token arrays", 8 * tokens as u64, "--max-tokens"),
            ],
        }
    }
}

/// All trainable parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct TextParams {
    /// The sizes.
    pub shape: TextShape,
    /// Embedding E, `[V][D]` row-major.
    pub embedding: Vec<f32>,
    /// Hidden weights W1, `[H][D]` row-major.
    pub w1: Vec<f32>,
    /// Hidden biases b1, `[H]`.
    pub b1: Vec<f32>,
    /// Output weights W2, `[V][H]` row-major.
    pub w2: Vec<f32>,
    /// Output biases b2, `[V]`.
    pub b2: Vec<f32>,
}

impl TextParams {
    /// Embedding ~ N(0, 1) (as torch.nn.Embedding); W1 and W2 Xavier/Glorot uniform; biases zero.
    pub fn init(shape: TextShape, seed: u64) -> TextParams {
        let TextShape { vocab: v, embed: d, hidden: h, .. } = shape;
        let mut rng = SeededRng::seed_from_u64(seed);
        let normal = Normal::new(0.0f32, 1.0).unwrap();
        let xavier = |fan_in: usize, fan_out: usize, n: usize, rng: &mut SeededRng| -> Vec<f32> {
            let limit = (6.0 / (fan_in + fan_out) as f32).sqrt();
            let dist = Uniform::new_inclusive(-limit, limit).unwrap();
            (0..n).map(|_| dist.sample(rng)).collect()
        };
        let embedding = (0..v * d).map(|_| normal.sample(&mut rng)).collect();
        let w1 = xavier(d, h, h * d, &mut rng);
        let w2 = xavier(h, v, v * h, &mut rng);
        TextParams { shape, embedding, w1, b1: vec![0.0; h], w2, b2: vec![0.0; v] }
    }

    /// Named tensors in file order, with their shapes.
    pub fn tensors(&self) -> [(&'static str, &[f32], Vec<usize>); 5] {
        let TextShape { vocab: v, embed: d, hidden: h, .. } = self.shape;
        [
            ("embedding", &self.embedding, vec![v, d]),
            ("w1", &self.w1, vec![h, d]),
            ("b1", &self.b1, vec![h]),
            ("w2", &self.w2, vec![v, h]),
            ("b2", &self.b2, vec![v]),
        ]
    }

    /// Whether every parameter is finite.
    pub fn all_finite(&self) -> bool {
        self.tensors().iter().all(|(_, t, _)| t.iter().all(|x| x.is_finite()))
    }
}

/// Context tokens of the sample whose target sits at `pos` in the token stream.
#[inline]
pub fn context_of(tokens: &[u32], pos: u32, n: usize) -> &[u32] {
    let pos = pos as usize;
    &tokens[pos - n..pos]
}

/// Forward-pass values of one sample.
#[derive(Clone, Debug)]
pub struct Activations {
    /// Mean context embedding x, `[D]`.
    pub x: Vec<f32>,
    /// Hidden pre-activation z1, `[H]`.
    pub z1: Vec<f32>,
    /// Hidden layer h = ReLU(z1), `[H]`.
    pub h: Vec<f32>,
    /// Logits, `[V]`.
    pub logits: Vec<f32>,
    /// Softmax probabilities.
    pub probs: Vec<f32>,
    /// log Σ exp(logits), so loss = logsumexp − `logits[target]`.
    pub logsumexp: f32,
}

impl Activations {
    /// Zeroed values for `shape`.
    pub fn new(shape: TextShape) -> Activations {
        Activations {
            x: vec![0.0; shape.embed],
            z1: vec![0.0; shape.hidden],
            h: vec![0.0; shape.hidden],
            logits: vec![0.0; shape.vocab],
            probs: vec![0.0; shape.vocab],
            logsumexp: 0.0,
        }
    }

    /// Cross-entropy of `target`: −log `p[target]`, in nats.
    pub fn loss(&self, target: u32) -> f32 {
        self.logsumexp - self.logits[target as usize]
    }
}

/// Averages the context embeddings into `x`.
pub fn embed_context(p: &TextParams, context: &[u32], x: &mut [f32]) {
    let d = p.shape.embed;
    x.fill(0.0);
    for &t in context {
        let row = &p.embedding[t as usize * d..][..d];
        for (xi, ei) in x.iter_mut().zip(row) {
            *xi += ei;
        }
    }
    let inv = 1.0 / context.len() as f32;
    x.iter_mut().for_each(|xi| *xi *= inv);
}

/// Forward pass from an already averaged input `a.x` (what `predict` and the kernels share).
pub fn forward_from_x(p: &TextParams, a: &mut Activations) {
    let TextShape { embed: d, hidden: h, .. } = p.shape;
    for j in 0..h {
        a.z1[j] = dot(&p.w1[j * d..][..d], &a.x) + p.b1[j];
        a.h[j] = a.z1[j].max(0.0);
    }
    for (v, logit) in a.logits.iter_mut().enumerate() {
        *logit = dot(&p.w2[v * h..][..h], &a.h) + p.b2[v];
    }
    let max = a.logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for (prob, &logit) in a.probs.iter_mut().zip(&a.logits) {
        *prob = (logit - max).exp();
        sum += *prob;
    }
    let inv = 1.0 / sum;
    a.probs.iter_mut().for_each(|q| *q *= inv);
    a.logsumexp = max + sum.ln();
}

/// Runs the model on `context` (N token ids), filling `a`.
pub fn forward(p: &TextParams, context: &[u32], a: &mut Activations) {
    embed_context(p, context, &mut a.x);
    forward_from_x(p, a);
}

/// Gradients of the mean loss over a batch. W1, b1, W2, b2 are dense; the embedding gradient is kept as
/// one `dx` row per sample (∂loss/∂x), which reaches each of that sample's N context rows divided by N.
#[derive(Clone, Debug)]
pub struct Grads {
    /// W1's gradient, `[H][D]`.
    pub w1: Vec<f32>,
    /// b1's gradient, `[H]`.
    pub b1: Vec<f32>,
    /// W2's gradient, `[V][H]`.
    pub w2: Vec<f32>,
    /// b2's gradient, `[V]`.
    pub b2: Vec<f32>,
    /// B×H: ∂(mean loss)/∂h of each sample (before the ReLU mask), what the kernels pass between them.
    pub dh: Vec<f32>,
    /// B×D: ∂(mean loss)/∂x of each sample (already divided by B).
    pub dx: Vec<f32>,
}

impl Grads {
    /// The dense embedding gradient (V×D), for checks; training applies `dx` row by row instead.
    pub fn embedding_dense(&self, shape: TextShape, contexts: &[&[u32]]) -> Vec<f32> {
        let d = shape.embed;
        let mut g = vec![0.0f32; shape.vocab * d];
        for (s, ctx) in contexts.iter().enumerate() {
            for &t in *ctx {
                axpy(1.0 / ctx.len() as f32, &self.dx[s * d..][..d], &mut g[t as usize * d..][..d]);
            }
        }
        g
    }
}

/// Forward and backward over a batch of (context, target) samples. Returns the gradients of the mean
/// loss and the summed loss. All parameters are read as they are before any update.
pub fn backward(p: &TextParams, contexts: &[&[u32]], targets: &[u32]) -> (Grads, f64) {
    let TextShape { vocab: v, embed: d, hidden: h, .. } = p.shape;
    let b = contexts.len();
    let inv_b = 1.0 / b as f32;
    let mut acts = Vec::with_capacity(b);
    let mut loss_sum = 0.0f64;
    // dlogits = (p − onehot(target)) / B, stored in place of the probabilities.
    for (ctx, &t) in contexts.iter().zip(targets) {
        let mut a = Activations::new(p.shape);
        forward(p, ctx, &mut a);
        loss_sum += a.loss(t) as f64;
        a.probs[t as usize] -= 1.0;
        a.probs.iter_mut().for_each(|g| *g *= inv_b);
        acts.push(a);
    }
    // W2 rows: gW2[r] = Σ_s dlogits_s[r]·h_s, and dh_s += W2[r]·dlogits_s[r] with the old W2.
    let mut w2 = vec![0.0f32; v * h];
    let mut b2 = vec![0.0f32; v];
    let mut dh = vec![0.0f32; b * h];
    for r in 0..v {
        let row = &p.w2[r * h..][..h];
        let grad_row = &mut w2[r * h..][..h];
        for (s, a) in acts.iter().enumerate() {
            let g = a.probs[r];
            b2[r] += g;
            axpy(g, &a.h, grad_row);
            axpy(g, row, &mut dh[s * h..][..h]);
        }
    }
    // W1 rows through the ReLU mask; dx_s += W1[j]·dz1_s[j] with the old W1.
    let mut w1 = vec![0.0f32; h * d];
    let mut b1 = vec![0.0f32; h];
    let mut dx = vec![0.0f32; b * d];
    for j in 0..h {
        let row = &p.w1[j * d..][..d];
        for (s, a) in acts.iter().enumerate() {
            let dz = if a.z1[j] > 0.0 { dh[s * h + j] } else { 0.0 };
            b1[j] += dz;
            axpy(dz, &a.x, &mut w1[j * d..][..d]);
            axpy(dz, row, &mut dx[s * d..][..d]);
        }
    }
    (Grads { w1, b1, w2, b2, dh, dx }, loss_sum)
}

/// SGD: θ ← θ − lr·g on every parameter, the embedding rows of each sample's context included.
pub fn sgd_update(p: &mut TextParams, g: &Grads, contexts: &[&[u32]], lr: f32) {
    let d = p.shape.embed;
    axpy(-lr, &g.w1, &mut p.w1);
    axpy(-lr, &g.b1, &mut p.b1);
    axpy(-lr, &g.w2, &mut p.w2);
    axpy(-lr, &g.b2, &mut p.b2);
    for (s, ctx) in contexts.iter().enumerate() {
        let scale = -lr / ctx.len() as f32;
        for &t in *ctx {
            axpy(scale, &g.dx[s * d..][..d], &mut p.embedding[t as usize * d..][..d]);
        }
    }
}

/// One step of `optimizer` (momentum or Adam; `src/ops/optim.rs`) over every parameter, flattened in the
/// order E, W1, b1, W2, b2. Unlike `sgd_update`, the embedding's gradient is dense: rows no context used
/// get a zero gradient and still move under momentum, weight decay or Adam's moments, as a PyTorch
/// `nn.Embedding` does with a dense optimizer.
pub fn optimizer_update(
    p: &mut TextParams,
    g: &Grads,
    contexts: &[&[u32]],
    optimizer: &mut crate::ops::optim::Optimizer,
) {
    let grad: Vec<f32> = [&g.embedding_dense(p.shape, contexts)[..], &g.w1, &g.b1, &g.w2, &g.b2].concat();
    let mut flat: Vec<f32> = [&p.embedding[..], &p.w1, &p.b1, &p.w2, &p.b2].concat();
    optimizer.step(&mut flat, &grad);
    let mut rest = &flat[..];
    for part in [&mut p.embedding, &mut p.w1, &mut p.b1, &mut p.w2, &mut p.b2] {
        let (head, tail) = rest.split_at(part.len());
        part.copy_from_slice(head);
        rest = tail;
    }
}

/// One training step on the samples whose targets sit at `positions`; returns the summed loss.
pub fn train_step(p: &mut TextParams, tokens: &[u32], positions: &[u32], lr: f32) -> f64 {
    let n = p.shape.context;
    let contexts: Vec<&[u32]> = positions.iter().map(|&pos| context_of(tokens, pos, n)).collect();
    let targets: Vec<u32> = positions.iter().map(|&pos| tokens[pos as usize]).collect();
    let (g, loss) = backward(p, &contexts, &targets);
    sgd_update(p, &g, &contexts, lr);
    loss
}

/// Sums over an evaluation set: loss, and how often the target is the top-1 / within the top-5.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvalSums {
    /// Samples evaluated.
    pub samples: u64,
    /// Summed loss in nats.
    pub loss: f64,
    /// Samples whose target was the top prediction.
    pub top1: u64,
    /// Samples whose target was among the top 5.
    pub top5: u64,
}

impl EvalSums {
    /// Adds another set's sums to these.
    pub fn add(&mut self, other: EvalSums) {
        self.samples += other.samples;
        self.loss += other.loss;
        self.top1 += other.top1;
        self.top5 += other.top5;
    }
}

/// Loss and top-k hits of the samples at `positions`, without updating anything.
pub fn evaluate(p: &TextParams, tokens: &[u32], positions: &[u32]) -> EvalSums {
    let mut a = Activations::new(p.shape);
    let mut sums = EvalSums::default();
    for &pos in positions {
        let target = tokens[pos as usize];
        forward(p, context_of(tokens, pos, p.shape.context), &mut a);
        sums.samples += 1;
        sums.loss += a.loss(target) as f64;
        let best = top_k(&a.logits, 5);
        sums.top1 += (best.first() == Some(&(target as usize))) as u64;
        sums.top5 += best.contains(&(target as usize)) as u64;
    }
    sums
}
