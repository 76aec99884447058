//! `textnet bench`: training speed on the GPU, timed with device events after warm-up, median of several
//! repeats (`timing`). Each pipeline's bench lives with it (`text::bench`, `mnist::bench`, `xor::bench`, `sales::bench`, `matmul::bench`, `transformer::bench`); this file only
//! lists them. Numbers go to BENCHMARKS.md; nothing here is asserted.

use crate::device::Gpu;
use anyhow::Result;
use std::sync::Arc;

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BenchTarget {
    /// Text model speed: single-sample and batched steps
    #[default]
    Text,
    /// Text model quality: GPU and CPU reference trained on the same samples; writes what the
    /// PyTorch baseline needs to repeat the run (`benches/torch_baseline.py --quality DIR`)
    Quality,
    /// MNIST pipeline speed and accuracy
    Mnist,
    /// XOR: the 5000-epoch run in one launch
    Xor,
    /// Tabular regression: 50 epochs over a sales table (--table), GPU and CPU reference
    Sales,
    /// 1024² fp32 matrix product: naive, tiled (gemm_128, 64² gemm_tile) and cuBLAS kernels
    Matmul,
    /// The character-level Transformer: 1000 steps on --corpus
    Transformer,
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Which pipeline to time
    #[arg(value_enum, default_value_t = BenchTarget::Text)]
    pub target: BenchTarget,
    /// Timed repeats per configuration (the median is reported)
    #[arg(long, default_value_t = 7)]
    pub repeats: usize,
    /// Print one JSON object instead of a table
    #[arg(long)]
    pub json: bool,
    /// text: only the single-sample configurations and the per-kernel timings
    #[arg(long)]
    pub single: bool,
    /// text: only the configurations with this batch size (1, 256 or 4096)
    #[arg(long)]
    pub batch: Option<usize>,
    /// quality, transformer: the corpus to train on
    #[arg(long, default_value = "corpus/shakespeare.txt")]
    pub corpus: std::path::PathBuf,
    /// quality: training samples (single-sample SGD steps)
    #[arg(long, default_value_t = 20_000)]
    pub samples: usize,
    /// quality: where to write tokens, sample order and initial parameters for the PyTorch run
    #[arg(long, default_value = "data/quality")]
    pub dump: std::path::PathBuf,
    /// quality, sales, transformer: seed of the sample order and of the initial parameters
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// quality, sales: skip the CPU reference run
    #[arg(long)]
    pub no_cpu: bool,
    /// sales: the table (scripts/make-sales.py writes it)
    #[arg(long, default_value = "data/sales.tsv")]
    pub table: std::path::PathBuf,
    /// mnist: the model to time
    #[arg(long, value_enum, default_value_t = crate::mnist::ModelKind::Mlp)]
    pub model: crate::mnist::ModelKind,
    /// transformer: the linear layers on the tensor cores in TF32
    #[arg(long)]
    pub tf32: bool,
    /// transformer: the larger shape (6 layers, 6 heads, d_model 384, block 256, batch 64), 200 steps
    #[arg(long)]
    pub large: bool,
    /// sales: epochs
    #[arg(long, default_value_t = crate::sales::model::DEFAULT_EPOCHS)]
    pub epochs: usize,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let gpu = Arc::new(Gpu::open(0).map_err(|e| anyhow::anyhow!("bench needs a CUDA GPU: {e:#}"))?);
    let repeats = args.repeats.max(1);
    match args.target {
        BenchTarget::Text => crate::text::bench::speed(&gpu, repeats, args.json, args.single, args.batch),
        BenchTarget::Quality => crate::text::bench::quality(
            &gpu,
            &crate::text::bench::QualityOptions {
                corpus: args.corpus,
                samples: args.samples,
                seed: args.seed,
                dump: args.dump,
                no_cpu: args.no_cpu,
                json: args.json,
            },
        ),
        BenchTarget::Mnist => match args.model {
            crate::mnist::ModelKind::Mlp => crate::mnist::bench::bench(&gpu, repeats, args.json),
            crate::mnist::ModelKind::Cnn => crate::mnist::bench::cnn_bench(&gpu, args.json),
        },
        BenchTarget::Xor => crate::xor::bench::bench(&gpu, repeats, args.json),
        BenchTarget::Matmul => crate::matmul::bench::bench(&gpu, repeats, args.json),
        BenchTarget::Transformer => {
            crate::transformer::bench::bench(&gpu, &args.corpus, args.seed, args.tf32, args.large, args.json)
        }
        BenchTarget::Sales => crate::sales::bench::bench(
            &gpu,
            &crate::sales::bench::SalesBenchOptions {
                table: &args.table,
                epochs: args.epochs,
                seed: args.seed,
                no_cpu: args.no_cpu,
                json: args.json,
            },
        ),
    }
}
