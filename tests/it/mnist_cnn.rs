//! The CNN's CPU reference: analytic gradients against central finite differences for every parameter
//! (conv weights and biases included), in f64 where a 1e-6 step crosses no ReLU kink and changes no
//! pooling choice; and a deliberately wrong gradient fails the same comparison.

use crate::common::relative;
use rand::{RngExt, SeedableRng};
use textnet::mnist::cnn::{CnnParams, CnnShape, loss_and_grad};
use textnet::mnist::idx::Split;
use textnet::ops::cpu::SeededRng;

const SHAPE: CnnShape = CnnShape { side: 8, c1: 3, c2: 4, fc: 6, classes: 5 };

fn random_split(shape: CnnShape, n: usize, seed: u64) -> Split {
    let mut rng = SeededRng::seed_from_u64(seed);
    let pixels = shape.side * shape.side;
    Split {
        images: (0..n * pixels).map(|_| rng.random_range(0.0f32..1.0)).collect(),
        labels: (0..n).map(|_| rng.random_range(0..shape.classes as u8)).collect(),
        pixels,
    }
}

/// Central differences of the summed loss, turned into the mean loss's gradient.
fn numeric(params: &[f64], data: &Split, rows: &[u32]) -> Vec<f64> {
    const EPS: f64 = 1e-6;
    let mut scratch = vec![0.0; params.len()];
    (0..params.len())
        .map(|i| {
            let mut q = params.to_vec();
            q[i] += EPS;
            let up = loss_and_grad(SHAPE, &q, data, rows, &mut scratch);
            q[i] -= 2.0 * EPS;
            let down = loss_and_grad(SHAPE, &q, data, rows, &mut scratch);
            (up - down) / (2.0 * EPS) / rows.len() as f64
        })
        .collect()
}

fn problem() -> (Vec<f64>, Split, Vec<u32>) {
    let p = CnnParams::init(SHAPE, 3);
    let params: Vec<f64> = p.flat.iter().map(|&v| v as f64).collect();
    (params, random_split(SHAPE, 6, 11), vec![4, 0, 5, 2, 1])
}

#[test]
fn every_gradient_matches_finite_differences() {
    let (params, data, rows) = problem();
    let mut analytic = vec![0.0; params.len()];
    loss_and_grad(SHAPE, &params, &data, &rows, &mut analytic);
    assert_eq!(analytic.len(), 3 * 9 + 3 + 4 * 3 * 9 + 4 + 6 * 16 + 6 + 5 * 6 + 5);
    let (starts, _) = SHAPE.offsets();
    // Every tensor takes part: some gradient of each is not zero.
    for k in 0..8 {
        let end = if k < 7 { starts[k + 1] } else { analytic.len() };
        assert!(analytic[starts[k]..end].iter().any(|g| *g != 0.0), "tensor {k} has an all-zero gradient");
    }
    let fd = numeric(&params, &data, &rows);
    for k in 0..8 {
        let end = if k < 7 { starts[k + 1] } else { analytic.len() };
        let err = relative(&fd[starts[k]..end], &analytic[starts[k]..end]);
        assert!(err < 1e-6, "tensor {k}: relative error {err:.2e}");
    }
}

#[test]
fn a_wrong_gradient_fails_the_comparison() {
    let (params, data, rows) = problem();
    let mut analytic = vec![0.0; params.len()];
    loss_and_grad(SHAPE, &params, &data, &rows, &mut analytic);
    let fd = numeric(&params, &data, &rows);
    // conv1's weight gradient off by 0.1 %, or one of its elements off by 10 %: the comparison's
    // tolerance (1e-6) sees both.
    let (starts, _) = SHAPE.offsets();
    let mut scaled = analytic.clone();
    scaled[..starts[1]].iter_mut().for_each(|g| *g *= 1.001);
    assert!(relative(&fd[..starts[1]], &scaled[..starts[1]]) > 1e-6);
    let worst = (0..starts[1]).max_by(|&a, &b| analytic[a].abs().total_cmp(&analytic[b].abs())).unwrap();
    analytic[worst] *= 1.1;
    assert!(relative(&fd[..starts[1]], &analytic[..starts[1]]) > 1e-6);
}

#[test]
fn the_mnist_shape_has_its_parameter_count() {
    // conv1 80, conv2 1168, fc1 50240, fc2 650
    assert_eq!(CnnShape::MNIST.param_count(), 80 + 1168 + 50240 + 650);
    let p = CnnParams::init(CnnShape::MNIST, 1);
    let image = vec![0.5f32; 784];
    let logits = textnet::mnist::cnn::logits(&p, &image);
    assert_eq!(logits.len(), 10);
    assert!(logits.iter().all(|v| v.is_finite()));
}

/// The CPU reference's run of the training checks: 100 steps of 4 images of `data` from `start`, step k at
/// `rates[k]`; the parameters, and the smallest kink margin any step reached.
fn reference_run(
    start: &CnnParams,
    data: &Split,
    optim: textnet::ops::optim::OptimConfig,
    rates: &[f32],
) -> (CnnParams, f64) {
    use textnet::mnist::cnn::kink_margin;
    let mut p = start.clone();
    let mut optimizer = textnet::ops::optim::Optimizer::new(optim, p.flat.len());
    let mut grad = vec![0.0f32; p.flat.len()];
    let mut margin = f64::INFINITY;
    for (rows, &rate) in (0..400u32).collect::<Vec<_>>().chunks(4).zip(rates) {
        margin = margin.min(kink_margin(&p, data, rows));
        loss_and_grad(start.shape, &p.flat, data, rows, &mut grad);
        optimizer.config.lr = rate;
        optimizer.step(&mut p.flat, &grad);
    }
    (p, margin)
}

/// The selftest's CNN training problems (100 steps of 4 images on the small CNN), at a constant rate and
/// scheduled, stay clear of every switch over the reference run nearly always; the selftest draws again,
/// up to 8 times, when one does not. On each clear scheduled problem, a trainer that ignored the schedule
/// (every step at the base rate) or read the rate of the step after ends far outside the check's tolerance.
#[test]
fn training_check_problems_stay_clear_nearly_always() {
    use textnet::harness::check::rel_error;
    use textnet::mnist::cnn_checks::{MARGIN, TRAINING_SCHEDULE, TRAINING_SHAPE, TRAINING_TOLERANCE};
    use textnet::mnist::cnn_checks::{optimizers, random_split};
    use textnet::ops::optim::LrSchedule;
    let mut rng = SeededRng::seed_from_u64(20261123);
    let (mut clear, mut drawn) = (0, 0);
    for optim in optimizers() {
        for schedule in [LrSchedule::default(), TRAINING_SCHEDULE] {
            for _ in 0..8 {
                let data = random_split(TRAINING_SHAPE, 400, &mut rng);
                let start = CnnParams::init(TRAINING_SHAPE, rng.random());
                let rates = schedule.rates(optim.lr, 100);
                let (p, margin) = reference_run(&start, &data, optim, &rates);
                drawn += 1;
                if !(margin >= MARGIN && p.all_finite()) {
                    continue;
                }
                clear += 1;
                if schedule != LrSchedule::default() {
                    let (unscheduled, _) = reference_run(&start, &data, optim, &[optim.lr; 100]);
                    let shifted: Vec<f32> = rates[1..].iter().chain(&rates[99..]).copied().collect();
                    let (off_by_one, _) = reference_run(&start, &data, optim, &shifted);
                    for (bug, got) in [("the base rate", unscheduled), ("the next step's rate", off_by_one)] {
                        // Measured: at least 3.6e-2 and 1.3e-3.
                        let error = rel_error(&got.flat, &p.flat);
                        assert!(error > 10.0 * TRAINING_TOLERANCE, "{}, {bug}: only {error:e}", optim.describe());
                    }
                }
            }
        }
    }
    assert!(clear * 10 >= drawn * 6, "only {clear} of {drawn} problems stayed clear");
}
