//! What the `sales` command trains: its regressor as the layer stack `Linear(n, H), ReLU, Linear(H, 1)`
//! (`model::network`) under squared error, run by `nn::stack`'s trainers (the CPU reference, or on a GPU
//! the whole-epoch kernel, which matches the hand-fused sales kernel it replaced to within 3 % at the
//! same features). Both keep the parameters in the layout of `SalesParams` and the model file, so
//! `sales` keeps its flags, its reports and its files.

use super::model::{Evaluation, SalesParams, SalesShape, network, samples};
use crate::datasets::features::{Dataset, Stats};
use crate::device::Backend;
use crate::harness::run::Trainer;
use crate::nn::stack::model::Loss;
use crate::nn::stack::{self, Samples, StackTrainer, Target};
use crate::ops::optim::OptimConfig;
use anyhow::Result;
use std::sync::Arc;

/// The regressor on the stack's trainer for a backend.
pub struct FitSales {
    trainer: Box<StackTrainer>,
    shape: SalesShape,
    stats: Stats,
    test: Arc<Samples>,
}

impl FitSales {
    /// The stack's setup of `params` on `data`, both splits standardised with `stats` (a resumed model's), else
    /// with the training split's; and those statistics.
    pub fn setup(
        data: &Dataset,
        params: SalesParams,
        optim: OptimConfig,
        stats: Option<Stats>,
    ) -> Result<(stack::Setup, Stats)> {
        optim.validate()?;
        params.shape.validate()?;
        let stats = stats.unwrap_or_else(|| Stats::of(&data.train));
        let setup = stack::Setup {
            net: network(params.shape)?,
            params: params.flat,
            loss: Loss::Mse,
            optim,
            dropout_seed: 0,
            splits: vec![
                Arc::new(samples(&stats.normalize(&data.train))),
                Arc::new(samples(&stats.normalize(&data.test))),
            ],
        };
        Ok((setup, stats))
    }

    /// A trainer of `params` on `backend` for batches of up to `batch` rows (see `setup`).
    pub fn new(
        backend: &Backend,
        data: &Dataset,
        params: SalesParams,
        optim: OptimConfig,
        stats: Option<Stats>,
        batch: usize,
    ) -> Result<FitSales> {
        let shape = params.shape;
        let (setup, stats) = FitSales::setup(data, params, optim, stats)?;
        let test = setup.splits[1].clone();
        Ok(FitSales { trainer: stack::trainer(backend, setup, batch.max(1))?, shape, stats, test })
    }
}

impl FitSales {
    /// The statistics the features and target were standardised with (saved with the model).
    pub fn stats(&self) -> &Stats {
        &self.stats
    }
}

/// The regressor as the shared trainer: its evaluation is the test split's (`run::TEST`, the one split
/// it holds besides the training one), the summed squared error (standardised) and the MAE.
impl Trainer for FitSales {
    type Params = SalesParams;
    type Evaluation = Evaluation;

    fn train_epoch(
        &mut self,
        order: &[u32],
        batch: usize,
        rates: &[f32],
        progress: &mut dyn FnMut(usize, f64),
    ) -> Result<f64> {
        self.trainer.train_epoch(order, batch, rates, progress)
    }

    fn evaluate(&mut self, split: usize) -> Result<Evaluation> {
        crate::harness::run::test_split_only("the sales trainer", split)?;
        let (squares, outputs) = self.trainer.evaluate(crate::harness::run::TEST)?;
        let Target::Values(y) = &self.test.target else { unreachable!("the sales target is a value") };
        Ok(Evaluation::of(squares, &outputs, y, self.stats.target_std))
    }

    fn params(&mut self) -> Result<SalesParams> {
        Ok(SalesParams { shape: self.shape, flat: self.trainer.params()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sales::model::{DEFAULT_BATCH, DEFAULT_HIDDEN};

    /// `textnet sales` on the default sales.tsv (19 features) compiles nothing on a first run.
    #[test]
    fn the_default_run_is_precompiled() {
        let net = network(SalesShape { inputs: 19, hidden: DEFAULT_HIDDEN }).unwrap();
        let modules = stack::gpu::trainer_modules(&net, Loss::Mse, DEFAULT_BATCH);
        let missing: Vec<_> = modules.iter().filter(|m| !crate::device::compile::listed_for_precompiling(m)).collect();
        assert!(missing.is_empty(), "add to fused/precompiled.txt: {missing:?}");
    }
}
