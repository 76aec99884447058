//! `textnet bench`: training speed on the GPU, timed with device events after warm-up, median of several
//! repeats (`timing`). Each pipeline's benches live with it and own their flags (`Pipeline::benches`);
//! this file makes them subcommands. `textnet bench` alone runs the first (the text model's speed), with
//! its flags. Numbers go to BENCHMARKS.md; nothing here is asserted.

use crate::device::Gpu;
use crate::pipeline::{Bench, BenchOptions};
use crate::pipelines;
use anyhow::Result;
use clap::{ArgMatches, FromArgMatches};
use std::sync::Arc;

/// The flags of `textnet bench`: the shared ones, and the bench to run with its own.
#[derive(Debug)]
pub struct BenchArgs {
    /// The flags every bench takes (`--repeats`, `--json`).
    pub options: BenchOptions,
    /// The bench to run.
    pub bench: &'static Bench,
    matches: ArgMatches,
}

/// The benches of the shared layers (`nn`), after the pipelines'.
const SHARED_BENCHES: [&Bench; 1] = [&crate::nn::bench::BENCH];

fn benches() -> impl Iterator<Item = &'static Bench> {
    pipelines::ALL.iter().flat_map(|p| p.benches.iter()).chain(SHARED_BENCHES)
}

/// The bench `textnet bench` runs without a subcommand.
fn default_bench() -> &'static Bench {
    benches().next().expect("a pipeline has a bench")
}

impl clap::Args for BenchArgs {
    fn augment_args(command: clap::Command) -> clap::Command {
        let command = command
            .arg(
                clap::Arg::new("repeats")
                    .long("repeats")
                    .value_name("REPEATS")
                    .global(true)
                    .value_parser(clap::value_parser!(usize))
                    .default_value("7")
                    .help("Timed repeats per configuration (the median is reported)"),
            )
            .arg(
                clap::Arg::new("json")
                    .long("json")
                    .global(true)
                    .action(clap::ArgAction::SetTrue)
                    .help("Print one JSON object instead of a table"),
            )
            .subcommand_value_name("BENCH")
            .subcommand_help_heading("Benches");
        let default = default_bench();
        let command = (default.args)(command)
            .after_help(format!("Without a BENCH, runs `{}` (its flags may be given here).", default.name));
        benches().fold(command, |command, b| command.subcommand((b.args)(clap::Command::new(b.name)).about(b.about)))
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

impl FromArgMatches for BenchArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let options = BenchOptions {
            repeats: matches.get_one::<usize>("repeats").copied().unwrap_or(7).max(1),
            json: matches.get_flag("json"),
        };
        let (bench, matches) = match matches.subcommand() {
            Some((name, sub)) => {
                if let Some(flag) = default_bench_flag_given(matches) {
                    return Err(clap::Error::raw(
                        clap::error::ErrorKind::ArgumentConflict,
                        format!(
                            "--{flag} is a flag of `bench {}`, not of `bench {name}` (see `textnet bench {name} --help`)",
                            default_bench().name
                        ),
                    ));
                }
                (
                    benches()
                        .find(|b| b.name == name)
                        .ok_or_else(|| clap::Error::raw(clap::error::ErrorKind::InvalidSubcommand, name))?,
                    sub.clone(),
                )
            }
            None => (default_bench(), matches.clone()),
        };
        Ok(BenchArgs { options, bench, matches })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

/// A flag of the default bench given on the command line (`bench --single mnist`), which a subcommand
/// would silently ignore.
fn default_bench_flag_given(matches: &ArgMatches) -> Option<String> {
    matches
        .ids()
        .map(|id| id.as_str())
        .filter(|id| !matches!(*id, "repeats" | "json"))
        .find(|id| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
        .map(str::to_owned)
}

/// Runs the chosen bench on GPU 0.
pub fn run(args: BenchArgs) -> Result<()> {
    let gpu = Arc::new(Gpu::open(0).map_err(|e| anyhow::anyhow!("bench needs a CUDA GPU: {e:#}"))?);
    (args.bench.run)(&gpu, &args.options, &args.matches)
}
