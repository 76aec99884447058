//! The character-level Transformer (`textnet transformer`): a GPT-style decoder over a corpus's characters, trained
//! with AdamW. The character vocabulary, the corpus split and the training and validation windows `data`; the CPU
//! reference of the model (forward, backward, training) `model`; the GPU trainer over fused/transformer.cu `gpu`; the
//! model file `modelfile`; the command `cli` (its flags `args`, `steps`, `ending`); sampling for `textnet generate`
//! `generate`; scoring a corpus for `textnet eval` `eval`; selftest checks `checks` and `bench`.

pub mod args;
pub mod bench;
pub mod checks;
pub mod cli;
pub mod data;
mod ending;
pub mod eval;
pub mod generate;
pub mod gpu;
pub mod model;
pub mod modelfile;
pub mod onnx;
mod steps;

/// The Transformer pipeline as the command line, `selftest`, `bench` and `generate` see it.
pub const PIPELINE: crate::pipeline::Pipeline = crate::pipeline::Pipeline {
    name: "transformer",
    commands: &[crate::pipeline::Command {
        name: "transformer",
        about: "Train the character-level Transformer on a UTF-8 corpus and write a .safetensors model file",
        args: <args::TransformerArgs as clap::Args>::augment_args,
        run: |m| cli::run(crate::pipeline::parsed(m)?),
    }],
    checks: checks::selftest_checks,
    modules: checks::modules,
    benches: &[crate::pipeline::Bench {
        name: "transformer",
        about: "The character-level Transformer: 1000 steps on --corpus",
        args: <bench::TransformerBenchArgs as clap::Args>::augment_args,
        run: |gpu, options, m| bench::bench(gpu, options, &crate::pipeline::parsed(m)?),
    }],
    models: &[&crate::io::modelkind::TRANSFORMER],
    language_model: Some(crate::pipeline::LanguageModel { open: generate::open, evaluate: eval::evaluate }),
    image_classifier: None,
    onnx: Some(crate::pipeline::OnnxExport { export: onnx::export_file }),
};
