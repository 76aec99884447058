//! The selftest's text problems, on the CPU: the kink margin sees a pre-activation at ReLU's kink, kernel
//! checks get problems clear of it, and the training checks' problems stay clear of it over the whole
//! reference run as often as `MAX_DRAWS` counts on.

use rand::SeedableRng;
use std::sync::Arc;
use textnet::harness::check::Plan;
use textnet::ops::cpu::SeededRng;
use textnet::text::checks::{
    KERNEL_MARGIN, TRAINING_CASES, TRAINING_MARGIN, TrainingProblem, kink_margin, random_problem, reference_run,
    training_problem,
};
use textnet::text::model::{self, TextParams, TextShape};

fn sgd(lr: f32) -> textnet::ops::optim::OptimConfig {
    textnet::ops::optim::OptimConfig {
        lr,
        ..textnet::ops::optim::OptimConfig::new(textnet::ops::optim::OptimKind::Sgd)
    }
}

fn tiny() -> (TextParams, Arc<[u32]>) {
    let shape = TextShape { vocab: 11, embed: 5, hidden: 4, context: 2 };
    (TextParams::init(shape, 7), (0..40u32).map(|i| i * 7 % 11).collect())
}

#[test]
fn the_margin_is_zero_at_the_kink_and_large_away_from_it() {
    let (mut p, tokens) = tiny();
    let pos = [5u32];
    let mut x = vec![0.0; 5];
    model::embed_context(&p, &tokens[3..5], &mut x);
    p.b1 = vec![10.0, -10.0, 10.0, -10.0];
    assert!(kink_margin(&p, &tokens, &pos) > 0.2, "biases of ±10 keep every unit far from the kink");
    // Unit 2's pre-activation lands on 0 (to rounding).
    let w1_x: f32 = p.w1[10..15].iter().zip(&x).map(|(w, x)| w * x).sum();
    p.b1[2] = -w1_x;
    assert!(kink_margin(&p, &tokens, &pos) < 1e-6, "margin {}", kink_margin(&p, &tokens, &pos));
}

#[test]
fn a_reference_run_reports_a_step_that_touches_the_kink() {
    let (mut p, tokens) = tiny();
    let positions: Vec<u32> = (2..30).collect();
    p.b1 = vec![1.0, -1.0, 1.0, -1.0];
    let rates = vec![0.01; positions.len()];
    let clear = reference_run(
        &TrainingProblem { params: p.clone(), tokens: tokens.clone(), positions: positions.clone() },
        1,
        sgd(0.01),
        &rates,
    );
    assert!(clear.margin > TRAINING_MARGIN);
    // The first sample's context puts unit 0 on the kink.
    let mut x = vec![0.0; 5];
    model::embed_context(&p, &tokens[positions[0] as usize - 2..positions[0] as usize], &mut x);
    p.b1[0] = -p.w1[..5].iter().zip(&x).map(|(w, x)| w * x).sum::<f32>();
    let touching = reference_run(&TrainingProblem { params: p, tokens, positions }, 1, sgd(0.01), &rates);
    assert!(touching.margin < 1e-6, "margin {}", touching.margin);
}

#[test]
fn kernel_check_problems_are_clear_of_the_kink() {
    let mut rng = SeededRng::seed_from_u64(3);
    for (shape, batch) in [
        (TextShape { vocab: 1000, embed: 33, hidden: 100, context: 2 }, 300),
        (TextShape { vocab: 517, embed: 16, hidden: 40, context: 1 }, 64),
    ] {
        for _ in 0..5 {
            let (p, tokens, positions) = random_problem(shape, batch, &mut rng);
            assert!(kink_margin(&p, &tokens, &positions) >= KERNEL_MARGIN);
        }
    }
}

/// Every training case's problems stay TRAINING_MARGIN clear of the kink over the reference run, nearly
/// always (the selftest draws again, up to MAX_DRAWS times, when one does not). The cheap cases are drawn
/// six times each, the three largest once.
#[test]
fn training_problems_stay_clear_of_the_kink() {
    let plan = Plan { seed: 20261123, quick: false, groups: vec![] };
    let mut clear = 0;
    let mut drawn = 0;
    for (i, case) in TRAINING_CASES.iter().enumerate() {
        let draws = if case.shape.vocab * case.shape.hidden > 2_000_000 { 1 } else { 6 };
        let mut rng = plan.rng(&format!("test training {i}"));
        for _ in 0..draws {
            let problem = training_problem(case, &mut rng);
            let run = reference_run(&problem, case.batch, case.optim_config(), &case.rates());
            drawn += 1;
            clear += (run.margin >= TRAINING_MARGIN) as usize;
        }
    }
    assert!(clear * 10 >= drawn * 9, "only {clear} of {drawn} problems stayed clear of the kink");
}

/// A training check at a rate per step fails a GPU trainer that stepped at the wrong rates: every step at
/// the base rate (the schedule ignored) ends far outside TRAINING_TOLERANCE of the reference, and on the
/// alternating cases so does every step at the next step's rate. (A smooth schedule's rates, shifted by a
/// step, moved these runs by only 1.3e-4 to 4.5e-4: the alternating cases are there for that.)
#[test]
fn the_scheduled_checks_fail_a_trainer_at_the_wrong_rates() {
    use textnet::harness::check::rel_error;
    use textnet::text::checks::{CaseRates, TRAINING_TOLERANCE, param_rel_errors};
    let plan = Plan { seed: 20261127, quick: false, groups: vec![] };
    let mut alternating = 0;
    for (i, case) in TRAINING_CASES.iter().enumerate() {
        let rates = case.rates();
        if rates.iter().all(|&r| r == case.lr) {
            continue;
        }
        let problem = training_problem(case, &mut plan.rng(&format!("test training {i}")));
        let want = reference_run(&problem, case.batch, case.optim_config(), &rates);
        let next: Vec<f32> = rates[1..].iter().chain(rates.last()).copied().collect();
        let mut bugs = vec![("the base rate", vec![case.lr; case.steps])];
        if case.rates == CaseRates::Alternating {
            bugs.push(("the next step's rate", next));
            alternating += 1;
        }
        for (bug, wrong) in bugs {
            let got = reference_run(&problem, case.batch, case.optim_config(), &wrong);
            let loss = rel_error(&[got.loss as f32], &[want.loss as f32]);
            let worst = param_rel_errors(&got.params, &want.params).into_iter().map(|(_, e)| e).fold(loss, f64::max);
            assert!(worst > 10.0 * TRAINING_TOLERANCE, "case {i}, {bug}: only {worst:e} from the reference");
        }
    }
    assert_eq!(alternating, 4, "fused/text_sample.cu, fused/text.cu for 1 and 7 samples, the tiled kernels");
}

#[test]
fn each_part_of_the_checks_draws_the_same_whatever_else_runs() {
    use rand::RngExt;
    let plan = Plan { seed: 5, quick: true, groups: vec![] };
    let a: u64 = plan.rng("text training 3").random();
    let b: u64 = plan.rng("text training 3").random();
    let c: u64 = plan.rng("text training 4").random();
    assert_eq!(a, b);
    assert_ne!(a, c);
}
