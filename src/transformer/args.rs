//! The flags of `textnet transformer`, with the checks that need no data, and what they make: the model's
//! configuration, the optimizer, the schedule, the dropout seed of each rank and the run's fingerprint.

use super::data::Corpus;
use super::model::{self, Config};
use crate::device::parallel::ParallelArgs;
use crate::device::precision::Precision;
use crate::harness::args::{RunArgs, ScheduleArgs, run_out};
use crate::io::resources::{self, MemoryNeed};
use crate::ops::optim::{LrSchedule, OptimConfig, OptimKind};
use anyhow::{Result, bail};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("out", run_out(
        "transformer.safetensors",
        "Where to write the model (.safetensors); a Transformer already there (of the same vocabulary and block) is \
replaced only by one of equal or lower validation loss on this run's validation windows"
    )),
    mut_arg("seed", |a| a.help("Seed of the initial parameters and of the batches"))
)]
/// The flags of `textnet transformer`.
pub struct TransformerArgs {
    /// UTF-8 text to train on (the last 10 % is held out for validation)
    pub corpus: PathBuf,
    /// Transformer blocks
    #[arg(long, default_value_t = model::DEFAULT_LAYERS)]
    pub layers: usize,
    /// Attention heads per block (must divide --embed)
    #[arg(long, default_value_t = model::DEFAULT_HEADS)]
    pub heads: usize,
    /// Embedding width d_model (the MLP is 4× as wide; on the GPU a multiple of 32)
    #[arg(long, default_value_t = model::DEFAULT_EMBED)]
    pub embed: usize,
    /// Context length in characters
    #[arg(long, default_value_t = model::DEFAULT_BLOCK)]
    pub block: usize,
    /// No biases in the linear layers and LayerNorms (nanoGPT's bias=False)
    #[arg(long)]
    pub no_bias: bool,
    /// The output head shares the token embedding's weight (nanoGPT's weight tying)
    #[arg(long)]
    pub tie_weights: bool,
    /// Sequences per step (per micro-batch with --grad-accum; over all GPUs with --gpus)
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Micro-batches of --batch sequences per optimizer step, their gradients summed before the update: a
    /// step of N·batch sequences that holds one micro-batch's activations at a time (nanoGPT's
    /// gradient_accumulation_steps)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub grad_accum: usize,
    /// Optimizer steps
    #[arg(long, default_value_t = 1000)]
    pub steps: usize,
    /// AdamW learning rate
    #[arg(long, default_value_t = 1e-3, allow_negative_numbers = true)]
    pub lr: f32,
    /// AdamW's decoupled weight decay
    #[arg(long, default_value_t = 0.01, allow_negative_numbers = true)]
    pub weight_decay: f32,
    /// AdamW's β2, the decay of the squared gradient's running mean (nanoGPT's small models use 0.99)
    #[arg(long, default_value_t = 0.999, allow_negative_numbers = true)]
    pub beta2: f32,
    /// Clip the gradient's global L2 norm to this before each update (0 = off; nanoGPT uses 1)
    #[arg(long, visible_alias = "grad-clip", value_name = "G", default_value_t = 0.0, allow_negative_numbers = true)]
    pub clip_norm: f32,
    /// --lr-schedule, --warmup and --min-lr.
    #[command(flatten)]
    pub schedule: ScheduleArgs,
    /// --gpus, --world-size, --rank and --rendezvous.
    #[command(flatten)]
    pub parallel: ParallelArgs,
    /// ZeRO-1 with --gpus or --world-size: each GPU keeps AdamW's moments for its 1/N of the parameters and
    /// updates that share alone; the gradient is reduce-scattered and the parameters all-gathered
    #[arg(long)]
    pub zero: bool,
    /// Dropout probability in training, in [0, 1): after the embeddings, on the attention probabilities and
    /// on both residual branches (nanoGPT's places); never in evaluation or generation
    #[arg(long, value_name = "P", default_value_t = 0.0, allow_negative_numbers = true)]
    pub dropout: f32,
    /// How the initial parameters are drawn: GPT-2's (Normal(0, 0.02) for every weight matrix and
    /// embedding, each block's two residual projections at 0.02/√(2·layers)), or Normal(0, 0.02) for all
    #[arg(long, value_enum, default_value_t)]
    pub init: model::Init,
    /// Largest vocabulary, the unknown character included (rarer characters read as unknown)
    #[arg(long, default_value_t = 256)]
    pub vocab: usize,
    /// Validation loss every N steps (and after the last)
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub eval_every: usize,
    /// Each evaluation over N batches of --batch validation windows drawn at random (from --seed, the
    /// same windows every time) instead of the evenly spaced windows across the whole validation part
    #[arg(long, value_name = "N")]
    pub eval_iters: Option<usize>,
    #[command(flatten)]
    /// The run flags (`--out`, `--seed`, `--device`, `--json`, ...).
    pub run: RunArgs,
    /// The GPU's arithmetic: fp32 throughout, TF32 products on the tensor cores, or bf16 products and
    /// attention on the tensor cores with fp32 sums, weights and statistics (the CPU trains in fp32)
    #[arg(long, value_enum, default_value_t)]
    pub precision: Precision,
    /// Continue training this Transformer model file, with its shape and vocabulary (which is why --layers,
    /// --heads, --embed, --block, --no-bias, --tie-weights, --vocab and --init cannot be given with it); AdamW's
    /// moments start afresh
    #[arg(
        long,
        value_name = "MODEL",
        conflicts_with_all = ["layers", "heads", "embed", "block", "no_bias", "tie_weights", "vocab", "init"]
    )]
    pub resume: Option<PathBuf>,
}

impl TransformerArgs {
    pub(super) fn check(&self) -> Result<Config> {
        if self.steps == 0 {
            bail!("--steps must be at least 1, got 0");
        }
        if self.batch == 0 {
            bail!("--batch must be at least 1, got 0");
        }
        if self.grad_accum == 0 {
            bail!("--grad-accum must be at least 1 (micro-batches a step), got 0");
        }
        if self.zero && self.parallel.plan(self.batch).is_ok_and(|p| p.replicas() < 2) {
            bail!(
                "--zero shards AdamW's state over the GPUs of a data-parallel run: give --gpus N (N ≥ 2) or --world-size"
            );
        }
        if self.eval_every == 0 {
            bail!("--eval-every must be at least 1, got 0");
        }
        if self.eval_iters == Some(0) {
            bail!("--eval-iters must be at least 1, got 0 (leave it out to evaluate on the evenly spaced windows)");
        }
        if !(0.0..1.0).contains(&self.dropout) {
            bail!("--dropout must be in [0, 1), got {}", self.dropout);
        }
        if self.vocab < 2 {
            bail!("--vocab must be at least 2 (the unknown character and one more), got {}", self.vocab);
        }
        let config = Config {
            vocab: self.vocab,
            block: self.block,
            embed: self.embed,
            heads: self.heads,
            layers: self.layers,
            bias: !self.no_bias,
            tie_weights: self.tie_weights,
        };
        config.validate()?;
        // The vocabulary here is the cap; the corpus's own, often far smaller, is checked once read.
        self.memory_need(&Config { vocab: 2, ..config }).check(resources::available_memory())?;
        Ok(config)
    }

    /// What a run holds at once (on each GPU of a data-parallel run), counted before anything is
    /// allocated: the parameters with their gradient and AdamW's two moments (and with --grad-accum the
    /// gradient's running sum), a micro-batch's activations (18·embed + the vocabulary a row per block,
    /// about as much again for the gradients), and an evaluation interval's batch offsets.
    pub(super) fn memory_need(&self, config: &Config) -> MemoryNeed {
        let (v, t, c, l) = (config.vocab as u64, config.block as u64, config.embed as u64, config.layers as u64);
        let per_block = c.saturating_mul(c).saturating_mul(12).saturating_add(c.saturating_mul(13));
        let params =
            l.saturating_mul(per_block).saturating_add((2 * v + t).saturating_mul(c)).saturating_add(v + 2 * c);
        // Each GPU of a data-parallel run holds its share of the batch, and with --zero its share of AdamW's
        // two moments.
        let ranks = self.parallel.plan(self.batch).map_or(1, |p| p.replicas());
        let share = self.batch / ranks;
        let moments = if self.zero { 8u64.div_ceil(ranks as u64) } else { 8 };
        let rows = (share as u64).saturating_mul(t);
        let row_floats = l.saturating_mul(18 * c).saturating_add(12 * c).saturating_add(v);
        MemoryNeed {
            parts: vec![
                (
                    "the parameters and AdamW's state",
                    params.saturating_mul(8 + moments + if self.grad_accum > 1 { 4 } else { 0 }),
                    "--embed or --layers",
                ),
                (
                    "a step's activations",
                    rows.saturating_mul(row_floats).saturating_mul(8),
                    "--batch, --block or --layers",
                ),
                (
                    "an evaluation interval's batches",
                    (self.eval_every as u64)
                        .saturating_mul(self.batch as u64)
                        .saturating_mul(self.grad_accum as u64)
                        .saturating_mul(4),
                    "--eval-every",
                ),
            ],
        }
    }

    pub(super) fn optim(&self) -> Result<OptimConfig> {
        if !(0.0..1.0).contains(&self.beta2) {
            bail!("--beta2 must be in [0, 1), got {}", self.beta2);
        }
        let config = OptimConfig {
            lr: self.lr,
            weight_decay: self.weight_decay,
            beta2: self.beta2,
            clip_norm: self.clip_norm,
            ..OptimConfig::new(OptimKind::AdamW)
        };
        config.validate()?;
        Ok(config)
    }

    /// The learning-rate schedule, checked against --lr and --steps.
    pub(super) fn lr_schedule(&self) -> Result<LrSchedule> {
        let schedule = self.schedule.schedule(self.lr)?;
        schedule.check(self.steps)?;
        Ok(schedule)
    }

    /// The seed of dropout's masks at the replica of global rank `rank` (rank 0's is a one-GPU run's).
    pub(super) fn dropout_seed(&self, rank: usize) -> u32 {
        ((self.run.seed ^ (self.run.seed >> 32)) as u32) ^ (rank as u32).wrapping_mul(0x9e37_79b9)
    }

    /// What every rank of a multi-process run must have been started with alike (the rendezvous compares
    /// it): the flags that shape the model and its training, and the corpus's length and hash (of its ids,
    /// as read: a corpus from standard input cannot be read twice).
    pub(super) fn fingerprint(&self, corpus: &Corpus) -> String {
        use std::hash::{Hash, Hasher};
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        (&corpus.train, &corpus.val).hash(&mut hash);
        format!(
            "layers={},heads={},embed={},block={},bias={},tie={},batch={},grad_accum={},steps={},lr={},wd={},beta2={},clip={},\
             schedule={}/{}/{},dropout={},vocab={},eval_every={},eval_iters={:?},seed={},precision={},resume={},zero={},\
             init={},corpus={}/{:016x}",
            self.layers,
            self.heads,
            self.embed,
            self.block,
            !self.no_bias,
            self.tie_weights,
            self.batch,
            self.grad_accum,
            self.steps,
            self.lr,
            self.weight_decay,
            self.beta2,
            self.clip_norm,
            self.schedule.lr_schedule.name(),
            self.schedule.warmup,
            self.schedule.min_lr,
            self.dropout,
            self.vocab,
            self.eval_every,
            self.eval_iters,
            self.run.seed,
            self.precision.name(),
            self.resume.is_some(),
            self.zero,
            self.init.name(),
            corpus.train.len() + corpus.val.len(),
            hash.finish()
        )
        .replace(char::is_whitespace, "_")
    }
}
