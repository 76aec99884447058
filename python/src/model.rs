//! `Model`, what `textnet.Sequential` holds: a `textnet fit` network and its parameters, the arrays it
//! takes and gives, and its training loop (`textnet fit`'s, reporting to the calling thread).

use crate::errors::{choice, memory_error, runtime_error, value_error};
use crate::worker::{Event, backend, device_name, drive};
use crate::{save_model, save_onnx};
use numpy::{IntoPyArray, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use rayon::prelude::*;
use std::path::PathBuf;
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};
use std::time::{Duration, Instant};
use textnet::device::{Backend, DeviceChoice};
use textnet::fit::data::{InputSchema, TargetInfo};
use textnet::fit::modelfile::{self, FitModel};
use textnet::harness::args::ScheduleArgs;
use textnet::harness::run::{EpochHooks, EpochPlan, EpochStart, EpochTrained, TRAIN, Verdict};
use textnet::nn::stack::model::{Init, Loss, Network};
use textnet::nn::stack::spec::{self, Shape};
use textnet::nn::stack::{Samples, Setup, StackTrainer, Target};
use textnet::ops::optim::{LrSchedule, LrScheduleKind, OptimConfig, OptimKind};

/// The rows of `x` (float32, C-contiguous, as the Python half makes it) as samples of `shape`: checks the
/// shape and that every value is finite.
fn features(x: &PyReadonlyArrayDyn<'_, f32>, shape: Shape, what: &str) -> PyResult<(usize, Vec<f32>)> {
    let dims = x.shape();
    let per_row = textnet::nn::stack::model::size(shape);
    let row_dims = shape_dims(shape);
    let fits = match dims {
        [_, rest @ ..] => rest == row_dims.as_slice() || rest == [per_row],
        [] => false,
    };
    if !fits {
        let wanted = row_dims.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
        return Err(PyValueError::new_err(format!(
            "{what} has shape {dims:?} but the model takes samples of shape ({wanted}): give an array of shape (n, {wanted})"
        )));
    }
    let values = x.as_slice().map_err(|_| PyValueError::new_err(format!("{what} is not a contiguous array")))?;
    if dims[0] == 0 {
        return Err(PyValueError::new_err(format!("{what} has no samples")));
    }
    // Copied and checked in one pass, in parallel: a training set is hundreds of megabytes.
    const CHUNK: usize = 1 << 16;
    let mut copy = vec![0.0f32; values.len()];
    let first_bad = copy
        .par_chunks_mut(CHUNK)
        .zip(values.par_chunks(CHUNK))
        .enumerate()
        .filter_map(|(k, (to, from))| {
            to.copy_from_slice(from);
            from.iter().position(|v| !v.is_finite()).map(|i| k * CHUNK + i)
        })
        .min();
    if let Some(i) = first_bad {
        return Err(PyValueError::new_err(format!(
            "{what} holds a non-finite value ({}) at sample {}, feature {}",
            values[i],
            i / per_row.max(1),
            i % per_row.max(1)
        )));
    }
    Ok((dims[0], copy))
}

/// The targets `y` of `rows` samples for `loss`: class indices below `outputs` (int64, as the Python half
/// makes them), or `outputs` finite values per sample.
fn targets(y: &Bound<'_, PyAny>, rows: usize, loss: Loss, outputs: usize, what: &str) -> PyResult<Target> {
    match loss {
        Loss::Ce => {
            let y: PyReadonlyArrayDyn<'_, i64> = y.extract()?;
            let labels =
                y.as_slice().map_err(|_| PyValueError::new_err(format!("{what} is not a contiguous array")))?;
            if y.ndim() != 1 || labels.len() != rows {
                return Err(PyValueError::new_err(format!(
                    "{what} has shape {:?} but there are {rows} samples: give one class label per sample, shape ({rows},)",
                    y.shape()
                )));
            }
            if let Some(i) = labels.iter().position(|&c| c < 0 || c as usize >= outputs) {
                return Err(PyValueError::new_err(format!(
                    "{what}[{i}] is {} but the model has {outputs} outputs: labels must be 0 to {}",
                    labels[i],
                    outputs - 1
                )));
            }
            Ok(Target::Classes(labels.iter().map(|&c| c as u32).collect()))
        }
        Loss::Mse => {
            let y: PyReadonlyArrayDyn<'_, f32> = y.extract()?;
            let values =
                y.as_slice().map_err(|_| PyValueError::new_err(format!("{what} is not a contiguous array")))?;
            if values.len() != rows * outputs || y.shape().first() != Some(&rows) {
                return Err(PyValueError::new_err(format!(
                    "{what} has shape {:?} but there are {rows} samples of {outputs} output{}: give shape ({rows},{})",
                    y.shape(),
                    if outputs == 1 { "" } else { "s" },
                    if outputs == 1 { String::new() } else { format!(" {outputs}") }
                )));
            }
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(PyValueError::new_err(format!("{what} holds a non-finite value ({}) at {i}", values[i])));
            }
            Ok(Target::Values(values.to_vec()))
        }
    }
}

/// Mean loss and accuracy (classes) or mean absolute error (values) of `outputs` against `s`'s targets.
fn figures(s: &Samples, loss_sum: f64, outputs: &[f32], k: usize) -> Vec<(&'static str, f64)> {
    let rows = s.rows().max(1);
    let mut out = vec![("loss", loss_sum / rows as f64)];
    match &s.target {
        Target::Classes(classes) => {
            let right =
                outputs.chunks(k).zip(classes).filter(|(o, c)| textnet::ops::cpu::argmax(o) == **c as usize).count();
            out.push(("accuracy", right as f64 / rows as f64));
        }
        Target::Values(values) => {
            let sum: f64 = outputs.iter().zip(values).map(|(o, y)| (o - y).abs() as f64).sum();
            out.push(("mae", sum / values.len().max(1) as f64));
        }
    }
    out
}

/// A `textnet fit` network with its parameters: what `textnet.Sequential` holds. Other threads may use
/// it while one trains it (they see the parameters from before that `fit`, or its last epoch's when it
/// hands each epoch's to Python), but only one `fit` at a time.
#[pyclass(module = "textnet._native", frozen)]
pub(crate) struct Model {
    /// The network and its parameters; a `fit` replaces the parameters when it ends.
    model: RwLock<FitModel>,
    /// Held by the `fit` that trains this model.
    training: Mutex<()>,
}

/// A sample's shape as Python gives it: (features,) or (channels, height, width).
fn shape_dims(shape: Shape) -> Vec<usize> {
    match shape {
        Shape::Flat(n) => vec![n],
        Shape::Image { channels, height, width } => vec![channels, height, width],
    }
}

fn parse_shape(dims: &[usize]) -> PyResult<Shape> {
    match *dims {
        [n] if n > 0 => Ok(Shape::Flat(n)),
        [channels, height, width] if channels * height * width > 0 => Ok(Shape::Image { channels, height, width }),
        _ => Err(PyValueError::new_err(format!(
            "input shape {dims:?} is neither (features,) nor (channels, height, width)"
        ))),
    }
}

fn class_target(net: &Network, loss: Loss, names: Option<Vec<String>>) -> PyResult<TargetInfo> {
    Ok(match loss {
        Loss::Ce => {
            let k = net.outputs();
            let names = names.unwrap_or_else(|| (0..k).map(|c| c.to_string()).collect());
            if names.len() != k {
                return Err(PyValueError::new_err(format!(
                    "{} class names for a network of {k} outputs: give one name per output",
                    names.len()
                )));
            }
            TargetInfo::Classes { names }
        }
        Loss::Mse => TargetInfo::Value { name: "target".into(), mean: 0.0, std: 1.0 },
    })
}

/// The command line's memory check (`Network::memory_need`) for training `net` on `sample_bytes` of
/// samples in batches of `batch`, before anything of that size is allocated.
fn check_memory(net: &Network, sample_bytes: u64, batch: usize) -> PyResult<()> {
    net.memory_need(sample_bytes, batch).check(textnet::io::resources::available_memory()).map_err(memory_error)
}

/// The settings of one `fit` call.
struct FitRequest {
    epochs: usize,
    batch: usize,
    optim: OptimConfig,
    device: DeviceChoice,
    seed: u64,
    /// Whether anyone draws the progress (else no progress events are sent).
    progress: bool,
    /// The learning rate over the run's steps.
    schedule: LrSchedule,
    /// Stop when the validation loss has not improved for this many epochs.
    patience: Option<usize>,
    /// Whether each epoch also measures the training samples (accuracy or MAE, dropout off).
    train_metric: bool,
    /// Whether Python is asked before each epoch (for its rate, or to stop).
    ask_before_epoch: bool,
    /// Whether each epoch's parameters go to Python with its figures.
    epoch_params: bool,
    /// Whether Python is told of every step, before the first and after each (the CPU only).
    step_events: bool,
}

/// The least time between two progress events: a bar redrawn 50 times a second looks smooth.
const PROGRESS_EVERY: Duration = Duration::from_millis(20);

#[pymethods]
impl Model {
    /// A network of `spec` ("Linear(784, 128), ReLU, Linear(128, 10)") taking samples of `input_shape`,
    /// its parameters drawn by `init` from `seed` as `textnet fit` draws them.
    #[new]
    #[pyo3(signature = (spec, input_shape, loss="ce", init="pytorch", seed=1, class_names=None))]
    fn new(
        spec: &str,
        input_shape: Vec<usize>,
        loss: &str,
        init: &str,
        seed: u64,
        class_names: Option<Vec<String>>,
    ) -> PyResult<Model> {
        let loss: Loss = choice("loss", loss)?;
        let init: Init = choice("init", init)?;
        let parsed = spec::parse(spec).map_err(value_error)?;
        let shape = parse_shape(&input_shape)?;
        let net = Network::new(&parsed, shape).map_err(value_error)?;
        // The least any `fit` needs (no samples, batches of one); `fit` checks again with its own.
        check_memory(&net, 0, 1)?;
        let target = class_target(&net, loss, class_names)?;
        let params = net.init(init, seed);
        Ok(Model::of(FitModel { net, params, loss, input: InputSchema::Array { shape }, target }))
    }

    /// Reads a `textnet fit` model file (of images, a table or arrays).
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf) -> PyResult<Model> {
        let model = py.detach(|| modelfile::load(&path)).map_err(value_error)?;
        Ok(Model::of(model))
    }

    /// Writes the model file as `save_model` does.
    #[pyo3(signature = (path, overwrite=false))]
    fn save(&self, py: Python<'_>, path: PathBuf, overwrite: bool) -> PyResult<()> {
        py.detach(|| save_model(&path, &modelfile::to_bytes(&self.read())?, &textnet::io::modelkind::FIT, overwrite))
            .map_err(value_error)
    }

    /// Writes the model as an ONNX file (`textnet export --onnx`, `fit::onnx`).
    fn export_onnx(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| save_onnx(&path, &textnet::fit::onnx::export(&self.read())?)).map_err(value_error)
    }

    /// The layers, every width written out.
    #[getter]
    fn spec(&self) -> String {
        spec::text(&self.read().net.layers)
    }

    /// The shape of one sample.
    #[getter]
    fn input_shape(&self) -> Vec<usize> {
        shape_dims(modelfile::input_shape(&self.read().input))
    }

    /// Outputs per sample.
    #[getter]
    fn outputs(&self) -> usize {
        self.read().net.outputs()
    }

    /// "ce" or "mse".
    #[getter]
    fn loss(&self) -> &'static str {
        self.read().loss.name()
    }

    /// Number of parameters.
    #[getter]
    fn param_count(&self) -> usize {
        self.read().net.param_count
    }

    /// Each layer as (its spec text, the shape of a sample it gives, its parameter count).
    #[getter]
    fn layers(&self) -> Vec<(String, Vec<usize>, usize)> {
        let m = self.read();
        let net = &m.net;
        let sizes = net
            .params
            .iter()
            .map(|p| p.as_ref().map_or(0, |p| p.weight.len() + p.bias.as_ref().map_or(0, |b| b.len())));
        net.layers
            .iter()
            .zip(&net.shapes[1..])
            .zip(sizes)
            .map(|((layer, &shape), params)| (spec::text(std::slice::from_ref(layer)), shape_dims(shape), params))
            .collect()
    }

    /// The class names (None for a model of values).
    #[getter]
    fn class_names(&self) -> Option<Vec<String>> {
        match &self.read().target {
            TargetInfo::Classes { names } => Some(names.clone()),
            TargetInfo::Value { .. } => None,
        }
    }

    #[setter]
    fn set_class_names(&self, names: Vec<String>) -> PyResult<()> {
        let mut m = self.write();
        if m.loss != Loss::Ce {
            return Err(PyValueError::new_err("a model of values (loss mse) has no class names"));
        }
        m.target = class_target(&m.net, Loss::Ce, Some(names))?;
        Ok(())
    }

    /// The target's mean and deviation: a value model's outputs are (value − mean) / std.
    #[getter]
    fn target_scale(&self) -> Option<(f32, f32)> {
        match &self.read().target {
            TargetInfo::Value { mean, std, .. } => Some((*mean, *std)),
            TargetInfo::Classes { .. } => None,
        }
    }

    /// What the model's inputs are: "array", "images" or "table".
    #[getter]
    fn input_kind(&self) -> &'static str {
        match &self.read().input {
            InputSchema::Array { .. } => "array",
            InputSchema::Images { .. } => "images",
            InputSchema::Table(_) => "table",
        }
    }

    /// Every tensor under PyTorch's `nn.Sequential` names, as (name, float32 array of its shape).
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Vec<(String, Bound<'py, PyAny>)>> {
        let m = self.read();
        let mut out = Vec::new();
        for (name, dims, range) in m.net.tensors() {
            let array = m.params[range].to_vec().into_pyarray(py).reshape(dims)?;
            out.push((name, array.into_any()));
        }
        Ok(out)
    }

    /// Replaces the tensors named in `tensors` (name → float32 array of the tensor's shape).
    fn load_state_dict(&self, tensors: Vec<(String, PyReadonlyArrayDyn<'_, f32>)>) -> PyResult<()> {
        let mut m = self.write();
        let expected = m.net.tensors();
        let mut params = m.params.clone();
        for (name, array) in &tensors {
            let Some((_, dims, range)) = expected.iter().find(|(n, _, _)| n == name) else {
                let names: Vec<&str> = expected.iter().map(|(n, _, _)| n.as_str()).collect();
                return Err(PyValueError::new_err(format!(
                    "no tensor {name} in this model: it has {}",
                    names.join(", ")
                )));
            };
            if array.shape() != dims.as_slice() {
                return Err(PyValueError::new_err(format!("tensor {name} is {dims:?}, got {:?}", array.shape())));
            }
            let values =
                array.as_slice().map_err(|_| PyValueError::new_err(format!("tensor {name} is not contiguous")))?;
            if values.iter().any(|v| !v.is_finite()) {
                return Err(PyValueError::new_err(format!("tensor {name} holds NaN or infinite values")));
            }
            params[range.clone()].copy_from_slice(values);
        }
        m.params = params;
        Ok(())
    }

    /// The network's outputs for `x` (rows × outputs, float32): logits for "ce", values for "mse" (in the
    /// units trained on), dropout off. `batch` bounds the rows a GPU pass takes.
    #[pyo3(signature = (x, device="auto", batch=1024))]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArrayDyn<'py, f32>,
        device: &str,
        batch: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let device: DeviceChoice = choice("device", device)?;
        let (shape, k, loss) = self.signature();
        let (rows, values) = features(&x, shape, "X")?;
        let target = match loss {
            Loss::Ce => Target::Classes(vec![0; rows]),
            Loss::Mse => Target::Values(vec![0.0; rows * k]),
        };
        let samples = Arc::new(Samples { features: values.len() / rows, x: values, target });
        let (_, outputs) = py.detach(|| self.evaluate_samples(samples, device, batch.max(1))).map_err(runtime_error)?;
        Ok(outputs.into_pyarray(py).reshape([rows, k])?.into_any())
    }

    /// Mean loss and accuracy (classes) or MAE (values) on `x`, `y`, as a dict.
    #[pyo3(signature = (x, y, device="auto", batch=1024))]
    fn evaluate<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArrayDyn<'py, f32>,
        y: &Bound<'py, PyAny>,
        device: &str,
        batch: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        let device: DeviceChoice = choice("device", device)?;
        let (shape, k, loss) = self.signature();
        let (rows, values) = features(&x, shape, "X")?;
        let target = targets(y, rows, loss, k, "y")?;
        let samples = Arc::new(Samples { features: values.len() / rows, x: values, target });
        let logs = py
            .detach(|| -> anyhow::Result<_> {
                let (sum, outputs) = self.evaluate_samples(samples.clone(), device, batch.max(1))?;
                Ok(figures(&samples, sum, &outputs, k))
            })
            .map_err(runtime_error)?;
        let dict = PyDict::new(py);
        for (key, value) in logs {
            dict.set_item(key, value)?;
        }
        Ok(dict)
    }

    /// Trains for `epochs` passes over `x`, `y` (shuffled per epoch from `seed`, as `textnet fit` does),
    /// measuring `x_val`, `y_val` (or the last `validation_split` of the samples) after each, and the
    /// training samples too when `train_metric`. `on_progress(epoch, done, total)`, `on_epoch_begin(epoch,
    /// lr)` and `on_epoch(epoch, logs, samples_per_s, lr)` are called on this thread, and training waits
    /// for the last two: `on_epoch_begin` returns the rate of every step of the epoch (None: as planned,
    /// `lr` being its first step's), `on_epoch` whether to stop after the epoch; an exception in either
    /// stops the run before
    /// the next epoch and is raised. `on_step(epoch, done, total, loss_sum)` (on the CPU only, else
    /// NotImplementedError) is called and waited for before an epoch's first step and after each step.
    /// With `epoch_params` the model takes each epoch's parameters before
    /// `on_epoch` is called (otherwise only when the run ends). Returns
    /// {"history": {name: [per epoch]}, "interrupted": bool, "diverged": None or the message, "device": str,
    /// "seconds", "setup_seconds", "training_seconds": float}; the model
    /// keeps the parameters of the last epoch finished (the last finite one, if training diverged).
    #[pyo3(signature = (x, y, x_val=None, y_val=None, validation_split=None, epochs=10, batch_size=64,
        optimizer="adam", lr=None, momentum=None, weight_decay=0.0, clip_norm=0.0, device="auto", seed=1,
        lr_schedule="constant", warmup=0, min_lr=0.0, patience=None, train_metric=false, epoch_params=false,
        on_progress=None, on_epoch_begin=None, on_epoch=None, on_step=None))]
    #[allow(clippy::too_many_arguments)]
    fn fit<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArrayDyn<'py, f32>,
        y: &Bound<'py, PyAny>,
        x_val: Option<PyReadonlyArrayDyn<'py, f32>>,
        y_val: Option<&Bound<'py, PyAny>>,
        validation_split: Option<f64>,
        epochs: usize,
        batch_size: usize,
        optimizer: &str,
        lr: Option<f32>,
        momentum: Option<f32>,
        weight_decay: f32,
        clip_norm: f32,
        device: &str,
        seed: u64,
        lr_schedule: &str,
        warmup: usize,
        min_lr: f32,
        patience: Option<usize>,
        train_metric: bool,
        epoch_params: bool,
        on_progress: Option<Py<PyAny>>,
        on_epoch_begin: Option<Py<PyAny>>,
        on_epoch: Option<Py<PyAny>>,
        on_step: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let _training = match self.training.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                return Err(PyRuntimeError::new_err(
                    "this model is being trained by another thread: wait for that fit to end, or train a copy",
                ));
            }
        };
        let kind: OptimKind = choice("optimizer", optimizer)?;
        let device: DeviceChoice = choice("device", device)?;
        if on_step.is_some() && !matches!(backend(device).map_err(runtime_error)?, Backend::Cpu) {
            return Err(PyNotImplementedError::new_err(
                "per-batch callbacks (on_train_batch_begin/end) run on the CPU only: on a GPU an epoch runs as \
                 one captured graph; give device=\"cpu\"",
            ));
        }
        if batch_size == 0 {
            return Err(PyValueError::new_err("batch_size must be at least 1"));
        }
        textnet::io::resources::check_epochs(epochs).map_err(value_error)?;
        let mut optim = OptimConfig::new(kind);
        if let Some(lr) = lr {
            optim.lr = lr;
        }
        if let Some(m) = momentum {
            if kind != OptimKind::Momentum {
                return Err(PyValueError::new_err(format!(
                    "momentum applies to optimizer=\"momentum\" only (this model uses {})",
                    kind.name()
                )));
            }
            optim.momentum = m;
        }
        optim.weight_decay = weight_decay;
        optim.clip_norm = clip_norm;
        optim.validate().map_err(|e| {
            PyValueError::new_err(
                format!("{e:#}")
                    .replace("--lr", "lr")
                    .replace("--momentum", "momentum")
                    .replace("--weight-decay", "weight_decay"),
            )
        })?;

        let python_names = |e: anyhow::Error| {
            PyValueError::new_err(
                format!("{e:#}")
                    .replace("--lr-schedule", "lr_schedule")
                    .replace("--min-lr", "min_lr")
                    .replace("--warmup", "warmup")
                    .replace("--lr", "lr"),
            )
        };
        let kind: LrScheduleKind = choice("lr_schedule", lr_schedule)?;
        let schedule = ScheduleArgs { lr_schedule: kind, warmup, min_lr }.schedule(optim.lr).map_err(python_names)?;
        if patience == Some(0) {
            return Err(PyValueError::new_err("patience must be at least 1"));
        }
        if patience.is_some() && x_val.is_none() && validation_split.is_none() {
            return Err(PyValueError::new_err(
                "patience watches the validation loss: give validation_data or validation_split",
            ));
        }
        let (shape, k, loss) = self.signature();
        let (rows, values) = features(&x, shape, "X")?;
        let target = targets(y, rows, loss, k, "y")?;
        let mut train = Samples { features: values.len() / rows, x: values, target };
        let val = match (x_val, y_val, validation_split) {
            (Some(_), _, Some(_)) => {
                return Err(PyValueError::new_err("give validation_data or validation_split, not both"));
            }
            (Some(xv), Some(yv), None) => {
                let (rows, values) = features(&xv, shape, "X_val")?;
                let target = targets(yv, rows, loss, k, "y_val")?;
                Some(Samples { features: values.len() / rows, x: values, target })
            }
            (Some(_), None, None) | (None, Some(_), _) => {
                return Err(PyValueError::new_err("validation_data must be a pair (X_val, y_val)"));
            }
            (None, None, Some(fraction)) => {
                if !(fraction > 0.0 && fraction < 1.0) {
                    return Err(PyValueError::new_err(format!(
                        "validation_split must be a fraction between 0 and 1 (exclusive), got {fraction}"
                    )));
                }
                let held = textnet::fit::data::check_val_room(rows, fraction, "samples")
                    .map_err(|e| PyValueError::new_err(format!("{e:#}").replace("--val-split", "validation_split")))?;
                Some(split_off(&mut train, rows - held, k))
            }
            (None, None, None) => None,
        };
        let (net, params) = {
            let m = self.read();
            (m.net.clone(), m.params.clone())
        };
        check_memory(&net, train.bytes() + val.as_ref().map_or(0, Samples::bytes), batch_size)?;
        let steps = (train.rows().div_ceil(batch_size)).saturating_mul(epochs);
        schedule.check(steps).map_err(python_names)?;
        let progress = on_progress.is_some();
        let request = FitRequest {
            epochs,
            batch: batch_size,
            optim,
            device,
            seed,
            progress,
            schedule,
            patience,
            train_metric,
            ask_before_epoch: on_epoch_begin.is_some(),
            epoch_params,
            step_events: on_step.is_some(),
        };
        let mut history: Vec<(&'static str, Vec<f64>)> = Vec::new();
        let started = Instant::now();
        let (trained, interrupted) = drive(
            py,
            move |events| train_epochs(net, params, loss, train, val, request, events),
            |py, event| match event {
                Event::Progress { epoch, done, total } => match &on_progress {
                    Some(f) => f.call1(py, (epoch, done, total)).map(drop),
                    None => Ok(()),
                },
                Event::Starting { epoch, lr, answer } => {
                    // An exception drops `answer` unanswered, which ends the run.
                    let rate: Option<f32> = match &on_epoch_begin {
                        Some(f) => f.call1(py, (epoch, lr))?.extract(py)?,
                        None => None,
                    };
                    let _ = answer.send(rate);
                    Ok(())
                }
                Event::Step { epoch, done, total, loss_sum, answer } => {
                    if let Some(f) = &on_step {
                        f.call1(py, (epoch, done, total, loss_sum))?;
                    }
                    let _ = answer.send(());
                    Ok(())
                }
                Event::Epoch { epoch, logs, speed_and_lr: (speed, lr), params, answer } => {
                    if let Some(params) = params {
                        self.write().params = params;
                    }
                    let dict = PyDict::new(py);
                    for (key, value) in &logs {
                        dict.set_item(*key, *value)?;
                        match history.iter_mut().find(|(k, _)| k == key) {
                            Some((_, values)) => values.push(*value),
                            None => history.push((*key, vec![*value])),
                        }
                    }
                    let stop = match &on_epoch {
                        Some(f) => f.call1(py, (epoch, dict, speed, lr))?.is_truthy(py)?,
                        None => false,
                    };
                    let _ = answer.send(stop);
                    Ok(())
                }
            },
            runtime_error,
        )?;
        py.detach(|| self.write().params = trained.params);
        let out = PyDict::new(py);
        let hist = PyDict::new(py);
        for (key, values) in history {
            hist.set_item(key, PyList::new(py, values)?)?;
        }
        out.set_item("history", hist)?;
        out.set_item("interrupted", interrupted)?;
        out.set_item("diverged", trained.diverged)?;
        out.set_item("device", trained.device)?;
        out.set_item("seconds", started.elapsed().as_secs_f64())?;
        // As `textnet fit` reports them: opening the device and handing the samples to the trainer, then
        // the epochs with their evaluations (its `wall_s.training`).
        out.set_item("setup_seconds", trained.setup_s)?;
        out.set_item("training_seconds", trained.training_s)?;
        Ok(out)
    }
}

impl Model {
    fn of(model: FitModel) -> Model {
        Model { model: RwLock::new(model), training: Mutex::new(()) }
    }

    fn read(&self) -> RwLockReadGuard<'_, FitModel> {
        self.model.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, FitModel> {
        self.model.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The shape of a sample, the outputs per sample and the loss: what the arrays given and returned follow.
    fn signature(&self) -> (Shape, usize, Loss) {
        let m = self.read();
        (modelfile::input_shape(&m.input), m.net.outputs(), m.loss)
    }

    /// The summed loss and the outputs of `samples`, on `device` (a GPU pass takes at most `batch` rows).
    fn evaluate_samples(
        &self,
        samples: Arc<Samples>,
        device: DeviceChoice,
        batch: usize,
    ) -> anyhow::Result<(f64, Vec<f32>)> {
        let m = self.read();
        match backend(device)? {
            Backend::Cpu => Ok(textnet::nn::stack::cpu::evaluate(&m.net, &m.params, &samples, m.loss)),
            backend => {
                let setup = Setup {
                    net: m.net.clone(),
                    params: m.params.clone(),
                    loss: m.loss,
                    optim: OptimConfig::new(OptimKind::Sgd),
                    dropout_seed: 0,
                    splits: vec![samples],
                };
                textnet::nn::stack::trainer(&backend, setup, batch)?.evaluate(0)
            }
        }
    }
}

/// Moves the samples from `keep` on out of `train` into a validation split.
fn split_off(train: &mut Samples, keep: usize, outputs: usize) -> Samples {
    let x = train.x.split_off(keep * train.features);
    let target = match &mut train.target {
        Target::Classes(c) => Target::Classes(c.split_off(keep)),
        Target::Values(v) => Target::Values(v.split_off(keep * outputs)),
    };
    Samples { features: train.features, x, target }
}

/// What `train_epochs` ends with.
struct Trained {
    /// The parameters of the last epoch finished with finite figures (the starting ones before any).
    params: Vec<f32>,
    /// Where and how training diverged, in words, if it did.
    diverged: Option<String>,
    /// The device it ran on, described.
    device: String,
    /// Seconds to open the device and hand the trainer the samples.
    setup_s: f64,
    /// Seconds of the epochs and their evaluations.
    training_s: f64,
}

/// The training loop of `textnet fit` (its shuffles, its learning rate per step, its check for
/// divergence), reporting to `events`.
fn train_epochs(
    net: Network,
    params: Vec<f32>,
    loss: Loss,
    train: Samples,
    val: Option<Samples>,
    request: FitRequest,
    events: &Sender<Event>,
) -> anyhow::Result<Trained> {
    let begun = Instant::now();
    let backend = backend(request.device)?;
    let device = device_name(&backend);
    let k = net.outputs();
    let n = train.rows();
    let mut splits = vec![Arc::new(train)];
    splits.extend(val.map(Arc::new));
    let has_val = splits.len() > 1;
    let setup = Setup {
        net,
        params: params.clone(),
        loss,
        optim: request.optim,
        dropout_seed: request.seed as u32,
        splits: splits.clone(),
    };
    let mut trainer: Box<StackTrainer> = textnet::nn::stack::trainer(&backend, setup, request.batch)?;
    let setup_s = begun.elapsed().as_secs_f64();
    let training = Instant::now();
    let plan = EpochPlan {
        epochs: request.epochs,
        samples: n,
        batch: request.batch,
        shuffle_seed: Some(request.seed ^ textnet::nn::stack::SHUFFLE_STREAM),
        rates: request.schedule.rates(request.optim.lr, n.div_ceil(request.batch.max(1)) * request.epochs),
        patience: request.patience,
    };
    let mut hooks = PythonEpochs {
        n,
        k,
        has_val,
        splits,
        events,
        progress: request.progress,
        train_metric: request.train_metric,
        ask_before_epoch: request.ask_before_epoch,
        epoch_params: request.epoch_params,
        step_events: request.step_events,
        kept: params,
        epoch: 0,
        last_sent: None,
    };
    let ran = textnet::harness::run::epochs(trainer.as_mut(), &plan, &mut hooks)?;
    let training_s = training.elapsed().as_secs_f64();
    let diverged = ran.diverged.map(|d| {
        format!(
            "training diverged at epoch {}: the {} stopped being finite; the model keeps epoch {}; \
             try a lower lr (this run used {}) or clip_norm",
            d.epoch,
            d.what,
            d.epoch - 1,
            textnet::harness::report::decimal(request.optim.lr)
        )
    });
    Ok(Trained { params: hooks.kept, diverged, device, setup_s, training_s })
}

/// The Python package's side of the epoch loop: the validation figures, the parameters kept, the events.
struct PythonEpochs<'a> {
    n: usize,
    k: usize,
    has_val: bool,
    splits: Vec<Arc<Samples>>,
    events: &'a Sender<Event>,
    progress: bool,
    train_metric: bool,
    ask_before_epoch: bool,
    epoch_params: bool,
    step_events: bool,
    /// The parameters of the last epoch finished with finite figures (the starting ones before any).
    kept: Vec<f32>,
    /// The epoch in progress, and when its last progress event was sent.
    epoch: usize,
    last_sent: Option<Instant>,
}

impl PythonEpochs<'_> {
    /// Tells Python of a step (when asked to) and waits until it has seen it.
    fn step(&mut self, done: usize, loss_sum: f64) {
        if self.step_events {
            let (answer, answered) = mpsc::channel();
            let _ = self.events.send(Event::Step { epoch: self.epoch, done, total: self.n, loss_sum, answer });
            let _ = answered.recv();
        }
    }
}

impl EpochHooks<StackTrainer> for PythonEpochs<'_> {
    fn starting(&mut self, epoch: usize, planned: &[f32]) -> EpochStart {
        if !self.ask_before_epoch {
            return EpochStart::AsPlanned;
        }
        let (answer, answered) = mpsc::channel();
        let _ = self.events.send(Event::Starting { epoch, lr: planned[0], answer });
        match answered.recv() {
            Ok(Some(lr)) => EpochStart::At(lr),
            Ok(None) => EpochStart::AsPlanned,
            Err(_) => EpochStart::Stop,
        }
    }

    fn started(&mut self, epoch: usize, _samples: usize) {
        (self.epoch, self.last_sent) = (epoch, Some(Instant::now()));
        if self.progress {
            let _ = self.events.send(Event::Progress { epoch, done: 0, total: self.n });
        }
        self.step(0, 0.0);
    }

    fn progress(&mut self, done: usize, loss_sum: f64) {
        self.step(done, loss_sum);
        if self.progress && (done == self.n || self.last_sent.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY)) {
            self.last_sent = Some(Instant::now());
            let _ = self.events.send(Event::Progress { epoch: self.epoch, done, total: self.n });
        }
    }

    fn finished(&mut self, trainer: &mut StackTrainer, epoch: &EpochTrained) -> anyhow::Result<Verdict> {
        let mut logs = vec![("loss", epoch.train_loss)];
        if self.train_metric {
            let (sum, outputs) = trainer.evaluate(TRAIN)?;
            logs.extend(
                figures(&self.splits[TRAIN], sum, &outputs, self.k).into_iter().filter(|&(key, _)| key != "loss"),
            );
        }
        if self.has_val {
            let (val_sum, outputs) = trainer.evaluate(1)?;
            logs.extend(figures(&self.splits[1], val_sum, &outputs, self.k).into_iter().map(|(key, v)| match key {
                "loss" => ("val_loss", v),
                "accuracy" => ("val_accuracy", v),
                _ => ("val_mae", v),
            }));
        }
        logs.push(("seconds", self.n as f64 / epoch.samples_per_s));
        let params = trainer.params()?;
        if logs.iter().any(|(_, v)| !v.is_finite()) || !params.iter().all(|p| p.is_finite()) {
            return Ok(Verdict::Diverged("parameters"));
        }
        let judged = logs.iter().find(|(key, _)| *key == "val_loss").map(|&(_, v)| v);
        let sent = self.epoch_params.then(|| params.clone());
        self.kept = params;
        let (answer, answered) = mpsc::channel();
        let speed_and_lr = (epoch.samples_per_s, epoch.lr);
        let _ = self.events.send(Event::Epoch { epoch: epoch.epoch, logs, speed_and_lr, params: sent, answer });
        Ok(match answered.recv() {
            Ok(false) => Verdict::Next { judged },
            Ok(true) | Err(_) => Verdict::Stop,
        })
    }
}
