//! The CPU twin of fused/layernorm.cuh: LayerNorm over the last dimension (biased variance, ε = 1e-5, as
//! PyTorch's `nn.LayerNorm`), forward per row and backward over rows. The `_eps` forms take ε (`nn`'s
//! `layer_norm` lets a caller choose it, as PyTorch's does); the kernels' ε is `LN_EPS`.

use super::constant;
use num_traits::Float;

/// ε under the variance.
pub const LN_EPS: f64 = 1e-5;

/// LayerNorm of one row into `out`; returns its mean and 1/√(σ² + ε).
pub fn layer_norm<F: Float>(x: &[F], w: &[F], b: &[F], out: &mut [F]) -> (F, F) {
    layer_norm_eps(x, w, b, constant(LN_EPS), out)
}

/// `layer_norm` with ε `eps`.
pub fn layer_norm_eps<F: Float>(x: &[F], w: &[F], b: &[F], eps: F, out: &mut [F]) -> (F, F) {
    let n: F = constant(x.len() as f64);
    let mean = x.iter().fold(F::zero(), |s, &v| s + v) / n;
    let var = x.iter().fold(F::zero(), |s, &v| s + (v - mean) * (v - mean)) / n;
    let rstd = F::one() / (var + eps).sqrt();
    for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(w).zip(b) {
        *o = (v - mean) * rstd * w + b;
    }
    (mean, rstd)
}

/// LayerNorm of each row of `x`: the outputs, means and 1/√(σ² + ε).
pub fn layer_norm_rows<F: Float>(x: &[F], w: &[F], b: &[F]) -> (Vec<F>, Vec<F>, Vec<F>) {
    layer_norm_rows_eps(x, w, b, constant(LN_EPS))
}

/// `layer_norm_rows` with ε `eps`.
pub fn layer_norm_rows_eps<F: Float>(x: &[F], w: &[F], b: &[F], eps: F) -> (Vec<F>, Vec<F>, Vec<F>) {
    let mut out = vec![F::zero(); x.len()];
    let (mean, rstd) = x
        .chunks_exact(w.len())
        .zip(out.chunks_exact_mut(w.len()))
        .map(|(x, o)| layer_norm_eps(x, w, b, eps, o))
        .unzip();
    (out, mean, rstd)
}

/// LayerNorm's backward over rows: adds to `gw` and `gb`, returns d x.
pub fn layer_norm_backward<F: Float>(
    x: &[F],
    mean: &[F],
    rstd: &[F],
    w: &[F],
    d_out: &[F],
    gw: &mut [F],
    gb: &mut [F],
) -> Vec<F> {
    let c = w.len();
    let n: F = constant(c as f64);
    let mut d_x = vec![F::zero(); x.len()];
    let mut xhat = vec![F::zero(); c];
    let mut d_xhat = vec![F::zero(); c];
    for (((x, d_out), d_x), (&mean, &rstd)) in
        x.chunks_exact(c).zip(d_out.chunks_exact(c)).zip(d_x.chunks_exact_mut(c)).zip(mean.iter().zip(rstd))
    {
        for i in 0..c {
            xhat[i] = (x[i] - mean) * rstd;
            d_xhat[i] = d_out[i] * w[i];
            gw[i] = gw[i] + d_out[i] * xhat[i];
            gb[i] = gb[i] + d_out[i];
        }
        let mean_d = d_xhat.iter().fold(F::zero(), |s, &v| s + v) / n;
        let mean_dx = d_xhat.iter().zip(&xhat).fold(F::zero(), |s, (&d, &h)| s + d * h) / n;
        for i in 0..c {
            d_x[i] = rstd * (d_xhat[i] - mean_d - xhat[i] * mean_dx);
        }
    }
    d_x
}
