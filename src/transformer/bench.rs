//! `textnet bench transformer`: 1000 training steps of the default model on a corpus (batch 32 × block
//! 64, AdamW 1e-3), in graphs of 100 steps timed with device events (the graph captured before timing;
//! the validation loss after each graph is timed apart), beside `benches/torch_transformer.py`; with
//! --precision tf32 or bf16 the products run on the tensor cores (beside the twin's --tf32 or --bf16); with --large, 200 steps
//! of the larger shape (6 layers, 6 heads, d_model 384, block 256, batch 64) in graphs of 50; with
//! --gpt2-small, 30 steps of GPT-2-small's body (12 layers, 12 heads, 768, block 1024, batch 16) in graphs of
//! 10; --batch, --grad-accum and --dropout as `transformer`'s. With
//! --attention, the attention kernels alone at nanoGPT's shape, fp32 beside bf16 (`gpu::flash::bench_attention`),
//! beside `benches/torch_attention.py`.

use super::data::{self, Corpus};
use super::gpu::GpuTransformer;
use super::model::{self, Config};
use crate::device::Gpu;
use crate::device::precision::Precision;
use crate::harness::timing::time_on_device;
use crate::ops::cpu::SeededRng;
use crate::ops::optim::{OptimConfig, OptimKind};
use crate::pipeline::BenchOptions;
use anyhow::{Result, bail};
use rand::SeedableRng;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// A timed run: the model, batch, steps and the steps per graph.
struct Run {
    shape: Config,
    batch: usize,
    steps: usize,
    chunk: usize,
}

/// The default model, 1000 steps of 32 windows.
const DEFAULT: Run = Run {
    shape: Config { vocab: 256, block: 64, embed: 64, heads: 4, layers: 2, bias: true, tie_weights: false },
    batch: 32,
    steps: 1000,
    chunk: 100,
};
/// The larger shape (6 layers, 6 heads, d_model 384, block 256, batch 64): 200 steps, for tokens/s.
const LARGE: Run = Run {
    shape: Config { vocab: 256, block: 256, embed: 384, heads: 6, layers: 6, bias: true, tie_weights: false },
    batch: 64,
    steps: 200,
    chunk: 50,
};

/// GPT-2-small's body (12 layers, 12 heads, d_model 768, block 1024, batch 16): 30 steps in graphs of 10.
const GPT2_SMALL: Run = Run {
    shape: Config { vocab: 256, block: 1024, embed: 768, heads: 12, layers: 12, bias: true, tie_weights: false },
    batch: 16,
    steps: 30,
    chunk: 10,
};

/// The flags of `bench transformer`.
#[derive(clap::Args, Debug)]
pub struct TransformerBenchArgs {
    /// The corpus to train on
    #[arg(long, default_value = "corpus/shakespeare.txt")]
    pub corpus: PathBuf,
    /// Seed of the initial parameters and of the windows
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The GPU's arithmetic (as `transformer --precision`)
    #[arg(long, value_enum, default_value_t)]
    pub precision: Precision,
    /// The larger shape (6 layers, 6 heads, d_model 384, block 256, batch 64), 200 steps
    #[arg(long)]
    pub large: bool,
    /// GPT-2-small's body instead (12 layers, 12 heads, d_model 768, block 1024, batch 16), 30 steps
    #[arg(long, conflicts_with = "large")]
    pub gpt2_small: bool,
    /// Sequences a micro-batch, instead of the shape's batch
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
    /// Micro-batches a step (as `transformer --grad-accum`)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub grad_accum: usize,
    /// Dropout probability in training (as `transformer --dropout`)
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub dropout: f32,
    /// Time the attention kernels alone at nanoGPT's shape instead: fp32 beside bf16 (flash)
    #[arg(long)]
    pub attention: bool,
}

impl TransformerBenchArgs {
    /// The run these flags ask for and its micro-batch's sequences; an error for a flag out of range.
    fn run(&self) -> Result<(Run, usize)> {
        if self.batch == Some(0) || self.grad_accum == 0 {
            bail!("--batch and --grad-accum must be at least 1");
        }
        if !(0.0..1.0).contains(&self.dropout) {
            bail!("--dropout must be in [0, 1), got {}", self.dropout);
        }
        let run = if self.gpt2_small {
            GPT2_SMALL
        } else if self.large {
            LARGE
        } else {
            DEFAULT
        };
        let batch = self.batch.unwrap_or(run.batch);
        Ok((run, batch))
    }
}

/// `textnet bench transformer`: times training steps on `args.corpus` on the GPU, with the shared bench options.
pub fn bench(gpu: &Arc<Gpu>, options: &BenchOptions, args: &TransformerBenchArgs) -> Result<()> {
    let TransformerBenchArgs { corpus: ref corpus_path, seed, precision, grad_accum, dropout, attention, .. } = *args;
    if attention {
        return super::gpu::flash::bench_attention(gpu);
    }
    let json = options.json;
    let (Run { shape, steps, chunk, .. }, batch) = args.run()?;
    let corpus = Corpus::load(corpus_path, shape.vocab, shape.block)?;
    let config = Config { vocab: corpus.vocab.len(), ..shape };
    let optim = OptimConfig { weight_decay: 0.01, ..OptimConfig::new(OptimKind::AdamW) };
    let params = model::init(&config, seed);
    let setup = Instant::now();
    let mut trainer = GpuTransformer::new(gpu.clone(), config, &params, optim, &corpus)?;
    trainer.set_precision(precision)?;
    trainer.set_dropout(dropout, seed as u32);
    trainer.set_grad_accum(grad_accum)?;
    trainer.prepare(chunk, batch)?;
    let setup_s = setup.elapsed().as_secs_f64();
    let val_offsets = data::val_offsets(corpus.val.len(), config.block);
    let mut rng = SeededRng::seed_from_u64(seed);
    let mut train_ms = 0.0;
    let mut eval_ms = 0.0;
    let mut rows = Vec::new();
    let mut last_loss = f64::NAN;
    let start = Instant::now();
    for graph in 0..steps / chunk {
        let offsets: Vec<u32> = (0..chunk * grad_accum)
            .flat_map(|_| data::train_offsets(&mut rng, corpus.train.len(), config.block, batch))
            .collect();
        let mut losses = Vec::new();
        train_ms += time_on_device(gpu, || {
            losses = trainer.train_steps(&offsets, batch, &vec![optim.lr; chunk])?;
            Ok(())
        })?;
        let mut val = 0.0;
        eval_ms += time_on_device(gpu, || {
            val = trainer.val_loss(&val_offsets, batch)?;
            Ok(())
        })?;
        last_loss = *losses.last().unwrap_or(&f64::NAN);
        let mean = losses.iter().sum::<f64>() / losses.len() as f64;
        rows.push(serde_json::json!({"step": (graph + 1) * chunk, "train_loss": mean, "val_loss": val}));
    }
    let wall_s = start.elapsed().as_secs_f64();
    let tokens = (steps * grad_accum * batch * config.block) as f64;
    let final_val = rows.last().map(|r| r["val_loss"].as_f64().unwrap_or(f64::NAN)).unwrap_or(f64::NAN);
    let out = serde_json::json!({
        "device": "cuda:0", "device_name": gpu.describe(),
        "corpus": corpus_path.display().to_string(),
        "config": {"vocab": config.vocab, "block": config.block, "embed": config.embed, "heads": config.heads,
                   "layers": config.layers, "batch": batch, "grad_accum": grad_accum, "dropout": dropout, "steps": steps,
                   "optimizer": optim.describe(), "seed": seed, "precision": precision.name()},
        "params": params.len(),
        "linear_gemm": trainer.linear_gemm(),
        "setup_s": setup_s,
        "train_s": train_ms / 1e3,
        "eval_s": eval_ms / 1e3,
        "wall_s": wall_s,
        "ms_per_step": train_ms / steps as f64,
        "tokens_per_s": tokens / (train_ms / 1e3),
        "final_train_loss": last_loss,
        "final_val_loss": final_val,
        "evals": rows,
        "timing": format!("device events around each graph of {chunk} training steps (captured before timing), summed; validation timed apart"),
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "transformer on {}: {steps} steps in {:.3} s of training on the device ({:.3} ms/step, {:.0} tokens/s); \
             last step's loss {last_loss:.4}, validation loss {final_val:.4}",
            gpu.describe(),
            train_ms / 1e3,
            train_ms / steps as f64,
            tokens / (train_ms / 1e3)
        );
        println!("linear products: {}", trainer.linear_gemm());
    }
    Ok(())
}
