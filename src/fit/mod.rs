//! `textnet fit --layers SPEC`: the command that trains a layer stack (`nn::stack`) on images or a table and predicts
//! with it. Here are its side of the work: the command line (its flags `args`, its run `cli` with `epochs`, `ending`
//! and `predict`), the data it reads (`data`), its model file (`modelfile`, also the Python package's), its selftest
//! checks (`checks`), its bench (`bench`) and its image models opened for the shared `textnet classify` (`classify`).

pub mod args;
pub mod bench;
pub mod checks;
pub mod classify;
pub mod cli;
pub mod data;
mod ending;
mod epochs;
pub mod modelfile;
pub mod onnx;
mod predict;

/// The fit pipeline as the command line, `selftest` and `bench` see it.
pub const PIPELINE: crate::pipeline::Pipeline = crate::pipeline::Pipeline {
    name: "fit",
    commands: &[crate::pipeline::Command {
        name: "fit",
        about: "Train a network written as layers (--layers \"Linear(784, 128), ReLU, Linear(128, 10)\") on images or a table, or predict with one",
        args: <args::FitArgs as clap::Args>::augment_args,
        run: |m| cli::run(crate::pipeline::parsed(m)?),
    }],
    checks: checks::selftest_checks,
    modules: checks::modules,
    benches: &[crate::pipeline::Bench {
        name: "fit",
        about: "A --layers model's training speed and accuracy on Fashion-MNIST or a --table",
        args: <bench::FitBenchArgs as clap::Args>::augment_args,
        run: |gpu, options, m| bench::run(gpu, options, &crate::pipeline::parsed(m)?),
    }],
    models: &[&crate::io::modelkind::FIT],
    language_model: None,
    image_classifier: Some(crate::pipeline::ImageClassifier { open: classify::open }),
    onnx: Some(crate::pipeline::OnnxExport { export: onnx::export_file }),
};
