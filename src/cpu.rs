//! Small dense kernels for the CPU references, written so the compiler vectorises them
//! (eight independent accumulators) while the arithmetic stays plain fp32; the activations; and the
//! generator every seeded stream draws from.

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

/// The hidden-layer activations the pipelines offer, with their derivatives (the same math as
/// fused/activations.cuh).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Relu,
    Sigmoid,
    Tanh,
}

impl Activation {
    pub const ALL: [Activation; 3] = [Activation::Relu, Activation::Sigmoid, Activation::Tanh];

    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "relu",
            Activation::Sigmoid => "sigmoid",
            Activation::Tanh => "tanh",
        }
    }

    pub fn from_name(name: &str) -> Option<Activation> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    #[inline]
    pub fn apply(self, z: f32) -> f32 {
        match self {
            Activation::Relu => z.max(0.0),
            Activation::Sigmoid => 1.0 / (1.0 + (-z).exp()),
            Activation::Tanh => z.tanh(),
        }
    }

    /// Its ACT_* code in fused/activations.cuh.
    pub fn kernel_code(self) -> i32 {
        match self {
            Activation::Relu => 0,
            Activation::Sigmoid => 1,
            Activation::Tanh => 2,
        }
    }

    /// act′(z), given z and a = act(z): ReLU reads z (0 at z = 0), sigmoid and tanh are cheapest from a.
    #[inline]
    pub fn derivative(self, z: f32, a: f32) -> f32 {
        match self {
            Activation::Relu => (z > 0.0) as u8 as f32,
            Activation::Sigmoid => a * (1.0 - a),
            Activation::Tanh => 1.0 - a * a,
        }
    }
}
