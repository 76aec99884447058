//! Small dense kernels for the CPU references, written so the compiler vectorises them
//! (eight independent accumulators) while the arithmetic stays plain fp32.

/// Σ a[i]·b[i].
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        sum += x * y;
    }
    sum
}

/// y[i] += alpha·x[i].
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// In-place numerically stable softmax; returns (max, Σ exp(v − max)) so callers can form log-probabilities.
pub fn softmax_in_place(v: &mut [f32]) -> (f32, f32) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    let inv = 1.0 / sum;
    for x in v.iter_mut() {
        *x *= inv;
    }
    (max, sum)
}

/// Indices of the `k` largest values, largest first (ties: lower index first).
pub fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut best: Vec<usize> = Vec::with_capacity(k + 1);
    for (i, &x) in v.iter().enumerate() {
        if best.len() == k && k > 0 && x <= v[best[k - 1]] {
            continue;
        }
        let at = best.partition_point(|&j| v[j] >= x);
        best.insert(at, i);
        best.truncate(k);
    }
    best
}
