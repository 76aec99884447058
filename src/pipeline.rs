//! What a pipeline shows the rest of textnet: its commands, its selftest checks, its benches, the kinds of
//! model file it writes and, for language models, how they generate and are evaluated (`EvalArgs`, the
//! flags of `textnet eval`, and `Evaluation`, what a model scored); for image classifiers, how they are
//! opened for `classify` (`ImageModel`); for models that travel, how they are written as ONNX. Each
//! pipeline describes itself in one `PIPELINE` constant in its `mod.rs`; `pipelines::ALL` lists them, and
//! the command line, `selftest`, `bench`, `generate`, `eval`, `classify` and `export` loop over that list
//! instead of naming pipelines.

use crate::device::{Gpu, compile::ModuleRequest};
use crate::harness::check::{Check, Plan};
use crate::io::modelkind::Kind;
use crate::ops::sampling::Generator;
use anyhow::Result;
use indicatif::ProgressBar;
use std::path::PathBuf;
use std::sync::Arc;

/// One pipeline: its commands, selftest checks, benches and the model files it writes.
pub struct Pipeline {
    /// The name `selftest --only` and the layout know it by (its folder under `src/`).
    pub name: &'static str,
    /// Its subcommands of `textnet`.
    pub commands: &'static [Command],
    /// The GPU-against-CPU checks `textnet selftest` runs.
    pub checks: fn(&Arc<Gpu>, &Plan) -> Result<Vec<Check>>,
    /// The kernel modules those checks compile, so that the selftest compiles them all at once first.
    pub modules: fn(&Plan) -> Vec<ModuleRequest>,
    /// Its subcommands of `textnet bench`.
    pub benches: &'static [Bench],
    /// The kinds of model file it writes.
    pub models: &'static [&'static Kind],
    /// `textnet generate` and `textnet eval` for its model files, if they are language models.
    pub language_model: Option<LanguageModel>,
    /// `textnet classify` for its model files, if they can be image classifiers.
    pub image_classifier: Option<ImageClassifier>,
    /// `textnet export --onnx` for its model files, if they can be written as ONNX graphs.
    pub onnx: Option<OnnxExport>,
}

/// How a pipeline's language model files generate and are evaluated; the commands around both are shared
/// (`generate`, `sampling`, `eval`).
pub struct LanguageModel {
    /// The model file's bytes read for sampling.
    pub open: fn(&[u8]) -> Result<Box<dyn Generator>>,
    /// The model file's bytes scored on `eval`'s corpus, advancing the bar by the samples done (it sets
    /// the bar's length).
    pub evaluate: fn(&[u8], &EvalArgs, &ProgressBar) -> Result<Evaluation>,
}

/// How a pipeline's model files are opened as image classifiers; the command around it is shared
/// (`classify`).
pub struct ImageClassifier {
    /// The model file's bytes, read from the path given (for messages), opened as an image classifier;
    /// an error when the file holds a model of something else (a table).
    pub open: fn(&[u8], &std::path::Path) -> Result<ImageModel>,
}

/// How a pipeline's model files are written as ONNX graphs (`crate::io::onnx`); the command around it is
/// shared (`export`).
pub struct OnnxExport {
    /// The model file's bytes as the bytes of an ONNX file.
    pub export: fn(&[u8]) -> Result<Vec<u8>>,
}

/// A subcommand of `textnet`.
pub struct Command {
    /// The subcommand's name, e.g. "xor".
    pub name: &'static str,
    /// Its one-line description in `--help`.
    pub about: &'static str,
    /// Its flags (`<Args as clap::Args>::augment_args`).
    pub args: fn(clap::Command) -> clap::Command,
    /// Parses its flags from the matches and runs it.
    pub run: fn(&clap::ArgMatches) -> Result<()>,
}

/// A subcommand of `textnet bench`, with its own flags.
pub struct Bench {
    /// The bench's name, e.g. "matmul".
    pub name: &'static str,
    /// Its one-line description in `--help`.
    pub about: &'static str,
    /// Its own flags (`<Args as clap::Args>::augment_args`).
    pub args: fn(clap::Command) -> clap::Command,
    /// Runs it on the GPU with the shared options and its own parsed flags.
    pub run: fn(&Arc<Gpu>, &BenchOptions, &clap::ArgMatches) -> Result<()>,
}

/// The flags every bench takes.
#[derive(Clone, Copy, Debug)]
pub struct BenchOptions {
    /// Timed repeats per configuration (the median is reported), at least 1.
    pub repeats: usize,
    /// One JSON object instead of a table.
    pub json: bool,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl std::fmt::Debug for Bench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Parses a command's flags from its matches (the derive's own parser, as a plain function so a
/// `Command`'s or `Bench`'s `run` can be a closure without captures).
pub fn parsed<A: clap::FromArgMatches>(matches: &clap::ArgMatches) -> Result<A> {
    Ok(A::from_arg_matches(matches)?)
}

/// The scores of `rows` images from their inputs (`ImageModel::scores`).
pub type Scores = Box<dyn Fn(&[f32], usize) -> Vec<f32> + Send + Sync>;

/// A model file opened as an image classifier: what images it reads, how their pixels become its
/// inputs, its classes, and its scores on the CPU.
pub struct ImageModel {
    /// Channels of the images it reads (1: greyscale).
    pub channels: usize,
    /// Their height in pixels.
    pub height: usize,
    /// Their width in pixels.
    pub width: usize,
    /// How an image's pixel bytes become the model's inputs, as the file records it
    /// (`datasets::mnist::INPUT_SCALING`: each byte divided by 255, row by row).
    pub scaling: String,
    /// The name of each class, in the order of the model's outputs.
    pub class_names: Vec<String>,
    /// The scores (logits: the softmax of a row is its classes' probabilities) of `rows` images,
    /// `rows × classes`, from their inputs (`rows × channels × height × width`, scaled), on the CPU.
    pub scores: Scores,
}

impl ImageModel {
    /// Inputs per image.
    pub fn inputs(&self) -> usize {
        self.channels * self.height * self.width
    }
}

impl std::fmt::Debug for ImageModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageModel")
            .field("channels", &self.channels)
            .field("height", &self.height)
            .field("width", &self.width)
            .field("scaling", &self.scaling)
            .field("class_names", &self.class_names)
            .finish_non_exhaustive()
    }
}

/// `textnet eval`'s flags.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// UTF-8 text to evaluate on, `-` for standard input
    pub corpus: PathBuf,
    /// Model file written by `textnet train` (tokens are words) or `textnet transformer` (characters)
    #[arg(short = 'm', long, default_value = "textnet.safetensors")]
    pub model: PathBuf,
    /// Use only the first N tokens (characters, for a Transformer) of the corpus
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Evaluate at most N samples, spread evenly over the corpus (0 = all); text models only
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_samples: usize,
    /// Print one JSON object
    #[arg(long)]
    pub json: bool,
    /// No progress bar
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// What a model scored on a corpus: sums over its samples (each a token predicted from those before it).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Evaluation {
    /// "token" or "character": what the model predicts.
    pub unit: &'static str,
    /// The corpus's length in units.
    pub tokens: usize,
    /// Of them, those outside the model's vocabulary (read as its unknown token).
    pub unknown_tokens: usize,
    /// The samples scored: positions with a full context before them.
    pub samples: u64,
    /// The summed cross-entropy (nats), in sample order.
    pub loss_sum: f64,
    /// Samples whose target was the model's first choice.
    pub top1: u64,
    /// Samples whose target was among the model's five first choices.
    pub top5: u64,
    /// The threads the samples were shared out over.
    pub threads: usize,
}
