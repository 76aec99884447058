//! `textnet eval` for a Transformer file: the corpus cut into windows of `block` characters one after
//! another (the last may be shorter), each character after the first predicted from those before it in
//! its window, on the CPU reference. That is how `textnet transformer` (and nanoGPT) measure the
//! validation loss. The windows are shared out over rayon's threads and their sums added in window
//! order, so any number of threads gives the same bits.

use super::data::utf8;
use super::model;
use super::modelfile::TransformerModel;
use crate::ops::cpu::top_k;
use crate::pipeline::{EvalArgs, Evaluation};
use anyhow::{Context, Result, bail};
use indicatif::ProgressBar;
use rayon::prelude::*;

/// `eval`'s hook: a Transformer file's bytes scored on the corpus, per character.
pub fn evaluate(bytes: &[u8], args: &EvalArgs, bar: &ProgressBar) -> Result<Evaluation> {
    if args.max_samples != 0 {
        bail!(
            "--max-samples is for text models; a Transformer is scored on every character (--max-tokens reads fewer)"
        );
    }
    let model = TransformerModel::from_bytes(bytes).with_context(|| format!("model file {}", args.model.display()))?;
    let what = format!("corpus {}", crate::io::fsutil::shown(&args.corpus));
    let raw = crate::io::fsutil::read_input(&args.corpus, "corpus")?;
    let text = utf8(&raw, &what)?;
    // A byte-order mark is no text.
    let text = text.strip_prefix('\u{FEFF}').unwrap_or(text);
    let text = match args.max_tokens.and_then(|n| text.char_indices().nth(n)) {
        Some((end, _)) => &text[..end],
        None => text,
    };
    let (ids, unknown) = model.vocab.encode(text);
    if ids.len() < 2 {
        bail!(
            "{what} has {} character{}; the model predicts each from those before it, so it needs at least 2",
            ids.len(),
            if ids.len() == 1 { "" } else { "s" }
        );
    }
    let targets = ids.len() - 1;
    bar.set_length(targets as u64);
    let windows: Vec<Evaluation> = (0..targets)
        .into_par_iter()
        .step_by(model.config.block)
        .map(|start| {
            let end = (start + model.config.block).min(targets);
            let sums = window(&model, &ids[start..end], &ids[start + 1..end + 1]);
            bar.inc((end - start) as u64);
            sums
        })
        .collect();
    let mut total = Evaluation {
        unit: "character",
        tokens: ids.len(),
        unknown_tokens: unknown,
        threads: rayon::current_num_threads(),
        ..Default::default()
    };
    for w in &windows {
        total.samples += w.samples;
        total.loss_sum += w.loss_sum;
        total.top1 += w.top1;
        total.top5 += w.top5;
    }
    Ok(total)
}

/// The sums over one window: `inputs` and the `targets` one character further.
fn window(m: &TransformerModel, inputs: &[u32], targets: &[u32]) -> Evaluation {
    let f = model::forward::<f32>(&m.config, &m.params, inputs, 1, Some(targets), None);
    let v = m.config.vocab;
    let mut sums = Evaluation::default();
    for ((loss, &target), logits) in f.losses.iter().zip(targets).zip(f.logits.chunks_exact(v)) {
        let best = top_k(logits, 5);
        sums.samples += 1;
        sums.loss_sum += f64::from(*loss);
        sums.top1 += u64::from(best.first() == Some(&(target as usize)));
        sums.top5 += u64::from(best.contains(&(target as usize)));
    }
    sums
}
