//! The sales trainer on the GPU (not yet written).

use super::data::{Dataset, Stats};
use super::model::{Evaluation, SalesParams};
use super::train::SalesTrainer;
use crate::device::Gpu;
use crate::optim::OptimConfig;
use anyhow::{Result, bail};
use std::sync::Arc;

pub struct GpuSales {
    stats: Stats,
}

impl GpuSales {
    pub fn new(_gpu: Arc<Gpu>, _data: &Dataset, _params: SalesParams, _optim: OptimConfig) -> Result<GpuSales> {
        bail!("the sales pipeline has no GPU trainer yet; use --device cpu")
    }
}

impl SalesTrainer for GpuSales {
    fn stats(&self) -> &Stats {
        &self.stats
    }
    fn train_epoch(&mut self, _order: &[u32], _batch: usize) -> Result<f64> {
        bail!("no GPU trainer yet")
    }
    fn evaluate_test(&mut self) -> Result<Evaluation> {
        bail!("no GPU trainer yet")
    }
    fn params(&mut self) -> Result<SalesParams> {
        bail!("no GPU trainer yet")
    }
}
