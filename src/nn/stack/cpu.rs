//! The CPU reference as a `run::Trainer`: `model`'s forward, loss and backward in f32.
//!
//! A batch is cut into runs of a fixed number of samples (from the batch size alone, never from the
//! number of cores), the runs go to rayon's threads, and their gradients are added in run order, so a
//! run gives the same parameters to the bit on any machine. Each run's loss gradient is scaled for the
//! whole batch's mean, and its dropout mask is the whole batch's (`model::forward_part`), so splitting
//! changes nothing but the order of additions.

use super::model::{self, Network};
use super::{Samples, Setup, Target};
use crate::harness::run::Trainer;
use crate::ops::dropout::DropoutKey;
use crate::ops::optim::Optimizer;
use anyhow::{Result, bail};
use rayon::prelude::*;
use std::sync::Arc;

/// Runs a batch is cut into at most (fewer when the batch is smaller).
pub const RUNS_PER_BATCH: usize = 16;

/// Samples per chunk when evaluating.
pub const EVAL_CHUNK: usize = 256;

/// The CPU reference's trainer.
pub struct CpuTrainer {
    net: Network,
    params: Vec<f32>,
    loss: model::Loss,
    optimizer: Optimizer,
    dropout_seed: u32,
    splits: Vec<Arc<Samples>>,
}

impl CpuTrainer {
    /// A trainer of `setup` with a fresh optimizer state.
    pub fn new(setup: Setup) -> Result<CpuTrainer> {
        let Setup { net, params, loss, optim, dropout_seed, splits } = setup;
        optim.validate()?;
        if params.len() != net.param_count {
            bail!("{} parameters given for a network of {}", params.len(), net.param_count);
        }
        if splits.is_empty() {
            bail!("no training split");
        }
        for (k, s) in splits.iter().enumerate() {
            if s.features != net.inputs() {
                bail!("split {k} has {} features per sample, the network takes {}", s.features, net.inputs());
            }
            check_targets(s, &net, loss).map_err(|e| anyhow::anyhow!("split {k}: {e}"))?;
        }
        let optimizer = Optimizer::new(optim, net.param_count);
        Ok(CpuTrainer { net, params, loss, optimizer, dropout_seed, splits })
    }

    /// Optimizer steps taken so far.
    pub fn steps(&self) -> u64 {
        self.optimizer.step
    }
}

/// Whether the targets of `s` fit the network's outputs and the loss.
fn check_targets(s: &Samples, net: &Network, loss: model::Loss) -> Result<()> {
    match (&s.target, loss) {
        (Target::Classes(c), model::Loss::Ce) => {
            if c.len() != s.rows() {
                bail!("{} classes for {} samples", c.len(), s.rows());
            }
            if let Some(&bad) = c.iter().find(|&&k| k as usize >= net.outputs()) {
                bail!("class {bad} is beyond the network's {} outputs", net.outputs());
            }
        }
        (Target::Values(v), model::Loss::Mse) => {
            if v.len() != s.rows() * net.outputs() {
                bail!("{} target values for {} samples of {} outputs", v.len(), s.rows(), net.outputs());
            }
        }
        (_, loss) => bail!("the {} loss does not fit targets of the other kind", loss.name()),
    }
    Ok(())
}

/// The targets of the samples `rows` of `s`, gathered.
fn gather_targets(s: &Samples, rows: &[u32], outputs: usize) -> Target {
    match &s.target {
        Target::Classes(c) => Target::Classes(rows.iter().map(|&r| c[r as usize]).collect()),
        Target::Values(v) => {
            Target::Values(rows.iter().flat_map(|&r| &v[r as usize * outputs..][..outputs]).copied().collect())
        }
    }
}

fn as_targets(t: &Target) -> model::Targets<'_> {
    match t {
        Target::Classes(c) => model::Targets::Classes(c),
        Target::Values(v) => model::Targets::Values(v),
    }
}

/// The summed loss of the batch `rows` of `s` and the gradient of its mean, the batch cut into runs
/// (module comment).
pub fn batch_loss_and_grad(
    net: &Network,
    params: &[f32],
    s: &Samples,
    rows: &[u32],
    kind: model::Loss,
    dropout: Option<DropoutKey>,
) -> (f64, Vec<f32>) {
    let batch = rows.len();
    let run = batch.div_ceil(RUNS_PER_BATCH).max(1);
    let (features, outputs) = (net.inputs(), net.outputs());
    let parts: Vec<(f64, Vec<f32>)> = rows
        .par_chunks(run)
        .enumerate()
        .map(|(k, part)| {
            let x: Vec<f32> = part.iter().flat_map(|&r| &s.x[r as usize * features..][..features]).copied().collect();
            let targets = gather_targets(s, part, outputs);
            let first = k * run;
            let trace = model::forward_part(net, params, &x, part.len(), dropout, first);
            // `loss` divides the gradient by the row count it is given: the whole batch's, so each run's
            // gradient is its share of the batch mean.
            let out = trace.values.last().expect("an output");
            let (sum, d) = model::loss(kind, out, batch, outputs, as_targets(&targets));
            (sum as f64, model::backward_part(net, params, &trace, d, dropout, first))
        })
        .collect();
    let mut grad = vec![0.0f32; net.param_count];
    let mut loss = 0.0f64;
    for (l, g) in &parts {
        loss += l;
        grad.iter_mut().zip(g).for_each(|(a, b)| *a += b);
    }
    (loss, grad)
}

/// The summed loss over every sample of `s` and the outputs (`rows × outputs`), dropout off; chunks on
/// every core, added in chunk order.
pub fn evaluate(net: &Network, params: &[f32], s: &Samples, kind: model::Loss) -> (f64, Vec<f32>) {
    let all: Vec<u32> = (0..s.rows() as u32).collect();
    let (features, outputs) = (net.inputs(), net.outputs());
    let parts: Vec<(f64, Vec<f32>)> = all
        .par_chunks(EVAL_CHUNK)
        .map(|part| {
            let x = &s.x[part[0] as usize * features..][..part.len() * features];
            let targets = gather_targets(s, part, outputs);
            let trace = model::forward(net, params, x, part.len(), None);
            let out = trace.values.last().expect("an output").clone();
            let (sum, _) = model::loss(kind, &out, part.len(), outputs, as_targets(&targets));
            (sum as f64, out)
        })
        .collect();
    let mut loss = 0.0;
    let mut out = Vec::with_capacity(s.rows() * outputs);
    for (l, o) in parts {
        loss += l;
        out.extend(o);
    }
    (loss, out)
}

impl Trainer for CpuTrainer {
    type Params = Vec<f32>;
    type Evaluation = (f64, Vec<f32>);

    fn train_epoch(
        &mut self,
        order: &[u32],
        batch: usize,
        lr: &[f32],
        progress: &mut dyn FnMut(usize, f64),
    ) -> Result<f64> {
        if batch == 0 {
            bail!("the batch size must be at least 1");
        }
        let train = Arc::clone(&self.splits[0]);
        if let Some(&bad) = order.iter().find(|&&i| i as usize >= train.rows()) {
            bail!("sample index {bad} is outside the training split ({} samples)", train.rows());
        }
        let steps = order.len().div_ceil(batch);
        if lr.len() != steps {
            bail!("{} learning rates for {steps} steps", lr.len());
        }
        let (mut loss, mut done) = (0.0, 0);
        for (rows, &rate) in order.chunks(batch).zip(lr) {
            let key = DropoutKey { seed: self.dropout_seed, step: self.optimizer.step as u32 };
            let (l, grad) = batch_loss_and_grad(&self.net, &self.params, &train, rows, self.loss, Some(key));
            loss += l;
            self.optimizer.config.lr = rate;
            self.optimizer.step(&mut self.params, &grad);
            done += rows.len();
            progress(done, loss);
        }
        Ok(loss)
    }

    fn evaluate(&mut self, split: usize) -> Result<(f64, Vec<f32>)> {
        let Some(s) = self.splits.get(split) else { bail!("no split {split} (there are {})", self.splits.len()) };
        Ok(evaluate(&self.net, &self.params, s, self.loss))
    }

    fn params(&mut self) -> Result<Vec<f32>> {
        Ok(self.params.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::stack::spec;
    use crate::ops::optim::{OptimConfig, OptimKind};

    fn samples(rows: usize, features: usize, classes: u32) -> Samples {
        let x = (0..rows * features).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
        Samples { features, x, target: Target::Classes((0..rows as u32).map(|r| r % classes).collect()) }
    }

    #[test]
    fn runs_add_up_to_the_whole_batch() {
        let spec = spec::parse("Linear(16), ReLU, Dropout(0.3), Linear(3)").unwrap();
        let net = Network::new(&spec, spec::Shape::Flat(5)).unwrap();
        let params = net.init(model::Init::Pytorch, 3);
        let s = samples(40, 5, 3);
        let rows: Vec<u32> = (0..40).rev().collect();
        let key = Some(DropoutKey { seed: 9, step: 4 });
        let (loss, grad) = batch_loss_and_grad(&net, &params, &s, &rows, model::Loss::Ce, key);
        let x: Vec<f32> = rows.iter().flat_map(|&r| &s.x[r as usize * 5..][..5]).copied().collect();
        let classes: Vec<u32> = rows.iter().map(|&r| r % 3).collect();
        let (whole, g) =
            model::loss_and_grad(&net, &params, &x, 40, model::Targets::Classes(&classes), model::Loss::Ce, key);
        assert!((loss - whole as f64).abs() < 1e-4 * whole.abs() as f64, "{loss} {whole}");
        let worst = grad.iter().zip(&g).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "{worst}");
    }

    #[test]
    fn training_lowers_the_loss_and_repeats_to_the_bit() {
        let spec = spec::parse("Linear(8), Tanh, Linear(2)").unwrap();
        let net = Network::new(&spec, spec::Shape::Flat(4)).unwrap();
        let s = Arc::new(samples(64, 4, 2));
        let run = || {
            let setup = Setup {
                net: net.clone(),
                params: net.init(model::Init::Xavier, 1),
                loss: model::Loss::Ce,
                optim: OptimConfig::new(OptimKind::Adam),
                dropout_seed: 1,
                splits: vec![s.clone()],
            };
            let mut t = CpuTrainer::new(setup).unwrap();
            let order: Vec<u32> = (0..64).collect();
            let before = t.evaluate(0).unwrap().0;
            for _ in 0..20 {
                t.train_epoch(&order, 16, &[0.01; 4], &mut |_, _| {}).unwrap();
            }
            assert_eq!(t.steps(), 80);
            (before, t.evaluate(0).unwrap().0, t.params().unwrap())
        };
        let (before, after, params) = run();
        assert!(after < before, "{before} → {after}");
        assert_eq!(params, run().2);
    }
}
