//! `textnet selftest --only nn`: every op of `nn` on device tensors (the kernels of `fused/nn.cu`)
//! against the same op on host tensors (its CPU twin), on seeded random inputs and shapes with odd sizes,
//! size-1 and broadcast axes, a scalar, rows longer than a warp and products larger than a tile:
//!
//! - kernels: each op's output and the gradient of every input, from a random output gradient (the
//!   layout and image ops too: narrow, slice and cat along every axis, conv2d, max_pool2d with ties);
//!   `clip_grad_norm` and three steps of each optimizer over many tensors of odd sizes at once (the
//!   multi-tensor launches, several tables each), against the host; the backward's fusion (an
//!   activation's slope in the next linear layer's dx) against the same backward unfused, to the bit;
//! - training: 30 steps of a two-layer MLP (linear, tanh — no kink for rounding to flip —, linear, cross-entropy with a row ignored, SGD)
//!   on the device against the host: the losses and the parameters;
//! - repeat: the device run twice gives the same bits; and 12 Adam steps of the MLP (a new batch and a new
//!   rate each step) through a `CapturedStep` — eager, then captured, then replayed — give the same bits
//!   as the same steps op by op; so do 12 AdamW steps of a next-token model whose step embeds ids held on
//!   the device, drops out by the layer's device counter and clips the gradients on the device.

use super::cuda::Device;
use super::cuda::direct_conv::ConvKernels;
use super::{
    Dropout, Embedding, Linear, Module, Optimizer, Result, Tensor, cat, causal_self_attention, clip_grad_norm, conv2d,
    dropout, embedding, index_rows, index_rows_tensor, layer_norm, linear, max_pool2d, scaled_dot_product_attention,
};
use crate::device::precision::Precision;
use crate::device::{Gpu, compile::ModuleRequest};
use crate::harness::check::{Check, Group, Plan, rel_error, worst};
use crate::ops::cpu::SeededRng;
use rand::RngExt;
use std::sync::Arc;

/// Largest relative error of an elementwise op (the same float operations on both sides, but the GPU may
/// fuse a multiply-add or use its own exp/tanh).
const ELEMENTWISE_TOLERANCE: f64 = 1e-5;
/// Largest relative error of an op that sums (products, reductions, losses): another order of addition.
const SUM_TOLERANCE: f64 = 1e-4;
/// An op whose device kernel does the host's float operations in the host's order (a gather, a sum of the
/// same rows in the same order, a mask of the same hash): the same bits.
const EXACT: f64 = 0.0;
/// Largest relative error of `clip_grad_norm` and of an optimizer that clips. The host sums the squares
/// in f64; the device sums each chunk of 8192 squares in f32 (32 in order a thread, then a tree of 8
/// levels: at most 40 roundings of 2⁻²⁴ relative, all terms ≥ 0) and the chunks in f64, so its Σg² is
/// within 2.4e-6 of the host's, the norm within 1.2e-6 (the square root halves it) plus a rounding, the
/// factor and the scaled gradients a rounding or two more: below 2e-6. Ten times that, less than the
/// sums' tolerance, as a bug in the chunks or the slots (a chunk or an element left out) is larger.
const CLIP_TOLERANCE: f64 = 2e-5;

type Op<'a> = dyn Fn(&[Tensor]) -> Result<Tensor> + 'a;

/// An activation op (`Tensor::relu`, …).
type Activation = fn(&Tensor) -> Result<Tensor>;

/// `nn`'s checks, for `textnet selftest` (`--only nn`).
pub const SUITE: crate::harness::check::Suite = crate::harness::check::Suite { name: "nn", checks, modules };

/// The modules the checks compile.
pub fn modules(_plan: &Plan) -> Vec<ModuleRequest> {
    let attention = PACKED_ATTENTION_SHAPES
        .map(|(_, time, _, head_size, _)| super::cuda::attention::module_request(time, head_size));
    [vec![super::cuda::module_request()], attention.to_vec()].concat()
}

/// `packed_attention_checks`' shapes: batch, sequence length, heads, head size, and whether in bf16.
/// Each (length, head size) is a module of its own.
const PACKED_ATTENTION_SHAPES: [(usize, usize, usize, usize, bool); 6] = [
    (2, 5, 1, 3, false),
    (3, 70, 2, 8, false),
    (1, 64, 4, 16, false),
    (2, 70, 2, 16, true),
    (2, 200, 2, 64, true),
    (1, 256, 6, 64, true),
];

fn values(rng: &mut SeededRng, shape: &[usize], low: f32, high: f32) -> Vec<f32> {
    (0..shape.iter().product::<usize>()).map(|_| rng.random_range(low..high)).collect()
}

/// The op on host tensors and on device tensors from the same inputs, both back-propagated from the same
/// random output gradient: the relative error of the output and of each input's gradient, as checks.
fn compare(
    device: &Arc<Device>,
    rng: &mut SeededRng,
    name: (&str, f64),
    inputs: &[(Vec<f32>, Vec<usize>)],
    op: &Op<'_>,
) -> anyhow::Result<Vec<Check>> {
    compare_rounded(device, rng, name, inputs, op, |v| v)
}

/// `compare` with the host's inputs and the output gradient passed through `round` (the device's inputs
/// are not): a device op that rounds its operands as `round` does then matches the host to `tolerance`.
fn compare_rounded(
    device: &Arc<Device>,
    rng: &mut SeededRng,
    (name, tolerance): (&str, f64),
    inputs: &[(Vec<f32>, Vec<usize>)],
    op: &Op<'_>,
    round: fn(f32) -> f32,
) -> anyhow::Result<Vec<Check>> {
    let rounded = |v: &[f32]| v.iter().map(|&x| round(x)).collect::<Vec<f32>>();
    let host: Vec<Tensor> = inputs.iter().map(|(v, s)| Tensor::parameter(rounded(v), s)).collect::<Result<_>>()?;
    let on_device: Vec<Tensor> =
        (inputs.iter()).map(|(v, s)| Tensor::parameter(v.clone(), s)?.to_device(device)).collect::<Result<_>>()?;
    let (out_host, out_device) = (op(&host)?, op(&on_device)?);
    let seed = Tensor::from_vec(rounded(&values(rng, out_host.shape(), -1.0, 1.0)), out_host.shape())?;
    out_host.backward_with(Some(&seed), false)?;
    out_device.backward_with(Some(&seed.to_device(device)?), false)?;
    let shapes: Vec<String> = inputs.iter().map(|(_, s)| format!("{s:?}")).collect();
    let shape = shapes.join(" ");
    let mut checks = vec![Check {
        kernel: format!("nn {name}"),
        shape: shape.clone(),
        rel_error: rel_error(&out_device.values()?, &out_host.values()?),
        tolerance,
    }];
    for (i, (h, d)) in host.iter().zip(&on_device).enumerate() {
        // A broadcast operand's gradient sums the output gradient over the positions it was read at: an
        // elementwise op's backward is then a sum, whose multiply-adds the GPU may fuse.
        let broadcast = h.numel() < out_host.numel() && tolerance == ELEMENTWISE_TOLERANCE;
        let grad_tolerance = if broadcast { SUM_TOLERANCE } else { tolerance };
        let (Some(gh), Some(gd)) = (h.grad(), d.grad()) else {
            anyhow::bail!(
                "nn {name} {shape}: input {i} got no gradient on the {}",
                if h.grad().is_none() { "host" } else { "GPU" }
            );
        };
        checks.push(Check {
            kernel: format!("nn {name} ∂input{i}"),
            shape: shape.clone(),
            rel_error: rel_error(&gd.values()?, &gh.values()?),
            tolerance: grad_tolerance,
        });
    }
    Ok(checks)
}

/// Pairs of shapes that broadcast, with odd sizes: equal, [3, 1] with [1, 4], a scalar, a trailing axis,
/// missing leading axes, four axes of which two broadcast.
const BROADCAST_PAIRS: [(&[usize], &[usize]); 7] = [
    (&[7, 33], &[7, 33]),
    (&[3, 1], &[1, 4]),
    (&[], &[5, 3]),
    (&[9, 130], &[130]),
    (&[5, 1, 3], &[4, 1]),
    (&[2, 3, 1, 5], &[3, 4, 1]),
    (&[1], &[1000]),
];

fn elementwise_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    let binaries: [(&str, &Op<'_>); 4] = [
        ("add", &|t| t[0].add(&t[1])),
        ("sub", &|t| t[0].sub(&t[1])),
        ("mul", &|t| t[0].mul(&t[1])),
        ("div", &|t| t[0].div(&t[1])),
    ];
    for (a, b) in BROADCAST_PAIRS {
        for (x, y) in [(a, b), (b, a)] {
            for (name, op) in binaries {
                let (low, high) = if name == "div" { (0.5, 2.0) } else { (-2.0, 2.0) };
                let inputs = [(values(rng, x, -2.0, 2.0), x.to_vec()), (values(rng, y, low, high), y.to_vec())];
                checks.extend(compare(device, rng, (name, ELEMENTWISE_TOLERANCE), &inputs, op)?);
            }
        }
    }
    let unaries: [(&str, &Op<'_>, f32, f32); 11] = [
        ("relu", &|t| t[0].relu(), -2.0, 2.0),
        ("gelu", &|t| t[0].gelu(), -3.0, 3.0),
        ("tanh", &|t| t[0].tanh(), -3.0, 3.0),
        ("sigmoid", &|t| t[0].sigmoid(), -4.0, 4.0),
        ("exp", &|t| t[0].exp(), -3.0, 3.0),
        ("log", &|t| t[0].log(), 0.1, 4.0),
        ("neg", &|t| t[0].neg(), -2.0, 2.0),
        ("add_scalar", &|t| t[0].add_scalar(0.75), -2.0, 2.0),
        ("sub_scalar", &|t| t[0].sub_scalar(-1.5), -2.0, 2.0),
        ("mul_scalar", &|t| t[0].mul_scalar(-3.0), -2.0, 2.0),
        ("div_scalar", &|t| t[0].div_scalar(0.3), -2.0, 2.0),
    ];
    for shape in [&[1][..], &[7, 33], &[3, 5, 257]] {
        for (name, op, low, high) in unaries {
            let inputs = [(values(rng, shape, low, high), shape.to_vec())];
            checks.extend(compare(device, rng, (name, ELEMENTWISE_TOLERANCE), &inputs, op)?);
        }
    }
    Ok(checks)
}

fn reduction_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    let ops: [(&str, &Op<'_>); 10] = [
        ("sum axis 0", &|t| t[0].sum(0, false)),
        ("sum axis -1", &|t| t[0].sum(-1, false)),
        ("mean axis 1 keepdim", &|t| t[0].mean(1, true)),
        ("sum_all", &|t| t[0].sum_all()),
        ("mean_all", &|t| t[0].mean_all()),
        ("softmax", &|t| t[0].softmax()),
        ("log_softmax", &|t| t[0].log_softmax()),
        ("transpose 0 -1", &|t| t[0].transpose(0, -1)),
        ("permute 2 0 1", &|t| t[0].permute(&[2, 0, 1])),
        ("reshape", &|t| t[0].reshape(&[t[0].numel()])),
    ];
    for shape in [&[1, 1, 1][..], &[7, 3, 33], &[2, 129, 5], &[3, 1, 1000]] {
        for (name, op) in ops {
            // Values of mean 1, both signs: a sum of values of mean 0 may cancel to near 0, where its relative
            // error is that of a few roundings over a tiny result (mean_all of 3000 failed so on a correct
            // kernel, 1.9e-4).
            let inputs = [(values(rng, shape, -2.0, 4.0), shape.to_vec())];
            checks.extend(compare(device, rng, (name, SUM_TOLERANCE), &inputs, op)?);
        }
    }
    Ok(checks)
}

fn product_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    let matmul: &Op<'_> = &|t| t[0].matmul(&t[1]);
    // The fp32 products' three tiles (`FP32_TILES`: the largest whose grid fills the GPU): 700×830 results
    // take the 64×64 tile, 200×170 the 16×16, and the rest the 8×8, 9×13 over k 600 in three chunks. Few
    // results over a long k split k into slices summed after (`k_slices`): 9×13 over 3000 (forward), 5×7
    // over 4000 (the first operand's gradient, the second transposed), 6×5 over 3000 (the second's, the
    // first transposed).
    let pairs: [(&[usize], &[usize]); 12] = [
        (&[1, 1], &[1, 1]),
        (&[5, 7], &[7, 3]),
        (&[130, 70], &[70, 65]),
        (&[700, 20], &[20, 830]),
        (&[200, 50], &[50, 170]),
        (&[9, 600], &[600, 13]),
        (&[9, 3000], &[3000, 13]),
        (&[5, 7], &[7, 4000]),
        (&[3000, 6], &[6, 5]),
        (&[2, 5, 7], &[2, 7, 3]),
        (&[3, 5, 7], &[7, 4]),
        (&[5, 7], &[3, 7, 4]),
    ];
    for (a, b) in pairs {
        let inputs = [(values(rng, a, -1.0, 1.0), a.to_vec()), (values(rng, b, -1.0, 1.0), b.to_vec())];
        checks.extend(compare(device, rng, ("matmul", SUM_TOLERANCE), &inputs, matmul)?);
    }
    let with_bias: &Op<'_> = &|t| linear(&t[0], &t[1], Some(&t[2]));
    let without: &Op<'_> = &|t| linear(&t[0], &t[1], None);
    // Forward 200×170 on the 16×16 tile; the backward (dx's tiles and dW's, with the bias column) of
    // 5×900→640 on the 64×64, of 600×64→256 on the 16×16, the rest on the 8×8.
    let layers = [
        (&[9, 17][..], (5, 17)),
        (&[2, 3, 70], (65, 70)),
        (&[1, 1], (1, 1)),
        (&[200, 30], (170, 30)),
        (&[5, 900], (640, 900)),
        (&[600, 64], (256, 64)),
    ];
    for (x, (outputs, inputs)) in layers {
        let w = [outputs, inputs];
        let parts = [(values(rng, x, -1.0, 1.0), x.to_vec()), (values(rng, &w, -1.0, 1.0), w.to_vec())];
        checks.extend(compare(device, rng, ("linear", SUM_TOLERANCE), &parts, without)?);
        let bias = (values(rng, &[outputs], -1.0, 1.0), vec![outputs]);
        let parts = [parts[0].clone(), parts[1].clone(), bias];
        checks.extend(compare(device, rng, ("linear + bias", SUM_TOLERANCE), &parts, with_bias)?);
    }
    checks.extend(bf16_product_checks(device, rng)?);
    Ok(checks)
}

/// Puts the device back to fp32 products when dropped, however the checks end.
struct Fp32Again<'a>(&'a Device);

impl Drop for Fp32Again<'_> {
    fn drop(&mut self) {
        let _ = self.0.set_precision(Precision::Fp32);
    }
}

/// The device's products in bf16 until the guard is dropped.
fn bf16_products(device: &Device) -> Result<Fp32Again<'_>> {
    device.set_precision(Precision::Bf16)?;
    Ok(Fp32Again(device))
}

/// `causal_self_attention` on packed q, k, v: the fp32 kernels at odd sizes (T not a multiple of the
/// 64-row chunk, head sizes 3 and 8, one head and several) and the bf16 flash kernels (head sizes 16 and
/// 64), each without and with dropout on the probabilities, against the twin. bf16 within 8u = 2⁻⁵ (the
/// Transformer's flash checks derive it: rounding of q, k, v, p and dy along the deepest chain).
fn packed_attention_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    for (batch, time, heads, head_size, bf16) in PACKED_ATTENTION_SHAPES {
        for p in [0.0, 0.2] {
            let shape = [batch, time, 3 * heads * head_size];
            let inputs = [(values(rng, &shape, -1.0, 1.0), shape.to_vec())];
            let seed = rng.random::<u32>();
            let op: &Op<'_> = &|t| {
                let layer = Dropout::new(p, seed)?.with_site(3);
                causal_self_attention(&t[0], heads, Some(&layer))
            };
            let (name, tolerance) = if bf16 {
                (format!("causal_self_attention bf16 p {p}"), 8.0 * Precision::Bf16.unit_roundoff())
            } else {
                (format!("causal_self_attention p {p}"), SUM_TOLERANCE)
            };
            let _reset = if bf16 { Some(bf16_products(device)?) } else { None };
            checks.extend(compare(device, rng, (&name, tolerance), &inputs, op)?);
        }
    }
    Ok(checks)
}

/// `causal_self_attention` with dropout, with small device buffers made and filled between its forward
/// and its backward (as a step's other ops do): the backward must redraw the forward's mask, so the step
/// word it reads must still be the forward's.
fn attention_dropout_kept_check(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Check> {
    let (batch, time, heads, head_size) = (2, 70, 2, 8);
    let shape = [batch, time, 3 * heads * head_size];
    let qkv = values(rng, &shape, -1.0, 1.0);
    let seed = rng.random::<u32>();
    let run = |on_device: bool| -> anyhow::Result<Vec<f32>> {
        let x = Tensor::parameter(qkv.clone(), &shape)?;
        let x = if on_device { x.to_device(device)? } else { x };
        let layer = Dropout::new(0.3, seed)?.with_site(1);
        let y = causal_self_attention(&x, heads, Some(&layer))?;
        let mut others = Vec::new();
        for k in 0..16 {
            let word = Tensor::from_vec(vec![k as f32 + 0.5], &[1])?;
            others.push(if on_device { word.to_device(device)? } else { word });
        }
        y.sum_all()?.backward()?;
        Ok(x.grad().expect("a gradient").values()?)
    };
    let (host, on_device) = (run(false)?, run(true)?);
    Ok(Check {
        kernel: "nn causal_self_attention dropout ∂qkv, buffers made between".into(),
        shape: format!("{shape:?}"),
        rel_error: rel_error(&on_device, &host),
        tolerance: SUM_TOLERANCE,
    })
}

/// The products at `Precision::Bf16` (forward and backward) against the host's fp32 products of the
/// operands and output gradient rounded to bf16: products of bf16 values are exact in fp32, so only the
/// order of the sums differs, and a kernel that did not round (or rounded another way) is off by ~2⁻⁹.
fn bf16_product_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    use crate::ops::gemm::round_bf16;
    let _reset = bf16_products(device)?;
    let mut checks = Vec::new();
    let matmul: &Op<'_> = &|t| t[0].matmul(&t[1]);
    // The last pair's k of 1500 over one tile is split in k (slices added in order).
    let pairs: [(&[usize], &[usize]); 5] = [
        (&[1, 1], &[1, 1]),
        (&[130, 70], &[70, 65]),
        (&[3, 65, 33], &[33, 129]),
        (&[2, 5, 7], &[2, 7, 3]),
        (&[5, 1500], &[1500, 7]),
    ];
    for (a, b) in pairs {
        let inputs = [(values(rng, a, -1.0, 1.0), a.to_vec()), (values(rng, b, -1.0, 1.0), b.to_vec())];
        checks.extend(compare_rounded(device, rng, ("matmul bf16", SUM_TOLERANCE), &inputs, matmul, round_bf16)?);
    }
    let with_bias: &Op<'_> = &|t| linear(&t[0], &t[1], Some(&t[2]));
    // 2100 rows: the weight's gradient (2 tiles, k 2100) is split in k.
    for (x, (outputs, inputs)) in [(&[9, 17][..], (5, 17)), (&[2, 67, 96], (130, 96)), (&[3, 700, 96], (130, 96))] {
        let w = [outputs, inputs];
        let parts = [
            (values(rng, x, -1.0, 1.0), x.to_vec()),
            (values(rng, &w, -1.0, 1.0), w.to_vec()),
            // The bias is added in fp32: a bias of bf16 values keeps the comparison exact up to order.
            (values(rng, &[outputs], -1.0, 1.0).into_iter().map(round_bf16).collect(), vec![outputs]),
        ];
        let name = ("linear + bias bf16", SUM_TOLERANCE);
        checks.extend(compare_rounded(device, rng, name, &parts, with_bias, round_bf16)?);
    }
    Ok(checks)
}

fn loss_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    for (rows, classes) in [(1, 1), (13, 10), (5, 1000), (64, 3)] {
        // Targets include class 0, the last class and a row to ignore (when there are two rows or more).
        let mut targets: Vec<i64> = (0..rows).map(|_| rng.random_range(0..classes as i64)).collect();
        targets[0] = 0;
        targets[rows - 1] = classes as i64 - 1;
        if rows > 2 {
            targets[1] = -100;
        }
        let logits = [(values(rng, &[rows, classes], -4.0, 4.0), vec![rows, classes])];
        let op: &Op<'_> = &|t| t[0].cross_entropy(&targets, Some(-100));
        checks.extend(compare(device, rng, ("cross_entropy", SUM_TOLERANCE), &logits, op)?);
        // Without an index to ignore the kernel divides the gradient by the rows itself, and a backward from
        // the loss starts from the 1 the kernel wrote, handing that gradient on as it is.
        let every: Vec<i64> = targets.iter().map(|&t| t.max(0)).collect();
        let op: &Op<'_> = &|t| t[0].cross_entropy(&every, None);
        checks.extend(compare(device, rng, ("cross_entropy, no index ignored", SUM_TOLERANCE), &logits, op)?);
        let host = Tensor::parameter(logits[0].0.clone(), &logits[0].1)?;
        let on_device = Tensor::parameter(logits[0].0.clone(), &logits[0].1)?.to_device(device)?;
        host.cross_entropy(&every, None)?.backward()?;
        on_device.cross_entropy(&every, None)?.backward()?;
        let (Some(gh), Some(gd)) = (host.grad(), on_device.grad()) else {
            anyhow::bail!("nn cross_entropy: a backward from the loss gave the logits no gradient");
        };
        checks.push(Check {
            kernel: "nn cross_entropy, backward from the loss, no index ignored".into(),
            shape: format!("[{rows}, {classes}]"),
            rel_error: rel_error(&gd.values()?, &gh.values()?),
            tolerance: SUM_TOLERANCE,
        });
    }
    for shape in [&[1][..], &[7, 33], &[4, 1000]] {
        let inputs = [(values(rng, shape, -2.0, 2.0), shape.to_vec()), (values(rng, shape, -2.0, 2.0), shape.to_vec())];
        checks.extend(compare(device, rng, ("mse", SUM_TOLERANCE), &inputs, &|t| t[0].mse(&t[1]))?);
    }
    Ok(checks)
}

/// LayerNorm (with and without weight and bias, D of 1, odd and past a warp), embedding (ids 0 and the
/// last, repeated, padding_idx first, negative and absent) and `index_rows` (`x[ids]`), dropout (the
/// host's mask to the bit, p = 1 included) and attention (causal and not, T = 1, odd D, more keys than a
/// warp's lanes).
fn layer_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    let norms: [(&str, &Op<'_>, bool, bool); 4] = [
        ("layer_norm", &|t| layer_norm(&t[0], None, None, 1e-5), false, false),
        ("layer_norm weight", &|t| layer_norm(&t[0], Some(&t[1]), None, 1e-5), true, false),
        ("layer_norm bias", &|t| layer_norm(&t[0], None, Some(&t[1]), 1e-3), false, true),
        ("layer_norm weight bias", &|t| layer_norm(&t[0], Some(&t[1]), Some(&t[2]), 1e-5), true, true),
    ];
    for shape in [&[1][..], &[4, 1], &[7, 33], &[3, 5, 257], &[2, 1, 20]] {
        let width = shape[shape.len() - 1];
        for (name, op, weight, bias) in norms {
            let mut inputs = vec![(values(rng, shape, -3.0, 3.0), shape.to_vec())];
            inputs.extend(weight.then(|| (values(rng, &[width], 0.5, 1.5), vec![width])));
            inputs.extend(bias.then(|| (values(rng, &[width], -1.0, 1.0), vec![width])));
            checks.extend(compare(device, rng, (name, SUM_TOLERANCE), &inputs, op)?);
        }
    }
    let tables: [(usize, usize, &[usize], Option<i64>); 4] =
        [(1, 1, &[1], None), (11, 7, &[3, 5], Some(3)), (50, 33, &[2, 3, 7], Some(-1)), (5, 40, &[17], Some(0))];
    for (rows, dims, ids_shape, padding) in tables {
        let count: usize = ids_shape.iter().product();
        // Ids 0 and the last, the rest drawn (so some repeat, the padding row's among them).
        let mut ids: Vec<i64> = (0..count).map(|_| rng.random_range(0..rows as i64)).collect();
        ids[0] = 0;
        ids[count - 1] = rows as i64 - 1;
        let weight = [(values(rng, &[rows, dims], -1.0, 1.0), vec![rows, dims])];
        let op: &Op<'_> = &|t| embedding(&t[0], &ids, ids_shape, padding);
        let name = format!("embedding ids {ids_shape:?} padding_idx {padding:?}");
        checks.extend(compare(device, rng, (&name, EXACT), &weight, op)?);
    }
    let long_ids: (usize, usize, &[usize], Option<i64>) = (9, 5, &[3, 200], Some(2));
    for (rows, dims, ids_shape, padding) in tables.into_iter().chain([long_ids]) {
        // The `Embedding` layer on ids in a tensor: on the device the ids stay there, their rows summed in
        // parts of 128 (600 ids: four parts of 150, added in order, so no longer the host's order exactly).
        let count: usize = ids_shape.iter().product();
        let mut ids: Vec<f32> = (0..count).map(|_| rng.random_range(0..rows) as f32).collect();
        ids[count - 1] = 0.0;
        let ids = Tensor::from_vec(ids, ids_shape)?;
        let weight = [(values(rng, &[rows, dims], -1.0, 1.0), vec![rows, dims])];
        let op: &Op<'_> = &|t| {
            let ids = if t[0].is_on_device() { ids.to_device(device)? } else { ids.clone() };
            Embedding::from_parameters(t[0].clone(), padding)?.forward(&ids)
        };
        let name = format!("Embedding ids on the device {ids_shape:?} padding_idx {padding:?}");
        let tolerance = if count < 256 { EXACT } else { SUM_TOLERANCE };
        checks.extend(compare(device, rng, (&name, tolerance), &weight, op)?);
    }
    checks.extend(bad_id_checks(device, rng)?);
    checks.extend(index_rows_checks(device, rng)?);
    for (shape, p, seed, step, site) in
        [(&[1][..], 0.5, 1, 0, 0), (&[7, 33], 0.1, 7, 3, 2), (&[3, 5, 257], 0.5, 42, 11, 1), (&[9, 10], 1.0, 5, 1, 4)]
    {
        let inputs = [(values(rng, shape, -2.0, 2.0), shape.to_vec())];
        let op: &Op<'_> = &|t| dropout(&t[0], p, true, seed, step, site);
        checks.extend(compare(device, rng, (&format!("dropout p {p}"), EXACT), &inputs, op)?);
        // The `Dropout` layer's forward number `step`: on the device its counter, read and advanced there.
        let op: &Op<'_> = &|t| {
            let layer = Dropout::new(p, seed)?.with_site(site);
            for _ in 0..step {
                layer.forward(&t[0])?;
            }
            layer.forward(&t[0])
        };
        checks.extend(compare(device, rng, (&format!("Dropout layer p {p} forward {step}"), EXACT), &inputs, op)?);
    }
    checks.extend(clip_checks(device, rng)?);
    checks.extend(packed_attention_checks(device, rng)?);
    checks.push(attention_dropout_kept_check(device, rng)?);
    for shape in [[1, 1, 1, 1], [2, 3, 5, 7], [1, 2, 33, 16], [2, 1, 70, 65], [1, 1, 1, 9]] {
        for causal in [false, true] {
            let name = if causal { "attention causal" } else { "attention" };
            let qkv: Vec<_> = (0..3).map(|_| (values(rng, &shape, -1.0, 1.0), shape.to_vec())).collect();
            let op: &Op<'_> = &|t| scaled_dot_product_attention(&t[0], &t[1], &t[2], causal);
            checks.extend(compare(device, rng, (name, SUM_TOLERANCE), &qkv, op)?);
        }
    }
    Ok(checks)
}

/// A lookup of rows of a table (its first argument) at ids held on the device (its second).
type Lookup<'a> = &'a dyn Fn(&Tensor, &Tensor) -> Result<Tensor>;

/// An id that is not a row (past the end, negative, not whole) gives a row of NaN on the device, and the
/// other rows stay the table's: the `Embedding` layer's lookup, and `index_rows_tensor`'s of a tensor of
/// three axes (its rows the last two).
fn bad_id_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let layer: Lookup<'_> = &|weight, ids| Embedding::from_parameters(weight.clone(), None)?.forward(ids);
    let index: Lookup<'_> = &|x, ids| index_rows_tensor(x, ids);
    let lookups: [(&str, &[usize], Lookup<'_>); 2] =
        [("nn Embedding bad id = NaN row", &[6, 5], layer), ("nn index_rows bad id = NaN row", &[6, 2, 3], index)];
    let mut checks = Vec::new();
    for (kernel, table_shape, lookup) in lookups {
        let (rows, dims) = (table_shape[0], table_shape[1..].iter().product::<usize>());
        let table = Tensor::from_vec(values(rng, table_shape, -1.0, 1.0), table_shape)?;
        let ids = [2.0, 6.0, -1.0, 0.5, 5.0];
        let looked_up =
            lookup(&table.to_device(device)?, &Tensor::from_slice(&ids, &[ids.len()])?.to_device(device)?)?.values()?;
        let table = table.to_vec();
        let right = ids.iter().zip(looked_up.chunks(dims)).all(|(&id, row)| {
            if (0.0..rows as f32).contains(&id) && id.fract() == 0.0 {
                row == &table[id as usize * dims..][..dims]
            } else {
                row.iter().all(|v| v.is_nan())
            }
        });
        checks.push(Check::holds(kernel, format!("ids {ids:?} of {table_shape:?}"), right));
    }
    Ok(checks)
}

/// `index_rows` (`x[ids]`) of tensors of one to four axes at odd sizes, ids 0 and the last, repeated:
/// by ids held on the device (`index_rows_tensor`, which sums a row's gradient in parts of 128 ids, so
/// 600 ids are no longer added in the host's order exactly) and by host ids (a negative one among them,
/// uploaded as `embedding`'s), each against the host's `index_rows` with the same ids; then a tensor
/// needing no gradient, and one computed, indexed by device ids: the result needs a gradient only when
/// the tensor does, and a computed tensor's flows back through it.
fn index_rows_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    let cases: [(&[usize], &[usize]); 5] =
        [(&[1], &[1]), (&[7], &[3, 5]), (&[5, 2, 3, 7], &[2, 3]), (&[50, 33], &[17]), (&[9, 5], &[3, 200])];
    for (shape, ids_shape) in cases {
        let (rows, count) = (shape[0], ids_shape.iter().product::<usize>());
        let mut ids: Vec<i64> = (0..count).map(|_| rng.random_range(0..rows as i64)).collect();
        ids[0] = 0;
        ids[count - 1] = rows as i64 - 1;
        ids[count / 2] = 0;
        let held = Tensor::from_vec(ids.iter().map(|&id| id as f32).collect(), ids_shape)?;
        let x = [(values(rng, shape, -1.0, 1.0), shape.to_vec())];
        let op: &Op<'_> = &|t| {
            if t[0].is_on_device() {
                index_rows_tensor(&t[0], &held.to_device(device)?)
            } else {
                index_rows(&t[0], &ids, ids_shape)
            }
        };
        let tolerance = if count < 256 { EXACT } else { SUM_TOLERANCE };
        let name = format!("index_rows ids on the device {ids_shape:?}");
        checks.extend(compare(device, rng, (&name, tolerance), &x, op)?);
        let mut signed = ids.clone();
        signed[count - 1] -= rows as i64;
        let op: &Op<'_> = &|t| index_rows(&t[0], &signed, ids_shape);
        checks.extend(compare(device, rng, (&format!("index_rows host ids {ids_shape:?}"), EXACT), &x, op)?);
    }
    let (rows, dims) = (5, 3);
    let table = values(rng, &[rows, dims], -1.0, 1.0);
    let ids = Tensor::from_slice(&[3.0, 0.0, 3.0], &[3])?.to_device(device)?;
    let plain = Tensor::from_vec(table.clone(), &[rows, dims])?.to_device(device)?;
    let picked = index_rows_tensor(&plain, &ids)?;
    let leaf = Tensor::parameter(table, &[rows, dims])?.to_device(device)?;
    let computed = leaf.mul_scalar(2.0)?;
    index_rows_tensor(&computed, &ids)?.sum_all()?.backward()?;
    let grad = leaf.grad().map(|g| g.values()).transpose()?;
    let mut expected = vec![0.0f32; rows * dims];
    expected[..dims].fill(2.0);
    expected[3 * dims..][..dims].fill(4.0);
    let right = !picked.requires_grad() && !plain.requires_grad() && grad == Some(expected);
    checks.push(Check::holds(
        "nn index_rows keeps the tensor's flags",
        format!("ids [3, 0, 3] of [{rows}, {dims}], needing no gradient, and computed"),
        right,
    ));
    Ok(checks)
}

/// `clip_grad_norm` over device gradients (computed and applied on the device) against the host's: the
/// norm returned and the clipped gradients, a norm above the limit and one below it.
fn clip_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    let shapes: [&[usize]; 4] = [&[1], &[7, 33], &[300, 257], &[65]];
    for max_norm in [1.0f32, 1e4] {
        let grads: Vec<Vec<f32>> = shapes.iter().map(|s| values(rng, s, -1.0, 1.0)).collect();
        let clip = |on_device: bool| -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
            let mut parameters = Vec::new();
            for (g, shape) in grads.iter().zip(shapes) {
                let p = Tensor::parameter(vec![0.0; g.len()], shape)?;
                let p = if on_device { p.to_device(device)? } else { p };
                give_gradient(&p, g)?;
                parameters.push(p);
            }
            let norm = clip_grad_norm(&parameters, max_norm)?.values()?;
            let mut clipped = Vec::new();
            for p in &parameters {
                clipped.extend(p.grad().expect("a gradient").values()?);
            }
            Ok((norm, clipped))
        };
        let ((host_norm, host_grads), (norm, grads)) = (clip(false)?, clip(true)?);
        let errors = [("norm", rel_error(&norm, &host_norm)), ("gradients", rel_error(&grads, &host_grads))];
        let (rel_error, what) = worst(errors);
        let shape = format!("4 gradients, max_norm {max_norm} ({what})");
        checks.push(Check { kernel: "nn clip_grad_norm".into(), shape, rel_error, tolerance: CLIP_TOLERANCE });
    }
    checks.push(many_gradients_clip_check(device, rng)?);
    Ok(checks)
}

/// Gives `p` the gradient `g` wherever it lives (∂(Σ p·g)/∂p = g, exactly: g times a seed of 1).
fn give_gradient(p: &Tensor, g: &[f32]) -> Result<()> {
    p.zero_grad();
    let g = Tensor::from_slice(g, p.shape())?;
    let g = match p.storage().as_ref() {
        super::Storage::Device(buffer) => g.to_device(buffer.device())?,
        super::Storage::Host(_) => g,
    };
    p.mul(&g)?.sum_all()?.backward()
}

/// The size of tensor `i` of the many-tensor checks: mostly small and odd, every 50th one at or across
/// the kernels' chunk of 8192 elements (one chunk less one, one, one more, two, three and more).
fn odd_size(i: usize) -> usize {
    const SMALL: [usize; 11] = [1, 2, 3, 5, 7, 31, 33, 64, 255, 257, 1000];
    const LARGE: [usize; 6] = [8191, 8192, 8193, 20001, 16384, 24577];
    if i % 50 == 7 { LARGE[(i / 50) % LARGE.len()] } else { SMALL[i % SMALL.len()] }
}

/// `clip_grad_norm` over 300 gradients of odd sizes (three launches' tables, more partial sums than the
/// final block has threads), one parameter without a gradient, one listed twice (scaled twice, as on the
/// host), and one whose gradient is held by a tensor from `grad()` meanwhile (that tensor keeps its
/// values): the norm, every clipped gradient and the held one against the host's.
fn many_gradients_clip_check(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Check> {
    const COUNT: usize = 300;
    let (idle, twice, held) = (11, 0, 1);
    let grads: Vec<Vec<f32>> = (0..COUNT).map(|i| values(rng, &[odd_size(i)], -1.0, 1.0)).collect();
    let clip = |on_device: bool| -> anyhow::Result<[Vec<f32>; 3]> {
        let mut parameters = Vec::new();
        for (i, g) in grads.iter().enumerate() {
            let p = Tensor::parameter(vec![0.0; g.len()], &[g.len()])?;
            let p = if on_device { p.to_device(device)? } else { p };
            if i != idle {
                give_gradient(&p, g)?;
            }
            parameters.push(p);
        }
        let kept = parameters[held].grad().expect("a gradient");
        let listed: Vec<Tensor> = parameters.iter().cloned().chain([parameters[twice].clone()]).collect();
        let norm = clip_grad_norm(&listed, 1.0)?.values()?;
        let mut clipped = Vec::new();
        for p in &parameters {
            clipped.extend(p.grad().map(|g| g.values()).transpose()?.unwrap_or_default());
        }
        Ok([norm, clipped, kept.values()?])
    };
    let ([host_norm, host_grads, host_kept], [norm, grads_after, kept]) = (clip(false)?, clip(true)?);
    let errors = [
        ("norm", rel_error(&norm, &host_norm)),
        ("gradients", rel_error(&grads_after, &host_grads)),
        ("held gradient", rel_error(&kept, &host_kept)),
        ("held gradient unchanged", rel_error(&kept, &grads[held])),
    ];
    let (rel_error, what) = worst(errors);
    let shape = format!("{COUNT} gradients of odd sizes, one without, one twice, one held ({what})");
    Ok(Check { kernel: "nn clip_grad_norm many tensors".into(), shape, rel_error, tolerance: CLIP_TOLERANCE })
}

/// Three steps of each optimizer over 150 parameters of odd sizes (three launches' tables) in three
/// groups (weight decay 0.05, none at half the rate, the optimizer's 0.01 at twice the rate), one
/// parameter without a gradient at the first step (its step count then lags the others', so its bias
/// corrections differ) and one never with a gradient, momentum and AdamW clipping to norm 1 first: the
/// parameters on the device against the host's.
fn optimizer_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    use super::ParamGroup;
    use crate::ops::optim::{OptimConfig, OptimKind};
    const COUNT: usize = 150;
    const STEPS: usize = 3;
    let (late, idle) = (4, 9);
    let initial: Vec<Vec<f32>> = (0..COUNT).map(|i| values(rng, &[odd_size(i)], -1.0, 1.0)).collect();
    let grads: Vec<Vec<Vec<f32>>> =
        (0..STEPS).map(|_| initial.iter().map(|p| values(rng, &[p.len()], -1.0, 1.0)).collect()).collect();
    let mut checks = Vec::new();
    for kind in [OptimKind::Sgd, OptimKind::Momentum, OptimKind::Adam, OptimKind::AdamW] {
        let clips = matches!(kind, OptimKind::Momentum | OptimKind::AdamW);
        let config = OptimConfig {
            lr: 1e-2,
            weight_decay: 0.01,
            clip_norm: if clips { 1.0 } else { 0.0 },
            ..OptimConfig::new(kind)
        };
        let run = |on_device: bool| -> anyhow::Result<Vec<f32>> {
            let mut parameters = Vec::new();
            for values in &initial {
                let p = Tensor::parameter(values.clone(), &[values.len()])?;
                parameters.push(if on_device { p.to_device(device)? } else { p });
            }
            let groups = vec![
                ParamGroup::new(parameters[..60].to_vec()).with_weight_decay(0.05),
                ParamGroup::new(parameters[60..110].to_vec()).with_weight_decay(0.0).with_lr_scale(0.5),
                ParamGroup::new(parameters[110..].to_vec()).with_lr_scale(2.0),
            ];
            let mut optimizer = Optimizer::new(config, groups)?;
            for (step, grads) in grads.iter().enumerate() {
                optimizer.zero_grad();
                for (i, (p, g)) in parameters.iter().zip(grads).enumerate() {
                    if i != idle && !(i == late && step == 0) {
                        give_gradient(p, g)?;
                    }
                }
                optimizer.step()?;
            }
            let mut flat = Vec::new();
            for p in &parameters {
                flat.extend(p.values()?);
            }
            Ok(flat)
        };
        let (host, on_device) = (run(false)?, run(true)?);
        let idle_at: usize = initial[..idle].iter().map(Vec::len).sum();
        let errors = [
            ("parameters", rel_error(&on_device, &host)),
            ("the one without a gradient", rel_error(&on_device[idle_at..][..initial[idle].len()], &initial[idle])),
        ];
        let (rel_error, what) = worst(errors);
        let tolerance = if clips { CLIP_TOLERANCE } else { ELEMENTWISE_TOLERANCE };
        let clipping = if clips { ", clipped to 1" } else { "" };
        let shape = format!("{COUNT} parameters in 3 groups, {STEPS} steps{clipping} ({what})");
        checks.push(Check { kernel: format!("nn optimizer {}", kind.name()), shape, rel_error, tolerance });
    }
    Ok(checks)
}

/// `narrow` and `slice` along every axis (the first, a middle one, the last; runs at the start, inside and
/// to the end, of one element and of all), and `cat` of one, two and three tensors along the first, a
/// middle and the last axis, a piece empty along it among them: copies, so the host's bits.
fn layout_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    let runs: [(&[usize], isize, usize, usize); 11] = [
        (&[7, 3, 33], 0, 2, 5),
        (&[7, 3, 33], 1, 1, 1),
        (&[7, 3, 33], 2, 5, 28),
        (&[7, 3, 33], -1, 0, 17),
        (&[2, 129, 5], 0, 1, 1),
        (&[2, 129, 5], 1, 64, 65),
        (&[2, 129, 5], -1, 4, 1),
        (&[3, 1, 1000], 1, 0, 1),
        (&[3, 1, 1000], 2, 333, 500),
        (&[1000], 0, 1, 998),
        (&[1, 1, 1], 2, 0, 1),
    ];
    for (shape, axis, start, len) in runs {
        let inputs = [(values(rng, shape, -3.0, 3.0), shape.to_vec())];
        let name = format!("narrow axis {axis} from {start}, {len}");
        checks.extend(compare(device, rng, (&name, EXACT), &inputs, &|t| t[0].narrow(axis, start, len))?);
        let name = format!("slice axis {axis} {start}..{}", start + len);
        checks.extend(compare(device, rng, (&name, EXACT), &inputs, &|t| t[0].slice(axis, start..start + len))?);
    }
    let joins: [(&[&[usize]], isize); 6] = [
        (&[&[4, 2, 5], &[4, 7, 5], &[4, 1, 5]], 1),
        (&[&[3, 5, 2, 33], &[3, 5, 1, 33], &[3, 5, 9, 33]], -2),
        (&[&[2, 0, 65], &[2, 3, 65], &[2, 1, 65]], 1),
        (&[&[3, 33], &[1, 33]], 0),
        (&[&[5, 3], &[5, 130], &[5, 1]], -1),
        (&[&[7, 9]], 0),
    ];
    for (shapes, axis) in joins {
        let inputs: Vec<_> = shapes.iter().map(|&shape| (values(rng, shape, -3.0, 3.0), shape.to_vec())).collect();
        let op: &Op<'_> = &|t| cat(&t.iter().collect::<Vec<_>>(), axis);
        checks.extend(compare(device, rng, (&format!("cat axis {axis}"), EXACT), &inputs, op)?);
    }
    Ok(checks)
}

/// The convolutions `image_checks` runs, as (x, weight, stride, padding): `image_checks` says what each
/// reaches.
pub(crate) const CONV_CHECKS: [([usize; 4], [usize; 4], usize, usize); 16] = [
    ([1, 1, 1, 1], [1, 1, 1, 1], 1, 0),
    ([2, 3, 7, 9], [5, 3, 3, 3], 1, 1),
    ([3, 2, 11, 8], [4, 2, 4, 3], 2, 2),
    ([2, 4, 5, 5], [3, 4, 5, 5], 1, 0),
    ([1, 3, 33, 17], [70, 3, 3, 3], 3, 1),
    ([2, 16, 10, 10], [8, 16, 3, 3], 1, 1),
    ([2, 2, 6, 7], [3, 2, 2, 3], 3, 1),
    ([8, 16, 28, 28], [16, 16, 3, 3], 1, 1),
    ([3, 20, 15, 13], [24, 20, 3, 3], 2, 1),
    ([5, 40, 9, 11], [33, 40, 3, 2], 1, 2),
    ([2, 230, 5, 6], [3, 230, 3, 3], 1, 1),
    ([2, 3, 6, 5], [230, 3, 3, 3], 1, 1),
    ([64, 3, 13, 11], [5, 3, 3, 3], 1, 1),
    ([96, 2, 15, 12], [6, 2, 3, 3], 2, 1),
    ([1, 1, 2, 1100], [2, 1, 1, 3], 1, 0),
    ([2, 3, 6, 45], [4, 3, 3, 3], 1, 1),
];

/// `conv2d` (with and without bias; odd sizes, one pixel, stride 2 and 3, padding 1 and 2, a kernel as large as
/// the input and a non-square one, more output channels than a product's tile and more taps than its depth;
/// channels for each of the implicit products' three tiles, a batch whose weight gradient is cut into slices, the
/// last one shorter, and more taps than the products list, C·KH·KW for the forward and O·KH·KW for the input
/// gradient; batches large enough that the direct kernels cut an image into bands of several rows, the last one
/// shorter; a row too wide for them; a row wider than a warp), each with the direct kernels where they fit, on the
/// tensor cores and on the CUDA cores, and with the implicit products alone, and `max_pool2d` (odd sizes,
/// windows that tile the input, overlapping windows, stride past the window, padding; inputs of whole numbers, so windows tie and the first
/// must win as on the host: the host's bits).
fn image_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    for kernels in ConvKernels::ALL {
        device.set_conv_kernels(kernels);
        let path = kernels.name();
        for (x, w, stride, padding) in CONV_CHECKS {
            let parts = [(values(rng, &x, -1.0, 1.0), x.to_vec()), (values(rng, &w, -1.0, 1.0), w.to_vec())];
            let name = format!("conv2d {x:?} * {w:?} stride {stride} padding {padding}, {path}");
            let op: &Op<'_> = &|t| conv2d(&t[0], &t[1], None, stride, padding);
            checks.extend(compare(device, rng, (&name, SUM_TOLERANCE), &parts, op)?);
            let bias = (values(rng, &[w[0]], -1.0, 1.0), vec![w[0]]);
            let parts = [parts[0].clone(), parts[1].clone(), bias];
            let op: &Op<'_> = &|t| conv2d(&t[0], &t[1], Some(&t[2]), stride, padding);
            checks.extend(compare(device, rng, (&format!("{name} + bias"), SUM_TOLERANCE), &parts, op)?);
        }
    }
    device.set_conv_kernels(ConvKernels::TensorCores);
    checks.extend(tf32_conv_checks(device, rng)?);
    let pools: [([usize; 4], usize, usize, usize); 9] = [
        ([1, 1, 1, 1], 1, 1, 0),
        ([2, 3, 7, 9], 2, 2, 0),
        ([2, 3, 8, 6], 2, 2, 0),
        ([3, 2, 9, 12], 3, 3, 0),
        ([2, 3, 7, 9], 3, 2, 1),
        ([1, 2, 13, 11], 3, 1, 1),
        ([3, 1, 8, 8], 4, 3, 2),
        ([2, 2, 9, 9], 5, 2, 2),
        ([1, 1, 5, 6], 3, 3, 1),
    ];
    for (shape, kernel, stride, padding) in pools {
        let name = format!("max_pool2d kernel {kernel} stride {stride} padding {padding}");
        let op: &Op<'_> = &|t| max_pool2d(&t[0], kernel, stride, padding);
        let inputs = [(values(rng, &shape, -3.0, 3.0), shape.to_vec())];
        checks.extend(compare(device, rng, (&name, EXACT), &inputs, op)?);
        let whole: Vec<f32> = values(rng, &shape, -2.0, 2.0).into_iter().map(f32::round).collect();
        checks.extend(compare(device, rng, (&format!("{name} ties"), EXACT), &[(whole, shape.to_vec())], op)?);
    }
    Ok(checks)
}

/// `conv2d` at `Precision::Tf32` (with and without bias), on the [`CONV_CHECKS`] whose forward, input
/// gradient and weight gradient all take the tensor-core kernels: their one TF32 product against the twin on
/// operands and an output gradient truncated to TF32 (the bias's values TF32 already, as the kernels add
/// it in fp32), so to the fp32 sums' tolerance; at least four such shapes.
fn tf32_conv_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    use crate::ops::{conv::Conv2dShape, gemm::truncate_tf32};
    device.set_precision(Precision::Tf32)?;
    let _reset = Fp32Again(device);
    let (mut checks, mut shapes) = (Vec::new(), 0);
    for (x, w, stride, padding) in CONV_CHECKS {
        let conv = Conv2dShape::new((x[1], x[2], x[3]), w[0], (w[2], w[3]), stride, padding)
            .ok_or_else(|| anyhow::anyhow!("CONV_CHECKS holds a convolution of no output: {x:?} * {w:?}"))?;
        if !super::cuda::direct_conv::all_on_tensor_cores(device, &conv, x[0], false)? {
            continue;
        }
        shapes += 1;
        let parts = [(values(rng, &x, -1.0, 1.0), x.to_vec()), (values(rng, &w, -1.0, 1.0), w.to_vec())];
        let name = format!("conv2d tf32 {x:?} * {w:?} stride {stride} padding {padding}");
        let op: &Op<'_> = &|t| conv2d(&t[0], &t[1], None, stride, padding);
        checks.extend(compare_rounded(device, rng, (&name, SUM_TOLERANCE), &parts, op, truncate_tf32)?);
        if !super::cuda::direct_conv::all_on_tensor_cores(device, &conv, x[0], true)? {
            continue;
        }
        let bias: Vec<f32> = values(rng, &[w[0]], -1.0, 1.0).into_iter().map(truncate_tf32).collect();
        let parts = [parts[0].clone(), parts[1].clone(), (bias, vec![w[0]])];
        let op: &Op<'_> = &|t| conv2d(&t[0], &t[1], Some(&t[2]), stride, padding);
        let name = format!("{name} + bias");
        checks.extend(compare_rounded(device, rng, (&name, SUM_TOLERANCE), &parts, op, truncate_tf32)?);
    }
    anyhow::ensure!(shapes >= 4, "conv2d tf32: only {shapes} of the convolutions checked take the tensor cores");
    Ok(checks)
}

/// The losses of `steps` SGD steps of a 20-33-7 MLP (tanh) on fixed data, and the parameters after them,
/// on the host or on `device`.
fn train_mlp(device: Option<&Arc<Device>>, seed: u64, steps: usize) -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
    use rand::SeedableRng;
    let mut rng = SeededRng::seed_from_u64(seed);
    let (first, second) = (Linear::<f32>::new(20, 33, true, &mut rng)?, Linear::<f32>::new(33, 7, true, &mut rng)?);
    let x = Tensor::from_vec(values(&mut rng, &[24, 20], -1.0, 1.0), &[24, 20])?;
    let mut targets: Vec<i64> = (0..24).map(|_| rng.random_range(0..7)).collect();
    targets[3] = -1;
    let x = match device {
        Some(device) => {
            for p in first.parameters().iter().chain(&second.parameters()) {
                p.move_to_device(device)?;
            }
            x.to_device(device)?
        }
        None => x,
    };
    let parameters: Vec<Tensor> = first.parameters().into_iter().chain(second.parameters()).collect();
    let mut sgd = Optimizer::sgd(parameters.clone(), 0.1)?;
    let mut losses = Vec::new();
    for _ in 0..steps {
        sgd.zero_grad();
        let loss = second.forward(&first.forward(&x)?.tanh()?)?.cross_entropy(&targets, Some(-1))?;
        loss.backward()?;
        sgd.step()?;
        losses.push(loss.item()?);
    }
    let mut flat = Vec::new();
    for p in &parameters {
        flat.extend(p.values()?);
    }
    Ok((losses, flat))
}

/// A run of steps' losses and its parameters' final values, flattened in order.
type StepsResult = (Vec<f32>, Vec<f32>);

/// `steps_result` of a run through `step` (`captured`) or op by op, and the fusions the capture made.
fn fused_steps_result(
    step: &super::CapturedStep,
    captured: bool,
    losses: Vec<f32>,
    parameters: &[Tensor],
) -> anyhow::Result<(StepsResult, Vec<(String, usize)>)> {
    Ok((steps_result(captured.then_some(step), losses, parameters)?, step.fusions().to_vec()))
}

/// A run of steps' losses and its parameters' final values, flattened in order; an error when a captured
/// run was not captured after all.
fn steps_result(
    step: Option<&super::CapturedStep>,
    losses: Vec<f32>,
    parameters: &[Tensor],
) -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
    if step.is_some_and(|s| !s.is_captured()) {
        anyhow::bail!("the step was not captured");
    }
    let mut flat = Vec::new();
    for p in parameters {
        flat.extend(p.values()?);
    }
    Ok((losses, flat))
}

/// The losses and final parameters of 12 Adam steps of a 20-33-7 MLP (tanh) on `device`, a new batch
/// (refilled in place) and a new rate (cosine) each step, op by op or through a `CapturedStep`.
fn adam_steps(device: &Arc<Device>, seed: u64, captured: bool) -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
    use super::{CapturedStep, Scheduler};
    use rand::SeedableRng;
    const STEPS: usize = 12;
    let mut rng = SeededRng::seed_from_u64(seed);
    let (first, second) = (Linear::<f32>::new(20, 33, true, &mut rng)?, Linear::<f32>::new(33, 7, true, &mut rng)?);
    let parameters: Vec<Tensor> = first.parameters().into_iter().chain(second.parameters()).collect();
    for p in &parameters {
        p.move_to_device(device)?;
    }
    let batches: Vec<(Vec<f32>, Vec<f32>)> = (0..STEPS)
        .map(|_| (values(&mut rng, &[24, 20], -1.0, 1.0), (0..24).map(|_| rng.random_range(0..7) as f32).collect()))
        .collect();
    let x = Tensor::from_vec(batches[0].0.clone(), &[24, 20])?.to_device(device)?;
    let targets = Tensor::from_vec(batches[0].1.clone(), &[24])?.to_device(device)?;
    let mut adam = Optimizer::adam(parameters.clone(), 3e-3)?;
    let schedule = Scheduler::cosine(3e-3, 3, 1e-4, STEPS)?;
    let mut step = CapturedStep::new(device, &[&x, &targets])?;
    let mut losses = Vec::new();
    for (k, (inputs, ids)) in batches.iter().enumerate() {
        x.copy_from_slice(inputs)?;
        targets.copy_from_slice(ids)?;
        schedule.apply(&mut adam, k)?;
        let mut one_step = || {
            adam.zero_grad();
            let loss = second.forward(&first.forward(&x)?.tanh()?)?.cross_entropy_ids(&targets, None)?;
            loss.backward()?;
            adam.step()?;
            Ok(loss)
        };
        let loss = if captured { step.run(one_step)? } else { one_step()? };
        losses.push(loss.item()?);
    }
    steps_result(captured.then_some(&step), losses, &parameters)
}

/// How a run of steps goes: op by op, through a `CapturedStep` whose inputs are refilled in place, or
/// through one handed each step's own tensors (`run_with`), all alive at once so that each has its own
/// address, whose replays must read them in place.
#[derive(Clone, Copy, PartialEq)]
enum StepRun {
    Eager,
    Refilled,
    Handed,
}

/// The losses and final parameters of 12 AdamW steps of a next-token model on `device` — embedding of
/// ids in a device tensor, dropout (the layer's device counter), a linear head, cross-entropy, the
/// gradients clipped on the device — a new batch each step, run as `run` says.
fn token_steps(device: &Arc<Device>, seed: u64, run: StepRun) -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
    use super::CapturedStep;
    use rand::SeedableRng;
    const STEPS: usize = 12;
    let (vocab, width, count) = (13, 24, 40);
    let mut rng = SeededRng::seed_from_u64(seed);
    let table = Embedding::<f32>::new(vocab, width, None, &mut rng)?;
    let head = Linear::<f32>::new(width, vocab, true, &mut rng)?;
    let drop = Dropout::new(0.2, seed as u32)?;
    let parameters: Vec<Tensor> = table.parameters().into_iter().chain(head.parameters()).collect();
    for p in &parameters {
        p.move_to_device(device)?;
    }
    let draw = |rng: &mut SeededRng| (0..count).map(|_| rng.random_range(0..vocab) as f32).collect::<Vec<f32>>();
    let batches: Vec<(Vec<f32>, Vec<f32>)> = (0..STEPS).map(|_| (draw(&mut rng), draw(&mut rng))).collect();
    let ids = Tensor::from_vec(batches[0].0.clone(), &[count])?.to_device(device)?;
    let targets = Tensor::from_vec(batches[0].1.clone(), &[count])?.to_device(device)?;
    let handed: Vec<(Tensor, Tensor)> = if run == StepRun::Handed {
        let to_device = |v: &Vec<f32>| Tensor::from_vec(v.clone(), &[count])?.to_device(device);
        batches.iter().map(|(i, t)| Ok((to_device(i)?, to_device(t)?))).collect::<super::Result<_>>()?
    } else {
        Vec::new()
    };
    let mut adamw = Optimizer::adamw(parameters.clone(), 1e-2, 0.1)?;
    let mut step = CapturedStep::new(device, &[&ids, &targets])?;
    let mut losses = Vec::new();
    for (k, (inputs, next)) in batches.iter().enumerate() {
        if run != StepRun::Handed {
            ids.copy_from_slice(inputs)?;
            targets.copy_from_slice(next)?;
        }
        let mut one_step = || {
            adamw.zero_grad();
            let loss = head.forward(&drop.forward(&table.forward(&ids)?)?)?.cross_entropy_ids(&targets, None)?;
            loss.backward()?;
            clip_grad_norm(&parameters, 0.5)?;
            adamw.step()?;
            Ok(loss)
        };
        let loss = match run {
            StepRun::Eager => one_step()?,
            StepRun::Refilled => step.run(one_step)?,
            StepRun::Handed => step.run_with(&[&handed[k].0, &handed[k].1], one_step)?,
        };
        losses.push(loss.item()?);
    }
    if run == StepRun::Handed && step.rebound_kernels().unwrap_or(0) == 0 {
        anyhow::bail!("the replays did not read the tensors handed to them where they are");
    }
    steps_result((run != StepRun::Eager).then_some(&step), losses, &parameters)
}

/// The losses, final parameters and fusions of 8 AdamW steps of a residual block on `device` in
/// `precision` — x = embedding(ids); x = x + dropout(fc2(gelu(fc1(ln1(x))))); x = x + relu(proj(ln2(x)));
/// logits = head(ln_f(x)) — a new batch each step, op by op or through a `CapturedStep`, whose capture
/// fuses the activations and the dropout into the products, the residual adds into the LayerNorms, (fp32)
/// the loss into head's product, with head's dx, and (bf16) the operands' copies into their producers.
fn block_steps(
    device: &Arc<Device>,
    seed: u64,
    precision: Precision,
    captured: bool,
) -> anyhow::Result<(StepsResult, Vec<(String, usize)>)> {
    use super::{CapturedStep, LayerNorm};
    use rand::SeedableRng;
    const STEPS: usize = 8;
    let (vocab, width, hidden, count) = (11, 40, 72, 36);
    let mut rng = SeededRng::seed_from_u64(seed);
    let table = Embedding::<f32>::new(vocab, width, None, &mut rng)?;
    let (fc1, fc2) =
        (Linear::<f32>::new(width, hidden, true, &mut rng)?, Linear::<f32>::new(hidden, width, true, &mut rng)?);
    let proj = Linear::<f32>::new(width, width, false, &mut rng)?;
    let head = Linear::<f32>::new(width, vocab, true, &mut rng)?;
    let drop = Dropout::new(0.25, 9)?;
    let norms = [
        LayerNorm::<f32>::new(width, true)?,
        LayerNorm::<f32>::new(width, true)?,
        LayerNorm::<f32>::new(width, false)?,
    ];
    let mut parameters: Vec<Tensor> = table.parameters();
    for layer in [&fc1, &fc2, &proj, &head] {
        parameters.extend(layer.parameters());
    }
    for norm in &norms {
        parameters.extend(norm.parameters());
    }
    for p in &parameters {
        p.move_to_device(device)?;
    }
    device.set_precision(precision)?;
    let draw = |rng: &mut SeededRng| (0..count).map(|_| rng.random_range(0..vocab) as f32).collect::<Vec<f32>>();
    let batches: Vec<(Vec<f32>, Vec<f32>)> = (0..STEPS).map(|_| (draw(&mut rng), draw(&mut rng))).collect();
    let ids = Tensor::from_vec(batches[0].0.clone(), &[count])?.to_device(device)?;
    let targets = Tensor::from_vec(batches[0].1.clone(), &[count])?.to_device(device)?;
    let mut adamw = Optimizer::adamw(parameters.clone(), 3e-3, 0.1)?;
    let mut step = CapturedStep::new(device, &[&ids, &targets])?;
    let mut losses = Vec::new();
    let mut run = || -> anyhow::Result<()> {
        for (inputs, next) in &batches {
            ids.copy_from_slice(inputs)?;
            targets.copy_from_slice(next)?;
            let mut one_step = || {
                adamw.zero_grad();
                let x = table.forward(&ids)?;
                let x = x.add(&drop.forward(&fc2.forward(&fc1.forward(&norms[0].forward(&x)?)?.gelu()?)?)?)?;
                let x = x.add(&proj.forward(&norms[1].forward(&x)?)?.relu()?)?;
                let loss = head.forward(&norms[2].forward(&x)?)?.cross_entropy_ids(&targets, None)?;
                loss.backward()?;
                adamw.step()?;
                Ok(loss)
            };
            let loss = if captured { step.run(one_step)? } else { one_step()? };
            losses.push(loss.item()?);
        }
        Ok(())
    };
    let ran = run();
    device.set_precision(Precision::Fp32)?;
    ran?;
    fused_steps_result(&step, captured, losses, &parameters)
}

/// A captured residual block equals the same steps op by op to the bit, in fp32 and in bf16, and its
/// capture fused what `fusion` says it fuses (a check that fused nothing would prove nothing). In the fp32
/// capture the head's weight gradient, deferred (its dx came with the loss), goes on the backward's second
/// stream when ln_f's backward launches (cuda::weight_grads): the capture forked, and equals one stream's
/// to the bit. (Op by op nothing is deferred there: the head's backward is one launch of dx, dW and db.)
fn fusion_checks(device: &Arc<Device>, seed: u64) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    // gelu and relu into fc1's and proj's epilogues, the dropout into fc2's, both residual adds into the
    // norms after them, the gelu's slope into fc2's backward; in fp32 the cross-entropy into head's
    // blocks, and head's dx too; in bf16 the four products' operands (ln1's, the gelu's from fc1's epilogue,
    // ln2's and ln_f's).
    for (precision, expected) in [(Precision::Fp32, 8), (Precision::Bf16, 10)] {
        let (eager, _) = block_steps(device, seed, precision, false)?;
        let forks = device.branches();
        let captured = block_steps(device, seed, precision, true);
        let forks = device.branches() - forks;
        device.set_branch(false)?;
        let one_stream = block_steps(device, seed, precision, true);
        device.set_branch(true)?;
        let ((captured, fusions), (one_stream, _)) = (captured?, one_stream?);
        let beside = precision != Precision::Fp32 || forks > 0;
        let same = steps_bits(&eager) == steps_bits(&captured) && steps_bits(&eager) == steps_bits(&one_stream);
        let made: usize = fusions.iter().map(|(_, n)| n).sum();
        let listed: Vec<String> = fusions.iter().map(|(what, n)| format!("{what} ×{n}")).collect();
        let shape = format!(
            "residual block, 8 AdamW steps, {}, fused: {}; weight gradients beside: {forks} forks, = one stream",
            precision.name(),
            listed.join("; ")
        );
        let right = same && beside && made == expected;
        checks.push(Check::holds("nn fused capture = op by op", shape, right));
    }
    Ok(checks)
}

/// The losses and final parameters of 4 SGD steps of a linear layer read by a cross-entropy (`bias`;
/// `ignore`: an id some rows take, to be ignored; `halved`: the backward from half the loss, so that the
/// gradient reaching the loss is not its own seed), after a first layer and its activation when `hidden`
/// gives them, a new batch each step, op by op or through a `CapturedStep`, whose capture fuses the loss
/// into the last layer's blocks (and, after an activation, that layer's dx too); and the capture's fusions.
fn linear_loss_steps(
    device: &Arc<Device>,
    rng: &mut SeededRng,
    (rows, inputs, classes): (usize, usize, usize),
    (bias, ignore, halves, halved): (bool, Option<i64>, bool, bool),
    hidden: Option<(usize, Activation)>,
    captured: bool,
) -> anyhow::Result<(StepsResult, Vec<(String, usize)>)> {
    use super::CapturedStep;
    const STEPS: usize = 4;
    // `halves`: the logits seen as twice the rows of half the classes before the loss.
    let (loss_rows, loss_classes) = if halves { (2 * rows, classes / 2) } else { (rows, classes) };
    let first = match hidden {
        Some((width, activation)) => Some((Linear::<f32>::new(inputs, width, bias, rng)?, activation)),
        None => None,
    };
    let last_inputs = hidden.map_or(inputs, |(width, _)| width);
    let layer = Linear::<f32>::new(last_inputs, classes, bias, rng)?;
    let mut parameters = first.as_ref().map(|(l, _)| l.parameters()).unwrap_or_default();
    parameters.extend(layer.parameters());
    for p in &parameters {
        p.move_to_device(device)?;
    }
    let batches: Vec<(Vec<f32>, Vec<f32>)> = (0..STEPS)
        .map(|_| {
            let ids = (0..loss_rows).map(|_| rng.random_range(0..loss_classes) as f32).collect();
            (values(rng, &[rows, inputs], -1.0, 1.0), ids)
        })
        .collect();
    let x = Tensor::from_vec(batches[0].0.clone(), &[rows, inputs])?.to_device(device)?;
    let targets = Tensor::from_vec(batches[0].1.clone(), &[loss_rows])?.to_device(device)?;
    let mut sgd = Optimizer::sgd(parameters.clone(), 0.5)?;
    let mut step = CapturedStep::new(device, &[&x, &targets])?;
    let mut losses = Vec::new();
    for (inputs, ids) in &batches {
        x.copy_from_slice(inputs)?;
        targets.copy_from_slice(ids)?;
        let mut one_step = || {
            sgd.zero_grad();
            let h = match &first {
                Some((first, activation)) => activation(&first.forward(&x)?)?,
                None => x.clone(),
            };
            let logits = layer.forward(&h)?.reshape(&[loss_rows, loss_classes])?;
            let loss = logits.cross_entropy_ids(&targets, ignore)?;
            if halved { loss.mul_scalar(0.5)?.backward() } else { loss.backward() }?;
            sgd.step()?;
            Ok(loss)
        };
        let loss = if captured { step.run(one_step)? } else { one_step()? };
        losses.push(loss.item()?);
    }
    fused_steps_result(&step, captured, losses, &parameters)
}

/// A linear layer and the cross-entropy of its output, fused in a capture (`nn_linear_cross_entropy`),
/// equal the two launches to the bit, over random sizes whose rows span several tiles and blocks, with and
/// without a bias and rows to ignore (which the fused kernel counts itself), and from half the loss; and
/// the capture fused them (an equality that fused nothing would prove nothing). Logits seen in another
/// shape before the loss are not fused, and equal too.
///
/// After a first layer and an activation, the loss kernel also forms the last layer's dx (times the
/// activation's slope) in the tile nn_linear_grad would take, and the two layers' weight gradients go as
/// one launch (`nn_linear_grad_weights`): equal to the bit too, sized to reach each of the three tiles, and
/// both fusions made, with rows to ignore or not, where the loss's gradient reaches the layer as it is, and
/// with layers whose inputs fill whole tiles, so that the bias's column is a tile of its own; and after a
/// first layer with no activation, dx without a slope.
fn loss_fusion_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    use rand::SeedableRng;
    let mut checks = Vec::new();
    for (bias, ignoring, halves, halved) in [
        (true, false, false, false),
        (false, true, false, false),
        (true, true, false, false),
        (true, true, true, false),
        (true, true, false, true),
    ] {
        let classes = if halves { 2 * rng.random_range(1..33) } else { rng.random_range(2..65) };
        // Inputs past 256, the tiny tile's chunk of k, as well as fewer.
        let sizes = (rng.random_range(1..300), rng.random_range(1..600), classes);
        let ignore = ignoring.then(|| rng.random_range(0..if halves { classes / 2 } else { classes }) as i64);
        let seed = rng.random();
        let form = (bias, ignore, halves, halved);
        let run =
            |captured| linear_loss_steps(device, &mut SeededRng::seed_from_u64(seed), sizes, form, None, captured);
        let ((eager, _), (captured, fusions)) = (run(false)?, run(true)?);
        let fused = fusions.iter().any(|(what, _)| what.starts_with("linear → cross_entropy"));
        let right = fused != halves && steps_bits(&eager) == steps_bits(&captured);
        let (rows, inputs, classes) = sizes;
        let seen = if halves { format!(", seen as {}×{}", 2 * rows, classes / 2) } else { String::new() };
        let from = if halved { ", from half the loss" } else { "" };
        let shape = format!("{rows}×{inputs} → {classes}{seen}, bias {bias}, ignore {ignore:?}, 4 SGD steps{from}");
        checks.push(Check::holds("nn fused linear + cross_entropy", shape, right));
    }
    let activations: [(&str, Activation); 6] = [
        ("relu", Tensor::relu),
        ("tanh", Tensor::tanh),
        ("gelu", Tensor::gelu),
        ("sigmoid", Tensor::sigmoid),
        ("relu", Tensor::relu),
        ("no activation", |t| Ok(t.clone())),
    ];
    // (rows, width) ranges that make nn_linear_grad take its tiny, small and large tile on 132 SMs.
    let tiles = [
        (1..120, 1..120),
        (200..400, 150..300),
        (1500..2500, 500..700),
        (1..120, 1..120),
        (1..120, 1..120),
        (100..300, 300..700),
    ];
    for (i, ((name, activation), (rows, width))) in activations.into_iter().zip(tiles).enumerate() {
        // The last case has one class, so that every row is ignored: a NaN loss and zero gradients, as
        // PyTorch's, either way.
        let (bias, ignore) = (i != 1, (i >= 3).then_some(0));
        let classes = if i == 4 { 1 } else { rng.random_range(2..65) };
        let mut sizes = (rng.random_range(rows), rng.random_range(1..90), classes);
        let mut width = rng.random_range(width);
        if i == 3 {
            // Both layers 64 inputs wide, a multiple of every tile's columns: the bias's column then starts
            // a tile of its own in each job of the grouped weight gradients.
            (sizes.1, width) = (64, 64);
        }
        let seed = rng.random();
        let hidden = Some((width, activation));
        let form = (bias, ignore, false, false);
        let run =
            |captured| linear_loss_steps(device, &mut SeededRng::seed_from_u64(seed), sizes, form, hidden, captured);
        let ((eager, _), (captured, fusions)) = (run(false)?, run(true)?);
        let made = |prefix: &str| fusions.iter().any(|(what, _)| what.starts_with(prefix));
        let (dx, together) = (made("linear ← cross_entropy"), made("linear ← linear"));
        // Every row ignored: the parameters must come through finite (zero gradients), as PyTorch's.
        let finite = i != 4 || eager.1.iter().all(|v| v.is_finite());
        let right = dx && together && finite && steps_bits(&eager) == steps_bits(&captured);
        let (rows, inputs, classes) = sizes;
        let shape = format!(
            "{rows}×{inputs} → {width}, {name}, → {classes}, bias {bias}, ignore {ignore:?}, 4 SGD steps (dx fused: \
             {dx}, weight gradients together: {together})"
        );
        checks.push(Check::holds("nn fused linear + cross_entropy", shape, right));
    }
    Ok(checks)
}

/// The backward's fusion (cuda::backward_fusion): an activation between two linear layers, its slope taken in the
/// second layer's dx epilogue, gives the same bits as its own backward's launch (the fusion off), for each
/// activation; and it was taken (an equality that fused nothing would prove nothing). Also a second reader
/// of the activation (no fusion then: two gradients to add) against the host.
fn backward_fusion_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    let activations: [(&str, Activation); 4] =
        [("relu", Tensor::relu), ("sigmoid", Tensor::sigmoid), ("tanh", Tensor::tanh), ("gelu", Tensor::gelu)];
    // A hidden width of 13 takes the bf16 slope epilogue's one-at-a-time path, 20 (over 130 rows, two
    // tiles' rows) its four-at-a-time one.
    for (rows, hidden) in [(9, 13), (130, 20)] {
        let inputs = [
            (values(rng, &[rows, 17], -1.0, 1.0), vec![rows, 17]),
            (values(rng, &[hidden, 17], -1.0, 1.0), vec![hidden, 17]),
            (values(rng, &[hidden], -1.0, 1.0), vec![hidden]),
            (values(rng, &[5, hidden], -1.0, 1.0), vec![5, hidden]),
        ];
        let seed = values(rng, &[rows, 5], -1.0, 1.0);
        for ((name, activation), precision) in
            activations.iter().flat_map(|a| [(a, Precision::Fp32), (a, Precision::Bf16)])
        {
            let _fp32_again = if precision == Precision::Bf16 { Some(bf16_products(device)?) } else { None };
            let grads = || -> anyhow::Result<Vec<u32>> {
                let t: Vec<Tensor> = (inputs.iter())
                    .map(|(v, s)| Tensor::parameter(v.clone(), s)?.to_device(device))
                    .collect::<Result<_>>()?;
                let out = linear(&activation(&linear(&t[0], &t[1], Some(&t[2]))?)?, &t[3], None)?;
                out.backward_with(Some(&Tensor::from_vec(seed.clone(), &[rows, 5])?.to_device(device)?), false)?;
                let mut bits = Vec::new();
                for p in &t {
                    bits.extend(
                        p.grad().ok_or_else(|| anyhow::anyhow!("no gradient"))?.values()?.iter().map(|v| v.to_bits()),
                    );
                }
                Ok(bits)
            };
            let (same, taken) = fused_against_unfused(device, grads)?;
            let right = same && taken == 1;
            checks.push(Check::holds(
                "nn backward fusion = unfused",
                format!(
                    "{rows} rows, linear 17→{hidden}, {name}, linear {hidden}→5, {} (slopes taken: {taken})",
                    precision.name()
                ),
                right,
            ));
        }
    }
    // The activation read twice (by the layer and by the sum): its gradient is the sum of two.
    let inputs = [
        (values(rng, &[9, 17], -1.0, 1.0), vec![9, 17]),
        (values(rng, &[13, 17], -1.0, 1.0), vec![13, 17]),
        (values(rng, &[13], -1.0, 1.0), vec![13]),
        (values(rng, &[5, 13], -1.0, 1.0), vec![5, 13]),
    ];
    let twice: &Op<'_> = &|t| {
        let h = linear(&t[0], &t[1], Some(&t[2]))?.relu()?;
        linear(&h, &t[3], None)?.sum_all()?.add(&h.sum_all()?)
    };
    checks.extend(compare(device, rng, ("linear → relu read twice", SUM_TOLERANCE), &inputs, twice)?);
    checks.extend(pool_slope_checks(device, rng)?);
    Ok(checks)
}

/// `grads` (a backward's gradients, as bits) with the backward's fusion off, then on (and left on): whether
/// the two are the same bits, and how many activation slopes the fused run took.
fn fused_against_unfused(
    device: &Device,
    grads: impl Fn() -> anyhow::Result<Vec<u32>>,
) -> anyhow::Result<(bool, usize)> {
    device.set_backward_fusion(false);
    let unfused = grads();
    device.set_backward_fusion(true);
    let before = device.slopes_taken();
    let fused = grads();
    let taken = device.slopes_taken() - before;
    Ok((unfused? == fused?, taken))
}

/// A max pool's backward that takes the slope of the ReLU before it (`nn_max_pool_grad`'s `relu_out`)
/// equals the ReLU's own backward launch to the bit, where the windows tile the input and where they overlap
/// and pass its edges; and the slope was taken (an equality that fused nothing would prove nothing). Most
/// inputs are negative, so that whole windows are too and their winners' slopes 0.
fn pool_slope_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let mut checks = Vec::new();
    for (image, (kernel, stride, padding)) in [([2, 3, 8, 10], (2, 2, 0)), ([2, 3, 9, 11], (3, 2, 1))] {
        let pooled = |size: usize| (size + 2 * padding - kernel) / stride + 1;
        let out_shape = [image[0], image[1], pooled(image[2]), pooled(image[3])];
        let (x, seed) = (values(rng, &image, -1.0, 0.3), values(rng, &out_shape, -1.0, 1.0));
        let grads = || -> anyhow::Result<Vec<u32>> {
            let t = Tensor::parameter(x.clone(), &image)?.to_device(device)?;
            let out = max_pool2d(&t.relu()?, kernel, stride, padding)?;
            out.backward_with(Some(&Tensor::from_vec(seed.clone(), &out_shape)?.to_device(device)?), false)?;
            let grad = t.grad().ok_or_else(|| anyhow::anyhow!("no gradient"))?.values()?;
            Ok(grad.iter().map(|v| v.to_bits()).collect())
        };
        let (same, taken) = fused_against_unfused(device, grads)?;
        let right = same && taken == 1;
        checks.push(Check::holds(
            "nn backward fusion = unfused",
            format!(
                "{image:?} relu, max_pool2d {kernel}×{kernel} stride {stride} padding {padding} (slopes taken: {taken})"
            ),
            right,
        ));
    }
    Ok(checks)
}

/// A run's losses and parameters as bits, for comparing two runs to the bit.
fn steps_bits((losses, parameters): &StepsResult) -> Vec<u32> {
    losses.iter().chain(parameters).map(|v| v.to_bits()).collect()
}

/// The SGD steps of `conv_steps`.
const CONV_STEPS: usize = 4;

/// The losses and final parameters of [`CONV_STEPS`] SGD steps of two convolutions with an activation after each (x
/// `[3, 2, 9, 11]` → 4 channels, `first` → 5 channels, `second` → sum), op by op or through a
/// `CapturedStep`, whose capture puts both activations in their convolutions' stores; and its fusions.
fn conv_steps(
    device: &Arc<Device>,
    seed: u64,
    (first, second): (Activation, Activation),
    captured: bool,
) -> anyhow::Result<(StepsResult, Vec<(String, usize)>)> {
    conv_block_steps(device, seed, (first, second), captured, (Residual::None, CONV_IMAGE, 4))
}

/// The images of [`conv_steps`]: rows of 11 positions, so that a band's results leave the tensor-core kernel
/// one at a time.
const CONV_IMAGE: [usize; 4] = [3, 2, 9, 11];

/// What the second convolution's output of [`conv_block_steps`] is added to before its activation.
#[derive(Clone, Copy, PartialEq)]
enum Residual {
    None,
    /// Its own input, the first activation's output (`width` → `width` channels: `h + conv(h)`, as a ResNet block).
    Hidden,
    /// The step's input (`width` → 2 channels: `x + conv(h)`).
    Input,
}

/// `conv_steps` on images of shape `image` with `width` channels between the convolutions, or a residual
/// block whose second convolution's output is added to `residual` before `second`.
fn conv_block_steps(
    device: &Arc<Device>,
    seed: u64,
    (first, second): (Activation, Activation),
    captured: bool,
    (residual, image, width): (Residual, [usize; 4], usize),
) -> anyhow::Result<(StepsResult, Vec<(String, usize)>)> {
    use super::CapturedStep;
    use rand::SeedableRng;
    let mut rng = SeededRng::seed_from_u64(seed);
    let outputs = match residual {
        Residual::None => 5,
        Residual::Hidden => width,
        Residual::Input => 2,
    };
    let shapes: [&[usize]; 4] = [&[width, 2, 3, 3], &[width], &[outputs, width, 3, 3], &[outputs]];
    let parameters: Vec<Tensor> = (shapes.iter())
        .map(|s| Tensor::parameter(values(&mut rng, s, -0.5, 0.5), s)?.to_device(device))
        .collect::<Result<_>>()?;
    let batches: Vec<Vec<f32>> = (0..CONV_STEPS).map(|_| values(&mut rng, &image, -1.0, 1.0)).collect();
    let x = Tensor::from_vec(batches[0].clone(), &image)?.to_device(device)?;
    let mut sgd = Optimizer::sgd(parameters.clone(), 0.1)?;
    let mut step = CapturedStep::new(device, &[&x])?;
    let mut losses = Vec::new();
    for batch in &batches {
        x.copy_from_slice(batch)?;
        let mut one_step = || {
            sgd.zero_grad();
            let p = &parameters;
            let h = first(&conv2d(&x, &p[0], Some(&p[1]), 1, 1)?)?;
            let y = conv2d(&h, &p[2], Some(&p[3]), 1, 1)?;
            let summed = match residual {
                Residual::None => y,
                Residual::Hidden => h.add(&y)?,
                Residual::Input => x.add(&y)?,
            };
            // A residual sum is read by the loss too, so that its values count, not only its ReLU's; and
            // its loss is a mean, so that the first step does not drive every sum below 0 (where the ReLU of
            // the convolution's result alone would give the same bits as the ReLU of the sum).
            let loss = match residual {
                Residual::None => second(&summed)?.sum_all()?,
                _ => second(&summed)?.mean_all()?.add(&summed.mean_all()?)?,
            };
            loss.backward()?;
            sgd.step()?;
            Ok(loss)
        };
        let loss = if captured { step.run(one_step)? } else { one_step()? };
        losses.push(loss.item()?);
    }
    fused_steps_result(&step, captured, losses, &parameters)
}

/// A direct convolution's fusions (cuda::fusion) equal the launches they replace to the bit, on the tensor
/// cores and on the CUDA cores, with a ReLU in either place or neither: captured, each ReLU in its
/// convolution's stores (`conv2d → relu`) against the same steps op by op; and, op by op, the first ReLU's
/// slope in the second convolution's input gradient (taken each step) against the fusion off, and the
/// weight gradients on the backward's second stream (cuda::branch) against one stream; then
/// [`add_relu_checks`]. Each fusion
/// was made where a ReLU is (an equality that fused nothing would prove nothing), and none for the other
/// activations or with the implicit products.
fn conv_fusion_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let [relu, tanh, sigmoid, gelu]: [(&str, Activation); 4] =
        [("relu", Tensor::relu), ("tanh", Tensor::tanh), ("sigmoid", Tensor::sigmoid), ("gelu", Tensor::gelu)];
    let mut checks = Vec::new();
    for kernels in ConvKernels::ALL {
        device.set_conv_kernels(kernels);
        for ((first_name, first), (second_name, second)) in
            [(relu, relu), (relu, tanh), (sigmoid, relu), (gelu, sigmoid)]
        {
            let seed = rng.random();
            let run = |captured| conv_steps(device, seed, (first, second), captured);
            let before = (device.slopes_taken(), device.branches());
            let eager = run(false);
            let (slopes, forks) = (device.slopes_taken() - before.0, device.branches() - before.1);
            device.set_backward_fusion(false);
            let unfused = run(false);
            device.set_backward_fusion(true);
            device.set_branch(false)?;
            let one_stream = run(false);
            device.set_branch(true)?;
            let ((eager, _), (unfused, _), (one_stream, _)) = (eager?, unfused?, one_stream?);
            let (captured, fusions) = run(true)?;
            let made = |prefix: &str| fusions.iter().filter(|(what, _)| what.starts_with(prefix)).map(|(_, n)| n).sum();
            let (forward, backward): (usize, usize) = (made("conv2d → relu"), made("conv2d ← "));
            let (relus, sloped) = if kernels == ConvKernels::Implicit {
                (0, false)
            } else {
                ([first_name, second_name].iter().filter(|n| **n == "relu").count(), first_name == "relu")
            };
            // Each step forks the second stream for both weight gradients (branch.rs).
            let right = (forward, backward, slopes) == (relus, sloped as usize, CONV_STEPS * sloped as usize)
                && forks == 2 * CONV_STEPS
                && steps_bits(&eager) == steps_bits(&captured)
                && steps_bits(&eager) == steps_bits(&unfused)
                && steps_bits(&eager) == steps_bits(&one_stream);
            checks.push(Check::holds(
                "nn fused conv2d = op by op",
                format!(
                    "[3, 2, 9, 11] conv 3×3 → 4, {first_name}, conv 3×3 → 5, {second_name}, 4 SGD steps, {} (fused: \
                     {forward} in the stores, {backward} slope; weight gradients beside: {forks}, = one stream)",
                    kernels.name()
                ),
                right,
            ));
        }
    }
    device.set_conv_kernels(ConvKernels::TensorCores);
    checks.extend(add_relu_checks(device, rng)?);
    Ok(checks)
}

/// A residual block's sum and the ReLU after it, captured against op by op, to the bit, the fusion made
/// once a step: added to the block's input, an activation's output, in the second convolution's stores
/// (`conv2d → add → relu`), on the tensor cores and on the CUDA cores; added to the step's input, which no
/// op of the step made, in one launch of their own (`add → relu`). In the backward of the first, the block
/// input's two gradients (the skip's and the convolution's) added and times the ReLU's slope in the
/// convolution's input gradient, each step, against the backward's fusion off, to the bit.
fn add_relu_checks(device: &Arc<Device>, rng: &mut SeededRng) -> anyhow::Result<Vec<Check>> {
    let cases = [
        (Residual::Hidden, ConvKernels::TensorCores, "conv2d → add → relu", "h + conv 3×3 (h)"),
        (Residual::Hidden, ConvKernels::Fma, "conv2d → add → relu", "h + conv 3×3 (h)"),
        (Residual::Input, ConvKernels::TensorCores, "add → relu", "x + conv 3×3 → 2 (h)"),
    ];
    let mut checks = Vec::new();
    // Rows of 11 positions, and rows of 12 with 16 channels between the convolutions: a band's results leave
    // the tensor-core kernel one at a time, and four at a time with their operands loaded for several channels.
    for ((residual, kernels, fusion, block), (image, width)) in
        cases.into_iter().flat_map(|c| [(c, (CONV_IMAGE, 4)), (c, ([2, 2, 8, 12], 16))])
    {
        device.set_conv_kernels(kernels);
        let seed = rng.random();
        let run =
            |captured| conv_block_steps(device, seed, (Tensor::relu, Tensor::relu), captured, (residual, image, width));
        let before = device.addends_taken();
        let eager = run(false);
        let addends = device.addends_taken() - before;
        device.set_backward_fusion(false);
        let unfused = run(false);
        device.set_backward_fusion(true);
        let ((eager, _), (unfused, _), (captured, fusions)) = (eager?, unfused?, run(true)?);
        let made =
            |prefix: &str| -> usize { fusions.iter().filter(|(w, _)| w.starts_with(prefix)).map(|(_, n)| n).sum() };
        // The ReLU reports taking its activation from the add either way; the convolution made none here.
        let by_conv = if residual == Residual::Input { made("conv2d → add") } else { 0 };
        let want_addends = if residual == Residual::Hidden { CONV_STEPS } else { 0 };
        let right = made(fusion) == 1
            && by_conv == 0
            && addends == want_addends
            && steps_bits(&eager) == steps_bits(&captured)
            && steps_bits(&eager) == steps_bits(&unfused);
        checks.push(Check::holds(
            format!("nn fused {fusion} = op by op"),
            format!(
                "{image:?} conv 3×3 → {width}, relu, {block}, relu, 4 SGD steps, {} (fused: {}; gradients added \
                 in dx: {addends}, = unfused backward)",
                kernels.name(),
                made(fusion)
            ),
            right,
        ));
    }
    device.set_conv_kernels(ConvKernels::TensorCores);
    Ok(checks)
}

/// Every check of `nn` the plan asks for.
pub fn checks(gpu: &Arc<Gpu>, plan: &Plan) -> anyhow::Result<Vec<Check>> {
    let device = Device::on(Arc::clone(gpu))?;
    let mut checks = Vec::new();
    if plan.wants(Group::Kernels) {
        checks.extend(elementwise_checks(&device, &mut plan.rng("nn elementwise"))?);
        checks.extend(reduction_checks(&device, &mut plan.rng("nn reductions"))?);
        checks.extend(product_checks(&device, &mut plan.rng("nn products"))?);
        checks.extend(loss_checks(&device, &mut plan.rng("nn losses"))?);
        checks.extend(layer_checks(&device, &mut plan.rng("nn layers"))?);
        checks.extend(optimizer_checks(&device, &mut plan.rng("nn optimizers"))?);
        checks.extend(layout_checks(&device, &mut plan.rng("nn layout"))?);
        checks.extend(image_checks(&device, &mut plan.rng("nn images"))?);
        checks.extend(backward_fusion_checks(&device, &mut plan.rng("nn backward fusion"))?);
    }
    let seed = plan.seed;
    if plan.wants(Group::Training) {
        let (host_losses, host_params) = train_mlp(None, seed, 30)?;
        let (losses, params) = train_mlp(Some(&device), seed, 30)?;
        let errors = [("losses", rel_error(&losses, &host_losses)), ("parameters", rel_error(&params, &host_params))];
        let (rel_error, what) = worst(errors);
        let shape = format!("MLP 20-33-7, 30 SGD steps ({what})");
        checks.push(Check { kernel: "nn training".into(), shape, rel_error, tolerance: SUM_TOLERANCE });
    }
    if plan.wants(Group::Repeat) {
        let first = train_mlp(Some(&device), seed, 10)?;
        let second = train_mlp(Some(&device), seed, 10)?;
        let same = first
            .0
            .iter()
            .chain(&first.1)
            .zip(second.0.iter().chain(&second.1))
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let shape = "MLP 20-33-7, 10 SGD steps twice".into();
        checks.push(Check {
            kernel: "nn repeat".into(),
            shape,
            rel_error: if same { 0.0 } else { f64::INFINITY },
            tolerance: 0.0,
        });
        let (eager, captured) = (adam_steps(&device, seed, false)?, adam_steps(&device, seed, true)?);
        let same = steps_bits(&eager) == steps_bits(&captured);
        let shape = "MLP 20-33-7, 12 Adam steps, cosine rate".into();
        let rel_error = if same { 0.0 } else { f64::INFINITY };
        checks.push(Check { kernel: "nn captured step = op by op".into(), shape, rel_error, tolerance: 0.0 });
        let eager = token_steps(&device, seed, StepRun::Eager)?;
        for (run, how) in
            [(StepRun::Refilled, "inputs refilled"), (StepRun::Handed, "each step's tensors read in place")]
        {
            let same = steps_bits(&eager) == steps_bits(&token_steps(&device, seed, run)?);
            let shape = format!("embedding (device ids), dropout, linear, clip, 12 AdamW steps, {how}");
            let rel_error = if same { 0.0 } else { f64::INFINITY };
            checks.push(Check { kernel: "nn captured step = op by op".into(), shape, rel_error, tolerance: 0.0 });
        }
        checks.extend(fusion_checks(&device, seed)?);
        checks.extend(loss_fusion_checks(&device, &mut plan.rng("nn loss fusion"))?);
        checks.extend(conv_fusion_checks(&device, &mut plan.rng("nn conv fusion"))?);
    }
    Ok(checks)
}
