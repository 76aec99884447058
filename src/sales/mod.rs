//! Regression on a table, by default `sales.tsv` (scripts/make-sales.py): Linear(n, H) → ReLU → Linear(H, 1) predicting
//! a numeric column from numeric, one-hot categorical and day-of-year features, mean squared error on standardised
//! values. Reading the table `table` (its dates `dates`), features and splits `datasets::features`, the model and its
//! CPU predictions `model`, the trainer `train` (the network as a layer stack, on `nn::stack`'s CPU reference or GPU
//! kernels), command `cli` (its flags `args`, the table it reads `data`, `epochs`, `ending`, `predict`).

pub mod args;
pub mod bench;
pub mod cli;
mod data;
mod ending;
mod epochs;
pub use crate::datasets::{dates, infer, table};
pub mod model;
pub mod modelfile;
mod predict;
pub mod train;

/// The sales pipeline as the command line, `selftest` and `bench` see it.
pub const PIPELINE: crate::pipeline::Pipeline = crate::pipeline::Pipeline {
    name: "sales",
    commands: &[crate::pipeline::Command {
        name: "sales",
        about: "Train a regressor on a table (CSV or TSV; a column --target), or predict with one",
        args: <args::SalesArgs as clap::Args>::augment_args,
        run: |m| cli::run(crate::pipeline::parsed(m)?),
    }],
    // It trains on the layer stack's kernels, which fit's checks cover (the sales shape among their fixed specs).
    checks: |_, _| Ok(Vec::new()),
    modules: |_| Vec::new(),
    benches: &[crate::pipeline::Bench {
        name: "sales",
        about: "Tabular regression: 50 epochs over a sales table (--table), GPU and CPU reference",
        args: <bench::SalesBenchArgs as clap::Args>::augment_args,
        run: |gpu, options, m| bench::bench(gpu, options, &crate::pipeline::parsed(m)?),
    }],
    models: &[&crate::io::modelkind::SALES],
    language_model: None,
    image_classifier: None,
    onnx: None,
};
