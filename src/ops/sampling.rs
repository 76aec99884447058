//! Sampling text from a model, for every pipeline that generates (`textnet generate` reads its flags in
//! `commands::generate`): drawing the next token (temperature, then top-k, then top-p, and an id that is never drawn while another is left:
//! the unknown token), and one continuation drawn token by token until `--length` or a stop string. A
//! pipeline gives a `Generator` (its model's logits and how its tokens read); the rest is here, so both
//! model kinds sample, stop and report alike. On the CPU: one draw per generated token, next to a forward
//! pass that costs far more.

use crate::ops::cpu::SeededRng;
use anyhow::{Result, bail};
use rand::RngExt;
use serde::Serialize;

/// How the next token is drawn from the logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0: always the likeliest.
    pub temperature: f32,
    /// Sample among the k likeliest only; `None` keeps every candidate.
    pub top_k: Option<usize>,
    /// In (0, 1]; `None` keeps every candidate top-k left.
    pub top_p: Option<f32>,
}

impl Sampling {
    /// The model's own distribution: temperature 1, no cut.
    pub const PLAIN: Sampling = Sampling { temperature: 1.0, top_k: None, top_p: None };
}

/// The ids a draw chooses among, likeliest first, with their weights (proportional to the
/// probabilities they are drawn with): `skip` left out while another id is left, the `top_k` largest
/// logits, then the nucleus of `top_p`. At temperature 0, only the likeliest id.
pub fn distribution(logits: &[f32], sampling: &Sampling, skip: Option<usize>) -> Vec<(usize, f64)> {
    let mut ids: Vec<usize> = (0..logits.len()).filter(|&i| Some(i) != skip || logits.len() == 1).collect();
    ids.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    ids.truncate(sampling.top_k.unwrap_or(usize::MAX).max(1));
    if sampling.temperature == 0.0 {
        ids.truncate(1);
    }
    let max = logits[ids[0]];
    let t = if sampling.temperature == 0.0 { 1.0 } else { sampling.temperature };
    let mut weights: Vec<(usize, f64)> = ids.into_iter().map(|i| (i, (((logits[i] - max) / t) as f64).exp())).collect();
    // At 1 nothing is cut (rounding in the running sum could otherwise drop the least likely).
    if let Some(top_p) = sampling.top_p.filter(|&p| p < 1.0) {
        let total: f64 = weights.iter().map(|(_, w)| w).sum();
        let probabilities: Vec<f64> = weights.iter().map(|(_, w)| w / total).collect();
        weights.truncate(nucleus_size(&probabilities, f64::from(top_p)));
    }
    weights
}

/// How many of `probabilities` (sorted, largest first, adding up to 1) the nucleus of `top_p` keeps: each
/// whose likelier ones add up to less than `top_p`, so the kept ones are the fewest that reach it (Hugging
/// Face's TopPLogitsWarper: a token goes when the tokens no likelier than it add up to at most 1 − top_p).
/// At least one.
pub fn nucleus_size(probabilities: &[f64], top_p: f64) -> usize {
    let mut likelier = 0.0;
    let kept = probabilities
        .iter()
        .take_while(|&&p| {
            let keep = likelier < top_p;
            likelier += p;
            keep
        })
        .count();
    kept.max(1)
}

/// The index drawn from `logits` as `sampling` says, never `skip` (the unknown token's id) while another
/// candidate is left.
pub fn sample(logits: &[f32], sampling: &Sampling, skip: Option<usize>, rng: &mut SeededRng) -> usize {
    let candidates = distribution(logits, sampling, skip);
    if candidates.len() == 1 {
        return candidates[0].0;
    }
    let mut draw = rng.random::<f64>() * candidates.iter().map(|(_, w)| w).sum::<f64>();
    for &(i, w) in &candidates {
        if draw < w {
            return i;
        }
        draw -= w;
    }
    candidates.last().expect("at least one candidate").0
}

/// A model file read for generation: the next token's logits and how each token reads.
pub trait Generator {
    /// The next token's scores after `ids` (the model keeps the last ones its context holds).
    fn logits(&mut self, ids: &[u32]) -> Vec<f32>;
    /// The id never drawn while another is left (the unknown token).
    fn unknown_id(&self) -> u32;
    /// What one token is: "token" (a word or punctuation) or "character".
    fn unit(&self) -> &'static str;
    /// The prompt as the model reads it; empty: the model's start context, for an unconditional sample.
    fn read_prompt(&self, text: &str) -> Result<Prompt>;
    /// The text token `id` adds after `before`, the text written so far.
    fn piece(&self, id: u32, before: &str) -> String;
}

/// A prompt as a model reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    /// The ids a sample starts from: the prompt's, or the model's start context without one.
    pub ids: Vec<u32>,
    /// What is printed before the continuation: the prompt as the model's tokens read (empty for an
    /// unconditional sample).
    pub shown: String,
    /// Prompt tokens (or characters) outside the vocabulary, read as the unknown token.
    pub unknown: usize,
}

/// Why a sample ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stopped {
    /// Its text came to contain a stop string.
    Stop,
    /// It reached `--length` tokens.
    Length,
}

/// One sampled continuation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The sampled ids, in order.
    pub ids: Vec<u32>,
    /// The continuation's text, stop string included (the prompt not).
    pub text: String,
    /// Why the sample ended: its length, or a stop string.
    pub stopped: Stopped,
}

/// Draws one continuation of `prompt`: at most `length` tokens, ending after the token whose text makes
/// the continuation contain one of `stops`. `emit` gets each token's text as it is drawn, and ends the
/// sample there by answering false (its reader is gone).
pub fn continuation(
    generator: &mut dyn Generator,
    prompt: &Prompt,
    sampling: &Sampling,
    length: usize,
    stops: &[String],
    rng: &mut SeededRng,
    emit: &mut dyn FnMut(&str) -> bool,
) -> Result<Sample> {
    let mut context = prompt.ids.clone();
    let mut written = prompt.shown.clone();
    let start = written.len();
    let longest_stop = stops.iter().map(String::len).max().unwrap_or(0);
    let skip = Some(generator.unknown_id() as usize);
    for _ in 0..length {
        let logits = generator.logits(&context);
        if logits.iter().any(|l| !l.is_finite()) {
            bail!("the model's output is not finite: its weights are too large to be a trained model");
        }
        let id = sample(&logits, sampling, skip, rng) as u32;
        context.push(id);
        let piece = generator.piece(id, &written);
        let read = emit(&piece);
        // Only a match that ends in this piece is new: search from where such a match could begin.
        let mut from = written.len().saturating_sub(longest_stop.saturating_sub(1)).max(start);
        while !written.is_char_boundary(from) {
            from -= 1;
        }
        written.push_str(&piece);
        if stops.iter().any(|stop| written[from..].contains(stop.as_str())) {
            return Ok(sample_of(context, prompt, written, Stopped::Stop));
        }
        if !read {
            break;
        }
    }
    Ok(sample_of(context, prompt, written, Stopped::Length))
}

fn sample_of(context: Vec<u32>, prompt: &Prompt, written: String, stopped: Stopped) -> Sample {
    Sample { ids: context[prompt.ids.len()..].to_vec(), text: written[prompt.shown.len()..].to_string(), stopped }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Probabilities 1/2, 1/4, 1/8, 1/8 (exact in binary): the cut-off lands on the boundaries.
    const HALVES: [f64; 4] = [0.5, 0.25, 0.125, 0.125];

    #[test]
    fn the_nucleus_is_the_fewest_tokens_that_reach_p() {
        // Kept: those whose likelier ones add up to less than p.
        for (top_p, kept) in
            [(0.1, 1), (0.5, 1), (0.500001, 2), (0.7, 2), (0.75, 2), (0.750001, 3), (0.875, 3), (0.9, 4), (1.0, 4)]
        {
            assert_eq!(nucleus_size(&HALVES, top_p), kept, "top_p {top_p}");
        }
    }

    /// The cut-off one token too late or too early is caught: at p = 0.75 the nucleus is the first two
    /// tokens, not one and not three, and the distribution drawn from is theirs renormalised (2/3, 1/3).
    #[test]
    fn top_p_draws_from_the_hand_computed_distribution() {
        let logits = HALVES.map(|p| p.ln() as f32);
        let sampling = Sampling { top_p: Some(0.75), ..Sampling::PLAIN };
        let candidates = distribution(&logits, &sampling, None);
        assert_eq!(candidates.iter().map(|c| c.0).collect::<Vec<_>>(), [0, 1], "{candidates:?}");
        let total: f64 = candidates.iter().map(|c| c.1).sum();
        for ((_, w), expected) in candidates.iter().zip([2.0 / 3.0, 1.0 / 3.0]) {
            assert!((w / total - expected).abs() < 1e-6, "{candidates:?}");
        }
        let mut rng = SeededRng::seed_from_u64(3);
        let draws: Vec<usize> = (0..6000).map(|_| sample(&logits, &sampling, None, &mut rng)).collect();
        assert!(draws.iter().all(|&d| d < 2), "a token outside the nucleus was drawn");
        let share = draws.iter().filter(|&&d| d == 0).count() as f64 / draws.len() as f64;
        assert!((share - 2.0 / 3.0).abs() < 0.02, "{share}");

        // Applied after the temperature: at 2 the probabilities flatten to √ of theirs, renormalised.
        let hot = Sampling { temperature: 2.0, top_p: Some(0.5), ..Sampling::PLAIN };
        let roots: Vec<f64> = HALVES.iter().map(|p| p.sqrt()).collect();
        let sum: f64 = roots.iter().sum();
        // √.5/sum ≈ 0.363 < 0.5, so the second token joins the nucleus; together 0.620 ≥ 0.5.
        assert!(roots[0] / sum < 0.5 && (roots[0] + roots[1]) / sum >= 0.5);
        assert_eq!(distribution(&logits, &hot, None).len(), 2);
        // After top-k: among the two likeliest (2/3, 1/3), p = 0.6 keeps only the first.
        let both = Sampling { top_k: Some(2), top_p: Some(0.6), ..Sampling::PLAIN };
        assert_eq!(distribution(&logits, &both, None).len(), 1);
        // The skipped id never counts: without id 0, the rest are 1/2, 1/4, 1/4.
        let skipping = Sampling { top_p: Some(0.5), ..Sampling::PLAIN };
        assert_eq!(distribution(&logits, &skipping, Some(0)).iter().map(|c| c.0).collect::<Vec<_>>(), [1]);
    }

    /// Without top-p a draw is what it was before top-p existed: the same seed gives the same tokens.
    #[test]
    fn top_p_one_changes_no_draw() {
        let logits = [0.3f32, 2.0, -1.0, 0.7, 1.1];
        let draws = |sampling: &Sampling| {
            let mut rng = SeededRng::seed_from_u64(11);
            (0..200).map(|_| sample(&logits, sampling, Some(0), &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draws(&Sampling { top_p: Some(1.0), ..Sampling::PLAIN }), draws(&Sampling::PLAIN));
    }

    struct Letters;

    impl Generator for Letters {
        fn logits(&mut self, ids: &[u32]) -> Vec<f32> {
            // Always the next letter of "abcd…" after the last one, cyclically.
            let next = (ids.last().copied().unwrap_or(0) + 1) % 26;
            (0..26).map(|i| if i == next { 10.0 } else { 0.0 }).collect()
        }
        fn unknown_id(&self) -> u32 {
            25
        }
        fn unit(&self) -> &'static str {
            "character"
        }
        fn read_prompt(&self, _text: &str) -> Result<Prompt> {
            unimplemented!("the tests give the prompt's ids")
        }
        fn piece(&self, id: u32, _before: &str) -> String {
            char::from(b'a' + id as u8).to_string()
        }
    }

    #[test]
    fn a_stop_string_ends_the_sample_and_is_kept() {
        let prompt = Prompt { ids: vec![0], shown: "a".into(), unknown: 0 };
        let greedy = Sampling { temperature: 0.0, ..Sampling::PLAIN };
        let mut rng = SeededRng::seed_from_u64(1);
        let mut streamed = String::new();
        let stops = ["xyz".to_string(), "de".to_string()];
        let s = continuation(&mut Letters, &prompt, &greedy, 10, &stops, &mut rng, &mut |p| {
            streamed.push_str(p);
            true
        })
        .unwrap();
        assert_eq!((s.text.as_str(), s.stopped, streamed.as_str()), ("bcde", Stopped::Stop, "bcde"));
        assert_eq!(s.ids, [1, 2, 3, 4]);
        // The prompt is not searched: "a" alone stops nothing.
        let s = continuation(&mut Letters, &prompt, &greedy, 3, &["ab".into()], &mut rng, &mut |_| true).unwrap();
        assert_eq!((s.text.as_str(), s.stopped), ("bcd", Stopped::Length));
    }
}
