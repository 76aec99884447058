//! GPU parity of the text kernels against the CPU reference: the checks `textnet selftest --only text`
//! prints, one group per test. Run on a machine with a CUDA GPU: `cargo test --release -- --ignored`.
//! Without one they fail.

use textnet::check::{Check, Group, Plan, test_gpu};
use textnet::text::checks;

/// Runs one group of the text checks on fresh random inputs, from a seed printed so that a failure can be
/// repeated (`cargo test` shows a failing test's output; `textnet selftest --seed S` draws the same).
fn run_group(group: Group) {
    let gpu = test_gpu();
    let seed: u64 = rand::random();
    println!("random inputs from seed {seed}");
    let results = checks::checks(&gpu, &Plan { seed, quick: false, groups: vec![group] }).unwrap();
    assert!(!results.is_empty());
    let failed: Vec<&Check> = results.iter().filter(|c| !c.passed()).collect();
    assert!(failed.is_empty(), "failed checks (seed {seed}): {failed:#?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn each_text_kernel_matches_the_cpu_reference() {
    run_group(Group::Kernels);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn whole_training_runs_match_the_cpu_reference() {
    run_group(Group::Training);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn single_sample_training_repeats_to_the_bit() {
    run_group(Group::Repeat);
}
