//! `textnet generate` and `textnet eval`, the commands that take any language model file: the pipeline
//! whose model kind the file names reads it (`pipelines::ALL`, `pipeline::LanguageModel`); a model file
//! of another kind is refused with what it is (`modelkind`). Generation runs on the CPU and streams each
//! sample's text to stdout as its tokens are drawn; `--json` prints one object at the end instead.

use crate::eval::EvalArgs;
use crate::pipeline::LanguageModel;
use crate::sampling::{GenerateArgs, Sample, continuation};
use crate::{console, cpu::SeededRng};
use anyhow::{Context, Result, bail};
use rand::SeedableRng;
use serde_json::json;
use std::path::Path;

/// The line printed between two samples (nanoGPT's sample.py prints it after each).
pub const SEPARATOR: &str = "---------------";

/// `textnet generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    let sampling = args.check()?;
    let bytes = crate::fsutil::read_input(&args.model, "model file")?;
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
                "seed": args.seed, "temperature": crate::report::decimal(args.temperature),
                "top_k": args.top_k, "top_p": args.top_p.map(crate::report::decimal),
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
    let bytes = crate::fsutil::read_input(&args.model, "model file")?;
    let (model, kind) = language_model(&bytes, &args.model, "eval takes a text model or a Transformer")?;
    let bar = crate::report::progress_bar(args.quiet, "evaluating", 0);
    let evaluation = (model.evaluate)(&bytes, &args, &bar);
    bar.finish_and_clear();
    crate::eval::report(&args, kind, &evaluation?)
}

/// The pipeline hooks for the model file `bytes` (read from `path`) and its kind's tag; `refusal` ends the
/// error for a file of a kind that is no language model.
fn language_model(bytes: &[u8], path: &Path, refusal: &str) -> Result<(&'static LanguageModel, &'static str)> {
    let kind = crate::modelkind::claimed_by(bytes);
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
