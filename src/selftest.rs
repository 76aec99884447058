//! `textnet selftest`: every pipeline's GPU kernels checked against its CPU reference on this machine's GPU
//! (each pipeline's checks live with it: `text::checks`, `mnist::checks`, `xor::checks`, `sales::checks`, `matmul::checks`, `transformer::checks`). Prints a table
//! (kernel, shape, relative error, tolerance, pass/fail) and exits non-zero on any failure.

use crate::check::{Check, Group, Plan};
use crate::device::Gpu;
use anyhow::{Result, bail};
use std::sync::Arc;
use std::time::Instant;

/// The pipelines, each with its checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Pipeline {
    Text,
    Mnist,
    Xor,
    Sales,
    Matmul,
    Transformer,
}

impl Pipeline {
    pub const ALL: [Pipeline; 6] =
        [Pipeline::Text, Pipeline::Mnist, Pipeline::Xor, Pipeline::Sales, Pipeline::Matmul, Pipeline::Transformer];
}

impl Pipeline {
    fn checks(self, gpu: &Arc<Gpu>, plan: &Plan) -> Result<Vec<Check>> {
        match self {
            Pipeline::Text => crate::text::checks::checks(gpu, plan),
            Pipeline::Mnist => crate::mnist::checks::selftest_checks(gpu, plan),
            Pipeline::Xor => crate::xor::checks::selftest_checks(gpu, plan),
            Pipeline::Sales => crate::sales::checks::selftest_checks(gpu, plan),
            Pipeline::Matmul => crate::matmul::checks::selftest_checks(gpu, plan),
            Pipeline::Transformer => crate::transformer::checks::selftest_checks(gpu, plan),
        }
    }
}

/// A pipeline or a group of checks, for `--only`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Only {
    Pipeline(Pipeline),
    Group(Group),
}

impl clap::ValueEnum for Only {
    fn value_variants<'a>() -> &'a [Self] {
        use Only::{Group as G, Pipeline as P};
        &[
            P(Pipeline::Text),
            P(Pipeline::Mnist),
            P(Pipeline::Xor),
            P(Pipeline::Sales),
            P(Pipeline::Matmul),
            P(Pipeline::Transformer),
            G(Group::Kernels),
            G(Group::Training),
            G(Group::Repeat),
        ]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        match self {
            Only::Pipeline(p) => p.to_possible_value(),
            Only::Group(g) => g.to_possible_value(),
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct SelftestArgs {
    /// Seed of the random inputs (default: a fresh one, printed so a failure can be repeated)
    #[arg(long)]
    pub seed: Option<u64>,
    /// Skip the largest shapes (quicker)
    #[arg(long)]
    pub quick: bool,
    /// Run only these pipelines and/or groups of checks (comma-separated), e.g. `--only training` or
    /// `--only text,kernels`
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Only>,
    /// Print the results as one JSON object
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: SelftestArgs) -> Result<()> {
    let started = Instant::now();
    let gpu = Arc::new(Gpu::open(0).map_err(|e| anyhow::anyhow!("selftest needs a CUDA GPU: {e:#}"))?);
    let opened = started.elapsed().as_secs_f64();
    let seed = args.seed.unwrap_or_else(rand::random);
    eprintln!("selftest on {} (seed {seed}; GPU opened in {opened:.1} s)", gpu.describe());
    let pipelines: Vec<Pipeline> =
        args.only.iter().filter_map(|o| if let Only::Pipeline(p) = o { Some(*p) } else { None }).collect();
    let groups = args.only.iter().filter_map(|o| if let Only::Group(g) = o { Some(*g) } else { None }).collect();
    let plan = Plan { seed, quick: args.quick, groups };
    let mut checks = Vec::new();
    for pipeline in Pipeline::ALL {
        if pipelines.is_empty() || pipelines.contains(&pipeline) {
            checks.extend(pipeline.checks(&gpu, &plan)?);
        }
    }
    let failed = checks.iter().filter(|c| !c.passed()).count();
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        let out = serde_json::json!({
            "device": gpu.describe(), "seed": seed, "failed": failed, "seconds": seconds, "gpu_open_seconds": opened,
            "checks": checks.iter().map(|c| serde_json::json!({
                "kernel": c.kernel, "shape": c.shape, "rel_error": c.rel_error, "tolerance": c.tolerance, "pass": c.passed()
            })).collect::<Vec<_>>(),
        });
        println!("{out}");
    } else {
        println!("{:<34} {:<34} {:>12} {:>10}  result", "kernel", "shape", "rel. error", "tolerance");
        for c in &checks {
            println!(
                "{:<34} {:<34} {:>12.3e} {:>10.0e}  {}",
                c.kernel,
                c.shape,
                c.rel_error,
                c.tolerance,
                if c.passed() { "pass" } else { "FAIL" }
            );
        }
        println!("{} checks, {} failed, {seconds:.1} s", checks.len(), failed);
    }
    if failed > 0 {
        bail!("{failed} of {} GPU checks failed (seed {seed})", checks.len());
    }
    Ok(())
}
