//! The `textnet` command line. Each subcommand lives with its pipeline; this file only dispatches and
//! turns errors into one line on stderr and a non-zero exit.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use textnet::{bench, mnist, sales, selftest, text, transformer, xor};

#[derive(Parser)]
#[command(name = "textnet", version, about = "Small neural networks trained with fused CUDA kernels, with a CPU reference for each", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train the next-token model on a UTF-8 text corpus and write a .safetensors model file
    Train(text::cli::TrainArgs),
    /// Print the likeliest next tokens after a context, using a trained model file
    Predict(text::cli::PredictArgs),
    /// Continue a prompt by sampling tokens from a trained model file
    Generate(textnet::generate::GenerateArgs),
    /// Evaluate a trained text model on a corpus, without training
    Eval(text::eval::EvalArgs),
    /// Train the MNIST / Fashion-MNIST classifier (784 → hidden → 10)
    Mnist(mnist::cli::MnistArgs),
    /// Classify 28×28 greyscale images (PNG, PGM or IDX) with a trained MNIST model file
    Classify(mnist::classify::ClassifyArgs),
    /// Train the XOR network (2 → hidden → 1, MSE) and print its truth table
    Xor(xor::cli::XorArgs),
    /// Train the tabular regressor (by default on the roadmap's sales.tsv), or predict with one
    Sales(sales::cli::SalesArgs),
    /// Train the character-level Transformer on a UTF-8 corpus and write a .safetensors model file
    Transformer(transformer::cli::TransformerArgs),
    /// Check every GPU kernel against the CPU reference on this machine's GPU
    Selftest(selftest::SelftestArgs),
    /// Measure training speed on the GPU (text model, or `bench mnist`)
    Bench(bench::BenchArgs),
}

fn main() {
    // Last line of defence: an internal bug prints one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("unknown");
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("textnet: internal error{at}: {msg} (this is a bug; please report it)");
    }));
    let cli = parse_args();
    let result = match cli.command {
        Command::Train(args) => text::cli::train(args),
        Command::Predict(args) => text::cli::predict(args),
        Command::Generate(args) => textnet::generate::run(args),
        Command::Eval(args) => text::eval::run(args),
        Command::Mnist(args) => mnist::cli::run(args),
        Command::Classify(args) => mnist::classify::run(args),
        Command::Xor(args) => xor::cli::run(args),
        Command::Sales(args) => sales::cli::run(args),
        Command::Transformer(args) => transformer::cli::run(args),
        Command::Selftest(args) => selftest::run(args),
        Command::Bench(args) => bench::run(args),
    };
    let result = result.and_then(|()| textnet::console::finish());
    if let Err(err) = result {
        let text = format!("{err:#}");
        textnet::console::err(&format!("textnet: error: {}", text.trim_end()));
        let interrupted = err.downcast_ref::<textnet::interrupt::Interrupted>().is_some();
        std::process::exit(if interrupted { textnet::interrupt::EXIT_STATUS } else { 1 });
    }
}

/// The command line, with negative numbers read as values wherever a flag takes one (`--seed -1` is
/// then refused by the flag's own type, naming the flag, rather than read as an unknown flag `-1`).
fn parse_args() -> Cli {
    fn numbers_may_be_negative(command: clap::Command) -> clap::Command {
        command.mut_args(|arg| arg.allow_negative_numbers(true)).mut_subcommands(numbers_may_be_negative)
    }
    let matches = numbers_may_be_negative(Cli::command()).try_get_matches().and_then(|m| Cli::from_arg_matches(&m));
    matches.unwrap_or_else(|err| {
        if let Some(line) = negative_value_error(&err) {
            textnet::console::err(&line);
            std::process::exit(2);
        }
        err.exit()
    })
}

/// One line for a negative value given to a flag that takes whole numbers of 0 or more.
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
    (value.starts_with('-') && unsigned)
        .then(|| format!("textnet: error: {flag} takes a whole number of 0 or more, got {value}"))
}
