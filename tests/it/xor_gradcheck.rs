//! The XOR CPU reference's analytic gradients against central finite differences of the loss, for every
//! parameter, with each activation (ReLU at a point where no perturbation crosses the kink).

use crate::common::relative;
use textnet::ops::activations::Activation;
use textnet::xor::model::{INPUTS, TARGETS, XorParams, loss_and_grads, predict, train};

const EPS: f32 = 1e-2;

/// The parameters as one flat vector (w1, b1, w2, b2) and back.
fn flat(p: &XorParams) -> Vec<f32> {
    p.w1.iter().chain(&p.b1).chain(&p.w2).copied().chain([p.b2]).collect()
}

fn unflat(p: &XorParams, v: &[f32]) -> XorParams {
    let h = p.hidden();
    XorParams {
        activation: p.activation,
        w1: v[..2 * h].to_vec(),
        b1: v[2 * h..3 * h].to_vec(),
        w2: v[3 * h..4 * h].to_vec(),
        b2: v[4 * h],
    }
}

#[test]
fn every_gradient_matches_finite_differences() {
    for activation in [Activation::Sigmoid, Activation::Tanh, Activation::Relu] {
        // For ReLU, the first seed whose pre-activations all stay clear of the perturbation's reach.
        let clear = |p: &XorParams| {
            (0..p.hidden()).all(|j| {
                INPUTS.iter().all(|x| (p.w1[2 * j] * x[0] + p.w1[2 * j + 1] * x[1] + p.b1[j]).abs() > 3.0 * EPS)
            })
        };
        let p = (3..)
            .map(|seed| XorParams::init(5, activation, seed))
            .find(|p| activation != Activation::Relu || clear(p))
            .unwrap();
        let (_, g) = loss_and_grads(&p);
        let analytic: Vec<f64> = g.w1.iter().chain(&g.b1).chain(&g.w2).copied().chain([g.b2]).map(f64::from).collect();
        let base = flat(&p);
        let numeric: Vec<f64> = (0..base.len())
            .map(|i| {
                let at = |delta: f32| {
                    let mut v = base.clone();
                    v[i] += delta;
                    loss_and_grads(&unflat(&p, &v)).0 as f64
                };
                (at(EPS) - at(-EPS)) / (2.0 * EPS as f64)
            })
            .collect();
        let err = relative(&numeric, &analytic);
        assert!(err < 1e-3, "{activation:?}: relative error {err:.2e}\nanalytic {analytic:?}\nnumeric  {numeric:?}");
    }
}

#[test]
fn a_wrong_gradient_fails_the_comparison() {
    // The comparison above must see a real error: one gradient entry off by 5 % fails it.
    let p = XorParams::init(5, Activation::Sigmoid, 3);
    let (_, g) = loss_and_grads(&p);
    let analytic: Vec<f64> = g.w1.iter().chain(&g.b1).chain(&g.w2).copied().chain([g.b2]).map(f64::from).collect();
    let mut wrong = analytic.clone();
    let largest = (0..wrong.len()).max_by(|&a, &b| wrong[a].abs().total_cmp(&wrong[b].abs())).unwrap();
    wrong[largest] *= 1.05;
    assert!(relative(&wrong, &analytic) > 1e-3);
}

#[test]
fn the_default_run_learns_xor() {
    // Linear(2,4) → sigmoid → Linear(4,1), lr 0.5, 5000 epochs: every point on the right side of 0.5.
    for seed in 0..5 {
        let mut p = XorParams::init(4, Activation::Sigmoid, seed);
        let losses = train(&mut p, &[0.5; 5000], 500);
        assert_eq!(losses.len(), 10);
        assert!(losses.last().unwrap() < &0.01, "seed {seed}: losses {losses:?}");
        for (x, t) in INPUTS.iter().zip(TARGETS) {
            assert!((predict(&p, *x) - t).abs() < 0.5, "seed {seed}: {x:?} → {}", predict(&p, *x));
        }
    }
}
