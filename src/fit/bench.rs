//! `textnet bench fit`: a spec trained on the GPU, on Fashion-MNIST as `textnet bench mnist` times the
//! hand-fused MLP (same data, batch, optimizer, shuffle stream and, with `--init xavier`, the same initial
//! weights), or on a table as `textnet bench sales` times the hand-fused sales model; beside
//! `benches/fit_torch.py --train`. The timing itself is `nn::stack::bench`'s.

use super::args::TableArgs;
use super::data::{self as fit_data, Request, Source};
use super::epochs::figures;
use crate::device::Gpu;
use crate::harness::args::OptimArgs;
use crate::nn::stack::bench::StackBench;
use crate::nn::stack::model::{Init, Network};
use crate::nn::stack::spec;
use anyhow::Result;
use std::sync::Arc;

/// The flags of `bench fit`.
#[derive(clap::Args, Debug)]
pub struct FitBenchArgs {
    /// The model, as `textnet fit --layers` takes it
    #[arg(long, default_value = "Linear(784, 128), ReLU, Linear(128, 10)")]
    pub layers: String,
    /// Initial weights (`xavier` draws what `textnet mnist` draws for its MLP)
    #[arg(long, value_enum, default_value_t = Init::Xavier)]
    pub init: Init,
    #[command(flatten)]
    /// The optimizer flags.
    pub optim: OptimArgs,
    /// Passes over the training images
    #[arg(long, default_value_t = 10)]
    pub epochs: usize,
    /// Samples per step
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Seed of the weights, the shuffle and dropout (0 is `bench mnist`'s)
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    /// A table to train on instead of Fashion-MNIST.
    pub tabular: TableArgs,
}

/// `textnet bench fit`.
pub fn run(gpu: &Arc<Gpu>, options: &crate::pipeline::BenchOptions, args: &FitBenchArgs) -> Result<()> {
    use crate::datasets::mnist::Dataset;
    let spec = spec::parse(&args.layers)?;
    let source = match args.tabular.source()? {
        Some(table) => table,
        None => Source::Images { dataset: Dataset::Fashion, dir: None },
    };
    let request = Request { loss: None, seed: args.seed, train_limit: None, val_split: None };
    let data = fit_data::load(&source, &spec, request, &|note| eprintln!("{note}"))?;
    let net = Network::new(&spec, data.input)?;
    let bench = StackBench {
        layers: args.layers.clone(),
        net,
        init: args.init,
        loss: data.loss,
        optim: args.optim.config()?,
        epochs: args.epochs,
        batch: args.batch,
        seed: args.seed,
        source: data.source.clone(),
        train: Arc::new(data.train.clone()),
        test: Arc::new(data.test.clone()),
    };
    let test = bench.test.clone();
    crate::nn::stack::bench::run(gpu, options.repeats, options.json, &bench, &|loss, outputs| {
        figures(&data.target, &test, &data.test_values, loss, outputs)
    })
}
