//! `textnet xor`: train the XOR network by full-batch SGD on its four points, print the loss every
//! --log-every epochs and the truth table, and write the model as .safetensors. What it prints goes
//! through `report`, as for every training command.

use super::gpu::GpuXor;
use super::model::{self, INPUTS, MAX_HIDDEN, TARGETS, XorParams};
use super::modelfile;
use crate::device::{self, Backend};
use crate::harness::args::{RunArgs, ScheduleArgs, run_out};
use crate::harness::checkpoint;
use crate::harness::report::{self, Display, Divergence, EpochRow, Report, Status};
use crate::harness::run::{self, Ending, TrainingCommand};
use crate::io::fsutil;
use crate::io::resources::{self, MemoryNeed};
use crate::ops::activations::Activation;
use crate::ops::optim::LrSchedule;
use anyhow::{Result, bail};
use serde_json::json;
use std::path::Path;
use std::time::Instant;

#[derive(clap::Args, Debug)]
#[command(
    mut_arg("out", run_out(
        "xor.safetensors",
        "Where to write the model (.safetensors); an XOR model already there is replaced only by a better one \
(lower loss)"
    )),
    mut_arg("seed", |a| a.help("Seed of the initial parameters")),
    mut_arg("device", |a| a.help("Where to train (on the GPU the whole run is one kernel launch)"))
)]
/// The flags of `textnet xor`.
pub struct XorArgs {
    /// Hidden units (at most 1024 on the GPU)
    #[arg(long, default_value_t = 4)]
    pub hidden: usize,
    /// Hidden-layer activation
    #[arg(long, value_enum, default_value_t = Activation::Sigmoid)]
    pub activation: Activation,
    /// SGD learning rate (with sigmoid, 0.5 solved XOR for each of 20 seeds; from about 1.0 plain SGD on
    /// this MSE model is unstable)
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    pub lr: f32,
    #[command(flatten)]
    /// The learning-rate schedule (`--lr-schedule`, `--warmup`, `--min-lr`); a step is an epoch.
    pub schedule: ScheduleArgs,
    /// SGD steps, each on all four points
    #[arg(short = 'e', long, default_value_t = 5000)]
    pub epochs: usize,
    #[command(flatten)]
    /// The run flags (`--out`, `--seed`, `--device`, `--json`, ...).
    pub run: RunArgs,
    /// Print the loss every N epochs (also spelt --report-every)
    #[arg(long = "log-every", alias = "report-every", value_name = "N", default_value_t = 500)]
    pub report_every: usize,
}

/// The four points make one full batch.
const BATCH: usize = INPUTS.len();

/// The flags checked; returns the learning-rate schedule they ask for.
fn check_args(args: &XorArgs) -> Result<LrSchedule> {
    if args.hidden == 0 {
        bail!("--hidden must be at least 1, got 0");
    }
    if !(args.lr.is_finite() && args.lr > 0.0) {
        bail!("--lr must be a positive finite number, got {}", args.lr);
    }
    resources::check_epochs(args.epochs)?;
    if args.report_every == 0 {
        bail!("--log-every must be at least 1, got 0");
    }
    let schedule = args.schedule.schedule(args.lr)?;
    schedule.check(args.epochs)?;
    Ok(schedule)
}

fn parameter_count(hidden: usize) -> usize {
    4 * hidden + 1
}

/// Runs `textnet xor`.
pub fn run(args: XorArgs) -> Result<()> {
    run::run(&args)
}

/// What `setup` checked and prepared.
pub struct Setup {
    _lock: fsutil::OutputLock,
    display: Display,
    backend: Backend,
    schedule: LrSchedule,
    /// The loss of the XOR model already at --out, which a run must match to replace it.
    baseline: Option<f64>,
}

/// What `train` hands to `finish`: the trained parameters and the loss of every --log-every-th epoch.
pub struct Trained {
    setup: Setup,
    params: XorParams,
    losses: Vec<f32>,
    seconds: f64,
}

impl TrainingCommand for XorArgs {
    type Setup = Setup;
    type Trained = Trained;

    fn setup(&self) -> Result<Setup> {
        let args = self;
        let schedule = check_args(args)?;
        let lock = fsutil::check_output(&args.run.out, &[])?;
        crate::harness::plot::check(args.run.plot.as_deref(), Some(&args.run.out), &[])?;
        let existing = existing_out(&args.run.out)?.filter(|_| !args.run.overwrite);
        let display =
            Display::new(args.run.quiet, args.run.json, args.epochs).tensorboard(args.run.tensorboard.as_deref())?;
        let (backend, device_line) = device::select_described(args.run.device)?;
        if matches!(backend, Backend::Cuda(_)) && args.hidden > MAX_HIDDEN {
            bail!(
                "--hidden {} is more than the {MAX_HIDDEN} the GPU kernel takes; lower it or use --device cpu",
                args.hidden
            );
        }
        // Parameters, gradients, pre-activations and activations, and the copies made to write the file; a
        // learning rate per epoch.
        let bytes = (args.hidden as u64).saturating_mul(96);
        let rates = 4 * args.epochs as u64;
        MemoryNeed { parts: vec![("the model", bytes, "--hidden"), ("the learning rates", rates, "--epochs")] }
            .check(resources::available_memory())?;
        let schedule_text = match schedule.describe() {
            s if s.is_empty() => String::new(),
            s => format!(", {s}"),
        };
        display.line(&format!(
            "model 2 → {} ({}) → 1, {} parameters, mean squared error; SGD lr {} on all 4 points{schedule_text}, \
             {} epoch{}, seed {}; device {}",
            args.hidden,
            args.activation.name(),
            parameter_count(args.hidden),
            args.lr,
            args.epochs,
            if args.epochs == 1 { "" } else { "s" },
            args.run.seed,
            device_line
        ));
        let baseline = match existing {
            Some(old) => {
                let loss = checkpoint::baseline(&args.run.out, f64::from(model::loss_and_grads(&old).0), "loss")?;
                display.line(&format!(
                    "--out {} already holds an XOR model of loss {}; only one at least as good replaces it",
                    args.run.out.display(),
                    loss_text(loss as f32)
                ));
                Some(loss)
            }
            None => None,
        };
        Ok(Setup { _lock: lock, display, backend, schedule, baseline })
    }

    fn train(&self, setup: Setup) -> Result<Trained> {
        let args = self;
        let mut params = XorParams::init(args.hidden, args.activation, args.run.seed);
        let rates = setup.schedule.rates(args.lr, args.epochs);
        let (losses, seconds) = match &setup.backend {
            Backend::Cpu => {
                let start = Instant::now();
                let losses = model::train(&mut params, &rates, args.report_every);
                (losses, start.elapsed().as_secs_f64())
            }
            Backend::Cuda(gpu) => {
                let mut trainer = GpuXor::new(gpu.clone(), &params)?;
                let start = Instant::now();
                let losses = trainer.train(&rates, args.report_every)?;
                let seconds = start.elapsed().as_secs_f64();
                params = trainer.params()?;
                (losses, seconds)
            }
        };
        Ok(Trained { setup, params, losses, seconds })
    }

    fn finish(&self, trained: Trained) -> Result<Ending> {
        let args = self;
        let Trained { setup: Setup { mut display, backend, schedule, baseline, .. }, params, losses, seconds } =
            trained;
        let rates = schedule.rates(args.lr, args.epochs);
        let final_loss = model::loss_and_grads(&params).0;
        let predictions: [f32; 4] = std::array::from_fn(|k| model::predict(&params, INPUTS[k]));
        let (rows, mut diverged) = args.rows(&losses, &rates, seconds, &mut display);
        if diverged.is_none() && !(final_loss.is_finite() && params.all_finite()) {
            diverged = Some(Divergence { epoch: args.epochs, what: "parameters" });
        }
        let wrong = predictions.iter().zip(TARGETS).filter(|&(&y, t)| (y > 0.5) != (t > 0.5)).count();
        let learned = wrong == 0;
        let (written, outcome) = args.outcome(diverged.is_none() && learned, final_loss, baseline);
        if diverged.is_none() {
            args.say_final(final_loss, &predictions, wrong, &display);
        }
        if written {
            modelfile::save(&params, &args.run.out)
                .map_err(|e| anyhow::anyhow!("{e:#}; {}", run::write_once_outcome(&args.run.out, false, None, None)))?;
            display.line(&outcome);
        }
        let failed = (diverged.is_none() && !learned).then(|| {
            run::not_learned(
                &format!("{wrong} of 4 points are on the wrong side of 0.5 after {} epochs", args.epochs),
                &outcome,
                &format!("try more --epochs, another --seed or a lower --lr (this run used {})", args.lr),
            )
        });
        let mut ending = Ending {
            report: None,
            json: args.run.json,
            board: display.take_board(),
            diverged,
            interrupted: None,
            failed,
            written,
            outcome,
            remedy: format!("try a lower --lr (this run used {})", args.lr),
            plot_failed: crate::harness::plot::training_curves(
                args.run.plot.as_deref(),
                &args.plot_title(),
                &rows,
                &display,
            ),
        };
        let final_metrics = written.then(|| final_metrics(final_loss, &predictions, wrong));
        if args.run.json || args.run.tensorboard.is_some() {
            let mut report = args.report(&backend, ending.status(), rows, final_metrics, baseline);
            report.diverged = ending.diverged.clone();
            ending.report = Some(report);
        }
        Ok(ending)
    }
}

impl XorArgs {
    /// The report rows of the recorded `losses` (one every --log-every epochs) and the divergence at the
    /// first that is not finite; each row's line is said on `display`.
    fn rows(
        &self,
        losses: &[f32],
        rates: &[f32],
        seconds: f64,
        display: &mut Display,
    ) -> (Vec<EpochRow>, Option<Divergence>) {
        let args = self;
        // Each recorded loss is taken before its epoch's update, as a report row's train_loss is. The run
        // is timed as a whole (on the GPU it is one launch), so a row's time is its share of it.
        let mut rows = Vec::new();
        let mut diverged = None;
        for (i, &loss) in losses.iter().enumerate() {
            let epoch = i * args.report_every + 1;
            if !loss.is_finite() {
                diverged = Some(Divergence { epoch, what: "loss" });
                break;
            }
            let row = EpochRow {
                epoch,
                train_loss: f64::from(loss),
                val_loss: None,
                val_accuracy: None,
                test_loss: None,
                test_accuracy: None,
                samples_per_s: (BATCH * args.epochs) as f64 / seconds.max(1e-9),
                lr: Some(report::decimal(rates[epoch - 1])),
                elapsed_s: seconds * epoch as f64 / args.epochs as f64,
                extra: Default::default(),
            };
            display.line(&format!("epoch {epoch}/{}: loss {}", args.epochs, loss_text(loss)));
            display.record(epoch, &row);
            rows.push(row);
        }
        (rows, diverged)
    }

    /// The lines of a run that did not diverge: its final loss, the truth table and whether XOR was learned.
    fn say_final(&self, final_loss: f32, predictions: &[f32; 4], wrong: usize, display: &Display) {
        display.line(&format!("final loss {} (after epoch {})", loss_text(final_loss), self.epochs));
        display.line(&truth_table(predictions));
        display.line(&if wrong == 0 {
            "every point is on the right side of 0.5: XOR learned".to_string()
        } else {
            format!("{wrong} of 4 points on the wrong side of 0.5: XOR not learned")
        });
    }

    /// Whether the model is written, and what became of --out. A model that has not learned XOR (or
    /// diverged) is not written. One that has replaces only a model at least as good (`baseline`):
    /// rerunning the same command rewrites the same file.
    fn outcome(&self, learned: bool, final_loss: f32, baseline: Option<f64>) -> (bool, String) {
        let written = learned && baseline.is_none_or(|b| f64::from(final_loss) <= b);
        let outcome = run::write_once_outcome(
            &self.run.out,
            written,
            (written || learned).then(|| format!("loss {}", loss_text(final_loss))),
            baseline.filter(|_| learned).map(|b| loss_text(b as f32)),
        );
        (written, outcome)
    }

    /// The title of the run's plot.
    fn plot_title(&self) -> String {
        let args = self;
        format!(
            "textnet xor: 2 → {} ({}) → 1, SGD lr {}, seed {}",
            args.hidden,
            args.activation.name(),
            args.lr,
            args.run.seed
        )
    }

    /// The `--json` report of a run that ended with `status`, its rows, and the figures of the model it
    /// wrote (`final_metrics`, none when it wrote none); `diverged` is the caller's to fill in.
    fn report(
        &self,
        backend: &Backend,
        status: Status,
        rows: Vec<EpochRow>,
        final_metrics: Option<serde_json::Map<String, serde_json::Value>>,
        baseline: Option<f64>,
    ) -> Report {
        let args = self;
        let kept_epoch = final_metrics.is_some().then_some(args.epochs);
        Report {
            textnet: crate::VERSION,
            command: "xor",
            status,
            config: report::with_flags(
                json!({
                    "keep": "last",
                    "hidden": args.hidden,
                    "activation": args.activation.name(),
                    "lr": report::decimal(args.lr),
                    "epochs": args.epochs,
                    "batch": BATCH,
                    "report_every": args.report_every,
                }),
                &[&args.run, &args.schedule],
            ),
            device: report::DeviceFields::of(backend),
            data: json!({
                "inputs": INPUTS,
                "targets": TARGETS,
                "train_samples": BATCH,
                "val_samples": 0,
            }),
            parameters: parameter_count(args.hidden),
            epochs: rows,
            final_metrics,
            model: args.run.out.display().to_string(),
            kept_epoch,
            baseline_val_loss: baseline,
            diverged: None,
        }
    }
}

/// The report's figures of the model a run wrote: its final loss, its predictions and whether all four
/// are on the right side of 0.5 (`wrong` are not).
fn final_metrics(final_loss: f32, predictions: &[f32; 4], wrong: usize) -> serde_json::Map<String, serde_json::Value> {
    let mut figures = serde_json::Map::new();
    figures.insert("loss".into(), json!(final_loss));
    figures.insert("predictions".into(), json!(predictions));
    figures.insert("correct".into(), json!(wrong == 0));
    figures
}

/// Six decimals, or three significant digits below 0.0001, where a trained model's loss often is.
fn loss_text(loss: f32) -> String {
    if loss == 0.0 || loss.abs() >= 1e-4 { format!("{loss:.6}") } else { format!("{loss:.2e}") }
}

/// `x1 x2 | target | prediction`, one row per point.
fn truth_table(predictions: &[f32; 4]) -> String {
    let mut out = "x1 x2 | target | prediction".to_string();
    for ((x, t), y) in INPUTS.iter().zip(TARGETS).zip(predictions) {
        out += &format!("\n{:>2} {:>2} | {t:>6} | {y:>10.4}", x[0], x[1]);
    }
    out
}

/// The XOR model already at `out` (anything else there is refused).
fn existing_out(out: &Path) -> Result<Option<XorParams>> {
    fsutil::existing_model(out, "XOR", modelfile::from_bytes)
}
