//! The errors of `nn`: one line each, naming the op and the shapes it was given, typed by what went wrong
//! so that a caller (the Python binding, a trainer) can choose its reaction by kind, not by the text.

use std::fmt;
use std::path::{Path, PathBuf};

/// What `nn` returns: a tensor, a value, or the one error that stopped the op.
pub type Result<T> = std::result::Result<T, Error>;

/// Why an op refused its inputs. `Display` is the one-line message, e.g.
/// `add: shapes [2, 3] and [4] do not broadcast`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// Two shapes the op cannot combine: they do not broadcast, do not multiply, or differ.
    Shapes {
        /// The op, e.g. "matmul".
        op: &'static str,
        /// The first operand's shape.
        left: Vec<usize>,
        /// The second operand's shape.
        right: Vec<usize>,
        /// What is wrong, e.g. "do not broadcast".
        problem: &'static str,
    },
    /// One shape the op cannot take: an axis out of range, too few axes, an element count that differs.
    Shape {
        /// The op, e.g. "sum".
        op: &'static str,
        /// The shape given.
        shape: Vec<usize>,
        /// What is wrong with it, e.g. "has no axis 3".
        problem: String,
    },
    /// A value the op cannot take: a class index out of range, a learning rate that is not positive.
    Value {
        /// The op, e.g. "cross_entropy".
        op: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// The GPU refused or failed: tensors in two places, a dtype without device kernels (f64), a size past a
    /// kernel's int, a launch or copy the driver reported failing.
    Device {
        /// The op, e.g. "add".
        op: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// The graph cannot be walked back: a non-scalar without a gradient, a graph freed by an earlier
    /// backward, a tensor that needs no gradient.
    Graph {
        /// The op where the walk stopped ("backward", or the op whose graph was freed).
        op: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A file the op cannot read or write, or that is not what it reads (a state dict's safetensors).
    File {
        /// The op, e.g. "load_state_dict".
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong, a phrase that follows the path, e.g. "is not a safetensors file (header too small)".
        problem: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Shapes { op, left, right, problem } => write!(f, "{op}: shapes {left:?} and {right:?} {problem}"),
            Error::Shape { op, shape, problem } => write!(f, "{op}: shape {shape:?} {problem}"),
            Error::Value { op, problem } | Error::Graph { op, problem } | Error::Device { op, problem } => {
                write!(f, "{op}: {problem}")
            }
            Error::File { op, path, problem } => write!(f, "{op}: {} {problem}", path.display()),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// `left` and `right` cannot be combined by `op`.
    pub(crate) fn shapes(op: &'static str, left: &[usize], right: &[usize], problem: &'static str) -> Error {
        Error::Shapes { op, left: left.to_vec(), right: right.to_vec(), problem }
    }

    /// `shape` cannot be taken by `op`.
    pub(crate) fn shape(op: &'static str, shape: &[usize], problem: impl Into<String>) -> Error {
        Error::Shape { op, shape: shape.to_vec(), problem: problem.into() }
    }

    /// A value `op` cannot take.
    pub(crate) fn value(op: &'static str, problem: impl Into<String>) -> Error {
        Error::Value { op, problem: problem.into() }
    }

    /// A device failure or refusal in `op`.
    pub(crate) fn device(op: &'static str, problem: impl Into<String>) -> Error {
        Error::Device { op, problem: problem.into() }
    }

    /// A file `op` cannot read or write.
    pub(crate) fn file(op: &'static str, path: &Path, problem: impl Into<String>) -> Error {
        Error::File { op, path: path.to_path_buf(), problem: problem.into() }
    }

    /// A graph `op` cannot walk.
    pub(crate) fn graph(op: &'static str, problem: impl Into<String>) -> Error {
        Error::Graph { op, problem: problem.into() }
    }
}
