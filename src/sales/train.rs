//! What the `sales` command trains on: one interface over the CPU reference and the GPU trainer, so the
//! command, the selftest and the bench drive both the same way.

use super::data::{Dataset, Split, Stats};
use super::model::{self, Evaluation, SalesParams};
use crate::ops::optim::{OptimConfig, Optimizer};
use anyhow::Result;

/// A model being trained on one dataset: the training split standardised with its own statistics, the
/// optimizer state, and the test split to evaluate.
pub trait SalesTrainer {
    /// The statistics the features and target were standardised with (saved with the model).
    fn stats(&self) -> &Stats;
    /// One pass over `order` (indices into the training split) in batches of `batch`, an optimizer step
    /// per batch (the last may be shorter). Returns the summed per-row squared error (standardised), each
    /// row's taken before its batch's step.
    fn train_epoch(&mut self, order: &[u32], batch: usize) -> Result<f64>;
    /// The model on every test row.
    fn evaluate_test(&mut self) -> Result<Evaluation>;
    /// The current parameters.
    fn params(&mut self) -> Result<SalesParams>;
}

/// The CPU reference as a `SalesTrainer`.
pub struct CpuSales {
    params: SalesParams,
    optimizer: Optimizer,
    stats: Stats,
    train: Split,
    test: Split,
    /// When set, the smallest `model::kink_margin` of any step so far (the selftest's training checks).
    pub kink_margin: Option<f64>,
}

impl CpuSales {
    /// Standardises both splits of `data` with `stats` (a resumed model's), else the training split's.
    pub fn new(data: &Dataset, params: SalesParams, optim: OptimConfig, stats: Option<Stats>) -> Result<CpuSales> {
        optim.validate()?;
        let stats = stats.unwrap_or_else(|| Stats::of(&data.train));
        let optimizer = Optimizer::new(optim, params.flat.len());
        Ok(CpuSales {
            train: stats.normalize(&data.train),
            test: stats.normalize(&data.test),
            stats,
            params,
            optimizer,
            kink_margin: None,
        })
    }
}

impl SalesTrainer for CpuSales {
    fn stats(&self) -> &Stats {
        &self.stats
    }

    fn train_epoch(&mut self, order: &[u32], batch: usize) -> Result<f64> {
        model::train_epoch(&mut self.params, &mut self.optimizer, &self.train, order, batch, self.kink_margin.as_mut())
    }

    fn evaluate_test(&mut self) -> Result<Evaluation> {
        Ok(model::evaluate(&self.params, &self.test, &self.stats))
    }

    fn params(&mut self) -> Result<SalesParams> {
        Ok(self.params.clone())
    }
}
