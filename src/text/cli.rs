//! `textnet train` and `textnet predict`: argument checks and what they print (through `report`, as
//! every training command does). The work itself is in `corpus`, `train`, `modelfile` and `predict`.
//! Errors are returned and printed by `main` as one line.

use super::args::{CPU_BATCH, CPU_LR_PER_SAMPLE, DEFAULT_LR, Plan, TrainArgs};
use super::corpus::{Corpus, CorpusOptions, Split};
use super::cpu_batch;
use super::ending::Summary;
use super::epochs::{EpochBar, Saver, epoch_row};
use super::model::{TextParams, TextShape};
use super::modelfile::TextModel;
use super::tokenizer::Tokenizer;
use super::train::{self, TrainOptions, TrainRun};
use super::{CpuTrainer, TextTrainer};
use crate::device::precision::Precision;
use crate::device::{self, Backend};
use crate::harness::args::RunArgs;
use crate::harness::checkpoint::{self, Keeper};
use crate::harness::report::{self, Display};
use crate::harness::run::{self, Ending, TrainingCommand};
use crate::ops::optim::{OptimConfig, OptimKind};
use anyhow::{Context, Result, anyhow, bail};
use std::path::Path;
use std::sync::Arc;

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
        let lock = lock_out(args)?;
        let resumed = args.resume.as_deref().map(|path| TextModel::load(path).context("--resume")).transpose()?;
        let existing = existing_out(&args.run.out, args.resume.as_deref())?.filter(|_| !args.run.overwrite);
        let (mut corpus, shape, tokenizer) = read_corpus(args, resumed.as_ref())?;
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
        let params = resumed.map_or_else(|| TextParams::init(shape, args.run.seed), |model| model.params);
        let tokens: Arc<[u32]> = std::mem::take(&mut corpus.tokens).into();
        let cpu_line = on_cpu.then(|| cpu_plan_line(&plan, args, &params, &tokens, &split.train, &val)).transpose()?;
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
        summary.print(args, &display);
        let model = TextModel { params, tokenizer, vocab: corpus.vocab };
        let baseline = out_baseline(&args.run, existing, &model, &backend, &tokens, &val, &display)?;
        let optim = args.optim_config(plan.lr);
        let mut trainer =
            train::make_trainer(&backend, model.params.clone(), tokens, plan.batch, optim, args.precision)?;
        let baseline = match &args.resume {
            Some(path) => {
                let loss = resumed_loss(path, trainer.as_mut(), &val, &display)?;
                Some(baseline.map_or(loss, |b: f64| b.min(loss)))
            }
            None => baseline,
        };
        Ok(Prepared { _lock: lock, summary, display, trainer, train: split.train, val, baseline, model })
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

/// Locks --out and checks --plot against the files the run reads.
fn lock_out(args: &TrainArgs) -> Result<crate::io::fsutil::OutputLock> {
    let lock = crate::io::fsutil::check_output(&args.run.out, &[("corpus", &args.corpus)])?;
    let mut inputs = vec![("corpus", args.corpus.as_path())];
    inputs.extend(args.resume.as_deref().map(|m| ("--resume model", m)));
    crate::harness::plot::check(args.run.plot.as_deref(), Some(&args.run.out), &inputs)?;
    Ok(lock)
}

/// The corpus as the model reads it (the --resume model's tokenizer and vocabulary, else the flags'), the
/// model's shape and the tokenizer.
fn read_corpus(args: &TrainArgs, resumed: Option<&TextModel>) -> Result<(Corpus, TextShape, Tokenizer)> {
    let tokenizer = resumed.map_or(Tokenizer { lowercase: !args.keep_case }, |m| m.tokenizer);
    let max_vocab = if resumed.is_some() { usize::MAX } else { args.max_vocab };
    let mut corpus = Corpus::read(&args.corpus, CorpusOptions { tokenizer, max_vocab, max_tokens: args.max_tokens })?;
    if let (Some(model), Some(path)) = (resumed, &args.resume) {
        corpus = corpus.in_vocabulary(&model.vocab);
        check_resumable(&corpus, path, &args.corpus)?;
    }
    let shape = match resumed {
        Some(model) => model.params.shape,
        None => TextShape { vocab: corpus.vocab.len(), embed: args.embed, hidden: args.hidden, context: args.context },
    };
    Ok((corpus, shape, tokenizer))
}

/// The validation loss of the model already at --out (`existing`), which only a better epoch replaces; a
/// model of another vocabulary, tokenizer or context than `model`'s is refused.
fn out_baseline(
    run: &RunArgs,
    existing: Option<TextModel>,
    model: &TextModel,
    backend: &Backend,
    tokens: &Arc<[u32]>,
    val: &[u32],
    display: &Display,
) -> Result<Option<f64>> {
    let Some(old) = existing else {
        if run.overwrite && run.out.exists() {
            display
                .line(&format!("--overwrite: the first saved epoch replaces the model at --out {}", run.out.display()));
        }
        return Ok(None);
    };
    let (vocab, tokenizer, context) = (&model.vocab, model.tokenizer, model.params.shape.context);
    if !(old.vocab == *vocab && old.tokenizer == tokenizer && old.params.shape.context == context) {
        return Err(checkpoint::other_data(&run.out, "a text model of another vocabulary, tokenizer or context"));
    }
    let loss = checkpoint::baseline(&run.out, val_loss(backend, old.params, tokens, val)?, "val loss")?;
    display.line(&format!(
        "--out {} already holds a model of val loss {loss:.4} here; only a better epoch replaces it",
        run.out.display()
    ));
    Ok(Some(loss))
}

/// The validation loss of the --resume model at `path`, which a saved epoch must beat; an error where its
/// outputs are not finite.
fn resumed_loss(path: &Path, trainer: &mut dyn TextTrainer, val: &[u32], display: &Display) -> Result<f64> {
    let loss = mean_loss(trainer.evaluate(val)?);
    if !loss.is_finite() {
        bail!(
            "--resume {}: the model's outputs on this corpus are not finite (val loss {loss}), so it cannot be trained \
             further; train a new model instead",
            path.display()
        );
    }
    display.line(&format!("{} has val loss {loss:.4} here; only a better epoch is saved", path.display()));
    Ok(loss)
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
