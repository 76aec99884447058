//! The MNIST GPU pipeline. `fused/mnist.cu` compiles through NVRTC for the sizes the launch layer uses
//! (needs libnvrtc, not a GPU). The ignored tests need a CUDA GPU and fail, never skip, without one:
//! `cargo test --release --test gpu_mnist -- --ignored`.

use textnet::check::test_gpu;
use textnet::device::{compile_ptx, kernel_source};
use textnet::mnist::checks::selftest_checks;
use textnet::mnist::data::{self, Dataset};
use textnet::mnist::gpu::GpuTrainer;
use textnet::mnist::idx::{CLASSES, PIXELS};
use textnet::mnist::model::{Activation, MlpParams, MlpShape};
use textnet::mnist::train::{self, Schedule};
use textnet::optim::{OptimConfig, OptimKind};

#[test]
fn mnist_kernels_compile_for_the_shapes_used() {
    let unit = kernel_source("mnist").unwrap();
    // (inputs, classes): (Fashion-)MNIST, the selftest's odd shape, and the smallest model.
    for (inputs, classes) in [(PIXELS, CLASSES), (50, 7), (1, 2)] {
        for cc in [(9, 0), (8, 0)] {
            let defines = [format!("-DMNIST_I={inputs}"), format!("-DMNIST_C={classes}")];
            let ptx = compile_ptx(unit, cc, &defines)
                .unwrap_or_else(|e| panic!("I={inputs} C={classes} sm_{}{}: {e:#}", cc.0, cc.1));
            for kernel in ["mnist_forward", "mnist_evaluate", "mnist_backward", "mnist_update", "mnist_advance"] {
                assert!(ptx.contains(kernel), "{kernel} missing from the PTX for I={inputs} C={classes}");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_mnist_gpu_check_passes() {
    let gpu = test_gpu();
    let checks =
        selftest_checks(&gpu, &textnet::check::Plan { seed: rand::random(), quick: false, groups: vec![] }).unwrap();
    assert!(!checks.is_empty());
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| !c.passed())
        .map(|c| format!("{} [{}]: {:.3e} > {:.0e}", c.kernel, c.shape, c.rel_error, c.tolerance))
        .collect();
    assert!(failed.is_empty(), "{} of {} checks failed:\n{}", failed.len(), checks.len(), failed.join("\n"));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_training_on_fashion_mnist_learns() {
    // The default search: $TEXTNET_DATA, ./data/fashion-mnist, the cache, /usr/share/datasets/fashion-mnist.
    let data =
        data::load(Dataset::Fashion, None, &|_| {}).unwrap_or_else(|e| panic!("this test needs Fashion-MNIST: {e:#}"));
    let shape = MlpShape { inputs: PIXELS, hidden: 128, classes: CLASSES, activation: Activation::Relu };
    let mut t = GpuTrainer::new(
        test_gpu(),
        MlpParams::init(shape, 3),
        OptimConfig::new(OptimKind::Adam),
        &data.train,
        &data.test,
    )
    .unwrap();
    let (history, eval) =
        train::run(&mut t, data.train.len(), Schedule { epochs: 2, batch: 64, seed: 3 }, &mut ()).unwrap();
    assert_eq!(eval.samples, 10_000);
    assert!(history[1].train_loss < history[0].train_loss, "{history:?}");
    assert!(eval.accuracy() >= 0.83, "test accuracy {:.4} after 2 epochs", eval.accuracy());
}
