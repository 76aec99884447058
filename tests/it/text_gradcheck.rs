//! The CPU reference's analytic gradients against central finite differences of the mean loss, for
//! every parameter tensor, on a batch that repeats a token within one context and uses `<unk>`.

use textnet::text::model::{Activations, TextParams, TextShape, backward, forward, sgd_update, train_step};

const SHAPE: TextShape = TextShape { vocab: 7, embed: 5, hidden: 6, context: 3 };
const CONTEXTS: [&[u32]; 3] = [&[1, 2, 3], &[4, 4, 5], &[0, 6, 2]];
const TARGETS: [u32; 3] = [3, 1, 6];
const EPS: f32 = 1e-2;

fn params() -> TextParams {
    let mut p = TextParams::init(SHAPE, 11);
    // Non-zero biases, so their gradients meet a generic point too.
    p.b1.iter_mut().enumerate().for_each(|(i, b)| *b = 0.05 * (i as f32 - 2.5));
    p.b2.iter_mut().enumerate().for_each(|(i, b)| *b = 0.1 * (i as f32 - 3.0));
    p
}

fn mean_loss(p: &TextParams) -> f64 {
    let mut a = Activations::new(p.shape);
    let sum: f64 = CONTEXTS
        .iter()
        .zip(TARGETS)
        .map(|(ctx, t)| {
            forward(p, ctx, &mut a);
            a.loss(t) as f64
        })
        .sum();
    sum / CONTEXTS.len() as f64
}

/// Which hidden units are active for each sample: finite differences across a ReLU kink are not
/// derivatives, so entries whose perturbation changes this are skipped.
fn relu_pattern(p: &TextParams) -> Vec<bool> {
    let mut a = Activations::new(p.shape);
    CONTEXTS
        .iter()
        .flat_map(|ctx| {
            forward(p, ctx, &mut a);
            a.z1.iter().map(|&z| z > 0.0).collect::<Vec<_>>()
        })
        .collect()
}

fn tensor_mut<'a>(p: &'a mut TextParams, name: &str) -> &'a mut Vec<f32> {
    match name {
        "embedding" => &mut p.embedding,
        "w1" => &mut p.w1,
        "b1" => &mut p.b1,
        "w2" => &mut p.w2,
        "b2" => &mut p.b2,
        _ => unreachable!(),
    }
}

fn norm(v: impl Iterator<Item = f64>) -> f64 {
    v.map(|x| x * x).sum::<f64>().sqrt()
}

#[test]
fn analytic_gradients_match_finite_differences() {
    let p = params();
    let (g, loss_sum) = backward(&p, &CONTEXTS, &TARGETS);
    assert!((loss_sum / 3.0 - mean_loss(&p)).abs() < 1e-5);
    let embedding = g.embedding_dense(SHAPE, &CONTEXTS);
    let pattern = relu_pattern(&p);
    for (name, analytic) in [("embedding", &embedding), ("w1", &g.w1), ("b1", &g.b1), ("w2", &g.w2), ("b2", &g.b2)] {
        let mut probe = p.clone();
        let (mut checked, mut skipped) = (Vec::new(), 0);
        for (i, &a) in analytic.iter().enumerate() {
            let original = tensor_mut(&mut probe, name)[i];
            tensor_mut(&mut probe, name)[i] = original + EPS;
            let (plus, plus_pattern) = (mean_loss(&probe), relu_pattern(&probe));
            tensor_mut(&mut probe, name)[i] = original - EPS;
            let (minus, minus_pattern) = (mean_loss(&probe), relu_pattern(&probe));
            tensor_mut(&mut probe, name)[i] = original;
            if plus_pattern != pattern || minus_pattern != pattern {
                skipped += 1;
                continue;
            }
            checked.push((a as f64, (plus - minus) / (2.0 * EPS as f64)));
        }
        assert!(skipped * 5 <= analytic.len(), "{name}: {skipped} of {} entries sit on a ReLU kink", analytic.len());
        let diff = norm(checked.iter().map(|(a, n)| a - n));
        let scale = norm(checked.iter().map(|(a, _)| *a)).max(norm(checked.iter().map(|(_, n)| *n)));
        assert!(scale > 1e-4, "{name}: gradient vanishes ({scale}), the check would prove nothing");
        let rel = diff / scale;
        assert!(rel < 1e-2, "{name}: relative error {rel:.2e} over {} entries", checked.len());
    }
}

#[test]
fn every_token_in_the_contexts_gets_an_embedding_gradient() {
    let p = params();
    let (g, _) = backward(&p, &CONTEXTS, &TARGETS);
    let dense = g.embedding_dense(SHAPE, &CONTEXTS);
    let row_norm = |t: usize| norm(dense[t * SHAPE.embed..][..SHAPE.embed].iter().map(|&x| x as f64));
    for t in 0..SHAPE.vocab {
        assert!(row_norm(t) > 0.0, "token {t} appears in a context but its row has no gradient");
    }
}

#[test]
fn sgd_step_moves_every_parameter_against_its_gradient() {
    let p = params();
    let lr = 0.3;
    let (g, _) = backward(&p, &CONTEXTS, &TARGETS);
    let mut expected = p.clone();
    sgd_update(&mut expected, &g, &CONTEXTS, lr);
    let dense = g.embedding_dense(SHAPE, &CONTEXTS);
    for (i, (&new, &old)) in expected.embedding.iter().zip(&p.embedding).enumerate() {
        assert!((new - (old - lr * dense[i])).abs() < 1e-6, "embedding[{i}]");
    }

    // train_step reads contexts and targets out of a token stream by target position.
    let stream = [1, 2, 3, 3, 4, 4, 5, 1, 0, 6, 2, 6];
    let mut stepped = p.clone();
    let loss = train_step(&mut stepped, &stream, &[3, 7, 11], lr);
    assert!((loss / 3.0 - mean_loss(&p)).abs() < 1e-5);
    assert_eq!(stepped, expected);
    assert!(mean_loss(&stepped) < mean_loss(&p));
}
