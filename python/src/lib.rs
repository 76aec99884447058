//! `textnet._native`: the Rust half of the Python package. The Python half (`python/textnet/`) turns
//! arguments into the plain forms taken here (float32 C-contiguous arrays, int64 labels, names of flags)
//! and draws the progress; this half checks every value again, trains and predicts with textnet's own
//! code (the CPU reference or the fused GPU kernels, as `textnet fit` does) and turns every error into a
//! Python exception carrying the command line's one-line message.
//!
//! Training runs on a worker thread without the GIL. The calling thread waits for its events (progress,
//! a finished epoch), calls the Python callbacks with them, and checks for Ctrl-C: the first one asks the
//! worker to stop after the current epoch (`textnet::harness::interrupt`), whose results are kept, and the call
//! then reports `interrupted` so that Python raises `KeyboardInterrupt`.
//!
//! Modules: `errors` (exceptions), `worker` (training off the GIL), `model` (`textnet.Sequential`'s
//! network), `language` (the text model and the Transformer), `tensor` (`textnet.Tensor`, the face of
//! `nn`'s tensors), `functional` (the tensor functions of `textnet.nn.functional`, `no_grad`, the seeded
//! draws, the optimizer), `layers` (the engine's dropout layer, which a captured step replays), `capture`
//! (`textnet.compile`), `state` (safetensors), `summary` (TensorBoard event files); here, the functions and the module.

mod capture;
mod errors;
mod functional;
mod language;
mod layers;
mod model;
mod state;
mod summary;
mod tensor;
mod worker;

use crate::errors::{choice, command_error, not_replaced, runtime_error, value_error};
use crate::language::LanguageModel;
use crate::model::Model;
use crate::worker::drive;
use numpy::{IntoPyArray, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use textnet::io::modelkind::Kind;

/// MNIST or Fashion-MNIST as ((X_train, y_train), (X_test, y_test)): X float32 (n, 784) with pixels / 255,
/// y int64, found (or downloaded and checked) as `textnet mnist` finds it.
#[pyfunction]
#[pyo3(signature = (kind="digits", path=None))]
fn mnist<'py>(py: Python<'py>, kind: &str, path: Option<PathBuf>) -> PyResult<Bound<'py, PyAny>> {
    use textnet::datasets::mnist::Dataset;
    let dataset = match kind {
        "digits" | "mnist" => Dataset::Mnist,
        "fashion" => Dataset::Fashion,
        other => return Err(PyValueError::new_err(format!("kind must be \"digits\" or \"fashion\", got {other:?}"))),
    };
    let data = py
        .detach(|| textnet::datasets::mnist::load(dataset, path.as_deref(), &|note| eprintln!("{note}")))
        .map_err(value_error)?;
    let split = |s: textnet::datasets::idx::Split| -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let n = s.len();
        let x = s.images.into_pyarray(py).reshape([n, s.pixels])?.into_any();
        let y = s.labels.iter().map(|&l| i64::from(l)).collect::<Vec<_>>().into_pyarray(py).into_any();
        Ok((x, y))
    };
    let train = split(data.train)?;
    let test = split(data.test)?;
    Ok((train, test).into_pyobject(py)?.into_any())
}

/// The class names of a dataset kind ("digits" or "fashion").
#[pyfunction]
fn mnist_class_names(kind: &str) -> PyResult<Vec<String>> {
    use textnet::datasets::mnist::Dataset;
    let dataset = match kind {
        "digits" | "mnist" => Dataset::Mnist,
        "fashion" => Dataset::Fashion,
        other => return Err(PyValueError::new_err(format!("kind must be \"digits\" or \"fashion\", got {other:?}"))),
    };
    Ok(dataset.class_names().iter().map(|s| s.to_string()).collect())
}

/// Runs the GPU selftest and returns every check as a dict (kernel, shape, rel_error, tolerance, passed).
#[pyfunction]
#[pyo3(signature = (quick=false, only=None, seed=None))]
fn selftest<'py>(
    py: Python<'py>,
    quick: bool,
    only: Option<Vec<String>>,
    seed: Option<u64>,
) -> PyResult<Bound<'py, PyList>> {
    let only = only
        .unwrap_or_default()
        .iter()
        .map(|name| choice::<textnet::commands::selftest::Only>("only", name))
        .collect::<PyResult<Vec<_>>>()?;
    let args = textnet::commands::selftest::SelftestArgs { seed, quick, only, json: false };
    let outcome = py.detach(|| textnet::commands::selftest::checks(&args)).map_err(runtime_error)?;
    let rows = PyList::empty(py);
    for c in &outcome.checks {
        let row = PyDict::new(py);
        row.set_item("kernel", &c.kernel)?;
        row.set_item("shape", &c.shape)?;
        row.set_item("rel_error", c.rel_error)?;
        row.set_item("tolerance", c.tolerance)?;
        row.set_item("passed", c.passed())?;
        row.set_item("seed", outcome.seed)?;
        row.set_item("device", &outcome.device_name)?;
        rows.append(row)?;
    }
    Ok(rows)
}

/// Runs the pipeline command `name` (`train`, `transformer`, …) with the command line's arguments `args`
/// in this process, as `textnet NAME ARGS…` would. Its lines go to this process's stdout and stderr.
/// Returns True when Ctrl-C stopped it (after its current epoch was saved).
#[pyfunction]
fn run_command(py: Python<'_>, name: &str, args: Vec<String>) -> PyResult<bool> {
    let Some(command) = textnet::pipelines::ALL.iter().flat_map(|p| p.commands.iter()).find(|c| c.name == name) else {
        return Err(PyValueError::new_err(format!("no textnet command {name:?}")));
    };
    let cli = (command.args)(clap::Command::new(command.name).no_binary_name(true));
    let matches = cli.try_get_matches_from(&args).map_err(|e| {
        let text = e.render().to_string();
        let line = text.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("invalid arguments").to_string();
        PyValueError::new_err(line.trim_start_matches("error: ").to_string())
    })?;
    let (result, interrupted) = drive(
        py,
        move |_| match (command.run)(&matches) {
            Err(e) if e.downcast_ref::<textnet::harness::interrupt::Interrupted>().is_some() => Ok(true),
            other => other.map(|()| false),
        },
        |_, _| Ok(()),
        command_error,
    )?;
    Ok(result || interrupted)
}

/// Checks a spec ("Linear(784, 128), ReLU, Linear(128, 10)"), raising ValueError with what is wrong.
#[pyfunction]
fn parse_spec(text: &str) -> PyResult<()> {
    textnet::nn::stack::spec::parse(text).map(drop).map_err(value_error)
}

/// Folders to look for NVRTC in before giving up (the package passes its `nvidia-cuda-nvrtc` wheel's).
#[pyfunction]
fn add_nvrtc_dir(dir: PathBuf) {
    textnet::device::add_nvrtc_dir(dir);
}

/// Saves of this process wait for each other (the `--out` lock, taken per save, would refuse a second
/// thread); runs of other processes are kept out by that lock.
static SAVING: Mutex<()> = Mutex::new(());

/// Writes `bytes`, a model file of `kind`, to `path` atomically, as the command line writes `--out`: under
/// its lock (a save while a `textnet` run writes the file is refused), never over a directory, FIFO or
/// device, never over a textnet model of another kind, and over a file that is not a textnet model only
/// with `overwrite` (such a file is the user's, and nothing of theirs is lost).
pub(crate) fn save_model(path: &Path, bytes: &[u8], kind: &'static Kind, overwrite: bool) -> anyhow::Result<()> {
    let _saving = SAVING.lock().unwrap_or_else(PoisonError::into_inner);
    if path.is_dir() {
        return Err(std::io::Error::new(ErrorKind::IsADirectory, format!("{} is a directory", path.display())).into());
    }
    let _lock = textnet::io::fsutil::check_output_named("path", path, &[])?;
    refuse_replacing(path, kind, overwrite)?;
    textnet::io::fsutil::write_atomic(path, bytes)
}

/// Writes ONNX bytes to `path` as `textnet export --onnx` does: atomically, never over a model file; a
/// directory there is `IsADirectoryError`.
pub(crate) fn save_onnx(path: &Path, onnx: &[u8]) -> anyhow::Result<()> {
    if path.is_dir() {
        return Err(std::io::Error::new(ErrorKind::IsADirectory, format!("{} is a directory", path.display())).into());
    }
    textnet::commands::export::save("path", path, onnx, &[])
}

/// Fails (`FileExistsError`) when the file at `path` must not be replaced by a model of `kind` (see
/// `save_model`).
fn refuse_replacing(path: &Path, kind: &'static Kind, overwrite: bool) -> anyhow::Result<()> {
    if std::fs::metadata(path).map_or(true, |m| m.len() == 0) {
        return Ok(());
    }
    let bytes = textnet::io::fsutil::read_input(path, "file")?;
    let shown = path.display();
    match textnet::io::modelkind::of_bytes(&bytes) {
        Some(there) if there == kind => Ok(()),
        Some(there) => Err(not_replaced(format!(
            "{shown} holds {} (for {}), not {}, so it is not replaced, even with overwrite=True; remove it or \
             choose another path",
            there.what, there.used_by, kind.what
        ))),
        None if overwrite => Ok(()),
        None => Err(not_replaced(format!(
            "{shown} exists and is not a textnet model file, so it is not replaced; save(..., overwrite=True) \
             replaces it"
        ))),
    }
}

/// The kind tag of a textnet model file ("textnet-fit", "textnet-text", …), or None.
#[pyfunction]
fn file_kind(path: PathBuf) -> PyResult<Option<String>> {
    let bytes = textnet::io::fsutil::read_input(&path, "model file").map_err(value_error)?;
    Ok(textnet::io::modelkind::of_bytes(&bytes).map(|k| k.tag.to_string()))
}

/// The native half of the `textnet` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Python raises KeyboardInterrupt; `drive` turns it into textnet's request to stop after the epoch.
    textnet::harness::interrupt::hosted();
    m.add("__version__", textnet::VERSION)?;
    m.add_class::<Model>()?;
    m.add_class::<LanguageModel>()?;
    m.add_function(wrap_pyfunction!(mnist, m)?)?;
    m.add_function(wrap_pyfunction!(mnist_class_names, m)?)?;
    m.add_function(wrap_pyfunction!(selftest, m)?)?;
    m.add_function(wrap_pyfunction!(run_command, m)?)?;
    m.add_function(wrap_pyfunction!(add_nvrtc_dir, m)?)?;
    m.add_function(wrap_pyfunction!(parse_spec, m)?)?;
    m.add_function(wrap_pyfunction!(file_kind, m)?)?;
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<functional::NoGrad>()?;
    m.add_class::<functional::PyOptimizer>()?;
    m.add_class::<capture::PyCapturedStep>()?;
    m.add_class::<layers::PyDropout>()?;
    m.add_class::<summary::PyEventWriter>()?;
    m.add_function(wrap_pyfunction!(state::save_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(state::load_tensors, m)?)?;
    use functional::*;
    for function in [
        wrap_pyfunction!(manual_seed, m)?,
        wrap_pyfunction!(normal_draws, m)?,
        wrap_pyfunction!(uniform_draws, m)?,
        wrap_pyfunction!(uniform_init, m)?,
        wrap_pyfunction!(is_grad_enabled, m)?,
        wrap_pyfunction!(cat, m)?,
        wrap_pyfunction!(linear, m)?,
        wrap_pyfunction!(layer_norm, m)?,
        wrap_pyfunction!(embedding, m)?,
        wrap_pyfunction!(cross_entropy, m)?,
        wrap_pyfunction!(mse_loss, m)?,
        wrap_pyfunction!(dropout, m)?,
        wrap_pyfunction!(scaled_dot_product_attention, m)?,
        wrap_pyfunction!(clip_grad_norm, m)?,
        wrap_pyfunction!(conv2d, m)?,
        wrap_pyfunction!(max_pool2d, m)?,
        wrap_pyfunction!(layers::causal_self_attention, m)?,
        wrap_pyfunction!(tensor::set_precision, m)?,
        wrap_pyfunction!(tensor::precision, m)?,
    ] {
        m.add_function(function)?;
    }
    Ok(())
}
