//! The tensor of `nn`: a shape (row-major, contiguous) over elements in a `Storage`, and, when it was
//! computed by an op while gradients are recorded, the op's inputs and backward. Cloning a `Tensor`
//! clones a handle, not the elements, as in PyTorch.
//!
//! The elements sit behind one enum, `Storage`: host memory, or a GPU's (`nn::cuda`). An op first finds
//! where its operands live (`cuda::place_of`), then runs its host loop or launches its kernel; a backward
//! is recorded for the same place (`Backward`). An op reads its inputs as snapshots
//! (`Arc<Storage>`), and its backward keeps the snapshots it needs: an in-place change of a parameter
//! (an optimizer step) after the forward copies the parameter first (copy on write), so a backward always
//! sees the values its forward saw.

use super::cuda::{self, Device, DeviceBuffer};
use super::error::{Error, Result};
use crate::ops::cpu::Real;
use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// Where a tensor's elements live.
#[derive(Clone, Debug, PartialEq)]
pub enum Storage<F> {
    /// In host memory, row-major.
    Host(Vec<F>),
    /// In a GPU's memory, row-major f32 (`nn::cuda`).
    Device(DeviceBuffer),
}

impl<F> Storage<F> {
    /// The elements of a host storage, row-major. Ops call it only after `cuda::place_of` found their
    /// operands on the host; a device storage here is a bug in the op, which panics.
    pub fn host(&self) -> &[F] {
        match self {
            Storage::Host(values) => values,
            Storage::Device(_) => panic!("internal: a host loop was given a device tensor"),
        }
    }

    /// The elements of a host storage, row-major, to change in place (as `host`).
    pub fn host_mut(&mut self) -> &mut [F] {
        match self {
            Storage::Host(values) => values,
            Storage::Device(_) => panic!("internal: a host loop was given a device tensor"),
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Storage::Host(values) => values.len(),
            Storage::Device(buffer) => buffer.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A backward: given the gradient of the op's output, the gradient of each input, `None` where the input
/// needs none (`needs[i]` false) or gets none.
pub(crate) type BackwardFn<F> = Box<dyn Fn(&[F], &[bool]) -> Result<Vec<Option<Vec<F>>>> + Send + Sync>;

/// A backward on the device: `BackwardFn`'s contract over device buffers (it launches kernels).
pub(crate) type DeviceBackwardFn =
    Box<dyn Fn(&DeviceBuffer, &[bool]) -> Result<Vec<Option<DeviceBuffer>>> + Send + Sync>;

/// An op's backward, in the place its forward ran.
pub(crate) enum Backward<F> {
    Host(BackwardFn<F>),
    Device(DeviceBackwardFn),
}

/// How a tensor came to be.
pub(crate) enum Origin<F: Real> {
    /// Made from values (or detached, or computed while nothing was recorded).
    Leaf,
    /// Computed by `op` from `inputs`; `backward` carries what it saved.
    Op { op: &'static str, inputs: Vec<Tensor<F>>, backward: Backward<F> },
    /// Computed by `op`, whose saved values an earlier backward freed.
    Freed { op: &'static str },
}

pub(crate) struct Node<F: Real> {
    pub(crate) shape: Vec<usize>,
    pub(crate) storage: Arc<RwLock<Arc<Storage<F>>>>,
    pub(crate) requires_grad: AtomicBool,
    pub(crate) grad: Mutex<Option<Storage<F>>>,
    pub(crate) origin: Mutex<Origin<F>>,
}

/// A tensor of `F` (f32, or f64 for exact checks) with reverse-mode autograd.
pub struct Tensor<F: Real = f32>(pub(crate) Arc<Node<F>>);

impl<F: Real> Clone for Tensor<F> {
    fn clone(&self) -> Self {
        Tensor(Arc::clone(&self.0))
    }
}

impl<F: Real> fmt::Debug for Tensor<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor{:?} ({}", self.shape(), self.op_name())?;
        if self.requires_grad() {
            write!(f, ", requires grad")?;
        }
        write!(f, ")")
    }
}

/// A lock's value even when another thread panicked while holding it (the values stay whole: every write
/// replaces them at once).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

thread_local! {
    static RECORDING: Cell<bool> = const { Cell::new(true) };
}

/// While it lives, ops on this thread record no graph (PyTorch's `torch.no_grad()`): their results need
/// no gradient and keep nothing for a backward. Dropping it restores what was before.
#[must_use = "gradients are off only while the guard lives"]
pub struct NoGradGuard {
    before: bool,
}

/// Turns recording off on this thread until the guard is dropped.
pub fn no_grad() -> NoGradGuard {
    NoGradGuard { before: RECORDING.with(|r| r.replace(false)) }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        RECORDING.with(|r| r.set(self.before));
    }
}

/// Whether ops on this thread record their graph now.
pub fn is_grad_enabled() -> bool {
    RECORDING.with(|r| r.get())
}

/// The number of elements of `shape` (1 for a scalar's `[]`), or None when it overflows.
pub(crate) fn element_count(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

impl<F: Real> Tensor<F> {
    fn from_parts(shape: Vec<usize>, storage: Arc<Storage<F>>, origin: Origin<F>, requires_grad: bool) -> Self {
        Tensor(Arc::new(Node {
            shape,
            storage: Arc::new(RwLock::new(storage)),
            requires_grad: AtomicBool::new(requires_grad),
            grad: Mutex::new(None),
            origin: Mutex::new(origin),
        }))
    }

    /// A leaf holding `values` in `shape` (row-major).
    pub fn from_vec(values: Vec<F>, shape: &[usize]) -> Result<Self> {
        match element_count(shape) {
            Some(n) if n == values.len() => {}
            Some(n) => {
                let problem = format!("holds {n} elements, but {} values were given", values.len());
                return Err(Error::shape("from_vec", shape, problem));
            }
            None => return Err(Error::shape("from_vec", shape, "has more elements than memory can address")),
        }
        Ok(Self::from_parts(shape.to_vec(), Arc::new(Storage::Host(values)), Origin::Leaf, false))
    }

    /// A leaf holding a copy of `values` in `shape` (row-major).
    pub fn from_slice(values: &[F], shape: &[usize]) -> Result<Self> {
        Self::from_vec(values.to_vec(), shape)
    }

    /// A leaf that requires a gradient: a parameter to train.
    pub fn parameter(values: Vec<F>, shape: &[usize]) -> Result<Self> {
        let tensor = Self::from_vec(values, shape)?;
        tensor.0.requires_grad.store(true, Ordering::Relaxed);
        Ok(tensor)
    }

    /// A leaf holding a device buffer's elements in `shape` (as many as it holds).
    pub(crate) fn from_device_buffer(buffer: DeviceBuffer, shape: Vec<usize>) -> Self {
        debug_assert_eq!(element_count(&shape), Some(buffer.len()));
        Self::from_parts(shape, Arc::new(Storage::Device(buffer)), Origin::Leaf, false)
    }

    /// A scalar (shape `[]`).
    pub fn scalar(value: F) -> Self {
        Self::from_parts(Vec::new(), Arc::new(Storage::Host(vec![value])), Origin::Leaf, false)
    }

    /// A leaf of `shape` filled with `value`.
    pub fn full(shape: &[usize], value: F) -> Result<Self> {
        let n = element_count(shape)
            .ok_or_else(|| Error::shape("full", shape, "has more elements than memory can address"))?;
        Self::from_vec(vec![value; n], shape)
    }

    /// A leaf of zeros.
    pub fn zeros(shape: &[usize]) -> Result<Self> {
        Self::full(shape, F::zero())
    }

    /// The result of `op` on `inputs`: `storage` in `shape`, with `backward` recorded when recording is on
    /// and an input requires a gradient (otherwise `backward`, and what it saved, are dropped here).
    /// `storage` is shared with `backward` when it needs the output (an in-place change of the output then
    /// copies it first).
    pub(crate) fn from_op(
        op: &'static str,
        storage: Arc<Storage<F>>,
        shape: Vec<usize>,
        inputs: &[&Tensor<F>],
        backward: BackwardFn<F>,
    ) -> Self {
        Self::recorded(op, storage, shape, inputs, Backward::Host(backward))
    }

    /// `from_op` for an op that ran on the device: `buffer` in `shape`, with a device `backward`.
    pub(crate) fn from_device_op(
        op: &'static str,
        buffer: DeviceBuffer,
        shape: Vec<usize>,
        inputs: &[&Tensor<F>],
        backward: DeviceBackwardFn,
    ) -> Self {
        Self::recorded(op, Arc::new(Storage::Device(buffer)), shape, inputs, Backward::Device(backward))
    }

    fn recorded(
        op: &'static str,
        storage: Arc<Storage<F>>,
        shape: Vec<usize>,
        inputs: &[&Tensor<F>],
        backward: Backward<F>,
    ) -> Self {
        debug_assert_eq!(element_count(&shape), Some(storage.len()), "{op}");
        if is_grad_enabled() && inputs.iter().any(|t| t.requires_grad()) {
            let inputs = inputs.iter().map(|&t| t.clone()).collect();
            Self::from_parts(shape, storage, Origin::Op { op, inputs, backward }, true)
        } else {
            Self::from_parts(shape, storage, Origin::Leaf, false)
        }
    }

    /// The shape, outermost axis first (`[]` for a scalar).
    pub fn shape(&self) -> &[usize] {
        &self.0.shape
    }

    /// The number of axes.
    pub fn rank(&self) -> usize {
        self.0.shape.len()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.0.shape.iter().product()
    }

    /// The elements as they are now (a snapshot: a later in-place change does not alter it).
    pub fn storage(&self) -> Arc<Storage<F>> {
        Arc::clone(&self.0.storage.read().unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    /// A copy of the elements, row-major, wherever they live (a device tensor's are copied back, after
    /// the launches that write them).
    pub fn values(&self) -> Result<Vec<F>> {
        match &*self.storage() {
            Storage::Host(values) => Ok(values.clone()),
            Storage::Device(buffer) => Ok(cuda::from_f32(buffer.to_host("values")?)),
        }
    }

    /// A copy of the elements, row-major. For a device tensor this is `values`, and a copy the GPU fails
    /// panics: use `values` where that can happen.
    pub fn to_vec(&self) -> Vec<F> {
        self.values().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Copies the elements into `out`, whose length must be the element count.
    pub fn copy_to(&self, out: &mut [F]) -> Result<()> {
        if out.len() != self.numel() {
            let problem = format!("holds {} elements, but the slice to copy them to has {}", self.numel(), out.len());
            return Err(Error::shape("copy_to", self.shape(), problem));
        }
        out.copy_from_slice(&self.values()?);
        Ok(())
    }

    /// The one element of a tensor of one element.
    pub fn item(&self) -> Result<F> {
        if self.numel() != 1 {
            return Err(Error::shape("item", self.shape(), "is not one element"));
        }
        Ok(self.values()?[0])
    }

    /// Changes the elements in place through `change`, outside the graph (an optimizer's update): a
    /// backward recorded before still sees the old values. A device tensor's elements are copied to the
    /// host and back (its optimizers update on the device instead).
    pub fn update_in_place(&self, change: impl FnOnce(&mut [F])) -> Result<()> {
        let mut storage = self.0.storage.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Storage::Device(buffer) = &**storage {
            const OP: &str = "update_in_place";
            let device = Arc::clone(buffer.device());
            let mut values = cuda::from_f32(buffer.to_host(OP)?);
            change(&mut values);
            let values = cuda::to_f32(&values);
            return replace_device(&mut storage, |buffer| buffer.overwrite(OP, &values), || device.upload(OP, &values));
        }
        change(Arc::make_mut(&mut storage).host_mut());
        Ok(())
    }

    /// The buffer that kernels changing this device tensor's elements in place should write: its own when
    /// nothing else holds it (a captured step's parameters keep their addresses), else a copy that
    /// replaces it for every handle at once (a backward recorded before keeps the old values, as on the
    /// host).
    pub(crate) fn buffer_to_update(&self, op: &'static str) -> Result<DeviceBuffer> {
        let mut storage = self.0.storage.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Storage::Device(buffer) = &**storage else {
            return Err(Error::device(op, "the tensor is not on a GPU"));
        };
        if Arc::strong_count(&storage) == 1 && buffer.is_unshared() {
            buffer.device().in_place_writes.fetch_add(1, Ordering::Relaxed);
            return Ok(buffer.clone());
        }
        let copy = buffer.duplicate(op)?;
        *storage = Arc::new(Storage::Device(copy.clone()));
        Ok(copy)
    }

    /// Replaces the elements in place with `values` (as `update_in_place`).
    pub fn copy_from_slice(&self, values: &[F]) -> Result<()> {
        const OP: &str = "copy_from_slice";
        if values.len() != self.numel() {
            let problem = format!("holds {} elements, but {} values were given", self.numel(), values.len());
            return Err(Error::shape(OP, self.shape(), problem));
        }
        let mut storage = self.0.storage.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Storage::Device(buffer) = &**storage else {
            drop(storage);
            return self.update_in_place(|mine| mine.copy_from_slice(values));
        };
        // Every element is replaced: the old ones are not read back first.
        let device = Arc::clone(buffer.device());
        let values = cuda::to_f32(values);
        replace_device(&mut storage, |buffer| buffer.overwrite(OP, &values), || device.upload(OP, &values))
    }

    /// Sets the elements to `source`'s (as many, of any shape), in place where nothing else holds them
    /// (a captured step's input keeps its address). Between two tensors on one GPU it is a copy in the
    /// stream's order, which neither waits for the GPU nor passes through the host; otherwise the values
    /// travel as `copy_from_slice`'s.
    pub fn copy_from(&self, source: &Tensor<F>) -> Result<()> {
        const OP: &str = "copy_from";
        if source.numel() != self.numel() {
            return Err(Error::shapes(OP, self.shape(), source.shape(), "differ in their number of elements"));
        }
        let theirs = source.storage();
        let Storage::Device(from) = &*theirs else { return self.copy_from_slice(&source.values()?) };
        let mut storage = self.0.storage.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        let same_device = matches!(&**storage, Storage::Device(mine) if Arc::ptr_eq(mine.device(), from.device()));
        if !same_device {
            drop(storage);
            return self.copy_from_slice(&source.values()?);
        }
        replace_device(&mut storage, |buffer| buffer.overwrite_from(OP, from), || from.duplicate(OP))
    }

    /// Whether the elements live on a GPU.
    pub fn is_on_device(&self) -> bool {
        matches!(&*self.storage(), Storage::Device(_))
    }

    /// The GPU the elements live on, None on the host.
    pub fn device(&self) -> Option<Arc<Device>> {
        match &*self.storage() {
            Storage::Host(_) => None,
            Storage::Device(buffer) => Some(Arc::clone(buffer.device())),
        }
    }

    /// A copy on `device`: a leaf outside the graph that requires a gradient when this one does (moving a
    /// parameter or an input, as PyTorch's `.to(device)` of a leaf). f32 only.
    pub fn to_device(&self, device: &Arc<Device>) -> Result<Tensor<F>> {
        if std::any::TypeId::of::<F>() != std::any::TypeId::of::<f32>() {
            return Err(Error::device("to_device", "device tensors hold f32 only"));
        }
        let buffer = match &*self.storage() {
            Storage::Device(buffer) if Arc::ptr_eq(buffer.device(), device) => buffer.clone(),
            Storage::Device(buffer) => device.upload("to_device", &buffer.to_host("to_device")?)?,
            Storage::Host(values) => device.upload("to_device", &cuda::to_f32(values))?,
        };
        Ok(Self::from_parts(
            self.shape().to_vec(),
            Arc::new(Storage::Device(buffer)),
            Origin::Leaf,
            self.requires_grad(),
        ))
    }

    /// A copy in host memory: a leaf outside the graph that requires a gradient when this one does.
    pub fn to_host(&self) -> Result<Tensor<F>> {
        let values = self.values()?;
        Ok(Self::from_parts(self.shape().to_vec(), Arc::new(Storage::Host(values)), Origin::Leaf, self.requires_grad()))
    }

    /// Moves this tensor's elements to `device` in place, for every handle of it (a module's parameters);
    /// its gradient is forgotten. A leaf only: a computed tensor belongs to its graph.
    pub fn move_to_device(&self, device: &Arc<Device>) -> Result<()> {
        if !self.is_leaf() {
            let problem =
                format!("the result of {} belongs to its graph: move its inputs, or detach it", self.op_name());
            return Err(Error::graph("move_to_device", problem));
        }
        let moved = self.to_device(device)?.storage();
        *self.0.storage.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = moved;
        self.zero_grad();
        Ok(())
    }

    /// Whether a backward through this tensor computes gradients.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad.load(Ordering::Relaxed)
    }

    /// Whether this tensor was made from values rather than computed by a recorded op.
    pub fn is_leaf(&self) -> bool {
        matches!(*lock(&self.0.origin), Origin::Leaf)
    }

    /// Marks a leaf as needing a gradient (a parameter), or not. A computed tensor's flag follows its
    /// inputs', and setting it is an error.
    pub fn set_requires_grad(&self, requires_grad: bool) -> Result<()> {
        if !self.is_leaf() {
            let problem = format!("the result of {} follows its inputs; detach it first", self.op_name());
            return Err(Error::graph("set_requires_grad", problem));
        }
        self.0.requires_grad.store(requires_grad, Ordering::Relaxed);
        Ok(())
    }

    /// The op that computed this tensor, or "leaf".
    pub fn op_name(&self) -> &'static str {
        match *lock(&self.0.origin) {
            Origin::Leaf => "leaf",
            Origin::Op { op, .. } | Origin::Freed { op } => op,
        }
    }

    /// The gradient accumulated by the backward calls so far (a leaf that requires grad only), as a new
    /// tensor of this shape; None before the first backward and after `zero_grad`.
    pub fn grad(&self) -> Option<Tensor<F>> {
        let grad = lock(&self.0.grad).clone()?;
        Some(Self::from_parts(self.0.shape.clone(), Arc::new(grad), Origin::Leaf, false))
    }

    /// Forgets the accumulated gradient (PyTorch's `zero_grad(set_to_none=True)`).
    pub fn zero_grad(&self) {
        *lock(&self.0.grad) = None;
    }

    /// Sets the accumulated gradient to a copy of `grad`'s elements, which must be of this shape and in
    /// this place (PyTorch's `x.grad = g`); None forgets it.
    pub fn set_grad(&self, grad: Option<&Tensor<F>>) -> Result<()> {
        const OP: &str = "set_grad";
        let Some(grad) = grad else {
            self.zero_grad();
            return Ok(());
        };
        if grad.shape() != self.shape() {
            return Err(Error::shape(OP, grad.shape(), format!("is not the tensor's shape {:?}", self.shape())));
        }
        let copy = match (&*self.storage(), &*grad.storage()) {
            (Storage::Host(_), Storage::Host(values)) => Storage::Host(values.clone()),
            (Storage::Device(mine), Storage::Device(theirs)) if Arc::ptr_eq(mine.device(), theirs.device()) => {
                Storage::Device(theirs.duplicate(OP)?)
            }
            _ => return Err(Error::device(OP, "the gradient is not in the tensor's place (host or GPU)")),
        };
        *lock(&self.0.grad) = Some(copy);
        Ok(())
    }

    /// Adds `grad` to the accumulated gradient, in element order (on the device: into a new buffer, so a
    /// gradient handed out by `grad()` keeps its values).
    pub(crate) fn accumulate_grad(&self, grad: Storage<F>) -> Result<()> {
        let mut mine = lock(&self.0.grad);
        let sum = match (mine.take(), grad) {
            (None, grad) => grad,
            (Some(Storage::Host(mut sum)), Storage::Host(grad)) => {
                sum.iter_mut().zip(grad).for_each(|(s, g)| *s = *s + g);
                Storage::Host(sum)
            }
            (Some(Storage::Device(sum)), Storage::Device(grad)) => Storage::Device(sum.plus(&grad)?),
            (Some(_), _) => return Err(Error::device("backward", "a gradient reached a tensor in another place")),
        };
        *mine = Some(sum);
        Ok(())
    }

    /// The same elements (shared, not copied) as a leaf outside the graph, needing no gradient.
    pub fn detach(&self) -> Tensor<F> {
        Tensor(Arc::new(Node {
            shape: self.0.shape.clone(),
            storage: Arc::clone(&self.0.storage),
            requires_grad: AtomicBool::new(false),
            grad: Mutex::new(None),
            origin: Mutex::new(Origin::Leaf),
        }))
    }

    /// A leaf with elements and gradient of its own, equal to this leaf's, in the same place and requiring
    /// a gradient when this one does: PyTorch's `copy.deepcopy` of a tensor. A computed tensor belongs to
    /// its graph and is refused, as PyTorch refuses it.
    pub fn deep_copy(&self) -> Result<Tensor<F>> {
        const OP: &str = "deepcopy";
        if !self.is_leaf() {
            let problem =
                format!("the result of {} belongs to its graph: deep-copy a leaf (detach it first)", self.op_name());
            return Err(Error::graph(OP, problem));
        }
        let copied = |storage: &Storage<F>| -> Result<Storage<F>> {
            Ok(match storage {
                Storage::Host(values) => Storage::Host(values.clone()),
                Storage::Device(buffer) => Storage::Device(buffer.duplicate(OP)?),
            })
        };
        let copy = Self::from_parts(self.0.shape.clone(), Arc::new(copied(&self.storage())?), Origin::Leaf, false);
        copy.0.requires_grad.store(self.requires_grad(), Ordering::Relaxed);
        *lock(&copy.0.grad) = lock(&self.0.grad).as_ref().map(copied).transpose()?;
        Ok(copy)
    }

    /// Whether `self` and `other` are handles of the same tensor.
    pub fn same(&self, other: &Tensor<F>) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// New elements for a device tensor's `storage`: written by `in_place` into its own buffer when nothing else
/// holds it (a captured step's input keeps its address), else the buffer `fresh` makes replaces it for every
/// handle at once (a backward recorded before keeps the old values).
fn replace_device<F: Real>(
    storage: &mut Arc<Storage<F>>,
    in_place: impl FnOnce(&mut DeviceBuffer) -> Result<()>,
    fresh: impl FnOnce() -> Result<DeviceBuffer>,
) -> Result<()> {
    if let Some(Storage::Device(buffer)) = Arc::get_mut(storage)
        && buffer.is_unshared()
    {
        return in_place(buffer);
    }
    *storage = Arc::new(Storage::Device(fresh()?));
    Ok(())
}
