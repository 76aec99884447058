//! The functions of `textnet.nn.functional` and of the package's top level that take tensors (`cat`,
//! `clip_grad_norm`), `no_grad`, the seeded draws (`manual_seed`, `randn`, the layers' initial
//! parameters, dropout's masks) and the optimizer over parameter groups.

use crate::errors::nn_error;
use crate::tensor::{Data, Float, PyTensor, by_dtype, dtypes_differ, float_op, float_pair_op, not_float};
use numpy::{IntoPyArray, PyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rand::{RngExt, SeedableRng};
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};
use textnet::cpu::{SeededRng, linear_init};
use textnet::nn::{self, Optimizer, ParamGroup, Tensor};
use textnet::ops::optim::{OptimConfig, OptimKind};

/// The generator of `randn`, the layers' initial parameters and dropout's masks (`manual_seed` reseeds
/// it); seeded 0 until then.
fn rng() -> MutexGuard<'static, SeededRng> {
    static RNG: LazyLock<Mutex<SeededRng>> = LazyLock::new(|| Mutex::new(SeededRng::seed_from_u64(0)));
    RNG.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reseeds the generator of `randn`, the initial parameters and dropout.
#[pyfunction]
pub(crate) fn manual_seed(seed: u64) {
    *rng() = SeededRng::seed_from_u64(seed);
}

/// `count` draws of N(0, 1), in f32.
#[pyfunction]
pub(crate) fn normal_draws(py: Python<'_>, count: usize) -> Bound<'_, PyArray1<f32>> {
    use rand_distr::{Distribution, StandardNormal};
    let mut rng = rng();
    let values: Vec<f32> = (0..count).map(|_| StandardNormal.sample(&mut *rng)).collect();
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

fn ids_of<'a>(op: &str, data: &'a Data) -> PyResult<(&'a [i64], &'a [usize])> {
    match data {
        Data::Ids { values, shape, .. } => Ok((values, shape)),
        other => Err(PyValueError::new_err(format!(
            "{op}: the ids must be int64, got {} of shape {:?}",
            if matches!(other, Data::F32(_)) { "float32" } else { "float64" },
            other.shape()
        ))),
    }
}

/// `tensors` joined along `dim`.
#[pyfunction]
#[pyo3(signature = (tensors, dim = 0))]
pub(crate) fn cat(tensors: Vec<PyRef<'_, PyTensor>>, dim: isize) -> PyResult<PyTensor> {
    let Some(first) = tensors.first() else { return Err(PyValueError::new_err("cat: no tensors to join")) };
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
    let (values, shape) = ids_of("embedding", &ids.data)?;
    float_op!("embedding", &weight.data, |w| nn::embedding(w, values, shape, padding_idx)).map(PyTensor::of)
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
    let (ids, ids_shape) = ids_of(OP, &targets.data)?;
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
    float_op!(OP, &logits.data, |x| {
        let rows = if shape.len() > 2 { x.permute(&axes) } else { Ok(x.clone()) };
        rows.and_then(|rows| py.detach(|| rows.cross_entropy(ids, Some(ignore_index))))
    })
    .map(PyTensor::of)
}

/// The mean squared error between `input` and `target`, of one shape.
#[pyfunction]
pub(crate) fn mse_loss(input: PyRef<'_, PyTensor>, target: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
    float_pair_op!("mse_loss", &input.data, &target.data, |x, y| x.mse(y)).map(PyTensor::of)
}

/// `input` with dropout of probability `p` when `training`, its mask drawn from the seeded generator.
#[pyfunction]
#[pyo3(signature = (input, p = 0.5, training = true))]
pub(crate) fn dropout(input: PyRef<'_, PyTensor>, p: f32, training: bool) -> PyResult<PyTensor> {
    let seed = rng().random::<u32>();
    float_op!("dropout", &input.data, |x| nn::dropout(x, p, training, seed, 0, 0)).map(PyTensor::of)
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
#[pyclass(name = "Optimizer", module = "textnet._native")]
pub(crate) struct PyOptimizer {
    steps: Steps,
}

fn optimizer<F: Float>(config: OptimConfig, groups: &[(Vec<PyRef<'_, PyTensor>>, f32, f32)]) -> PyResult<Optimizer<F>> {
    let first = groups.iter().flat_map(|(params, ..)| params.first()).next();
    let mut made = Vec::with_capacity(groups.len());
    for (params, lr, weight_decay) in groups {
        let tensors: PyResult<Vec<Tensor<F>>> = (params.iter())
            .map(|p| operand::<F>(config.kind.name(), first.map_or(&p.data, |f| &f.data), &p.data).cloned())
            .collect();
        made.push(ParamGroup::new(tensors?).with_weight_decay(*weight_decay).with_lr_scale(*lr));
    }
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
            Some(ids @ Data::Ids { .. }) => return Err(not_float(kind.name(), ids)),
            _ => Steps::F32(optimizer(config, &groups)?),
        };
        Ok(PyOptimizer { steps })
    }

    /// One step over every parameter with a gradient, group `i` at rate `lrs[i]`.
    fn step(&mut self, py: Python<'_>, lrs: Vec<f32>) -> PyResult<()> {
        fn run<F: Float>(py: Python<'_>, optimizer: &mut Optimizer<F>, lrs: &[f32]) -> nn::Result<()> {
            for (group, &lr) in lrs.iter().enumerate() {
                optimizer.set_lr_scale(group, lr)?;
            }
            py.detach(|| optimizer.step())
        }
        match &mut self.steps {
            Steps::F32(optimizer) => run(py, optimizer, &lrs),
            Steps::F64(optimizer) => run(py, optimizer, &lrs),
        }
        .map_err(nn_error)
    }
}
