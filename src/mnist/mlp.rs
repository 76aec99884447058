//! How `textnet mnist` trains its MLP: as the layer stack `Linear(I, H), act, Linear(H, C)` under
//! cross-entropy, on `nn::stack`'s trainers (the CPU reference, or on a GPU the stack's layer kernels,
//! which match the hand-fused MLP they replaced to within 1 % a step). The stack's flat layout is the
//! MLP's (`nn.Linear`'s tensors in order), so the parameters, the model files and `textnet classify` stay
//! as they were.

use super::idx::Split;
use super::model::{Activation, MlpParams, MlpShape};
use super::{Classifier, Evaluation};
use crate::device::Backend;
use crate::harness::run::Trainer;
use crate::nn::stack::model::{Loss, Network};
use crate::nn::stack::spec::{Layer, Shape, Spec};
use crate::nn::stack::{self, Samples, StackTrainer, Target};
use crate::ops::optim::OptimConfig;
use anyhow::Result;
use std::sync::Arc;

/// The MLP as a layer stack of `shape`.
pub fn network(shape: MlpShape) -> Result<Network> {
    let activation = match shape.activation {
        Activation::Relu => Layer::Relu,
        Activation::Sigmoid => Layer::Sigmoid,
        Activation::Tanh => Layer::Tanh,
    };
    let layers = vec![Layer::dense(shape.inputs, shape.hidden), activation, Layer::dense(shape.hidden, shape.classes)];
    Network::new(&Spec { layers }, Shape::Flat(shape.inputs))
}

/// An image split as the stack's samples.
pub fn samples(split: &Split) -> Samples {
    Samples {
        features: split.pixels,
        x: split.images.clone(),
        target: Target::Classes(split.labels.iter().map(|&l| l as u32).collect()),
    }
}

/// The evaluation of a split of `labels` from its summed loss and its logits.
fn evaluation(loss: f64, logits: &[f32], labels: &[u8], classes: usize) -> Evaluation {
    let mut eval = Evaluation::new(classes);
    for (row, &label) in logits.chunks(classes).zip(labels) {
        eval.record(label as usize, crate::ops::cpu::argmax(row));
    }
    eval.loss = loss;
    eval
}

/// Loss and confusion matrix of `params` over all of `data`, on the CPU: the stack's CPU evaluation, as
/// the trainer's.
pub fn evaluate(params: &MlpParams, data: &Split) -> Result<Evaluation> {
    let net = network(params.shape)?;
    let (loss, logits) = stack::cpu::evaluate(&net, &params.flat, &samples(data), Loss::Ce);
    Ok(evaluation(loss, &logits, &data.labels, params.shape.classes))
}

/// The MLP on the stack's trainer for a backend.
pub struct FitMlp {
    trainer: Box<StackTrainer>,
    shape: MlpShape,
    test_labels: Vec<u8>,
}

impl FitMlp {
    /// A trainer of `params` on `backend` for batches of up to `batch` samples, with a fresh optimizer
    /// state (on a GPU both splits are copied to it once).
    pub fn new(
        backend: &Backend,
        params: MlpParams,
        optim: OptimConfig,
        train: &Split,
        test: &Split,
        batch: usize,
    ) -> Result<FitMlp> {
        optim.validate()?;
        params.shape.validate()?;
        let setup = stack::Setup {
            net: network(params.shape)?,
            params: params.flat,
            loss: Loss::Ce,
            optim,
            dropout_seed: 0,
            splits: vec![Arc::new(samples(train)), Arc::new(samples(test))],
        };
        Ok(FitMlp {
            trainer: stack::trainer(backend, setup, batch.max(1))?,
            shape: params.shape,
            test_labels: test.labels.clone(),
        })
    }
}

impl Trainer for FitMlp {
    type Params = Classifier;
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
        super::test_split_only(split)?;
        let (loss, logits) = self.trainer.evaluate(crate::harness::run::TEST)?;
        Ok(evaluation(loss, &logits, &self.test_labels, self.shape.classes))
    }

    fn params(&mut self) -> Result<Classifier> {
        Ok(Classifier::Mlp(MlpParams { shape: self.shape, flat: self.trainer.params()? }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `textnet mnist` at its defaults (784 → 128 ReLU → 10, batch 64) compiles nothing on a first run.
    #[test]
    fn the_default_run_is_precompiled() {
        let shape = MlpShape { inputs: 784, hidden: 128, classes: 10, activation: Activation::Relu };
        let modules = stack::gpu::trainer_modules(&network(shape).unwrap(), Loss::Ce, 64);
        let missing: Vec<_> = modules.iter().filter(|m| !crate::device::compile::listed_for_precompiling(m)).collect();
        assert!(missing.is_empty(), "add to fused/precompiled.txt: {missing:?}");
    }
}
