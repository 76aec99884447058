//! The XOR pipeline: Linear(2, H) → activation → Linear(H, 1), mean squared error,
//! full-batch SGD on the four XOR points. CPU reference `model`, GPU trainer `gpu` (fused/xor.cu: the whole
//! run in one launch), selftest checks `checks`, the model file `modelfile`, the `textnet xor` command `cli`.

pub mod bench;
pub mod checks;
pub mod cli;
pub mod gpu;
pub mod model;
pub mod modelfile;

/// The XOR pipeline as the command line, `selftest` and `bench` see it.
pub const PIPELINE: crate::pipeline::Pipeline = crate::pipeline::Pipeline {
    name: "xor",
    commands: &[crate::pipeline::Command {
        name: "xor",
        about: "Train the XOR network (2 → hidden → 1, MSE) and print its truth table",
        args: <cli::XorArgs as clap::Args>::augment_args,
        run: |m| cli::run(crate::pipeline::parsed(m)?),
    }],
    checks: checks::selftest_checks,
    modules: checks::modules,
    benches: &[crate::pipeline::Bench {
        name: "xor",
        about: "XOR: the 5000-epoch run in one launch",
        args: |command| command,
        run: |gpu, options, _| bench::bench(gpu, options.repeats, options.json),
    }],
    models: &[&crate::io::modelkind::XOR],
    language_model: None,
    image_classifier: None,
    onnx: None,
};
