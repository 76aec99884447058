//! micrograd's demo written with `textnet::nn`: a 2-16-16-1 ReLU MLP trained by full-batch SGD on 100
//! points of two interleaving half-moons, with the SVM max-margin loss mean(relu(1 − y·score)) plus
//! 1e-4·Σθ² (L2), at rate 1 − 0.9·k/100 in step k, for 100 steps. The points come from a seeded
//! generator of the same construction as scikit-learn's `make_moons` (noise 0.1), and the weights are
//! drawn as micrograd's neurons draw theirs (U(−1, 1), bias 0).
//!
//! Trains once in f64 and once in f32 from the same start and prints both losses of each step. Writes
//! the points, the initial weights and both loss curves as JSON, so that micrograd's own scalar engine
//! can train from the same start (`scripts/micrograd_compare.py`) and the curves can be compared.
//!
//! usage: cargo run --release --example micrograd_moons -- [out.json (default target/micrograd_moons.json)]

use anyhow::Result;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Normal};
use textnet::nn::{Linear, Module, Optimizer, Tensor, prefixed};
use textnet::ops::cpu::{Real, SeededRng};

const POINTS: usize = 100;
const NOISE: f64 = 0.1;
const WIDTHS: [usize; 4] = [2, 16, 16, 1];
const STEPS: usize = 100;
const L2: f64 = 1e-4;
const SEED: u64 = 1337;

/// Two interleaving half circles, shuffled, with Gaussian noise: the outer one's points
/// (cos t, sin t) labelled −1, the inner one's (1 − cos t, 1 − sin t − ½) labelled 1, t evenly spaced
/// over [0, π] in each.
fn moons(count: usize, noise: f64, rng: &mut SeededRng) -> (Vec<[f64; 2]>, Vec<f64>) {
    let (outer, inner) = (count / 2, count - count / 2);
    let angle = |i: usize, n: usize| if n > 1 { std::f64::consts::PI * i as f64 / (n - 1) as f64 } else { 0.0 };
    let mut points: Vec<([f64; 2], f64)> = (0..outer)
        .map(|i| ([angle(i, outer).cos(), angle(i, outer).sin()], -1.0))
        .chain((0..inner).map(|i| ([1.0 - angle(i, inner).cos(), 0.5 - angle(i, inner).sin()], 1.0)))
        .collect();
    for i in (1..points.len()).rev() {
        points.swap(i, rng.random_range(0..=i));
    }
    let normal = Normal::new(0.0, noise).expect("a positive standard deviation");
    points.iter_mut().for_each(|(p, _)| p.iter_mut().for_each(|v| *v += normal.sample(rng)));
    points.into_iter().unzip()
}

/// One layer's weights [out][in] and biases, as micrograd's neurons draw them: each weight U(−1, 1),
/// neuron after neuron, each bias 0.
struct LayerStart {
    weight: Vec<Vec<f64>>,
    bias: Vec<f64>,
}

fn micrograd_start(rng: &mut SeededRng) -> Vec<LayerStart> {
    WIDTHS
        .windows(2)
        .map(|w| LayerStart {
            weight: (0..w[1]).map(|_| (0..w[0]).map(|_| rng.random_range(-1.0..1.0)).collect()).collect(),
            bias: vec![0.0; w[1]],
        })
        .collect()
}

/// The MLP: ReLU after every layer but the last.
struct Mlp<F: Real> {
    layers: Vec<Linear<F>>,
}

impl<F: Real> Module<F> for Mlp<F> {
    fn forward(&self, x: &Tensor<F>) -> textnet::nn::Result<Tensor<F>> {
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.relu()?;
            }
        }
        Ok(h)
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<F>)> {
        let named = |(i, layer): (usize, &Linear<F>)| prefixed(&format!("layers.{i}"), layer.named_parameters());
        self.layers.iter().enumerate().flat_map(named).collect()
    }
}

fn cast<F: Real>(values: &[f64]) -> Vec<F> {
    values.iter().map(|&v| F::from(v).expect("an f64 is every float")).collect()
}

/// micrograd's demo in F: the loss and accuracy of each step.
fn train<F: Real>(points: &[[f64; 2]], labels: &[f64], start: &[LayerStart]) -> Result<Vec<(f64, f64)>> {
    let layers = start
        .iter()
        .map(|l| {
            let weight = Tensor::from_vec(cast(&l.weight.concat()), &[l.bias.len(), l.weight[0].len()])?;
            Linear::from_parameters(weight, Some(Tensor::from_vec(cast(&l.bias), &[l.bias.len()])?))
        })
        .collect::<textnet::nn::Result<Vec<_>>>()?;
    let model = Mlp { layers };
    let x = Tensor::from_vec(cast(&points.concat()), &[points.len(), 2])?;
    let y = Tensor::from_vec(cast(labels), &[labels.len(), 1])?;
    let mut sgd = Optimizer::sgd(model.parameters(), 1.0)?;
    let mut curve = Vec::with_capacity(STEPS);
    for k in 0..STEPS {
        let scores = model.forward(&x)?;
        let data_loss = y.mul(&scores)?.neg()?.add_scalar(F::one())?.relu()?.mean_all()?;
        let squares =
            model.parameters().iter().map(|p| p.mul(p).and_then(|s| s.sum_all())).collect::<Result<Vec<_>, _>>()?;
        let reg_loss = squares.iter().skip(1).try_fold(squares[0].clone(), |sum, s| sum.add(s))?;
        let loss = data_loss.add(&reg_loss.mul_scalar(cast::<F>(&[L2])[0])?)?;
        let right = scores.to_vec().iter().zip(labels).filter(|(s, y)| (**s > F::zero()) == (**y > 0.0)).count();
        sgd.zero_grad();
        loss.backward()?;
        sgd.set_lr((1.0 - 0.9 * k as f64 / STEPS as f64) as f32)?;
        sgd.step()?;
        curve.push((loss.item()?.to_f64().unwrap_or(f64::NAN), right as f64 / labels.len() as f64));
    }
    Ok(curve)
}

fn main() -> Result<()> {
    let out = std::env::args().nth(1).unwrap_or_else(|| "target/micrograd_moons.json".into());
    let mut rng = SeededRng::seed_from_u64(SEED);
    let (points, labels) = moons(POINTS, NOISE, &mut rng);
    let start = micrograd_start(&mut rng);
    let (double, single) = (train::<f64>(&points, &labels, &start)?, train::<f32>(&points, &labels, &start)?);
    for (k, ((loss, accuracy), (loss_f32, _))) in double.iter().zip(&single).enumerate() {
        println!("step {k} loss {loss:.9} (f32 {loss_f32:.9}), accuracy {:.0}%", accuracy * 100.0);
    }
    let json = serde_json::json!({
        "points": points,
        "labels": labels,
        "layers": start.iter().map(|l| serde_json::json!({ "weight": l.weight, "bias": l.bias })).collect::<Vec<_>>(),
        "l2": L2,
        "steps": STEPS,
        "loss_f64": double.iter().map(|(l, _)| l).collect::<Vec<_>>(),
        "loss_f32": single.iter().map(|(l, _)| l).collect::<Vec<_>>(),
    });
    std::fs::write(&out, serde_json::to_string(&json)?)?;
    println!("wrote the points, the initial weights and both loss curves to {out}");
    Ok(())
}
