//! The `textnet` command line. Each subcommand lives with its pipeline; this file only dispatches and
//! turns errors into one line on stderr and a non-zero exit.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{FromArgMatches, Subcommand};
use textnet::pipelines;

#[global_allocator]
static ALLOCATOR: textnet::io::resources::Allocator = textnet::io::resources::Allocator;

// The commands of textnet itself; each pipeline's come from its entry in `pipelines::ALL`.
#[derive(Subcommand)]
enum Command {
    /// Continue a prompt by sampling tokens from a trained model file
    Generate(textnet::commands::generate::GenerateArgs),
    /// Evaluate a trained text model or Transformer on a corpus, without training
    Eval(textnet::pipeline::EvalArgs),
    /// Classify images (PNG, JPEG, PGM/PPM or IDX) with a trained image model file of textnet mnist or fit
    Classify(textnet::commands::classify::ClassifyArgs),
    /// Write a trained model file as an ONNX model (a fit or Sequential network, an MNIST MLP or CNN, a
    /// Transformer), e.g. `textnet export --onnx model.onnx model.safetensors`
    Export(textnet::commands::export::ExportArgs),
    /// Check every GPU kernel against the CPU reference on this machine's GPU
    Selftest(textnet::commands::selftest::SelftestArgs),
    /// Measure training speed on the GPU (the text model, or `bench BENCH`)
    Bench(textnet::commands::bench::BenchArgs),
    /// Print a shell completion script, e.g. `textnet completions bash > ~/.local/share/bash-completion/completions/textnet`
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
    /// Print a manual page (roff): textnet's, e.g. `textnet man > textnet.1 && man ./textnet.1`, or a
    /// command's, e.g. `textnet man train > textnet-train.1`
    Man {
        /// The command whose page to print, as the pages name it (`train` for textnet-train(1), `bench fit`
        /// for textnet-bench-fit(1)); without one, textnet's own page
        command: Vec<String>,
    },
}

/// The whole command line: the pipelines' commands, in the list's order, then textnet's own.
fn command_line() -> clap::Command {
    let command = clap::Command::new("textnet")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Small neural networks trained with fused CUDA kernels, with a CPU reference for each")
        .subcommand_required(true)
        .arg_required_else_help(true)
        .arg(
            clap::Arg::new("verbose")
                .short('v')
                .long("verbose")
                .global(true)
                .action(clap::ArgAction::SetTrue)
                .help("Print where the start-up time goes: finding the driver, opening the GPU, each kernel compile"),
        );
    let pipelines = pipelines::ALL
        .iter()
        .flat_map(|p| p.commands.iter())
        .map(|c| (c.args)(clap::Command::new(c.name)).about(c.about));
    Command::augment_subcommands(command.subcommands(pipelines))
}

fn main() {
    // Last line of defence: an internal bug prints one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let msg = textnet::device::panic_message(info.payload());
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("textnet: internal error{at}: {msg} (this is a bug; please report it)");
    }));
    let matches = parse_args();
    textnet::device::phases::set_verbose(matches.get_flag("verbose"));
    let result = textnet::io::resources::start_threads().and_then(|()| run(&matches));
    let result = result.and_then(|()| textnet::harness::console::finish());
    if let Err(err) = result {
        let text = format!("{err:#}");
        textnet::harness::console::err(&format!("textnet: error: {}", text.trim_end()));
        let interrupted = err.downcast_ref::<textnet::harness::interrupt::Interrupted>().is_some();
        std::process::exit(if interrupted { textnet::harness::interrupt::EXIT_STATUS } else { 1 });
    }
}

/// The chosen command, run.
fn run(matches: &clap::ArgMatches) -> anyhow::Result<()> {
    let (name, sub) = matches.subcommand().expect("a subcommand is required");
    if let Some(command) = pipelines::ALL.iter().flat_map(|p| p.commands.iter()).find(|c| c.name == name) {
        return (command.run)(sub);
    }
    // A parse error found here (a flag given to the wrong bench) exits as clap's own do.
    let command = Command::from_arg_matches(matches).unwrap_or_else(|err| err.format(&mut full_command_line()).exit());
    match command {
        Command::Generate(args) => textnet::commands::generate::run(args),
        Command::Eval(args) => textnet::commands::generate::evaluate(args),
        Command::Classify(args) => textnet::commands::classify::run(args),
        Command::Export(args) => textnet::commands::export::run(args),
        Command::Selftest(args) => textnet::commands::selftest::run(args),
        Command::Bench(args) => textnet::commands::bench::run(args),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut full_command_line(), "textnet", &mut script);
            textnet::harness::console::out(String::from_utf8_lossy(&script).trim_end());
            Ok(())
        }
        Command::Man { command } => {
            let mut page = Vec::new();
            let source = format!("textnet {}", env!("CARGO_PKG_VERSION"));
            clap_mangen::Man::new(manual_page_command(&command)?).source(source).render(&mut page)?;
            textnet::harness::console::out(String::from_utf8_lossy(&page).trim_end());
            Ok(())
        }
    }
}

/// The command `textnet man NAME…` describes, found by the names of its path below textnet (none for
/// textnet itself). Built first, so that its page's title is the name the pages refer to it by
/// (`textnet-bench-fit`) and its synopsis the words a user types (`textnet bench fit`).
fn manual_page_command(path: &[String]) -> anyhow::Result<clap::Command> {
    // clap's `help` command has no page of its own: `--help` is on every page.
    let mut command = full_command_line().disable_help_subcommand(true);
    command.build();
    for (depth, name) in path.iter().enumerate() {
        let Some(sub) = command.find_subcommand(name) else {
            let parent = ["textnet"].into_iter().chain(path[..depth].iter().map(String::as_str)).collect::<Vec<_>>();
            let known: Vec<&str> = command.get_subcommands().map(clap::Command::get_name).collect();
            anyhow::bail!(match known.is_empty() {
                true => format!("`{}` has no commands, so no page for `{name}`", parent.join(" ")),
                false => format!("`{}` has no command `{name}` (its commands: {})", parent.join(" "), known.join(", ")),
            });
        };
        command = sub.clone();
    }
    Ok(command)
}

/// The command line, with negative numbers read as values wherever an argument takes one (`--seed -1`
/// is then refused by the flag's own type, naming the flag, rather than read as an unknown flag `-1`).
/// Only there: clap refuses the setting on a flag that takes no value (`--verbose`, `--json`), in its
/// debug assertions.
fn full_command_line() -> clap::Command {
    fn takes_values(arg: &clap::Arg) -> bool {
        arg.get_action().takes_values() && arg.get_num_args().is_none_or(|n| n.takes_values())
    }
    fn numbers_may_be_negative(command: clap::Command) -> clap::Command {
        command
            .mut_args(|arg| if takes_values(&arg) { arg.allow_negative_numbers(true) } else { arg })
            .mut_subcommands(numbers_may_be_negative)
    }
    numbers_may_be_negative(command_line())
}

fn parse_args() -> clap::ArgMatches {
    let matches = full_command_line().try_get_matches();
    matches.unwrap_or_else(|err| {
        let line = match err.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                // clap's own exit ignores a failed write: the help or version would be lost without a word.
                let printed = err.print().and_then(|()| std::io::Write::flush(&mut std::io::stdout()));
                match printed {
                    Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                        textnet::harness::console::err(&format!(
                            "textnet: error: cannot write to standard output: {e}"
                        ));
                        std::process::exit(1)
                    }
                    _ => std::process::exit(err.exit_code()),
                }
            }
            _ => {
                negative_value_error(&err).or_else(|| data_parallel_flag_error(&err)).unwrap_or_else(|| one_line(&err))
            }
        };
        textnet::harness::console::err(&line);
        std::process::exit(err.exit_code());
    })
}

/// A usage error in one line, as the program's own errors are: clap's message and tip, then the usage.
fn one_line(err: &clap::Error) -> String {
    let text = err.render().to_string();
    let (mut message, mut usage) = (Vec::new(), Vec::new());
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("For more information")) {
        match line.strip_prefix("Usage: ") {
            Some(form) => usage.push(form),
            None if !usage.is_empty() => usage.push(line),
            None => message.push(line.strip_prefix("error: ").unwrap_or(line)),
        }
    }
    let usage = match usage.is_empty() {
        true => String::new(),
        false => format!(" (usage: {}; more with --help)", usage.join(" | ")),
    };
    format!("textnet: error: {}{usage}", message.join(" "))
}

/// The flags of whole numbers that refuse 0 too (each command's own check says "must be at least 1").
const COUNTS_FROM_ONE: &[&str] = &[
    "--epochs",
    "--batch",
    "--steps",
    "--hidden",
    "--top",
    "--top-k",
    "--train-limit",
    "--eval-every",
    "--eval-iters",
    "--patience",
    "--context",
    "--log-every",
    "--max-tokens",
    "--gpus",
    "--world-size",
];

/// One line for a negative value given to a flag that takes whole numbers of 0 (or 1) or more.
fn negative_value_error(err: &clap::Error) -> Option<String> {
    if err.kind() != ErrorKind::ValueValidation {
        return None;
    }
    let (Some(ContextValue::String(arg)), Some(ContextValue::String(value))) =
        (err.get(ContextKind::InvalidArg), err.get(ContextKind::InvalidValue))
    else {
        return None;
    };
    let flag = arg.split_whitespace().next().unwrap_or(arg);
    let unsigned = std::error::Error::source(err)
        .and_then(|e| e.downcast_ref::<std::num::ParseIntError>())
        .is_some_and(|e| *e.kind() == std::num::IntErrorKind::InvalidDigit);
    let least = if COUNTS_FROM_ONE.contains(&flag) { 1 } else { 0 };
    (value.starts_with('-') && unsigned)
        .then(|| format!("textnet: error: {flag} takes a whole number of {least} or more, got {value}"))
}

/// One line for a data-parallel flag (`parallel::FLAGS`) given to a command that has none, naming the
/// commands that take it (clap's tip, to pass it as a value after `--`, would make it a file name).
fn data_parallel_flag_error(err: &clap::Error) -> Option<String> {
    if err.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    let flag = arg.split('=').next()?.strip_prefix("--")?;
    if !textnet::device::parallel::FLAGS.contains(&flag) {
        return None;
    }
    let line = command_line();
    let owners: Vec<&str> = line
        .get_subcommands()
        .filter(|c| c.get_arguments().any(|a| a.get_long() == Some(flag)))
        .map(clap::Command::get_name)
        .collect();
    let runs = match command_of_usage(&err.render().to_string(), &line) {
        given if given.is_empty() => String::new(),
        given => format!(" ({given} runs on one GPU)"),
    };
    Some(format!("textnet: error: --{flag} is a flag of {} only{runs}", owners.join(" and ")))
}

/// The command a usage error names: "bench mnist" for "Usage: textnet bench mnist [OPTIONS]"; empty for
/// textnet itself.
fn command_of_usage(text: &str, line: &clap::Command) -> String {
    let usage = text.lines().find_map(|l| l.trim().strip_prefix("Usage: ")).unwrap_or_default();
    let mut command = line;
    let mut names = Vec::new();
    for word in usage.split_whitespace().skip(1) {
        let Some(sub) = command.find_subcommand(word) else { break };
        names.push(word);
        command = sub;
    }
    names.join(" ")
}

#[cfg(test)]
mod tests {
    /// Every subcommand, at any depth, of `command` (built), with `command` itself first.
    fn all_commands(command: &clap::Command) -> Vec<&clap::Command> {
        std::iter::once(command).chain(command.get_subcommands().flat_map(all_commands)).collect()
    }

    /// clap's own checks of the whole command tree (they run in debug builds, where a contradiction
    /// crashes `textnet --help` at start-up), and the one they once caught checked here too, so that it
    /// fails in release test builds, where clap compiles its checks out.
    #[test]
    fn the_command_line_passes_claps_debug_assertions() {
        super::full_command_line().debug_assert();
        let mut command = super::full_command_line();
        command.build();
        let mut negative = 0;
        for sub in all_commands(&command) {
            for arg in sub.get_arguments().filter(|a| a.is_allow_negative_numbers_set()) {
                let takes = arg.get_num_args().is_some_and(|n| n.takes_values());
                assert!(
                    takes,
                    "{} --{}: negative numbers allowed on an argument that takes no value",
                    sub.get_name(),
                    arg.get_id()
                );
                negative += 1;
            }
        }
        assert!(negative > 10, "negative numbers allowed on only {negative} arguments");
        let verbose = command.get_arguments().find(|a| a.get_id() == "verbose").expect("--verbose");
        assert!(!verbose.is_allow_negative_numbers_set());
    }
}
