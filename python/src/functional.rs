//! The functions of `textnet.nn.functional` and of the package's top level that take tensors (`cat`,
//! `clip_grad_norm`), `no_grad`, the seeded draws (`manual_seed`, `randn`, the layers' initial
//! parameters, dropout's masks) and the optimizer over parameter groups.

use crate::errors::nn_error;
use crate::tensor::{
    Data, Float, HostIds, PyTensor, by_dtype, dtypes_differ, float_op, float_pair_op, ids_of_f64, not_float,
};
use numpy::{IntoPyArray, PyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rand::{RngExt, SeedableRng};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};
use textnet::nn::{self, Module, Optimizer, ParamGroup, Tensor};
use textnet::ops::cpu::{SeededRng, linear_init};
use textnet::ops::optim::{OptimConfig, OptimKind};

/// The generator of `randn`, the layers' initial parameters and dropout's masks (`manual_seed` reseeds
/// it); seeded 0 until then.
fn rng() -> MutexGuard<'static, SeededRng> {
    static RNG: LazyLock<Mutex<SeededRng>> = LazyLock::new(|| Mutex::new(SeededRng::seed_from_u64(0)));
    RNG.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reseeds the generator of `randn`, the initial parameters and `dropout`'s masks, and the seed of the
/// dropout layers made from now on (`layers`).
#[pyfunction]
pub(crate) fn manual_seed(seed: u64) {
    *rng() = SeededRng::seed_from_u64(seed);
    crate::layers::reseed_sites(seed);
}

/// `count` draws of N(0, 1), in f32.
#[pyfunction]
pub(crate) fn normal_draws(py: Python<'_>, count: usize) -> Bound<'_, PyArray1<f32>> {
    use rand_distr::{Distribution, StandardNormal};
    let mut rng = rng();
    let values: Vec<f32> = (0..count).map(|_| StandardNormal.sample(&mut *rng)).collect();
    values.into_pyarray(py)
}

/// `count` draws of U(0, 1), in f64 (`multinomial`'s).
#[pyfunction]
pub(crate) fn uniform_draws(py: Python<'_>, count: usize) -> Bound<'_, PyArray1<f64>> {
    let mut rng = rng();
    let values: Vec<f64> = (0..count).map(|_| rng.random::<f64>()).collect();
    values.into_pyarray(py)
}

/// `count` draws as PyTorch initialises a layer of fan-in `fan_in` (`nn.Linear`'s weight and bias):
/// U(−1/√fan_in, 1/√fan_in), in f32.
#[pyfunction]
pub(crate) fn uniform_init(py: Python<'_>, count: usize, fan_in: usize) -> Bound<'_, PyArray1<f32>> {
    let mut values = vec![0f32; count];
    linear_init(&mut values, fan_in, &mut rng());
    values.into_pyarray(py)
}

/// While entered, ops on this thread record no graph (`textnet.no_grad()`).
#[pyclass(name = "NoGrad", module = "textnet._native", unsendable)]
pub(crate) struct NoGrad {
    guards: Vec<nn::NoGradGuard>,
}

#[pymethods]
impl NoGrad {
    #[new]
    fn new() -> Self {
        NoGrad { guards: Vec::new() }
    }

    fn __enter__(&mut self) {
        self.guards.push(nn::no_grad());
    }

    fn __exit__(&mut self, _kind: &Bound<'_, PyAny>, _value: &Bound<'_, PyAny>, _traceback: &Bound<'_, PyAny>) -> bool {
        self.guards.pop();
        false
    }
}

/// Whether ops on this thread record their graph now.
#[pyfunction]
pub(crate) fn is_grad_enabled() -> bool {
    nn::is_grad_enabled()
}

/// `data` as a tensor of `F`, the dtype of `first` (the op's first operand), or the error naming both.
fn operand<'a, F: Float>(op: &str, first: &Data, data: &'a Data) -> PyResult<&'a Tensor<F>> {
    F::of(data).ok_or_else(|| dtypes_differ(op, first, data))
}

/// The tensors of `list`, every one of `F`.
fn operands<'a, F: Float>(op: &str, list: &'a [PyRef<'_, PyTensor>]) -> PyResult<Vec<&'a Tensor<F>>> {
    list.iter().map(|t| operand::<F>(op, &list[0].data, &t.data)).collect()
}

/// The ids of an int64 tensor, on the host (read back from the GPU), with their shape.
fn ids_of(op: &str, data: &Data) -> PyResult<HostIds> {
    data.host_ids()?.ok_or_else(|| {
        PyValueError::new_err(format!(
            "{op}: the ids must be int64, got {} of shape {:?}",
            if matches!(data, Data::F32(_)) { "float32" } else { "float64" },
            data.shape()
        ))
    })
}

/// `tensors` joined along `dim`: floats of one dtype, or int64 ids all on the host or all on the GPU.
#[pyfunction]
#[pyo3(signature = (tensors, dim = 0))]
pub(crate) fn cat(tensors: Vec<PyRef<'_, PyTensor>>, dim: isize) -> PyResult<PyTensor> {
    let Some(first) = tensors.first() else { return Err(PyValueError::new_err("cat: no tensors to join")) };
    let differ = |t: &PyRef<'_, PyTensor>| dtypes_differ("cat", &first.data, &t.data);
    match &first.data {
        Data::DeviceIds(_) => {
            let list: Vec<&Tensor<f32>> = (tensors.iter())
                .map(|t| if let Data::DeviceIds(ids) = &t.data { Ok(ids) } else { Err(differ(t)) })
                .collect::<PyResult<_>>()?;
            return nn::cat(&list, dim).map(|t| PyTensor::of(Data::DeviceIds(t))).map_err(nn_error);
        }
        Data::Ids { .. } => {
            let list: Vec<Tensor<f64>> = (tensors.iter())
                .map(|t| match &t.data {
                    Data::Ids { values, shape } => {
                        Tensor::from_vec(values.iter().map(|&v| v as f64).collect(), shape).map_err(nn_error)
                    }
                    _ => Err(differ(t)),
                })
                .collect::<PyResult<_>>()?;
            let joined = nn::cat(&list.iter().collect::<Vec<_>>(), dim).map_err(nn_error)?;
            return Ok(PyTensor::of(ids_of_f64(&joined)));
        }
        Data::F32(_) | Data::F64(_) => {}
    }
    by_dtype!("cat", &first.data, F => {
        let list = operands::<F>("cat", &tensors)?;
        nn::cat(&list, dim).map(|t| PyTensor::of(F::wrap(t))).map_err(nn_error)
    })
}

/// y = x·wᵀ + b.
#[pyfunction]
#[pyo3(signature = (input, weight, bias = None))]
pub(crate) fn linear(
    py: Python<'_>,
    input: PyRef<'_, PyTensor>,
    weight: PyRef<'_, PyTensor>,
    bias: Option<PyRef<'_, PyTensor>>,
) -> PyResult<PyTensor> {
    let x = &input.data;
    by_dtype!("linear", x, F => {
        let w = operand::<F>("linear", x, &weight.data)?;
        let b = bias.as_ref().map(|b| operand::<F>("linear", x, &b.data)).transpose()?;
        let x = operand::<F>("linear", x, x)?;
        py.detach(|| nn::linear(x, w, b)).map(|t| PyTensor::of(F::wrap(t))).map_err(nn_error)
    })
}

/// LayerNorm over the last axis.
#[pyfunction]
#[pyo3(signature = (input, weight = None, bias = None, eps = 1e-5))]
pub(crate) fn layer_norm(
    input: PyRef<'_, PyTensor>,
    weight: Option<PyRef<'_, PyTensor>>,
    bias: Option<PyRef<'_, PyTensor>>,
    eps: f64,
) -> PyResult<PyTensor> {
    let x = &input.data;
    by_dtype!("layer_norm", x, F => {
        let w = weight.as_ref().map(|w| operand::<F>("layer_norm", x, &w.data)).transpose()?;
        let b = bias.as_ref().map(|b| operand::<F>("layer_norm", x, &b.data)).transpose()?;
        let x = operand::<F>("layer_norm", x, x)?;
        nn::layer_norm(x, w, b, eps).map(|t| PyTensor::of(F::wrap(t))).map_err(nn_error)
    })
}

/// The rows of `weight` at the int64 `ids`.
#[pyfunction]
#[pyo3(signature = (ids, weight, padding_idx = None))]
pub(crate) fn embedding(
    ids: PyRef<'_, PyTensor>,
    weight: PyRef<'_, PyTensor>,
    padding_idx: Option<i64>,
) -> PyResult<PyTensor> {
    if let (Data::DeviceIds(ids), Data::F32(w)) = (&ids.data, &weight.data)
        && w.is_on_device()
        && w.is_leaf()
    {
        // The layer reads the ids where they are (a captured step reads each replay's); it marks its
        // weight as needing a gradient, which a frozen weight keeps from needing.
        let frozen = !w.requires_grad();
        let looked_up = nn::Embedding::from_parameters(w.clone(), padding_idx).and_then(|layer| layer.forward(ids));
        if frozen {
            w.set_requires_grad(false).map_err(nn_error)?;
        }
        return looked_up.map(|t| PyTensor::of(Data::F32(t))).map_err(nn_error);
    }
    let (values, shape) = ids_of("embedding", &ids.data)?;
    float_op!("embedding", &weight.data, |w| nn::embedding(w, &values, &shape, padding_idx)).map(PyTensor::of)
}

/// The mean cross-entropy of `logits` (`[N, C]`, `[C]`, or `[N, C, d1, …]`: classes on axis 1, as
/// PyTorch's) against int64 `targets` (the logits' shape without the class axis); targets equal to
/// `ignore_index` count for nothing.
#[pyfunction]
#[pyo3(signature = (logits, targets, ignore_index = -100))]
pub(crate) fn cross_entropy(
    py: Python<'_>,
    logits: PyRef<'_, PyTensor>,
    targets: PyRef<'_, PyTensor>,
    ignore_index: i64,
) -> PyResult<PyTensor> {
    const OP: &str = "cross_entropy";
    let ids_shape = match &targets.data {
        Data::Ids { shape, .. } => shape.clone(),
        Data::DeviceIds(t) => t.shape().to_vec(),
        floats => ids_of(OP, floats)?.1,
    };
    let shape = logits.data.shape();
    let class_axis = usize::from(shape.len() > 1);
    let mut expected = shape.to_vec();
    if !expected.is_empty() {
        expected.remove(class_axis);
    }
    if shape.is_empty() || expected != ids_shape {
        return Err(PyValueError::new_err(format!(
            "{OP}: shapes {shape:?} and {ids_shape:?} do not match: the targets must have the logits' shape \
             without its class axis (axis {class_axis})"
        )));
    }
    // Classes last, as nn's cross_entropy takes them.
    let axes: Vec<isize> =
        (0..shape.len()).filter(|&a| a != class_axis).chain([class_axis]).map(|a| a as isize).collect();
    if let (Data::F32(x), Data::DeviceIds(ids)) = (&logits.data, &targets.data)
        && x.is_on_device()
    {
        // The ids stay on the GPU (a captured step reads each replay's).
        let rows = if shape.len() > 2 { x.permute(&axes) } else { Ok(x.clone()) };
        let flat = ids.reshape(&[ids.numel()]);
        let loss = rows.and_then(|rows| flat.and_then(|flat| rows.cross_entropy_ids(&flat, Some(ignore_index))));
        return loss.map(|t| PyTensor::of(Data::F32(t))).map_err(nn_error);
    }
    let (ids, _) = ids_of(OP, &targets.data)?;
    float_op!(OP, &logits.data, |x| {
        let rows = if shape.len() > 2 { x.permute(&axes) } else { Ok(x.clone()) };
        rows.and_then(|rows| py.detach(|| rows.cross_entropy(&ids, Some(ignore_index))))
    })
    .map(PyTensor::of)
}

/// The mean squared error between `input` and `target`, of one shape.
#[pyfunction]
pub(crate) fn mse_loss(input: PyRef<'_, PyTensor>, target: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
    float_pair_op!("mse_loss", &input.data, &target.data, |x, y| x.mse(y)).map(PyTensor::of)
}

/// `input` with dropout of probability `p` when `training`, its mask drawn from the seeded generator on the
/// host: a captured step would replay the mask it recorded (`nn.Dropout`, the engine's layer, does not).
#[pyfunction]
#[pyo3(signature = (input, p = 0.5, training = true))]
pub(crate) fn dropout(input: PyRef<'_, PyTensor>, p: f32, training: bool) -> PyResult<PyTensor> {
    let seed = rng().random::<u32>();
    float_op!("dropout", &input.data, |x| nn::dropout(x, p, training, seed, 0, 0)).map(PyTensor::of)
}

/// The 2-D convolution of `input` `[N, C, H, W]` by `weight` `[O, C, KH, KW]` plus `bias` `[O]`: windows
/// `stride` apart over the input padded by `padding` zeros on every side.
#[pyfunction]
#[pyo3(signature = (input, weight, bias = None, stride = 1, padding = 0))]
pub(crate) fn conv2d(
    py: Python<'_>,
    input: PyRef<'_, PyTensor>,
    weight: PyRef<'_, PyTensor>,
    bias: Option<PyRef<'_, PyTensor>>,
    stride: usize,
    padding: usize,
) -> PyResult<PyTensor> {
    let x = &input.data;
    by_dtype!("conv2d", x, F => {
        let w = operand::<F>("conv2d", x, &weight.data)?;
        let b = bias.as_ref().map(|b| operand::<F>("conv2d", x, &b.data)).transpose()?;
        let x = operand::<F>("conv2d", x, x)?;
        py.detach(|| nn::conv2d(x, w, b, stride, padding)).map(|t| PyTensor::of(F::wrap(t))).map_err(nn_error)
    })
}

/// The max over each `kernel_size`×`kernel_size` window of `input` `[N, C, H, W]`, windows `stride` apart
/// over the input padded by `padding` (at most half the window) with −∞.
#[pyfunction]
pub(crate) fn max_pool2d(
    py: Python<'_>,
    input: PyRef<'_, PyTensor>,
    kernel_size: usize,
    stride: usize,
    padding: usize,
) -> PyResult<PyTensor> {
    float_op!("max_pool2d", &input.data, |x| py.detach(|| nn::max_pool2d(x, kernel_size, stride, padding)))
        .map(PyTensor::of)
}

/// softmax(q·kᵀ/√D)·v over `[B, H, T, D]` tensors, causal when `is_causal`.
#[pyfunction]
#[pyo3(signature = (query, key, value, is_causal = false))]
pub(crate) fn scaled_dot_product_attention(
    py: Python<'_>,
    query: PyRef<'_, PyTensor>,
    key: PyRef<'_, PyTensor>,
    value: PyRef<'_, PyTensor>,
    is_causal: bool,
) -> PyResult<PyTensor> {
    const OP: &str = "scaled_dot_product_attention";
    let q = &query.data;
    by_dtype!(OP, q, F => {
        let k = operand::<F>(OP, q, &key.data)?;
        let v = operand::<F>(OP, q, &value.data)?;
        let q = operand::<F>(OP, q, q)?;
        py.detach(|| nn::scaled_dot_product_attention(q, k, v, is_causal))
            .map(|t| PyTensor::of(F::wrap(t)))
            .map_err(nn_error)
    })
}

/// Scales the gradients of `parameters` in place so that their global L2 norm is at most `max_norm`;
/// returns the norm before.
#[pyfunction]
pub(crate) fn clip_grad_norm(parameters: Vec<PyRef<'_, PyTensor>>, max_norm: f64) -> PyResult<PyTensor> {
    let Some(first) = parameters.first() else { return Err(PyValueError::new_err("clip_grad_norm_: no parameters")) };
    by_dtype!("clip_grad_norm_", &first.data, F => {
        let list: Vec<Tensor<F>> = operands::<F>("clip_grad_norm_", &parameters)?.into_iter().cloned().collect();
        let max_norm = max_norm as F;
        nn::clip_grad_norm(&list, max_norm).map(|t| PyTensor::of(F::wrap(t))).map_err(nn_error)
    })
}

enum Steps {
    F32(Optimizer<f32>),
    F64(Optimizer<f64>),
}

/// SGD (with momentum when `momentum` > 0), Adam or AdamW over parameter groups, each with its own rate
/// and weight decay; β and ε are the optimizer's.
///
/// The groups' rates are a base rate (the first nonzero one) times a factor per group: the base lives on
/// the GPU, where a captured step's replays read it, so a schedule that changes every rate alike (the
/// usual one) reaches them; a change of the factors needs the step captured again.
#[pyclass(name = "Optimizer", module = "textnet._native")]
pub(crate) struct PyOptimizer {
    steps: Steps,
    /// The base rate and each group's factor now.
    base_lr: f32,
    scales: Vec<f32>,
}

/// Sets `optimizer`'s base rate and group factors to `base_lr` and `scales` where they differ from
/// `now`'s (setting the base rate writes it to the GPU, which a step being captured cannot do).
fn set_rates<F: Float>(
    optimizer: &mut Optimizer<F>,
    now: (f32, &[f32]),
    base_lr: f32,
    scales: &[f32],
) -> nn::Result<()> {
    if base_lr != now.0 {
        optimizer.set_lr(base_lr)?;
    }
    for (group, (&scale, &was)) in scales.iter().zip(now.1).enumerate() {
        if scale != was {
            optimizer.set_lr_scale(group, scale)?;
        }
    }
    Ok(())
}

/// The tensors of each group of `groups`, every one of `F` (the dtype of the first parameter, whose
/// dtype any other must share).
fn group_tensors<'a, 'py: 'a, F: Float>(
    op: &str,
    groups: impl Iterator<Item = &'a [PyRef<'py, PyTensor>]> + Clone,
) -> PyResult<Vec<Vec<Tensor<F>>>> {
    let first = groups.clone().flat_map(|params| params.first()).next();
    (groups.map(|params| {
        params.iter().map(|p| operand::<F>(op, first.map_or(&p.data, |f| &f.data), &p.data).cloned()).collect()
    }))
    .collect()
}

fn optimizer<F: Float>(config: OptimConfig, groups: &[(Vec<PyRef<'_, PyTensor>>, f32, f32)]) -> PyResult<Optimizer<F>> {
    let tensors = group_tensors::<F>(config.kind.name(), groups.iter().map(|(params, ..)| params.as_slice()))?;
    let made = (tensors.into_iter().zip(groups))
        .map(|(tensors, (_, lr, weight_decay))| {
            ParamGroup::new(tensors).with_weight_decay(*weight_decay).with_lr_scale(*lr)
        })
        .collect();
    Optimizer::new(config, made).map_err(nn_error)
}

#[pymethods]
impl PyOptimizer {
    /// `kind` "sgd", "adam" or "adamw"; `groups` of (parameters, lr, weight decay).
    #[new]
    #[pyo3(signature = (kind, groups, momentum = 0.0, betas = (0.9, 0.999), eps = 1e-8))]
    fn new(
        kind: &str,
        groups: Vec<(Vec<PyRef<'_, PyTensor>>, f32, f32)>,
        momentum: f32,
        betas: (f32, f32),
        eps: f32,
    ) -> PyResult<Self> {
        let kind = match kind {
            "sgd" if momentum > 0.0 => OptimKind::Momentum,
            "sgd" => OptimKind::Sgd,
            "adam" => OptimKind::Adam,
            "adamw" => OptimKind::AdamW,
            other => return Err(PyValueError::new_err(format!("optimizer: no kind {other:?} (sgd, adam, adamw)"))),
        };
        // Each group's rate is its lr scale at a base rate of 1, so that every group's rate can be set.
        let config = OptimConfig { lr: 1.0, momentum, beta1: betas.0, beta2: betas.1, eps, ..OptimConfig::new(kind) };
        let first = groups.iter().flat_map(|(params, ..)| params.first()).next();
        let steps = match first.map(|p| &p.data) {
            Some(Data::F64(_)) => Steps::F64(optimizer(config, &groups)?),
            Some(ids @ (Data::Ids { .. } | Data::DeviceIds(_))) => return Err(not_float(kind.name(), ids)),
            _ => Steps::F32(optimizer(config, &groups)?),
        };
        let scales = groups.iter().map(|(_, lr, _)| *lr).collect();
        Ok(PyOptimizer { steps, base_lr: 1.0, scales })
    }

    /// Sets group `i`'s rate to `lrs[i]` for the next steps; returns whether the groups' factors changed
    /// (not only the base rate), which a captured step does not see.
    fn set_lrs(&mut self, lrs: Vec<f32>) -> PyResult<bool> {
        if lrs.len() != self.scales.len() {
            let (given, groups) = (lrs.len(), self.scales.len());
            return Err(PyValueError::new_err(format!("optimizer: {given} rates for {groups} parameter groups")));
        }
        // All rates zero: the factors stay, at a base rate of 0.
        let base_lr = lrs.iter().copied().find(|&lr| lr != 0.0).unwrap_or(0.0);
        let scales: Vec<f32> =
            if base_lr == 0.0 { self.scales.clone() } else { lrs.iter().map(|&lr| lr / base_lr).collect() };
        let now = (self.base_lr, self.scales.as_slice());
        match &mut self.steps {
            Steps::F32(optimizer) => set_rates(optimizer, now, base_lr, &scales),
            Steps::F64(optimizer) => set_rates(optimizer, now, base_lr, &scales),
        }
        .map_err(nn_error)?;
        let changed = scales != self.scales;
        (self.base_lr, self.scales) = (base_lr, scales);
        Ok(changed)
    }

    /// This optimizer (rates, every parameter's state) over `groups`, the copies of its parameters, one
    /// list per group: `copy.deepcopy` of a `textnet.optim` optimizer.
    fn deep_copy_onto(&self, groups: Vec<Vec<PyRef<'_, PyTensor>>>) -> PyResult<Self> {
        fn onto<F: Float>(optimizer: &Optimizer<F>, groups: &[Vec<PyRef<'_, PyTensor>>]) -> PyResult<Optimizer<F>> {
            let parameters = group_tensors::<F>(optimizer.kind().name(), groups.iter().map(Vec::as_slice))?;
            optimizer.deep_copy_onto(parameters).map_err(nn_error)
        }
        let steps = match &self.steps {
            Steps::F32(optimizer) => Steps::F32(onto(optimizer, &groups)?),
            Steps::F64(optimizer) => Steps::F64(onto(optimizer, &groups)?),
        };
        Ok(PyOptimizer { steps, base_lr: self.base_lr, scales: self.scales.clone() })
    }

    /// One step over every parameter with a gradient, group `i` at rate `lrs[i]`.
    fn step(&mut self, py: Python<'_>, lrs: Vec<f32>) -> PyResult<()> {
        self.set_lrs(lrs)?;
        match &mut self.steps {
            Steps::F32(optimizer) => py.detach(|| optimizer.step()),
            Steps::F64(optimizer) => py.detach(|| optimizer.step()),
        }
        .map_err(nn_error)
    }
}
