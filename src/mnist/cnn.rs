//! The convolutional classifier (`textnet mnist --model cnn`) and its CPU reference: the oracle for the
//! GPU kernels and the no-GPU path. For a `side`×`side` greyscale image x:
//!
//! ```text
//! z1 = conv3x3(x; W1, b1), pad 1          (c1 × side × side)     a1 = relu(z1)    p1 = maxpool2(a1)
//! z2 = conv3x3(p1; W2, b2), pad 1         (c2 × side/2 × side/2) a2 = relu(z2)    p2 = maxpool2(a2)
//! f  = flatten(p2)                        (c2·(side/4)², channel-major, as torch.flatten)
//! zh = Wf·f + bf,  h = relu(zh)           (fc)
//! logits = Wo·h + bo                      (classes)   loss = −log softmax(logits)[label]
//! ```
//!
//! Max pooling keeps the first largest of each 2×2 window in the order (0,0), (0,1), (1,0), (1,1), and
//! the gradient goes to that element only. The parameters are one flat vector in PyTorch's layouts and
//! `state_dict` order: conv1.weight `[c1,1,3,3]`, conv1.bias, conv2.weight `[c2,c1,3,3]`, conv2.bias,
//! fc1.weight `[fc,c2·(side/4)²]`, fc1.bias, fc2.weight `[classes,fc]`, fc2.bias, so the shared optimizers
//! update it in one pass and a model file loads into the same `torch.nn` model.
//!
//! The convolutions and the pooling are `ops::conv`'s (the twin `textnet fit` shares); the two fully
//! connected layers sum each output in input order, as the kernel's warps fold them, not through `gemm`.
//!
//! The math is generic over the float type: training runs it in f32, and the finite-difference tests in
//! f64, where a perturbation of 1e-6 is too small to cross a ReLU kink or change a pooling choice.

use super::idx::Split;
use crate::ops::conv::{Conv2dShape, ConvGrads, MaxPool2dShape, ZeroGrads};
use crate::ops::cpu::SeededRng;
use crate::ops::losses::softmax_xent;
use anyhow::{Result, bail};
use num_traits::Float;
use rand::SeedableRng;

/// The architecture's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CnnShape {
    /// Image side (a multiple of 4).
    pub side: usize,
    /// Channels of the first convolution.
    pub c1: usize,
    /// Channels of the second convolution.
    pub c2: usize,
    /// Hidden units of the fully connected layer.
    pub fc: usize,
    /// Number of classes (outputs).
    pub classes: usize,
}

/// The names of the parameter tensors, in flat-vector order.
pub const TENSOR_NAMES: [&str; 8] =
    ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"];

impl CnnShape {
    /// The MNIST model on 28×28 images: 8 and 16 channels, 64 hidden units, 10 classes.
    pub const MNIST: CnnShape = CnnShape { side: 28, c1: 8, c2: 16, fc: 64, classes: 10 };

    /// Ok when the sizes are usable, otherwise the error line.
    pub fn validate(&self) -> Result<()> {
        if self.side == 0 || !self.side.is_multiple_of(4) {
            bail!("the CNN needs an image side that is a positive multiple of 4, got {}", self.side);
        }
        if self.c1 == 0 || self.c2 == 0 || self.fc == 0 || self.classes < 2 {
            bail!("the CNN needs at least one channel per layer, one hidden unit and two classes");
        }
        Ok(())
    }

    /// Inputs of fc1: c2 channels of (side/4)².
    pub fn flat(&self) -> usize {
        self.c2 * (self.side / 4) * (self.side / 4)
    }

    /// Names and shapes of the tensors in flat-vector order.
    pub fn tensor_shapes(&self) -> [(&'static str, Vec<usize>); 8] {
        let CnnShape { c1, c2, fc, classes, .. } = *self;
        let shapes = [
            vec![c1, 1, 3, 3],
            vec![c1],
            vec![c2, c1, 3, 3],
            vec![c2],
            vec![fc, self.flat()],
            vec![fc],
            vec![classes, fc],
            vec![classes],
        ];
        let mut shapes = shapes.into_iter();
        TENSOR_NAMES.map(|name| (name, shapes.next().expect("eight shapes")))
    }

    /// Start of each tensor in the flat vector, and the total.
    pub fn offsets(&self) -> ([usize; 8], usize) {
        let mut at = 0;
        let starts = self.tensor_shapes().map(|(_, dims)| {
            let start = at;
            at += dims.iter().product::<usize>();
            start
        });
        (starts, at)
    }

    /// Number of parameters.
    pub fn param_count(&self) -> usize {
        self.offsets().1
    }
}

/// All trainable parameters, flat (see the module comment for the layout).
#[derive(Clone, Debug, PartialEq)]
pub struct CnnParams {
    /// The sizes.
    pub shape: CnnShape,
    /// Every parameter, in the layout of the module comment.
    pub flat: Vec<f32>,
}

impl CnnParams {
    /// PyTorch's default initialisation of `nn.Conv2d` and `nn.Linear`: every weight and bias
    /// U(−1/√fan_in, 1/√fan_in), fan_in = in_channels·3·3 for a convolution; drawn in tensor order.
    pub fn init(shape: CnnShape, seed: u64) -> CnnParams {
        let mut rng = SeededRng::seed_from_u64(seed);
        let (starts, total) = shape.offsets();
        let mut flat = vec![0.0f32; total];
        let fan_in = [9, 9, 9 * shape.c1, 9 * shape.c1, shape.flat(), shape.flat(), shape.fc, shape.fc];
        for k in 0..8 {
            let end = if k + 1 < 8 { starts[k + 1] } else { total };
            crate::ops::cpu::linear_init(&mut flat[starts[k]..end], fan_in[k], &mut rng);
        }
        CnnParams { shape, flat }
    }

    /// Whether every parameter is finite.
    pub fn all_finite(&self) -> bool {
        self.flat.iter().all(|x| x.is_finite())
    }
}

/// Views of the flat vector by tensor.
struct Tensors<'a, T> {
    w1: &'a [T],
    b1: &'a [T],
    w2: &'a [T],
    b2: &'a [T],
    wf: &'a [T],
    bf: &'a [T],
    wo: &'a [T],
    bo: &'a [T],
}

fn tensors<T>(shape: CnnShape, flat: &[T]) -> Tensors<'_, T> {
    let (starts, total) = shape.offsets();
    assert_eq!(flat.len(), total, "flat buffer does not match the CNN shape");
    let part = |k: usize| &flat[starts[k]..if k + 1 < 8 { starts[k + 1] } else { total }];
    Tensors { w1: part(0), b1: part(1), w2: part(2), b2: part(3), wf: part(4), bf: part(5), wo: part(6), bo: part(7) }
}

/// One image's activations, kept for the backward pass.
struct Forward<T> {
    z1: Vec<T>,
    p1: Vec<T>,
    /// Per pooled element of p1, the element of z1 it took.
    arg1: Vec<u32>,
    z2: Vec<T>,
    f: Vec<T>,
    arg2: Vec<u32>,
    zh: Vec<T>,
    logits: Vec<T>,
}

/// conv3x3 (pad 1) of `channels` × `side` × `side` maps into `out_channels`.
fn conv3x3(channels: usize, side: usize, out_channels: usize) -> Conv2dShape {
    Conv2dShape::new((channels, side, side), out_channels, (3, 3), 1, 1).expect("a 3×3 kernel fits a padded image")
}

/// 2×2 max pooling of `channels` × `side` × `side` maps.
fn pool2(channels: usize, side: usize) -> MaxPool2dShape {
    MaxPool2dShape::new((channels, side, side), 2, 2, 0).expect("the side is even")
}

/// relu then 2×2 max pooling of `z` (channels × side × side): the pooled values and which element of
/// each window they came from (the first largest).
fn relu_pool<T: Float>(z: &[T], channels: usize, side: usize, pooled: &mut [T], winners: &mut [u32]) {
    pool2(channels, side).forward_mapped(z, |v| v.max(T::zero()), pooled, winners);
}

fn forward_one<T: Float>(shape: CnnShape, p: &Tensors<T>, image: &[f32]) -> Forward<T> {
    let CnnShape { side, c1, c2, fc, classes } = shape;
    let (s2, s3) = (side / 2, side / 4);
    let x: Vec<T> = image.iter().map(|&v| T::from(v).expect("a float")).collect();
    let mut z1 = vec![T::zero(); c1 * side * side];
    conv3x3(1, side, c1).forward(&x, p.w1, Some(p.b1), &mut z1);
    let (mut p1, mut arg1) = (vec![T::zero(); c1 * s2 * s2], vec![0u32; c1 * s2 * s2]);
    relu_pool(&z1, c1, side, &mut p1, &mut arg1);
    let mut z2 = vec![T::zero(); c2 * s2 * s2];
    conv3x3(c1, s2, c2).forward(&p1, p.w2, Some(p.b2), &mut z2);
    let (mut f, mut arg2) = (vec![T::zero(); c2 * s3 * s3], vec![0u32; c2 * s3 * s3]);
    relu_pool(&z2, c2, s2, &mut f, &mut arg2);
    let n = f.len();
    let zh: Vec<T> =
        (0..fc).map(|j| p.wf[j * n..][..n].iter().zip(&f).fold(p.bf[j], |acc, (&w, &v)| acc + w * v)).collect();
    let logits: Vec<T> = (0..classes)
        .map(|k| p.wo[k * fc..][..fc].iter().zip(&zh).fold(p.bo[k], |acc, (&w, &z)| acc + w * z.max(T::zero())))
        .collect();
    Forward { z1, p1, arg1, z2, f, arg2, zh, logits }
}

/// Sends each pooled gradient to the window element the forward pass took, through relu's mask (z > 0).
fn unpool<T: Float>(d_pooled: &[T], winners: &[u32], z: &[T], channels: usize, side: usize, dz: &mut [T]) {
    dz.iter_mut().for_each(|v| *v = T::zero());
    pool2(channels, side).backward(d_pooled, winners, dz);
    dz.iter_mut().zip(z).for_each(|(d, &z)| *d = if z > T::zero() { *d } else { T::zero() });
}

/// The weight and bias gradients of conv3x3 (`channels` in, pad 1) from dz and its input, added to `gw`
/// and `gb`, and, when `d_input` is given, the input's gradient written there.
fn conv3x3_backward<T: Float>(
    (input, channels, side): (&[T], usize, usize),
    w: &[T],
    dz: &[T],
    (gw, gb): (&mut [T], &mut [T]),
    mut d_input: Option<&mut [T]>,
) {
    if let Some(d) = d_input.as_deref_mut() {
        d.iter_mut().for_each(|v| *v = T::zero());
    }
    let conv = conv3x3(channels, side, gb.len());
    let grads = ConvGrads { weight: Some(gw), bias: Some(gb), input: d_input };
    conv.backward(input, w, dz, grads, ZeroGrads::Skip);
}

/// What the GPU's forward and backward kernels keep per image, image after image, for the selftest's
/// checks of each kernel alone: the pooled maps p1 and f, the hidden layer h, dlogits (already divided
/// by the batch), the loss; dh (through ReLU′), dz2 and dz1.
#[derive(Clone, Debug, Default)]
pub struct Intermediates {
    /// First pooled map p1, `[c1][side/2][side/2]` per image.
    pub p1: Vec<f32>,
    /// Flattened second pooled map f, `[c2·(side/4)²]` per image.
    pub f: Vec<f32>,
    /// Hidden layer h after ReLU, `[fc]` per image.
    pub h: Vec<f32>,
    /// Gradient of the loss at the logits, divided by the batch, `[classes]` per image.
    pub dlogits: Vec<f32>,
    /// Cross-entropy loss, one per image.
    pub loss: Vec<f32>,
    /// Gradient at the hidden layer's pre-activation (through ReLU′), `[fc]` per image.
    pub dh: Vec<f32>,
    /// Gradient at the second convolution's output z2, `[c2][side/2][side/2]` per image.
    pub dz2: Vec<f32>,
    /// Gradient at the first convolution's output z1, `[c1][side][side]` per image.
    pub dz1: Vec<f32>,
}

/// The intermediates of a step on the images `rows` (f32).
pub fn intermediates(p: &CnnParams, data: &Split, rows: &[u32]) -> Intermediates {
    let mut record = Intermediates::default();
    let mut grad = vec![0.0f32; p.flat.len()];
    step(p.shape, &p.flat, data, rows, &mut grad, Some(&mut record));
    record
}

/// The summed loss over the images `rows` of `data` and the gradient of the mean loss into `grad`.
pub fn loss_and_grad<T: Float>(shape: CnnShape, params: &[T], data: &Split, rows: &[u32], grad: &mut [T]) -> T {
    step(shape, params, data, rows, grad, None)
}

fn step<T: Float>(
    shape: CnnShape,
    params: &[T],
    data: &Split,
    rows: &[u32],
    grad: &mut [T],
    mut record: Option<&mut Intermediates>,
) -> T {
    let CnnShape { side, c1, c2, fc, classes } = shape;
    let p = tensors(shape, params);
    assert_eq!(grad.len(), params.len());
    grad.iter_mut().for_each(|g| *g = T::zero());
    if rows.is_empty() {
        return T::zero();
    }
    let (starts, _) = shape.offsets();
    let scale = T::one() / T::from(rows.len()).expect("a float");
    let s2 = side / 2;
    let mut loss = T::zero();
    let mut d = vec![T::zero(); classes];
    let (mut dz1, mut dp1, mut dz2) =
        (vec![T::zero(); c1 * side * side], vec![T::zero(); c1 * s2 * s2], vec![T::zero(); c2 * s2 * s2]);
    for &row in rows {
        let image = data.image(row);
        let a = forward_one(shape, &p, image);
        let loss_one = softmax_xent(&a.logits, data.label(row), &mut d);
        loss = loss + loss_one;
        d.iter_mut().for_each(|v| *v = *v * scale);
        let n = a.f.len();
        let mut dh = vec![T::zero(); fc];
        for (k, &dk) in d.iter().enumerate() {
            grad[starts[7] + k] = grad[starts[7] + k] + dk;
            for j in 0..fc {
                let h = a.zh[j].max(T::zero());
                grad[starts[6] + k * fc + j] = grad[starts[6] + k * fc + j] + dk * h;
                dh[j] = dh[j] + p.wo[k * fc + j] * dk;
            }
        }
        let mut df = vec![T::zero(); n];
        for j in 0..fc {
            if a.zh[j] <= T::zero() {
                continue;
            }
            grad[starts[5] + j] = grad[starts[5] + j] + dh[j];
            for i in 0..n {
                grad[starts[4] + j * n + i] = grad[starts[4] + j * n + i] + dh[j] * a.f[i];
                df[i] = df[i] + p.wf[j * n + i] * dh[j];
            }
        }
        unpool(&df, &a.arg2, &a.z2, c2, s2, &mut dz2);
        let (g_lo, g_hi) = grad.split_at_mut(starts[3]);
        let grads = (&mut g_lo[starts[2]..], &mut g_hi[..c2]);
        conv3x3_backward((&a.p1, c1, s2), p.w2, &dz2, grads, Some(&mut dp1));
        unpool(&dp1, &a.arg1, &a.z1, c1, side, &mut dz1);
        if let Some(r) = record.as_deref_mut() {
            let f32s = |v: &[T]| -> Vec<f32> { v.iter().map(|x| x.to_f32().unwrap_or(f32::NAN)).collect() };
            r.p1.extend(f32s(&a.p1));
            r.f.extend(f32s(&a.f));
            r.h.extend(a.zh.iter().map(|z| z.max(T::zero()).to_f32().unwrap_or(f32::NAN)));
            r.dlogits.extend(f32s(&d));
            r.loss.push(loss_one.to_f32().unwrap_or(f32::NAN));
            r.dh.extend(
                dh.iter().zip(&a.zh).map(|(g, z)| if *z > T::zero() { g.to_f32().unwrap_or(f32::NAN) } else { 0.0 }),
            );
            r.dz2.extend(f32s(&dz2));
            r.dz1.extend(f32s(&dz1));
        }
        let x: Vec<T> = image.iter().map(|&v| T::from(v).expect("a float")).collect();
        let (g_lo, g_hi) = grad.split_at_mut(starts[1]);
        conv3x3_backward((&x, 1, side), p.w1, &dz1, (&mut g_lo[starts[0]..], &mut g_hi[..c1]), None);
    }
    loss
}

/// The class scores of one image (the logits) under f32 parameters.
pub fn logits(p: &CnnParams, image: &[f32]) -> Vec<f32> {
    forward_one(p.shape, &tensors(p.shape, &p.flat), image).logits
}

/// Loss and confusion matrix over all of `data` (f32, the first largest logit as the prediction).
pub fn evaluate(p: &CnnParams, data: &Split) -> super::Evaluation {
    let mut eval = super::Evaluation::new(p.shape.classes);
    let mut d = vec![0.0f32; p.shape.classes];
    for row in 0..data.len() as u32 {
        let logits = logits(p, data.image(row));
        eval.loss += softmax_xent(&logits, data.label(row), &mut d) as f64;
        let best = logits.iter().enumerate().fold(0, |b, (k, &v)| if v > logits[b] { k } else { b });
        eval.record(data.label(row), best);
    }
    eval
}

/// How close the images `rows` bring the model to a point where rounding could change its derivative: the
/// smallest, over every pre-activation of conv1, conv2 and fc1, of |z| / (|b| + Σ|w·x|)
/// (`check::kink_ratio`), and over every pooling window whose winner is positive, of the winner's lead
/// over the runner-up relative to the winner.
pub fn kink_margin(p: &CnnParams, data: &Split, rows: &[u32]) -> f64 {
    let s = p.shape;
    let t = tensors(s, &p.flat);
    let (s1, s2) = (s.side, s.side / 2);
    let mut margin = f64::INFINITY;
    let conv_margin =
        |input: &[f32], channels: usize, side: usize, w: &[f32], b: &[f32], z: &[f32], margin: &mut f64| {
            let conv = conv3x3(channels, side, b.len());
            for (c, plane) in z.chunks_exact(side * side).enumerate() {
                let weights = &w[c * conv.taps()..][..conv.taps()];
                for (p, &z) in plane.iter().enumerate() {
                    let mut scale = b[c].abs() as f64;
                    conv.for_each_tap(p / side, p % side, |tap, at| {
                        scale += (weights[tap] as f64 * input[at] as f64).abs();
                    });
                    if scale > 0.0 {
                        *margin = margin.min(z.abs() as f64 / scale);
                    }
                }
            }
        };
    let pool_margin = |z: &[f32], channels: usize, side: usize, margin: &mut f64| {
        let pool = pool2(channels, side);
        for o in 0..pool.output_len() {
            let mut a: Vec<f32> = pool.window(o).map(|at| z[at].max(0.0)).collect();
            a.sort_by(|x, y| y.total_cmp(x));
            if a[0] > 0.0 {
                *margin = margin.min(((a[0] - a[1]) / a[0]) as f64);
            }
        }
    };
    for &row in rows {
        let image = data.image(row);
        let a: Forward<f32> = forward_one(s, &t, image);
        conv_margin(image, 1, s1, t.w1, t.b1, &a.z1, &mut margin);
        pool_margin(&a.z1, s.c1, s1, &mut margin);
        conv_margin(&a.p1, s.c1, s2, t.w2, t.b2, &a.z2, &mut margin);
        pool_margin(&a.z2, s.c2, s2, &mut margin);
        let n = a.f.len();
        for j in 0..s.fc {
            margin = margin.min(crate::harness::check::kink_ratio(&t.wf[j * n..][..n], t.bf[j], &a.f));
        }
    }
    margin
}

/// The `format` metadata of a CNN model file.
pub const FORMAT: &str = crate::io::modelkind::MNIST_CNN.tag;

impl CnnParams {
    /// The model as a .safetensors file: the tensors under PyTorch's `state_dict` names and layouts
    /// (`conv1.weight` `[c1,1,3,3]` … `fc2.bias`), so `load_state_dict` takes them, and metadata `format`
    /// (`textnet-mnist-cnn`), `side`, `c1`, `c2`, `fc`, `classes`, plus the caller's `extra` entries.
    pub fn to_safetensors(&self, extra: &[(&str, &str)]) -> Result<Vec<u8>> {
        let (starts, total) = self.shape.offsets();
        let tensors: Vec<(&str, &[f32], Vec<usize>)> = self
            .shape
            .tensor_shapes()
            .into_iter()
            .enumerate()
            .map(|(k, (name, dims))| (name, &self.flat[starts[k]..if k + 1 < 8 { starts[k + 1] } else { total }], dims))
            .collect();
        let s = self.shape;
        let mut meta: std::collections::BTreeMap<String, String> = [
            (crate::io::modelkind::KEY, FORMAT.to_string()),
            ("side", s.side.to_string()),
            ("c1", s.c1.to_string()),
            ("c2", s.c2.to_string()),
            ("fc", s.fc.to_string()),
            ("classes", s.classes.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        meta.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        crate::io::tensorfile::to_bytes(&tensors, meta)
    }

    /// Reads what `to_safetensors` wrote; returns the parameters and the file's metadata.
    pub fn from_safetensors(bytes: &[u8]) -> Result<(CnnParams, std::collections::HashMap<String, String>)> {
        use anyhow::{Context, anyhow};
        let (_, header) = safetensors::SafeTensors::read_metadata(bytes).context("not a safetensors file")?;
        let meta = header.metadata().clone().unwrap_or_default();
        crate::io::modelkind::MNIST_CNN.check(Some(&meta), "textnet MNIST CNN model file")?;
        let number = |key: &str| -> Result<usize> {
            meta.get(key)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| anyhow!("metadata entry {key:?} is missing or not a number"))
        };
        let shape = CnnShape {
            side: number("side")?,
            c1: number("c1")?,
            c2: number("c2")?,
            fc: number("fc")?,
            classes: number("classes")?,
        };
        shape.validate()?;
        let tensors = safetensors::SafeTensors::deserialize(bytes)?;
        let mut flat = Vec::with_capacity(shape.param_count());
        for (name, dims) in shape.tensor_shapes() {
            let t = tensors.tensor(name).with_context(|| format!("tensor {name}"))?;
            if t.dtype() != safetensors::Dtype::F32 || t.shape() != dims.as_slice() {
                bail!("tensor {name} is {} of shape {:?}, expected F32 of shape {dims:?}", t.dtype(), t.shape());
            }
            flat.extend(t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())));
        }
        Ok((CnnParams { shape, flat }, meta))
    }
}
