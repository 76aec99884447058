//! `textnet generate`: continues a prompt by sampling from a model file one token (or character) at a
//! time, on the CPU. It lists the pipelines whose model files generate, as `selftest` and `bench` list
//! theirs; a model file of another kind is refused with what it is (`modelkind`).

use crate::console;
use crate::text::generate::{generate, join};
use crate::text::modelfile::{self, TextModel};
use crate::transformer::modelfile::TransformerModel;
use anyhow::{Context, Result, bail};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[arg(
        long,
        allow_hyphen_values = true,
        help = "The text to continue (the model's tokenizer splits it; words outside its vocabulary read as <unk>)"
    )]
    pub prompt: String,
    /// Tokens to generate (characters, for a Transformer model), at most 100,000
    #[arg(long, default_value_t = 50)]
    pub length: usize,
    /// Softmax temperature: 1 samples the model's own distribution, lower is more conservative, 0 always
    /// takes the likeliest token
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// Sample only among the K likeliest tokens
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Seed of the sampling
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Model file written by `textnet train` or `textnet transformer`
    #[arg(long, default_value = "textnet.safetensors")]
    pub model: PathBuf,
    /// Print one JSON object (the tokens as a list too)
    #[arg(long)]
    pub json: bool,
}

/// A model file that can continue text.
pub enum Generator {
    /// The next-token model of `textnet train`.
    Text(TextModel),
    /// The character-level Transformer of `textnet transformer`.
    Transformer(TransformerModel),
}

impl Generator {
    pub fn load(path: &Path) -> Result<Generator> {
        let bytes = crate::fsutil::read_input(path, "model file")?;
        let kind = safetensors::SafeTensors::read_metadata(&bytes)
            .ok()
            .and_then(|(_, header)| {
                let meta = header.metadata().as_ref()?;
                meta.get("format").or_else(|| meta.get("kind")).cloned()
            })
            .unwrap_or_default();
        match kind.as_str() {
            modelfile::FORMAT => Ok(Generator::Text(
                TextModel::from_bytes(&bytes).with_context(|| format!("model file {}", path.display()))?,
            )),
            crate::transformer::modelfile::FORMAT => Ok(Generator::Transformer(
                TransformerModel::from_bytes(&bytes).with_context(|| format!("model file {}", path.display()))?,
            )),
            _ => match crate::modelkind::describe(header_metadata(&bytes).as_ref()) {
                Some(what) => bail!("{}: {what}; it does not generate text", path.display()),
                None => bail!("{} is not a textnet model that generates text", path.display()),
            },
        }
    }
}

/// The most tokens (or characters) one `generate` writes.
pub const MAX_LENGTH: usize = 100_000;

pub fn run(args: GenerateArgs) -> Result<()> {
    if !(1..=MAX_LENGTH).contains(&args.length) {
        bail!("--length must be between 1 and {MAX_LENGTH}, got {}", args.length);
    }
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        bail!("--temperature must be 0 or more, got {}", args.temperature);
    }
    if args.top_k == Some(0) {
        bail!("--top-k must be at least 1");
    }
    let model = match Generator::load(&args.model)? {
        Generator::Text(model) => model,
        Generator::Transformer(model) => return run_transformer(&args, &model),
    };
    let (prompt, generated) = generate(&model, &args.prompt, args.length, args.temperature, args.top_k, args.seed)?;
    let text = join(&prompt.iter().chain(&generated).cloned().collect::<Vec<_>>());
    if args.json {
        console::out(
            &json!({
                "model": args.model.display().to_string(), "prompt": prompt, "tokens": generated, "text": text,
                "temperature": crate::report::decimal(args.temperature), "top_k": args.top_k, "seed": args.seed,
            })
            .to_string(),
        );
    } else {
        console::out(&text);
    }
    Ok(())
}

/// `textnet generate` with a Transformer: characters, not tokens (--length counts characters).
fn run_transformer(args: &GenerateArgs, model: &TransformerModel) -> Result<()> {
    let (generated, unknown) = crate::transformer::generate::generate(
        model,
        &args.prompt,
        args.length,
        args.temperature,
        args.top_k,
        args.seed,
    )?;
    if unknown > 0 {
        console::err(&format!(
            "note: {unknown} character{} of the prompt {} not in the model's vocabulary and read as unknown",
            if unknown == 1 { "" } else { "s" },
            if unknown == 1 { "is" } else { "are" }
        ));
    }
    if args.json {
        console::out(
            &json!({
                "model": args.model.display().to_string(), "prompt": args.prompt, "generated": generated,
                "text": format!("{}{generated}", args.prompt), "unknown_prompt_chars": unknown,
                "temperature": crate::report::decimal(args.temperature), "top_k": args.top_k, "seed": args.seed,
            })
            .to_string(),
        );
    } else {
        console::out(&format!("{}{generated}", args.prompt));
    }
    Ok(())
}

/// A safetensors file's metadata, if it has any.
fn header_metadata(bytes: &[u8]) -> Option<std::collections::HashMap<String, String>> {
    safetensors::SafeTensors::read_metadata(bytes).ok().and_then(|(_, header)| header.metadata().clone())
}
