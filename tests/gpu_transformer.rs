//! GPU parity of fused/transformer.cu against the CPU reference: the checks `textnet selftest --only
//! transformer` prints. Run on a machine with a CUDA GPU: `cargo test --release -- --ignored`. Without one
//! they fail.

use textnet::check::{Check, Plan, test_gpu};

#[test]
#[ignore = "needs a CUDA GPU"]
fn transformer_kernels_and_training_match_the_cpu_reference() {
    let gpu = test_gpu();
    let seed: u64 = rand::random();
    println!("random inputs from seed {seed}");
    let checks =
        textnet::transformer::checks::selftest_checks(&gpu, &Plan { seed, quick: false, groups: vec![] }).unwrap();
    assert!(!checks.is_empty());
    let failed: Vec<&Check> = checks.iter().filter(|c| !c.passed()).collect();
    assert!(failed.is_empty(), "failed checks (seed {seed}): {failed:#?}");
}
