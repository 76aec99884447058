//! The CPU twin of fused/attention.cuh: causal multi-head self-attention of one sequence from its packed
//! q, k, v rows (`[n][3C]`, head h at dims h·hs..(h+1)·hs of each third), forward and backward, with the
//! T×T probabilities kept (the GPU keeps only their log-sum-exp and rebuilds them). With dropout, y_t =
//! Σ_u m_tu·p_tu·v_u for a mask m of 0 or 1/(1 − p) (`AttentionDropout`); the probabilities kept are p's.
//!
//! `sdp_attention` is the same math with the causal mask optional (without it every query attends to every
//! key, which no kernel does yet); `attention` is its causal form, the kernels'.

use super::constant;
use super::dropout::Mask;
use num_traits::Float;

/// Dropout on one sequence's attention probabilities. Element (h, t, u) of sequence b is
/// ((b·heads + h)·T + t)·T + u with T the block (the kernels' compiled T, whatever the sequence's length),
/// as fused/attention.cuh numbers them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionDropout {
    /// The step's mask of the attention site.
    pub mask: Mask,
    /// The element of (b, h 0, t 0, u 0): b·heads·T·T.
    pub first: usize,
    /// T, the model's block.
    pub block: usize,
}

impl AttentionDropout {
    /// m_tu of head h.
    fn factor<F: Float>(&self, h: usize, t: usize, u: usize) -> F {
        constant(self.mask.factor(self.first + (h * self.block + t) * self.block + u) as f64)
    }
}

/// m_tu, 1 without dropout.
fn keep<F: Float>(drop: Option<&AttentionDropout>, h: usize, t: usize, u: usize) -> F {
    drop.map_or(F::one(), |d| d.factor(h, t, u))
}

/// attention.cuh's `AttentionSizes<T, HS>`: the launch code's one mirror of its shared-memory sizes, for
/// sequences of `t` positions and heads of `hs` dims in blocks of `warps` warps (tested against the
/// kernel file).
pub struct AttentionSizes {
    /// Sequence length T (positions).
    pub t: usize,
    /// Head size: dims per head.
    pub hs: usize,
    /// Warps per block.
    pub warps: usize,
}

impl AttentionSizes {
    /// Keys per block of the backward pass (KC).
    pub fn key_chunk(&self) -> usize {
        self.t.min(64)
    }

    /// Floats of the forward kernel's shared memory (FORWARD_FLOATS): a chunk of q, k and v rows padded by
    /// one, and a chunk × chunk tile of probabilities (rows padded by one).
    pub fn forward_floats(&self) -> usize {
        let kc = self.key_chunk();
        3 * kc * (self.hs + 1) + kc * (kc + 1)
    }

    /// Floats of the backward kernel's shared memory (BACKWARD_FLOATS).
    pub fn backward_floats(&self) -> usize {
        let kc = self.key_chunk();
        4 * kc * (self.hs + 1) + 2 * kc * (kc + 1) + 2 * kc
    }
}

/// fused/flash_attention.cuh's `FlashSizes<T, HS>`: the launch layers' one mirror of its blocks and shared
/// memory (tested against the kernel file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashSizes {
    /// T, the longest sequence (the module's TF_T or NN_T).
    pub t: usize,
    /// The head size (TF_HS or NN_HS), a multiple of 16.
    pub hs: usize,
}

impl FlashSizes {
    /// Queries of a forward block; keys or queries of a backward one: 16 per warp (ROWS).
    pub const ROWS: usize = 128;
    /// The streamed tile of keys or queries (TILE).
    pub const TILE: usize = 64;

    /// bf16 per staged row (LD).
    fn ld(&self) -> usize {
        self.hs + 8
    }

    /// Blocks of one kind per (sequence, head) (BLOCKS).
    pub fn blocks(&self) -> usize {
        self.t.div_ceil(Self::ROWS)
    }

    /// Dynamic shared memory of the forward kernel (FORWARD_BYTES).
    pub fn forward_bytes(&self) -> usize {
        4 * Self::TILE * self.ld() * 2 + 2 * Self::TILE * self.hs * 4
    }

    /// Dynamic shared memory of the backward kernel (BACKWARD_BYTES).
    pub fn backward_bytes(&self) -> usize {
        (2 * Self::ROWS + 4 * Self::TILE) * self.ld() * 2 + 3 * Self::TILE * self.hs * 4 + 4 * Self::TILE * 4
    }
}

fn dot<F: Float>(a: &[F], b: &[F]) -> F {
    a.iter().zip(b).fold(F::zero(), |s, (&x, &y)| s + x * y)
}

/// Causal attention of one sequence of `n` positions from its qkv rows: y `[n][C]` and the probabilities
/// `[NH][n][n]` (before dropout).
pub fn attention<F: Float>(
    qkv: &[F],
    n: usize,
    heads: usize,
    hs: usize,
    drop: Option<&AttentionDropout>,
) -> (Vec<F>, Vec<F>) {
    sdp_attention(qkv, n, heads, hs, true, drop)
}

/// The keys query `t` of `n` attends to: 0..=t when `causal`, else all.
fn keys_of(t: usize, n: usize, causal: bool) -> usize {
    if causal { t + 1 } else { n }
}

/// `attention`, causal only when `causal` (otherwise query t attends to every key, and the probabilities
/// fill each row of `[NH][n][n]`).
pub fn sdp_attention<F: Float>(
    qkv: &[F],
    n: usize,
    heads: usize,
    hs: usize,
    causal: bool,
    drop: Option<&AttentionDropout>,
) -> (Vec<F>, Vec<F>) {
    let c = heads * hs;
    let scale = F::one() / constant::<F>(hs as f64).sqrt();
    let mut y = vec![F::zero(); n * c];
    let mut att = vec![F::zero(); heads * n * n];
    for h in 0..heads {
        let (q, k, v) = (h * hs, c + h * hs, 2 * c + h * hs);
        for t in 0..n {
            let p = &mut att[(h * n + t) * n..][..keys_of(t, n, causal)];
            let q_t = &qkv[t * 3 * c + q..][..hs];
            for (u, s) in p.iter_mut().enumerate() {
                *s = dot(q_t, &qkv[u * 3 * c + k..][..hs]) * scale;
            }
            let max = p.iter().fold(F::neg_infinity(), |m, &s| m.max(s));
            p.iter_mut().for_each(|s| *s = (*s - max).exp());
            let sum = p.iter().fold(F::zero(), |a, &e| a + e);
            p.iter_mut().for_each(|s| *s = *s / sum);
            let y_t = &mut y[t * c + h * hs..][..hs];
            for (u, &p) in p.iter().enumerate() {
                let p = p * keep::<F>(drop, h, t, u);
                y_t.iter_mut().zip(&qkv[u * 3 * c + v..][..hs]).for_each(|(y, &v)| *y = *y + p * v);
            }
        }
    }
    (y, att)
}

/// `attention`'s backward from d y: d probabilities (before dropout), d scores and d qkv.
pub fn attention_backward<F: Float>(
    qkv: &[F],
    att: &[F],
    d_y: &[F],
    n: usize,
    heads: usize,
    hs: usize,
    drop: Option<&AttentionDropout>,
) -> (Vec<F>, Vec<F>, Vec<F>) {
    sdp_attention_backward(qkv, att, d_y, n, heads, hs, true, drop)
}

/// `sdp_attention`'s backward from d y, as `attention_backward`.
#[allow(clippy::too_many_arguments)]
pub fn sdp_attention_backward<F: Float>(
    qkv: &[F],
    att: &[F],
    d_y: &[F],
    n: usize,
    heads: usize,
    hs: usize,
    causal: bool,
    drop: Option<&AttentionDropout>,
) -> (Vec<F>, Vec<F>, Vec<F>) {
    let c = heads * hs;
    let scale = F::one() / constant::<F>(hs as f64).sqrt();
    let mut d_att = vec![F::zero(); heads * n * n];
    let mut d_scores = vec![F::zero(); heads * n * n];
    let mut d_qkv = vec![F::zero(); n * 3 * c];
    for h in 0..heads {
        let (q, k, v) = (h * hs, c + h * hs, 2 * c + h * hs);
        for t in 0..n {
            let (row, keys) = ((h * n + t) * n, keys_of(t, n, causal));
            let p = &att[row..][..keys];
            let d_y_t = &d_y[t * c + h * hs..][..hs];
            for u in 0..keys {
                let m = keep::<F>(drop, h, t, u);
                d_att[row + u] = m * dot(d_y_t, &qkv[u * 3 * c + v..][..hs]);
                let d_v = &mut d_qkv[u * 3 * c + v..][..hs];
                d_v.iter_mut().zip(d_y_t).for_each(|(d, &g)| *d = *d + p[u] * m * g);
            }
            let pd = dot(p, &d_att[row..][..keys]);
            for u in 0..keys {
                let d_s = p[u] * (d_att[row + u] - pd);
                d_scores[row + u] = d_s;
                let g = d_s * scale;
                for i in 0..hs {
                    let (qi, ki) = (qkv[t * 3 * c + q + i], qkv[u * 3 * c + k + i]);
                    d_qkv[t * 3 * c + q + i] = d_qkv[t * 3 * c + q + i] + g * ki;
                    d_qkv[u * 3 * c + k + i] = d_qkv[u * 3 * c + k + i] + g * qi;
                }
            }
        }
    }
    (d_att, d_scores, d_qkv)
}

#[cfg(test)]
mod tests {
    use super::AttentionSizes;
    use crate::device::compile::kernel_constants;
    use crate::ops::THREADS_PER_BLOCK;

    #[test]
    fn sizes_match_the_kernel_file() {
        for (t, hs) in [(64, 16), (256, 64), (32, 8), (5, 3), (100, 12)] {
            let sizes = AttentionSizes { t, hs, warps: THREADS_PER_BLOCK as usize / 32 };
            let s = format!("AttentionSizes<{t}, {hs}>");
            let kernel = kernel_constants(
                "transformer",
                &[],
                &[&format!("{s}::KC"), &format!("{s}::FORWARD_FLOATS"), &format!("{s}::BACKWARD_FLOATS")],
            )
            .unwrap();
            let mirror = [sizes.key_chunk(), sizes.forward_floats(), sizes.backward_floats()];
            assert_eq!(kernel, mirror.map(|v| v as i64), "T = {t}, HS = {hs}");
        }
    }
}
