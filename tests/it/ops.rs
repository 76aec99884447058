//! The shared operations' CPU twins (`textnet::ops`): values computed by hand, and every backward pass
//! against central finite differences of its forward pass in f64 (each check also fails on a gradient
//! that is wrong in one element).

use crate::common::relative;
use rand::{RngExt, SeedableRng};
use textnet::ops::activations::{gelu, gelu_grad};
use textnet::ops::attention::{AttentionDropout, attention, attention_backward};
use textnet::ops::cpu::SeededRng;
use textnet::ops::dropout::{DropoutKey, Mask};
use textnet::ops::layernorm::{layer_norm, layer_norm_backward, layer_norm_rows};
use textnet::ops::losses::softmax_xent;

fn assert_close(got: f64, want: f64) {
    assert!((got - want).abs() < 1e-12, "{got} is not {want}");
}

#[test]
fn layer_norm_softmax_and_gelu_at_hand_computed_values() {
    // x = [1, 2, 3, 4]: μ 2.5, σ² 1.25, r = 1/√1.25001.
    let mut out = [0.0; 4];
    let (mean, rstd) = layer_norm(&[1.0, 2.0, 3.0, 4.0], &[1.0; 4], &[0.0; 4], &mut out);
    assert_close(mean, 2.5);
    assert_close(rstd, 0.894423613312618);
    for (o, want) in out.iter().zip([-1.3416354199689269, -0.447211806656309, 0.447211806656309, 1.3416354199689269]) {
        assert_close(*o, want);
    }
    // x = [0.5, −1.5, 2], w 2, b 1: μ 1/3, σ² 2.0556.
    let mut out = [0.0; 3];
    layer_norm(&[0.5, -1.5, 2.0], &[2.0; 3], &[1.0; 3], &mut out);
    for (o, want) in out.iter().zip([1.2324947119606486, -1.557441831567135, 3.3249471196064864]) {
        assert_close(*o, want);
    }
    // logits [1, 2, 3]: log Σ eˡ = 3.40760596444438.
    let mut d = [0.0; 3];
    assert_close(softmax_xent(&[1.0, 2.0, 3.0], 0, &mut d), 2.40760596444438);
    for (g, want) in d.iter().zip([0.09003057317038048 - 1.0, 0.2447284710547977, 0.665240955774822]) {
        assert_close(*g, want);
    }
    assert_close(softmax_xent(&[1.0, 2.0, 3.0], 2, &mut d), 0.40760596444438013);
    // Large logits do not overflow.
    assert_close(softmax_xent(&[1000.0, 1001.0, 1002.0], 2, &mut d), 0.40760596444438013);
    for (u, want) in [
        (1.0, 0.8411919906082768),
        (-1.0, -0.15880800939172324),
        (2.0, 1.954597694087775),
        (-3.0, -0.0036373920817729943),
        (0.0, 0.0),
    ] {
        assert_close(gelu(u), want);
    }
    for (u, want) in [(1.0, 1.0829640838457826), (-1.0, -0.08296408384578255), (0.5, 0.8673699035346424), (0.0, 0.5)] {
        assert_close(gelu_grad(u), want);
        assert!((gelu_grad(u) - (gelu(u + 1e-6) - gelu(u - 1e-6)) / 2e-6).abs() < 1e-9);
    }
    // f32 agrees.
    assert!((gelu(1.0f32) - 0.841_192).abs() < 1e-6);
}

fn random(n: usize, rng: &mut SeededRng) -> Vec<f64> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// Central differences of `loss` at `x`, one element at a time.
fn numeric(x: &[f64], loss: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let h = 1e-6;
    (0..x.len())
        .map(|i| {
            let (mut up, mut down) = (x.to_vec(), x.to_vec());
            up[i] += h;
            down[i] -= h;
            (loss(&up) - loss(&down)) / (2.0 * h)
        })
        .collect()
}

/// The check itself: agreement within 1e-6, and a one-element error in the analytic gradient caught.
fn matches(analytic: &[f64], numeric: &[f64], what: &str) {
    assert!(relative(analytic, numeric) < 1e-6, "{what}: {:.3e}", relative(analytic, numeric));
    let mut wrong = analytic.to_vec();
    wrong[analytic.len() / 2] += 0.01 * (1.0 + wrong[analytic.len() / 2].abs());
    assert!(relative(&wrong, numeric) > 1e-4, "{what}: a wrong gradient passes");
}

#[test]
fn softmax_xent_gradient_matches_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(1);
    let logits = random(7, &mut rng);
    let mut d = vec![0.0; 7];
    softmax_xent(&logits, 3, &mut d);
    let num = numeric(&logits, |l| softmax_xent(l, 3, &mut [0.0; 7]));
    matches(&d, &num, "d logits");
}

#[test]
fn layer_norm_gradients_match_finite_differences() {
    let (rows, c) = (3, 8);
    let mut rng = SeededRng::seed_from_u64(2);
    let (x, w, b, probe) =
        (random(rows * c, &mut rng), random(c, &mut rng), random(c, &mut rng), random(rows * c, &mut rng));
    // loss = Σ probe · LN(x; w, b)
    let loss = |x: &[f64], w: &[f64], b: &[f64]| {
        let (out, _, _) = layer_norm_rows(x, w, b);
        out.iter().zip(&probe).map(|(o, p)| o * p).sum::<f64>()
    };
    let (_, mean, rstd) = layer_norm_rows(&x, &w, &b);
    let (mut gw, mut gb) = (vec![0.0; c], vec![0.0; c]);
    let dx = layer_norm_backward(&x, &mean, &rstd, &w, &probe, &mut gw, &mut gb);
    matches(&dx, &numeric(&x, |x| loss(x, &w, &b)), "d x");
    matches(&gw, &numeric(&w, |w| loss(&x, w, &b)), "d w");
    matches(&gb, &numeric(&b, |b| loss(&x, &w, b)), "d b");
}

#[test]
fn attention_gradient_matches_finite_differences() {
    let (n, heads, hs) = (5, 2, 3);
    let mut rng = SeededRng::seed_from_u64(3);
    let qkv = random(n * 3 * heads * hs, &mut rng);
    let probe = random(n * heads * hs, &mut rng);
    // With dropout too: a block of 7 (longer than the sequence) numbers the mask's elements.
    let mask = Mask::new(Some(DropoutKey { seed: 3, step: 2 }), 1, 0.3);
    let dropped = AttentionDropout { mask: mask.unwrap(), first: 2 * heads * 7 * 7, block: 7 };
    for drop in [None, Some(&dropped)] {
        let loss =
            |qkv: &[f64]| attention(qkv, n, heads, hs, drop).0.iter().zip(&probe).map(|(y, p)| y * p).sum::<f64>();
        let (_, att) = attention(&qkv, n, heads, hs, drop);
        let (_, _, d_qkv) = attention_backward(&qkv, &att, &probe, n, heads, hs, drop);
        matches(&d_qkv, &numeric(&qkv, loss), "d qkv");
    }
    let (y, _) = attention(&qkv, n, heads, hs, None);
    assert_ne!(y, attention(&qkv, n, heads, hs, Some(&dropped)).0, "dropout changed nothing");
}

#[test]
fn attention_is_causal() {
    let (n, heads, hs) = (4, 1, 2);
    let mut rng = SeededRng::seed_from_u64(4);
    let qkv = random(n * 3 * heads * hs, &mut rng);
    let (y, _) = attention(&qkv, n, heads, hs, None);
    let mut later = qkv.clone();
    later[(n - 1) * 3 * hs..].iter_mut().for_each(|v| *v += 1.0);
    let (y_later, _) = attention(&later, n, heads, hs, None);
    assert_eq!(y[..(n - 1) * hs], y_later[..(n - 1) * hs], "a later position changed an earlier output");
    assert_ne!(y[(n - 1) * hs..], y_later[(n - 1) * hs..]);
}

#[test]
fn gelu_gradient_matches_finite_differences() {
    let u = random(9, &mut SeededRng::seed_from_u64(5));
    let analytic: Vec<f64> = u.iter().map(|&u| gelu_grad(u)).collect();
    let numeric: Vec<f64> = u.iter().map(|&u| (gelu(u + 1e-6) - gelu(u - 1e-6)) / 2e-6).collect();
    matches(&analytic, &numeric, "gelu'");
}
