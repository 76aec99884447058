//! Next-token prediction with a trained model, on the CPU reference: tokenize the context with the
//! model's own tokenizer settings, keep the last N tokens, average their embeddings, one forward pass;
//! and `textnet predict` (`PredictArgs`, `run`), which prints it for a context or each line of stdin.

use super::model::{Activations, forward};
use super::modelfile::TextModel;
use super::vocab::UNK_ID;
use crate::device::{self, DeviceChoice};
use crate::harness::console;
use crate::ops::cpu::top_k;
use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Serialize)]
/// One possible next token.
pub struct Candidate {
    /// The token's text.
    pub token: String,
    /// Its id in the vocabulary.
    pub id: u32,
    /// Its probability, 0 to 1.
    pub probability: f32,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
/// The model's prediction after a text.
pub struct Prediction {
    /// The context tokens the model read (at most its context length: the last ones of the text).
    pub context: Vec<String>,
    /// Those of them outside the vocabulary, read as `<unk>`.
    pub unknown: Vec<String>,
    /// Earlier tokens of the text that did not fit the context window.
    pub dropped: usize,
    /// How many context tokens the model was trained with; `context` is shorter when the text was.
    pub model_context: usize,
    /// The likeliest next tokens, likeliest first.
    pub top: Vec<Candidate>,
}

/// The `k` likeliest next tokens after `text` (all of them when `k` exceeds the vocabulary), `<unk>` left
/// out unless `show_unk` (as `generate` never samples it).
pub fn predict(model: &TextModel, text: &str, k: usize, show_unk: bool) -> Result<Prediction> {
    if k == 0 {
        bail!("--top must be at least 1");
    }
    let n = model.params.shape.context;
    let mut context: Vec<String> = model.tokenizer.tokens(text).map(|t| t.into_owned()).collect();
    if context.is_empty() {
        bail!("the context has no tokens; give some words, e.g. textnet predict \"to be or\"");
    }
    let dropped = context.len().saturating_sub(n);
    context.drain(..dropped);
    let ids: Vec<u32> = context.iter().map(|t| model.vocab.id(t)).collect();
    let unknown: Vec<String> =
        context.iter().zip(&ids).filter(|&(_, &id)| id == UNK_ID).map(|(t, _)| t.clone()).collect();
    if unknown.len() == context.len() {
        bail!("none of the context tokens is in the model's vocabulary: {}", quoted(&unknown));
    }

    let mut acts = Activations::new(model.params.shape);
    forward(&model.params, &ids, &mut acts);
    if !acts.logsumexp.is_finite() || acts.probs.iter().any(|p| !p.is_finite()) {
        bail!("the model's output is not finite for this context: its weights are too large to be a trained model");
    }
    let mut probs = acts.probs.clone();
    if !show_unk {
        probs[UNK_ID as usize] = f32::NEG_INFINITY;
    }
    let candidates = probs.len() - usize::from(!show_unk);
    let top = top_k(&probs, k.min(candidates))
        .into_iter()
        .map(|id| Candidate {
            token: model.vocab.token(id as u32).to_string(),
            id: id as u32,
            probability: acts.probs[id],
        })
        .collect();
    Ok(Prediction { context, unknown, dropped, model_context: n, top })
}

/// `"a", "b"`: tokens as they appear in messages.
pub fn quoted(tokens: &[String]) -> String {
    tokens.iter().map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", ")
}

#[derive(clap::Args, Debug)]
/// The flags of `textnet predict`.
pub struct PredictArgs {
    /// The text to continue; its last N tokens are used (N = the model's context). Without it (and
    /// without --context), contexts are read from standard input, one per line
    #[arg(allow_hyphen_values = true, conflicts_with = "context", value_name = "TEXT")]
    pub text: Option<String>,
    /// The text to continue (the same as the positional TEXT)
    #[arg(long, allow_hyphen_values = true)]
    pub context: Option<String>,
    /// How many candidates to print
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Count `<unk>` (words outside the vocabulary) among the candidates
    #[arg(long)]
    pub show_unk: bool,
    /// Model file written by `textnet train`
    #[arg(short = 'm', long, default_value = "textnet.safetensors")]
    pub model: PathBuf,
    /// Print one JSON object per context instead of text (JSON Lines when reading standard input)
    #[arg(long)]
    pub json: bool,
    /// A prediction is one small forward pass, done on the CPU: `cuda` checks that a GPU is usable and,
    /// like `train --device cuda`, fails with the reason when none is
    #[arg(long, value_enum, default_value_t)]
    pub device: DeviceChoice,
}

/// Runs `textnet predict`.
pub fn run(args: PredictArgs) -> Result<()> {
    if args.top == 0 {
        bail!("--top must be at least 1");
    }
    if args.device == DeviceChoice::Cuda {
        device::select(DeviceChoice::Cuda)?;
    }
    let model = TextModel::load(&args.model)?;
    let show = |context: &str| -> Result<()> {
        let prediction = predict(&model, context, args.top, args.show_unk)?;
        if args.json {
            let mut value = serde_json::to_value(&prediction)?;
            value["model"] = json!(args.model.display().to_string());
            console::out(&value.to_string());
        } else {
            print_prediction(&prediction, &args.model);
        }
        Ok(())
    };
    if let Some(context) = args.text.as_deref().or(args.context.as_deref()) {
        return show(context);
    }
    let stdin = std::io::stdin();
    if std::io::IsTerminal::is_terminal(&stdin) {
        bail!("give the text to continue: textnet predict \"to be or\" (or pipe contexts in, one per line)");
    }
    // Every line gets its answer; a line that has none gets an error in its place (on stderr, or as a
    // JSON object with `--json`, so that answers stay in line with the input) and the rest go on.
    let (mut read, mut failed) = (0, 0);
    for (number, line) in std::io::BufRead::lines(stdin.lock()).enumerate() {
        let line = line.with_context(|| format!("cannot read line {} of standard input", number + 1))?;
        if number > 0 && !args.json {
            console::out("");
        }
        if let Err(e) = show(&line) {
            failed += 1;
            match args.json {
                true => console::out(&json!({"line": number + 1, "error": format!("{e:#}")}).to_string()),
                false => console::err(&format!("textnet: line {} of standard input: {e:#}", number + 1)),
            }
        }
        read += 1;
        // Nobody reads the answers any more (`| head -1`): stop, as a filter does.
        if console::stdout_closed() {
            break;
        }
    }
    if read == 0 {
        bail!(
            "standard input holds no contexts: give the text to continue (textnet predict \"to be or\") or pipe contexts in, one per line"
        );
    }
    if failed > 0 {
        bail!("{failed} of {read} lines of standard input had no prediction (each is named above)");
    }
    Ok(())
}

fn print_prediction(p: &Prediction, model: &Path) {
    console::out(&format!("model: {}", model.display()));
    console::out(&format!("context: {}", quoted(&p.context)));
    if p.dropped > 0 {
        console::out(&format!(
            "note: the model reads the last {} tokens; {} earlier ones were left out",
            p.model_context, p.dropped
        ));
    }
    if p.context.len() < p.model_context {
        console::out(&format!(
            "note: the model was trained on {} context tokens; only {} given, using those",
            p.model_context,
            p.context.len()
        ));
    }
    if !p.unknown.is_empty() {
        console::out(&format!("unknown (read as <unk>): {}", quoted(&p.unknown)));
    }
    let width = p.top.iter().map(|c| c.token.chars().count()).max().unwrap_or(0);
    for (rank, c) in p.top.iter().enumerate() {
        console::out(&format!("{:>3}. {:<width$}  {:.4}", rank + 1, c.token, c.probability));
    }
}
