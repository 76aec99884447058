//! The MLP's forward pass and its layout as fit's network, the optimizers against hand-computed steps, and
//! the model file round trip.

use rand::{RngExt, SeedableRng};
use textnet::mnist::idx::Split;
use textnet::mnist::model::{self, Activation, MlpParams, MlpShape};
use textnet::ops::cpu::SeededRng;
use textnet::ops::optim::{OptimConfig, OptimKind, Optimizer, clip_scale, global_norm};

/// `n` random samples of `inputs` values in [0,1], labels below `classes`.
fn random_split(n: usize, inputs: usize, classes: usize, rng: &mut SeededRng) -> Split {
    Split {
        images: (0..n * inputs).map(|_| rng.random::<f32>()).collect(),
        labels: (0..n).map(|_| rng.random_range(0..classes as u8)).collect(),
        pixels: inputs,
    }
}

/// The MLP trains as fit's network (whose gradients fit's finite-difference checks cover): that network,
/// given the MLP's flat parameters, computes the MLP's logits, for every activation.
#[test]
fn the_fit_network_reads_the_mlp_layout() {
    for activation in Activation::ALL {
        let shape = MlpShape { inputs: 7, hidden: 6, classes: 4, activation };
        let mut rng = SeededRng::seed_from_u64(7);
        let data = random_split(5, shape.inputs, shape.classes, &mut rng);
        let mut p = MlpParams::init(shape, 11);
        p.flat.iter_mut().for_each(|x| *x = *x * 2.0 + rng.random_range(-0.3..0.3));
        let net = textnet::mnist::mlp::network(shape).unwrap();
        assert_eq!(net.param_count, shape.param_count());
        let trace = textnet::nn::stack::model::forward(&net, &p.flat, &data.images, 5, None);
        let fit_logits = trace.values.last().unwrap();
        for s in 0..5u32 {
            let want = model::logits(&p, data.image(s));
            for (got, want) in fit_logits[s as usize * 4..][..4].iter().zip(&want) {
                assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "{activation:?}: {got} vs {want}");
            }
        }
    }
}

#[test]
fn forward_matches_a_direct_evaluation() {
    let shape = MlpShape { inputs: 3, hidden: 2, classes: 3, activation: Activation::Tanh };
    let p = MlpParams {
        shape,
        flat: vec![0.1, -0.2, 0.3, 0.4, 0.5, -0.6, 0.05, -0.05, 1.0, -1.0, 0.5, 0.5, 2.0, 0.0, 0.1, 0.2, 0.3],
    };
    let data = Split { images: vec![1.0, 0.5, 0.25], labels: vec![2], pixels: 3 };
    let eval = textnet::mnist::mlp::evaluate(&p, &data).unwrap();
    let loss = eval.loss;
    let a = [(0.1f64 - 0.1 + 0.075 + 0.05).tanh(), (0.4f64 + 0.25 - 0.15 - 0.05).tanh()];
    let logits = [a[0] - a[1] + 0.1, 0.5 * a[0] + 0.5 * a[1] + 0.2, 2.0 * a[0] + 0.3];
    let lse = logits.iter().map(|l| l.exp()).sum::<f64>().ln();
    assert!((loss - (lse - logits[2])).abs() < 1e-6, "{loss}");
    assert_eq!(eval.confusion[2 * 3 + 2], 1, "predicted class 2");
    let logits_got = model::logits(&p, data.image(0));
    for (got, want) in logits_got.iter().zip(&logits) {
        assert!((*got as f64 - want).abs() < 1e-6);
    }
}

fn close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((*g as f64 - w).abs() < 1e-6, "got {got:?}, want {want:?}");
    }
}

/// Runs `config` from θ = [1, −2] over the gradients `grads`, checking θ after each step.
fn steps(config: OptimConfig, grads: &[[f32; 2]], want: &[[f64; 2]]) {
    let mut theta = vec![1.0f32, -2.0];
    let mut opt = Optimizer::new(config, 2);
    for (g, w) in grads.iter().zip(want) {
        opt.step(&mut theta, g);
        close(&theta, w);
    }
}

fn config(kind: OptimKind, lr: f32) -> OptimConfig {
    OptimConfig { lr, ..OptimConfig::new(kind) }
}

#[test]
fn sgd_steps() {
    let g = [0.5, -0.25];
    steps(config(OptimKind::Sgd, 0.1), &[g, g], &[[0.95, -1.975], [0.9, -1.95]]);
    // Weight decay 0.1: g' = g + 0.1·θ; step 1 g' = [0.6, −0.45], step 2 g' = [0.594, −0.4455].
    let wd = OptimConfig { weight_decay: 0.1, ..config(OptimKind::Sgd, 0.1) };
    steps(wd, &[g, g], &[[0.94, -1.955], [0.8806, -1.91045]]);
}

#[test]
fn momentum_steps() {
    // Constant g: the velocity goes g, 1.9·g, 2.71·g.
    let g = [0.5, -0.25];
    let mut c = config(OptimKind::Momentum, 0.1);
    c.momentum = 0.9;
    steps(c, &[g, g, g], &[[0.95, -1.975], [0.855, -1.9275], [0.7195, -1.85975]]);
}

#[test]
fn adam_steps() {
    // Step 1: m̂ = g, v̂ = g², so θ moves lr·sign(g). Steps 2 and 3 follow
    //   m = 0.9·m + 0.1·g, v = 0.999·v + 0.001·g², θ −= 0.1·(m/(1−0.9ᵗ)) / (√(v/(1−0.999ᵗ)) + 1e-8):
    //   t=2: m = [0.035, −0.0025],   v = [2.5975e-4, 1.024375e-4]
    //   t=3: m = [0.0615, 0.02775],  v = [3.4949025e-4, 1.923350625e-4]
    let grads = [[0.5, -0.25], [-0.1, 0.2], [0.3, 0.3]];
    let want = [[0.9, -1.9], [0.8488973957, -1.8941874995], [0.7824417742, -1.9346085776]];
    steps(config(OptimKind::Adam, 0.1), &grads, &want);
}

#[test]
fn clipping_scales_the_whole_gradient_before_weight_decay() {
    assert_eq!(global_norm(&[3.0, 4.0]), 5.0);
    assert_eq!(clip_scale(5.0, 1.0), 0.2);
    assert_eq!(clip_scale(5.0, 10.0), 1.0);
    assert_eq!(clip_scale(5.0, 0.0), 1.0);
    let g = [3.0f32, 4.0];
    // ‖g‖ = 5 clipped to 1: g = [0.6, 0.8]; θ = [1, −2] − 0.5·g.
    let clipped = OptimConfig { clip_norm: 1.0, ..config(OptimKind::Sgd, 0.5) };
    steps(clipped, &[g], &[[0.7, -2.4]]);
    // Under the limit nothing changes.
    let loose = OptimConfig { clip_norm: 6.0, ..config(OptimKind::Sgd, 0.5) };
    steps(loose, &[g], &[[-0.5, -4.0]]);
    // Decay is added after clipping: g' = [0.6 + 0.5·1, 0.8 + 0.5·(−2)] = [1.1, −0.2].
    let both = OptimConfig { clip_norm: 1.0, weight_decay: 0.5, ..config(OptimKind::Sgd, 0.1) };
    steps(both, &[g], &[[0.89, -1.98]]);
    // Adam with clipping: the first step is still lr·sign(g).
    let adam = OptimConfig { clip_norm: 1.0, ..config(OptimKind::Adam, 0.1) };
    steps(adam, &[g], &[[0.9, -2.1]]);
}

#[test]
fn bad_hyper_parameters_are_rejected() {
    let ok = OptimConfig::new(OptimKind::Adam);
    ok.validate().unwrap();
    for bad in [
        OptimConfig { lr: 0.0, ..ok },
        OptimConfig { lr: -1.0, ..ok },
        OptimConfig { lr: f32::NAN, ..ok },
        OptimConfig { lr: f32::INFINITY, ..ok },
        OptimConfig { momentum: 1.0, ..ok },
        OptimConfig { weight_decay: -0.1, ..ok },
        OptimConfig { clip_norm: -1.0, ..ok },
        OptimConfig { clip_norm: f32::NAN, ..ok },
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
}

#[test]
fn model_file_round_trips() {
    let shape = MlpShape { inputs: 784, hidden: 9, classes: 10, activation: Activation::Sigmoid };
    let p = MlpParams::init(shape, 3);
    let bytes = p.to_safetensors(&[("dataset", "fashion")]).unwrap();
    let (back, meta) = MlpParams::from_safetensors(&bytes).unwrap();
    assert_eq!(back, p);
    assert_eq!(meta["dataset"], "fashion");
    assert_eq!(meta["format"], "textnet-mnist");
    assert_eq!(meta["hidden"], "9");
    assert_eq!(meta["activation"], "sigmoid");
    let foreign = safetensors::serialize(Vec::<(&str, safetensors::tensor::TensorView)>::new(), None).unwrap();
    assert!(format!("{:#}", MlpParams::from_safetensors(&foreign).unwrap_err()).contains("not a textnet model file"));
    assert!(MlpParams::from_safetensors(b"garbage").is_err());
    let limit = (6.0f32 / (784 + 9) as f32).sqrt();
    let parts = p.parts();
    assert!(parts.w1.iter().all(|w| w.abs() <= limit) && parts.w1.iter().any(|w| w.abs() > limit / 2.0));
    assert!(parts.b1.iter().chain(parts.b2).all(|&b| b == 0.0));
}

#[test]
fn a_model_file_cannot_size_an_allocation_from_its_metadata() {
    let shape = MlpShape { inputs: 784, hidden: 9, classes: 10, activation: Activation::Relu };
    let bytes = MlpParams::init(shape, 3).to_safetensors(&[]).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for inputs in ["1000000000000", "18446744073709551615"] {
        let mut meta = header.metadata().clone().unwrap();
        meta.insert("inputs".into(), inputs.into());
        let forged = safetensors::serialize(file.iter(), Some(meta)).unwrap();
        let e = format!("{:#}", MlpParams::from_safetensors(&forged).unwrap_err());
        assert!(e.contains("tensor w1") && e.contains(inputs), "{e}");
    }
}
