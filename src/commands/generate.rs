//! `textnet generate` (its flags and its run) and the run of `textnet eval` (whose flags and report, which
//! the pipelines use, are in `eval`), the commands that take any language model file: the pipeline whose
//! model kind the file names reads it (`pipelines::ALL`, `pipeline::LanguageModel`); a model file of
//! another kind is refused with what it is (`io::modelkind`). Generation runs on the CPU and streams each
//! sample's text to stdout as its tokens are drawn (`ops::sampling` draws them); `--json` prints one
//! object at the end instead.

use crate::harness::console;
use crate::ops::cpu::SeededRng;
use crate::ops::sampling::{Sample, Sampling, continuation};
use crate::pipeline::EvalArgs;
use crate::pipeline::LanguageModel;
use anyhow::{Context, Result, bail};
use rand::SeedableRng;
use serde_json::json;
use std::path::{Path, PathBuf};

/// The flags of `textnet generate`, shared by every pipeline that generates.
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// The text to continue (the model's tokenizer reads it; for a text model, words outside its
    /// vocabulary read as `<unk>`, and at least one must be known). Without it, or empty, the sample is
    /// unconditional: a text model starts as after the end of a sentence (the context ".", or its most
    /// frequent token when "." is not in its vocabulary), a Transformer from a newline, as nanoGPT's
    /// sample.py does; that start is not printed
    #[arg(allow_hyphen_values = true, value_name = "PROMPT", conflicts_with = "prompt_flag")]
    pub prompt: Option<String>,
    /// The same as the positional PROMPT
    #[arg(long = "prompt", hide = true, allow_hyphen_values = true, value_name = "TEXT")]
    pub prompt_flag: Option<String>,
    /// Tokens to generate per sample (characters, for a Transformer model), at most 100,000
    #[arg(long, default_value_t = 50)]
    pub length: usize,
    /// Softmax temperature: 1 samples the model's own distribution, lower is more conservative, 0 always
    /// takes the likeliest token
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Sample only among the K likeliest tokens
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Nucleus sampling: only among the likeliest tokens whose probabilities (after --temperature and
    /// --top-k) first add up to P or more, 0 < P ≤ 1
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Independent samples to draw, one after another from the one seeded generator; printed with a line
    /// `---------------` between them
    #[arg(short = 'n', long, value_name = "N", default_value_t = 1)]
    pub num_samples: usize,
    /// End a sample once the text it generated contains STRING; STRING is kept in the output (as Hugging
    /// Face's stop_strings), with the rest of the token that completed it. May be given more than once
    #[arg(long, value_name = "STRING", allow_hyphen_values = true)]
    pub stop: Vec<String>,
    /// Seed of the sampling
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Model file written by `textnet train` or `textnet transformer`
    #[arg(short = 'm', long, default_value = "textnet.safetensors")]
    pub model: PathBuf,
    /// Print one JSON object at the end instead of streaming the text
    #[arg(long)]
    pub json: bool,
}

/// The most tokens (or characters) one sample holds.
pub const MAX_LENGTH: usize = 100_000;
/// The most samples one `generate` draws.
pub const MAX_SAMPLES: usize = 10_000;

impl GenerateArgs {
    /// The prompt, positional or `--prompt`; empty when neither is given.
    pub fn prompt(&self) -> &str {
        self.prompt.as_deref().or(self.prompt_flag.as_deref()).unwrap_or("")
    }

    /// Checks every flag (an error names the one out of range) and gives how tokens are drawn.
    pub fn check(&self) -> Result<Sampling> {
        if !(1..=MAX_LENGTH).contains(&self.length) {
            bail!("--length must be between 1 and {MAX_LENGTH}, got {}", self.length);
        }
        if !(1..=MAX_SAMPLES).contains(&self.num_samples) {
            bail!("--num-samples must be between 1 and {MAX_SAMPLES}, got {}", self.num_samples);
        }
        if self.stop.iter().any(String::is_empty) {
            bail!("--stop must be a non-empty string");
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            bail!("--temperature must be 0 or more, got {}", self.temperature);
        }
        if self.top_k == Some(0) {
            bail!("--top-k must be at least 1");
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            bail!("--top-p must be more than 0 and at most 1, got {p}");
        }
        Ok(Sampling { temperature: self.temperature, top_k: self.top_k, top_p: self.top_p })
    }
}

/// The line printed between two samples (nanoGPT's sample.py prints it after each).
pub const SEPARATOR: &str = "---------------";

/// `textnet generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    let sampling = args.check()?;
    let bytes = crate::io::fsutil::read_input(&args.model, "model file")?;
    let (model, kind) = language_model(&bytes, &args.model, "it does not generate text")?;
    let mut generator = (model.open)(&bytes).with_context(|| format!("model file {}", args.model.display()))?;
    let prompt = generator.read_prompt(args.prompt())?;
    if prompt.unknown > 0 {
        console::err(&format!(
            "note: {} {}{} of the prompt {} not in the model's vocabulary and read as unknown",
            prompt.unknown,
            generator.unit(),
            if prompt.unknown == 1 { "" } else { "s" },
            if prompt.unknown == 1 { "is" } else { "are" }
        ));
    }
    let mut rng = SeededRng::seed_from_u64(args.seed);
    let mut samples: Vec<Sample> = Vec::with_capacity(args.num_samples);
    for n in 0..args.num_samples {
        if !args.json {
            if n > 0 {
                console::out(SEPARATOR);
            }
            console::print(&prompt.shown);
        }
        // Nobody reads the text any more (`| head -1`): the sample ends, and no other follows.
        let mut emit = |piece: &str| {
            if !args.json {
                console::print(piece);
            }
            !console::stdout_closed()
        };
        let sample =
            continuation(generator.as_mut(), &prompt, &sampling, args.length, &args.stop, &mut rng, &mut emit)?;
        if !args.json {
            console::out("");
            if console::stdout_closed() {
                return Ok(());
            }
        }
        samples.push(sample);
    }
    if args.json {
        let samples: Vec<serde_json::Value> = samples
            .iter()
            .map(|s| {
                json!({
                    "text": format!("{}{}", prompt.shown, s.text), "generated": s.text,
                    "tokens": s.ids.len(), "stopped": s.stopped,
                })
            })
            .collect();
        console::out(
            &json!({
                "model": args.model.display().to_string(), "kind": kind,
                "prompt": args.prompt(), "prompt_unknown": prompt.unknown, "samples": samples,
                "seed": args.seed, "temperature": crate::harness::report::decimal(args.temperature),
                "top_k": args.top_k, "top_p": args.top_p.map(crate::harness::report::decimal),
                "length": args.length, "stop": args.stop, "device": "cpu",
            })
            .to_string(),
        );
    }
    Ok(())
}

/// `textnet eval`.
pub fn evaluate(args: EvalArgs) -> Result<()> {
    if args.max_tokens == Some(0) {
        bail!("--max-tokens must be at least 1, got 0");
    }
    let bytes = crate::io::fsutil::read_input(&args.model, "model file")?;
    let (model, kind) = language_model(&bytes, &args.model, "eval takes a text model or a Transformer")?;
    let bar = crate::harness::report::progress_bar(args.quiet, "evaluating", 0);
    let evaluation = (model.evaluate)(&bytes, &args, &bar);
    bar.finish_and_clear();
    super::eval::report(&args, kind, &evaluation?)
}

/// The pipeline hooks for the model file `bytes` (read from `path`) and its kind's tag; `refusal` ends the
/// error for a file of a kind that is no language model.
fn language_model(bytes: &[u8], path: &Path, refusal: &str) -> Result<(&'static LanguageModel, &'static str)> {
    let kind = crate::io::modelkind::claimed_by(bytes);
    let model = crate::pipelines::ALL
        .iter()
        .find(|p| kind.is_some_and(|k| p.models.contains(&k)))
        .and_then(|p| p.language_model.as_ref());
    match (model, kind) {
        (Some(model), Some(kind)) => Ok((model, kind.tag)),
        (_, Some(kind)) => bail!("{}: it is {} (for {}); {refusal}", path.display(), kind.what, kind.used_by),
        (_, None) => bail!("{} is not a textnet model that generates text", path.display()),
    }
}
