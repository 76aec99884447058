//! `textnet selftest`: every pipeline's GPU kernels checked against its CPU reference on this machine's GPU
//! (each pipeline's checks live with it, in `Pipeline::checks`; this file loops over `pipelines::ALL`).
//! Prints a table (kernel, shape, relative error, tolerance, pass/fail) and exits non-zero on any failure.

use crate::device::Gpu;
use crate::harness::check::{Check, Group, Plan, Suite};
use crate::pipeline::Pipeline;
use crate::pipelines;
use anyhow::{Result, bail};
use std::sync::Arc;
use std::time::Instant;

/// The shared layers with checks of their own.
pub const SUITES: [&Suite; 1] = [&crate::nn::checks::SUITE];

/// A pipeline, a shared layer or a group of checks, for `--only`.
#[derive(Clone, Copy, Debug)]
pub enum Only {
    /// Every check of one pipeline.
    Pipeline(&'static Pipeline),
    /// Every check of one shared layer (`nn`).
    Suite(&'static Suite),
    /// One group of checks across the pipelines.
    Group(Group),
}

impl PartialEq for Only {
    fn eq(&self, other: &Only) -> bool {
        match (self, other) {
            (Only::Pipeline(a), Only::Pipeline(b)) => a.name == b.name,
            (Only::Suite(a), Only::Suite(b)) => a.name == b.name,
            (Only::Group(a), Only::Group(b)) => a == b,
            _ => false,
        }
    }
}

impl clap::ValueEnum for Only {
    fn value_variants<'a>() -> &'a [Self] {
        static VARIANTS: std::sync::LazyLock<Vec<Only>> = std::sync::LazyLock::new(|| {
            let pipelines = pipelines::ALL.iter().map(|p| Only::Pipeline(p));
            let suites = SUITES.iter().map(|s| Only::Suite(s));
            let groups = Group::value_variants().iter().map(|g| Only::Group(*g));
            pipelines.chain(suites).chain(groups).collect()
        });
        &VARIANTS
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        match self {
            Only::Pipeline(p) => Some(clap::builder::PossibleValue::new(p.name)),
            Only::Suite(s) => Some(clap::builder::PossibleValue::new(s.name)),
            Only::Group(g) => g.to_possible_value(),
        }
    }
}

#[derive(clap::Args, Debug)]
/// The flags of `textnet selftest`.
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

/// What a selftest found: the GPU, the seed of its inputs and every check.
#[derive(Debug)]
pub struct Outcome {
    /// The GPU, described.
    pub device_name: String,
    /// Seed of the random inputs.
    pub seed: u64,
    /// Seconds the GPU took to open.
    pub gpu_open_seconds: f64,
    /// Every check, in the pipelines' order.
    pub checks: Vec<Check>,
}

/// Runs the selected checks on GPU 0 (progress on stderr) and returns them, passed or not.
pub fn checks(args: &SelftestArgs) -> Result<Outcome> {
    let started = Instant::now();
    let gpu = Arc::new(Gpu::open(0).map_err(|e| anyhow::anyhow!("selftest needs a CUDA GPU: {e:#}"))?);
    let opened = started.elapsed().as_secs_f64();
    let seed = args.seed.unwrap_or_else(rand::random);
    eprintln!("selftest on {} (seed {seed}; GPU opened in {opened:.1} s)", gpu.describe());
    let chosen: Vec<&str> = (args.only.iter())
        .filter_map(|o| match o {
            Only::Pipeline(p) => Some(p.name),
            Only::Suite(s) => Some(s.name),
            Only::Group(_) => None,
        })
        .collect();
    let groups = args.only.iter().filter_map(|o| if let Only::Group(g) = o { Some(*g) } else { None }).collect();
    let plan = Plan { seed, quick: args.quick, groups };
    let wanted = || pipelines::ALL.iter().filter(|p| chosen.is_empty() || chosen.contains(&p.name));
    let suites = || SUITES.into_iter().filter(|s| chosen.is_empty() || chosen.contains(&s.name));
    // Every kernel module first, on every core: the checks then wait for the slowest compile, not the sum.
    let compiling = Instant::now();
    let modules: Vec<_> =
        wanted().flat_map(|p| (p.modules)(&plan)).chain(suites().flat_map(|s| (s.modules)(&plan))).collect();
    let count = crate::device::compile::precompile(gpu.compute_capability, &modules);
    let (_, built_in) = crate::device::compile::precompiled_count();
    crate::device::phases::note(
        compiling,
        &format!("{count} kernel modules ready (built into the binary: {built_in})"),
    );
    let mut checks = Vec::new();
    for pipeline in wanted() {
        let checking = Instant::now();
        checks.extend((pipeline.checks)(&gpu, &plan)?);
        crate::device::phases::note(checking, &format!("{} checks", pipeline.name));
    }
    for suite in suites() {
        let checking = Instant::now();
        checks.extend((suite.checks)(&gpu, &plan)?);
        crate::device::phases::note(checking, &format!("{} checks", suite.name));
    }
    Ok(Outcome { device_name: gpu.describe(), seed, gpu_open_seconds: opened, checks })
}

/// Runs the selected checks on GPU 0 and prints each result (or the JSON report).
pub fn run(args: SelftestArgs) -> Result<()> {
    let started = Instant::now();
    let Outcome { device_name, seed, gpu_open_seconds: opened, checks } = checks(&args)?;
    let failed = checks.iter().filter(|c| !c.passed()).count();
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        let out = serde_json::json!({
            "device": "cuda:0", "device_name": device_name, "seed": seed, "failed": failed, "seconds": seconds, "gpu_open_seconds": opened,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::check::Plan;
    use std::collections::BTreeSet;

    #[test]
    fn every_module_the_selftest_compiles_is_compiled_at_build_time() {
        let listed = crate::device::compile::precompiled_lines();
        let mut missing = BTreeSet::new();
        for quick in [false, true] {
            let plan = Plan { seed: 1, quick, groups: Vec::new() };
            for pipeline in pipelines::ALL {
                // `fit`'s too: its random specs come from a fixed stream, so their modules are known here.
                let lines = (pipeline.modules)(&plan).into_iter().map(|r| crate::device::compile::precompiled_line(&r));
                missing.extend(lines.filter(|l| !listed.contains(l)));
            }
            for suite in SUITES {
                let lines = (suite.modules)(&plan).into_iter().map(|r| crate::device::compile::precompiled_line(&r));
                missing.extend(lines.filter(|l| !listed.contains(l)));
            }
        }
        assert!(
            missing.is_empty(),
            "add to fused/precompiled.txt:\n{}",
            missing.into_iter().collect::<Vec<_>>().join("\n")
        );
        let distinct: BTreeSet<&String> = listed.iter().collect();
        assert_eq!(distinct.len(), listed.len(), "fused/precompiled.txt lists a module twice");
    }
}
