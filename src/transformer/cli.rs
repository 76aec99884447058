//! `textnet transformer CORPUS`: trains the character-level Transformer (AdamW, random windows of the
//! corpus's first 90 %), reports the train and validation loss every --eval-every steps and writes the
//! model file. Progress is counted in steps, as nanoGPT counts them: one bar for the run with tokens/s
//! and ms/step, and a line per evaluation. In the `--json` report an "epoch" is the --eval-every steps
//! between two evaluations, and each row also gives its last step.
//!
//! nanoGPT's Shakespeare recipe maps onto the flags: --dropout 0.2, --lr-schedule cosine --warmup 100
//! --min-lr 1e-4, --beta2 0.99, --clip-norm 1 (alias --grad-clip), --eval-iters 200.

use super::args::TransformerArgs;
use super::data::{self, Corpus};
use super::gpu::GpuTransformer;
use super::gpu::parallel::Replicas;
use super::model::{self, Config, CpuTrainer};
use super::modelfile::TransformerModel;
use super::steps::{Progress, Setup, Trainer};
use crate::device::parallel::{Opened, Plan};
use crate::device::precision::Precision;
use crate::device::{self, Backend};
use crate::harness::checkpoint;
use crate::harness::report::{self, Display};
use crate::harness::run::{self, Ending, TrainingCommand};
use crate::io::fsutil;
use crate::io::resources;
use crate::ops::optim::{LrSchedule, OptimConfig};
use anyhow::{Context, Result, anyhow, bail};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Runs `textnet transformer`.
pub fn run(args: TransformerArgs) -> Result<()> {
    run::run(&args)
}

/// What `train` hands to `finish`.
pub struct Trained {
    pub(super) setup: Setup,
    pub(super) progress: Progress,
    pub(super) seconds: f64,
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
        let (lock, existing) = lock_out(args, writes)?;
        let resumed =
            args.resume.as_deref().map(|path| TransformerModel::load(path).context("--resume")).transpose()?;
        let steps_before = resumed.as_ref().map_or(0, |m| m.steps);
        let (corpus, config, params) = corpus_and_model(args, shape, resumed)?;
        check_fits(args, &config, &corpus, existing.as_ref())?;
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
        display.line(&args.model_line(&config, &corpus, params.len(), &schedule, &device_line));
        let val_offsets = args.val_offsets(&corpus, config.block);
        let baseline = baseline(args, existing.as_ref(), &backend, optim, &corpus, &val_offsets, &display)?;
        let trainer = trainer(args, &plan, &opened, config, &params, optim, &corpus)?;
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
        let Trained { mut setup, progress, seconds } = trained;
        let so_far = progress.outcome_so_far(&args.run.out);
        let Progress { rows, diverged, done, best_val, kept } = progress;
        if let Some(watch) = setup.watch.take() {
            watch.finish();
        }
        let interrupted = diverged.is_none() && done < args.steps;
        let guessing = (setup.config.vocab as f64).ln();
        let written = kept.is_some();
        if let Some(kept) = kept {
            args.say_kept(&setup, kept, seconds);
        }
        let figure = kept.map_or(best_val, |k| k.val_loss);
        let outcome = run::write_once_outcome(
            &args.run.out,
            written,
            (written || diverged.is_none()).then(|| format!("validation loss {figure:.4}")),
            setup.baseline.map(|b| format!("{b:.4}")),
        );
        let failed = (diverged.is_none() && !interrupted && best_val >= guessing).then(|| {
            run::not_learned(
                &format!(
                    "its best val loss {best_val:.4} is no better than guessing (ln {} = {guessing:.4})",
                    setup.config.vocab
                ),
                &outcome,
                &format!("try more --steps or another --lr (this run used {})", args.lr),
            )
        });
        let plot = args.run.plot.as_deref().filter(|_| setup.writes);
        let mut ending = Ending {
            report: None,
            json: args.run.json,
            board: setup.display.take_board(),
            diverged,
            interrupted: interrupted.then(|| format!("at step {done} of {}", args.steps)),
            failed,
            written,
            outcome: if interrupted && written { so_far } else { outcome },
            remedy: args.remedy(),
            plot_failed: crate::harness::plot::training_curves(
                plot,
                &args.plot_title(&setup.config),
                &rows,
                &setup.display,
            ),
        };
        // Ranks other than 0 of a multi-process run print no report (rank 0's is the run's).
        if (args.run.json || args.run.tensorboard.is_some()) && setup.writes {
            let mut report = args.report(&setup, ending.status(), rows, kept, seconds);
            report.diverged = ending.diverged.clone();
            ending.report = Some(report);
        }
        Ok(ending)
    }
}

/// Locks --out and checks --plot (on the rank that writes them), and reads the model already at --out,
/// none with --overwrite.
fn lock_out(args: &TransformerArgs, writes: bool) -> Result<(Option<fsutil::OutputLock>, Option<TransformerModel>)> {
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
    Ok((lock, existing))
}

/// The corpus, the model's configuration and its parameters: the --resume model's, whose vocabulary reads
/// the corpus, else a new model of `shape` over the corpus's vocabulary.
fn corpus_and_model(
    args: &TransformerArgs,
    shape: Config,
    resumed: Option<TransformerModel>,
) -> Result<(Corpus, Config, Vec<f32>)> {
    Ok(match resumed {
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
            (corpus, config, model::init_with(&config, args.run.seed, args.init))
        }
    })
}

/// Refuses a model too large for host memory, and a model at --out (`existing`) of another vocabulary or
/// block than this run's.
fn check_fits(
    args: &TransformerArgs,
    config: &Config,
    corpus: &Corpus,
    existing: Option<&TransformerModel>,
) -> Result<()> {
    args.memory_need(config).check(resources::available_memory())?;
    if let Some(old) = existing
        && (old.vocab != corpus.vocab || old.config.block != config.block)
    {
        return Err(checkpoint::other_data(&args.run.out, "a Transformer of another vocabulary or block"));
    }
    Ok(())
}

/// The validation loss of the model already at --out on this run's validation windows (its stored
/// val_loss was measured on whatever corpus it was trained on), which a written model must match.
fn baseline(
    args: &TransformerArgs,
    existing: Option<&TransformerModel>,
    backend: &Backend,
    optim: OptimConfig,
    corpus: &Corpus,
    val_offsets: &[u32],
    display: &Display,
) -> Result<Option<f64>> {
    Ok(match existing {
        Some(old) => {
            let loss = match backend {
                Backend::Cpu => model::mean_loss(&old.config, &old.params, &corpus.val, val_offsets),
                Backend::Cuda(gpu) => GpuTransformer::new(gpu.clone(), old.config, &old.params, optim, corpus)?
                    .val_loss(val_offsets, args.batch)?,
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
    })
}

/// The trainer of the run's plan: the CPU reference, one GPU, or data-parallel replicas on the `opened`
/// devices, each with the model's dropout and precision.
fn trainer(
    args: &TransformerArgs,
    plan: &Plan,
    opened: &Opened,
    config: Config,
    params: &[f32],
    optim: OptimConfig,
    corpus: &Corpus,
) -> Result<Trainer> {
    let replica = |gpu: Arc<device::Gpu>, rank: usize| -> Result<GpuTransformer> {
        let mut t = GpuTransformer::new(gpu, config, params, optim, corpus)?;
        t.set_dropout(args.dropout, args.dropout_seed(rank));
        t.set_grad_accum(args.grad_accum)?;
        if args.zero {
            t.set_zero(rank, opened.world_size)?;
        }
        t.set_precision(args.precision)?;
        Ok(t)
    };
    Ok(match (plan, &opened.backend) {
        (_, Backend::Cpu) => Trainer::Cpu(Box::new(
            CpuTrainer::new(config, params.to_vec(), optim)?.with_dropout(args.dropout, args.dropout_seed(0)),
        )),
        (Plan::One, Backend::Cuda(gpu)) => Trainer::Gpu(Box::new(replica(gpu.clone(), 0)?)),
        (Plan::Local(_) | Plan::Rank { .. }, _) => Trainer::Parallel(Box::new(Replicas::new(opened, replica)?)),
    })
}

impl TransformerArgs {
    /// The line that says what the run trains and how.
    fn model_line(
        &self,
        config: &Config,
        corpus: &Corpus,
        parameters: usize,
        schedule: &LrSchedule,
        device_line: &str,
    ) -> String {
        let args = self;
        format!(
            "model: {} layers, {} heads, embed {}, block {}{}{}, vocabulary {} ({} characters of {} read as unknown); \
             {} parameters; AdamW lr {}{} weight decay {} β2 {}{}{}, batch {} × {}{}, {} steps, seed {}; device {device_line}",
            config.layers,
            config.heads,
            config.embed,
            config.block,
            if config.bias { "" } else { ", no biases" },
            if config.tie_weights { ", head tied to the token embedding" } else { "" },
            config.vocab,
            report::count(corpus.unknown),
            report::count(corpus.train.len() + corpus.val.len()),
            report::count(parameters),
            args.lr,
            Some(schedule.describe()).filter(|d| !d.is_empty()).map_or(String::new(), |d| format!(" ({d})")),
            args.weight_decay,
            args.beta2,
            if args.clip_norm > 0.0 { format!(", clip-norm {}", args.clip_norm) } else { String::new() },
            if args.dropout > 0.0 { format!(", dropout {}", args.dropout) } else { String::new() },
            args.batch,
            config.block,
            if args.grad_accum > 1 { format!(" × {} micro-batches a step", args.grad_accum) } else { String::new() },
            args.steps,
            args.run.seed,
        )
    }

    /// The validation windows every evaluation measures: --eval-iters batches drawn from --seed, else
    /// evenly spaced windows across the whole validation part.
    fn val_offsets(&self, corpus: &Corpus, block: usize) -> Vec<u32> {
        let args = self;
        match args.eval_iters {
            Some(n) => data::sampled_val_offsets(corpus.val.len(), block, n.saturating_mul(args.batch), args.run.seed),
            None => data::val_offsets(corpus.val.len(), block),
        }
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
