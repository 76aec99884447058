//! Drawing the next token from a model's logits, for every pipeline that generates: temperature, top-k,
//! and an id that is never drawn while another is left (the unknown token). On the CPU: one draw per
//! generated token, next to a forward pass that costs far more.

use crate::cpu::SeededRng;
use rand::RngExt;

/// The index drawn from `logits` at `temperature` (0: the largest), among the `top_k` largest, never
/// `skip` (the unknown token's id) while another candidate is left.
pub fn sample(
    logits: &[f32],
    temperature: f32,
    top_k: Option<usize>,
    skip: Option<usize>,
    rng: &mut SeededRng,
) -> usize {
    let mut candidates: Vec<usize> = (0..logits.len()).filter(|&i| Some(i) != skip || logits.len() == 1).collect();
    candidates.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    candidates.truncate(top_k.unwrap_or(usize::MAX).max(1));
    if temperature == 0.0 || candidates.len() == 1 {
        return candidates[0];
    }
    let max = logits[candidates[0]];
    let weights: Vec<f64> = candidates.iter().map(|&i| (((logits[i] - max) / temperature) as f64).exp()).collect();
    let mut draw = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (&i, w) in candidates.iter().zip(&weights) {
        if draw < *w {
            return i;
        }
        draw -= w;
    }
    *candidates.last().expect("at least one candidate")
}
