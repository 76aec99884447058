//! A layer stack on a CUDA GPU: the launch layer of `fused/fit.cu`.
//!
//! The network is cut into groups (`plan`): a Linear or Conv2d with the activation and Dropout after it
//! fused in, a MaxPool2d, or a lone activation or Dropout; Flatten is only a new view of the same values.
//! Each distinct group compiles its own module of `fused/fit.cu` with its sizes as defines. A dense group
//! whose module is not compiled yet (a new spec) starts on the generic dense kernels instead, one module
//! for every size, built into the binary, while its own compiles on another thread; the trainer swaps it
//! in before the next epoch once it is ready ([`DenseKernels`]). Both give the same bits. A step is one
//! forward kernel per group, the loss, one backward grid per group down to the first layer with
//! parameters, and the update. The weight gradients that no ∂x waits for run on side streams beside the
//! chain of ∂x kernels, so the epoch's graph has them as parallel branches.
//!
//! A small chain of Linear layers (`whole_epoch_plan`: up to four, their weights within a warp's
//! registers, a batch of at most 256) trains instead in one launch an epoch, `dense_train_epoch`, one
//! block running every step; the layer kernels still evaluate it.
//!
//! Memory is one arena, allocated when the trainer is built: parameters, gradient, optimizer state, every
//! group's activations and output gradient for `capacity` samples, the per-sample losses,
//! the epoch's order and learning rates, and every split. Training allocates nothing
//! (`device_bytes_allocated_by_training` measures it). An epoch's steps are captured once as a CUDA graph
//! and replayed every epoch after the order and the rates are uploaded; the host reads back the
//! per-sample losses once per epoch and sums them in order.

use super::model::{Loss, Network, size};
use super::spec::{Layer, Shape};
use super::{Setup, Target};
use crate::device::kernel_struct::kernel_struct;
use crate::device::launch::{Arg, Kernel, StructArg};
use crate::device::phases;
use crate::device::{Gpu, compile::ModuleRequest};
use crate::harness::run::Trainer;
use crate::ops::THREADS_PER_BLOCK;
use crate::ops::dropout::{DropoutKey, dropout_scale, dropout_threshold, site_seed};
use crate::ops::gemm::tile_shared_floats;
use crate::ops::optim::OptimConfig;
use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaGraph, CudaModule, CudaSlice, CudaStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

const THREADS: usize = THREADS_PER_BLOCK as usize;
/// dense_forward's tile: samples × outputs, register tile, and the most k staged at once (FWD_* in fit.cu).
const FORWARD_TILE: (usize, usize, usize, usize, usize) = (8, 8, 256, 2, 2);
/// dense_backward's tiles (BWD_*).
const BACKWARD_TILE: (usize, usize, usize, usize, usize) = (16, 64, 64, 4, 4);
/// The most k dense_forward_loss stages at once (LOSS_BK).
const LOSS_DEPTH: usize = 128;
/// Samples evaluated per forward pass, at least (the batch when larger)...
const EVAL_ROWS: usize = 1024;
/// ... and more, up to a whole split, while the activations of one pass stay within this many bytes: each
/// pass reads its outputs back, so a test split of 73,200 rows in 1,024-row passes spent ~4 ms an epoch
/// waiting on the host.
const EVAL_BYTES: usize = 64 << 20;
const NO_ACTIVATION: i64 = -1;
/// The whole-epoch kernel's limits: Linear layers (FIT_LAYER0..3), batch (a thread per sample stages
/// row indices), and the floats a lane holds in registers across a step (weights, their gradient, and
/// the activations of the one or two samples it takes at once), past which the compiler would spill them.
const WHOLE_EPOCH_LAYERS: usize = 4;
const WHOLE_EPOCH_BATCH: usize = THREADS;
const WHOLE_EPOCH_REGISTERS: usize = 200;

/// How a trainer runs its training steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepPath {
    /// The whole-epoch kernel where the network and batch fit it, else the layer kernels.
    Auto,
    /// The layer kernels, an epoch of them captured as one CUDA graph.
    Layers,
    /// The whole-epoch kernel (an error for a network or batch it does not take).
    WholeEpoch,
}

impl StepPath {
    /// How reports name it.
    pub fn name(self) -> &'static str {
        match self {
            StepPath::Auto => "auto",
            StepPath::Layers => "layer kernels",
            StepPath::WholeEpoch => "whole epoch in one kernel",
        }
    }
}

/// Which kernels a trainer's dense groups run: their own modules (`FIT_OP 1`, sizes compiled in) or the
/// generic family (`FIT_OP 8`, sizes as an argument), which sums in the same order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseKernels {
    /// Its own module where it is compiled already (or the trainer takes the whole-epoch kernel, which
    /// compiles anyway); else the generic kernels, where they are compiled, while its own module compiles
    /// on another thread, swapped in before the first epoch after it is ready.
    Auto,
    /// Its own module, compiled first where need be.
    Own,
    /// The generic kernels until `use_own_kernels` (the checks').
    Generic,
}

kernel_struct! {
    /// A dense group's sizes as the generic kernels take them (`DenseDims` in fused/fit.cu, FIT_OP 8):
    /// act an activation code or −1, bias and drop 0 or 1, loss the fused loss's code or −1.
    pub struct DenseDims {
        inputs: i32,
        outputs: i32,
        act: i32,
        bias: i32,
        drop: i32,
        loss: i32,
    }
}

/// What one group computes. `act` is an activation code (0 ReLU, 1 sigmoid, 2 tanh, 3 GELU; −1 none) and
/// `dropout` the spec index and probability of a Dropout.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Op {
    /// Linear(inputs, outputs), then the activation, then the dropout.
    Dense { inputs: usize, outputs: usize, bias: bool, act: i64, dropout: Option<(usize, f32)> },
    /// Conv2d over `input` (channels, height, width) images, then the activation.
    Conv { input: (usize, usize, usize), outputs: usize, kernel: usize, stride: usize, padding: usize, act: i64 },
    /// MaxPool2d(k) over `input` images.
    Pool { input: (usize, usize, usize), k: usize },
    /// A lone activation, or (act −1) a lone dropout, over `size` values per sample.
    Pointwise { size: usize, act: i64, dropout: Option<(usize, f32)> },
}

/// One group: what it computes, the spec layer whose parameters it holds (if any), its output's size.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The computation.
    pub op: Op,
    /// Spec index of its Linear or Conv2d.
    pub layer: Option<usize>,
    /// Values per sample it outputs.
    pub out_size: usize,
}

fn activation_code(layer: &Layer) -> Option<i64> {
    match layer {
        Layer::Relu => Some(0),
        Layer::Sigmoid => Some(1),
        Layer::Tanh => Some(2),
        Layer::Gelu => Some(3),
        _ => None,
    }
}

fn image(s: Shape) -> (usize, usize, usize) {
    match s {
        Shape::Image { channels, height, width } => (channels, height, width),
        Shape::Flat(n) => (n, 1, 1),
    }
}

/// The network cut into groups (see the module comment).
pub fn plan(net: &Network) -> Vec<Group> {
    let mut groups = Vec::new();
    let layers = &net.layers;
    let mut i = 0;
    while i < layers.len() {
        let start = i;
        let dropout_at = |j: usize| match layers.get(j) {
            Some(Layer::Dropout(p)) => Some((j, *p)),
            _ => None,
        };
        let (op, layer) = match layers[i] {
            Layer::Linear { inputs, outputs, bias } => {
                let act = layers.get(i + 1).and_then(activation_code);
                let after = i + 1 + act.is_some() as usize;
                let dropout = dropout_at(after);
                i = after + dropout.is_some() as usize;
                let act = act.unwrap_or(NO_ACTIVATION);
                (Op::Dense { inputs: inputs.unwrap_or(0), outputs, bias, act, dropout }, Some(start))
            }
            Layer::Conv2d { outputs, kernel, stride, padding, .. } => {
                let act = layers.get(i + 1).and_then(activation_code);
                i += 1 + act.is_some() as usize;
                let input = image(net.shapes[start]);
                let act = act.unwrap_or(NO_ACTIVATION);
                (Op::Conv { input, outputs, kernel, stride, padding, act }, Some(start))
            }
            Layer::MaxPool2d(k) => {
                i += 1;
                (Op::Pool { input: image(net.shapes[start]), k }, None)
            }
            Layer::Flatten => {
                i += 1;
                continue;
            }
            ref other => {
                i += 1;
                let size = size(net.shapes[start]);
                let dropout = dropout_at(start);
                (Op::Pointwise { size, act: activation_code(other).unwrap_or(NO_ACTIVATION), dropout }, None)
            }
        };
        groups.push(Group { op, layer, out_size: size(net.shapes[i]) });
    }
    groups
}

/// Samples per block of conv_weight_partials for outputs of `positions` values per channel (SAMPLES in
/// fit.cu): at least 1024 output positions a block.
fn conv_samples_per_run(positions: usize) -> usize {
    1024usize.div_ceil(positions)
}

/// Whether the last group forms the loss itself (`dense_forward_loss`): a plain last Linear of at most
/// 64 outputs.
pub fn fuses_loss(groups: &[Group]) -> bool {
    matches!(groups.last().map(|g| g.op), Some(Op::Dense { outputs, act: NO_ACTIVATION, dropout, .. })
        if outputs <= 64 && dropout.is_none_or(|(_, p)| p == 0.0))
}

fn loss_code(loss: Loss) -> i64 {
    (loss == Loss::Mse) as i64
}

/// The module of `fused/fit.cu` a group compiles; `fused_loss`: the loss the group forms itself.
pub fn group_module(op: &Op, fused_loss: Option<Loss>) -> ModuleRequest {
    let n = |v: usize| v as i64;
    match *op {
        Op::Dense { inputs, outputs, bias, act, dropout } => {
            let mut defines = vec![
                ("FIT_OP", 1),
                ("FIT_IN", n(inputs)),
                ("FIT_OUT", n(outputs)),
                ("FIT_ACT", act),
                ("FIT_BIAS", bias as i64),
                ("FIT_DROP", dropout.is_some_and(|(_, p)| p > 0.0) as i64),
            ];
            defines.extend(fused_loss.map(|l| ("FIT_LOSS", loss_code(l))));
            ("fit", defines)
        }
        Op::Conv { input: (c, h, w), outputs, kernel, stride, padding, act } => (
            "fit",
            vec![
                ("FIT_OP", 2),
                ("FIT_CIN", n(c)),
                ("FIT_H", n(h)),
                ("FIT_W", n(w)),
                ("FIT_COUT", n(outputs)),
                ("FIT_K", n(kernel)),
                ("FIT_S", n(stride)),
                ("FIT_P", n(padding)),
                ("FIT_ACT", act),
            ],
        ),
        Op::Pool { input: (c, h, w), k } => {
            ("fit", vec![("FIT_OP", 3), ("FIT_C", n(c)), ("FIT_H", n(h)), ("FIT_W", n(w)), ("FIT_K", n(k))])
        }
        Op::Pointwise { size, act, .. } => ("fit", vec![("FIT_OP", 4), ("FIT_SIZE", n(size)), ("FIT_ACT", act)]),
    }
}

/// The whole-epoch kernel's view of a network (see `dense_train_epoch` in fit.cu): each Linear layer
/// packed as FIT_LAYERn, and the dynamic shared memory it needs, in floats.
#[derive(Clone, Debug, PartialEq)]
pub struct WholeEpochPlan {
    /// inputs | outputs << 16 | (act + 1) << 32 | bias << 35 | dropout << 36, per layer.
    pub codes: Vec<i64>,
    /// SMEM_FLOATS.
    pub shared_floats: usize,
    /// Samples a warp takes at once (FIT_PAIR): 2 where the second sample's activations fit the registers.
    pub pair: usize,
}

/// The whole-epoch plan of `net` (cut into `groups`) at `batch`, or None where the kernel does not take
/// it: anything but Linear layers (with their activations and dropout), more than four of them, a batch
/// above 256, or weights past a lane's registers. Mirrors `Dense` in fit.cu: only the first layer of
/// several lays its rows over the lanes (when its inputs are fewer than 5 × its outputs), the others
/// their columns.
pub fn whole_epoch_plan(net: &Network, groups: &[Group], loss: Loss, batch: usize) -> Option<WholeEpochPlan> {
    if groups.is_empty() || groups.len() > WHOLE_EPOCH_LAYERS || batch == 0 || batch > WHOLE_EPOCH_BATCH {
        return None;
    }
    // Registers a lane needs: its weights and their gradient, and per sample taken at once, the sample's
    // activations and kept inputs.
    let (mut codes, mut fixed, mut per_sample, mut at) = (Vec::new(), 0, 0, 0);
    for (l, g) in groups.iter().enumerate() {
        let Op::Dense { inputs, outputs, bias, act, dropout } = g.op else { return None };
        // The kernel lays the parameters out layer by layer, weights then bias, as `Network` does.
        let params = net.params[g.layer?].as_ref()?;
        if params.weight.start != at || params.bias.as_ref().is_some_and(|b| b.start != at + inputs * outputs) {
            return None;
        }
        at += inputs * outputs + if bias { outputs } else { 0 };
        let rows = l == 0 && groups.len() > 1 && inputs < 5 * outputs;
        let (own, span, values) = if rows {
            (outputs.div_ceil(32), inputs, outputs.div_ceil(32))
        } else {
            (inputs.div_ceil(32), outputs, outputs)
        };
        fixed += 2 * own * span;
        per_sample += 3 * values + if rows { inputs } else { own };
        if inputs >= 1 << 16 || outputs >= 1 << 16 {
            return None;
        }
        let drop = dropout.is_some_and(|(_, p)| p > 0.0);
        codes
            .push(inputs as i64 | (outputs as i64) << 16 | (act + 1) << 32 | (bias as i64) << 35 | (drop as i64) << 36);
    }
    let pair = if fixed + 2 * per_sample <= WHOLE_EPOCH_REGISTERS {
        2
    } else if fixed + per_sample <= WHOLE_EPOCH_REGISTERS {
        1
    } else {
        return None;
    };
    let ps = net.param_count.div_ceil(4) * 4;
    let target = if loss == Loss::Ce { 1 } else { net.outputs() };
    let shared_floats = (3 + THREADS / 32) * ps + 2 * batch * (net.inputs().div_ceil(4) * 4 + target + 1);
    Some(WholeEpochPlan { codes, shared_floats, pair })
}

const LAYER_DEFINES: [&str; WHOLE_EPOCH_LAYERS] = ["FIT_LAYER0", "FIT_LAYER1", "FIT_LAYER2", "FIT_LAYER3"];

/// The whole-epoch module of a plan, for `loss` and `batch`.
pub fn whole_epoch_module(plan: &WholeEpochPlan, loss: Loss, batch: usize) -> ModuleRequest {
    let mut defines =
        vec![("FIT_OP", 7), ("FIT_BATCH", batch as i64), ("FIT_LOSS", loss_code(loss)), ("FIT_PAIR", plan.pair as i64)];
    defines.extend(LAYER_DEFINES.iter().zip(&plan.codes).map(|(name, &code)| (*name, code)));
    ("fit", defines)
}

/// The loss module for `outputs` values per sample.
pub fn loss_module(loss: Loss, outputs: usize) -> ModuleRequest {
    ("fit", vec![("FIT_OP", 5), ("FIT_OUT", outputs as i64), ("FIT_LOSS", loss_code(loss))])
}

/// The update module (the same for every network).
pub fn update_module() -> ModuleRequest {
    ("fit", vec![("FIT_OP", 6)])
}

/// The generic dense kernels' module: every dense group's kernels, sizes as an argument.
pub fn generic_dense_module() -> ModuleRequest {
    ("fit", vec![("FIT_OP", 8)])
}

/// Every module a trainer of `net` with `loss` for batches of up to `batch` compiles: the layer kernels'
/// and, where the network takes it, the whole-epoch kernel's.
pub fn trainer_modules(net: &Network, loss: Loss, batch: usize) -> Vec<ModuleRequest> {
    let mut out = modules(net, loss);
    out.extend(whole_epoch_plan(net, &plan(net), loss, batch).map(|p| whole_epoch_module(&p, loss, batch)));
    out
}

/// Every module the layer kernels of a trainer of `net` with `loss` compile.
pub fn modules(net: &Network, loss: Loss) -> Vec<ModuleRequest> {
    let groups = plan(net);
    let fused = fuses_loss(&groups);
    let last = groups.len() - 1;
    let mut out: Vec<ModuleRequest> =
        groups.iter().enumerate().map(|(i, g)| group_module(&g.op, (fused && i == last).then_some(loss))).collect();
    if !fused {
        out.push(loss_module(loss, net.outputs()));
    }
    out.push(update_module());
    out
}

/// A region of the arena, in bytes from its start.
#[derive(Clone, Copy, Debug, Default)]
struct Region {
    offset: usize,
    bytes: usize,
}

/// Hands out 256-byte-aligned regions of the arena before it is allocated.
#[derive(Default)]
struct Layout {
    end: usize,
}

impl Layout {
    fn take(&mut self, values: usize) -> Region {
        let r = Region { offset: self.end, bytes: 4 * values };
        self.end += (4 * values).div_ceil(256) * 256;
        r
    }
}

struct DeviceSplit {
    rows: usize,
    x: Region,
    /// u32 classes or f32 values.
    target: Region,
}

struct GroupKernels {
    /// A dense group's sizes where it runs the generic kernels, their first argument.
    dims: Option<StructArg>,
    forward: Kernel,
    backward: Option<Kernel>,
    backward_input: Option<Kernel>,
    /// conv_weight_sum.
    backward_sum: Option<Kernel>,
    /// Shared memory of dense forward and backward, bytes.
    shared: (usize, usize),
}

struct GroupBuffers {
    /// Output values, for `capacity` samples.
    y: Region,
    /// Pre-activation values (fused activations) or a pool's winners.
    z: Option<Region>,
    /// Where this group's Σg² partials start, and how many.
    partials: (usize, usize),
    /// A conv's per-sample weight gradients.
    conv_partial: Option<Region>,
}

/// The whole-epoch kernel of a trainer: compiled for `batch`, with the per-layer dropout table it reads.
struct WholeEpoch {
    kernel: Kernel,
    batch: usize,
    shared_floats: usize,
    /// Per group: the layer seed, threshold and scale bits of its dropout (zeros without).
    dropout: Region,
}

struct CapturedEpoch {
    samples: usize,
    batch: usize,
    graph: CudaGraph,
}

/// A dense group on the generic kernels, and its own module: compiling on another thread (Auto), or not
/// started (Generic: compiled when `use_own_kernels` asks).
struct PendingModule {
    group: usize,
    request: ModuleRequest,
    fused_loss: Option<Loss>,
    compiling: Option<JoinHandle<Result<Vec<u8>>>>,
}

/// A dense group's kernels: the group's own and, where the group forms the loss, that kernel with its
/// shared memory in bytes.
type DenseLoaded = (GroupKernels, Option<(Kernel, usize)>);

/// Loads a dense group's kernels from `module`: its own (FIT_OP 1), or the generic family's (FIT_OP 8)
/// with the group's sizes as their first argument.
fn dense_kernels(
    gpu: &Gpu,
    module: &Arc<CudaModule>,
    op: &Op,
    fused_loss: Option<Loss>,
    generic: bool,
) -> Result<DenseLoaded> {
    let Op::Dense { inputs, outputs, bias, act, dropout } = *op else {
        bail!("internal: a dense group's kernels for {op:?}")
    };
    let load = |name: &str| Gpu::function(module, name);
    let dims = generic.then(|| {
        let int = |v: usize| v as i32;
        StructArg::of(&DenseDims {
            inputs: int(inputs),
            outputs: int(outputs),
            act: act as i32,
            bias: bias as i32,
            drop: dropout.is_some_and(|(_, p)| p > 0.0) as i32,
            loss: fused_loss.map_or(-1, |l| loss_code(l) as i32),
        })
    });
    // The depth staged at once: the generic kernels' is their most, FWD_BK and LOSS_BK.
    let depth = |most: usize| if generic { most } else { inputs.min(most) };
    let loss = match fused_loss {
        Some(_) => {
            let bn = outputs.next_power_of_two().max(8);
            let tn = if bn == 64 { 2 } else { 1 };
            let kernel = load(&if generic { format!("dense_forward_loss_{bn}") } else { "dense_forward_loss".into() })?;
            let shared = 4 * tile_shared_floats(8, bn, depth(LOSS_DEPTH), 1, tn);
            gpu.reserve_shared(&kernel, shared, "the layer widths")?;
            Some((kernel, shared))
        }
        None => None,
    };
    let (fm, fn_, fk, ftm, ftn) = FORWARD_TILE;
    let (bm, bn, bk, btm, btn) = BACKWARD_TILE;
    let shared = (4 * tile_shared_floats(fm, fn_, depth(fk), ftm, ftn), 4 * tile_shared_floats(bm, bn, bk, btm, btn));
    let k = GroupKernels {
        dims,
        forward: load("dense_forward")?,
        backward: Some(load("dense_backward")?),
        backward_input: None,
        backward_sum: None,
        shared,
    };
    gpu.reserve_shared(&k.forward, shared.0, "the layer widths")?;
    gpu.reserve_shared(k.backward.as_ref().expect("loaded"), shared.1, "the layer widths")?;
    Ok((k, loss))
}

/// How `--verbose` names a dense group: its Linear, e.g. "Linear(784, 96)".
fn dense_name(op: &Op) -> String {
    match op {
        Op::Dense { inputs, outputs, .. } => format!("Linear({inputs}, {outputs})"),
        other => format!("{other:?}"),
    }
}

/// Compiles the generic dense module into the cache on another thread, once a process, so that the next
/// new spec starts on it.
fn warm_generic_module(compute_capability: (i32, i32)) {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        std::thread::spawn(move || {
            crate::device::compile::compile_request(&generic_dense_module(), compute_capability)
        });
    });
}

/// The trainer of a layer stack on a CUDA GPU (see the module comment).
pub struct GpuTrainer {
    gpu: Arc<Gpu>,
    net: Network,
    groups: Vec<Group>,
    kernels: Vec<GroupKernels>,
    /// loss_forward, or the last group's dense_forward_loss when it forms the loss itself.
    loss_kernel: Kernel,
    fused_loss: bool,
    loss_shared: usize,
    /// Dense groups on the generic kernels, and their own modules.
    pending: Vec<PendingModule>,
    /// Epochs `train_epoch` has run.
    epochs: usize,
    update_kernel: Kernel,
    loss: Loss,
    optim: OptimConfig,
    dropout_seed: u32,
    capacity: usize,
    arena: CudaSlice<u8>,
    base: u64,
    params: Region,
    grad: Region,
    m: Region,
    v: Region,
    partials: Region,
    partial_count: usize,
    counters: Region,
    buffers: Vec<GroupBuffers>,
    /// Each group's output gradient, for `capacity` samples.
    dy: Vec<Region>,
    /// Per group, the stream its weight gradient runs on beside the main stream's chain of ∂x kernels
    /// (None: on the main stream, within a grid that also forms ∂x).
    sides: Vec<Option<Arc<CudaStream>>>,
    losses: Region,
    order: Region,
    lr: Region,
    splits: Vec<DeviceSplit>,
    update_grid: u32,
    captured: Option<CapturedEpoch>,
    whole_epoch: Option<WholeEpoch>,
    free_after_setup: usize,
    graph_bytes: usize,
}

fn bytes_of<T: Copy>(values: &[T]) -> &[u8] {
    // SAFETY: f32 and u32 (the only types passed) have no padding and every byte pattern of them is a
    // valid u8; the slice covers exactly their bytes.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn free_device_bytes() -> usize {
    cudarc::driver::result::mem_get_info().map(|(free, _)| free).unwrap_or(0)
}

impl GpuTrainer {
    /// Compiles the network's modules, allocates the arena for batches of up to `batch` samples and uploads
    /// the parameters and every split; steps run as `StepPath::Auto` chooses.
    pub fn new(gpu: Arc<Gpu>, setup: Setup, batch: usize) -> Result<GpuTrainer> {
        GpuTrainer::with_path(gpu, setup, batch, StepPath::Auto)
    }

    /// As `new`, with the steps' path chosen.
    pub fn with_path(gpu: Arc<Gpu>, setup: Setup, batch: usize, path: StepPath) -> Result<GpuTrainer> {
        GpuTrainer::with_kernels(gpu, setup, batch, path, DenseKernels::Auto)
    }

    /// As `with_path`, with the dense groups' kernels chosen.
    pub fn with_kernels(
        gpu: Arc<Gpu>,
        setup: Setup,
        batch: usize,
        path: StepPath,
        dense: DenseKernels,
    ) -> Result<GpuTrainer> {
        let Setup { net, params, loss, optim, dropout_seed, splits } = setup;
        if params.len() != net.param_count {
            bail!("internal: {} parameters given for a network of {}", params.len(), net.param_count);
        }
        let groups = plan(&net);
        let outputs = net.outputs();
        // Floats per sample of the buffers sized by `capacity` (outputs, pre-activations, output gradients,
        // and a conv's per-sample weight-gradient partials).
        let per_sample: usize = groups
            .iter()
            .map(|g| {
                3 * g.out_size
                    + match g.op {
                        Op::Conv { input: (c, ..), outputs, kernel, .. } => outputs * (c * kernel * kernel + 1),
                        _ => 0,
                    }
            })
            .sum();
        let eval_rows = (EVAL_BYTES / (4 * per_sample.max(1))).clamp(EVAL_ROWS, 65_535 * FORWARD_TILE.0);
        let capacity = batch.max(eval_rows.min(splits.iter().map(|s| s.rows()).max().unwrap_or(1))).max(1);
        if capacity.div_ceil(FORWARD_TILE.0) > 65_535 {
            bail!("--batch {batch} is above the GPU kernels' limit of {}", 65_535 * FORWARD_TILE.0);
        }

        let fused_loss = fuses_loss(&groups);
        let whole_plan = whole_epoch_plan(&net, &groups, loss, batch)
            .filter(|p| 4 * p.shared_floats <= gpu.max_shared_optin)
            .filter(|_| path != StepPath::Layers);
        if path == StepPath::WholeEpoch && whole_plan.is_none() {
            bail!("internal: the whole-epoch kernel does not take this network at batch {batch}");
        }
        let mut kernels = Vec::with_capacity(groups.len());
        let (mut loss_kernel, mut loss_shared, mut pending) = (None, 0, Vec::new());
        for (i, g) in groups.iter().enumerate() {
            let fuses = (fused_loss && i + 1 == groups.len()).then_some(loss);
            let request = group_module(&g.op, fuses);
            if let Op::Dense { .. } = g.op {
                let generic = match dense {
                    DenseKernels::Own => false,
                    DenseKernels::Generic => true,
                    DenseKernels::Auto if gpu.module_ready(&request) || whole_plan.is_some() => false,
                    DenseKernels::Auto if gpu.module_ready(&generic_dense_module()) => true,
                    DenseKernels::Auto => {
                        warm_generic_module(gpu.compute_capability);
                        false
                    }
                };
                let module = if generic { gpu.module(&generic_dense_module())? } else { gpu.module(&request)? };
                let (k, fused) = dense_kernels(&gpu, &module, &g.op, fuses, generic)?;
                if let Some((kernel, shared)) = fused {
                    (loss_kernel, loss_shared) = (Some(kernel), shared);
                }
                if generic {
                    let compiling = (dense == DenseKernels::Auto).then(|| {
                        let (request, capability) = (request.clone(), gpu.compute_capability);
                        std::thread::spawn(move || crate::device::compile::compile_request(&request, capability))
                    });
                    let what =
                        format!("{}: the generic dense kernels until its own module compiles", dense_name(&g.op));
                    phases::note(Instant::now(), &what);
                    pending.push(PendingModule { group: i, request, fused_loss: fuses, compiling });
                }
                kernels.push(k);
                continue;
            }
            let module = gpu.module(&request)?;
            let load = |name: &str| Gpu::function(&module, name);
            let k = match g.op {
                Op::Dense { .. } => unreachable!("loaded above"),
                Op::Conv { .. } => GroupKernels {
                    dims: None,
                    forward: load("conv_forward")?,
                    backward: Some(load("conv_weight_partials")?),
                    backward_input: Some(load("conv_backward_input")?),
                    backward_sum: Some(load("conv_weight_sum")?),
                    shared: (0, 0),
                },
                Op::Pool { .. } => GroupKernels {
                    dims: None,
                    forward: load("pool_forward")?,
                    backward: Some(load("pool_backward")?),
                    backward_input: None,
                    backward_sum: None,
                    shared: (0, 0),
                },
                Op::Pointwise { .. } => GroupKernels {
                    dims: None,
                    forward: load("pointwise_forward")?,
                    backward: Some(load("pointwise_backward")?),
                    backward_input: None,
                    backward_sum: None,
                    shared: (0, 0),
                },
            };
            kernels.push(k);
        }
        let loss_kernel = match loss_kernel {
            Some(k) => k,
            None => Gpu::function(&gpu.module(&loss_module(loss, outputs))?, "loss_forward")?,
        };
        let update_kernel = Gpu::function(&gpu.module(&update_module())?, "fit_update")?;

        // The arena's layout.
        let n = net.param_count;
        let mut layout = Layout::default();
        let (p_params, p_grad, p_m, p_v) = (layout.take(n), layout.take(n), layout.take(n), layout.take(n));
        let counters = layout.take(2); // step, update ticket
        let mut partial_count = 0;
        let mut buffers = Vec::with_capacity(groups.len());
        for g in &groups {
            let count = match g.op {
                Op::Dense { inputs, outputs, bias, .. } => {
                    let (bm, bn, ..) = BACKWARD_TILE;
                    outputs.div_ceil(bm) * (inputs + bias as usize).div_ceil(bn)
                }
                Op::Conv { input: (c, ..), outputs, kernel, .. } => outputs * c * kernel * kernel + outputs,
                _ => 0,
            };
            let z = match g.op {
                Op::Dense { act, .. } | Op::Conv { act, .. } if act != NO_ACTIVATION => {
                    Some(layout.take(capacity * g.out_size))
                }
                Op::Pool { .. } => Some(layout.take(capacity * g.out_size)),
                _ => None,
            };
            let conv_partial = match g.op {
                Op::Conv { input: (c, ..), outputs, kernel, .. } => {
                    Some(layout.take(capacity * outputs * (c * kernel * kernel + 1)))
                }
                _ => None,
            };
            let y = layout.take(capacity * g.out_size);
            buffers.push(GroupBuffers { y, z, partials: (partial_count, count), conv_partial });
            partial_count += count;
        }
        let partials = layout.take(partial_count.max(1));
        let dy: Vec<Region> = groups.iter().map(|g| layout.take(capacity * g.out_size)).collect();
        let train_rows = splits.first().map_or(0, |s| s.rows());
        let losses = layout.take(train_rows.max(capacity));
        let order = layout.take(train_rows.max(1));
        let lr = layout.take(train_rows.max(1));
        let dropout_table = layout.take(3 * groups.len());
        let mut device_splits = Vec::with_capacity(splits.len());
        for s in &splits {
            if s.features != net.inputs() {
                bail!("the data has {} values per sample but the network takes {}", s.features, net.inputs());
            }
            let targets = match &s.target {
                Target::Classes(c) => c.len(),
                Target::Values(v) => v.len(),
            };
            device_splits.push(DeviceSplit { rows: s.rows(), x: layout.take(s.x.len()), target: layout.take(targets) });
        }

        let stream = gpu.stream.clone();
        let mut arena = stream.alloc_zeros::<u8>(layout.end.max(256)).map_err(|_| {
            anyhow::anyhow!(
                "the GPU has no room for this model and data ({} MB): lower --batch, the layer widths or the data",
                layout.end.div_ceil(1 << 20)
            )
        })?;
        let base = Arg::buf(&gpu, &arena);
        let Arg::Ptr(base) = base else { unreachable!("a buffer is a pointer") };
        let mut put = |region: Region, bytes: &[u8]| -> Result<()> {
            stream
                .memcpy_htod(bytes, &mut arena.slice_mut(region.offset..region.offset + bytes.len()))
                .context("copying to the GPU")
        };
        put(p_params, bytes_of(&params))?;
        let table: Vec<u32> = groups
            .iter()
            .flat_map(|g| match g.op {
                Op::Dense { dropout, .. } => {
                    let (seed, threshold, scale) = dropout_values(dropout_seed, dropout, true);
                    [seed, threshold, scale.to_bits()]
                }
                _ => [0; 3],
            })
            .collect();
        put(dropout_table, bytes_of(&table))?;
        for (s, d) in splits.iter().zip(&device_splits) {
            put(d.x, bytes_of(&s.x))?;
            match &s.target {
                Target::Classes(c) => put(d.target, bytes_of(c))?,
                Target::Values(v) => put(d.target, bytes_of(v))?,
            }
        }
        stream.synchronize().context("copying to the GPU")?;
        let update_grid = n.div_ceil(THREADS).clamp(1, 4 * gpu.sm_count as usize) as u32;
        let mut sides = Vec::with_capacity(groups.len());
        for beside in weights_beside(&groups, fused_loss) {
            sides.push(if beside { Some(gpu.stream.fork().context("creating a CUDA stream")?) } else { None });
        }
        let whole_epoch = match whole_plan {
            Some(p) => {
                let kernel = Gpu::function(&gpu.module(&whole_epoch_module(&p, loss, batch))?, "dense_train_epoch")?;
                gpu.reserve_shared(&kernel, 4 * p.shared_floats, "--batch")?;
                Some(WholeEpoch { kernel, batch, shared_floats: p.shared_floats, dropout: dropout_table })
            }
            None => None,
        };
        Ok(GpuTrainer {
            free_after_setup: free_device_bytes(),
            gpu,
            net,
            groups,
            kernels,
            loss_kernel,
            fused_loss,
            loss_shared,
            pending,
            epochs: 0,
            update_kernel,
            loss,
            optim,
            dropout_seed,
            capacity,
            arena,
            base,
            params: p_params,
            grad: p_grad,
            m: p_m,
            v: p_v,
            partials,
            partial_count,
            counters,
            buffers,
            dy,
            sides,
            losses,
            order,
            lr,
            splits: device_splits,
            update_grid,
            captured: None,
            whole_epoch,
            graph_bytes: 0,
        })
    }

    fn ptr(&self, region: Region) -> Arg {
        Arg::Ptr(self.base + region.offset as u64)
    }

    fn ptr_at(&self, region: Region, element: usize) -> Arg {
        Arg::Ptr(self.base + (region.offset + 4 * element) as u64)
    }

    fn param_ptr(&self, region: Region, layer: usize, bias: bool) -> Arg {
        let p = self.net.params[layer].as_ref().expect("a group with a layer has parameters");
        let at = if bias { p.bias.as_ref().map_or(0, |b| b.start) } else { p.weight.start };
        self.ptr_at(region, at)
    }

    fn step_ptr(&self) -> Arg {
        self.ptr(self.counters)
    }

    /// Dropout's (layer seed, threshold, scale) for a group, off when not `training`.
    fn dropout_args(&self, dropout: Option<(usize, f32)>, training: bool) -> [Arg; 3] {
        let (seed, threshold, scale) = dropout_values(self.dropout_seed, dropout, training);
        [Arg::u32(seed), Arg::u32(threshold), Arg::f32(scale)]
    }

    /// The forward kernels of every group over `b` samples: of split `split` gathered through the order
    /// from `offset` when training, else its samples `offset..offset + b` in order.
    pub fn launch_forward(&self, split: usize, offset: usize, b: usize, training: bool) -> Result<()> {
        let g = &*self.gpu;
        let unfused = self.groups.len() - self.fused_loss as usize;
        for (i, group) in self.groups.iter().enumerate().take(unfused) {
            let (input, rows) = self.group_input(split, i, offset, training);
            let buf = &self.buffers[i];
            let k = &self.kernels[i];
            let y = self.ptr(buf.y);
            let z = buf.z.map_or(Arg::Ptr(0), |z| self.ptr(z));
            let blocks = |values: usize| ((b * values).div_ceil(THREADS) as u32, 1);
            match group.op {
                Op::Dense { outputs, dropout, .. } => {
                    let layer = group.layer.expect("dense has a layer");
                    let mut args = vec![
                        input,
                        rows,
                        Arg::i32(b as i32),
                        self.param_ptr(self.params, layer, false),
                        self.param_ptr(self.params, layer, true),
                        z,
                        y,
                    ];
                    let [seed, threshold, scale] = self.dropout_args(dropout, training);
                    args.extend([seed, self.step_ptr(), threshold, scale]);
                    let grid = (outputs.div_ceil(FORWARD_TILE.1) as u32, b.div_ceil(FORWARD_TILE.0) as u32);
                    let shape = (grid, THREADS as u32, k.shared.0 as u32, false);
                    g.launch_on_with_struct(&g.stream, &k.forward, shape, k.dims.as_ref(), &args)?;
                }
                Op::Conv { .. } => {
                    let layer = group.layer.expect("conv has a layer");
                    let args = [
                        input,
                        rows,
                        Arg::i32(b as i32),
                        self.param_ptr(self.params, layer, false),
                        self.param_ptr(self.params, layer, true),
                        z,
                        y,
                    ];
                    g.launch(&k.forward, blocks(group.out_size), 0, false, &args)?;
                }
                Op::Pool { .. } => {
                    g.launch(&k.forward, blocks(group.out_size), 0, false, &[input, rows, Arg::i32(b as i32), y, z])?;
                }
                Op::Pointwise { dropout, .. } => {
                    let [seed, threshold, scale] = self.dropout_args(dropout, training);
                    let args = [input, rows, Arg::i32(b as i32), y, seed, self.step_ptr(), threshold, scale];
                    g.launch(&k.forward, blocks(group.out_size), 0, false, &args)?;
                }
            }
        }
        Ok(())
    }

    /// Group `i`'s input and the rows it gathers: split `split` through the order from `offset` (training)
    /// or its samples from `offset` in order for the first group, the group before's output otherwise.
    fn group_input(&self, split: usize, i: usize, offset: usize, training: bool) -> (Arg, Arg) {
        let data = &self.splits[split];
        match (i, training) {
            (0, true) => (self.ptr(data.x), self.ptr_at(self.order, offset)),
            (0, false) => (self.ptr_at(data.x, offset * self.net.inputs()), Arg::Ptr(0)),
            _ => (self.ptr(self.buffers[i - 1].y), Arg::Ptr(0)),
        }
    }

    /// The loss over the last group's output: per-sample losses into `losses[at..]`, and (when training)
    /// the output gradient into the last group's `dy`. Where the last group forms the loss itself, this is
    /// that group's forward, which also writes the layer before's gradient into that group's `dy`.
    pub fn launch_loss(&self, split: usize, offset: usize, b: usize, training: bool, at: usize) -> Result<()> {
        let data = &self.splits[split];
        let last = self.buffers.last().expect("a network has a group").y;
        let outputs = self.net.outputs();
        let (rows, target_at) = if training { (self.ptr_at(self.order, offset), 0) } else { (Arg::Ptr(0), offset) };
        let (classes, values) = match self.loss {
            Loss::Ce => (self.ptr_at(data.target, target_at), Arg::Ptr(0)),
            Loss::Mse => (Arg::Ptr(0), self.ptr_at(data.target, target_at * outputs)),
        };
        let last_group = self.groups.len() - 1;
        let dy = if training { self.ptr(self.dy[last_group]) } else { Arg::Ptr(0) };
        if self.fused_loss {
            let i = self.groups.len() - 1;
            let layer = self.groups[i].layer.expect("dense has a layer");
            let wants_dx = training && self.groups.iter().position(|g| g.layer.is_some()).is_some_and(|f| f < i);
            let (input, input_rows) = self.group_input(split, i, offset, training);
            let args = [
                input,
                input_rows,
                rows,
                Arg::i32(b as i32),
                self.param_ptr(self.params, layer, false),
                self.param_ptr(self.params, layer, true),
                classes,
                values,
                self.ptr(last),
                self.ptr_at(self.losses, at),
                dy,
                if wants_dx { self.ptr(self.dy[i - 1]) } else { Arg::Ptr(0) },
            ];
            let shape = ((b.div_ceil(8) as u32, 1), THREADS as u32, self.loss_shared as u32, false);
            let dims = self.kernels[i].dims.as_ref();
            return self.gpu.launch_on_with_struct(&self.gpu.stream, &self.loss_kernel, shape, dims, &args);
        }
        let args = [self.ptr(last), rows, Arg::i32(b as i32), classes, values, self.ptr_at(self.losses, at), dy];
        let blocks = b.div_ceil(THREADS / 32) as u32;
        self.gpu.launch(&self.loss_kernel, (blocks, 1), 0, false, &args)
    }

    /// The backward grids, last group first, down to the first group with parameters. The chain of ∂x
    /// kernels runs on the main stream; a weight gradient that nothing else waits for (a conv's, or a
    /// dense group's that forms no ∂x) runs on its group's side stream from the moment its ∂y is ready,
    /// and the main stream waits for all of them at the end. Each group has its own ∂y buffer, so a side
    /// stream still reading one is never overwritten.
    pub fn launch_backward(&self, offset: usize, b: usize) -> Result<()> {
        let g = &*self.gpu;
        let Some(first) = self.groups.iter().position(|g| g.layer.is_some()) else { return Ok(()) };
        let clipping = self.optim.clip_norm > 0.0;
        let main = &g.stream;
        let mut joined = Vec::new();
        for i in (first..self.groups.len()).rev() {
            let group = &self.groups[i];
            let k = &self.kernels[i];
            let buf = &self.buffers[i];
            let (input, rows) = if i == 0 {
                (self.ptr(self.splits[0].x), self.ptr_at(self.order, offset))
            } else {
                (self.ptr(self.buffers[i - 1].y), Arg::Ptr(0))
            };
            let wants_dx = wants_dx(&self.groups, self.fused_loss, i);
            let dy = self.ptr(self.dy[i]);
            let dx = if i > 0 { self.ptr(self.dy[i - 1]) } else { Arg::Ptr(0) };
            // The stream of this group's weight gradient, started once its ∂y is in.
            let weights = match &self.sides[i] {
                Some(side) => {
                    side.join(main).context("ordering the CUDA streams")?;
                    joined.push(side);
                    side
                }
                None => main,
            };
            let z = buf.z.map_or(Arg::Ptr(0), |z| self.ptr(z));
            let partials =
                if clipping && buf.partials.1 > 0 { self.ptr_at(self.partials, buf.partials.0) } else { Arg::Ptr(0) };
            let blocks = |values: usize| ((b * values).div_ceil(THREADS) as u32, 1);
            let in_size = if i == 0 { self.net.inputs() } else { self.groups[i - 1].out_size };
            match group.op {
                Op::Dense { inputs, dropout, .. } => {
                    let layer = group.layer.expect("dense has a layer");
                    let [seed, threshold, scale] = self.dropout_args(dropout, true);
                    let args = [
                        input,
                        rows,
                        Arg::i32(b as i32),
                        self.param_ptr(self.params, layer, false),
                        z,
                        dy,
                        self.param_ptr(self.grad, layer, false),
                        self.param_ptr(self.grad, layer, true),
                        if wants_dx { dx } else { Arg::Ptr(0) },
                        seed,
                        self.step_ptr(),
                        threshold,
                        scale,
                        partials,
                    ];
                    let (bm, bn, ..) = BACKWARD_TILE;
                    let dx_tiles = if wants_dx { b.div_ceil(bm) * inputs.div_ceil(bn) } else { 0 };
                    let grid = (buf.partials.1 + dx_tiles) as u32;
                    let kernel = k.backward.as_ref().expect("loaded");
                    let shape = ((grid, 1), THREADS as u32, k.shared.1 as u32, false);
                    g.launch_on_with_struct(weights, kernel, shape, k.dims.as_ref(), &args)?;
                }
                Op::Conv { outputs, .. } => {
                    let layer = group.layer.expect("conv has a layer");
                    let conv_partial = self.ptr(buf.conv_partial.expect("a conv has its partial sums"));
                    let args = [input, rows, Arg::i32(b as i32), z, dy, conv_partial];
                    let runs = b.div_ceil(conv_samples_per_run(group.out_size / outputs));
                    let kernel = k.backward.as_ref().expect("loaded");
                    g.launch_on(weights, kernel, ((runs * outputs) as u32, 1), THREADS as u32, 0, false, &args)?;
                    let args = [
                        Arg::i32(b as i32),
                        conv_partial,
                        self.param_ptr(self.grad, layer, false),
                        self.param_ptr(self.grad, layer, true),
                        partials,
                    ];
                    let sum = k.backward_sum.as_ref().expect("loaded");
                    let grid = (buf.partials.1.div_ceil(THREADS / 32) as u32, 1);
                    g.launch_on(weights, sum, grid, THREADS as u32, 0, false, &args)?;
                    if wants_dx {
                        let args = [Arg::i32(b as i32), self.param_ptr(self.params, layer, false), z, dy, dx];
                        g.launch(k.backward_input.as_ref().expect("loaded"), blocks(in_size), 0, false, &args)?;
                    }
                }
                Op::Pool { .. } => {
                    let args = [Arg::i32(b as i32), z, dy, dx];
                    g.launch(k.backward.as_ref().expect("loaded"), blocks(in_size), 0, false, &args)?;
                }
                Op::Pointwise { dropout, .. } => {
                    let [seed, threshold, scale] = self.dropout_args(dropout, true);
                    let args = [input, Arg::i32(b as i32), dy, dx, seed, self.step_ptr(), threshold, scale];
                    g.launch(k.backward.as_ref().expect("loaded"), blocks(in_size), 0, false, &args)?;
                }
            }
        }
        for side in joined {
            main.join(side).context("ordering the CUDA streams")?;
        }
        Ok(())
    }

    /// The optimizer step at the rate of entry `step_in_epoch` of the uploaded schedule.
    pub fn launch_update(&self, step_in_epoch: usize) -> Result<()> {
        let args = [
            self.ptr(self.params),
            self.ptr(self.grad),
            self.ptr(self.m),
            self.ptr(self.v),
            Arg::i32(self.net.param_count as i32),
            self.ptr_at(self.lr, step_in_epoch),
            self.ptr(self.partials),
            Arg::i32(self.partial_count as i32),
            self.step_ptr(),
            Arg::Ptr(self.base + self.counters.offset as u64 + 4),
        ];
        let settings = StructArg::of(&self.optim.kernel_settings());
        self.gpu.launch_with_struct(&self.update_kernel, ((self.update_grid, 1), 0, false), &settings, &args)
    }

    /// One training step over `b` samples of the order from `offset`.
    pub fn launch_step(&self, offset: usize, b: usize, step_in_epoch: usize) -> Result<()> {
        self.launch_forward(0, offset, b, true)?;
        self.launch_loss(0, offset, b, true, offset)?;
        self.launch_backward(offset, b)?;
        self.launch_update(step_in_epoch)
    }

    fn enqueue_epoch(&self, samples: usize, batch: usize) -> Result<()> {
        let (mut offset, mut k) = (0, 0);
        while offset < samples {
            let b = batch.min(samples - offset);
            self.launch_step(offset, b, k)?;
            offset += b;
            k += 1;
        }
        Ok(())
    }

    fn upload(&mut self, region: Region, bytes: &[u8]) -> Result<()> {
        let r = region.offset..region.offset + bytes.len();
        self.gpu.stream.memcpy_htod(bytes, &mut self.arena.slice_mut(r)).context("copying to the GPU")
    }

    fn download(&self, region: Region, values: usize) -> Result<Vec<f32>> {
        let r = region.offset..region.offset + 4 * values;
        let bytes = self.gpu.stream.clone_dtoh(&self.arena.slice(r)).context("a fit kernel failed")?;
        Ok(f32s(&bytes))
    }

    /// Uploads an epoch's order and rates (samples of split 0; one rate per step).
    pub fn set_epoch(&mut self, order: &[u32], lr: &[f32]) -> Result<()> {
        self.upload(self.order, bytes_of(order))?;
        self.upload(self.lr, bytes_of(lr))
    }

    /// The gradient of the last step (flat, as the parameters).
    pub fn gradient(&self) -> Result<Vec<f32>> {
        self.download(self.grad, self.net.param_count)
    }

    /// Replaces the parameters and zeroes the optimizer state and step count.
    pub fn reset(&mut self, params: &[f32]) -> Result<()> {
        self.upload(self.params, bytes_of(params))?;
        let zeros = vec![0u8; self.m.bytes];
        self.upload(self.m, &zeros)?;
        self.upload(self.v, &zeros)?;
        self.upload(self.counters, &[0u8; 8])
    }

    /// Fills the gradient and every group's outputs with NaN, so a value a kernel fails to write cannot
    /// pass a check.
    pub fn poison(&mut self) -> Result<()> {
        let nan = |r: Region| bytes_of(&vec![f32::NAN; r.bytes / 4]).to_vec();
        let mut regions = vec![self.grad];
        regions.extend(self.dy.iter().copied());
        regions.extend(self.buffers.iter().map(|b| b.y));
        for r in regions {
            let bytes = nan(r);
            self.upload(r, &bytes)?;
        }
        Ok(())
    }

    /// Waits for the queued kernels.
    pub fn synchronize(&self) -> Result<()> {
        self.gpu.stream.synchronize().context("a fit kernel failed")
    }

    /// Device memory taken since the trainer was built (by anything on this GPU), apart from the epoch
    /// graphs' own (`graph_bytes`), in bytes: 0 when training allocates nothing.
    pub fn device_bytes_allocated_by_training(&self) -> usize {
        self.free_after_setup.saturating_sub(free_device_bytes())
    }

    /// Device memory the driver took for the captured epoch graphs.
    pub fn graph_bytes(&self) -> usize {
        self.graph_bytes
    }

    /// Bytes of the arena.
    pub fn arena_bytes(&self) -> usize {
        self.arena.len()
    }

    /// Graph nodes per step (kernel launches).
    pub fn launches_per_step(&self) -> usize {
        let backward: usize = match self.groups.iter().position(|g| g.layer.is_some()) {
            Some(first) => (first..self.groups.len())
                .map(|i| match self.groups[i].op {
                    Op::Conv { .. } => 2 + (i > first) as usize,
                    _ => 1,
                })
                .sum(),
            None => 0,
        };
        self.groups.len() + !self.fused_loss as usize + backward + 1
    }

    /// Swaps each dense group's own kernels in for the generic ones: where its module has compiled, or,
    /// with `wait`, once it has (compiling it here where nothing started it). The epoch's graph is captured
    /// again at its next launch.
    fn adopt_own_kernels(&mut self, wait: bool) -> Result<()> {
        let mut i = 0;
        while i < self.pending.len() {
            let ready = self.pending[i].compiling.as_ref().map_or(wait, |c| wait || c.is_finished());
            if !ready {
                i += 1;
                continue;
            }
            let PendingModule { group, request, fused_loss, compiling } = self.pending.swap_remove(i);
            let cubin = match compiling {
                Some(thread) => thread.join().map_err(|_| anyhow::anyhow!("internal: a kernel compile panicked"))?,
                None => crate::device::compile::compile_request(&request, self.gpu.compute_capability),
            }?;
            let module = self.gpu.module_from_cubin(&request, cubin)?;
            let (kernels, fused) = dense_kernels(&self.gpu, &module, &self.groups[group].op, fused_loss, false)?;
            self.kernels[group] = kernels;
            if let Some((kernel, shared)) = fused {
                (self.loss_kernel, self.loss_shared) = (kernel, shared);
            }
            self.captured = None;
            let what =
                format!("{}: its own kernels from epoch {}", dense_name(&self.groups[group].op), self.epochs + 1);
            phases::note(Instant::now(), &what);
        }
        Ok(())
    }

    /// Runs every dense group on its own kernels from here on, compiling them first where need be.
    pub fn use_own_kernels(&mut self) -> Result<()> {
        self.adopt_own_kernels(true)
    }

    /// Captures (once per epoch size and batch) the epoch's graph.
    fn prepare_epoch(&mut self, samples: usize, batch: usize) -> Result<()> {
        if matches!(&self.captured, Some(c) if c.samples == samples && c.batch == batch) {
            return Ok(());
        }
        self.captured = None;
        self.synchronize()?;
        let free_before = free_device_bytes();
        let stream = self.gpu.stream.clone();
        let graph = crate::device::launch::capture_graph(&stream, self, |t| t.enqueue_epoch(samples, batch))?;
        graph.upload()?;
        self.synchronize()?;
        // The driver's memory for the graph itself, once per capture: not counted as training's.
        let graph_bytes = free_before.saturating_sub(free_device_bytes());
        self.graph_bytes += graph_bytes;
        self.free_after_setup = self.free_after_setup.saturating_sub(graph_bytes);
        self.captured = Some(CapturedEpoch { samples, batch, graph });
        Ok(())
    }

    /// Runs one epoch over the uploaded order and rates, without reading anything back: the whole-epoch
    /// kernel where the trainer has it for this batch, else the epoch's graph.
    pub fn launch_epoch(&mut self, samples: usize, batch: usize) -> Result<()> {
        if let Some(w) = self.whole_epoch.as_ref().filter(|w| w.batch == batch) {
            return self.launch_whole_epoch(w, samples);
        }
        self.prepare_epoch(samples, batch)?;
        self.captured.as_ref().expect("prepared").graph.launch().context("replaying the epoch's graph")?;
        Ok(())
    }

    fn launch_whole_epoch(&self, w: &WholeEpoch, samples: usize) -> Result<()> {
        let data = &self.splits[0];
        let (classes, values) = match self.loss {
            Loss::Ce => (self.ptr(data.target), Arg::Ptr(0)),
            Loss::Mse => (Arg::Ptr(0), self.ptr(data.target)),
        };
        let args = [
            self.ptr(data.x),
            classes,
            values,
            self.ptr(self.order),
            Arg::i32(samples as i32),
            self.ptr(self.lr),
            self.ptr(self.params),
            self.ptr(self.grad),
            self.ptr(self.m),
            self.ptr(self.v),
            self.step_ptr(),
            self.ptr(self.losses),
            self.ptr(w.dropout),
            Arg::i32(w.shared_floats as i32),
        ];
        let settings = StructArg::of(&self.optim.kernel_settings());
        self.gpu.launch_with_struct(&w.kernel, ((1, 1), (4 * w.shared_floats) as u32, false), &settings, &args)
    }

    /// How this trainer runs an epoch of `batch`.
    pub fn path(&self, batch: usize) -> StepPath {
        if self.whole_epoch.as_ref().is_some_and(|w| w.batch == batch) {
            StepPath::WholeEpoch
        } else {
            StepPath::Layers
        }
    }

    /// The dropout key of the next step, as the CPU reference computes it.
    pub fn dropout_key(&self) -> Result<DropoutKey> {
        let step = self.download(self.counters, 1)?[0].to_bits();
        Ok(DropoutKey { seed: self.dropout_seed, step })
    }
}

/// Dropout's (layer seed, threshold, scale) for a group's dropout, off (0, 0, 1) without one or when not
/// `training`.
fn dropout_values(seed: u32, dropout: Option<(usize, f32)>, training: bool) -> (u32, u32, f32) {
    match dropout {
        Some((layer, p)) if training && p > 0.0 => (site_seed(seed, layer), dropout_threshold(p), dropout_scale(p)),
        _ => (0, 0, 1.0),
    }
}

/// Per group, whether its weight gradient runs on a side stream: a conv's (its ∂x is a kernel of its own),
/// or a dense group's whose backward grid forms no ∂x.
pub fn weights_beside(groups: &[Group], fused_loss: bool) -> Vec<bool> {
    (0..groups.len())
        .map(|i| match groups[i].op {
            Op::Dense { .. } => groups[i].layer.is_some() && !wants_dx(groups, fused_loss, i),
            Op::Conv { .. } => true,
            _ => false,
        })
        .collect()
}

/// Whether group `i`'s backward forms ∂x: a group after the first with parameters, unless it is a last
/// layer that forms the loss (which wrote the layer before's ∂x in its forward).
fn wants_dx(groups: &[Group], fused_loss: bool, i: usize) -> bool {
    let first = groups.iter().position(|g| g.layer.is_some());
    first.is_some_and(|f| i > f) && !(fused_loss && i + 1 == groups.len())
}

impl Trainer for GpuTrainer {
    type Params = Vec<f32>;
    type Evaluation = (f64, Vec<f32>);

    fn train_epoch(
        &mut self,
        order: &[u32],
        batch: usize,
        lr: &[f32],
        progress: &mut dyn FnMut(usize, f64),
    ) -> Result<f64> {
        let rows = self.splits[0].rows;
        if batch == 0 || batch > self.capacity {
            bail!("internal: batch {batch} for a trainer built for up to {}", self.capacity);
        }
        if order.len() > rows {
            bail!("internal: an order of {} samples for a split of {rows}", order.len());
        }
        if let Some(&bad) = order.iter().find(|&&i| i as usize >= rows) {
            bail!("sample index {bad} is outside the training split ({rows} samples)");
        }
        if lr.len() != order.len().div_ceil(batch) {
            bail!("internal: {} rates for {} steps", lr.len(), order.len().div_ceil(batch));
        }
        if order.is_empty() {
            return Ok(0.0);
        }
        self.adopt_own_kernels(false)?;
        self.epochs += 1;
        self.set_epoch(order, lr)?;
        self.launch_epoch(order.len(), batch)?;
        let losses = self.download(self.losses, order.len())?;
        let loss = losses.iter().map(|&l| l as f64).sum();
        progress(order.len(), loss);
        Ok(loss)
    }

    fn evaluate(&mut self, split: usize) -> Result<(f64, Vec<f32>)> {
        let rows = self.splits.get(split).map(|s| s.rows).context("internal: no such split")?;
        let outputs = self.net.outputs();
        let last = self.buffers.last().expect("a network has a group").y;
        let (mut sum, mut out) = (0.0, Vec::with_capacity(rows * outputs));
        let mut first = 0;
        while first < rows {
            let b = self.capacity.min(rows - first);
            self.launch_forward(split, first, b, false)?;
            self.launch_loss(split, first, b, false, 0)?;
            sum += self.download(self.losses, b)?.iter().map(|&l| l as f64).sum::<f64>();
            out.extend(self.download(last, b * outputs)?);
            first += b;
        }
        Ok((sum, out))
    }

    fn params(&mut self) -> Result<Vec<f32>> {
        self.download(self.params, self.net.param_count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::compile::kernel_constants;
    use crate::nn::stack::spec;

    fn net(layers: &str, input: Shape) -> Network {
        Network::new(&spec::parse(layers).unwrap(), input).unwrap()
    }

    #[test]
    fn activations_and_dropout_fuse_into_the_layer_before_and_flatten_is_a_view() {
        let mlp = plan(&net("Linear(784, 128), ReLU, Dropout(0.1), Linear(10)", Shape::Flat(784)));
        let dense = |inputs, outputs, act, dropout| Op::Dense { inputs, outputs, bias: true, act, dropout };
        assert_eq!(
            mlp.iter().map(|g| (g.op, g.layer, g.out_size)).collect::<Vec<_>>(),
            [(dense(784, 128, 0, Some((2, 0.1))), Some(0), 128), (dense(128, 10, -1, None), Some(3), 10)]
        );
        assert!(fuses_loss(&mlp));
        // Dropout before the activation stays on the Linear; the activation after it stands alone.
        let odd = plan(&net("Linear(4, 8), Dropout(0.5), ReLU, Linear(70)", Shape::Flat(4)));
        assert_eq!(odd[0].op, dense(4, 8, -1, Some((1, 0.5))));
        assert_eq!(odd[1].op, Op::Pointwise { size: 8, act: 0, dropout: None });
        assert!(!fuses_loss(&odd), "70 outputs are more than one block of the fused loss holds");
        let image = Shape::Image { channels: 1, height: 28, width: 28 };
        let cnn = plan(&net("Conv2d(1, 8, 3, padding=1), ReLU, MaxPool2d(2), Flatten, Linear(10)", image));
        let kinds: Vec<_> = cnn.iter().map(|g| (std::mem::discriminant(&g.op), g.out_size)).collect();
        let conv = std::mem::discriminant(&Op::Conv {
            input: (1, 1, 1),
            outputs: 1,
            kernel: 1,
            stride: 1,
            padding: 0,
            act: 0,
        });
        let pool = std::mem::discriminant(&Op::Pool { input: (1, 1, 1), k: 1 });
        let linear = std::mem::discriminant(&dense(1, 1, 0, None));
        assert_eq!(kinds, [(conv, 8 * 28 * 28), (pool, 8 * 14 * 14), (linear, 10)]);
    }

    #[test]
    fn a_fused_loss_needs_no_loss_module_and_an_unfused_one_does() {
        let fused = modules(&net("Linear(5, 3), Tanh, Linear(2)", Shape::Flat(5)), Loss::Mse);
        assert!(fused.iter().all(|(_, d)| !d.contains(&("FIT_OP", 5))));
        assert!(fused[1].1.contains(&("FIT_LOSS", 1)));
        let unfused = modules(&net("Linear(5, 3), Tanh, Linear(2), Sigmoid", Shape::Flat(5)), Loss::Mse);
        assert!(unfused.iter().any(|(_, d)| d == &vec![("FIT_OP", 5), ("FIT_OUT", 2), ("FIT_LOSS", 1)]));
        assert_eq!(unfused.last(), Some(&update_module()));
    }

    #[test]
    fn weight_gradients_that_no_input_gradient_waits_for_run_beside() {
        let beside = |layers: &str, input: Shape| {
            let n = net(layers, input);
            let groups = plan(&n);
            weights_beside(&groups, fuses_loss(&groups))
        };
        // The MLP: the first layer forms no ∂x, the last formed it in the loss kernel.
        assert_eq!(beside("Linear(784, 128), ReLU, Linear(128, 10)", Shape::Flat(784)), [true, true]);
        assert_eq!(beside("Linear(512), ReLU, Linear(256), ReLU, Linear(10)", Shape::Flat(784)), [true, false, true]);
        let image = Shape::Image { channels: 1, height: 28, width: 28 };
        let cnn = "Conv2d(1,8,3,padding=1), ReLU, MaxPool2d(2), Conv2d(8,16,3,padding=1), ReLU, MaxPool2d(2), Flatten, Linear(64), ReLU, Linear(10)";
        assert_eq!(beside(cnn, image), [true, false, true, false, false, true]);
        // An unfused loss (an activation after the last layer): that layer forms its ∂x itself.
        assert_eq!(beside("Linear(8), Tanh, Linear(3), Sigmoid", Shape::Flat(5)), [true, false]);
    }

    #[test]
    fn the_whole_epoch_kernel_takes_small_dense_chains_only() {
        let plan_of = |layers: &str, inputs: usize, batch: usize| {
            let n = net(layers, Shape::Flat(inputs));
            whole_epoch_plan(&n, &plan(&n), Loss::Mse, batch)
        };
        assert!(plan_of("Linear(32), ReLU, Linear(1)", 19, 64).is_some(), "the sales shape");
        assert!(plan_of("Linear(32), ReLU, Linear(1)", 19, WHOLE_EPOCH_BATCH + 1).is_none(), "batch");
        assert!(plan_of("Linear(128), ReLU, Linear(10)", 784, 64).is_none(), "the MNIST MLP's weights");
        assert!(
            plan_of("Linear(4), ReLU, Linear(4), ReLU, Linear(4), ReLU, Linear(4), ReLU, Linear(1)", 3, 8).is_none()
        );
        assert!(plan_of("ReLU, Linear(1)", 3, 8).is_none(), "a lone activation");
        let conv = net("Conv2d(1, 2, 3), Flatten, Linear(1)", Shape::Image { channels: 1, height: 5, width: 5 });
        assert!(whole_epoch_plan(&conv, &plan(&conv), Loss::Mse, 8).is_none());
    }

    #[test]
    fn whole_epoch_sizes_match_the_kernel_file() {
        for (layers, inputs, loss, batch) in [
            ("Linear(32), ReLU, Linear(1)", 19, Loss::Mse, 64),
            ("Linear(6, 40), Tanh, Dropout(0.3), Linear(8, bias=false), Sigmoid, Linear(2)", 6, Loss::Mse, 4),
            ("Linear(20, 33), GELU, Linear(33, 7), ReLU, Dropout(0.5), Linear(5)", 20, Loss::Ce, 256),
            ("Linear(50, 3)", 50, Loss::Ce, 8),
        ] {
            let n = net(layers, Shape::Flat(inputs));
            let p = whole_epoch_plan(&n, &plan(&n), loss, batch).unwrap_or_else(|| panic!("{layers}: no plan"));
            let (_, defines) = whole_epoch_module(&p, loss, batch);
            let rows = p.codes.iter().enumerate().map(|(l, &c)| {
                let (i, o) = ((c & 0xffff) as usize, (c >> 16 & 0xffff) as usize);
                1 + (l == 0 && p.codes.len() > 1 && i < 5 * o) as i64
            });
            // (1 + …: a constant of 0 has no initializer in the PTX.)
            let expressions: Vec<String> = (0..p.codes.len()).map(|l| format!("1 + Dense<{l}>::ROWS")).collect();
            let mut asked = vec!["SMEM_FLOATS", "P", "LAYERS", "PAIR"];
            asked.extend(expressions.iter().map(String::as_str));
            let mut host = vec![p.shared_floats as i64, n.param_count as i64, p.codes.len() as i64, p.pair as i64];
            host.extend(rows);
            assert_eq!(kernel_constants("fit", &defines, &asked).unwrap(), host, "{layers}");
        }
    }

    #[test]
    fn the_generic_dense_sizes_match_the_kernel_file() {
        crate::device::kernel_struct::assert_kernel_layout::<DenseDims>("fit", &generic_dense_module().1);
    }

    #[test]
    fn sizes_match_the_kernel_file() {
        let dense =
            [("FIT_OP", 1), ("FIT_IN", 784), ("FIT_OUT", 10), ("FIT_ACT", -1), ("FIT_BIAS", 1), ("FIT_DROP", 0)];
        let names =
            ["FWD_BM", "FWD_BN", "FWD_BK", "FWD_TM", "FWD_TN", "BWD_BM", "BWD_BN", "BWD_BK", "BWD_TM", "BWD_TN"];
        let (f, b) = (FORWARD_TILE, BACKWARD_TILE);
        let host = [f.0, f.1, f.2, f.3, f.4, b.0, b.1, b.2, b.3, b.4].map(|v| v as i64);
        assert_eq!(kernel_constants("fit", &dense, &names).unwrap(), host);
        assert_eq!(kernel_constants("fit", &dense, &["LOSS_BK"]).unwrap(), [LOSS_DEPTH as i64]);
        for outputs in [1, 10, 33, 64] {
            let mut defines = dense.to_vec();
            defines[2] = ("FIT_OUT", outputs);
            defines.push(("FIT_LOSS", 0));
            let bn = (outputs as usize).next_power_of_two().max(8) as i64;
            assert_eq!(
                kernel_constants("fit", &defines, &["LOSS_BN", "LOSS_TN"]).unwrap(),
                [bn, if bn == 64 { 2 } else { 1 }]
            );
        }
        for (side, padding) in [(28, 1), (14, 1), (5, 0)] {
            let conv = [("FIT_OP", 2), ("FIT_CIN", 3), ("FIT_H", side), ("FIT_W", side), ("FIT_COUT", 4), ("FIT_K", 3)];
            let conv = [&conv[..], &[("FIT_S", 1), ("FIT_P", padding), ("FIT_ACT", 0)]].concat();
            let [positions, samples] = kernel_constants("fit", &conv, &["OH * OW", "SAMPLES"]).unwrap()[..] else {
                panic!("two constants asked for")
            };
            assert_eq!(samples, conv_samples_per_run(positions as usize) as i64, "side {side}");
        }
    }
}
