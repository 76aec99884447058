//! The text pipeline: corpus → tokens → vocabulary → next-token model, trained on the CPU reference
//! (`model`) or the fused CUDA kernels (`gpu`, kernels in `fused/text.cu`).

pub mod bench;
pub mod checks;
pub mod cli;
pub mod corpus;
pub mod cpu_batch;
pub mod eval;
pub mod generate;
pub mod gpu;
pub mod model;
pub mod modelfile;
pub mod predict;
pub mod tokenizer;
pub mod train;
pub mod vocab;

use anyhow::Result;
use model::{EvalSums, TextParams};

/// A training backend. It owns the parameters (on the GPU: resident in device memory) and the token
/// stream; callers address samples by the position of their target token in that stream.
pub trait TextTrainer {
    /// Trains on the samples at `positions`, in that order, `batch` samples per SGD step (the last step
    /// may be shorter). Returns the summed per-sample loss.
    fn train(&mut self, positions: &[u32], batch: usize, lr: f32) -> Result<f64>;
    /// Loss and top-1/top-5 hits over `positions`, without updating anything.
    fn evaluate(&mut self, positions: &[u32]) -> Result<EvalSums>;
    /// A host copy of the current parameters.
    fn params(&mut self) -> Result<TextParams>;
}

/// The CPU reference as a trainer.
pub struct CpuTrainer {
    pub params: TextParams,
    pub tokens: std::sync::Arc<[u32]>,
    /// Momentum or Adam (`model::optimizer_update`) in place of SGD at the `train` call's lr.
    pub optimizer: Option<crate::optim::Optimizer>,
}

impl CpuTrainer {
    /// An SGD trainer.
    pub fn new(params: TextParams, tokens: std::sync::Arc<[u32]>) -> CpuTrainer {
        CpuTrainer { params, tokens, optimizer: None }
    }
}

impl TextTrainer for CpuTrainer {
    fn train(&mut self, positions: &[u32], batch: usize, lr: f32) -> Result<f64> {
        let mut loss = 0.0;
        let n = self.params.shape.context;
        for step in positions.chunks(batch.max(1)) {
            loss += match &mut self.optimizer {
                None => model::train_step(&mut self.params, &self.tokens, step, lr),
                Some(optimizer) => {
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
