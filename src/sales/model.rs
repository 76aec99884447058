//! The sales regressor and its CPU reference: the oracle for the GPU trainer and the no-GPU path.
//!
//! On standardised features x (n) and target t (see `data::Stats`):
//! ```text
//! z = W1·x + b1,   a = relu(z)              (H)
//! y = W2·a + b2                             (1)
//! loss = (1/B) Σ_s (y_s − t_s)²             over a batch of B rows
//! ```
//! and backward, per row s, with dy = 2(y_s − t_s)/B:
//! ```text
//! ∂b2 += dy,   ∂W2 += dy·a,   dz = dy·W2 ⊙ [z > 0],   ∂b1 += dz,   ∂W1 += dz·xᵀ
//! ```
//!
//! The parameters live in one flat f32 vector, W1 (H×n, row-major), b1 (H), W2 (1×H), b2 (1), so the
//! optimizers of `crate::ops::optim` update them in one elementwise pass.

use super::data::{Split, Stats};
use crate::cpu::SeededRng;
use crate::cpu::dot;
use crate::ops::mlp::Parts;
use crate::ops::optim::{OptimConfig, Optimizer};
use crate::report::Divergence;
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
            crate::cpu::linear_init(values, fan_in, &mut rng);
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

/// The hidden pre-activations of `x` into `z` (H).
fn hidden(p: &SalesParams, x: &[f32], z: &mut [f32]) {
    let (n, w) = (p.shape.inputs, p.parts());
    for (j, z) in z.iter_mut().enumerate() {
        *z = dot(&w.w1[j * n..][..n], x) + w.b1[j];
    }
}

fn output(p: &SalesParams, z: &[f32]) -> f32 {
    let w = p.parts();
    w.b2[0] + z.iter().zip(w.w2).map(|(&z, &w)| w * z.max(0.0)).sum::<f32>()
}

/// The model's (standardised) prediction for one standardised feature row.
pub fn predict(p: &SalesParams, x: &[f32]) -> f32 {
    assert_eq!(x.len(), p.shape.inputs, "feature row does not match the model's inputs");
    let mut z = vec![0.0; p.shape.hidden];
    hidden(p, x, &mut z);
    output(p, &z)
}

/// Mean squared error over the rows `rows` of `data`, and its gradient into `grad` (flat, parameter
/// order).
pub fn loss_and_grad(p: &SalesParams, data: &Split, rows: &[u32], grad: &mut [f32]) -> f64 {
    let SalesShape { inputs: n, hidden: h } = p.shape;
    assert_eq!(data.features, n, "the split's features do not match the model's inputs");
    assert_eq!(grad.len(), p.flat.len());
    grad.fill(0.0);
    if rows.is_empty() {
        return 0.0;
    }
    let w = p.parts();
    let g = p.shape.split_mut(grad);
    let mut z = vec![0.0f32; h];
    let scale = 2.0 / rows.len() as f32;
    let mut loss = 0.0f64;
    for &row in rows {
        let x = data.row(row as usize);
        hidden(p, x, &mut z);
        let err = output(p, &z) - data.y[row as usize];
        loss += (err as f64) * (err as f64);
        let dy = scale * err;
        g.b2[0] += dy;
        for (j, &z) in z.iter().enumerate() {
            if z > 0.0 {
                g.w2[j] += dy * z;
                let dz = dy * w.w2[j];
                g.b1[j] += dz;
                for (gw, &xi) in g.w1[j * n..][..n].iter_mut().zip(x) {
                    *gw += dz * xi;
                }
            }
        }
    }
    loss / rows.len() as f64
}

/// Mixed into the seed for the shuffle stream, so it differs from the initialisation stream.
const SHUFFLE_STREAM: u64 = 0x5341_4c45_535f_5348;

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

/// The smallest `check::kink_ratio` of any hidden unit over the rows `rows` (how close a step on them comes
/// to ReLU′'s jump).
pub fn kink_margin(p: &SalesParams, data: &Split, rows: &[u32]) -> f64 {
    let (n, w) = (p.shape.inputs, p.parts());
    rows.iter()
        .flat_map(|&row| (0..p.shape.hidden).map(move |j| (row, j)))
        .map(|(row, j)| crate::check::kink_ratio(&w.w1[j * n..][..n], w.b1[j], data.row(row as usize)))
        .fold(f64::INFINITY, f64::min)
}

/// One pass over `order` in batches of `batch` (the last may be shorter), an optimizer step per batch.
/// Returns the summed per-row loss, each row's taken before its batch's step. With `kink_margin`, lowers
/// it to the `kink_margin` of every step's batch.
pub fn train_epoch(
    p: &mut SalesParams,
    optimizer: &mut Optimizer,
    data: &Split,
    order: &[u32],
    batch: usize,
    mut watch: Option<&mut f64>,
) -> Result<f64> {
    if batch == 0 {
        bail!("the batch size must be at least 1");
    }
    if let Some(&bad) = order.iter().find(|&&i| i as usize >= data.rows) {
        bail!("row index {bad} is outside the training split ({} rows)", data.rows);
    }
    let mut grad = vec![0.0f32; p.flat.len()];
    let mut loss = 0.0;
    for rows in order.chunks(batch) {
        if let Some(margin) = watch.as_deref_mut() {
            *margin = margin.min(kink_margin(p, data, rows));
        }
        loss += loss_and_grad(p, data, rows, &mut grad) * rows.len() as f64;
        optimizer.step(&mut p.flat, &grad);
    }
    Ok(loss)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// How long to train and in what order.
pub struct Schedule {
    /// Passes over the training split.
    pub epochs: usize,
    /// Rows per optimizer step.
    pub batch: usize,
    /// Seed of the shuffle before each epoch.
    pub seed: u64,
}

/// Trains `p` on the standardised split `train` for `schedule.epochs` epochs; returns each epoch's mean
/// training loss. A `Divergence` error when the loss or the parameters stop being finite.
pub fn train(p: &mut SalesParams, optim: OptimConfig, train: &Split, schedule: Schedule) -> Result<Vec<f64>> {
    optim.validate()?;
    let mut optimizer = Optimizer::new(optim, p.flat.len());
    let mut shuffle = Shuffle::new(train.rows, schedule.seed);
    let mut losses = Vec::with_capacity(schedule.epochs);
    for epoch in 1..=schedule.epochs {
        let loss = train_epoch(p, &mut optimizer, train, shuffle.next_epoch(), schedule.batch, None)?;
        if !loss.is_finite() {
            return Err(Divergence { epoch, what: "training loss" }.into());
        }
        if !p.all_finite() {
            return Err(Divergence { epoch, what: "parameters" }.into());
        }
        losses.push(loss / train.rows.max(1) as f64);
    }
    Ok(losses)
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

/// The model on every row of the standardised split `data`; `stats` turns errors back into target units.
pub fn evaluate(p: &SalesParams, data: &Split, stats: &Stats) -> Evaluation {
    let mut z = vec![0.0f32; p.shape.hidden];
    let (mut se, mut ae) = (0.0f64, 0.0f64);
    for i in 0..data.rows {
        hidden(p, data.row(i), &mut z);
        let err = (output(p, &z) - data.y[i]) as f64;
        se += err * err;
        ae += err.abs();
    }
    let n = data.rows.max(1) as f64;
    Evaluation { rows: data.rows, mse: se / n, mae: ae / n * stats.target_std as f64 }
}

/// Mean absolute error, in target units, of always predicting the training mean on the standardised
/// split `data`.
pub fn baseline_mae(data: &Split, stats: &Stats) -> f64 {
    let sum: f64 = data.y.iter().map(|&y| (y as f64).abs()).sum();
    sum / data.rows.max(1) as f64 * stats.target_std as f64
}
