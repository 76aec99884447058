//! nanoGPT's `model.py` written with `textnet::nn`, class for class (`CausalSelfAttention`, `MLP`,
//! `Block`, `GPT` with the token embedding tied to the output head, `configure_optimizers`), trained by
//! its `train.py` loop on the character-level Shakespeare recipe (`config/train_shakespeare_char.py`):
//! 6 layers, 6 heads, 384 wide, block 256, batch 64, dropout 0.2, AdamW (rate 1e-3, β2 0.99, weight
//! decay 0.1 on the matrices and embeddings only), 100 steps of warm-up then a cosine down to 1e-4 at
//! step 5000, gradients clipped to norm 1, the losses estimated on 200 batches of each split every 250
//! steps. The vocabulary is the corpus's sorted characters, the first 90 % trains and the rest validates,
//! and a batch is `batch` windows at random offsets, as `data/shakespeare_char/prepare.py` and `get_batch`.
//!
//! What differs from nanoGPT's code, and why:
//! - `CausalSelfAttention.forward`'s split of `c_attn(x)` into q, k, v, their views and transposes into
//!   heads, `F.scaled_dot_product_attention(is_causal=True, dropout_p=...)` and the transpose back are one
//!   op, `causal_self_attention` on the packed rows (flash-attn's `qkvpacked` form): the same math without
//!   six copies a layer, on the flash kernels in bf16. `attn_dropout` becomes the layer it draws from.
//! - `nn.GELU()` is the tanh form (textnet's kernels' GELU), not the erf form.
//! - Products run in bf16 with `--precision bf16` (PyTorch's autocast), fp32 otherwise; nothing else of
//!   autocast (LayerNorm, softmax and the loss stay fp32 either way).
//! - `torch.compile` becomes `CapturedStep`: the training step (forward, loss, backward, clip, AdamW) is
//!   recorded once and replayed as one CUDA graph, and so is the evaluation forward.
//! - Random numbers come from textnet's seeded generator, so the initial weights and batches are not
//!   PyTorch's for the same seed.
//!
//! usage: cargo run --release --example nanogpt -- CORPUS [--device cuda] [--precision bf16] [--iters N] ...
//! (`--help` lists the flags; the defaults are the recipe's). Prints nanoGPT's log lines and, with
//! `--json FILE`, writes the losses, the step times and tokens/s.

use anyhow::{Context, Result, bail};
use clap::Parser;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Normal};
use std::sync::Arc;
use std::time::Instant;
use textnet::device::precision::Precision;
use textnet::nn::{
    CapturedStep, Device, Dropout, Embedding, LayerNorm, Linear, Module, ModuleList, Optimizer, Scheduler, Tensor,
    causal_self_attention, clip_grad_norm, decay_groups, linear, no_grad, prefixed,
};
use textnet::ops::cpu::SeededRng;
use textnet::ops::optim::{OptimConfig, OptimKind};

#[derive(Parser, Debug, Clone)]
#[command(about = "nanoGPT's model and training loop on textnet::nn (character-level Shakespeare)")]
pub struct Args {
    /// The text to train on (nanoGPT's: tiny Shakespeare)
    corpus: std::path::PathBuf,
    /// Where to train: cpu, or cuda (the first GPU)
    #[arg(long, default_value = "cpu")]
    device: String,
    /// The products' arithmetic on the GPU: fp32 or bf16
    #[arg(long, value_enum, default_value = "fp32")]
    precision: Precision,
    #[arg(long, default_value_t = 6)]
    n_layer: usize,
    #[arg(long, default_value_t = 6)]
    n_head: usize,
    #[arg(long, default_value_t = 384)]
    n_embd: usize,
    #[arg(long, default_value_t = 256)]
    block_size: usize,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    #[arg(long, default_value_t = 0.2)]
    dropout: f32,
    #[arg(long, default_value_t = 1e-3)]
    learning_rate: f32,
    #[arg(long, default_value_t = 1e-4)]
    min_lr: f32,
    #[arg(long, default_value_t = 5000)]
    max_iters: usize,
    #[arg(long, default_value_t = 100)]
    warmup_iters: usize,
    #[arg(long, default_value_t = 0.1)]
    weight_decay: f32,
    #[arg(long, default_value_t = 0.9)]
    beta1: f32,
    #[arg(long, default_value_t = 0.99)]
    beta2: f32,
    /// Clip the gradients' global norm to this (0: no clipping)
    #[arg(long, default_value_t = 1.0)]
    grad_clip: f32,
    #[arg(long, default_value_t = 250)]
    eval_interval: usize,
    #[arg(long, default_value_t = 200)]
    eval_iters: usize,
    #[arg(long, default_value_t = 10)]
    log_interval: usize,
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// Run every step op by op instead of replaying a captured graph
    #[arg(long)]
    no_capture: bool,
    /// Print the fusions the captured step got
    #[arg(long, short)]
    verbose: bool,
    /// Write the run's losses, step times and tokens/s here as JSON
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// A tensor of `shape` drawn from N(0, std²): nanoGPT's `_init_weights` for linear and embedding weights.
fn normal(rng: &mut SeededRng, shape: &[usize], std: f32) -> Result<Tensor> {
    let normal = Normal::new(0.0f32, std)?;
    let values = (0..shape.iter().product()).map(|_| normal.sample(rng)).collect();
    Ok(Tensor::parameter(values, shape)?)
}

/// `nn.Linear(inputs, outputs, bias)` initialised as nanoGPT's: weights N(0, std²), biases 0.
fn dense(rng: &mut SeededRng, (inputs, outputs): (usize, usize), bias: bool, std: f32) -> Result<Linear> {
    let bias = bias.then(|| Tensor::parameter(vec![0.0; outputs], &[outputs])).transpose()?;
    Ok(Linear::from_parameters(normal(rng, &[outputs, inputs], std)?, bias)?)
}

/// nanoGPT's `LayerNorm(ndim, bias)`: a weight, and a bias only when asked.
fn layer_norm(width: usize, bias: bool) -> Result<LayerNorm> {
    let mut norm = LayerNorm::new(width, true)?;
    if !bias {
        norm.bias = None;
    }
    Ok(norm)
}

struct Config {
    n_layer: usize,
    n_head: usize,
    n_embd: usize,
    block_size: usize,
    vocab_size: usize,
    dropout: f32,
    bias: bool,
}

struct CausalSelfAttention {
    c_attn: Linear,
    c_proj: Linear,
    attn_dropout: Dropout,
    resid_dropout: Dropout,
    n_head: usize,
}

impl CausalSelfAttention {
    fn new(c: &Config, rng: &mut SeededRng, site: usize, seed: u32) -> Result<Self> {
        let proj_std = 0.02 / (2.0 * c.n_layer as f32).sqrt();
        Ok(CausalSelfAttention {
            c_attn: dense(rng, (c.n_embd, 3 * c.n_embd), c.bias, 0.02)?,
            c_proj: dense(rng, (c.n_embd, c.n_embd), c.bias, proj_std)?,
            attn_dropout: Dropout::new(c.dropout, seed)?.with_site(site),
            resid_dropout: Dropout::new(c.dropout, seed)?.with_site(site + 1),
            n_head: c.n_head,
        })
    }
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> textnet::nn::Result<Tensor> {
        let y = causal_self_attention(&self.c_attn.forward(x)?, self.n_head, Some(&self.attn_dropout))?;
        self.resid_dropout.forward(&self.c_proj.forward(&y)?)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        [prefixed("c_attn", self.c_attn.named_parameters()), prefixed("c_proj", self.c_proj.named_parameters())]
            .concat()
    }

    fn set_training(&self, training: bool) {
        Module::<f32>::set_training(&self.attn_dropout, training);
        Module::<f32>::set_training(&self.resid_dropout, training);
    }
}

struct Mlp {
    c_fc: Linear,
    c_proj: Linear,
    dropout: Dropout,
}

impl Mlp {
    fn new(c: &Config, rng: &mut SeededRng, site: usize, seed: u32) -> Result<Self> {
        let proj_std = 0.02 / (2.0 * c.n_layer as f32).sqrt();
        Ok(Mlp {
            c_fc: dense(rng, (c.n_embd, 4 * c.n_embd), c.bias, 0.02)?,
            c_proj: dense(rng, (4 * c.n_embd, c.n_embd), c.bias, proj_std)?,
            dropout: Dropout::new(c.dropout, seed)?.with_site(site),
        })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> textnet::nn::Result<Tensor> {
        self.dropout.forward(&self.c_proj.forward(&self.c_fc.forward(x)?.gelu()?)?)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        [prefixed("c_fc", self.c_fc.named_parameters()), prefixed("c_proj", self.c_proj.named_parameters())].concat()
    }

    fn set_training(&self, training: bool) {
        Module::<f32>::set_training(&self.dropout, training);
    }
}

struct Block {
    ln_1: LayerNorm,
    attn: CausalSelfAttention,
    ln_2: LayerNorm,
    mlp: Mlp,
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> textnet::nn::Result<Tensor> {
        let x = x.add(&self.attn.forward(&self.ln_1.forward(x)?)?)?;
        x.add(&self.mlp.forward(&self.ln_2.forward(&x)?)?)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        [
            prefixed("ln_1", self.ln_1.named_parameters()),
            prefixed("attn", self.attn.named_parameters()),
            prefixed("ln_2", self.ln_2.named_parameters()),
            prefixed("mlp", self.mlp.named_parameters()),
        ]
        .concat()
    }

    fn set_training(&self, training: bool) {
        self.attn.set_training(training);
        self.mlp.set_training(training);
    }
}

struct Gpt {
    wte: Embedding,
    wpe: Embedding,
    drop: Dropout,
    h: ModuleList,
    ln_f: LayerNorm,
    /// The positions 0..T, where the model lives (the position embedding's ids).
    positions: Tensor,
}

impl Gpt {
    fn new(c: &Config, rng: &mut SeededRng, seed: u32) -> Result<Self> {
        let wte = Embedding::from_parameters(normal(rng, &[c.vocab_size, c.n_embd], 0.02)?, None)?;
        let wpe = Embedding::from_parameters(normal(rng, &[c.block_size, c.n_embd], 0.02)?, None)?;
        let mut h = ModuleList::new();
        for layer in 0..c.n_layer {
            h.push(Block {
                ln_1: layer_norm(c.n_embd, c.bias)?,
                attn: CausalSelfAttention::new(c, rng, 1 + 3 * layer, seed)?,
                ln_2: layer_norm(c.n_embd, c.bias)?,
                mlp: Mlp::new(c, rng, 3 + 3 * layer, seed)?,
            });
        }
        let positions = Tensor::from_vec((0..c.block_size).map(|p| p as f32).collect(), &[c.block_size])?;
        let drop = Dropout::new(c.dropout, seed)?;
        Ok(Gpt { wte, wpe, drop, h, ln_f: layer_norm(c.n_embd, c.bias)?, positions })
    }

    /// Moves the parameters (and the positions) to `device`.
    fn move_to_device(&mut self, device: &Arc<Device>) -> Result<()> {
        for p in self.parameters() {
            p.move_to_device(device)?;
        }
        self.positions = self.positions.to_device(device)?;
        Ok(())
    }

    /// The logits `[B, T, vocab]` of `idx` (`[B, T]` token ids as floats).
    fn logits(&self, idx: &Tensor) -> textnet::nn::Result<Tensor> {
        let t = idx.shape()[1];
        let positions =
            if t == self.positions.numel() { self.positions.clone() } else { self.positions.narrow(0, 0, t)? };
        let mut x = self.drop.forward(&self.wte.forward(idx)?.add(&self.wpe.forward(&positions)?)?)?;
        for block in self.h.iter() {
            x = block.forward(&x)?;
        }
        // The head is the token embedding's transpose (weight tying).
        linear(&self.ln_f.forward(&x)?, &self.wte.weight, None)
    }

    /// The mean cross-entropy of the logits of `idx` against `targets` (`[B, T]`).
    fn loss(&self, idx: &Tensor, targets: &Tensor) -> textnet::nn::Result<Tensor> {
        self.logits(idx)?.cross_entropy_ids(targets, None)
    }

    /// nanoGPT's `configure_optimizers`: AdamW, weight decay on the parameters of two axes or more.
    fn configure_optimizers(&self, a: &Args) -> Result<Optimizer> {
        let config =
            OptimConfig { lr: a.learning_rate, beta1: a.beta1, beta2: a.beta2, ..OptimConfig::new(OptimKind::AdamW) };
        Ok(Optimizer::new(config, decay_groups(self.named_parameters(), a.weight_decay))?)
    }
}

impl Module for Gpt {
    fn forward(&self, idx: &Tensor) -> textnet::nn::Result<Tensor> {
        self.logits(idx)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        [
            prefixed("transformer.wte", self.wte.named_parameters()),
            prefixed("transformer.wpe", self.wpe.named_parameters()),
            prefixed("transformer.h", self.h.named_parameters()),
            prefixed("transformer.ln_f", self.ln_f.named_parameters()),
        ]
        .concat()
    }

    fn set_training(&self, training: bool) {
        Module::<f32>::set_training(&self.drop, training);
        self.h.set_training(training);
    }
}

/// The corpus as character ids (its sorted distinct characters), split 90/10 into train and validation.
fn load(path: &std::path::Path) -> Result<(Vec<char>, Vec<f32>, Vec<f32>)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut chars: Vec<char> = text.chars().collect();
    chars.sort_unstable();
    chars.dedup();
    let ids: Vec<f32> =
        text.chars().map(|ch| chars.binary_search(&ch).expect("a character of the text") as f32).collect();
    let split = ids.len() * 9 / 10;
    Ok((chars, ids[..split].to_vec(), ids[split..].to_vec()))
}

/// `get_batch`: `batch` windows of `block + 1` ids at random offsets, as inputs and next-id targets.
fn fill_batch(data: &[f32], (batch, block): (usize, usize), rng: &mut SeededRng, x: &mut [f32], y: &mut [f32]) {
    for row in 0..batch {
        let at = rng.random_range(0..data.len() - block);
        x[row * block..][..block].copy_from_slice(&data[at..at + block]);
        y[row * block..][..block].copy_from_slice(&data[at + 1..at + 1 + block]);
    }
}

/// A batch's inputs and targets, where the model lives, refilled in place (a captured step's inputs).
struct Batch {
    x: Tensor,
    y: Tensor,
    host: (Vec<f32>, Vec<f32>),
}

impl Batch {
    fn new(shape: [usize; 2], device: Option<&Arc<Device>>) -> Result<Self> {
        let n = shape[0] * shape[1];
        let place = |t: Tensor| -> Result<Tensor> {
            Ok(match device {
                Some(d) => t.to_device(d)?,
                None => t,
            })
        };
        Ok(Batch {
            x: place(Tensor::zeros(&shape)?)?,
            y: place(Tensor::zeros(&shape)?)?,
            host: (vec![0.0; n], vec![0.0; n]),
        })
    }

    fn draw(&mut self, data: &[f32], rng: &mut SeededRng) -> Result<()> {
        let [batch, block] = *self.x.shape() else { unreachable!("[B, T]") };
        fill_batch(data, (batch, block), rng, &mut self.host.0, &mut self.host.1);
        self.x.copy_from_slice(&self.host.0)?;
        self.y.copy_from_slice(&self.host.1)?;
        Ok(())
    }
}

fn main() -> Result<()> {
    run(&Args::parse()).map(|_| ())
}

/// What a run reached: the validation loss of the first evaluation (before training) and the best one
/// (`tests/it/nn_nanogpt.rs` reads them).
#[allow(dead_code)]
pub struct Outcome {
    pub first_val: f32,
    pub best_val: f32,
}

/// nanoGPT's `train.py` with `a`'s settings: trains, evaluates, prints its log lines, writes `--json`.
pub fn run(a: &Args) -> Result<Outcome> {
    let (chars, train, val) = load(&a.corpus)?;
    if train.len() <= a.block_size + 1 || val.len() <= a.block_size + 1 {
        bail!("{}: too short for windows of {} characters", a.corpus.display(), a.block_size + 1);
    }
    let device = match a.device.as_str() {
        "cpu" => None,
        "cuda" => Some(Device::open(0)?),
        other => bail!("--device must be cpu or cuda, not {other}"),
    };
    if let Some(device) = &device {
        device.set_precision(a.precision)?;
    } else if a.precision != Precision::Fp32 {
        bail!("--precision {} needs --device cuda", a.precision.name());
    }
    let config = Config {
        n_layer: a.n_layer,
        n_head: a.n_head,
        n_embd: a.n_embd,
        block_size: a.block_size,
        vocab_size: chars.len(),
        dropout: a.dropout,
        bias: false,
    };
    if !config.n_embd.is_multiple_of(config.n_head) {
        bail!("--n-embd {} is not a multiple of --n-head {}", config.n_embd, config.n_head);
    }
    let mut rng = SeededRng::seed_from_u64(a.seed);
    let mut model = Gpt::new(&config, &mut rng, a.seed as u32)?;
    if let Some(device) = &device {
        model.move_to_device(device)?;
    }
    // nanoGPT's count leaves the position embedding out.
    let counted = model.parameters().iter().map(Tensor::numel).sum::<usize>() - config.block_size * config.n_embd;
    println!("number of parameters: {:.2}M", counted as f64 / 1e6);
    let mut optimizer = model.configure_optimizers(a)?;
    let schedule = Scheduler::cosine(a.learning_rate, a.warmup_iters, a.min_lr, a.max_iters)?;
    let parameters = model.parameters();

    let shape = [a.batch_size, a.block_size];
    let mut batch = Batch::new(shape, device.as_ref())?;
    let mut eval_batch = Batch::new(shape, device.as_ref())?;
    let capture = |inputs: &Batch| -> Result<Option<CapturedStep>> {
        match (&device, a.no_capture) {
            (Some(device), false) => Ok(Some(CapturedStep::new(device, &[&inputs.x, &inputs.y])?)),
            _ => Ok(None),
        }
    };
    let (mut train_step, mut eval_forward) = (capture(&batch)?, capture(&eval_batch)?);
    let sync = || -> Result<()> { device.as_ref().map_or(Ok(()), |d| Ok(d.synchronize()?)) };

    let mut estimate_loss = |model: &Gpt, rng: &mut SeededRng| -> Result<(f32, f32)> {
        model.set_training(false);
        let mut means = [0.0f32; 2];
        for (mean, data) in means.iter_mut().zip([&train, &val]) {
            let mut losses = Vec::with_capacity(a.eval_iters);
            for _ in 0..a.eval_iters {
                eval_batch.draw(data, rng)?;
                let (x, y) = (&eval_batch.x, &eval_batch.y);
                let forward = || {
                    let _no_grad = no_grad();
                    model.loss(x, y)
                };
                let loss = match eval_forward.as_mut() {
                    Some(step) => step.run(forward)?,
                    None => forward()?,
                };
                losses.push(loss.item()?);
            }
            *mean = losses.iter().sum::<f32>() / losses.len() as f32;
        }
        model.set_training(true);
        Ok((means[0], means[1]))
    };

    let mut log = serde_json::Map::new();
    let (mut evals, mut step_ms, mut best_val, mut first_val) = (Vec::new(), Vec::new(), f32::INFINITY, None);
    let mut train_seconds = 0.0;
    let run_start = Instant::now();
    for iter in 0..=a.max_iters {
        if iter % a.eval_interval == 0 || iter == a.max_iters {
            let (train_loss, val_loss) = estimate_loss(&model, &mut rng)?;
            first_val.get_or_insert(val_loss);
            best_val = best_val.min(val_loss);
            println!("step {iter}: train loss {train_loss:.4}, val loss {val_loss:.4}");
            evals.push(serde_json::json!({"iter": iter, "train": train_loss, "val": val_loss,
                                          "seconds": run_start.elapsed().as_secs_f64()}));
        }
        if iter == a.max_iters {
            break;
        }
        schedule.apply(&mut optimizer, iter)?;
        batch.draw(&train, &mut rng)?;
        let started = Instant::now();
        let (x, y) = (&batch.x, &batch.y);
        let mut one_step = || {
            optimizer.zero_grad();
            let loss = model.loss(x, y)?;
            loss.backward()?;
            if a.grad_clip > 0.0 {
                clip_grad_norm(&parameters, a.grad_clip)?;
            }
            optimizer.step()?;
            Ok(loss)
        };
        let loss = match train_step.as_mut() {
            Some(step) => {
                let was_captured = step.is_captured();
                let loss = step.run(one_step)?;
                if a.verbose && step.is_captured() && !was_captured {
                    println!("the step is captured; its fusions:");
                    step.fusions().iter().for_each(|(what, n)| println!("  {what} ×{n}"));
                }
                loss
            }
            None => one_step()?,
        };
        sync()?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        train_seconds += ms / 1e3;
        step_ms.push(ms);
        if iter % a.log_interval == 0 {
            println!("iter {iter}: loss {:.4}, time {ms:.2}ms", loss.item()?);
        }
    }
    // Steady-state step time: the median over the steps after the first two (eager, then captured).
    let mut steady: Vec<f64> = step_ms.iter().skip(2).copied().collect();
    steady.sort_by(f64::total_cmp);
    let median_ms = steady.get(steady.len() / 2).copied().unwrap_or(f64::NAN);
    let tokens_per_s = (a.batch_size * a.block_size) as f64 / (median_ms / 1e3);
    println!(
        "best val loss {best_val:.4}; step {median_ms:.2} ms median, {:.0} tokens/s; training {train_seconds:.1} s, \
         run {:.1} s",
        tokens_per_s,
        run_start.elapsed().as_secs_f64()
    );
    if let Some(path) = &a.json {
        log.insert("args".into(), serde_json::json!(format!("{a:?}")));
        log.insert("device".into(), serde_json::json!(device.as_ref().map(|d| d.describe())));
        log.insert("evals".into(), serde_json::json!(evals));
        log.insert("best_val".into(), serde_json::json!(best_val));
        log.insert("step_ms_median".into(), serde_json::json!(median_ms));
        log.insert("tokens_per_s".into(), serde_json::json!(tokens_per_s));
        log.insert("train_seconds".into(), serde_json::json!(train_seconds));
        log.insert("run_seconds".into(), serde_json::json!(run_start.elapsed().as_secs_f64()));
        std::fs::write(path, serde_json::to_string_pretty(&log)?)?;
    }
    Ok(Outcome { first_val: first_val.unwrap_or(f32::NAN), best_val })
}
