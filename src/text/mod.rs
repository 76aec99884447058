//! The text pipeline: corpus → tokens → vocabulary → next-token model, trained on the CPU reference
//! (`model`) or the fused CUDA kernels (`gpu`, kernels in `fused/text.cu`).

pub mod args;
pub mod bench;
pub mod checks;
pub mod cli;
pub mod corpus;
pub mod cpu_batch;
mod ending;
mod epochs;
pub mod eval;
pub mod generate;
pub mod gpu;
pub mod model;
pub mod modelfile;
pub mod neighbors;
pub mod predict;
pub mod tokenizer;
pub mod train;
pub mod vocab;

use anyhow::{Result, bail};
use model::{EvalSums, TextParams};

/// A training backend. It owns the parameters (on the GPU: resident in device memory) and the token
/// stream; callers address samples by the position of their target token in that stream. `train::train`
/// drives one through `run::epochs` as a `run::Trainer` over the training and validation positions;
/// `eval`, `bench` and the selftest address positions of their own.
pub trait TextTrainer {
    /// Trains on the samples at `positions`, in that order, `batch` samples per step (the last step may
    /// be shorter), step k at learning rate `rates[k]` (`rates.len()` = the number of steps). Returns the
    /// summed per-sample loss.
    fn train_steps(&mut self, positions: &[u32], batch: usize, rates: &[f32]) -> Result<f64>;
    /// `train_steps` at the one learning rate `lr` for every step.
    fn train(&mut self, positions: &[u32], batch: usize, lr: f32) -> Result<f64> {
        self.train_steps(positions, batch, &vec![lr; positions.len().div_ceil(batch.max(1))])
    }
    /// Loss and top-1/top-5 hits over `positions`, without updating anything.
    fn evaluate(&mut self, positions: &[u32]) -> Result<EvalSums>;
    /// A host copy of the current parameters.
    fn params(&mut self) -> Result<TextParams>;
}

/// The CPU reference as a trainer.
pub struct CpuTrainer {
    /// The parameters being trained.
    pub params: TextParams,
    /// The corpus's token ids.
    pub tokens: std::sync::Arc<[u32]>,
    /// Momentum or Adam (`model::optimizer_update`) in place of SGD, each step at its rate (which replaces
    /// the optimizer's `lr`).
    pub optimizer: Option<crate::ops::optim::Optimizer>,
}

impl CpuTrainer {
    /// An SGD trainer.
    pub fn new(params: TextParams, tokens: std::sync::Arc<[u32]>) -> CpuTrainer {
        CpuTrainer { params, tokens, optimizer: None }
    }
}

/// Ok for the precisions the text model offers: fp32, and bf16 for its three V×H products (TF32 is not
/// offered: at the batches where the tensor cores pay, bf16 has the same fp32 sums at twice TF32's rate).
pub fn check_precision(precision: crate::device::precision::Precision) -> Result<()> {
    if precision == crate::device::precision::Precision::Tf32 {
        bail!("--precision tf32 is not available for the text model: use fp32 or bf16");
    }
    Ok(())
}

/// Ok when `rates` has one rate per step of `samples` samples in batches of `batch`.
fn check_rates(samples: usize, batch: usize, rates: &[f32]) -> Result<()> {
    let steps = samples.div_ceil(batch.max(1));
    if rates.len() != steps {
        bail!("internal: {} learning rates for {steps} steps", rates.len());
    }
    Ok(())
}

impl TextTrainer for CpuTrainer {
    fn train_steps(&mut self, positions: &[u32], batch: usize, rates: &[f32]) -> Result<f64> {
        check_rates(positions.len(), batch, rates)?;
        let mut loss = 0.0;
        let n = self.params.shape.context;
        for (step, &lr) in positions.chunks(batch.max(1)).zip(rates) {
            loss += match &mut self.optimizer {
                None => model::train_step(&mut self.params, &self.tokens, step, lr),
                Some(optimizer) => {
                    optimizer.config.lr = lr;
                    let contexts: Vec<&[u32]> =
                        step.iter().map(|&pos| model::context_of(&self.tokens, pos, n)).collect();
                    let targets: Vec<u32> = step.iter().map(|&pos| self.tokens[pos as usize]).collect();
                    let (g, step_loss) = model::backward(&self.params, &contexts, &targets);
                    model::optimizer_update(&mut self.params, &g, &contexts, optimizer);
                    step_loss
                }
            };
        }
        Ok(loss)
    }

    fn evaluate(&mut self, positions: &[u32]) -> Result<EvalSums> {
        Ok(model::evaluate(&self.params, &self.tokens, positions))
    }

    fn params(&mut self) -> Result<TextParams> {
        Ok(self.params.clone())
    }
}

/// The text pipeline as the command line, `selftest`, `bench` and `generate` see it.
pub const PIPELINE: crate::pipeline::Pipeline = crate::pipeline::Pipeline {
    name: "text",
    commands: &[
        crate::pipeline::Command {
            name: "train",
            about: "Train the next-token model on a UTF-8 text corpus and write a .safetensors model file",
            args: <args::TrainArgs as clap::Args>::augment_args,
            run: |m| cli::train(crate::pipeline::parsed(m)?),
        },
        crate::pipeline::Command {
            name: "predict",
            about: "Print the likeliest next tokens after a context, using a trained model file",
            args: <predict::PredictArgs as clap::Args>::augment_args,
            run: |m| predict::run(crate::pipeline::parsed(m)?),
        },
        crate::pipeline::Command {
            name: "neighbors",
            about: "Print the words whose embeddings lie nearest a word's in a trained text model",
            args: <neighbors::NeighborsArgs as clap::Args>::augment_args,
            run: |m| neighbors::run(crate::pipeline::parsed(m)?),
        },
    ],
    checks: checks::checks,
    modules: checks::modules,
    benches: &[
        crate::pipeline::Bench {
            name: "text",
            about: "Text model speed: single-sample and batched steps",
            args: <bench::SpeedArgs as clap::Args>::augment_args,
            run: |gpu, options, m| bench::speed(gpu, options, &crate::pipeline::parsed(m)?),
        },
        crate::pipeline::Bench {
            name: "quality",
            about: "Text model quality: GPU and CPU reference trained on the same samples; writes what the \
                    PyTorch baseline needs to repeat the run (`benches/torch_baseline.py --quality DIR`)",
            args: <bench::QualityArgs as clap::Args>::augment_args,
            run: |gpu, options, m| bench::quality(gpu, options, &crate::pipeline::parsed(m)?),
        },
    ],
    models: &[&crate::io::modelkind::TEXT],
    language_model: Some(crate::pipeline::LanguageModel { open: generate::open, evaluate: eval::evaluate }),
    image_classifier: None,
    onnx: None,
};
