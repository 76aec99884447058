//! The CPU reference of a layer stack: any `Spec` as a network over a batch, forward, loss and backward,
//! in f32 (to train) or f64 (for finite-difference checks). `fused/fit.cu` is its GPU twin.
//!
//! Tensors are batch-major: a batch of `rows` samples of shape `s` is `rows × s.size()` values, images
//! channel-major (`[c][y][x]`), as PyTorch lays out `[N, C, H, W]`.
//!
//! Parameters are one flat vector, layer by layer in spec order, each layer's weight then its bias, in
//! PyTorch's layouts (`Linear`: `[out][in]`; `Conv2d`: `[out][in][k][k]`), so the flat vector cut at
//! `Network::tensors` is `nn.Sequential`'s `state_dict`.
//!
//! Dropout's mask is a hash of (seed, step, layer, element) (`crate::ops::dropout`, one site per layer), so
//! the GPU draws the same mask without a generator's state and a step is repeatable to the bit.

use super::spec::{Layer, Shape, Spec};
use crate::ops::activations::{gelu, gelu_grad};
use crate::ops::constant;
use crate::ops::conv::{Conv2dShape, ConvGrads, MaxPool2dShape};
use crate::ops::cpu::{Real, SeededRng};
use crate::ops::dense::{DenseGrads, DenseShape, WeightGrad, dense_backward, dense_forward};
use crate::ops::dropout::{DropoutKey, dropout_keeps, dropout_threshold};
use anyhow::{Result, anyhow, bail};
use rand::SeedableRng;
use std::ops::Range;

/// The training loss.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Softmax cross-entropy over the outputs against a class (`nn.CrossEntropyLoss`).
    Ce,
    /// Mean squared error of the outputs against the target values (`nn.MSELoss`).
    Mse,
}

impl Loss {
    /// The name the flag and the model file use.
    pub fn name(self) -> &'static str {
        match self {
            Loss::Ce => "ce",
            Loss::Mse => "mse",
        }
    }
}

/// How the weights start.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Init {
    /// PyTorch's defaults: weights and biases U(±1/√fan_in).
    #[default]
    Pytorch,
    /// Glorot: weights U(±√(6/(fan_in + fan_out))), biases 0.
    Xavier,
    /// Kaiming normal for ReLU: weights N(0, 2/fan_in), biases 0.
    He,
}

/// What the batch is measured against: a class per sample, or `outputs` values per sample.
#[derive(Clone, Copy, Debug)]
pub enum Targets<'a> {
    /// Class index of each sample.
    Classes(&'a [u32]),
    /// `rows × outputs` target values.
    Values(&'a [f32]),
}

/// Where one layer's parameters lie in the flat vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerParams {
    /// The weight's elements.
    pub weight: Range<usize>,
    /// The bias's, if the layer has one.
    pub bias: Option<Range<usize>>,
}

/// A spec bound to an input shape: every layer's input width known, every shape and parameter offset.
#[derive(Clone, Debug, PartialEq)]
pub struct Network {
    /// The layers, `Linear`'s inputs all filled in.
    pub layers: Vec<Layer>,
    /// `shapes[i]` flows into layer i; the last is the output.
    pub shapes: Vec<Shape>,
    /// Each layer's parameters (None for layers without any).
    pub params: Vec<Option<LayerParams>>,
    /// Length of the flat parameter vector.
    pub param_count: usize,
}

/// Number of values of one sample of shape `s`.
pub fn size(s: Shape) -> usize {
    match s {
        Shape::Flat(n) => n,
        Shape::Image { channels, height, width } => channels * height * width,
    }
}

/// The element counts of a layer's weight (None when it overflows) and bias, for a layer with parameters.
fn param_sizes(layer: Layer) -> Option<(Option<usize>, Option<usize>)> {
    match layer {
        Layer::Linear { inputs, outputs, bias } => {
            Some((outputs.checked_mul(inputs.unwrap_or(0)), bias.then_some(outputs)))
        }
        Layer::Conv2d { inputs, outputs, kernel, .. } => Some((
            outputs.checked_mul(inputs).and_then(|n| n.checked_mul(kernel)).and_then(|n| n.checked_mul(kernel)),
            Some(outputs),
        )),
        _ => None,
    }
}

/// `size`, or None when it overflows.
fn checked_size(s: Shape) -> Option<usize> {
    match s {
        Shape::Flat(n) => Some(n),
        Shape::Image { channels, height, width } => channels.checked_mul(height)?.checked_mul(width),
    }
}

impl Network {
    /// What training this network in batches of `batch` over samples of `sample_bytes` holds in host
    /// memory, each part with the flags that shrink it: the samples; the parameters with their gradient,
    /// the optimizer's two moments and a gradient per run of the batch; every layer's output and gradient
    /// for a batch (the trace and the run's copies); and evaluation's chunks, which each thread forwards
    /// keeping every layer's output (`cpu::EVAL_CHUNK`).
    pub fn memory_need(&self, sample_bytes: u64, batch: usize) -> crate::io::resources::MemoryNeed {
        let activations: u64 = self.shapes.iter().map(|&s| size(s) as u64).sum::<u64>();
        let eval_rows = (super::cpu::EVAL_CHUNK * rayon::current_num_threads()) as u64;
        crate::io::resources::MemoryNeed {
            parts: vec![
                ("the samples", sample_bytes, "--train-limit"),
                (
                    "the parameters",
                    (self.param_count as u64).saturating_mul(4 * (4 + super::cpu::RUNS_PER_BATCH as u64)),
                    "the widths or channels in --layers",
                ),
                (
                    "a batch's activations",
                    activations.saturating_mul(batch as u64).saturating_mul(4 * 4),
                    "--batch, or the widths or channels in --layers",
                ),
                (
                    "evaluation's activations",
                    activations.saturating_mul(eval_rows).saturating_mul(4),
                    "the widths, channels or number of layers in --layers",
                ),
            ],
        }
    }

    /// `spec` over samples of shape `input`, or the error of `Spec::chain`, or an error for a layer whose
    /// values or parameters are more than a machine can count (so that no size here wraps around).
    pub fn new(spec: &Spec, input: Shape) -> Result<Network> {
        let after = spec.chain(input)?;
        let mut shapes = vec![input];
        shapes.extend(after);
        if let Some(i) = shapes.iter().position(|&s| checked_size(s).is_none()) {
            let source =
                if i == 0 { "the data".to_string() } else { format!("layer {i} ({})", spec.layers[i - 1].name()) };
            bail!("{source} gives {}, more values per sample than a machine can hold", shapes[i]);
        }
        let mut layers = Vec::with_capacity(spec.layers.len());
        let mut params = Vec::with_capacity(spec.layers.len());
        let mut at = 0usize;
        let mut take = |n: Option<usize>| {
            let end = at.checked_add(n?)?;
            let r = at..end;
            at = end;
            Some(r)
        };
        for (i, layer) in spec.layers.iter().enumerate() {
            let layer = match *layer {
                Layer::Linear { outputs, bias, .. } => Layer::Linear { inputs: Some(size(shapes[i])), outputs, bias },
                other => other,
            };
            if let Layer::Dropout(p) = layer
                && !(0.0..1.0).contains(&p)
            {
                bail!("layer {} (Dropout): p must be at least 0 and below 1, not {p}", i + 1);
            }
            params.push(match param_sizes(layer) {
                None => None,
                Some((weight, bias)) => {
                    let too_many =
                        || anyhow!("layer {} ({}) has more parameters than a machine can hold", i + 1, layer.name());
                    let weight = take(weight).ok_or_else(too_many)?;
                    let bias = bias.map(|n| take(Some(n)).ok_or_else(too_many)).transpose()?;
                    Some(LayerParams { weight, bias })
                }
            });
            layers.push(layer);
        }
        Ok(Network { layers, shapes, params, param_count: at })
    }

    /// Values per sample going in.
    pub fn inputs(&self) -> usize {
        size(self.shapes[0])
    }

    /// Values per sample coming out.
    pub fn outputs(&self) -> usize {
        size(*self.shapes.last().expect("a network has an input shape"))
    }

    /// The parameter tensors under `nn.Sequential`'s `state_dict` names (`0.weight`, `0.bias`, …), with
    /// their shapes and places in the flat vector.
    pub fn tensors(&self) -> Vec<(String, Vec<usize>, Range<usize>)> {
        let mut out = Vec::new();
        for (i, (layer, p)) in self.layers.iter().zip(&self.params).enumerate() {
            let Some(p) = p else { continue };
            let (dims, outputs) = match *layer {
                Layer::Linear { inputs, outputs, .. } => (vec![outputs, inputs.unwrap_or(0)], outputs),
                Layer::Conv2d { inputs, outputs, kernel, .. } => (vec![outputs, inputs, kernel, kernel], outputs),
                _ => unreachable!("only Linear and Conv2d have parameters"),
            };
            out.push((format!("{i}.weight"), dims, p.weight.clone()));
            if let Some(b) = &p.bias {
                out.push((format!("{i}.bias"), vec![outputs], b.clone()));
            }
        }
        out
    }

    /// Initial parameters drawn from `seed`, layer by layer, each weight then its bias. `Xavier` with
    /// biases is what `textnet mnist` draws, `Pytorch` what `textnet sales` draws, for the same layers.
    pub fn init(&self, init: Init, seed: u64) -> Vec<f32> {
        use rand_distr::{Distribution, Normal, Uniform};
        let mut rng = SeededRng::seed_from_u64(seed);
        let mut flat = vec![0.0f32; self.param_count];
        for (layer, p) in self.layers.iter().zip(&self.params) {
            let Some(p) = p else { continue };
            let (fan_in, fan_out) = match *layer {
                Layer::Linear { inputs, outputs, .. } => (inputs.unwrap_or(0), outputs),
                Layer::Conv2d { inputs, outputs, kernel, .. } => (inputs * kernel * kernel, outputs * kernel * kernel),
                _ => unreachable!("only Linear and Conv2d have parameters"),
            };
            let weight = &mut flat[p.weight.clone()];
            match init {
                Init::Pytorch => crate::ops::cpu::linear_init(weight, fan_in, &mut rng),
                Init::Xavier => {
                    let limit = (6.0 / (fan_in + fan_out).max(1) as f32).sqrt();
                    let dist = Uniform::new_inclusive(-limit, limit).expect("finite positive limit");
                    weight.iter_mut().for_each(|x| *x = dist.sample(&mut rng));
                }
                Init::He => {
                    let dist = Normal::new(0.0, (2.0 / fan_in.max(1) as f32).sqrt()).expect("finite deviation");
                    weight.iter_mut().for_each(|x| *x = dist.sample(&mut rng));
                }
            }
            if let (Some(b), Init::Pytorch) = (&p.bias, init) {
                crate::ops::cpu::linear_init(&mut flat[b.clone()], fan_in, &mut rng);
            }
        }
        flat
    }
}

/// Every layer's output over one batch (`values[0]` is the input), and what backward needs besides.
#[derive(Clone, Debug)]
pub struct Trace<F> {
    /// Samples in the batch.
    pub rows: usize,
    /// `values[i]`: what flows into layer i, `rows × size(shapes[i])`; the last is the output.
    pub values: Vec<Vec<F>>,
    /// Per MaxPool2d layer, the input index each output came from (per batch, flat).
    pub argmax: Vec<Vec<u32>>,
}

/// The network's output on `rows` samples `x` (`rows × inputs`). `dropout`: the training step's mask,
/// None in evaluation (dropout off).
pub fn forward<F: Real>(net: &Network, params: &[F], x: &[F], rows: usize, dropout: Option<DropoutKey>) -> Trace<F> {
    forward_part(net, params, x, rows, dropout, 0)
}

/// `forward` on a run of a batch that starts at the batch's sample `first_row`: dropout's mask is the one
/// the whole batch draws for those samples (its elements numbered from the batch's start), so a batch
/// split into runs trains as the whole batch does.
pub fn forward_part<F: Real>(
    net: &Network,
    params: &[F],
    x: &[F],
    rows: usize,
    dropout: Option<DropoutKey>,
    first_row: usize,
) -> Trace<F> {
    assert_eq!(params.len(), net.param_count, "parameter vector of another network");
    assert_eq!(x.len(), rows * net.inputs(), "input of another shape");
    let mut values = vec![x.to_vec()];
    let mut argmax = vec![Vec::new(); net.layers.len()];
    for (i, layer) in net.layers.iter().enumerate() {
        let input = &values[i];
        let (sin, sout) = (net.shapes[i], net.shapes[i + 1]);
        let (n_in, n_out) = (size(sin), size(sout));
        let mut out = vec![F::zero(); rows * n_out];
        match *layer {
            Layer::Linear { inputs, outputs, .. } => {
                let p = net.params[i].as_ref().expect("Linear has parameters");
                let shape = DenseShape { rows, inputs: inputs.unwrap_or(0), outputs };
                let bias = p.bias.clone().map(|b| &params[b]);
                dense_forward(shape, input, &params[p.weight.clone()], bias, &mut out);
            }
            Layer::Relu | Layer::Sigmoid | Layer::Tanh | Layer::Gelu => {
                out.iter_mut().zip(input).for_each(|(o, &z)| *o = activate(*layer, z));
            }
            Layer::Dropout(p) => match dropout {
                Some(key) if p > 0.0 => {
                    let (key, threshold) = (key.site_key(i), dropout_threshold(p));
                    let scale = F::one() / constant::<F>(1.0 - p as f64);
                    let offset = first_row * n_in;
                    for (e, (o, &v)) in out.iter_mut().zip(input).enumerate() {
                        *o = if dropout_keeps(key, (offset + e) as u32, threshold) { v * scale } else { F::zero() };
                    }
                }
                _ => out.copy_from_slice(input),
            },
            Layer::Flatten => out.copy_from_slice(input),
            Layer::Conv2d { kernel, stride, padding, .. } => {
                let p = net.params[i].as_ref().expect("Conv2d has parameters");
                let (w, b) = (&params[p.weight.clone()], &params[p.bias.clone().expect("Conv2d has a bias")]);
                conv_shape(sin, sout, kernel, stride, padding).forward_samples(input, w, Some(b), &mut out);
            }
            Layer::MaxPool2d(k) => {
                let pool = pool_shape(sin, k);
                let mut from = vec![0u32; rows * n_out];
                for ((x, y), winners) in input.chunks(n_in).zip(out.chunks_mut(n_out)).zip(from.chunks_mut(n_out)) {
                    pool.forward(x, y, winners);
                }
                argmax[i] = from;
            }
        }
        values.push(out);
    }
    Trace { rows, values, argmax }
}

/// The loss summed over the batch, and its gradient with respect to the outputs scaled for the batch
/// mean (`rows × outputs`). Cross-entropy: −log softmax(out)`[class]`; squared error: the mean over the
/// outputs of (out − target)².
pub fn loss<F: Real>(loss: Loss, out: &[F], rows: usize, outputs: usize, targets: Targets) -> (F, Vec<F>) {
    let mut d = vec![F::zero(); out.len()];
    let mut sum = F::zero();
    let batch = constant::<F>(rows.max(1) as f64);
    match (loss, targets) {
        (Loss::Ce, Targets::Classes(classes)) => {
            for (s, (o, d)) in out.chunks(outputs).zip(d.chunks_mut(outputs)).enumerate() {
                sum = sum + crate::ops::losses::softmax_xent(o, classes[s] as usize, d);
                d.iter_mut().for_each(|v| *v = *v / batch);
            }
        }
        (Loss::Mse, Targets::Values(values)) => {
            let scale = constant::<F>(2.0) / (batch * constant::<F>(outputs as f64));
            let per_output = F::one() / constant::<F>(outputs as f64);
            for ((&y, &t), d) in out.iter().zip(values).zip(d.iter_mut()) {
                let (l, dy) = crate::ops::losses::squared_error(y, constant::<F>(t as f64), scale);
                sum = sum + l * per_output;
                *d = dy;
            }
        }
        (loss, _) => panic!("{} loss against targets of the other kind", loss.name()),
    }
    (sum, d)
}

/// The gradient of the loss whose output gradient is `d_out` with respect to every parameter (flat,
/// as `params`), from the forward `trace` with the same `dropout`.
pub fn backward<F: Real>(
    net: &Network,
    params: &[F],
    trace: &Trace<F>,
    d_out: Vec<F>,
    dropout: Option<DropoutKey>,
) -> Vec<F> {
    backward_part(net, params, trace, d_out, dropout, 0)
}

/// `backward` of a `forward_part` trace of the run starting at the batch's sample `first_row`.
pub fn backward_part<F: Real>(
    net: &Network,
    params: &[F],
    trace: &Trace<F>,
    d_out: Vec<F>,
    dropout: Option<DropoutKey>,
    first_row: usize,
) -> Vec<F> {
    let rows = trace.rows;
    let mut grad = vec![F::zero(); net.param_count];
    let mut d = d_out;
    for i in (0..net.layers.len()).rev() {
        let input = &trace.values[i];
        let output = &trace.values[i + 1];
        let (sin, sout) = (net.shapes[i], net.shapes[i + 1]);
        let (n_in, n_out) = (size(sin), size(sout));
        let needs_input_grad = i > 0;
        let mut d_in = vec![F::zero(); rows * n_in];
        match net.layers[i] {
            Layer::Linear { inputs, outputs, .. } => {
                let p = net.params[i].as_ref().expect("Linear has parameters");
                let shape = DenseShape { rows, inputs: inputs.unwrap_or(0), outputs };
                // The weight's gradient comes before its bias's in the flat vector.
                let (gw, gb) = grad.split_at_mut(p.weight.end);
                let grads = DenseGrads {
                    weight: Some((&mut gw[p.weight.clone()], WeightGrad::Write)),
                    bias: p.bias.clone().map(|b| &mut gb[b.start - p.weight.end..b.end - p.weight.end]),
                    input: needs_input_grad.then_some(&mut d_in[..]),
                };
                dense_backward(shape, input, &params[p.weight.clone()], &d, grads);
            }
            layer @ (Layer::Relu | Layer::Sigmoid | Layer::Tanh | Layer::Gelu) => {
                for (((di, &dv), &z), &a) in d_in.iter_mut().zip(&d).zip(input).zip(output) {
                    *di = dv * slope(layer, z, a);
                }
            }
            Layer::Dropout(p) => match dropout {
                Some(key) if p > 0.0 => {
                    let (key, threshold) = (key.site_key(i), dropout_threshold(p));
                    let scale = F::one() / constant::<F>(1.0 - p as f64);
                    let offset = first_row * n_in;
                    for (e, (di, &dv)) in d_in.iter_mut().zip(&d).enumerate() {
                        *di = if dropout_keeps(key, (offset + e) as u32, threshold) { dv * scale } else { F::zero() };
                    }
                }
                _ => d_in.copy_from_slice(&d),
            },
            Layer::Flatten => d_in.copy_from_slice(&d),
            Layer::Conv2d { kernel, stride, padding, .. } => {
                let p = net.params[i].as_ref().expect("Conv2d has parameters");
                let bias = p.bias.clone().expect("Conv2d has a bias");
                let conv = conv_shape(sin, sout, kernel, stride, padding);
                // The weight's gradient comes before its bias's in the flat vector.
                let (gw, gb) = grad.split_at_mut(p.weight.end);
                let grads = ConvGrads {
                    weight: Some(&mut gw[p.weight.clone()]),
                    bias: Some(&mut gb[bias.start - p.weight.end..bias.end - p.weight.end]),
                    input: needs_input_grad.then_some(&mut d_in[..]),
                };
                conv.backward_samples(input, &params[p.weight.clone()], &d, grads);
            }
            Layer::MaxPool2d(k) => {
                let pool = pool_shape(sin, k);
                let windows = d.chunks(n_out).zip(trace.argmax[i].chunks(n_out));
                for ((dy, winners), dx) in windows.zip(d_in.chunks_mut(n_in)) {
                    pool.backward(dy, winners, dx);
                }
            }
        }
        d = d_in;
    }
    grad
}

/// The summed loss of one batch and the gradient of its mean.
pub fn loss_and_grad<F: Real>(
    net: &Network,
    params: &[F],
    x: &[F],
    rows: usize,
    targets: Targets,
    kind: Loss,
    dropout: Option<DropoutKey>,
) -> (F, Vec<F>) {
    let trace = forward(net, params, x, rows, dropout);
    let (sum, d) = loss(kind, trace.values.last().expect("an output"), rows, net.outputs(), targets);
    (sum, backward(net, params, &trace, d, dropout))
}

/// How close a batch comes to a kink of the network (ReLU's jump, a max-pool tie): the smallest |z| over
/// ReLU inputs and the smallest gap between a window's largest and second-largest value, each relative to
/// the largest magnitude of its tensor. A GPU and the CPU may round such a point to different sides.
pub fn kink_margin<F: Real>(net: &Network, trace: &Trace<F>) -> f64 {
    let mut margin = f64::INFINITY;
    for (i, layer) in net.layers.iter().enumerate() {
        let input = &trace.values[i];
        let scale = input.iter().fold(0.0f64, |m, v| m.max(v.to_f64().unwrap_or(0.0).abs())).max(1e-30);
        match *layer {
            // Exact zeros (a dropped value, a ReLU output) are exact on every device: no kink to cross.
            Layer::Relu => {
                for v in input.iter().filter(|v| !v.is_zero()) {
                    margin = margin.min(v.to_f64().unwrap_or(0.0).abs() / scale);
                }
            }
            Layer::MaxPool2d(k) => {
                let pool = pool_shape(net.shapes[i], k);
                for sample in input.chunks(pool.input_len()) {
                    for o in 0..pool.output_len() {
                        let mut top = [f64::NEG_INFINITY; 2];
                        for at in pool.window(o) {
                            let v = sample[at].to_f64().unwrap_or(0.0);
                            if v > top[0] {
                                top = [v, top[0]];
                            } else if v > top[1] {
                                top[1] = v;
                            }
                        }
                        if k > 1 && !(top[0] == 0.0 && top[1] == 0.0) {
                            margin = margin.min((top[0] - top[1]) / scale);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    margin
}

fn image(s: Shape) -> (usize, usize, usize) {
    match s {
        Shape::Image { channels, height, width } => (channels, height, width),
        Shape::Flat(_) => unreachable!("Spec::chain puts only images into image layers"),
    }
}

fn activate<F: Real>(layer: Layer, z: F) -> F {
    match layer {
        Layer::Relu => z.max(F::zero()),
        Layer::Sigmoid => F::one() / (F::one() + (-z).exp()),
        Layer::Tanh => z.tanh(),
        Layer::Gelu => gelu(z),
        _ => unreachable!("not an activation"),
    }
}

/// d activation / dz from the input z and the output a.
fn slope<F: Real>(layer: Layer, z: F, a: F) -> F {
    match layer {
        Layer::Relu => {
            if z > F::zero() {
                F::one()
            } else {
                F::zero()
            }
        }
        Layer::Sigmoid => a * (F::one() - a),
        Layer::Tanh => F::one() - a * a,
        Layer::Gelu => gelu_grad(z),
        _ => unreachable!("not an activation"),
    }
}

/// A Conv2d layer's sizes from its input and output shapes (`Spec::chain` checked that they fit).
fn conv_shape(sin: Shape, sout: Shape, kernel: usize, stride: usize, padding: usize) -> Conv2dShape {
    let conv = Conv2dShape::new(image(sin), image(sout).0, (kernel, kernel), stride, padding)
        .expect("Spec::chain lets only kernels that fit their input through");
    debug_assert_eq!(image(sout), (conv.out_channels, conv.out_height, conv.out_width));
    conv
}

/// A MaxPool2d(k) layer's sizes: k×k windows side by side (stride k, no padding).
fn pool_shape(sin: Shape, k: usize) -> MaxPool2dShape {
    MaxPool2dShape::new(image(sin), k, k, 0).expect("Spec::chain lets only windows that fit their input through")
}
