//! `textnet bench transformer`: 1000 training steps of the default model on a corpus (batch 32 × block
//! 64, AdamW 1e-3), in graphs of 100 steps timed with device events (the graph captured before timing;
//! the validation loss after each graph is timed apart), beside `benches/torch_transformer.py`; with
//! --tf32 the linear layers run on the tensor cores (beside the twin's --tf32).

use super::data::{self, Corpus};
use super::gpu::GpuTransformer;
use super::model::{self, Config};
use crate::cpu::SeededRng;
use crate::device::Gpu;
use crate::optim::{OptimConfig, OptimKind};
use crate::timing::time_on_device;
use anyhow::Result;
use rand::SeedableRng;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

pub const STEPS: usize = 1000;
pub const BATCH: usize = 32;
const CHUNK: usize = 100;

pub fn bench(gpu: &Arc<Gpu>, corpus_path: &Path, seed: u64, tf32: bool, json: bool) -> Result<()> {
    let shape = Config::new(256);
    let corpus = Corpus::load(corpus_path, shape.vocab, shape.block)?;
    let config = Config { vocab: corpus.vocab.len(), ..shape };
    let optim = OptimConfig { weight_decay: 0.01, ..OptimConfig::new(OptimKind::AdamW) };
    let params = model::init(&config, seed);
    let setup = Instant::now();
    let mut trainer = GpuTransformer::new(gpu.clone(), config, &params, optim, &corpus)?;
    trainer.set_tf32(tf32);
    trainer.prepare(CHUNK, BATCH)?;
    let setup_s = setup.elapsed().as_secs_f64();
    let val_offsets = data::val_offsets(corpus.val.len(), config.block);
    let mut rng = SeededRng::seed_from_u64(seed);
    let mut train_ms = 0.0;
    let mut eval_ms = 0.0;
    let mut rows = Vec::new();
    let mut last_loss = f64::NAN;
    let start = Instant::now();
    for chunk in 0..STEPS / CHUNK {
        let offsets: Vec<u32> = (0..CHUNK).flat_map(|_| data::train_offsets(&mut rng, corpus.train.len(), config.block, BATCH)).collect();
        let mut losses = Vec::new();
        train_ms += time_on_device(gpu, || {
            losses = trainer.train_steps(&offsets, BATCH)?;
            Ok(())
        })?;
        let mut val = 0.0;
        eval_ms += time_on_device(gpu, || {
            val = trainer.val_loss(&val_offsets, BATCH)?;
            Ok(())
        })?;
        last_loss = *losses.last().unwrap_or(&f64::NAN);
        let mean = losses.iter().sum::<f64>() / losses.len() as f64;
        rows.push(serde_json::json!({"step": (chunk + 1) * CHUNK, "train_loss": mean, "val_loss": val}));
    }
    let wall_s = start.elapsed().as_secs_f64();
    let tokens = (STEPS * BATCH * config.block) as f64;
    let final_val = rows.last().map(|r| r["val_loss"].as_f64().unwrap_or(f64::NAN)).unwrap_or(f64::NAN);
    let out = serde_json::json!({
        "device": gpu.describe(),
        "corpus": corpus_path.display().to_string(),
        "config": {"vocab": config.vocab, "block": config.block, "embed": config.embed, "heads": config.heads,
                   "layers": config.layers, "batch": BATCH, "steps": STEPS, "optimizer": optim.describe(), "seed": seed,
                   "linear_layers": if tf32 { "tf32 tensor cores" } else { "fp32" }},
        "params": params.len(),
        "setup_s": setup_s,
        "train_s": train_ms / 1e3,
        "eval_s": eval_ms / 1e3,
        "wall_s": wall_s,
        "ms_per_step": train_ms / STEPS as f64,
        "tokens_per_s": tokens / (train_ms / 1e3),
        "final_train_loss": last_loss,
        "final_val_loss": final_val,
        "evals": rows,
        "timing": "device events around each graph of 100 training steps (captured before timing), summed; validation timed apart",
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "transformer on {}: {STEPS} steps in {:.3} s of training on the device ({:.3} ms/step, {:.0} tokens/s); \
             last step's loss {last_loss:.4}, validation loss {final_val:.4}",
            gpu.describe(),
            train_ms / 1e3,
            train_ms / STEPS as f64,
            tokens / (train_ms / 1e3)
        );
    }
    Ok(())
}
