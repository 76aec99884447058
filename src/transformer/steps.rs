//! `textnet transformer`'s training loop beyond the harness: what `setup` built (`Setup`), the trainer on
//! its device (CPU, one GPU or data-parallel replicas), and the steps between evaluations with each
//! evaluation's line, report row and save.

use super::args::TransformerArgs;
use super::data::{self, Corpus};
use super::gpu::GpuTransformer;
use super::gpu::parallel::Replicas;
use super::model::{self, Config, CpuTrainer};
use super::modelfile::TransformerModel;
use crate::device::Backend;
use crate::harness::report::{self, Display, Divergence, EpochRow};
use crate::harness::run;
use crate::io::fsutil;
use crate::ops::cpu::SeededRng;
use anyhow::Result;
use rand::SeedableRng;
use std::path::Path;
use std::time::Instant;

/// A trainer on either device: steps over given batch offsets, and the validation loss.
pub(super) enum Trainer {
    Cpu(Box<CpuTrainer>),
    Gpu(Box<GpuTransformer>),
    /// Data-parallel replicas (--gpus, --world-size).
    Parallel(Box<Replicas>),
}

impl Trainer {
    /// The mean loss of each step over `offsets` (micro-batches of `batch`, as many a step as
    /// `--grad-accum` says, so rates.len() divides offsets.len()), step s at learning rate `rates[s]`;
    /// `stepped(n)` after each n steps done (every step on the CPU; on the GPU, whose steps run as one
    /// graph, once).
    pub(super) fn train(
        &mut self,
        corpus: &Corpus,
        offsets: &[u32],
        batch: usize,
        rates: &[f32],
        stepped: &mut dyn FnMut(usize),
    ) -> Result<Vec<f64>> {
        match self {
            Trainer::Cpu(t) => Ok(offsets
                .chunks(offsets.len() / rates.len().max(1))
                .zip(rates)
                .map(|(o, &rate)| {
                    t.optimizer.config.lr = rate;
                    let (tokens, targets) = data::windows(&corpus.train, o, t.config.block);
                    let loss = f64::from(t.accumulated_step(&tokens, &targets, batch, o.len() / batch));
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

    pub(super) fn val_loss(&mut self, corpus: &Corpus, offsets: &[u32], batch: usize) -> Result<f64> {
        match self {
            Trainer::Cpu(t) => Ok(model::mean_loss(&t.config, &t.params, &corpus.val, offsets)),
            Trainer::Gpu(t) => t.val_loss(offsets, batch),
            Trainer::Parallel(replicas) => replicas.val_loss(offsets, batch),
        }
    }

    pub(super) fn params(&mut self) -> Result<Vec<f32>> {
        match self {
            Trainer::Cpu(t) => Ok(t.params.clone()),
            Trainer::Gpu(t) => t.params(),
            Trainer::Parallel(replicas) => replicas.params(),
        }
    }
}

/// How far the evaluations got.
pub(super) struct Progress {
    pub(super) rows: Vec<EpochRow>,
    pub(super) diverged: Option<Divergence>,
    /// Steps done.
    pub(super) done: usize,
    /// The lowest validation loss of the run.
    pub(super) best_val: f64,
    /// What --out holds from this run: the evaluation, its step and its validation loss.
    pub(super) kept: Option<Kept>,
}

impl Progress {
    /// What --out holds when the run stops before its end (interrupted, or on an error): the best step
    /// written so far, or what a run that wrote nothing leaves there.
    pub(super) fn outcome_so_far(&self, out: &Path) -> String {
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
pub(super) struct Kept {
    pub(super) eval: usize,
    pub(super) step: usize,
    pub(super) val_loss: f64,
}

/// The evaluation intervals of a run, each written to --out when it beats the ones before; `progress` says
/// how far they got, also when one fails.
impl TransformerArgs {
    pub(super) fn evaluations(&self, setup: &mut Setup, progress: &mut Progress, start: Instant) -> Result<()> {
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
        let sequences = args.batch * args.grad_accum; // a step's
        display.steps_started(args.steps, sequences * config.block);
        for eval in 1..=evals {
            let before = progress.done;
            let steps = args.eval_every.min(args.steps - before);
            let offsets: Vec<u32> = (0..steps * args.grad_accum)
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
                samples_per_s: (done * sequences) as f64 / elapsed.max(1e-9),
                lr: Some(report::decimal(rates[done - 1])),
                elapsed_s: elapsed,
                extra: Default::default(),
            }
            .with("step", done)
            .with("tokens_per_s", (done * sequences * config.block) as f64 / elapsed.max(1e-9))
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

/// What `setup` read, checked and built.
pub struct Setup {
    pub(super) _lock: Option<fsutil::OutputLock>,
    /// The links to the other ranks of a multi-process run, watched until it ends.
    pub(super) watch: Option<crate::device::rendezvous::Watch>,
    /// Whether this process writes --out (every process but ranks other than 0).
    pub(super) writes: bool,
    pub(super) display: Display,
    pub(super) corpus: Corpus,
    pub(super) config: Config,
    pub(super) backend: Backend,
    pub(super) val_offsets: Vec<u32>,
    /// The validation loss of the Transformer already at --out on this run's windows.
    pub(super) baseline: Option<f64>,
    pub(super) trainer: Trainer,
    /// Evaluations in the run (one per --eval-every steps): the report's rows.
    pub(super) evals: usize,
    /// Steps the --resume'd model had taken.
    pub(super) steps_before: usize,
    /// The learning rate of each of this run's steps.
    pub(super) rates: Vec<f32>,
}
