//! `textnet train` and `textnet predict`: argument checks and what they print (through `report`, as
//! every training command does). The work itself is in `corpus`, `train`, `modelfile` and `predict`.
//! Errors are returned and printed by `main` as one line.

use super::corpus::{Corpus, CorpusOptions, Split};
use super::cpu_batch;
use super::model::{TextParams, TextShape};
use super::modelfile::TextModel;
use super::tokenizer::Tokenizer;
use super::train::{self, EpochMetrics, Progress, TrainOptions, TrainRun};
use super::{CpuTrainer, TextTrainer};
use crate::device::precision::Precision;
use crate::device::{self, Backend};
use crate::harness::args::{RunArgs, ScheduleArgs, run_out};
use crate::harness::checkpoint::{self, Keep, Keeper};
use crate::harness::interrupt;
use crate::harness::report::{self, Display, EpochRow, Report, Status};
use crate::harness::run::{self, Ending, TrainingCommand};
use crate::ops::optim::{LrSchedule, OptimConfig, OptimKind};
use anyhow::{Context, Result, anyhow, bail};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Args, Debug)]
#[command(mut_arg(
    "out",
    run_out(
        "textnet.safetensors",
        "Where to write the model (.safetensors); it is written after every epoch that --keep keeps"
    )
))]
/// The flags of `textnet train`.
pub struct TrainArgs {
    /// UTF-8 text file to train on, `-` for standard input (other encodings are rejected, naming the first
    /// invalid byte)
    pub corpus: PathBuf,
    #[command(flatten)]
    /// The run flags (`--out`, `--seed`, `--device`, `--json`, ...).
    pub run: RunArgs,
    /// Which epoch the model file holds: the one of lowest validation loss, or the last
    #[arg(long, value_enum, default_value_t = Keep::Best)]
    pub keep: Keep,
    /// Go on training this model file on CORPUS, with its vocabulary, tokenizer and shape (which is why
    /// --max-vocab, --context, --embed, --hidden and --keep-case cannot be given with it)
    #[arg(long, value_name = "MODEL", conflicts_with_all = ["max_vocab", "context", "embed", "hidden", "keep_case"])]
    pub resume: Option<PathBuf>,
    #[arg(long, default_value_t = 8192, help = "Vocabulary size cap, <unk> included; rarer tokens become <unk>")]
    /// Vocabulary size cap, `<unk>` included; rarer tokens become `<unk>`.
    pub max_vocab: usize,
    /// Context tokens per prediction (N)
    #[arg(long, default_value_t = 3)]
    pub context: usize,
    /// Embedding width (D)
    #[arg(long, default_value_t = 64)]
    pub embed: usize,
    /// Hidden layer width (H)
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// SGD learning rate (single samples: 0.01-0.02 did best on the Shakespeare corpus at the default size;
    /// 0.1 is worse). With --batch B, B times this keeps an epoch's progress (a step averages B samples)
    /// [default: 0.02; on the CPU 0.01 × the batch: 2.56 for its default batch of 256, 0.64 for --batch 64]
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f32>,
    /// Optimizer: sgd is fused into the step kernels (single samples at full speed); momentum and adam take
    /// every step through the batched kernels and the shared update, with --lr as their learning rate
    /// (Adam wants about 1e-3)
    #[arg(long, value_enum, default_value_t = OptimKind::Sgd)]
    pub optim: OptimKind,
    /// Momentum μ of --optim momentum [default: 0.9]
    #[arg(long, allow_negative_numbers = true)]
    pub momentum: Option<f32>,
    /// L2 weight decay of --optim momentum or adam, added to the gradient as wd·θ
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub weight_decay: f32,
    #[command(flatten)]
    /// The learning-rate schedule (`--lr-schedule`, `--warmup`, `--min-lr`).
    pub schedule: ScheduleArgs,
    /// Passes over the training samples [default: 5; on the CPU: 3]
    #[arg(short = 'e', long)]
    pub epochs: Option<usize>,
    /// Samples per SGD step. On the CPU, given neither --batch nor --lr, steps of 256 samples at lr 2.56
    /// (single samples would take hours there); given either, the other takes its GPU default
    /// [default: 1; on the CPU: 256]
    #[arg(long)]
    pub batch: Option<usize>,
    /// Shuffle the training samples each epoch (the default; seeded by --seed)
    #[arg(long, overrides_with = "no_shuffle")]
    // Only so that `--shuffle` can be written: the last of the two flags wins, and `no_shuffle` says which.
    pub shuffle: bool,
    /// Train on the samples in corpus order
    #[arg(long, overrides_with = "shuffle")]
    pub no_shuffle: bool,
    /// Keep upper case (by default all text is lowercased; the model remembers which)
    #[arg(long)]
    pub keep_case: bool,
    /// Use only the first N tokens of the corpus (the vocabulary is built from them too)
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Validate on at most N samples, spread evenly over the held-out last 10% (0 = all of them)
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    pub val_max: usize,
    /// The arithmetic of the three vocabulary-sized products (logits, ∂W2, ∂h): fp32, or bf16 operands on
    /// the tensor cores with fp32 sums, weights, softmax and updates (every step then takes the batched
    /// kernels; pays from --batch 64). The CPU runs bf16 as its twin for SGD; tf32 is not offered
    #[arg(long, value_enum, default_value_t)]
    pub precision: Precision,
    /// Print an epoch's line only every N epochs (and the first and last), for long runs
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub log_every: usize,
}

impl TrainArgs {
    fn validate(&self) -> Result<()> {
        for (flag, value, least) in [
            ("--max-vocab", self.max_vocab, 2),
            ("--context", self.context, 1),
            ("--embed", self.embed, 1),
            ("--hidden", self.hidden, 1),
            ("--batch", self.batch.unwrap_or(1), 1),
            ("--max-tokens", self.max_tokens.unwrap_or(1), 1),
        ] {
            if value < least {
                bail!("{flag} must be at least {least}, got {value}");
            }
        }
        if let Some(epochs) = self.epochs {
            crate::io::resources::check_epochs(epochs)?;
        }
        if let Some(lr) = self.lr.filter(|lr| !(lr.is_finite() && *lr > 0.0)) {
            bail!("--lr must be a positive finite number, got {lr}");
        }
        if self.run.out.is_dir() {
            bail!("--out {} is a directory; give a file name", self.run.out.display());
        }
        self.optim_config(self.lr.unwrap_or(DEFAULT_LR)).validate()?;
        if self.momentum.is_some() && self.optim != OptimKind::Momentum {
            bail!("--momentum applies to --optim momentum only (this run uses --optim {})", self.optim.name());
        }
        super::check_precision(self.precision)?;
        if self.weight_decay != 0.0 && self.optim == OptimKind::Sgd {
            bail!("--weight-decay applies to --optim momentum and adam (the fused SGD update has none)");
        }
        Ok(())
    }

    /// The update the flags ask for, at learning rate `lr`.
    fn optim_config(&self, lr: f32) -> OptimConfig {
        let mut config = OptimConfig { lr, weight_decay: self.weight_decay, ..OptimConfig::new(self.optim) };
        if let Some(momentum) = self.momentum {
            config.momentum = momentum;
        }
        config
    }

    /// The flags with the defaults of the device the run trains on filled in.
    fn plan(&self, on_cpu: bool) -> Plan {
        let cpu_rule = on_cpu && self.lr.is_none() && self.optim == OptimKind::Sgd;
        let cpu_default = cpu_rule && self.batch.is_none();
        let batch = self.batch.unwrap_or(if cpu_default { CPU_BATCH } else { 1 });
        let lr = match self.lr {
            Some(lr) => lr,
            None if cpu_rule && batch > 1 => CPU_LR_PER_SAMPLE * batch as f32,
            None => DEFAULT_LR,
        };
        let epochs = self.epochs.unwrap_or(if on_cpu { CPU_EPOCHS } else { DEFAULT_EPOCHS });
        Plan { lr, batch, epochs, cpu_default, cpu_rule: cpu_rule && batch > 1 }
    }

    fn config_json(&self, shape: TextShape, tokenizer: Tokenizer, plan: &Plan) -> serde_json::Value {
        report::with_flags(
            json!({
                "corpus": self.corpus.display().to_string(),
                "keep": self.keep.name(),
                "resume": self.resume.as_ref().map(|p| p.display().to_string()),
                "max_vocab": self.max_vocab,
                "context": shape.context,
                "embed": shape.embed,
                "hidden": shape.hidden,
                "lr": report::decimal(plan.lr),
                "optim": self.optim.name(),
                "weight_decay": report::decimal(self.weight_decay),
                "epochs": plan.epochs,
                "batch": plan.batch,
                "shuffle": !self.no_shuffle,
                "keep_case": !tokenizer.lowercase,
                "max_tokens": self.max_tokens,
                "val_max": self.val_max,
                "precision": self.precision.name(),
            }),
            &[&self.run, &self.schedule],
        )
    }
}

/// The progress display, and the save after each epoch.
struct EpochBar {
    display: Display,
    saver: Saver,
}

/// Writes the epochs that `keeper` keeps to `out`.
struct Saver {
    out: PathBuf,
    keeper: Keeper,
    /// The parameters are replaced by each saved epoch's.
    model: TextModel,
    /// What happened to the last epoch, for its summary line.
    note: String,
}

impl Saver {
    fn offer(&mut self, m: &EpochMetrics, params: &TextParams) -> Result<()> {
        let (model, out) = (&mut self.model, &self.out);
        let written = self.keeper.offer(m.epoch, m.val_loss, || {
            model.params = params.clone();
            model.save(out)
        })?;
        self.note = self.keeper.note(written, "val loss");
        Ok(())
    }
}

/// An epoch's row in the `--json` report.
fn epoch_row(m: &EpochMetrics) -> EpochRow {
    EpochRow {
        epoch: m.epoch,
        train_loss: m.train_loss,
        val_loss: Some(m.val_loss),
        val_accuracy: Some(m.top1),
        test_loss: None,
        test_accuracy: None,
        samples_per_s: m.samples_per_s,
        lr: Some(report::decimal(m.lr)),
        elapsed_s: m.elapsed_s,
        extra: Default::default(),
    }
    .with("val_perplexity", m.val_perplexity)
    .with("val_top5_accuracy", m.top5)
}

impl Progress for EpochBar {
    fn epoch_started(&mut self, epoch: usize, samples: usize) {
        self.display.epoch_started(epoch, samples);
    }

    fn advanced(&mut self, samples: usize) {
        self.display.advanced(samples);
    }

    fn epoch_completed(&mut self, m: &EpochMetrics, params: &TextParams) -> Result<bool> {
        self.saver.offer(m, params)?;
        Ok(!interrupt::requested())
    }

    fn epoch_finished(&mut self, m: &EpochMetrics) {
        let figures = format!(
            "val loss {:.4} (perplexity {:.1}), top-1 {:.1}%, top-5 {:.1}%",
            m.val_loss,
            m.val_perplexity,
            100.0 * m.top1,
            100.0 * m.top5
        );
        self.display.epoch_finished(&epoch_row(m), &figures, &self.saver.note);
    }
}

/// Runs `textnet train`.
pub fn train(args: TrainArgs) -> Result<()> {
    run::run(&args)
}

/// What `setup` read, checked and built for `train`.
pub struct Prepared {
    _lock: crate::io::fsutil::OutputLock,
    summary: Summary,
    display: Display,
    trainer: Box<dyn TextTrainer>,
    train: Vec<u32>,
    /// The validation samples evaluated each epoch.
    val: Vec<u32>,
    /// The val loss a saved epoch must beat: the model at --out's, or the --resume'd one's.
    baseline: Option<f64>,
    /// The model as the run starts (its parameters are replaced by each saved epoch's).
    model: TextModel,
}

/// What `train` hands to `finish`.
pub struct Trained {
    _lock: crate::io::fsutil::OutputLock,
    summary: Summary,
    bar: EpochBar,
    run: Result<TrainRun>,
}

impl TrainingCommand for TrainArgs {
    type Setup = Prepared;
    type Trained = Trained;

    fn setup(&self) -> Result<Prepared> {
        let args = self;
        args.validate()?;
        let lock = crate::io::fsutil::check_output(&args.run.out, &[("corpus", &args.corpus)])?;
        let mut inputs = vec![("corpus", args.corpus.as_path())];
        inputs.extend(args.resume.as_deref().map(|m| ("--resume model", m)));
        crate::harness::plot::check(args.run.plot.as_deref(), Some(&args.run.out), &inputs)?;
        let resumed = match &args.resume {
            Some(path) => Some(TextModel::load(path).context("--resume")?),
            None => None,
        };
        let existing = existing_out(&args.run.out, args.resume.as_deref())?;
        let existing = existing.filter(|_| !args.run.overwrite);
        let tokenizer = resumed.as_ref().map_or(Tokenizer { lowercase: !args.keep_case }, |m| m.tokenizer);
        let max_vocab = if resumed.is_some() { usize::MAX } else { args.max_vocab };
        let mut corpus =
            Corpus::read(&args.corpus, CorpusOptions { tokenizer, max_vocab, max_tokens: args.max_tokens })?;
        if let (Some(model), Some(path)) = (&resumed, &args.resume) {
            corpus = corpus.in_vocabulary(&model.vocab);
            check_resumable(&corpus, path, &args.corpus)?;
        }
        let shape = match &resumed {
            Some(model) => model.params.shape,
            None => {
                TextShape { vocab: corpus.vocab.len(), embed: args.embed, hidden: args.hidden, context: args.context }
            }
        };
        let split = Split::new(corpus.tokens.len(), shape.context)?;
        let val = train::spread_subset(&split.val, args.val_max);
        shape.validate()?;
        check_size(shape)?;

        let (backend, device_line) = device::select_described(args.run.device)?;
        let on_cpu = matches!(backend, device::Backend::Cpu);
        let plan = args.plan(on_cpu);
        let schedule = args.schedule.schedule(plan.lr)?;
        schedule.check(split.train.len().div_ceil(plan.batch) * plan.epochs)?;
        let display = Display::new(args.run.quiet, args.run.json, plan.epochs)
            .log_every(args.log_every)
            .tensorboard(args.run.tensorboard.as_deref())?;
        let batch = plan.batch.min(split.train.len());
        shape.training_memory(batch, corpus.tokens.len(), on_cpu).check(crate::io::resources::available_memory())?;
        let params = match resumed {
            Some(model) => model.params,
            None => TextParams::init(shape, args.run.seed),
        };
        let tokens: Arc<[u32]> = std::mem::take(&mut corpus.tokens).into();
        let cpu_line = match on_cpu {
            true => Some(cpu_plan_line(&plan, args, &params, &tokens, &split.train, &val)?),
            false => None,
        };
        let summary = Summary {
            plan,
            schedule,
            cpu_line,
            device: device_line,
            device_fields: report::DeviceFields::of(&backend),
            tokens: tokens.len(),
            truncated: corpus.truncated,
            unknown: corpus.unknown,
            shape,
            tokenizer,
            train_samples: split.train.len(),
            val_samples: split.val.len(),
            val_evaluated: val.len(),
            unigram: train::unigram_loss(&tokens, split.val_start, shape.vocab, &val),
        };
        let Corpus { vocab, .. } = corpus;
        summary.print(args, &display);

        let mut baseline = None;
        if let Some(old) = existing {
            if !(old.vocab == vocab && old.tokenizer == tokenizer && old.params.shape.context == shape.context) {
                return Err(checkpoint::other_data(
                    &args.run.out,
                    "a text model of another vocabulary, tokenizer or context",
                ));
            }
            let loss = checkpoint::baseline(&args.run.out, val_loss(&backend, old.params, &tokens, &val)?, "val loss")?;
            display.line(&format!(
                "--out {} already holds a model of val loss {loss:.4} here; only a better epoch replaces it",
                args.run.out.display()
            ));
            baseline = Some(loss);
        } else if args.run.overwrite && args.run.out.exists() {
            display.line(&format!(
                "--overwrite: the first saved epoch replaces the model at --out {}",
                args.run.out.display()
            ));
        }
        let mut trainer = train::make_trainer(
            &backend,
            params.clone(),
            tokens,
            plan.batch,
            args.optim_config(plan.lr),
            args.precision,
        )?;
        if let Some(path) = &args.resume {
            let loss = mean_loss(trainer.evaluate(&val)?);
            if !loss.is_finite() {
                bail!(
                    "--resume {}: the model's outputs on this corpus are not finite (val loss {loss}), so it cannot be trained \
                     further; train a new model instead",
                    path.display()
                );
            }
            display.line(&format!("{} has val loss {loss:.4} here; only a better epoch is saved", path.display()));
            baseline = Some(baseline.map_or(loss, |b: f64| b.min(loss)));
        }
        Ok(Prepared {
            _lock: lock,
            summary,
            display,
            trainer,
            train: split.train,
            val,
            baseline,
            model: TextModel { params, tokenizer, vocab },
        })
    }

    fn train(&self, setup: Prepared) -> Result<Trained> {
        let args = self;
        let Prepared { _lock, summary, display, mut trainer, train, val, baseline, model } = setup;
        let plan = summary.plan;
        let options = TrainOptions {
            lr: plan.lr,
            schedule: summary.schedule,
            epochs: plan.epochs,
            batch: plan.batch,
            seed: args.run.seed,
            shuffle: !args.no_shuffle,
        };
        // An epoch no better than guessing learned nothing, and is never written.
        let guessing = summary.guessing_loss();
        let keeper = Keeper::new(args.keep, baseline).with_floor(guessing);
        let saver = Saver { out: args.run.out.clone(), keeper, model, note: String::new() };
        let mut bar = EpochBar { display, saver };
        let run = train::train(trainer.as_mut(), &train, &val, &options, &mut bar);
        Ok(Trained { _lock, summary, bar, run })
    }

    fn finish(&self, trained: Trained) -> Result<Ending> {
        let args = self;
        let Trained { summary, bar, run, .. } = trained;
        let plan = summary.plan;
        let EpochBar { mut display, saver } = bar;
        let keeper = saver.keeper;
        let outcome = keeper.outcome(&args.run.out, "val loss");
        let TrainRun { epochs, diverged, .. } = run.map_err(|e| anyhow!("{e:#}; {outcome}"))?;
        let interrupted = epochs.len() < plan.epochs && diverged.is_none();
        let guessing = summary.guessing_loss();
        let failed = match keeper.best {
            Some((_, best)) if keeper.kept.is_none() && diverged.is_none() && !interrupted && best >= guessing => {
                Some(run::not_learned(
                    &format!(
                        "its best val loss {best:.4} is no better than guessing (ln {} = {guessing:.4})",
                        summary.shape.vocab
                    ),
                    &outcome,
                    &format!("try more --epochs or another --lr (this run used {})", plan.lr),
                ))
            }
            _ => None,
        };
        let mut ending = Ending {
            report: None,
            json: args.run.json,
            board: display.take_board(),
            diverged,
            interrupted: interrupted.then(|| format!("after epoch {} of {}", epochs.len(), plan.epochs)),
            failed,
            written: keeper.kept.is_some(),
            outcome,
            remedy: format!("try a lower --lr (this run used {})", plan.lr),
            plot_failed: crate::harness::plot::training_curves(
                args.run.plot.as_deref(),
                &summary.plot_title(args),
                &epochs.iter().map(epoch_row).collect::<Vec<_>>(),
                &display,
            ),
        };
        if args.run.json || args.run.tensorboard.is_some() {
            ending.report = Some(summary.report(args, ending.status(), &epochs, ending.diverged.clone(), &keeper));
        }
        if ending.written && ending.diverged.is_none() && !interrupted {
            let kept = format!("{}, kept by --keep {}", ending.outcome, args.keep.name());
            display.line(&format!("{kept}; unigram baseline {:.4}", summary.unigram));
            if let Some((_, loss)) = keeper.kept.filter(|&(_, loss)| loss >= summary.unigram) {
                display.line(&run::weaker_than_unigram(loss, summary.unigram, "token"));
            }
        }
        Ok(ending)
    }
}

/// The model already at `out`, which the run must not replace with a worse one: `None` when there is no
/// file, an empty one, or the `--resume`d file itself (judged by its own loss). Anything there that is
/// not a text model is refused rather than overwritten.
fn existing_out(out: &Path, resume: Option<&Path>) -> Result<Option<TextModel>> {
    let Ok(meta) = std::fs::metadata(out) else { return Ok(None) };
    if meta.len() == 0 || resume.is_some_and(|r| crate::io::fsutil::same_file(r, out)) {
        return Ok(None);
    }
    TextModel::load(out).map(Some).map_err(|e| {
        anyhow!(
            "--out {} exists and is not a textnet text model, so it is not replaced (remove it or choose another \
             --out): {e:#}",
            out.display()
        )
    })
}

/// The most of a corpus's tokens that may lie outside a resumed model's vocabulary: beyond it, training
/// would mostly teach the model to predict `<unk>`, and a validation set of `<unk>`s would call that
/// better.
const MAX_UNKNOWN_TO_RESUME: f64 = 0.5;

fn check_resumable(corpus: &Corpus, model: &Path, corpus_path: &Path) -> Result<()> {
    let unknown = corpus.unknown as f64 / corpus.tokens.len().max(1) as f64;
    if unknown > MAX_UNKNOWN_TO_RESUME {
        bail!(
            "--resume {}: {:.1}% of the tokens of {} are not in the model's vocabulary (they read as <unk>), so training \
             would teach it to predict <unk>; train a new model on this corpus instead (without --resume)",
            model.display(),
            100.0 * unknown,
            crate::io::fsutil::shown(corpus_path)
        );
    }
    Ok(())
}

fn mean_loss(sums: super::model::EvalSums) -> f64 {
    sums.loss / sums.samples.max(1) as f64
}

/// Validation loss of `params` on the run's device, or on the CPU where that device cannot take the shape.
fn val_loss(backend: &Backend, params: TextParams, tokens: &Arc<[u32]>, val: &[u32]) -> Result<f64> {
    // A batched CPU trainer evaluates on every core.
    let sums = match train::make_trainer(
        backend,
        params.clone(),
        tokens.clone(),
        CPU_BATCH,
        OptimConfig::new(OptimKind::Sgd),
        Precision::Fp32,
    ) {
        Ok(mut trainer) => trainer.evaluate(val)?,
        Err(_) => CpuTrainer::new(params, tokens.clone()).evaluate(val)?,
    };
    Ok(mean_loss(sums))
}

/// What a run trains on and with: printed before training and repeated in the `--json` summary.
struct Summary {
    plan: Plan,
    /// The learning-rate schedule over the run's steps.
    schedule: LrSchedule,
    /// On the CPU: what it trains with and how long that should take.
    cpu_line: Option<String>,
    device: String,
    /// The report's device fields.
    device_fields: report::DeviceFields,
    tokens: usize,
    truncated: bool,
    unknown: usize,
    shape: TextShape,
    tokenizer: Tokenizer,
    train_samples: usize,
    val_samples: usize,
    val_evaluated: usize,
    /// Validation loss of the unigram baseline, on the same validation samples as the epochs.
    unigram: f64,
}

impl Summary {
    /// The validation loss of guessing, every token equally likely (ln V): an epoch no better learned
    /// nothing.
    fn guessing_loss(&self) -> f64 {
        (self.shape.vocab as f64).ln()
    }

    fn print(&self, args: &TrainArgs, display: &Display) {
        let (shape, plan) = (self.shape, self.plan);
        let limit_note = if self.truncated { " (cut at --max-tokens)" } else { "" };
        display.line(&format!(
            "corpus: {}, {} tokens{limit_note}; vocabulary {} entries, {:.2}% of tokens are <unk>",
            args.corpus.display(),
            report::count(self.tokens),
            report::count(shape.vocab),
            100.0 * self.unknown as f64 / self.tokens as f64
        ));
        display.line(&format!(
            "samples: {} training, {} validation ({} evaluated each epoch, --val-max {})",
            report::count(self.train_samples),
            report::count(self.val_samples),
            report::count(self.val_evaluated),
            args.val_max
        ));
        let schedule = match self.schedule.describe() {
            s if s.is_empty() => String::new(),
            s => format!(", {s}"),
        };
        display.line(&format!(
            "model: context {}, embed {}, hidden {}: {} parameters; {}{schedule}, batch {}, {} epoch{}",
            shape.context,
            shape.embed,
            shape.hidden,
            report::count(parameter_count(shape)),
            args.optim_config(plan.lr).describe(),
            plan.batch,
            plan.epochs,
            if plan.epochs == 1 { "" } else { "s" }
        ));
        if args.precision == Precision::Bf16 {
            display.line(match (args.optim, self.cpu_line.is_some()) {
                (OptimKind::Sgd, true) => {
                    "precision: bf16 products with fp32 sums (the CPU twin of the GPU's bf16 step)"
                }
                (_, true) => "note: --precision bf16 on the CPU takes --optim sgd; this run trains in fp32",
                _ => "precision: bf16 products on the tensor cores, fp32 sums, weights, softmax and updates",
            });
            if self.cpu_line.is_none() && plan.batch < super::gpu::TILED_MIN_BATCH {
                display.line(&format!(
                    "note: --precision bf16 takes every step through the batched kernels, which at --batch {} are \
                     slower than fp32's kernels for small batches; it pays from --batch 64",
                    plan.batch
                ));
            }
        }
        if let Some(path) = &args.resume {
            display.line(&format!("resuming: {} (its vocabulary, tokenizer and shape)", path.display()));
        }
        display.line(&format!("device: {}", self.device));
        if let Some(line) = &self.cpu_line {
            display.line(line);
        }
        display.line(&format!("unigram baseline: val loss {:.4} (perplexity {:.1})", self.unigram, self.unigram.exp()));
        if args.optim == OptimKind::Adam && plan.lr == DEFAULT_LR {
            display.line(&format!(
                "note: --lr {DEFAULT_LR} is the SGD default; Adam usually wants about 1e-3 (--lr 0.001)"
            ));
        }
        if let Some(note) = batch_lr_note(plan).filter(|_| args.optim == OptimKind::Sgd) {
            display.line(&note);
        }
    }

    /// The title of the `--plot` picture.
    fn plot_title(&self, args: &TrainArgs) -> String {
        let (shape, plan) = (self.shape, self.plan);
        format!(
            "textnet train on {}: context {}, embed {}, hidden {}; {}, batch {}",
            crate::io::fsutil::shown(&args.corpus),
            shape.context,
            shape.embed,
            shape.hidden,
            args.optim_config(plan.lr).describe(),
            plan.batch
        )
    }

    fn report(
        &self,
        args: &TrainArgs,
        status: Status,
        epochs: &[EpochMetrics],
        diverged: Option<report::Divergence>,
        keeper: &Keeper,
    ) -> Report {
        let epochs: Vec<EpochRow> = epochs.iter().map(epoch_row).collect();
        Report {
            textnet: report::VERSION,
            command: "train",
            status,
            config: args.config_json(self.shape, self.tokenizer, &self.plan),
            device: self.device_fields.clone(),
            data: json!({
                "tokens": self.tokens,
                "tokens_truncated": self.truncated,
                "unknown_tokens": self.unknown,
                "vocab_size": self.shape.vocab,
                "train_samples": self.train_samples,
                "val_samples": self.val_samples,
                "val_evaluated": self.val_evaluated,
                "unigram_val_loss": self.unigram,
            }),
            parameters: parameter_count(self.shape),
            final_metrics: report::final_metrics(&epochs, keeper.kept_epoch(), Default::default()),
            epochs,
            model: args.run.out.display().to_string(),
            kept_epoch: keeper.kept_epoch(),
            baseline_val_loss: keeper.baseline,
            diverged,
        }
    }
}

/// Refuses shapes whose tensors could not be allocated, before trying to (an allocation failure aborts).
fn check_size(s: TextShape) -> Result<()> {
    const MAX_ENTRIES: usize = u32::MAX as usize;
    for (name, rows, cols) in [("embedding", s.vocab, s.embed), ("w1", s.hidden, s.embed), ("w2", s.vocab, s.hidden)] {
        if rows.checked_mul(cols).is_none_or(|n| n > MAX_ENTRIES) {
            bail!(
                "the model is too large: {name} would have {rows}×{cols} entries (at most {MAX_ENTRIES}); lower \
                 --embed, --hidden or --max-vocab"
            );
        }
    }
    Ok(())
}

/// The single-sample default learning rate.
const DEFAULT_LR: f32 = 0.02;
/// The default number of epochs on a GPU.
const DEFAULT_EPOCHS: usize = 5;

/// The CPU's defaults. Single-sample SGD runs at about 600 samples a second there (over two hours for
/// the corpus's five epochs on 2 cores); SGD steps of 256 samples at 256 × 0.01 run on every core at thousands
/// a second and follow the single-sample run's validation loss epoch for epoch, so three epochs reach
/// about the loss the GPU's five do (BENCHMARKS.md, "CPU fallback").
const CPU_BATCH: usize = 256;
/// The CPU's SGD learning rate per sample of a batch: 2.56 for its batch of 256.
const CPU_LR_PER_SAMPLE: f32 = 0.01;
const CPU_EPOCHS: usize = 3;

/// What a run trains with: the flags, with the defaults of its device filled in.
#[derive(Clone, Copy, Debug)]
struct Plan {
    lr: f32,
    batch: usize,
    epochs: usize,
    /// The CPU's own batch and learning rate (neither --batch nor --lr given on the CPU).
    cpu_default: bool,
    /// The learning rate is the CPU's rule for the batch (SGD batches on the CPU without --lr).
    cpu_rule: bool,
}

/// Says what a CPU run trains with and how long it should take, from a few steps timed on a copy of
/// the trainer (about a third of a second).
fn cpu_plan_line(
    plan: &Plan,
    args: &TrainArgs,
    params: &TextParams,
    tokens: &Arc<[u32]>,
    train: &[u32],
    val: &[u32],
) -> Result<String> {
    let optim = args.optim_config(plan.lr);
    let mut probe =
        train::make_trainer(&Backend::Cpu, params.clone(), tokens.clone(), plan.batch, optim, args.precision)?;
    let budget = std::time::Duration::from_millis(250);
    let speed = cpu_batch::measure(probe.as_mut(), train, val, plan.batch, plan.lr, budget)?;
    drop(probe);
    let about = report::duration(speed.estimate_s(plan.epochs, train.len(), val.len()));
    let rate = speed.train_samples_per_s.round();
    let epochs = format!("{} epoch{}", plan.epochs, if plan.epochs == 1 { "" } else { "s" });
    let threads = rayon::current_num_threads();
    let threads = format!("{threads} thread{}", if threads == 1 { "" } else { "s" });
    let how = match (plan.cpu_default, plan.batch > 1) {
        _ if optim.kind != crate::ops::optim::OptimKind::Sgd => {
            format!("batch {} and {} on the reference (one thread), {epochs}", plan.batch, optim.describe())
        }
        (true, _) => format!(
            "batch {} and SGD lr {} (the CPU's defaults: single samples at lr {DEFAULT_LR}, as on a GPU, would take \
             hours here), {epochs} on {threads}",
            plan.batch, plan.lr
        ),
        (false, true) if plan.cpu_rule => format!(
            "batch {} and SGD lr {} (the CPU's rule: {CPU_LR_PER_SAMPLE} × the batch), {epochs} on {threads}",
            plan.batch, plan.lr
        ),
        (false, true) => format!("batch {} and SGD lr {}, {epochs} on {threads}", plan.batch, plan.lr),
        (false, false) => format!("single-sample SGD lr {} on the reference (one thread), {epochs}", plan.lr),
    };
    let why = match plan.batch > 1 {
        true => String::new(),
        false => format!("; without --batch and --lr the CPU trains batches of {CPU_BATCH}, far faster"),
    };
    Ok(format!("cpu: training with {how}: about {about} (measured {rate} samples/s){why}"))
}

/// A note for a batch run at the single-sample learning rate: each step averages `batch` samples'
/// gradients, so at the same lr an epoch moves the parameters about `batch` times less (`--batch 64` at
/// 0.02 ended worse than the unigram baseline on the corpus). On a 300,000-token slice (embed 32,
/// hidden 64, one epoch) batch 64 reached val loss 5.28 at lr 0.02, 5.19 at 0.16 and 5.11 at 1.28, where
/// single samples at 0.02 reached 5.10.
fn batch_lr_note(plan: Plan) -> Option<String> {
    let batch = plan.batch;
    (batch > 1 && plan.lr == DEFAULT_LR).then(|| {
        format!(
            "note: --batch {batch} averages {batch} samples' gradients per step, so at the single-sample --lr {DEFAULT_LR} an \
             epoch moves the model about {batch} times less; try --lr {} ({DEFAULT_LR} × {batch})",
            crate::harness::report::decimal(DEFAULT_LR * batch as f32)
        )
    })
}

fn parameter_count(s: TextShape) -> usize {
    s.vocab * s.embed + s.hidden * s.embed + s.hidden + s.vocab * s.hidden + s.vocab
}
