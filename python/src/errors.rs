//! Errors as Python exceptions carrying the command line's one-line messages, and flag values named by
//! strings.

use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// What kind of Python exception an error becomes (`FileNotFoundError` wins whenever a file is missing).
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// Bad arguments or data: `ValueError`.
    Value,
    /// The GPU or the run failed: `RuntimeError`.
    Runtime,
}

/// The error as a Python exception of `kind`, with the command line's one-line message.
pub(crate) fn raise(kind: Kind, e: anyhow::Error) -> PyErr {
    let message = format!("{e:#}");
    let missing = e.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound)
    });
    if missing {
        return PyFileNotFoundError::new_err(message);
    }
    match kind {
        Kind::Value => PyValueError::new_err(message),
        Kind::Runtime => PyRuntimeError::new_err(message),
    }
}

pub(crate) fn value_error(e: anyhow::Error) -> PyErr {
    raise(Kind::Value, e)
}

pub(crate) fn runtime_error(e: anyhow::Error) -> PyErr {
    raise(Kind::Runtime, e)
}

/// An error of a whole command run in-process: a device failure is a `RuntimeError`, a bad input a
/// `ValueError` (the command line does not say which, its message does).
pub(crate) fn command_error(e: anyhow::Error) -> PyErr {
    let text = format!("{e:#}");
    let device = ["CUDA", "GPU", "NVRTC", "driver", "libcuda", "kernel"].iter().any(|w| text.contains(w));
    raise(if device { Kind::Runtime } else { Kind::Value }, e)
}

/// A flag value named by a string (`"adam"`, `"ce"`, `"auto"`), as the command line reads it.
pub(crate) fn choice<T: clap::ValueEnum>(what: &str, text: &str) -> PyResult<T> {
    T::from_str(text, true).map_err(|_| {
        let names: Vec<String> = T::value_variants()
            .iter()
            .filter_map(|v| v.to_possible_value())
            .map(|p| p.get_name().to_string())
            .collect();
        PyValueError::new_err(format!("{what} must be one of {}, got {text:?}", names.join(", ")))
    })
}
