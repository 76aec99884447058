//! The selftest's MNIST training problems, on the CPU: with ReLU, the reference run stays clear of the
//! kink as often as the check's redraw rule counts on, and the watch sees a step that touches it.

use rand::SeedableRng;
use std::sync::Arc;
use textnet::cpu::SeededRng;
use textnet::mnist::CpuTrainer;
use textnet::mnist::checks::{TRAINING_EPOCHS, TRAINING_MARGIN, training_cases, training_problem};
use textnet::mnist::model::{Activation, kink_margin};
use textnet::mnist::train::{self, Schedule};

#[test]
fn relu_training_problems_stay_clear_of_the_kink() {
    let mut rng = SeededRng::seed_from_u64(11);
    let (mut clear, mut drawn) = (0, 0);
    for case in training_cases().into_iter().filter(|c| c.shape.activation == Activation::Relu) {
        for _ in 0..4 {
            let (train_split, test_split, p, seed) = training_problem(case.shape, case.samples, &mut rng);
            let mut cpu = CpuTrainer::new(p, case.optim, Arc::new(train_split), Arc::new(test_split));
            cpu.kink_margin = Some(f64::INFINITY);
            let schedule = Schedule { epochs: TRAINING_EPOCHS, batch: case.batch, seed };
            train::run(&mut cpu, case.samples, schedule, &mut ()).unwrap();
            drawn += 1;
            clear += (cpu.kink_margin.unwrap() >= TRAINING_MARGIN) as usize;
        }
    }
    assert!(clear * 10 >= drawn * 9, "only {clear} of {drawn} problems stayed clear of the kink");
}

#[test]
fn the_watch_sees_a_unit_at_the_kink() {
    let case = training_cases().into_iter().find(|c| c.shape.activation == Activation::Relu).unwrap();
    let (train_split, _, mut p, _) = training_problem(case.shape, case.samples, &mut SeededRng::seed_from_u64(2));
    assert!(kink_margin(&p, &train_split, &[0, 1, 2]) > 0.1);
    // Unit 3's pre-activation on image 1 set to 0.
    let (i, h) = (case.shape.inputs, case.shape.hidden);
    let w1_x: f32 = p.flat[3 * i..4 * i].iter().zip(train_split.image(1)).map(|(w, x)| w * x).sum();
    p.flat[h * i + 3] = -w1_x;
    assert!(kink_margin(&p, &train_split, &[0, 1, 2]) < 1e-6);
}
