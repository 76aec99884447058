//! Errors as Python exceptions carrying the command line's one-line messages, and flag values named by
//! strings.

use pyo3::exceptions::{
    PyFileExistsError, PyFileNotFoundError, PyIsADirectoryError, PyMemoryError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;

/// What kind of Python exception an error becomes (an I/O error in its chain decides first: a missing
/// file is `FileNotFoundError`, a file that is not replaced `FileExistsError`, a directory where a file
/// belongs `IsADirectoryError`).
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// Bad arguments or data: `ValueError`.
    Value,
    /// The GPU or the run failed: `RuntimeError`.
    Runtime,
}

/// The error as a Python exception of `kind`, with the command line's one-line message.
pub(crate) fn raise(kind: Kind, e: anyhow::Error) -> PyErr {
    use std::io::ErrorKind;
    let message = format!("{e:#}");
    let io_kinds: Vec<ErrorKind> =
        e.chain().filter_map(|cause| cause.downcast_ref::<std::io::Error>().map(std::io::Error::kind)).collect();
    if io_kinds.contains(&ErrorKind::NotFound) {
        return PyFileNotFoundError::new_err(message);
    }
    if io_kinds.contains(&ErrorKind::AlreadyExists) {
        return PyFileExistsError::new_err(message);
    }
    if io_kinds.contains(&ErrorKind::IsADirectory) {
        return PyIsADirectoryError::new_err(message);
    }
    match kind {
        Kind::Value => PyValueError::new_err(message),
        Kind::Runtime => PyRuntimeError::new_err(message),
    }
}

/// An error of `nn` (a tensor op, a module, an optimizer) as the exception its kind calls for: a shape or
/// a value the op cannot take is `ValueError`, the device `RuntimeError`, a graph that cannot be walked
/// back `RuntimeError` (as PyTorch's), a file `FileNotFoundError` when it is missing, else `ValueError`.
pub(crate) fn nn_error(e: textnet::nn::Error) -> PyErr {
    use textnet::nn::Error;
    let message = e.to_string();
    match e {
        Error::Shapes { .. } | Error::Shape { .. } | Error::Value { .. } => PyValueError::new_err(message),
        Error::Device { .. } | Error::Graph { .. } => PyRuntimeError::new_err(message),
        Error::File { path, .. } if !path.exists() => PyFileNotFoundError::new_err(message),
        Error::File { .. } => PyValueError::new_err(message),
    }
}

/// A refusal to replace `path`, raised as `FileExistsError`.
pub(crate) fn not_replaced(message: String) -> anyhow::Error {
    std::io::Error::new(std::io::ErrorKind::AlreadyExists, message).into()
}

/// The command line's memory check (`MemoryNeed::check`) as `MemoryError`, which NumPy raises too for an
/// array that cannot be allocated, with the flags it names in the package's words.
pub(crate) fn memory_error(e: anyhow::Error) -> PyErr {
    PyMemoryError::new_err(
        format!("{e:#}")
            .replace("--layers", "the spec")
            .replace("--batch", "batch_size")
            .replace("--train-limit", "the number of samples"),
    )
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
