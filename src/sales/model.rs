//! The sales regressor: its sizes, parameters, initialisation, row order, and its predictions on the CPU
//! (for a model file's figures and `--predict`). On standardised features x (n) and target t (see
//! `datasets::features::Stats`):
//! ```text
//! z = W1·x + b1,   a = relu(z)              (H)
//! y = W2·a + b2                             (1)
//! loss = (1/B) Σ_s (y_s − t_s)²             over a batch of B rows
//! ```
//! It trains as the layer stack `Linear(n, H), ReLU, Linear(H, 1)` (`network`, trained in `train`), whose
//! CPU reference and finite-difference checks are `nn::stack`'s. The parameters live in one flat f32 vector, W1 (H×n,
//! row-major), b1 (H), W2 (1×H), b2 (1): `nn.Linear`'s layouts, and the stack's.

use crate::datasets::features::{Split, Stats};
use crate::nn::stack::model::{Loss, Network};
use crate::nn::stack::spec::{Layer, Shape, Spec};
use crate::nn::stack::{Samples, Target};
use crate::ops::cpu::SeededRng;
use crate::ops::mlp::Parts;
use anyhow::{Result, bail};
use rand::SeedableRng;
use rand::seq::SliceRandom;

/// Hidden units when `--hidden` is not given.
pub const DEFAULT_HIDDEN: usize = 32;
/// Rows per step when `--batch` is not given.
pub const DEFAULT_BATCH: usize = 64;
/// Epochs when `--epochs` is not given.
pub const DEFAULT_EPOCHS: usize = 50;
/// Largest `--hidden` accepted.
pub const MAX_HIDDEN: usize = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// The regressor's sizes.
pub struct SalesShape {
    /// Input features n.
    pub inputs: usize,
    /// Hidden units H.
    pub hidden: usize,
}

impl SalesShape {
    /// Ok when the sizes are usable, otherwise the error line.
    pub fn validate(&self) -> Result<()> {
        if self.inputs == 0 {
            bail!("the model needs at least one input feature");
        }
        if self.hidden == 0 || self.hidden > MAX_HIDDEN {
            bail!("--hidden must be between 1 and {MAX_HIDDEN}, got {}", self.hidden);
        }
        Ok(())
    }

    /// Length of the flat parameter vector.
    pub fn param_count(&self) -> usize {
        let SalesShape { inputs: n, hidden: h } = *self;
        h * n + h + h + 1
    }

    /// Names and shapes of the tensors in flat-vector order.
    pub fn tensor_shapes(&self) -> [(&'static str, Vec<usize>); 4] {
        let SalesShape { inputs: n, hidden: h } = *self;
        [("w1", vec![h, n]), ("b1", vec![h]), ("w2", vec![1, h]), ("b2", vec![1])]
    }

    /// `flat` cut into the four parameter tensors.
    pub fn split<'a>(&self, flat: &'a [f32]) -> Parts<&'a [f32]> {
        Parts::of(flat, self.inputs, self.hidden, 1)
    }

    /// `flat` cut into the four parameter tensors, writable.
    pub fn split_mut<'a>(&self, flat: &'a mut [f32]) -> Parts<&'a mut [f32]> {
        Parts::of_mut(flat, self.inputs, self.hidden, 1)
    }
}

/// All trainable parameters, flat (see the module comment for the layout).
#[derive(Clone, Debug, PartialEq)]
pub struct SalesParams {
    /// The sizes.
    pub shape: SalesShape,
    /// Every parameter: W1, b1, W2, b2 (module comment).
    pub flat: Vec<f32>,
}

impl SalesParams {
    /// PyTorch's `nn.Linear` initialisation: every weight and bias U(−1/√fan_in, 1/√fan_in), drawn in the
    /// order W1, b1, W2, b2.
    pub fn init(shape: SalesShape, seed: u64) -> SalesParams {
        let mut rng = SeededRng::seed_from_u64(seed);
        let mut flat = vec![0.0f32; shape.param_count()];
        let parts = shape.split_mut(&mut flat);
        for (values, fan_in) in
            [(parts.w1, shape.inputs), (parts.b1, shape.inputs), (parts.w2, shape.hidden), (parts.b2, shape.hidden)]
        {
            crate::ops::cpu::linear_init(values, fan_in, &mut rng);
        }
        SalesParams { shape, flat }
    }

    /// The four parameter tensors.
    pub fn parts(&self) -> Parts<&[f32]> {
        self.shape.split(&self.flat)
    }

    /// Whether every parameter is finite.
    pub fn all_finite(&self) -> bool {
        self.flat.iter().all(|x| x.is_finite())
    }
}

/// The model's (standardised) predictions for the standardised feature rows `x` (rows × inputs): the stack's
/// CPU forward pass, as the trainer's.
pub fn predict(p: &SalesParams, x: &[f32]) -> Result<Vec<f32>> {
    let rows = x.len() / p.shape.inputs.max(1);
    let net = network(p.shape)?;
    let trace = crate::nn::stack::model::forward(&net, &p.flat, x, rows, None);
    Ok(trace.values.last().expect("a network has an output").clone())
}

/// Mixed into the seed for the shuffle stream, so it differs from the initialisation stream.
pub const SHUFFLE_STREAM: u64 = 0x5341_4c45_535f_5348;

/// The training order of every epoch: 0..rows reshuffled before each epoch by one seeded stream, so
/// every backend sees the same batches.
pub struct Shuffle {
    rng: SeededRng,
    order: Vec<u32>,
}

impl Shuffle {
    /// The order of `rows` rows for a run seeded with `seed`.
    pub fn new(rows: usize, seed: u64) -> Shuffle {
        Shuffle { rng: SeededRng::seed_from_u64(seed ^ SHUFFLE_STREAM), order: (0..rows as u32).collect() }
    }

    /// The next epoch's order.
    pub fn next_epoch(&mut self) -> &[u32] {
        self.order.shuffle(&mut self.rng);
        &self.order
    }
}

/// How well the model predicts a split.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evaluation {
    /// Number of rows evaluated.
    pub rows: usize,
    /// Mean squared error of the standardised target.
    pub mse: f64,
    /// Mean absolute error in the target's units.
    pub mae: f64,
}

impl Evaluation {
    /// The figures of the standardised predictions `outputs` of a split whose standardised targets are
    /// `y`, given their summed squared error; `target_std` turns errors back into target units.
    pub fn of(squares: f64, outputs: &[f32], y: &[f32], target_std: f32) -> Evaluation {
        let absolute: f64 = outputs.iter().zip(y).map(|(&o, &t)| (o as f64 - t as f64).abs()).sum();
        let n = y.len().max(1) as f64;
        Evaluation { rows: y.len(), mse: squares / n, mae: absolute / n * target_std as f64 }
    }
}

/// The model on every row of the standardised split `data` (the stack's CPU evaluation, as the trainer's);
/// `stats` turns errors back into target units.
pub fn evaluate(p: &SalesParams, data: &Split, stats: &Stats) -> Result<Evaluation> {
    let net = network(p.shape)?;
    let (squares, outputs) = crate::nn::stack::cpu::evaluate(&net, &p.flat, &samples(data), Loss::Mse);
    Ok(Evaluation::of(squares, &outputs, &data.y, stats.target_std))
}

/// Mean absolute error, in target units, of always predicting the training mean on the standardised
/// split `data`.
pub fn baseline_mae(data: &Split, stats: &Stats) -> f64 {
    let sum: f64 = data.y.iter().map(|&y| (y as f64).abs()).sum();
    sum / data.rows.max(1) as f64 * stats.target_std as f64
}

/// The regressor as a layer stack of `shape`.
pub fn network(shape: SalesShape) -> Result<Network> {
    let layers = vec![Layer::dense(shape.inputs, shape.hidden), Layer::Relu, Layer::dense(shape.hidden, 1)];
    Network::new(&Spec { layers }, Shape::Flat(shape.inputs))
}

/// A standardised split as the stack's samples: the features, and the target as one value per row.
pub fn samples(split: &Split) -> Samples {
    Samples { features: split.features, x: split.x.clone(), target: Target::Values(split.y.clone()) }
}
