//! The XOR model and its CPU reference (the oracle for fused/xor.cu and the no-GPU path):
//!
//! z = W1·x + b1 (H),  a = act(z),  y = w2·a + b2,  loss = mean over the four points of (y − t)²
//!
//! trained by full-batch SGD. The arithmetic runs in the kernel's order (hidden units in turn, the four
//! points in turn) so the two read side by side.

use crate::ops::activations::Activation;
use crate::ops::cpu::SeededRng;
use crate::ops::losses::squared_error;
use rand::SeedableRng;

/// The four XOR points and their targets.
pub const INPUTS: [[f32; 2]; 4] = [[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]];
/// The XOR target of each point in `INPUTS`.
pub const TARGETS: [f32; 4] = [0.0, 1.0, 1.0, 0.0];

/// Most hidden units the fused kernel takes (one thread each, one block).
pub const MAX_HIDDEN: usize = 1024;

#[derive(Clone, Debug, PartialEq)]
/// The XOR network's parameters: 2 inputs, H hidden units, 1 output.
pub struct XorParams {
    /// Hidden-layer activation.
    pub activation: Activation,
    /// H×2, row-major.
    pub w1: Vec<f32>,
    /// Hidden biases, H.
    pub b1: Vec<f32>,
    /// 1×H.
    pub w2: Vec<f32>,
    /// Output bias.
    pub b2: f32,
}

impl XorParams {
    /// PyTorch's `nn.Linear` initialisation: weights and biases U(−1/√fan_in, 1/√fan_in).
    pub fn init(hidden: usize, activation: Activation, seed: u64) -> XorParams {
        let mut rng = SeededRng::seed_from_u64(seed);
        let mut uniform = |fan_in: usize, n: usize| -> Vec<f32> {
            let mut values = vec![0.0; n];
            crate::ops::cpu::linear_init(&mut values, fan_in, &mut rng);
            values
        };
        let w1 = uniform(2, 2 * hidden);
        let b1 = uniform(2, hidden);
        let w2 = uniform(hidden, hidden);
        let b2 = uniform(hidden, 1)[0];
        XorParams { activation, w1, b1, w2, b2 }
    }

    /// Number of hidden units H.
    pub fn hidden(&self) -> usize {
        self.b1.len()
    }

    /// Named tensors in file order, with their shapes.
    pub fn tensors(&self) -> [(&'static str, Vec<f32>, Vec<usize>); 4] {
        let h = self.hidden();
        [
            ("w1", self.w1.clone(), vec![h, 2]),
            ("b1", self.b1.clone(), vec![h]),
            ("w2", self.w2.clone(), vec![1, h]),
            ("b2", vec![self.b2], vec![1]),
        ]
    }

    /// Whether every parameter is finite.
    pub fn all_finite(&self) -> bool {
        self.w1.iter().chain(&self.b1).chain(&self.w2).all(|x| x.is_finite()) && self.b2.is_finite()
    }
}

/// The model's output for one input.
pub fn predict(p: &XorParams, x: [f32; 2]) -> f32 {
    let mut y = p.b2;
    for j in 0..p.hidden() {
        let z = p.w1[2 * j] * x[0] + p.w1[2 * j + 1] * x[1] + p.b1[j];
        y += p.w2[j] * p.activation.apply(z);
    }
    y
}

/// Gradients of the mean squared error over the four points, in the parameters' layout.
#[derive(Clone, Debug, PartialEq)]
pub struct XorGrads {
    /// Gradient of the hidden weights, H×2 row-major.
    pub w1: Vec<f32>,
    /// Gradient of the hidden biases, H.
    pub b1: Vec<f32>,
    /// Gradient of the output weights, 1×H.
    pub w2: Vec<f32>,
    /// Gradient of the output bias.
    pub b2: f32,
}

/// The loss and its gradients at `p`.
pub fn loss_and_grads(p: &XorParams) -> (f32, XorGrads) {
    loss_and_grads_summed(p, false)
}

/// The same math, or with `perturbed` a probe of how far rounding-sized differences move a whole run:
/// every sum over hidden units and points in the opposite order, and each activation off by a relative
/// 1e-6 (up for even units, down for odd ones), several times what a different summation order or `exp`
/// implementation changes at each step.
pub fn loss_and_grads_summed(p: &XorParams, perturbed: bool) -> (f32, XorGrads) {
    let h = p.hidden();
    let mut z = vec![[0f32; 4]; h];
    let mut a = vec![[0f32; 4]; h];
    let mut y = [p.b2; 4];
    let units: Vec<usize> = if perturbed { (0..h).rev().collect() } else { (0..h).collect() };
    let points: Vec<usize> = if perturbed { vec![3, 2, 1, 0] } else { vec![0, 1, 2, 3] };
    for &j in &units {
        for &k in &points {
            let x = INPUTS[k];
            z[j][k] = p.w1[2 * j] * x[0] + p.w1[2 * j + 1] * x[1] + p.b1[j];
            a[j][k] = p.activation.apply(z[j][k]);
            if perturbed {
                a[j][k] *= if j % 2 == 0 { 1.0 + 1e-6 } else { 1.0 - 1e-6 };
            }
            y[k] += p.w2[j] * a[j][k];
        }
    }
    // Each point's (y − t)² and ∂loss/∂y = 2(y − t)/4.
    let errors: [(f32, f32); 4] = std::array::from_fn(|k| squared_error(y[k], TARGETS[k], 0.5));
    let dy = errors.map(|(_, dy)| dy);
    let loss = errors.iter().map(|(e, _)| e).sum::<f32>() / 4.0;
    let mut g =
        XorGrads { w1: vec![0.0; 2 * h], b1: vec![0.0; h], w2: vec![0.0; h], b2: points.iter().map(|&k| dy[k]).sum() };
    for j in 0..h {
        for &k in &points {
            let x = INPUTS[k];
            g.w2[j] += dy[k] * a[j][k];
            let dz = dy[k] * p.w2[j] * p.activation.derivative(z[j][k], a[j][k]);
            g.w1[2 * j] += dz * x[0];
            g.w1[2 * j + 1] += dz * x[1];
            g.b1[j] += dz;
        }
    }
    (loss, g)
}

/// One SGD step; returns the loss before it.
pub fn sgd_step(p: &mut XorParams, lr: f32) -> f32 {
    sgd_step_summed(p, lr, false)
}

/// `sgd_step` with `loss_and_grads_summed(p, perturbed)`.
pub fn sgd_step_summed(p: &mut XorParams, lr: f32, perturbed: bool) -> f32 {
    let (loss, g) = loss_and_grads_summed(p, perturbed);
    for (w, g) in p.w1.iter_mut().zip(&g.w1) {
        *w -= lr * g;
    }
    for (b, g) in p.b1.iter_mut().zip(&g.b1) {
        *b -= lr * g;
    }
    for (w, g) in p.w2.iter_mut().zip(&g.w2) {
        *w -= lr * g;
    }
    p.b2 -= lr * g.b2;
    loss
}

/// One SGD step per entry of `rates`, epoch k at learning rate `rates[k]`; returns the loss of every
/// `report_every`-th epoch (epochs 0, k, 2k, …), each taken before that epoch's update, as the kernel
/// records them.
pub fn train(p: &mut XorParams, rates: &[f32], report_every: usize) -> Vec<f32> {
    let mut losses = Vec::with_capacity(rates.len().div_ceil(report_every.max(1)));
    for (epoch, &lr) in rates.iter().enumerate() {
        let loss = sgd_step(p, lr);
        if epoch % report_every.max(1) == 0 {
            losses.push(loss);
        }
    }
    losses
}
