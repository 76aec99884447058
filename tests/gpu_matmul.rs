//! GPU parity of fused/matmul.cu against the CPU reference: the checks `textnet selftest --only matmul` prints.
//! Run on a machine with a CUDA GPU: `cargo test --release -- --ignored`. Without one they fail.

use textnet::check::{Check, Plan, test_gpu};

#[test]
#[ignore = "needs a CUDA GPU"]
fn matmul_kernels_match_the_cpu_reference() {
    let gpu = test_gpu();
    let seed: u64 = rand::random();
    println!("random inputs from seed {seed}");
    let checks = textnet::matmul::checks::selftest_checks(&gpu, &Plan { seed, quick: false, groups: vec![] }).unwrap();
    assert!(!checks.is_empty());
    let failed: Vec<&Check> = checks.iter().filter(|c| !c.passed()).collect();
    assert!(failed.is_empty(), "failed checks (seed {seed}): {failed:#?}");
}
