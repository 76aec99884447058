//! The XOR selftest's problems on the CPU: the whole-run check finds a tame problem within its first
//! draws for the smooth activations and every width, constant or scheduled, its sensitivity test sees a
//! run that is not tame, and the scheduled check's rates move a run far more than its tolerance.

use rand::SeedableRng;
use textnet::harness::check::rel_error;
use textnet::ops::activations::Activation;
use textnet::ops::cpu::SeededRng;
use textnet::ops::optim::LrSchedule;
use textnet::xor::checks::{
    EPOCHS, LR, REPORT_EVERY, RUN_SCHEDULE, SENSITIVITY, TOLERANCE, reference_problem, run_rates, worst_error,
};
use textnet::xor::model::{XorParams, train};

#[test]
fn tame_problems_are_found_in_a_few_draws() {
    let mut rng = SeededRng::seed_from_u64(5);
    let (mut drawn, mut found) = (0, 0);
    for activation in [Activation::Sigmoid, Activation::Tanh] {
        for hidden in [4, 37, 100] {
            for schedule in [LrSchedule::default(), RUN_SCHEDULE] {
                for _ in 0..3 {
                    let rates = run_rates(hidden, activation, schedule);
                    let (draws, problem) = reference_problem(hidden, activation, &rates, &mut rng);
                    drawn += draws;
                    found += problem.is_some() as usize;
                }
            }
        }
    }
    assert_eq!(found, 36, "some checks found no tame problem");
    // Measured: about half the draws at H = 4, every draw at 37 and 100; the check draws up to 32.
    assert!(drawn <= 36 * 2, "{drawn} draws for 36 problems: most draws are not tame");
}

#[test]
fn the_sensitivity_test_sees_a_run_that_amplifies_rounding() {
    // A learning rate past the stable range makes the run diverge from itself: the same test must say so.
    let start = XorParams::init(4, Activation::Sigmoid, 1);
    let run = |scale: f32| {
        let mut p = start.clone();
        p.w1.iter_mut().for_each(|w| *w *= scale);
        train(&mut p, &[4.0 * LR; EPOCHS], 500);
        p
    };
    let (a, b) = (run(1.0), run(1.0 + 1e-6));
    let moved = worst_error(&b, &a);
    assert!(moved.is_nan() || moved > SENSITIVITY, "an unstable run passed the sensitivity test ({moved:e})");
}

#[test]
fn the_scheduled_check_fails_a_kernel_that_ignores_the_schedule() {
    // A kernel that stepped every epoch at the base rate ends far outside TOLERANCE of the reference (its
    // parameters or recorded losses, as the check measures), on every problem the check could draw. (A rate read one epoch off moves a whole run by only ~2e-6: the
    // one-epoch checks catch that, their launch's second epoch running at rate 0.)
    let mut rng = SeededRng::seed_from_u64(11);
    for activation in [Activation::Sigmoid, Activation::Tanh] {
        for hidden in [37, 100] {
            let rates = run_rates(hidden, activation, RUN_SCHEDULE);
            let (_, problem) = reference_problem(hidden, activation, &rates, &mut rng);
            let (start, want, want_losses) = problem.expect("a tame problem");
            let mut got = start.clone();
            let losses = train(&mut got, &run_rates(hidden, activation, LrSchedule::default()), REPORT_EVERY);
            let error = worst_error(&got, &want).max(rel_error(&losses, &want_losses));
            assert!(error > 10.0 * TOLERANCE, "H={hidden} {activation:?}: only {error:e} from the reference");
        }
    }
}
