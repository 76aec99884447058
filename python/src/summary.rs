//! `textnet._native.EventWriter`: one TensorBoard event file, written by textnet's own writer
//! (`textnet::harness::tensorboard`, as `--tensorboard` writes it), under `textnet.tensorboard.SummaryWriter`.

use crate::errors::value_error;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use std::path::PathBuf;
use textnet::harness::tensorboard::{EventWriter, proto::Status};

/// An event file in a directory; closed, it refuses further writes.
#[pyclass(module = "textnet._native", name = "EventWriter")]
pub(crate) struct PyEventWriter {
    writer: Option<EventWriter>,
}

impl PyEventWriter {
    fn open(&mut self) -> PyResult<&mut EventWriter> {
        self.writer.as_mut().ok_or_else(|| PyValueError::new_err("the SummaryWriter is closed"))
    }
}

/// A failed write as Python's OSError, its one line of text.
fn os_error(e: anyhow::Error) -> PyErr {
    PyOSError::new_err(format!("{e:#}"))
}

#[pymethods]
impl PyEventWriter {
    /// A new event file in `log_dir`, created (with its parents) if missing.
    #[new]
    fn new(log_dir: PathBuf) -> PyResult<PyEventWriter> {
        let writer =
            EventWriter::create(&log_dir).map_err(|e| os_error(e.context(format!("{}", log_dir.display()))))?;
        Ok(PyEventWriter { writer: Some(writer) })
    }

    /// The file's path.
    #[getter]
    fn path(&self) -> Option<PathBuf> {
        self.writer.as_ref().map(|w| w.path().to_path_buf())
    }

    /// Scalars `(tag, value)` at `step`, one event.
    fn scalars(&mut self, step: i64, scalars: Vec<(String, f64)>) -> PyResult<()> {
        let step = u64::try_from(step)
            .map_err(|_| PyValueError::new_err(format!("global_step must be 0 or more, got {step}")))?;
        self.open()?.scalars(step, &scalars).map_err(os_error)
    }

    /// The HParams plugin's summaries: `hparams_json` a JSON object of the hyperparameters, `metrics` the
    /// scalar tags shown beside them, `success` how the run ended.
    fn hparams(&mut self, hparams_json: &str, metrics: Vec<String>, success: bool) -> PyResult<()> {
        let hparams: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(hparams_json).map_err(|e| value_error(e.into()))?;
        let status = if success { Status::Success } else { Status::Failure };
        self.open()?.hparams(&hparams, &metrics, status).map_err(os_error)
    }

    /// Closes the file (every event is already on disk).
    fn close(&mut self) {
        self.writer = None;
    }
}
