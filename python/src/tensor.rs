//! `textnet.Tensor`: the Python face of `nn::Tensor`. It holds an f32 or f64 tensor (with its graph and
//! gradient), or class ids (int64: what `embedding` and `cross_entropy` read); its methods are the ops of
//! `nn`, its operators `+ - * / @` and slicing.
//!
//! Every failing op raises `nn`'s typed error by its kind (`errors::nn_error`); operands of two dtypes are
//! refused here, naming the op, both dtypes and both shapes.

use crate::errors::nn_error;
use numpy::{Element, IntoPyArray, PyArrayDescr, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyEllipsis, PySlice, PySliceMethods, PyTuple};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use textnet::device::precision::Precision;
use textnet::nn::{self, Device, Tensor};
use textnet::ops::cpu::Real;

/// The elements of a `textnet.Tensor`.
#[derive(Clone)]
pub(crate) enum Data {
    F32(Tensor<f32>),
    F64(Tensor<f64>),
    /// Class ids in host memory, outside any graph.
    Ids {
        values: Arc<Vec<i64>>,
        shape: Vec<usize>,
    },
    /// Class ids on the GPU, as the f32 values `nn`'s device ops read (`Embedding::forward`,
    /// `cross_entropy_ids`): exact for every id of magnitude up to 2²⁴. A captured step reads each replay's.
    DeviceIds(Tensor<f32>),
}

/// Ids on the host, with their shape.
pub(crate) type HostIds = (Arc<Vec<i64>>, Vec<usize>);

/// The largest id magnitude an f32 holds exactly.
const LARGEST_DEVICE_ID: i64 = 1 << 24;

/// A float type a `textnet.Tensor` holds.
pub(crate) trait Float: Real + Element {
    fn wrap(tensor: Tensor<Self>) -> Data;
    /// The tensor of `data` when it holds this type.
    fn of(data: &Data) -> Option<&Tensor<Self>>;
}

impl Float for f32 {
    fn wrap(tensor: Tensor<f32>) -> Data {
        Data::F32(tensor)
    }
    fn of(data: &Data) -> Option<&Tensor<f32>> {
        if let Data::F32(t) = data { Some(t) } else { None }
    }
}

impl Float for f64 {
    fn wrap(tensor: Tensor<f64>) -> Data {
        Data::F64(tensor)
    }
    fn of(data: &Data) -> Option<&Tensor<f64>> {
        if let Data::F64(t) = data { Some(t) } else { None }
    }
}

impl Data {
    pub(crate) fn shape(&self) -> &[usize] {
        match self {
            Data::F32(t) => t.shape(),
            Data::F64(t) => t.shape(),
            Data::Ids { shape, .. } => shape,
            Data::DeviceIds(t) => t.shape(),
        }
    }

    pub(crate) fn dtype_name(&self) -> &'static str {
        match self {
            Data::F32(_) => "float32",
            Data::F64(_) => "float64",
            Data::Ids { .. } | Data::DeviceIds(_) => "int64",
        }
    }

    pub(crate) fn on_gpu(&self) -> bool {
        match self {
            Data::F32(t) | Data::DeviceIds(t) => t.is_on_device(),
            Data::F64(t) => t.is_on_device(),
            Data::Ids { .. } => false,
        }
    }

    /// The ids of an int64 tensor, on the host (read back from the GPU), with their shape; None for floats.
    pub(crate) fn host_ids(&self) -> PyResult<Option<HostIds>> {
        Ok(match self {
            Data::Ids { values, shape } => Some((Arc::clone(values), shape.clone())),
            Data::DeviceIds(t) => {
                let values = t.values().map_err(nn_error)?.into_iter().map(|v| v as i64).collect();
                Some((Arc::new(values), t.shape().to_vec()))
            }
            Data::F32(_) | Data::F64(_) => None,
        })
    }

    /// The elements as f64, row-major (copied back from the GPU).
    fn values_f64(&self) -> PyResult<Vec<f64>> {
        Ok(match self {
            Data::F32(t) => t.values().map_err(nn_error)?.into_iter().map(f64::from).collect(),
            Data::F64(t) => t.values().map_err(nn_error)?,
            Data::Ids { values, .. } => values.iter().map(|&v| v as f64).collect(),
            Data::DeviceIds(t) => t.values().map_err(nn_error)?.into_iter().map(f64::from).collect(),
        })
    }
}

/// `op` refused int64 ids.
pub(crate) fn not_float(op: &str, data: &Data) -> PyErr {
    PyValueError::new_err(format!(
        "{op}: the tensor {:?} holds int64 ids; the op takes float32 or float64",
        data.shape()
    ))
}

/// `op` refused operands of two dtypes (or two of ids, which it takes no more than one of).
pub(crate) fn dtypes_differ(op: &str, a: &Data, b: &Data) -> PyErr {
    if a.dtype_name() == b.dtype_name() {
        return not_float(op, a);
    }
    PyValueError::new_err(format!(
        "{op}: dtypes {} and {} differ (shapes {:?} and {:?})",
        a.dtype_name(),
        b.dtype_name(),
        a.shape(),
        b.shape()
    ))
}

/// `$body` (an `nn::Result<Tensor<F>>` of `$t`, the float tensor of `$data`) as a `PyResult<Data>`.
macro_rules! float_op {
    ($op:expr, $data:expr, |$t:ident| $body:expr) => {
        match $data {
            Data::F32($t) => $body.map(Data::F32).map_err(nn_error),
            Data::F64($t) => $body.map(Data::F64).map_err(nn_error),
            ids => Err(not_float($op, ids)),
        }
    };
}

/// `float_op` for two operands of one dtype.
macro_rules! float_pair_op {
    ($op:expr, $a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {
        match ($a, $b) {
            (Data::F32($x), Data::F32($y)) => $body.map(Data::F32).map_err(nn_error),
            (Data::F64($x), Data::F64($y)) => $body.map(Data::F64).map_err(nn_error),
            (a, b) => Err(dtypes_differ($op, a, b)),
        }
    };
}

/// `$body` with the type `$f` standing for the float type of `$data`.
macro_rules! by_dtype {
    ($op:expr, $data:expr, $f:ident => $body:expr) => {
        match $data {
            Data::F32(_) => {
                type $f = f32;
                $body
            }
            Data::F64(_) => {
                type $f = f64;
                $body
            }
            ids => Err(not_float($op, ids)),
        }
    };
}

/// A layout op (`reshape`, `narrow`, `permute`, …) on any tensor: on host ids through an f64 tensor of
/// them, which holds every id below 2⁵³ exactly.
macro_rules! layout_op {
    ($data:expr, |$t:ident| $body:expr) => {
        match $data {
            Data::F32($t) => $body.map(Data::F32).map_err(nn_error),
            Data::F64($t) => $body.map(Data::F64).map_err(nn_error),
            Data::DeviceIds($t) => $body.map(Data::DeviceIds).map_err(nn_error),
            Data::Ids { values, shape } => {
                let values = values.iter().map(|&v| v as f64).collect();
                let $t = &Tensor::<f64>::from_vec(values, shape).map_err(nn_error)?;
                let out = $body.map_err(nn_error)?;
                Ok(ids_of_f64(&out))
            }
        }
    };
}

pub(crate) use {by_dtype, float_op, float_pair_op};

/// Host ids of the whole numbers an f64 tensor holds.
pub(crate) fn ids_of_f64(t: &Tensor<f64>) -> Data {
    let values = t.to_vec().into_iter().map(|v| v as i64).collect();
    Data::Ids { values: Arc::new(values), shape: t.shape().to_vec() }
}

/// The GPU of every `textnet.Tensor` on "cuda", once opened.
static GPU: OnceLock<Arc<Device>> = OnceLock::new();

/// The precision of the GPU's products that `set_precision` chose: the GPU takes it when it opens.
static PRECISION: Mutex<Precision> = Mutex::new(Precision::Fp32);

/// The GPU of every `textnet.Tensor` on "cuda", opened at the first use.
pub(crate) fn gpu() -> PyResult<Arc<Device>> {
    if let Some(device) = GPU.get() {
        return Ok(Arc::clone(device));
    }
    let device = Device::open(0).map_err(nn_error)?;
    let device = GPU.get_or_init(|| device);
    device.set_precision(*PRECISION.lock().unwrap_or_else(PoisonError::into_inner)).map_err(nn_error)?;
    Ok(Arc::clone(device))
}

/// How the GPU's products (`matmul`, `linear`, attention, the convolutions; forward and backward) multiply
/// from now on: "fp32" (the default), "tf32" (the convolutions in one TF32 product, as PyTorch's by
/// default) or "bf16" on the tensor cores, operands rounded to bf16 and summed in fp32 (`Device::
/// set_precision`). Applied to the GPU now if it is open, else when it opens; the CPU's ops are unchanged
/// by it.
#[pyfunction]
pub(crate) fn set_precision(precision: &str) -> PyResult<()> {
    let wanted = match precision {
        "fp32" => Precision::Fp32,
        "tf32" => Precision::Tf32,
        "bf16" => Precision::Bf16,
        other => {
            return Err(PyValueError::new_err(format!(
                "set_precision: the products run in \"fp32\", \"tf32\" or \"bf16\", got {other:?}"
            )));
        }
    };
    let mut chosen = PRECISION.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(device) = GPU.get() {
        device.set_precision(wanted).map_err(nn_error)?;
    }
    *chosen = wanted;
    Ok(())
}

/// The precision `set_precision` chose: "fp32", "tf32" or "bf16".
#[pyfunction]
pub(crate) fn precision() -> &'static str {
    PRECISION.lock().unwrap_or_else(PoisonError::into_inner).name()
}

/// Whether `name` ("cpu", "cuda", "cuda:0") is the GPU.
fn is_gpu(name: &str) -> PyResult<bool> {
    match name {
        "cpu" => Ok(false),
        "cuda" | "cuda:0" => Ok(true),
        other => Err(PyValueError::new_err(format!("device must be \"cpu\" or \"cuda\", got {other:?}"))),
    }
}

/// `data` on the GPU or on the host: itself when it is there already, else a copy (a leaf).
fn placed(data: &Data, on_gpu: bool) -> PyResult<Data> {
    if data.on_gpu() == on_gpu {
        return Ok(data.clone());
    }
    if let Data::Ids { values, shape } = data {
        if let Some(&id) = values.iter().find(|id| id.abs() > LARGEST_DEVICE_ID) {
            return Err(PyValueError::new_err(format!(
                "to: id {id} cannot go to the GPU, which holds ids of magnitude up to {LARGEST_DEVICE_ID}"
            )));
        }
        let device = gpu()?;
        let values = values.iter().map(|&v| v as f32).collect();
        let ids = Tensor::from_vec(values, shape).and_then(|t| t.to_device(&device)).map_err(nn_error)?;
        return Ok(Data::DeviceIds(ids));
    }
    if let Some((values, shape)) = data.host_ids()? {
        return Ok(Data::Ids { values, shape });
    }
    let device = if on_gpu { Some(gpu()?) } else { None };
    float_op!("to", data, |t| match &device {
        Some(device) => t.to_device(device),
        None => t.to_host(),
    })
}

/// An array's elements in row-major order: one copy where they lie that way (C order; an
/// element-by-element walk of a dynamic-rank array costs nanoseconds an element), a walk otherwise (a
/// slice of a Fortran-order array would be column-major).
fn elements<T: numpy::Element + Copy>(array: &PyReadonlyArrayDyn<'_, T>) -> Vec<T> {
    use numpy::PyUntypedArrayMethods;
    match array.as_slice() {
        Ok(values) if array.is_c_contiguous() => values.to_vec(),
        _ => array.as_array().iter().copied().collect(),
    }
}

/// A tensor of `F` from a NumPy array of `F`, or None when `array` is not one.
fn from_array<F: Float>(array: &Bound<'_, PyAny>) -> PyResult<Option<Data>> {
    let Ok(array) = array.extract::<PyReadonlyArrayDyn<'_, F>>() else { return Ok(None) };
    let values = elements(&array);
    Ok(Some(F::wrap(Tensor::from_vec(values, array.shape()).map_err(nn_error)?)))
}

/// The same elements (shared) outside the graph.
fn detached(data: &Data) -> Data {
    match data {
        Data::F32(t) => Data::F32(t.detach()),
        Data::F64(t) => Data::F64(t.detach()),
        ids => ids.clone(),
    }
}

/// The four arithmetic operators.
#[derive(Clone, Copy)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
}

fn tensor_arith<F: Real>(a: &Tensor<F>, b: &Tensor<F>, op: Arith) -> nn::Result<Tensor<F>> {
    match op {
        Arith::Add => a.add(b),
        Arith::Sub => a.sub(b),
        Arith::Mul => a.mul(b),
        Arith::Div => a.div(b),
    }
}

/// `x op s`, or `s op x` when `reflected`.
fn scalar_arith<F: Real>(x: &Tensor<F>, s: f64, op: Arith, reflected: bool) -> nn::Result<Tensor<F>> {
    let s = F::from(s).unwrap_or_else(F::nan);
    match (op, reflected) {
        (Arith::Add, _) => x.add_scalar(s),
        (Arith::Mul, _) => x.mul_scalar(s),
        (Arith::Sub, false) => x.sub_scalar(s),
        (Arith::Sub, true) => x.neg()?.add_scalar(s),
        (Arith::Div, false) => x.div_scalar(s),
        (Arith::Div, true) => {
            let s = Tensor::scalar(s);
            let s = match x.device() {
                Some(device) => s.to_device(&device)?,
                None => s,
            };
            s.div(x)
        }
    }
}

/// `x` with the axes `a` and `b` swapped when they differ.
fn swapped<F: Real>(x: &Tensor<F>, a: usize, b: usize) -> nn::Result<Tensor<F>> {
    if a == b { Ok(x.clone()) } else { x.transpose(a as isize, b as isize) }
}

/// `axis` counted from the front when it is an axis of `rank` axes (negative: from the end); else as
/// given, for the op to refuse with its shape.
fn from_front(axis: isize, rank: usize) -> isize {
    if axis < 0 && axis + rank as isize >= 0 { axis + rank as isize } else { axis }
}

/// A softmax over `axis`: over the last axis after swapping `axis` there, then swapped back.
fn softmax_along<F: Real>(x: &Tensor<F>, axis: isize, log: bool) -> nn::Result<Tensor<F>> {
    let last = x.rank().saturating_sub(1);
    let axis = from_front(axis, x.rank());
    let axis = usize::try_from(axis).ok().filter(|&a| a < x.rank()).ok_or_else(|| nn::Error::Shape {
        op: "softmax",
        shape: x.shape().to_vec(),
        problem: format!("has no axis {axis}"),
    })?;
    let rows = swapped(x, axis, last)?;
    let normalised = if log { rows.log_softmax()? } else { rows.softmax()? };
    swapped(&normalised, axis, last)
}

/// The whole power `x^n` (n ≥ 1) as products.
fn power<F: Real>(x: &Tensor<F>, n: u32) -> nn::Result<Tensor<F>> {
    (1..n).try_fold(x.clone(), |product, _| product.mul(x))
}

/// `shape` with a −1 standing for what the element count leaves, as `reshape` reads it.
fn resolved_shape(op: &str, from: &[usize], shape: &[isize]) -> PyResult<Vec<usize>> {
    let count: usize = from.iter().product();
    let unknown: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] == -1).collect();
    let known: usize = shape.iter().filter(|&&d| d != -1).map(|&d| d.max(0) as usize).product();
    let bad =
        || PyValueError::new_err(format!("{op}: shape {from:?} cannot be viewed as {shape:?} ({count} elements)"));
    if shape.iter().any(|&d| d < -1) || unknown.len() > 1 {
        return Err(bad());
    }
    let mut out: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
    if let [i] = unknown[..] {
        if known == 0 || !count.is_multiple_of(known) {
            return Err(bad());
        }
        out[i] = count / known;
    }
    Ok(out)
}

/// Integers given as separate arguments (`view(2, 3)`) or as one sequence (`view((2, 3))`).
fn int_args(args: &Bound<'_, PyTuple>) -> PyResult<Vec<isize>> {
    if args.len() == 1
        && let Ok(first) = args.get_item(0)
        && let Ok(list) = first.extract::<Vec<isize>>()
    {
        return Ok(list);
    }
    args.extract()
}

/// `nn`'s error of `x[ids]` as PyTorch raises it: an id out of range (or not whole) is an `IndexError`,
/// the others as `nn_error`.
fn index_error(e: nn::Error) -> PyErr {
    match e {
        nn::Error::Value { .. } => PyIndexError::new_err(e.to_string()),
        e => nn_error(e),
    }
}

/// `x[ids]` for the int64 tensor `ids`, as PyTorch's: the slices of `x` along its first axis at the ids
/// (negative: from the end), in shape `ids.shape + x.shape[1:]` (`nn::index_rows`), with the gradient of a
/// float `x`; ids index ids too. Host ids index a tensor anywhere (they go up for one on the GPU, as PyTorch
/// takes CPU indices for a CUDA tensor) and are checked; ids on the GPU index a tensor there and stay there
/// unchecked (an id that is not a row gives a slice of NaN, `nn::index_rows_tensor`).
fn rows_at(x: &Data, ids: &Data) -> PyResult<Data> {
    if x.shape().is_empty() {
        return Err(PyIndexError::new_err(format!("index: too many indices for shape {:?}", x.shape())));
    }
    match (x, ids) {
        (_, Data::F32(_) | Data::F64(_)) => {
            return Err(PyIndexError::new_err(format!(
                "index: tensors used as indices must hold int64 ids, got {} {:?}",
                ids.dtype_name(),
                ids.shape()
            )));
        }
        (Data::F32(t), Data::Ids { values, shape }) => nn::index_rows(t, values, shape).map(Data::F32),
        (Data::F64(t), Data::Ids { values, shape }) => nn::index_rows(t, values, shape).map(Data::F64),
        (Data::DeviceIds(t), Data::Ids { values, shape }) => nn::index_rows(t, values, shape).map(Data::DeviceIds),
        (Data::Ids { values: labels, shape: labels_shape }, Data::Ids { values, shape }) => {
            // The labels' positions gathered (each exact in an f64), then the labels at them: every int64 kept.
            let positions = (0..labels.len()).map(|p| p as f64).collect();
            let positions = Tensor::<f64>::from_vec(positions, labels_shape).map_err(nn_error)?;
            nn::index_rows(&positions, values, shape).map(|picked| {
                let values = picked.to_vec().into_iter().map(|p| labels[p as usize]).collect();
                Data::Ids { values: Arc::new(values), shape: picked.shape().to_vec() }
            })
        }
        (Data::F32(t), Data::DeviceIds(ids)) if t.is_on_device() => nn::index_rows_tensor(t, ids).map(Data::F32),
        (Data::DeviceIds(t), Data::DeviceIds(ids)) => nn::index_rows_tensor(t, ids).map(Data::DeviceIds),
        (x, Data::DeviceIds(ids)) => {
            let problem = format!(
                "the tensors live in two places ({:?} on the host, ids {:?} on the GPU): move them to one with .to()",
                x.shape(),
                ids.shape()
            );
            Err(nn::Error::Device { op: "index", problem })
        }
    }
    .map_err(index_error)
}

/// A `textnet.Tensor`.
#[pyclass(name = "Tensor", module = "textnet._native", subclass, frozen)]
pub(crate) struct PyTensor {
    pub(crate) data: Data,
}

impl PyTensor {
    pub(crate) fn of(data: Data) -> PyTensor {
        PyTensor { data }
    }

    fn object(py: Python<'_>, data: Data) -> PyResult<Py<PyAny>> {
        Ok(Bound::new(py, PyTensor::of(data))?.into_any().unbind())
    }

    /// `self op other` (`other op self` when `reflected`) for a tensor or a number, else NotImplemented.
    fn arith(&self, py: Python<'_>, other: &Bound<'_, PyAny>, op: Arith, reflected: bool) -> PyResult<Py<PyAny>> {
        const NAMES: [&str; 4] = ["add", "sub", "mul", "div"];
        let name = NAMES[op as usize];
        if let Ok(other) = other.extract::<PyRef<'_, PyTensor>>() {
            let (a, b) = if reflected { (&other.data, &self.data) } else { (&self.data, &other.data) };
            return Self::object(py, float_pair_op!(name, a, b, |x, y| tensor_arith(x, y, op))?);
        }
        let Ok(scalar) = other.extract::<f64>() else { return Ok(py.NotImplemented()) };
        Self::object(py, float_op!(name, &self.data, |x| scalar_arith(x, scalar, op, reflected))?)
    }

    /// The sum (mean when `mean`) over `dims` (None: every element).
    fn reduce(&self, dims: Option<&Bound<'_, PyAny>>, keepdim: bool, mean: bool) -> PyResult<PyTensor> {
        let op = if mean { "mean" } else { "sum" };
        let Some(dims) = dims.filter(|d| !d.is_none()) else {
            let data = float_op!(op, &self.data, |t| if mean { t.mean_all() } else { t.sum_all() })?;
            return Ok(PyTensor::of(data));
        };
        let rank = self.data.shape().len();
        let mut axes: Vec<isize> = match dims.extract::<isize>() {
            Ok(axis) => vec![axis],
            Err(_) => dims.extract::<Vec<isize>>()?,
        };
        // From the last axis down, so that removing one leaves the others' indices as they are.
        axes.iter_mut().for_each(|a| *a = from_front(*a, rank));
        axes.sort_unstable_by(|a, b| b.cmp(a));
        let mut data = self.data.clone();
        for axis in axes {
            data = float_op!(op, &data, |t| if mean { t.mean(axis, keepdim) } else { t.sum(axis, keepdim) })?;
        }
        Ok(PyTensor::of(data))
    }

    fn layout(&self, f: impl FnOnce(&Data) -> PyResult<Data>) -> PyResult<PyTensor> {
        f(&self.data).map(PyTensor::of)
    }

    fn reshaped(&self, op: &str, shape: &[isize]) -> PyResult<PyTensor> {
        let shape = resolved_shape(op, self.data.shape(), shape)?;
        self.layout(|d| layout_op!(d, |t| t.reshape(&shape)))
    }
}

#[pymethods]
impl PyTensor {
    /// A tensor of `data` (a NumPy array of float32, float64 or int64, copied; or a tensor, whose elements
    /// it shares outside its graph), on `device`, a leaf that requires a gradient when `requires_grad`.
    #[new]
    #[pyo3(signature = (data, requires_grad = false, device = None))]
    fn new(data: &Bound<'_, PyAny>, requires_grad: bool, device: Option<&str>) -> PyResult<Self> {
        let mut made = if let Ok(tensor) = data.extract::<PyRef<'_, PyTensor>>() {
            detached(&tensor.data)
        } else if let Some(made) = from_array::<f32>(data)? {
            made
        } else if let Some(made) = from_array::<f64>(data)? {
            made
        } else if let Ok(ids) = data.extract::<PyReadonlyArrayDyn<'_, i64>>() {
            let values = elements(&ids);
            Data::Ids { values: Arc::new(values), shape: ids.shape().to_vec() }
        } else {
            let kind = data.get_type().name()?;
            return Err(PyTypeError::new_err(format!(
                "Tensor: data must be a tensor or a NumPy array of float32, float64 or int64, got {kind}"
            )));
        };
        if let Some(device) = device {
            made = placed(&made, is_gpu(device)?)?;
        }
        let made = PyTensor::of(made);
        if requires_grad {
            made.set_requires_grad(true)?;
        }
        Ok(made)
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.data.shape())
    }

    /// The shape, or the size of axis `dim`.
    #[pyo3(signature = (dim = None))]
    fn size(&self, py: Python<'_>, dim: Option<isize>) -> PyResult<Py<PyAny>> {
        let shape = self.data.shape();
        let Some(dim) = dim else { return Ok(PyTuple::new(py, shape)?.into_any().unbind()) };
        let axis = usize::try_from(from_front(dim, shape.len())).ok().filter(|&a| a < shape.len());
        let axis = axis.ok_or_else(|| PyIndexError::new_err(format!("size: shape {shape:?} has no axis {dim}")))?;
        Ok(shape[axis].into_pyobject(py)?.into_any().unbind())
    }

    #[getter]
    fn ndim(&self) -> usize {
        self.data.shape().len()
    }

    fn dim(&self) -> usize {
        self.data.shape().len()
    }

    fn numel(&self) -> usize {
        self.data.shape().iter().product()
    }

    fn __len__(&self) -> PyResult<usize> {
        self.data.shape().first().copied().ok_or_else(|| PyTypeError::new_err("len() of a 0-d tensor"))
    }

    /// The NumPy dtype of the elements.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> Bound<'py, PyArrayDescr> {
        match self.data {
            Data::F32(_) => numpy::dtype::<f32>(py),
            Data::F64(_) => numpy::dtype::<f64>(py),
            Data::Ids { .. } | Data::DeviceIds(_) => numpy::dtype::<i64>(py),
        }
    }

    /// "cuda" or "cpu".
    #[getter]
    fn device(&self) -> &'static str {
        if self.data.on_gpu() { "cuda" } else { "cpu" }
    }

    #[getter]
    fn is_leaf(&self) -> bool {
        match &self.data {
            Data::F32(t) => t.is_leaf(),
            Data::F64(t) => t.is_leaf(),
            Data::Ids { .. } | Data::DeviceIds(_) => true,
        }
    }

    #[getter]
    fn requires_grad(&self) -> bool {
        match &self.data {
            Data::F32(t) => t.requires_grad(),
            Data::F64(t) => t.requires_grad(),
            Data::Ids { .. } | Data::DeviceIds(_) => false,
        }
    }

    #[setter]
    fn set_requires_grad(&self, flag: bool) -> PyResult<()> {
        match &self.data {
            Data::F32(t) => t.set_requires_grad(flag).map_err(nn_error),
            Data::F64(t) => t.set_requires_grad(flag).map_err(nn_error),
            ids if flag => Err(not_float("requires_grad", ids)),
            Data::Ids { .. } | Data::DeviceIds(_) => Ok(()),
        }
    }

    /// Sets `requires_grad` and returns the tensor.
    #[pyo3(signature = (flag = true))]
    fn requires_grad_(slf: Bound<'_, Self>, flag: bool) -> PyResult<Bound<'_, Self>> {
        slf.get().set_requires_grad(flag)?;
        Ok(slf)
    }

    /// The gradient the backward calls so far accumulated, None before the first and after `zero_grad`.
    #[getter]
    fn grad(&self) -> Option<PyTensor> {
        match &self.data {
            Data::F32(t) => t.grad().map(|g| PyTensor::of(Data::F32(g))),
            Data::F64(t) => t.grad().map(|g| PyTensor::of(Data::F64(g))),
            Data::Ids { .. } | Data::DeviceIds(_) => None,
        }
    }

    /// `x.grad = g` sets the gradient to a copy of the tensor `g` (of `x`'s shape, dtype and device);
    /// `x.grad = None` (or `del x.grad`) forgets it.
    #[setter]
    fn set_grad(&self, grad: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let grad = match grad.filter(|g| !g.is_none()) {
            None => None,
            Some(g) => Some(
                g.extract::<PyRef<'_, PyTensor>>()
                    .map_err(|_| PyTypeError::new_err("grad: assign a tensor or None"))?,
            ),
        };
        match (&self.data, grad.as_ref().map(|g| &g.data)) {
            (Data::F32(t), None) => t.zero_grad(),
            (Data::F64(t), None) => t.zero_grad(),
            (Data::F32(t), Some(Data::F32(g))) => t.set_grad(Some(g)).map_err(nn_error)?,
            (Data::F64(t), Some(Data::F64(g))) => t.set_grad(Some(g)).map_err(nn_error)?,
            (Data::Ids { .. } | Data::DeviceIds(_), None) => {}
            (mine, Some(theirs)) => return Err(dtypes_differ("grad", mine, theirs)),
        }
        Ok(())
    }

    /// `copy.deepcopy`: a leaf of this class (a `Parameter` stays one) with elements and gradient of its
    /// own, in the same place and requiring a gradient when this one does; a subclass's attributes are
    /// deep-copied too. A computed tensor is refused, as in PyTorch.
    fn __deepcopy__<'py>(slf: &Bound<'py, Self>, memo: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let copy = match &this.data {
            Data::F32(t) => Data::F32(t.deep_copy().map_err(nn_error)?),
            Data::F64(t) => Data::F64(t.deep_copy().map_err(nn_error)?),
            Data::DeviceIds(t) => Data::DeviceIds(t.deep_copy().map_err(nn_error)?),
            Data::Ids { values, shape } => Data::Ids { values: Arc::new(values.to_vec()), shape: shape.clone() },
        };
        let grad = this.grad();
        let made = slf.get_type().call1((PyTensor::of(copy), this.requires_grad()))?;
        if let Some(grad) = grad {
            made.setattr("grad", grad)?;
        }
        if let Ok(attributes) = slf.getattr("__dict__") {
            let copied = py.import("copy")?.getattr("deepcopy")?.call1((attributes, memo))?;
            made.getattr("__dict__")?.call_method1("update", (copied,))?;
        }
        Ok(made)
    }

    /// Back-propagates from this tensor (one element, or `gradient` of its shape), then frees the graph
    /// unless `retain_graph`.
    #[pyo3(signature = (gradient = None, retain_graph = false))]
    fn backward(&self, py: Python<'_>, gradient: Option<PyRef<'_, PyTensor>>, retain_graph: bool) -> PyResult<()> {
        let outcome = match (&self.data, gradient.as_ref().map(|g| &g.data)) {
            (Data::F32(t), None) => py.detach(|| t.backward_with(None, retain_graph)),
            (Data::F64(t), None) => py.detach(|| t.backward_with(None, retain_graph)),
            (Data::F32(t), Some(Data::F32(g))) => py.detach(|| t.backward_with(Some(g), retain_graph)),
            (Data::F64(t), Some(Data::F64(g))) => py.detach(|| t.backward_with(Some(g), retain_graph)),
            (ids, None) => return Err(not_float("backward", ids)),
            (a, Some(b)) => return Err(dtypes_differ("backward", a, b)),
        };
        outcome.map_err(nn_error)
    }

    /// The same elements (shared) outside the graph, needing no gradient.
    fn detach(&self) -> PyTensor {
        PyTensor::of(detached(&self.data))
    }

    /// Replaces the elements in place, outside the graph, with those of `source` (a tensor or an array
    /// of the same shape, converted to this dtype); returns the tensor.
    fn copy_<'py>(slf: Bound<'py, Self>, source: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let source = PyTensor::new(source, false, None)?;
        let (mine, theirs) = (&slf.get().data, &source.data);
        if mine.shape() != theirs.shape() {
            return Err(PyValueError::new_err(format!(
                "copy_: shapes {:?} and {:?} differ",
                mine.shape(),
                theirs.shape()
            )));
        }
        // Between two tensors of one kind on the GPU, a copy there that does not wait for it (a compiled
        // step's inputs are refilled so from each call's).
        match (mine, theirs) {
            (Data::F32(to), Data::F32(from)) | (Data::DeviceIds(to), Data::DeviceIds(from))
                if to.is_on_device() && from.is_on_device() =>
            {
                to.copy_from(from).map_err(nn_error)?;
                return Ok(slf);
            }
            _ => {}
        }
        let values = theirs.values_f64()?;
        match mine {
            Data::F32(t) => t.copy_from_slice(&values.iter().map(|&v| v as f32).collect::<Vec<_>>()),
            Data::F64(t) => t.copy_from_slice(&values),
            Data::DeviceIds(t) => {
                if let Some(id) = values.iter().find(|v| v.fract() != 0.0 || v.abs() > LARGEST_DEVICE_ID as f64) {
                    return Err(PyValueError::new_err(format!(
                        "copy_: {id} is not an id the GPU holds (whole numbers of magnitude up to {LARGEST_DEVICE_ID})"
                    )));
                }
                t.copy_from_slice(&values.iter().map(|&v| v as f32).collect::<Vec<_>>())
            }
            ids @ Data::Ids { .. } => {
                return Err(PyValueError::new_err(format!(
                    "copy_: the int64 tensor {:?} lives on the host, where ids do not change in place (ids on \
                     the GPU do)",
                    ids.shape()
                )));
            }
        }
        .map_err(nn_error)?;
        Ok(slf)
    }

    /// A copy of the elements as a NumPy array of this shape and dtype.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        fn array<'py, F: Float>(py: Python<'py>, t: &Tensor<F>) -> PyResult<Bound<'py, PyAny>> {
            let values = t.values().map_err(nn_error)?;
            Ok(values.into_pyarray(py).reshape(t.shape().to_vec())?.into_any())
        }
        match &self.data {
            Data::F32(t) => array(py, t),
            Data::F64(t) => array(py, t),
            ids => {
                let (values, shape) = ids.host_ids()?.unwrap_or_default();
                Ok(values.to_vec().into_pyarray(py).reshape(shape)?.into_any())
            }
        }
    }

    /// The one element, as a Python number.
    fn item(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.data {
            Data::F32(t) => Ok(f64::from(t.item().map_err(nn_error)?).into_pyobject(py)?.into_any().unbind()),
            Data::F64(t) => Ok(t.item().map_err(nn_error)?.into_pyobject(py)?.into_any().unbind()),
            ids => match ids.host_ids()?.unwrap_or_default() {
                (values, _) if values.len() == 1 => Ok(values[0].into_pyobject(py)?.into_any().unbind()),
                (_, shape) => Err(PyValueError::new_err(format!("item: shape {shape:?} is not one element"))),
            },
        }
    }

    fn __float__(&self) -> PyResult<f64> {
        match &self.data {
            Data::F32(t) => t.item().map(f64::from).map_err(nn_error),
            Data::F64(t) => t.item().map_err(nn_error),
            ids => Err(not_float("float", ids)),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let values = self.numpy(py)?.str()?.to_string().replace('\n', "\n       ");
        let mut extra = String::new();
        if !matches!(self.data, Data::F32(_)) {
            extra += &format!(", dtype={}", self.data.dtype_name());
        }
        if self.data.on_gpu() {
            extra += ", device='cuda'";
        }
        if self.requires_grad() {
            extra += ", requires_grad=True";
        }
        Ok(format!("tensor({values}{extra})"))
    }

    /// The tensor on `device` ("cpu" or "cuda"): itself when it is there, else a copy (a leaf).
    fn to(&self, device: &str) -> PyResult<PyTensor> {
        placed(&self.data, is_gpu(device)?).map(PyTensor::of)
    }

    fn cpu(&self) -> PyResult<PyTensor> {
        placed(&self.data, false).map(PyTensor::of)
    }

    fn cuda(&self) -> PyResult<PyTensor> {
        placed(&self.data, true).map(PyTensor::of)
    }

    fn __add__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(py, other, Arith::Add, false)
    }
    fn __radd__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(py, other, Arith::Add, true)
    }
    fn __sub__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(py, other, Arith::Sub, false)
    }
    fn __rsub__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(py, other, Arith::Sub, true)
    }
    fn __mul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(py, other, Arith::Mul, false)
    }
    fn __rmul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(py, other, Arith::Mul, true)
    }
    fn __truediv__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(py, other, Arith::Div, false)
    }
    fn __rtruediv__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.arith(py, other, Arith::Div, true)
    }

    fn __matmul__(&self, py: Python<'_>, other: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        self.matmul(py, other)
    }

    /// The matrix product, batched over leading axes (broadcast).
    fn matmul(&self, py: Python<'_>, other: PyRef<'_, PyTensor>) -> PyResult<PyTensor> {
        float_pair_op!("matmul", &self.data, &other.data, |a, b| py.detach(|| a.matmul(b))).map(PyTensor::of)
    }

    fn __neg__(&self) -> PyResult<PyTensor> {
        float_op!("neg", &self.data, |t| t.neg()).map(PyTensor::of)
    }

    fn __pow__(&self, exponent: &Bound<'_, PyAny>, _modulo: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        self.pow(exponent)
    }

    /// `x ** n` for a whole exponent n ≥ 1 (as products, so that its gradient is the products').
    fn pow(&self, exponent: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let whole = exponent.extract::<f64>().ok().filter(|e| e.fract() == 0.0 && *e >= 1.0 && *e <= 64.0);
        let Some(n) = whole else {
            return Err(PyValueError::new_err(format!(
                "pow: the exponent must be a whole number from 1 to 64, got {exponent}"
            )));
        };
        float_op!("pow", &self.data, |t| power(t, n as u32)).map(PyTensor::of)
    }

    /// The sum over `dim` (an axis or several; None: every element), kept as size 1 when `keepdim`.
    #[pyo3(signature = (dim = None, keepdim = false))]
    fn sum(&self, dim: Option<&Bound<'_, PyAny>>, keepdim: bool) -> PyResult<PyTensor> {
        self.reduce(dim, keepdim, false)
    }

    /// The mean over `dim` (as `sum`).
    #[pyo3(signature = (dim = None, keepdim = false))]
    fn mean(&self, dim: Option<&Bound<'_, PyAny>>, keepdim: bool) -> PyResult<PyTensor> {
        self.reduce(dim, keepdim, true)
    }

    #[pyo3(signature = (dim = -1))]
    fn softmax(&self, dim: isize) -> PyResult<PyTensor> {
        float_op!("softmax", &self.data, |t| softmax_along(t, dim, false)).map(PyTensor::of)
    }

    #[pyo3(signature = (dim = -1))]
    fn log_softmax(&self, dim: isize) -> PyResult<PyTensor> {
        float_op!("log_softmax", &self.data, |t| softmax_along(t, dim, true)).map(PyTensor::of)
    }

    fn relu(&self) -> PyResult<PyTensor> {
        float_op!("relu", &self.data, |t| t.relu()).map(PyTensor::of)
    }

    /// GELU in its tanh form, the one textnet has (PyTorch's `approximate="tanh"`).
    #[pyo3(signature = (approximate = "tanh"))]
    fn gelu(&self, approximate: &str) -> PyResult<PyTensor> {
        if approximate != "tanh" {
            return Err(PyValueError::new_err(format!(
                "gelu: approximate={approximate:?} is not in textnet, whose GELU is the tanh form (approximate=\"tanh\")"
            )));
        }
        float_op!("gelu", &self.data, |t| t.gelu()).map(PyTensor::of)
    }

    fn tanh(&self) -> PyResult<PyTensor> {
        float_op!("tanh", &self.data, |t| t.tanh()).map(PyTensor::of)
    }

    fn sigmoid(&self) -> PyResult<PyTensor> {
        float_op!("sigmoid", &self.data, |t| t.sigmoid()).map(PyTensor::of)
    }

    fn exp(&self) -> PyResult<PyTensor> {
        float_op!("exp", &self.data, |t| t.exp()).map(PyTensor::of)
    }

    fn log(&self) -> PyResult<PyTensor> {
        float_op!("log", &self.data, |t| t.log()).map(PyTensor::of)
    }

    /// The same elements in `shape` (one axis may be −1: what the others leave).
    #[pyo3(signature = (*shape))]
    fn view(&self, shape: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        self.reshaped("view", &int_args(shape)?)
    }

    #[pyo3(signature = (*shape))]
    fn reshape(&self, shape: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        self.reshaped("reshape", &int_args(shape)?)
    }

    /// The tensor itself: every tensor here is contiguous.
    fn contiguous(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn transpose(&self, dim0: isize, dim1: isize) -> PyResult<PyTensor> {
        self.layout(|d| layout_op!(d, |t| t.transpose(dim0, dim1)))
    }

    #[pyo3(signature = (*dims))]
    fn permute(&self, dims: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        let dims = int_args(dims)?;
        self.layout(|d| layout_op!(d, |t| t.permute(&dims)))
    }

    /// `length` elements from `start` along `dim`.
    fn narrow(&self, dim: isize, start: usize, length: usize) -> PyResult<PyTensor> {
        self.layout(|d| layout_op!(d, |t| t.narrow(dim, start, length)))
    }

    /// A new axis of size 1 at `dim`.
    fn unsqueeze(&self, dim: isize) -> PyResult<PyTensor> {
        let mut shape: Vec<isize> = self.data.shape().iter().map(|&d| d as isize).collect();
        let at = from_front(dim, shape.len() + 1);
        let at = usize::try_from(at).ok().filter(|&a| a <= shape.len()).ok_or_else(|| {
            PyIndexError::new_err(format!("unsqueeze: shape {:?} has no place {dim} for an axis", self.data.shape()))
        })?;
        shape.insert(at, 1);
        self.reshaped("unsqueeze", &shape)
    }

    /// Without the axes of size 1 (only `dim`'s, when given).
    #[pyo3(signature = (dim = None))]
    fn squeeze(&self, dim: Option<isize>) -> PyResult<PyTensor> {
        let shape = self.data.shape();
        let dim = dim.map(|d| from_front(d, shape.len()));
        let kept: Vec<isize> = (shape.iter().enumerate())
            .filter(|&(i, &size)| size != 1 || dim.is_some_and(|d| d != i as isize))
            .map(|(_, &size)| size as isize)
            .collect();
        self.reshaped("squeeze", &kept)
    }

    /// The axes `start_dim..=end_dim` as one.
    #[pyo3(signature = (start_dim = 0, end_dim = -1))]
    fn flatten(&self, start_dim: isize, end_dim: isize) -> PyResult<PyTensor> {
        let shape = self.data.shape();
        if shape.is_empty() {
            return self.reshaped("flatten", &[1]);
        }
        let (start, end) = (from_front(start_dim, shape.len()), from_front(end_dim, shape.len()));
        let in_range = |a: isize| usize::try_from(a).ok().filter(|&a| a < shape.len());
        let (Some(start), Some(end)) = (in_range(start), in_range(end)) else {
            return Err(PyIndexError::new_err(format!("flatten: shape {shape:?} has no axes {start_dim}..{end_dim}")));
        };
        let mut out: Vec<isize> = shape[..start].iter().map(|&d| d as isize).collect();
        out.push(shape[start..=end.max(start)].iter().product::<usize>() as isize);
        out.extend(shape[end.max(start) + 1..].iter().map(|&d| d as isize));
        self.reshaped("flatten", &out)
    }

    /// Pieces of `split_size` along `dim` (the last may be shorter), or of the sizes listed.
    #[pyo3(signature = (split_size, dim = 0))]
    fn split(&self, split_size: &Bound<'_, PyAny>, dim: isize) -> PyResult<Vec<PyTensor>> {
        let shape = self.data.shape();
        let axis = usize::try_from(from_front(dim, shape.len())).ok().filter(|&a| a < shape.len());
        let axis = axis.ok_or_else(|| PyIndexError::new_err(format!("split: shape {shape:?} has no axis {dim}")))?;
        let length = shape[axis];
        let sizes: Vec<usize> = match split_size.extract::<usize>() {
            Ok(0) => return Err(PyValueError::new_err("split: split_size must be at least 1")),
            Ok(size) => (0..length.div_ceil(size)).map(|i| size.min(length - i * size)).collect(),
            Err(_) => split_size.extract()?,
        };
        if sizes.iter().sum::<usize>() != length {
            return Err(PyValueError::new_err(format!(
                "split: sizes {sizes:?} do not add up to axis {dim} of shape {shape:?}"
            )));
        }
        let mut start = 0;
        let mut pieces = Vec::with_capacity(sizes.len());
        for size in sizes {
            pieces.push(self.narrow(axis as isize, start, size)?);
            start += size;
        }
        Ok(pieces)
    }

    /// `x[...]` with whole indices, slices of step 1 and `...` along the leading axes; or `x[ids]`, an
    /// int64 tensor of ids along the first axis (`rows_at`).
    fn __getitem__(&self, key: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        if let Ok(ids) = key.extract::<PyRef<'_, PyTensor>>() {
            return rows_at(&self.data, &ids.data).map(PyTensor::of);
        }
        let shape = self.data.shape().to_vec();
        let items: Vec<Bound<'_, PyAny>> = match key.cast::<PyTuple>() {
            Ok(tuple) => tuple.iter().collect(),
            Err(_) => vec![key.clone()],
        };
        let ellipses = items.iter().filter(|item| item.is_instance_of::<PyEllipsis>()).count();
        let indexed = items.len() - ellipses;
        if ellipses > 1 || indexed > shape.len() {
            return Err(PyIndexError::new_err(format!("index: too many indices for shape {shape:?}")));
        }
        let mut data = self.data.clone();
        let mut kept: Vec<isize> = Vec::new();
        let mut axis = 0;
        for item in &items {
            if item.is_instance_of::<PyEllipsis>() {
                let skipped = shape.len() - indexed;
                kept.extend(shape[axis..axis + skipped].iter().map(|&d| d as isize));
                axis += skipped;
                continue;
            }
            let size = shape[axis];
            if let Ok(slice) = item.cast::<PySlice>() {
                let range = slice.indices(size as isize)?;
                if range.step != 1 {
                    return Err(PyValueError::new_err(format!(
                        "index: slices of step {} are not supported (step 1 only)",
                        range.step
                    )));
                }
                let (start, length) = (range.start.max(0) as usize, range.slicelength);
                data = layout_op!(&data, |t| t.narrow(axis as isize, start, length))?;
                kept.push(length as isize);
            } else if let Ok(index) = item.extract::<isize>() {
                let at = usize::try_from(from_front(index, size)).ok().filter(|&i| i < size).ok_or_else(|| {
                    PyIndexError::new_err(format!("index {index} is out of range for axis {axis} of shape {shape:?}"))
                })?;
                data = layout_op!(&data, |t| t.narrow(axis as isize, at, 1))?;
            } else if item.is_instance_of::<PyTensor>() {
                return Err(PyIndexError::new_err(
                    "index: a tensor of ids is the whole key (x[ids], along the first axis); index the result \
                     for the other axes",
                ));
            } else {
                let kind = item.get_type().name()?;
                return Err(PyTypeError::new_err(format!(
                    "index: whole numbers, slices and ... index a tensor, got {kind}"
                )));
            }
            axis += 1;
        }
        kept.extend(shape[axis..].iter().map(|&d| d as isize));
        let out = PyTensor::of(data);
        out.reshaped("index", &kept)
    }
}
