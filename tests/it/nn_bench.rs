//! `bench nn`'s models, built and trained one step on the host: the MLP and the residual MLP have the
//! shapes and PyTorch names `scripts/nn_eager_torch.py` builds, and `train_step` (the step the bench times
//! eager and captured) lowers the loss on its batch and moves every parameter. Nothing here is timed.

use rand::SeedableRng;
use textnet::nn::bench::{BATCH, mlp, residual_mlp, train_step};
use textnet::nn::{Module, Optimizer, Sequential, Tensor};
use textnet::ops::cpu::SeededRng;

fn shapes(model: &Sequential) -> Vec<(String, Vec<usize>)> {
    model.named_parameters().into_iter().map(|(name, p)| (name, p.shape().to_vec())).collect()
}

fn named(list: &[(&str, &[usize])]) -> Vec<(String, Vec<usize>)> {
    list.iter().map(|(name, shape)| (name.to_string(), shape.to_vec())).collect()
}

#[test]
fn the_models_have_pytorchs_names_and_shapes() {
    let mut rng = SeededRng::seed_from_u64(2);
    let expected = named(&[("0.weight", &[128, 784]), ("0.bias", &[128]), ("2.weight", &[10, 128]), ("2.bias", &[10])]);
    assert_eq!(shapes(&mlp(&mut rng).unwrap()), expected);
    let block = |i: &str| {
        [
            (format!("{i}.f.0.weight"), vec![256, 256]),
            (format!("{i}.f.0.bias"), vec![256]),
            (format!("{i}.f.2.weight"), vec![256, 256]),
            (format!("{i}.f.2.bias"), vec![256]),
        ]
    };
    let mut expected = named(&[("0.weight", &[256, 784]), ("0.bias", &[256])]);
    expected.extend(block("1").into_iter().chain(block("2")));
    expected.extend(named(&[("3.weight", &[10, 256]), ("3.bias", &[10])]));
    assert_eq!(shapes(&residual_mlp(&mut rng).unwrap()), expected);
}

#[test]
fn a_residual_mlp_step_on_the_host_lowers_the_loss_and_moves_every_parameter() {
    let mut rng = SeededRng::seed_from_u64(3);
    let model = residual_mlp(&mut rng).unwrap();
    let x: Vec<f32> = (0..BATCH * 784).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
    let x = Tensor::from_vec(x, &[BATCH, 784]).unwrap();
    let ids = Tensor::from_vec((0..BATCH).map(|i| (i % 10) as f32).collect(), &[BATCH]).unwrap();
    let before: Vec<Vec<f32>> = model.parameters().iter().map(Tensor::to_vec).collect();
    let mut adam = Optimizer::adam(model.parameters(), 1e-3).unwrap();
    let first = train_step(&model, &mut adam, &x, &ids).unwrap().item().unwrap();
    let second = train_step(&model, &mut adam, &x, &ids).unwrap().item().unwrap();
    assert!(first.is_finite() && second < first, "loss {first} then {second}");
    for (p, old) in model.parameters().iter().zip(&before) {
        assert_ne!(&p.to_vec(), old, "a parameter of shape {:?} did not move", p.shape());
    }
}
