//! `textnet train` and `textnet predict`: argument checks, the human and `--json` output, and the
//! progress bar. The work itself is in `corpus`, `train`, `modelfile` and `predict`.
//!
//! Output: human lines go to stdout, or to stderr with `--json`, whose single JSON object then owns
//! stdout. `--quiet` drops the progress bar and the informational lines. Errors are returned and printed
//! by `main` as one line.

use super::corpus::{Corpus, CorpusOptions, Split};
use super::model::{TextParams, TextShape};
use super::modelfile::TextModel;
use super::predict::{Prediction, predict as predict_next, quoted};
use super::tokenizer::Tokenizer;
use super::train::{self, Divergence, EpochMetrics, Progress, TrainOptions, TrainRun};
use super::vocab::{UNK_ID, Vocab};
use super::{CpuTrainer, TextTrainer};
use crate::checkpoint::{Keep, Keeper};
use crate::console;
use crate::device::{self, Backend, DeviceChoice};
use crate::interrupt::{self, Interrupted};
use anyhow::{Context, Result, anyhow, bail};
use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// UTF-8 text file to train on (other encodings are rejected, naming the first invalid byte)
    pub corpus: PathBuf,
    /// Where to write the model (.safetensors); it is written after every epoch that --keep keeps
    #[arg(long, default_value = "textnet.safetensors")]
    pub out: PathBuf,
    /// Which epoch the model file holds: the one of lowest validation loss, or the last
    #[arg(long, value_enum, default_value_t = Keep::Best)]
    pub keep: Keep,
    /// Go on training this model file on CORPUS, with its vocabulary, tokenizer and shape (which is why
    /// --max-vocab, --context, --embed, --hidden and --keep-case cannot be given with it)
    #[arg(long, value_name = "MODEL", conflicts_with_all = ["max_vocab", "context", "embed", "hidden", "keep_case"])]
    pub resume: Option<PathBuf>,
    /// Vocabulary size cap, <unk> included; rarer tokens become <unk>
    #[arg(long, default_value_t = 8192)]
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
    /// SGD learning rate (0.01-0.02 did best on the Shakespeare corpus at the default size; 0.1 is worse)
    #[arg(long, default_value_t = 0.02, allow_negative_numbers = true)]
    pub lr: f32,
    /// Passes over the training samples
    #[arg(long, default_value_t = 5)]
    pub epochs: usize,
    /// Samples per SGD step
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Seed of the initial parameters and of the shuffle
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
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
    /// Use only the first N tokens of the corpus (the vocabulary is built from them too). The CPU trains
    /// only about 600 samples per second at the default size, so give it a slice, e.g. 100000
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Validate on at most N samples, spread evenly over the held-out last 10% (0 = all of them)
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    pub val_max: usize,
    /// Where to train
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceChoice,
    /// No progress bar and no informational lines
    #[arg(long)]
    pub quiet: bool,
    /// Print one JSON object with the configuration and every epoch's metrics on stdout at the end
    #[arg(long)]
    pub json: bool,
}

impl TrainArgs {
    fn validate(&self) -> Result<()> {
        for (flag, value, least) in [
            ("--max-vocab", self.max_vocab, 2),
            ("--context", self.context, 1),
            ("--embed", self.embed, 1),
            ("--hidden", self.hidden, 1),
            ("--batch", self.batch, 1),
            ("--max-tokens", self.max_tokens.unwrap_or(1), 1),
        ] {
            if value < least {
                bail!("{flag} must be at least {least}, got {value}");
            }
        }
        crate::resources::check_epochs(self.epochs)?;
        if !(self.lr.is_finite() && self.lr > 0.0) {
            bail!("--lr must be a positive finite number, got {}", self.lr);
        }
        if self.out.is_dir() {
            bail!("--out {} is a directory; give a file name", self.out.display());
        }
        Ok(())
    }

    fn config_json(&self, shape: TextShape, tokenizer: Tokenizer) -> serde_json::Value {
        json!({
            "corpus": self.corpus.display().to_string(),
            "out": self.out.display().to_string(),
            "keep": self.keep.name(),
            "resume": self.resume.as_ref().map(|p| p.display().to_string()),
            "max_vocab": self.max_vocab,
            "context": shape.context,
            "embed": shape.embed,
            "hidden": shape.hidden,
            // Through its shortest decimal form, so 0.05 reads 0.05 and not 0.05000000074505806.
            "lr": self.lr.to_string().parse::<f64>().unwrap_or(f64::from(self.lr)),
            "epochs": self.epochs,
            "batch": self.batch,
            "seed": self.seed,
            "shuffle": !self.no_shuffle,
            "keep_case": !tokenizer.lowercase,
            "max_tokens": self.max_tokens,
            "val_max": self.val_max,
            "device": device_name(self.device),
        })
    }
}

fn device_name(choice: DeviceChoice) -> String {
    choice.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default()
}

/// Where human-readable lines go.
#[derive(Clone, Copy)]
struct Report {
    quiet: bool,
    to_stderr: bool,
}

impl Report {
    fn line(&self, text: &str) {
        if !self.quiet {
            console::line(self.to_stderr, text);
        }
    }

    /// Drawn on the stream the lines go to, so it disappears where they are redirected.
    fn bar_target(&self) -> ProgressDrawTarget {
        match (self.quiet, self.to_stderr) {
            (true, _) => ProgressDrawTarget::hidden(),
            (false, true) => ProgressDrawTarget::stderr(),
            (false, false) => ProgressDrawTarget::stdout(),
        }
    }
}

/// A progress bar per epoch, replaced by the epoch's summary line when it ends; and the save after
/// each epoch.
struct EpochBar {
    report: Report,
    epochs: usize,
    bar: Option<ProgressBar>,
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
        if self.keeper.offer(m.epoch, m.val_loss) {
            self.model.params = params.clone();
            self.model.save(&self.out)?;
            self.note = "saved".into();
        } else {
            self.note = match (self.keeper.kept, self.keeper.baseline) {
                (Some((epoch, _)), _) => format!("not saved (the file keeps epoch {epoch})"),
                (None, Some(baseline)) => format!("not saved (the starting model's val loss is {baseline:.4})"),
                (None, None) => "not saved".into(),
            };
        }
        Ok(())
    }
}

impl Progress for EpochBar {
    fn epoch_started(&mut self, epoch: usize, samples: usize) {
        let style = ProgressStyle::with_template(
            "epoch {prefix} [{bar:30}] {human_pos}/{human_len} samples, {per_sec:0}, ETA {eta}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        let bar = ProgressBar::with_draw_target(Some(samples as u64), self.report.bar_target())
            .with_style(style)
            .with_prefix(format!("{epoch}/{}", self.epochs));
        self.bar = Some(bar);
    }

    fn advanced(&mut self, samples: usize) {
        if let Some(bar) = &self.bar {
            bar.inc(samples as u64);
        }
    }

    fn epoch_completed(&mut self, m: &EpochMetrics, params: &TextParams) -> Result<bool> {
        self.saver.offer(m, params)?;
        Ok(!interrupt::requested())
    }

    fn epoch_finished(&mut self, m: &EpochMetrics) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        self.report.line(&format!(
            "epoch {}/{}: train loss {:.4}, val loss {:.4} (perplexity {:.1}), top-1 {:.1}%, top-5 {:.1}%, {:.0} samples/s, {} elapsed; {}",
            m.epoch,
            self.epochs,
            m.train_loss,
            m.val_loss,
            m.val_perplexity,
            m.top1_percent,
            m.top5_percent,
            m.samples_per_sec,
            duration(m.elapsed_secs),
            self.saver.note
        ));
    }
}

impl Drop for EpochBar {
    /// Clears a bar left mid-epoch by a divergence or an error.
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// `42.0s`, `3m05s`, `1h02m`.
fn duration(secs: f64) -> String {
    let whole = secs as u64;
    match whole {
        0..60 => format!("{secs:.1}s"),
        60..3600 => format!("{}m{:02}s", whole / 60, whole % 60),
        _ => format!("{}h{:02}m", whole / 3600, whole % 3600 / 60),
    }
}

pub fn train(args: TrainArgs) -> Result<()> {
    args.validate()?;
    crate::fsutil::check_output(&args.out, &[("corpus", &args.corpus)])?;
    let report = Report { quiet: args.quiet, to_stderr: args.json };
    let resumed = match &args.resume {
        Some(path) => Some(TextModel::load(path).context("--resume")?),
        None => None,
    };
    let existing = existing_out(&args.out, args.resume.as_deref())?;
    let tokenizer = resumed.as_ref().map_or(Tokenizer { lowercase: !args.keep_case }, |m| m.tokenizer);
    let max_vocab = if resumed.is_some() { usize::MAX } else { args.max_vocab };
    let mut corpus = Corpus::read(&args.corpus, CorpusOptions { tokenizer, max_vocab, max_tokens: args.max_tokens })?;
    if let Some(model) = &resumed {
        corpus = in_vocabulary(corpus, &model.vocab);
    }
    let shape = match &resumed {
        Some(model) => model.params.shape,
        None => TextShape { vocab: corpus.vocab.len(), embed: args.embed, hidden: args.hidden, context: args.context },
    };
    let split = Split::new(corpus.tokens.len(), shape.context)?;
    let val = train::spread_subset(&split.val, args.val_max);
    shape.validate()?;
    check_size(shape)?;

    let backend = device::select(args.device, args.quiet)?;
    let batch = args.batch.min(split.train.len());
    let on_cpu = matches!(backend, device::Backend::Cpu);
    shape.training_memory(batch, corpus.tokens.len(), on_cpu).check(crate::resources::available_memory())?;
    let setup = Setup {
        args: &args,
        device: backend.describe(),
        tokens: corpus.tokens.len(),
        truncated: corpus.truncated,
        unknown: corpus.unknown,
        shape,
        tokenizer,
        train_samples: split.train.len(),
        val_samples: split.val.len(),
        val_evaluated: val.len(),
        unigram: train::unigram_loss(&corpus.tokens, split.val_start, shape.vocab, &val),
    };
    let Corpus { vocab, tokens, .. } = corpus;
    let tokens: Arc<[u32]> = tokens.into();
    setup.print(report);

    let mut baseline = None;
    if let Some(old) = existing {
        if old.vocab == vocab && old.tokenizer == tokenizer && old.params.shape.context == shape.context {
            let loss = val_loss(&backend, old.params, &tokens, &val)?;
            report.line(&format!(
                "--out {} already holds a model of val loss {loss:.4} here; only a better epoch replaces it",
                args.out.display()
            ));
            baseline = Some(loss);
        } else {
            report.line(&format!(
                "--out {} holds a model of another vocabulary or context; the first saved epoch replaces it",
                args.out.display()
            ));
        }
    }
    let params = match resumed {
        Some(model) => model.params,
        None => TextParams::init(shape, args.seed),
    };
    let mut trainer = train::make_trainer(&backend, params.clone(), tokens)?;
    if let Some(path) = &args.resume {
        let loss = mean_loss(trainer.evaluate(&val)?);
        report.line(&format!("{} has val loss {loss:.4} here; only a better epoch is saved", path.display()));
        baseline = Some(baseline.map_or(loss, |b: f64| b.min(loss)));
    }

    let options = TrainOptions {
        lr: args.lr,
        epochs: args.epochs,
        batch: args.batch,
        seed: args.seed,
        shuffle: !args.no_shuffle,
    };
    let saver = Saver {
        out: args.out.clone(),
        keeper: Keeper::new(args.keep, baseline),
        model: TextModel { params, tokenizer, vocab },
        note: String::new(),
    };
    let mut bar = EpochBar { report, epochs: args.epochs, bar: None, saver };
    interrupt::install();
    let run = train::train(trainer.as_mut(), &split.train, &val, &options, &mut bar);
    let keeper = bar.saver.keeper.clone();
    drop(bar);
    let outcome = keeper.outcome(&args.out, "val loss");
    let TrainRun { epochs, diverged, .. } = run.map_err(|e| anyhow!("{e:#}; {outcome}"))?;
    let interrupted = epochs.len() < args.epochs && diverged.is_none();
    let status = match (&diverged, interrupted, keeper.kept) {
        (Some(_), _, _) => "diverged",
        (None, true, _) => "interrupted",
        (None, false, None) => "not_better",
        (None, false, Some(_)) => "ok",
    };

    if args.json {
        console::out(&setup.json(status, &epochs, diverged.as_ref(), &keeper).to_string());
    }
    if let Some(d) = diverged {
        bail!(
            "training diverged in epoch {}: the {} became NaN or infinite; {outcome}; try a lower --lr (this run used {})",
            d.epoch,
            d.what,
            args.lr
        );
    }
    if interrupted {
        return Err(
            Interrupted(format!("interrupted after epoch {} of {}; {outcome}", epochs.len(), args.epochs)).into()
        );
    }
    if keeper.kept.is_none() {
        bail!("{outcome}");
    }
    report.line(&format!("{outcome}, kept by --keep {}; unigram baseline {:.4}", args.keep.name(), setup.unigram));
    Ok(())
}

/// The model already at `out`, which the run must not replace with a worse one: `None` when there is no
/// file, an empty one, or the `--resume`d file itself (judged by its own loss). Anything there that is
/// not a text model is refused rather than overwritten.
fn existing_out(out: &Path, resume: Option<&Path>) -> Result<Option<TextModel>> {
    let Ok(meta) = std::fs::metadata(out) else { return Ok(None) };
    if meta.len() == 0 || resume.is_some_and(|r| crate::fsutil::same_file(r, out)) {
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

/// `corpus` in the ids of `vocab` (a resumed model's), tokens outside it becoming `<unk>`.
fn in_vocabulary(corpus: Corpus, vocab: &Vocab) -> Corpus {
    let ids: Vec<u32> = corpus.vocab.tokens().iter().map(|t| vocab.id(t)).collect();
    let mut tokens = corpus.tokens;
    tokens.iter_mut().for_each(|t| *t = ids[*t as usize]);
    let unknown = tokens.iter().filter(|&&t| t == UNK_ID).count();
    Corpus { vocab: vocab.clone(), tokens, unknown, truncated: corpus.truncated }
}

fn mean_loss(sums: super::model::EvalSums) -> f64 {
    sums.loss / sums.samples.max(1) as f64
}

/// Validation loss of `params` on the run's device, or on the CPU where that device cannot take the shape.
fn val_loss(backend: &Backend, params: TextParams, tokens: &Arc<[u32]>, val: &[u32]) -> Result<f64> {
    let sums = match train::make_trainer(backend, params.clone(), tokens.clone()) {
        Ok(mut trainer) => trainer.evaluate(val)?,
        Err(_) => CpuTrainer { params, tokens: tokens.clone() }.evaluate(val)?,
    };
    Ok(mean_loss(sums))
}

/// What a run trains on and with: printed before training and repeated in the `--json` summary.
struct Setup<'a> {
    args: &'a TrainArgs,
    device: String,
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

impl Setup<'_> {
    fn print(&self, report: Report) {
        let (args, shape) = (self.args, self.shape);
        let limit_note = if self.truncated { " (cut at --max-tokens)" } else { "" };
        report.line(&format!(
            "corpus: {}, {} tokens{limit_note}; vocabulary {} entries, {:.2}% of tokens are <unk>",
            args.corpus.display(),
            self.tokens,
            shape.vocab,
            100.0 * self.unknown as f64 / self.tokens as f64
        ));
        report.line(&format!(
            "samples: {} training, {} validation ({} evaluated each epoch, --val-max {})",
            self.train_samples, self.val_samples, self.val_evaluated, args.val_max
        ));
        report.line(&format!(
            "model: context {}, embed {}, hidden {}: {} parameters; lr {}, batch {}, {} epochs",
            shape.context,
            shape.embed,
            shape.hidden,
            parameter_count(shape),
            args.lr,
            args.batch,
            args.epochs
        ));
        if let Some(path) = &args.resume {
            report.line(&format!("resuming: {} (its vocabulary, tokenizer and shape)", path.display()));
        }
        report.line(&format!("device: {}", self.device));
        report.line(&format!("unigram baseline: val loss {:.4} (perplexity {:.1})", self.unigram, self.unigram.exp()));
    }

    fn json(
        &self,
        status: &str,
        epochs: &[EpochMetrics],
        diverged: Option<&Divergence>,
        keeper: &Keeper,
    ) -> serde_json::Value {
        json!({
            "status": status,
            "config": self.args.config_json(self.shape, self.tokenizer),
            "device": self.device,
            "tokens": self.tokens,
            "tokens_truncated": self.truncated,
            "unknown_tokens": self.unknown,
            "vocab_size": self.shape.vocab,
            "parameters": parameter_count(self.shape),
            "samples": {
                "train": self.train_samples,
                "validation": self.val_samples,
                "validation_evaluated": self.val_evaluated,
            },
            "unigram_val_loss": self.unigram,
            "epochs": epochs,
            "diverged": diverged,
            "model": self.args.out.display().to_string(),
            "kept_epoch": keeper.kept_epoch(),
            "baseline_val_loss": keeper.baseline,
        })
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

fn parameter_count(s: TextShape) -> usize {
    s.vocab * s.embed + s.hidden * s.embed + s.hidden + s.vocab * s.hidden + s.vocab
}

#[derive(clap::Args, Debug)]
pub struct PredictArgs {
    /// The text to continue; its last N tokens are used (N = the model's context)
    #[arg(long, allow_hyphen_values = true)]
    pub context: String,
    /// How many candidates to print
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Model file written by `textnet train`
    #[arg(long, default_value = "textnet.safetensors")]
    pub model: PathBuf,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
    /// Accepted for symmetry with `train`; a prediction is one small forward pass and runs on the CPU
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceChoice,
}

pub fn predict(args: PredictArgs) -> Result<()> {
    if args.top == 0 {
        bail!("--top must be at least 1");
    }
    let model = TextModel::load(&args.model)?;
    let prediction = predict_next(&model, &args.context, args.top)?;
    if args.json {
        let mut value = serde_json::to_value(&prediction)?;
        value["model"] = json!(args.model.display().to_string());
        console::out(&value.to_string());
    } else {
        print_prediction(&prediction, &args.model);
    }
    Ok(())
}

fn print_prediction(p: &Prediction, model: &Path) {
    console::out(&format!("model: {}", model.display()));
    console::out(&format!("context: {}", quoted(&p.context)));
    if p.dropped > 0 {
        console::out(&format!(
            "note: the model reads the last {} tokens; {} earlier ones were left out",
            p.model_context, p.dropped
        ));
    }
    if p.context.len() < p.model_context {
        console::out(&format!(
            "note: the model was trained on {} context tokens; only {} given, using those",
            p.model_context,
            p.context.len()
        ));
    }
    if !p.unknown.is_empty() {
        console::out(&format!("unknown (read as <unk>): {}", quoted(&p.unknown)));
    }
    let width = p.top.iter().map(|c| c.token.chars().count()).max().unwrap_or(0);
    for (rank, c) in p.top.iter().enumerate() {
        console::out(&format!("{:>3}. {:<width$}  {:.4}", rank + 1, c.token, c.probability));
    }
}
