//! Small dense kernels for the CPU references, written so the compiler vectorises them
//! (eight independent accumulators) while the arithmetic stays plain fp32; matrix products through
//! `matrixmultiply` in f32 or f64; and the generator every seeded stream draws from.

/// The generator of every seeded stream (initial parameters, shuffles, the selftest's problems):
/// ChaCha8, whose output for a seed is promised not to change across platforms and releases, so a seed
/// names the same run in every build (`rand`'s `StdRng` makes no such promise).
pub type SeededRng = rand_chacha::ChaCha8Rng;

/// Fills `values` as PyTorch's `nn.Linear` initialises a layer's weights and bias: U(−1/√fan_in, 1/√fan_in).
pub fn linear_init(values: &mut [f32], fan_in: usize, rng: &mut SeededRng) {
    use rand_distr::{Distribution, Uniform};
    let limit = 1.0 / (fan_in.max(1) as f32).sqrt();
    let dist = Uniform::new_inclusive(-limit, limit).expect("finite positive limit");
    values.iter_mut().for_each(|v| *v = dist.sample(rng));
}

/// The float types the CPU references compute in (f32 to train, f64 for finite-difference tests), each
/// with its `matrixmultiply` kernel.
pub trait Real: num_traits::Float + Default + Send + Sync + std::fmt::Debug + 'static {
    /// `matrixmultiply::sgemm` or `dgemm`: C = alpha·A·B + beta·C over strided raw pointers.
    ///
    /// # Safety
    /// As `matrixmultiply`'s: every element the shapes and strides address lies inside its buffer, and C
    /// aliases neither A nor B.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

impl Real for f32 {
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: f32,
        a: *const f32,
        rsa: isize,
        csa: isize,
        b: *const f32,
        rsb: isize,
        csb: isize,
        beta: f32,
        c: *mut f32,
        rsc: isize,
        csc: isize,
    ) {
        // SAFETY: the caller's promise (see the trait).
        unsafe { matrixmultiply::sgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc) }
    }
}

impl Real for f64 {
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: f64,
        a: *const f64,
        rsa: isize,
        csa: isize,
        b: *const f64,
        rsb: isize,
        csb: isize,
        beta: f64,
        c: *mut f64,
        rsc: isize,
        csc: isize,
    ) {
        // SAFETY: the caller's promise (see the trait).
        unsafe { matrixmultiply::dgemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc) }
    }
}

/// A read-only matrix: element (i, j) is `data[i·rs + j·cs]`.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a, F> {
    /// The elements, of which the matrix views a part.
    pub data: &'a [F],
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// Row stride: elements from one row to the next.
    pub rs: usize,
    /// Column stride: elements from one column to the next.
    pub cs: usize,
}

impl<'a, F> Mat<'a, F> {
    /// The first `rows`×`cols` elements of `data`, row-major.
    pub fn rows_of(data: &'a [F], rows: usize, cols: usize) -> Mat<'a, F> {
        Mat { data, rows, cols, rs: cols, cs: 1 }
    }

    /// The transpose (no copy).
    pub fn t(self) -> Mat<'a, F> {
        Mat { data: self.data, rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs }
    }

    /// Rows `start..start + rows`.
    pub fn slice_rows(self, start: usize, rows: usize) -> Mat<'a, F> {
        Mat { data: &self.data[(start * self.rs).min(self.data.len())..], rows, ..self }
    }

    /// Whether every element lies inside `data` (what makes `gemm`'s unsafe call sound).
    fn fits(&self) -> bool {
        self.rows == 0 || self.cols == 0 || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// C = A·B + beta·C, with C (A.rows × B.cols) row-major and dense in `c`. With beta 0, C's old values are
/// not read. One thread; the same shapes give the same rounding.
pub fn gemm<F: Real>(a: Mat<F>, b: Mat<F>, beta: F, c: &mut [F]) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(b.rows == k && c.len() == m * n && a.fits() && b.fits(), "gemm: shapes do not match");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.iter_mut().for_each(|x| *x = *x * beta);
        return;
    }
    // SAFETY: `fits` holds for A and B, so every (i, l) and (l, j) they address is inside their slices;
    // C is `c`, m×n dense with row stride n, which `c.len() == m·n` covers, and it aliases neither (it
    // is borrowed mutably).
    unsafe {
        F::gemm_raw(
            m,
            k,
            n,
            F::one(),
            a.data.as_ptr(),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr(),
            b.rs as isize,
            b.cs as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// Σ `a[i]`·`b[i]`.
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

/// `y[i]` += alpha·`x[i]`.
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// In-place numerically stable softmax; returns (max, Σ exp(v − max)) so callers can form log-probabilities.
pub fn softmax_in_place<F: num_traits::Float>(v: &mut [F]) -> (F, F) {
    let max = v.iter().copied().fold(F::neg_infinity(), F::max);
    let mut sum = F::zero();
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum = sum + *x;
    }
    let inv = F::one() / sum;
    for x in v.iter_mut() {
        *x = *x * inv;
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

/// The index of the first largest value (0 for an empty slice).
pub fn argmax(values: &[f32]) -> usize {
    values.iter().enumerate().fold(0, |best, (k, &v)| if v > values[best] { k } else { best })
}
