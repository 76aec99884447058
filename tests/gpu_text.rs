//! GPU parity of the text kernels against the CPU reference (the checks `textnet selftest` prints).
//! Run on a machine with a CUDA GPU: `cargo test --release -- --ignored`. Without one they fail.

use rand::SeedableRng;
use rand::rngs::StdRng;
use textnet::selftest::{
    Check, REPEAT_SHAPES, REPETITIVE_CASES, TRAINING_CASES, test_gpu, text_kernel_checks, text_repeat_check, text_repetitive_training_check, text_sample_checks,
    text_tiled_checks, text_training_check,
};
use textnet::text::model::TextShape;

fn assert_all_pass(checks: &[Check]) {
    let failed: Vec<_> = checks.iter().filter(|c| !c.passed()).collect();
    assert!(failed.is_empty(), "failed checks: {failed:#?}");
}

/// A generator from a fresh seed, printed so that a failure can be repeated (`cargo test` shows a failing
/// test's output).
fn fresh_rng() -> StdRng {
    let seed: u64 = rand::random();
    println!("random inputs from seed {seed}");
    StdRng::seed_from_u64(seed)
}

fn shape(vocab: usize, embed: usize, hidden: usize, context: usize) -> TextShape {
    TextShape { vocab, embed, hidden, context }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn each_text_kernel_matches_the_cpu_reference() {
    let gpu = test_gpu();
    let mut rng = fresh_rng();
    // The bench shape, a vocabulary that is no multiple of the rows per block, odd widths, batches below
    // and above the kernels' sample chunk, and the largest hidden size the kernels take.
    for (s, batch) in [
        (shape(8192, 64, 256, 3), 1),
        (shape(8192, 64, 256, 3), 19),
        (shape(1000, 33, 100, 2), 5),
        (shape(517, 16, 40, 1), 11),
        (shape(50021, 256, textnet::text::gpu::MAX_HIDDEN, 4), 2),
    ] {
        assert_all_pass(&text_kernel_checks(&gpu, s, batch, &mut rng).unwrap());
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_tiled_large_batch_step_matches_the_cpu_reference() {
    let gpu = test_gpu();
    let mut rng = fresh_rng();
    for (s, batch) in [(shape(8192, 64, 256, 3), 256), (shape(1000, 33, 100, 2), 300), (shape(517, 16, 40, 1), 64)] {
        assert_all_pass(&text_tiled_checks(&gpu, s, batch, &mut rng).unwrap());
    }
    assert_all_pass(&[text_training_check(&gpu, shape(2003, 32, 64, 3), 130, 100, &mut rng).unwrap()]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn each_single_sample_kernel_matches_the_cpu_reference() {
    let gpu = test_gpu();
    let mut rng = fresh_rng();
    for s in [shape(8192, 64, 256, 3), shape(1000, 33, 100, 2), shape(517, 16, 40, 1), shape(131, 8, 32, 4)] {
        assert_all_pass(&text_sample_checks(&gpu, s, &mut rng).unwrap());
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_thousand_training_steps_match_the_cpu_reference() {
    let gpu = test_gpu();
    let mut rng = fresh_rng();
    for (s, batch) in TRAINING_CASES {
        assert_all_pass(&[text_training_check(&gpu, s, batch, 1000, &mut rng).unwrap()]);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn training_on_repetitive_text_matches_the_cpu_reference() {
    let gpu = test_gpu();
    let mut rng = fresh_rng();
    for (s, batch) in REPETITIVE_CASES {
        assert_all_pass(&[text_repetitive_training_check(&gpu, s, batch, 1000, &mut rng).unwrap()]);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn single_sample_training_repeats_to_the_bit() {
    let gpu = test_gpu();
    let mut rng = fresh_rng();
    for s in REPEAT_SHAPES {
        assert_all_pass(&[text_repeat_check(&gpu, s, &mut rng).unwrap()]);
    }
}
