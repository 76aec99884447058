//! The finite-difference check every `nn` op's gradient is held to: L = Σ c ⊙ op(inputs) for fixed random
//! c (given to `backward_with` as the output's gradient, so each output element weighs in with its own
//! factor), its analytic gradient with respect to every input element against central differences of L,
//! all in f64; and `fails_with`, the check of a bad input's one-line error.

use super::relative;
use rand::{RngExt, SeedableRng};
use textnet::nn::{self, Tensor, no_grad};
use textnet::ops::cpu::SeededRng;

pub const H: f64 = 1e-6;
pub const TOLERANCE: f64 = 1e-7;

pub type Op<'a> = dyn Fn(&[Tensor<f64>]) -> nn::Result<Tensor<f64>> + 'a;

pub fn values(rng: &mut SeededRng, count: usize, low: f64, high: f64) -> Vec<f64> {
    (0..count).map(|_| rng.random_range(low..high)).collect()
}

/// An input of `shape` drawn from U(low, high), each element at least `clear` from 0 (off a kink or a pole).
pub fn input(rng: &mut SeededRng, shape: &[usize], low: f64, high: f64, clear: f64) -> (Vec<f64>, Vec<usize>) {
    let count = shape.iter().product();
    let values = (0..count)
        .map(|_| {
            loop {
                let v = rng.random_range(low..high);
                if v.abs() >= clear {
                    break v;
                }
            }
        })
        .collect();
    (values, shape.to_vec())
}

/// The analytic gradient of L = Σ c ⊙ op(inputs) with respect to each input, and central differences of L.
pub fn gradients(inputs: &[(Vec<f64>, Vec<usize>)], op: &Op<'_>, seed: u64) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let params: Vec<Tensor<f64>> = inputs.iter().map(|(v, s)| Tensor::parameter(v.clone(), s).unwrap()).collect();
    let out = op(&params).unwrap();
    let mut rng = SeededRng::seed_from_u64(seed);
    let c = Tensor::from_vec(values(&mut rng, out.numel(), -1.0, 1.0), out.shape()).unwrap();
    out.backward_with(Some(&c), false).unwrap();
    let analytic = params.iter().map(|p| p.grad().map_or(vec![0.0; p.numel()], |g| g.to_vec())).collect();
    let _off = no_grad();
    let loss = |values: &[Vec<f64>]| {
        let tensors: Vec<Tensor<f64>> =
            values.iter().zip(inputs).map(|(v, (_, s))| Tensor::from_slice(v, s).unwrap()).collect();
        let out = op(&tensors).unwrap().to_vec();
        out.iter().zip(c.to_vec()).map(|(y, c)| y * c).sum::<f64>()
    };
    let mut moved: Vec<Vec<f64>> = inputs.iter().map(|(v, _)| v.clone()).collect();
    let numeric = (0..inputs.len())
        .map(|i| {
            (0..inputs[i].0.len())
                .map(|j| {
                    moved[i][j] = inputs[i].0[j] + H;
                    let up = loss(&moved);
                    moved[i][j] = inputs[i].0[j] - H;
                    let down = loss(&moved);
                    moved[i][j] = inputs[i].0[j];
                    (up - down) / (2.0 * H)
                })
                .collect()
        })
        .collect();
    (analytic, numeric)
}

/// Every input's analytic gradient within `TOLERANCE` (relative) of its finite differences.
pub fn check(name: &str, inputs: &[(Vec<f64>, Vec<usize>)], op: &Op<'_>) {
    let (analytic, numeric) = gradients(inputs, op, 7);
    for (i, (a, n)) in analytic.iter().zip(&numeric).enumerate() {
        let shapes: Vec<&Vec<usize>> = inputs.iter().map(|(_, s)| s).collect();
        let err = if n.iter().all(|v| *v == 0.0) { a.iter().map(|v| v.abs()).sum() } else { relative(a, n) };
        assert!(
            err < TOLERANCE,
            "{name} {shapes:?}, input {i}: relative error {err:.2e}\nanalytic {a:?}\nnumeric  {n:?}"
        );
    }
}

/// `result`'s error as its one line, which must be `expected` exactly.
pub fn fails_with<T: std::fmt::Debug>(result: nn::Result<T>, expected: &str) {
    let err = result.unwrap_err().to_string();
    assert_eq!(err, expected);
    assert_eq!(err.lines().count(), 1);
}
