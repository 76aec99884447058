//! `textnet transformer CORPUS`: trains the character-level Transformer (AdamW, random windows of the
//! corpus's first 90 %), reports the train and validation loss every --eval-every steps and writes the
//! model file. Progress is counted in steps, as nanoGPT counts them: one bar for the run with tokens/s
//! and ms/step, and a line per evaluation. In the `--json` report an "epoch" is the --eval-every steps
//! between two evaluations, and each row also gives its last step.
//!
//! nanoGPT's Shakespeare recipe maps onto the flags: --dropout 0.2, --lr-schedule cosine --warmup 100
//! --min-lr 1e-4, --beta2 0.99, --clip-norm 1 (alias --grad-clip), --eval-iters 200.

use super::data::{self, Corpus};
use super::gpu::GpuTransformer;
use super::gpu::parallel::Replicas;
use super::model::{self, Config, CpuTrainer};
use super::modelfile::TransformerModel;
use crate::device::parallel::{ParallelArgs, Plan};
use crate::device::precision::Precision;
use crate::device::{self, Backend};
use crate::harness::args::{RunArgs, ScheduleArgs, run_out};
use crate::harness::checkpoint;
use crate::harness::report::{self, Display, Divergence, EpochRow, Report};
use crate::harness::run::{self, Ending, TrainingCommand};
use crate::io::fsutil;
use crate::io::resources::{self, MemoryNeed};
use crate::ops::cpu::SeededRng;
use crate::ops::optim::{LrSchedule, OptimConfig, OptimKind};
use anyhow::{Context, Result, anyhow, bail};
use rand::SeedableRng;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

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
    /// Sequences per step
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
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
    /// Dropout probability in training, in [0, 1): after the embeddings, on the attention probabilities and
    /// on both residual branches (nanoGPT's places); never in evaluation or generation
    #[arg(long, value_name = "P", default_value_t = 0.0, allow_negative_numbers = true)]
    pub dropout: f32,
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
    /// --heads, --embed, --block, --no-bias, --tie-weights and --vocab cannot be given with it); AdamW's
    /// moments start afresh
    #[arg(
        long,
        value_name = "MODEL",
        conflicts_with_all = ["layers", "heads", "embed", "block", "no_bias", "tie_weights", "vocab"]
    )]
    pub resume: Option<PathBuf>,
}

impl TransformerArgs {
    fn check(&self) -> Result<Config> {
        if self.steps == 0 {
            bail!("--steps must be at least 1, got 0");
        }
        if self.batch == 0 {
            bail!("--batch must be at least 1, got 0");
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
    /// allocated: the parameters with their gradient and AdamW's two moments, a step's activations
    /// (18·embed + the vocabulary a row per block, about as much again for the gradients), and an
    /// evaluation interval's batch offsets.
    fn memory_need(&self, config: &Config) -> MemoryNeed {
        let (v, t, c, l) = (config.vocab as u64, config.block as u64, config.embed as u64, config.layers as u64);
        let per_block = c.saturating_mul(c).saturating_mul(12).saturating_add(c.saturating_mul(13));
        let params =
            l.saturating_mul(per_block).saturating_add((2 * v + t).saturating_mul(c)).saturating_add(v + 2 * c);
        // Each GPU of a data-parallel run holds its share of the batch.
        let share = self.batch / self.parallel.plan(self.batch).map_or(1, |p| p.replicas());
        let rows = (share as u64).saturating_mul(t);
        let row_floats = l.saturating_mul(18 * c).saturating_add(12 * c).saturating_add(v);
        MemoryNeed {
            parts: vec![
                ("the parameters and AdamW's state", params.saturating_mul(16), "--embed or --layers"),
                (
                    "a step's activations",
                    rows.saturating_mul(row_floats).saturating_mul(8),
                    "--batch, --block or --layers",
                ),
                (
                    "an evaluation interval's batches",
                    (self.eval_every as u64).saturating_mul(self.batch as u64).saturating_mul(4),
                    "--eval-every",
                ),
            ],
        }
    }

    fn optim(&self) -> Result<OptimConfig> {
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
    fn lr_schedule(&self) -> Result<LrSchedule> {
        let schedule = self.schedule.schedule(self.lr)?;
        schedule.check(self.steps)?;
        Ok(schedule)
    }

    /// The seed of dropout's masks at the replica of global rank `rank` (rank 0's is a one-GPU run's).
    fn dropout_seed(&self, rank: usize) -> u32 {
        ((self.run.seed ^ (self.run.seed >> 32)) as u32) ^ (rank as u32).wrapping_mul(0x9e37_79b9)
    }

    /// What every rank of a multi-process run must have been started with alike (the rendezvous compares
    /// it): the flags that shape the model and its training, and the corpus's length and hash (of its ids,
    /// as read: a corpus from standard input cannot be read twice).
    fn fingerprint(&self, corpus: &Corpus) -> String {
        use std::hash::{Hash, Hasher};
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        (&corpus.train, &corpus.val).hash(&mut hash);
        format!(
            "layers={},heads={},embed={},block={},bias={},tie={},batch={},steps={},lr={},wd={},beta2={},clip={},\
             schedule={}/{}/{},dropout={},vocab={},eval_every={},eval_iters={:?},seed={},precision={},resume={},\
             corpus={}/{:016x}",
            self.layers,
            self.heads,
            self.embed,
            self.block,
            !self.no_bias,
            self.tie_weights,
            self.batch,
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
            corpus.train.len() + corpus.val.len(),
            hash.finish()
        )
        .replace(char::is_whitespace, "_")
    }
}

/// A trainer on either device: steps over given batch offsets, and the validation loss.
enum Trainer {
    Cpu(Box<CpuTrainer>),
    Gpu(Box<GpuTransformer>),
    /// Data-parallel replicas (--gpus, --world-size).
    Parallel(Box<Replicas>),
}

impl Trainer {
    /// The mean loss of each step over `offsets` (`batch` per step), step s at learning rate `rates[s]`;
    /// `stepped(n)` after each n steps done (every step on the CPU; on the GPU, whose steps run as one
    /// graph, once).
    fn train(
        &mut self,
        corpus: &Corpus,
        offsets: &[u32],
        batch: usize,
        rates: &[f32],
        stepped: &mut dyn FnMut(usize),
    ) -> Result<Vec<f64>> {
        match self {
            Trainer::Cpu(t) => Ok(offsets
                .chunks(batch)
                .zip(rates)
                .map(|(o, &rate)| {
                    t.optimizer.config.lr = rate;
                    let (tokens, targets) = data::windows(&corpus.train, o, t.config.block);
                    let loss = f64::from(t.step(&tokens, &targets, batch));
                    stepped(1);
                    loss
                })
                .collect()),
            Trainer::Gpu(t) => {
                let losses = t.train_steps(offsets, batch, rates)?;
                stepped(losses.len());
                Ok(losses)
            }
            Trainer::Parallel(replicas) => {
                let losses = replicas.train_steps(offsets, batch, rates)?;
                stepped(losses.len());
                Ok(losses)
            }
        }
    }

    fn val_loss(&mut self, corpus: &Corpus, offsets: &[u32], batch: usize) -> Result<f64> {
        match self {
            Trainer::Cpu(t) => Ok(model::mean_loss(&t.config, &t.params, &corpus.val, offsets)),
            Trainer::Gpu(t) => t.val_loss(offsets, batch),
            Trainer::Parallel(replicas) => replicas.val_loss(offsets, batch),
        }
    }

    fn params(&mut self) -> Result<Vec<f32>> {
        match self {
            Trainer::Cpu(t) => Ok(t.params.clone()),
            Trainer::Gpu(t) => t.params(),
            Trainer::Parallel(replicas) => replicas.params(),
        }
    }
}

/// Runs `textnet transformer`.
pub fn run(args: TransformerArgs) -> Result<()> {
    run::run(&args)
}

/// What `setup` read, checked and built.
pub struct Setup {
    _lock: Option<fsutil::OutputLock>,
    /// The links to the other ranks of a multi-process run, watched until it ends.
    watch: Option<crate::device::rendezvous::Watch>,
    /// Whether this process writes --out (every process but ranks other than 0).
    writes: bool,
    display: Display,
    corpus: Corpus,
    config: Config,
    backend: Backend,
    val_offsets: Vec<u32>,
    /// The validation loss of the Transformer already at --out on this run's windows.
    baseline: Option<f64>,
    trainer: Trainer,
    /// Evaluations in the run (one per --eval-every steps): the report's rows.
    evals: usize,
    /// Steps the --resume'd model had taken.
    steps_before: usize,
    /// The learning rate of each of this run's steps.
    rates: Vec<f32>,
}

/// What `train` hands to `finish`.
pub struct Trained {
    setup: Setup,
    progress: Progress,
    seconds: f64,
}

/// How far the evaluations got.
struct Progress {
    rows: Vec<EpochRow>,
    diverged: Option<Divergence>,
    /// Steps done.
    done: usize,
    /// The lowest validation loss of the run.
    best_val: f64,
    /// What --out holds from this run: the evaluation, its step and its validation loss.
    kept: Option<Kept>,
}

impl Progress {
    /// What --out holds when the run stops before its end (interrupted, or on an error): the best step
    /// written so far, or what a run that wrote nothing leaves there.
    fn outcome_so_far(&self, out: &Path) -> String {
        match self.kept {
            Some(k) => format!(
                "{} holds the model of step {} (the best of the {} steps done)",
                out.display(),
                k.step,
                self.done
            ),
            None => run::write_once_outcome(out, false, None, None),
        }
    }
}

/// An evaluation written to --out.
#[derive(Clone, Copy)]
struct Kept {
    eval: usize,
    step: usize,
    val_loss: f64,
}

impl TrainingCommand for TransformerArgs {
    type Setup = Setup;
    type Trained = Trained;

    fn setup(&self) -> Result<Setup> {
        let args = self;
        let shape = args.check()?;
        let optim = args.optim()?;
        let schedule = args.lr_schedule()?;
        let plan = args.parallel.plan(args.batch)?;
        // Ranks other than 0 of a multi-process run write nothing: rank 0 writes --out and the report.
        let writes = plan.writes();
        let lock = writes.then(|| fsutil::check_output(&args.run.out, &[("corpus", &args.corpus)])).transpose()?;
        let mut inputs = vec![("corpus", args.corpus.as_path())];
        inputs.extend(args.resume.as_deref().map(|m| ("--resume model", m)));
        if writes {
            crate::harness::plot::check(args.run.plot.as_deref(), Some(&args.run.out), &inputs)?;
        }
        let existing = match writes {
            true => fsutil::existing_model(&args.run.out, "Transformer", TransformerModel::from_bytes)?,
            false => None,
        };
        let existing = existing.filter(|_| !args.run.overwrite);
        let resumed = match &args.resume {
            Some(path) => Some(TransformerModel::load(path).context("--resume")?),
            None => None,
        };
        let steps_before = resumed.as_ref().map_or(0, |m| m.steps);
        let (corpus, config, params) = match resumed {
            Some(model) => {
                let what = format!("corpus {}", fsutil::shown(&args.corpus));
                let bytes = fsutil::read_input(&args.corpus, "corpus")?;
                let corpus = Corpus::with_vocab(&bytes, &what, model.vocab, model.config.block)?;
                check_unknown_share(&corpus, args.resume.as_deref().unwrap_or(&args.run.out))?;
                (corpus, model.config, model.params)
            }
            None => {
                let corpus = Corpus::load(&args.corpus, args.vocab, args.block)?;
                let config = Config { vocab: corpus.vocab.len(), ..shape };
                (corpus, config, model::init(&config, args.run.seed))
            }
        };
        args.memory_need(&config).check(resources::available_memory())?;
        if let Some(old) = &existing
            && (old.vocab != corpus.vocab || old.config.block != config.block)
        {
            return Err(checkpoint::other_data(&args.run.out, "a Transformer of another vocabulary or block"));
        }
        let evals = args.steps.div_ceil(args.eval_every);
        let display = Display::new(args.run.quiet || !writes, args.run.json && writes, evals)
            .tensorboard(args.run.tensorboard.as_deref())?;
        // Every rank, the silent ones too, says whom it waits for at the rendezvous (up to minutes).
        let announce = |line: &str| {
            if !args.run.quiet {
                crate::harness::console::err(line);
            }
        };
        let mut opened = plan.open(args.run.device, || args.fingerprint(&corpus), announce)?;
        let (backend, device_line) = (opened.backend.clone(), opened.line.clone());
        if let Some(path) = &args.resume {
            display
                .line(&format!("resuming {} (its shape and vocabulary; AdamW's moments start afresh)", path.display()));
        }
        display.line(&format!(
            "model: {} layers, {} heads, embed {}, block {}{}{}, vocabulary {} ({} characters of {} read as unknown); \
             {} parameters; AdamW lr {}{} weight decay {} β2 {}{}{}, batch {} × {}, {} steps, seed {}; device {device_line}",
            config.layers,
            config.heads,
            config.embed,
            config.block,
            if config.bias { "" } else { ", no biases" },
            if config.tie_weights { ", head tied to the token embedding" } else { "" },
            config.vocab,
            report::count(corpus.unknown),
            report::count(corpus.train.len() + corpus.val.len()),
            report::count(params.len()),
            args.lr,
            Some(schedule.describe()).filter(|d| !d.is_empty()).map_or(String::new(), |d| format!(" ({d})")),
            args.weight_decay,
            args.beta2,
            if args.clip_norm > 0.0 { format!(", clip-norm {}", args.clip_norm) } else { String::new() },
            if args.dropout > 0.0 { format!(", dropout {}", args.dropout) } else { String::new() },
            args.batch,
            config.block,
            args.steps,
            args.run.seed,
        ));
        let val_offsets = match args.eval_iters {
            Some(n) => {
                data::sampled_val_offsets(corpus.val.len(), config.block, n.saturating_mul(args.batch), args.run.seed)
            }
            None => data::val_offsets(corpus.val.len(), config.block),
        };
        // The model already at --out, measured on this run's validation windows (its stored val_loss was
        // measured on whatever corpus it was trained on).
        let baseline = match &existing {
            Some(old) => {
                let loss = match &backend {
                    Backend::Cpu => model::mean_loss(&old.config, &old.params, &corpus.val, &val_offsets),
                    Backend::Cuda(gpu) => GpuTransformer::new(gpu.clone(), old.config, &old.params, optim, &corpus)?
                        .val_loss(&val_offsets, args.batch)?,
                };
                let loss = checkpoint::baseline(&args.run.out, loss, "validation loss")?;
                display.line(&format!(
                    "--out {} already holds a Transformer of validation loss {loss:.4} here; only one at least as good \
                     replaces it",
                    args.run.out.display()
                ));
                Some(loss)
            }
            None => None,
        };
        let replica = |gpu: Arc<device::Gpu>, rank: usize| -> Result<GpuTransformer> {
            let mut t = GpuTransformer::new(gpu, config, &params, optim, &corpus)?;
            t.set_dropout(args.dropout, args.dropout_seed(rank));
            t.set_precision(args.precision)?;
            Ok(t)
        };
        let trainer = match (&plan, &backend) {
            (_, Backend::Cpu) => Trainer::Cpu(Box::new(
                CpuTrainer::new(config, params.clone(), optim)?.with_dropout(args.dropout, args.dropout_seed(0)),
            )),
            (Plan::One, Backend::Cuda(gpu)) => Trainer::Gpu(Box::new(replica(gpu.clone(), 0)?)),
            (Plan::Local(_) | Plan::Rank { .. }, _) => Trainer::Parallel(Box::new(Replicas::new(&opened, replica)?)),
        };
        if args.precision != Precision::Fp32 && matches!(backend, Backend::Cpu) {
            display.line(&format!(
                "note: --precision {} applies to the GPU only; the CPU trains in fp32",
                args.precision.name()
            ));
        }
        let rates = schedule.rates(args.lr, args.steps);
        Ok(Setup {
            _lock: lock,
            watch: opened.watch.take(),
            writes,
            display,
            corpus,
            config,
            backend,
            val_offsets,
            baseline,
            trainer,
            evals,
            steps_before,
            rates,
        })
    }

    fn train(&self, mut setup: Setup) -> Result<Trained> {
        let start = Instant::now();
        let mut progress = Progress { rows: Vec::new(), diverged: None, done: 0, best_val: f64::INFINITY, kept: None };
        let evaluated = self.evaluations(&mut setup, &mut progress, start);
        setup.display.clear();
        if let Err(e) = evaluated {
            // A failed write or device: the line says what --out holds, as every other end of a run does.
            return Err(match setup.writes {
                true => anyhow!("{e:#}; {}", progress.outcome_so_far(&self.run.out)),
                false => e,
            });
        }
        Ok(Trained { setup, progress, seconds: start.elapsed().as_secs_f64() })
    }

    fn finish(&self, trained: Trained) -> Result<Ending> {
        let args = self;
        let Trained { setup, progress, seconds } = trained;
        let so_far = progress.outcome_so_far(&args.run.out);
        let Progress { rows, diverged, done, best_val, kept } = progress;
        let Setup { mut display, corpus, config, backend, val_offsets, baseline, evals, watch, writes, .. } = setup;
        if let Some(watch) = watch {
            watch.finish();
        }
        let interrupted = diverged.is_none() && done < args.steps;
        let unigram = corpus.unigram_loss();
        let guessing = (config.vocab as f64).ln();
        let learned = best_val < guessing;
        let written = kept.is_some();
        let out = args.run.out.display();
        if let Some(k) = kept {
            let at = if evals > 1 { format!(", step {} of {}", k.step, args.steps) } else { String::new() };
            display.line(&format!(
                "{out} holds the trained model (validation loss {:.4}{at}, {seconds:.1} s)",
                k.val_loss
            ));
            if k.val_loss >= unigram {
                display.line(&run::weaker_than_unigram(k.val_loss, unigram, "character"));
            }
        }
        let figure = kept.map_or(best_val, |k| k.val_loss);
        let outcome = run::write_once_outcome(
            &args.run.out,
            written,
            (written || diverged.is_none()).then(|| format!("validation loss {figure:.4}")),
            baseline.map(|b| format!("{b:.4}")),
        );
        let remedy = format!(
            "try a lower --lr (this run used {}){}",
            args.lr,
            if args.weight_decay > 1.0 {
                format!(" or a far lower --weight-decay (this run used {})", args.weight_decay)
            } else {
                String::new()
            }
        );
        let failed = (diverged.is_none() && !interrupted && !learned).then(|| {
            run::not_learned(
                &format!(
                    "its best val loss {best_val:.4} is no better than guessing (ln {} = {guessing:.4})",
                    config.vocab
                ),
                &outcome,
                &format!("try more --steps or another --lr (this run used {})", args.lr),
            )
        });
        let mut ending = Ending {
            report: None,
            json: args.run.json,
            board: display.take_board(),
            diverged,
            interrupted: interrupted.then(|| format!("at step {done} of {}", args.steps)),
            failed,
            written,
            outcome: if interrupted && written { so_far } else { outcome },
            remedy,
            plot_failed: crate::harness::plot::training_curves(
                args.run.plot.as_deref().filter(|_| writes),
                &format!(
                    "textnet transformer on {}: {} layer{}, {} heads, embed {}, block {}; AdamW lr {}, batch {}",
                    fsutil::shown(&args.corpus),
                    config.layers,
                    if config.layers == 1 { "" } else { "s" },
                    config.heads,
                    config.embed,
                    config.block,
                    args.lr,
                    args.batch
                ),
                &rows,
                &display,
            ),
        };
        // Ranks other than 0 of a multi-process run print no report (rank 0's is the run's).
        if (args.run.json || args.run.tensorboard.is_some()) && writes {
            ending.report = Some(Report {
                textnet: report::VERSION,
                command: "transformer",
                status: ending.status(),
                config: report::with_flags(
                    json!({
                        "corpus": args.corpus.display().to_string(),
                        "keep": "best",
                        "layers": config.layers, "heads": config.heads, "embed": config.embed, "block": config.block,
                        "bias": config.bias, "tie_weights": config.tie_weights,
                        "batch": args.batch, "steps": args.steps, "lr": report::decimal(args.lr),
                        "weight_decay": report::decimal(args.weight_decay), "beta2": report::decimal(args.beta2),
                        "clip_norm": report::decimal(args.clip_norm),
                        "dropout": report::decimal(args.dropout),
                        "eval_iters": args.eval_iters,
                        "vocab": args.vocab,
                        "eval_every": args.eval_every,
                        "precision": args.precision.name(),
                        "gpus": args.parallel.plan(args.batch).map_or(1, |p| p.replicas()),
                        "resume": args.resume.as_ref().map(|p| p.display().to_string()),
                    }),
                    &[&args.run, &args.schedule],
                ),
                device: report::DeviceFields::of(&backend),
                data: json!({
                    "train_chars": corpus.train.len(),
                    "val_chars": corpus.val.len(),
                    "val_windows": val_offsets.len(),
                    "vocabulary": config.vocab,
                    "unknown_chars": corpus.unknown,
                    "unigram_val_loss": unigram,
                }),
                parameters: model::Layout::new(&config).len(),
                epochs: rows,
                final_metrics: written.then(|| {
                    let mut m = serde_json::Map::new();
                    m.insert("val_loss".into(), json!(kept.map(|k| k.val_loss)));
                    m.insert("train_s".into(), json!(seconds));
                    m
                }),
                model: out.to_string(),
                kept_epoch: kept.map(|k| k.eval),
                baseline_val_loss: baseline,
                diverged: ending.diverged.clone(),
            });
        }
        Ok(ending)
    }
}

/// The evaluation intervals of a run, each written to --out when it beats the ones before; `progress` says
/// how far they got, also when one fails.
impl TransformerArgs {
    fn evaluations(&self, setup: &mut Setup, progress: &mut Progress, start: Instant) -> Result<()> {
        let args = self;
        let Setup {
            ref mut display,
            ref mut trainer,
            ref corpus,
            ref val_offsets,
            config,
            evals,
            ref rates,
            baseline,
            steps_before,
            writes,
            ..
        } = *setup;
        let mut rng = SeededRng::seed_from_u64(args.run.seed);
        let guessing = (config.vocab as f64).ln();
        display.steps_started(args.steps, args.batch * config.block);
        for eval in 1..=evals {
            let before = progress.done;
            let steps = args.eval_every.min(args.steps - before);
            let offsets: Vec<u32> = (0..steps)
                .flat_map(|_| data::train_offsets(&mut rng, corpus.train.len(), config.block, args.batch))
                .collect();
            let mut reached = before;
            let losses = trainer.train(corpus, &offsets, args.batch, &rates[before..before + steps], &mut |n| {
                reached += n;
                display.steps_reached(reached);
            })?;
            progress.done += steps;
            let done = progress.done;
            let train_loss = losses.iter().sum::<f64>() / losses.len() as f64;
            let val = trainer.val_loss(corpus, val_offsets, args.batch)?;
            let elapsed = start.elapsed().as_secs_f64();
            if !(train_loss.is_finite() && val.is_finite()) {
                progress.diverged = Some(Divergence { epoch: eval, what: "loss" });
                break;
            }
            progress.best_val = progress.best_val.min(val);
            // The best checkpoint so far goes to --out as soon as it is reached (atomically), so that an
            // overfitting tail never replaces it: an evaluation is written when it learned something,
            // beats every one written before it, and is no worse than the model --out held (a tie, as
            // stored in f32, rewrites: the same run again leaves the same bytes).
            let beats = val < guessing
                && baseline.is_none_or(|b| val as f32 <= b as f32)
                && progress.kept.is_none_or(|k| val < k.val_loss);
            if beats {
                let model = TransformerModel {
                    config,
                    vocab: corpus.vocab.clone(),
                    params: trainer.params()?,
                    val_loss: val as f32,
                    steps: steps_before + done,
                };
                if writes {
                    fsutil::write_atomic(&args.run.out, &model.to_bytes()?)?;
                }
                progress.kept = Some(Kept { eval, step: done, val_loss: val });
            }
            let row = EpochRow {
                epoch: eval,
                train_loss,
                val_loss: Some(val),
                val_accuracy: None,
                test_loss: None,
                test_accuracy: None,
                samples_per_s: (done * args.batch) as f64 / elapsed.max(1e-9),
                lr: Some(report::decimal(rates[done - 1])),
                elapsed_s: elapsed,
                extra: Default::default(),
            }
            .with("step", done)
            .with("tokens_per_s", (done * args.batch * config.block) as f64 / elapsed.max(1e-9))
            .with("last_step_loss", losses.last().copied().unwrap_or(f64::NAN));
            display.evaluated(&format!(
                "step {done}/{}: train loss {train_loss:.4}, val loss {val:.4}, {} tokens/s, {} elapsed",
                args.steps,
                report::thousands(row.samples_per_s * config.block as f64),
                report::duration(elapsed)
            ));
            display.record_steps(before + 1, &losses);
            display.record(done, &row);
            progress.rows.push(row);
            if crate::harness::interrupt::requested() {
                break;
            }
        }
        Ok(())
    }
}

/// A --resume'd model reads characters outside its vocabulary as unknown: past half of the corpus, it
/// would learn to predict the unknown character.
fn check_unknown_share(corpus: &Corpus, model: &Path) -> Result<()> {
    let total = corpus.train.len() + corpus.val.len();
    if corpus.unknown * 2 > total {
        bail!(
            "--resume {}: {:.1}% of the corpus's characters are not in the model's vocabulary (they read as unknown); \
             train a new model on this corpus instead (without --resume)",
            model.display(),
            100.0 * corpus.unknown as f64 / total as f64
        );
    }
    Ok(())
}
