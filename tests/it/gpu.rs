//! Every pipeline's GPU kernels against its CPU reference on fresh random inputs (the checks `textnet
//! selftest` prints), and a training run on real data. Run on a machine with a CUDA GPU: `cargo test
//! --release -- --ignored`. Without one they fail, never skip.

use textnet::datasets::mnist::{self, Dataset};
use textnet::device::Backend;
use textnet::harness::check::{Plan, test_gpu};
use textnet::mnist::idx::{CLASSES, PIXELS};
use textnet::mnist::mlp::FitMlp;
use textnet::mnist::model::{Activation, MlpParams, MlpShape};
use textnet::mnist::train::{self, Schedule};
use textnet::ops::optim::{LrSchedule, OptimConfig, OptimKind};
use textnet::pipelines;

/// Each pipeline in the list, all groups of checks, from one seed printed so that a failure can be
/// repeated (`textnet selftest --seed S` draws the same inputs).
#[test]
#[ignore = "needs a CUDA GPU"]
fn every_pipeline_matches_its_cpu_reference() {
    let gpu = test_gpu();
    let seed: u64 = rand::random();
    println!("random inputs from seed {seed}");
    let plan = Plan { seed, quick: false, groups: vec![] };
    let mut failed = Vec::new();
    for pipeline in pipelines::ALL {
        let checks = (pipeline.checks)(&gpu, &plan).unwrap_or_else(|e| panic!("{}: {e:#}", pipeline.name));
        // A pipeline without kernels of its own (sales trains on fit's) has no checks of its own.
        assert!(!checks.is_empty() || (pipeline.modules)(&plan).is_empty(), "{} has no checks", pipeline.name);
        failed.extend(checks.iter().filter(|c| !c.passed()).map(|c| {
            format!("{}: {} [{}]: {:.3e} > {:.0e}", pipeline.name, c.kernel, c.shape, c.rel_error, c.tolerance)
        }));
    }
    assert!(failed.is_empty(), "failed checks (seed {seed}):\n{}", failed.join("\n"));
}

/// The shared layers' checks (`nn`'s ops on device tensors against the same ops on the host).
#[test]
#[ignore = "needs a CUDA GPU"]
fn every_shared_layer_matches_its_cpu_twin() {
    let gpu = test_gpu();
    let seed: u64 = rand::random();
    let plan = Plan { seed, quick: false, groups: vec![] };
    for suite in textnet::commands::selftest::SUITES {
        let checks = (suite.checks)(&gpu, &plan).unwrap_or_else(|e| panic!("{}: {e:#}", suite.name));
        assert!(!checks.is_empty(), "{} has no checks", suite.name);
        let failed: Vec<String> = (checks.iter().filter(|c| !c.passed()))
            .map(|c| format!("{} [{}]: {:.3e} > {:.0e}", c.kernel, c.shape, c.rel_error, c.tolerance))
            .collect();
        assert!(failed.is_empty(), "{} (seed {seed}):\n{}", suite.name, failed.join("\n"));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_training_on_fashion_mnist_learns() {
    // The default search: $TEXTNET_DATA, ./data/fashion-mnist, the cache, /usr/share/datasets/fashion-mnist.
    let data =
        mnist::load(Dataset::Fashion, None, &|_| {}).unwrap_or_else(|e| panic!("this test needs Fashion-MNIST: {e:#}"));
    let shape = MlpShape { inputs: PIXELS, hidden: 128, classes: CLASSES, activation: Activation::Relu };
    let mut t = FitMlp::new(
        &Backend::Cuda(test_gpu()),
        MlpParams::init(shape, 3),
        OptimConfig::new(OptimKind::Adam),
        &data.train,
        &data.test,
        64,
    )
    .unwrap();
    let schedule = Schedule { epochs: 2, batch: 64, seed: 3, lr: 1e-3, lr_schedule: LrSchedule::default() };
    let (history, eval) = train::run(&mut t, data.train.len(), schedule, &mut ()).unwrap();
    assert_eq!(eval.samples, 10_000);
    assert!(history[1].train_loss < history[0].train_loss, "{history:?}");
    assert!(eval.accuracy() >= 0.83, "test accuracy {:.4} after 2 epochs", eval.accuracy());
}

/// The launch check's source of truth: the driver's parameter sizes of a kernel whose signature is known
/// (`xor_train(float* w1, float* b1, float* w2, float* b2, int H, int activation, int epochs,
/// const float* rates, int report_every, float* losses)`).
#[test]
#[ignore = "needs a CUDA GPU"]
fn kernel_parameters_are_read_at_load() {
    let gpu = test_gpu();
    let module = gpu.module(&textnet::xor::gpu::MODULE).unwrap();
    let kernel = textnet::device::Gpu::function(&module, "xor_train").unwrap();
    assert_eq!(kernel.parameter_sizes(), Some(&[8, 8, 8, 8, 4, 4, 4, 8, 4, 8][..]));
}

/// Every module the selftest needs was compiled when the binary was built (fused/precompiled.txt): the
/// first selftest with an empty kernel cache compiles none, which is what keeps a fresh machine's first
/// run short. Only a build asked to compile ahead of time (TEXTNET_PRECOMPILE=1) holds them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_first_selftest_compiles_no_kernel() {
    let (count, note) = textnet::device::compile::precompiled_count();
    if count == 0 {
        eprintln!("skipped: the binary holds no kernels compiled at build time ({note})");
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_textnet"))
        .args(["--verbose", "selftest", "--quick"])
        .env("TEXTNET_CACHE", cache.path())
        .output()
        .unwrap();
    let log = crate::common::stderr(&out);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("compiled at build time"), "{log}");
    let compiled: Vec<&str> = log.lines().filter(|l| l.contains("  compiled fused/")).collect();
    assert!(compiled.is_empty(), "compiled at run time:\n{}", compiled.join("\n"));
}
