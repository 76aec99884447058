//! The CPU twin of fused/losses.cuh: softmax cross-entropy over a row of logits with its gradient (the
//! MNIST CNN's and the Transformer's output layers), and the squared error (XOR's).

use num_traits::Float;

/// `−log softmax(logits)[target]`, and softmax − onehot(target) into `d`.
pub fn softmax_xent<F: Float>(logits: &[F], target: usize, d: &mut [F]) -> F {
    let max = logits.iter().fold(F::neg_infinity(), |m, &v| m.max(v));
    let sum = logits.iter().fold(F::zero(), |s, &v| s + (v - max).exp());
    for (k, (d, &v)) in d.iter_mut().zip(logits).enumerate() {
        *d = (v - max).exp() / sum - if k == target { F::one() } else { F::zero() };
    }
    max + sum.ln() - logits[target]
}

/// (y − t)², and ∂/∂y scaled by the caller (`scale` = 2/B for the mean over a batch of B): (loss, dy).
pub fn squared_error<F: Float>(y: F, t: F, scale: F) -> (F, F) {
    let err = y - t;
    (err * err, scale * err)
}
