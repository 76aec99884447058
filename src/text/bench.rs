//! `textnet bench` and `textnet bench quality` for the text model: single-sample and batched step speed
//! (fp32, and the batched steps at bf16)
//! at the bench shape beside `benches/torch_baseline.py`, and the quality run (GPU kernels and CPU
//! reference trained on the same samples, with what the PyTorch twin needs to repeat it).

use super::gpu::GpuTrainer;
use super::model::{TextParams, TextShape};
use crate::device::Gpu;
use crate::device::precision::Precision;
use crate::harness::timing::{median, time_graph_launches, time_on_device};
use crate::ops::cpu::SeededRng;
use crate::ops::optim::{LrSchedule, LrScheduleKind};
use crate::pipeline::BenchOptions;
use anyhow::{Context, Result};
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;

/// The flags of `bench text`.
#[derive(clap::Args, Debug)]
pub struct SpeedArgs {
    /// Only the single-sample configurations and the per-kernel timings
    #[arg(long)]
    pub single: bool,
    /// Only the configurations with this batch size (1, 256 or 4096)
    #[arg(long)]
    pub batch: Option<usize>,
}

/// What `bench quality` runs: the corpus, training samples, seed, where the PyTorch twin's inputs go, and
/// whether the CPU reference runs too.
#[derive(clap::Args, Clone, Debug)]
pub struct QualityArgs {
    /// The corpus to train on
    #[arg(long, default_value = "corpus/shakespeare.txt")]
    pub corpus: PathBuf,
    /// Training samples (single-sample SGD steps)
    #[arg(long, default_value_t = 20_000)]
    pub samples: usize,
    /// Seed of the sample order and of the initial parameters
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to write tokens, sample order and initial parameters for the PyTorch run
    #[arg(long, default_value = "data/quality")]
    pub dump: PathBuf,
    /// Skip the CPU reference run
    #[arg(long)]
    pub no_cpu: bool,
    /// Samples per SGD step (the CPU reference then takes its batched trainer)
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub batch: usize,
    /// SGD learning rate
    #[arg(long, default_value_t = QUALITY_LR)]
    pub lr: f32,
    /// The arithmetic of the vocabulary-sized products, on the GPU and in the CPU twin (fp32 or bf16)
    #[arg(long, value_enum, default_value_t)]
    pub precision: Precision,
}

#[derive(Serialize, Debug)]
/// One row of `textnet bench [text]`: a configuration and its timing.
pub struct TextBenchRow {
    /// The configuration in words, e.g. "batch 256, CUDA graph".
    pub mode: String,
    /// Samples per step.
    pub batch: usize,
    /// Steps timed per repeat.
    pub steps: usize,
    /// Median time of the steps over the repeats, in milliseconds.
    pub median_ms: f64,
    /// Optimizer steps per second at the median.
    pub steps_per_s: f64,
    /// Training samples per second at the median.
    pub samples_per_s: f64,
    /// Microseconds per step at the median.
    pub us_per_step: f64,
    /// Each repeat's time in milliseconds.
    pub repeats_ms: Vec<f64>,
}

/// The model the speed bench trains: V = 8192, D = 64, H = 256, context 3.
pub const BENCH_SHAPE: TextShape = TextShape { vocab: 8192, embed: 64, hidden: 256, context: 3 };

/// `textnet bench [text]`: single-sample steps/s (CUDA graph, plain launches, and a learning-rate
/// schedule's rate per step) and batched samples/s at B = 256 and 4096, fp32 and bf16, at V = 8192,
/// D = 64, H = 256, context 3 (`single_only`, `only_batch` pick a subset).
pub fn speed(gpu: &Arc<Gpu>, options: &BenchOptions, args: &SpeedArgs) -> Result<()> {
    let BenchOptions { repeats, json } = *options;
    let (single_only, only_batch) = (args.single, args.batch);
    let shape = BENCH_SHAPE;
    let mut rng = SeededRng::seed_from_u64(7);
    let tokens: Arc<[u32]> = (0..1usize << 20).map(|_| rng.random_range(0..shape.vocab as u32)).collect();
    let params = TextParams::init(shape, 1);
    let lr = 0.01f32;
    let mut rows = Vec::new();
    /// How a configuration's steps are launched.
    #[derive(Clone, Copy, PartialEq)]
    enum Launches {
        /// Replayed from CUDA graphs at one rate (the constant schedule).
        Graph,
        /// Each kernel launched, text_hidden and the cursor advance with every step.
        Plain,
        /// A rate per step (a learning-rate schedule): launched one by one (`enqueue_scheduled`).
        Scheduled,
    }
    let configs = [
        ("single-sample, CUDA graph", 1, 25_600, Launches::Graph, Precision::Fp32),
        ("single-sample, plain launches", 1, 5_000, Launches::Plain, Precision::Fp32),
        ("single-sample, a rate per step", 1, 25_600, Launches::Scheduled, Precision::Fp32),
        ("batch 256, CUDA graph", 256, 256, Launches::Graph, Precision::Fp32),
        ("batch 256 bf16, CUDA graph", 256, 256, Launches::Graph, Precision::Bf16),
        ("batch 4096, CUDA graph", 4096, 128, Launches::Graph, Precision::Fp32),
        ("batch 4096 bf16, CUDA graph", 4096, 128, Launches::Graph, Precision::Bf16),
    ];
    for (label, batch, steps, launches, precision) in configs {
        if (single_only && batch > 1) || only_batch.is_some_and(|b| b != batch) {
            continue;
        }
        let mut trainer = GpuTrainer::new(gpu.clone(), &params, tokens.clone())?;
        trainer.use_precision(precision)?;
        let samples = batch * steps;
        let positions: Vec<u32> =
            (0..samples).map(|_| rng.random_range(shape.context as u32..tokens.len() as u32)).collect();
        // The scheduled steps at rates of a cosine from lr down to 0 over the timed steps.
        let rates = LrSchedule { kind: LrScheduleKind::Cosine, warmup: 0, min_lr: 0.0 }.rates(lr, steps);
        let enqueue = |t: &mut GpuTrainer| match launches {
            Launches::Scheduled => t.enqueue_scheduled(samples, batch, &rates),
            _ => t.enqueue_training(samples, batch, lr, launches == Launches::Graph),
        };
        // Warm-up: compiles, captures and uploads the graph, fills the caches.
        trainer.set_positions(&positions)?;
        enqueue(&mut trainer)?;
        trainer.synchronize()?;
        let mut times = Vec::with_capacity(repeats);
        for _ in 0..repeats {
            trainer.set_positions(&positions)?;
            trainer.synchronize()?;
            times.push(time_on_device(gpu, || enqueue(&mut trainer))?);
        }
        let median_ms = median(&times);
        let secs = median_ms / 1e3;
        rows.push(TextBenchRow {
            mode: label.into(),
            batch,
            steps,
            median_ms,
            steps_per_s: steps as f64 / secs,
            samples_per_s: samples as f64 / secs,
            us_per_step: median_ms * 1e3 / steps as f64,
            repeats_ms: times,
        });
    }
    // Each kernel alone: a graph of 128 launches of it (single sample), replayed.
    let mut per_kernel = Vec::new();
    {
        let mut t = GpuTrainer::new(gpu.clone(), &params, tokens.clone())?;
        let positions: Vec<u32> =
            (0..1024).map(|_| rng.random_range(shape.context as u32..tokens.len() as u32)).collect();
        t.set_positions(&positions)?;
        t.launch_step(1, 0, lr, false)?;
        // Single samples take fused/text_sample.cu where the shape allows (it does at the bench shape).
        // The last entry, a one-thread kernel that does nothing (text_advance by 0), is the cost of a graph
        // node alone: the floor under each of the three.
        let sample = t.sample_path(1);
        let names = if sample {
            ["sample_forward", "sample_backward", "sample_update"]
        } else {
            ["text_forward", "text_backward", "text_update"]
        };
        for (name, which) in [(names[0], 0), (names[1], 1), (names[2], 2), ("empty kernel", 3)] {
            let graph = t.capture(|t| {
                for _ in 0..128 {
                    match (which, sample) {
                        (0, true) => t.launch_sample_forward(0, lr, true)?,
                        (1, true) => t.launch_sample_backward(0, lr, true)?,
                        (2, true) => t.launch_sample_update(0, lr, true)?,
                        (0, false) => t.launch_forward(1, true)?,
                        (1, false) => t.launch_backward(1, 0, lr, true)?,
                        (2, false) => t.launch_update(1, 0, lr, true)?,
                        _ => t.launch_advance(0)?,
                    }
                }
                Ok(())
            })?;
            let times = time_graph_launches(gpu, &graph, 128, repeats)?;
            per_kernel.push(serde_json::json!({"kernel": name, "us_median": median(&times), "us": times}));
        }
        per_kernel.push(serde_json::json!({"resources (name, registers, local bytes)": t.kernel_resources()}));
    }
    // The floor of a single-sample step (fused/text_sample.cu): W2 is read and written once, by
    // sample_forward; W1 is read and written once, by sample_backward, and read again by sample_update.
    let f = 4.0;
    let (v, d, h) = (shape.vocab as f64, shape.embed as f64, shape.hidden as f64);
    let layout = crate::text::gpu::TextLayout::new(shape, gpu.sm_count as usize, gpu.max_shared_optin)?;
    let bytes_step = 2.0 * v * h * f + 3.0 * h * d * f;
    if json {
        let out = serde_json::json!({
            "device": "cuda:0", "device_name": gpu.describe(),
            "shape": {"vocab": shape.vocab, "embed": shape.embed, "hidden": shape.hidden, "context": shape.context},
            "grid": layout.grid, "rows_per_block": layout.rows_per_block,
            "single_sample_bytes_per_step": bytes_step,
            "single_sample_kernels": per_kernel,
            "rows": rows,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "text model V={} D={} H={} N={} on {}",
            shape.vocab,
            shape.embed,
            shape.hidden,
            shape.context,
            gpu.describe()
        );
        println!(
            "{:<32} {:>6} {:>8} {:>12} {:>14} {:>10}",
            "mode", "batch", "steps", "steps/s", "samples/s", "µs/step"
        );
        for r in &rows {
            println!(
                "{:<32} {:>6} {:>8} {:>12.0} {:>14.0} {:>10.2}",
                r.mode, r.batch, r.steps, r.steps_per_s, r.samples_per_s, r.us_per_step
            );
        }
        for k in &per_kernel {
            println!("{k}");
        }
        println!(
            "single-sample bytes per step ≈ {:.1} MB → {:.1} µs at 5 TB/s (L2)",
            bytes_step / 1e6,
            bytes_step / 5e12 * 1e6
        );
    }
    Ok(())
}

/// The quality run's learning rate at one sample a step.
pub const QUALITY_LR: f32 = 0.05;

/// The quality run's inputs: the bench shape on `corpus`, `samples` training positions in an order drawn
/// from `seed`, 5000 validation positions, initial parameters from `seed`.
pub struct QualityRun {
    /// The corpus's token ids.
    pub tokens: Arc<[u32]>,
    /// The training positions, in the order they are trained.
    pub order: Vec<u32>,
    /// The validation positions.
    pub val: Vec<u32>,
    /// The initial parameters.
    pub params: TextParams,
}

impl QualityRun {
    /// Reads `corpus` and draws the run's `samples` training positions and initial parameters from `seed`.
    pub fn new(corpus: &std::path::Path, samples: usize, seed: u64) -> Result<QualityRun> {
        use super::corpus::{Corpus, CorpusOptions, Split};
        use super::train::spread_subset;
        use rand::seq::SliceRandom;
        let corpus = Corpus::read(
            corpus,
            CorpusOptions { tokenizer: Default::default(), max_vocab: BENCH_SHAPE.vocab, max_tokens: None },
        )?;
        let shape = TextShape { vocab: corpus.vocab.len(), ..BENCH_SHAPE };
        let split = Split::new(corpus.tokens.len(), shape.context)?;
        let mut order = split.train.clone();
        order.shuffle(&mut SeededRng::seed_from_u64(seed));
        order.truncate(samples.max(1));
        Ok(QualityRun {
            tokens: corpus.tokens.clone().into(),
            order,
            val: spread_subset(&split.val, 5000),
            params: TextParams::init(shape, seed),
        })
    }
}

/// The same SGD run on the GPU kernels and on the CPU reference: `samples` training samples in steps of
/// `batch` from the same initial parameters in the same shuffled order, at `precision` (the CPU's twin of
/// it), then the validation loss of each on the same held-out samples. The tokens, the order, the
/// validation positions, the initial parameters and the run's batch, rate and precision (`run.json`)
/// are written to `dump` so that the PyTorch model repeats exactly this run.
/// It always prints JSON.
pub fn quality(gpu: &Arc<Gpu>, _: &BenchOptions, args: &QualityArgs) -> Result<()> {
    use super::cpu_batch::BatchTrainer;
    use super::{CpuTrainer, TextTrainer};
    if !(args.lr.is_finite() && args.lr > 0.0) {
        anyhow::bail!("--lr must be a positive finite number, got {}", args.lr);
    }
    super::check_precision(args.precision)?;
    let QualityRun { tokens, order, val, params } = QualityRun::new(&args.corpus, args.samples, args.seed)?;
    let (shape, batch, lr) = (params.shape, args.batch, args.lr);

    // Each trainer runs the first PARITY_STEPS steps, then the rest; with the CPU run, the parameters
    // in between are compared (how close the two stay on real text before rounding has long to grow).
    const PARITY_STEPS: usize = 1000;
    let (head, tail) = order.split_at(order.len().min(PARITY_STEPS * batch));
    let started = std::time::Instant::now();
    let mut gpu_trainer = GpuTrainer::new(gpu.clone(), &params, tokens.clone())?;
    gpu_trainer.use_precision(args.precision)?;
    let mut gpu_loss = gpu_trainer.train(head, batch, lr)?;
    let (gpu_head, snapshot_secs) = if args.no_cpu {
        (None, 0.0)
    } else {
        let snapshot = std::time::Instant::now();
        (Some(gpu_trainer.params()?), snapshot.elapsed().as_secs_f64())
    };
    if !tail.is_empty() {
        gpu_loss += gpu_trainer.train(tail, batch, lr)?;
    }
    let gpu_train = gpu_loss / order.len() as f64;
    let gpu_eval = gpu_trainer.evaluate(&val)?;
    let gpu_secs = started.elapsed().as_secs_f64() - snapshot_secs;
    let (cpu_run, early_parity) = match gpu_head {
        None => (None, serde_json::Value::Null),
        Some(gpu_head) => {
            let started = std::time::Instant::now();
            let mut cpu: Box<dyn TextTrainer> = match (batch, args.precision) {
                (1, Precision::Fp32) => Box::new(CpuTrainer::new(params.clone(), tokens.clone())),
                _ => Box::new(BatchTrainer::at(params.clone(), tokens.clone(), args.precision)),
            };
            let mut cpu_loss = cpu.train(head, batch, lr)?;
            let errors: serde_json::Map<String, serde_json::Value> =
                super::checks::param_rel_errors(&gpu_head, &cpu.params()?)
                    .into_iter()
                    .map(|(name, err)| (name.to_string(), serde_json::json!(err)))
                    .collect();
            if !tail.is_empty() {
                cpu_loss += cpu.train(tail, batch, lr)?;
            }
            let cpu_run = (cpu_loss / order.len() as f64, cpu.evaluate(&val)?, started.elapsed().as_secs_f64());
            (Some(cpu_run), serde_json::json!({"steps": head.len().div_ceil(batch), "params_rel_error": errors}))
        }
    };

    std::fs::create_dir_all(&args.dump).with_context(|| format!("cannot create {}", args.dump.display()))?;
    let words = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    std::fs::write(args.dump.join("tokens.u32"), words(&tokens))?;
    std::fs::write(args.dump.join("order.u32"), words(&order))?;
    std::fs::write(args.dump.join("val.u32"), words(&val))?;
    let init = crate::io::tensorfile::to_bytes(&params.tensors(), Default::default())?;
    std::fs::write(args.dump.join("init.safetensors"), init)?;
    let run = serde_json::json!({"batch": batch, "lr": lr, "precision": args.precision.name()});
    std::fs::write(args.dump.join("run.json"), serde_json::to_string_pretty(&run)?)?;

    let summary = |train: f64, e: crate::text::model::EvalSums, secs: f64| {
        let n = e.samples.max(1) as f64;
        serde_json::json!({"train_loss": train, "val_loss": e.loss / n, "val_perplexity": (e.loss / n).exp(),
            "top1_percent": 100.0 * e.top1 as f64 / n, "top5_percent": 100.0 * e.top5 as f64 / n, "seconds": secs})
    };
    let gpu_val = gpu_eval.loss / gpu_eval.samples as f64;
    let (cpu, rel_diff) = match cpu_run {
        Some((train, eval, secs)) => {
            let cpu_val = eval.loss / eval.samples as f64;
            (summary(train, eval, secs), serde_json::json!((gpu_val - cpu_val).abs() / cpu_val))
        }
        None => (serde_json::Value::Null, serde_json::Value::Null),
    };
    let out = serde_json::json!({
        "device": "cuda:0", "device_name": gpu.describe(), "corpus": args.corpus, "vocab": shape.vocab, "samples": order.len(),
        "val_samples": val.len(), "lr": lr, "batch": batch, "precision": args.precision.name(), "seed": args.seed,
        "gpu": summary(gpu_train, gpu_eval, gpu_secs), "cpu": cpu,
        "val_loss_rel_diff": rel_diff, "early_parity": early_parity, "dump": args.dump,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
