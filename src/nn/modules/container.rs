//! Containers of modules, as `torch.nn`'s: [`Sequential`] feeds each module's output to the next, and
//! [`ModuleList`] holds modules that its owner calls itself. Both name their children's parameters by
//! position, as PyTorch does (`0.weight`, `2.bias`: a child without parameters, an activation, keeps its
//! number), so a `state_dict` lines up with the same PyTorch model's; both pass `set_training` on.

use super::{Module, prefixed};
use crate::nn::error::{Error, Result};
use crate::nn::tensor::Tensor;
use crate::ops::cpu::Real;
use std::ops::{Deref, DerefMut, Index};

/// Modules in a list, indexable, with no forward of its own (`torch.nn.ModuleList`).
#[derive(Default)]
pub struct ModuleList<F: Real = f32> {
    modules: Vec<Box<dyn Module<F>>>,
}

impl<F: Real> ModuleList<F> {
    /// An empty list.
    pub fn new() -> Self {
        ModuleList { modules: Vec::new() }
    }

    /// Appends `module`.
    pub fn push(&mut self, module: impl Module<F> + 'static) {
        self.modules.push(Box::new(module));
    }

    /// The same list with `module` appended.
    pub fn with(mut self, module: impl Module<F> + 'static) -> Self {
        self.push(module);
        self
    }

    /// The number of modules.
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    /// Whether the list holds no module.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// Module `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<&dyn Module<F>> {
        self.modules.get(index).map(|m| m.as_ref())
    }

    /// The modules in order.
    pub fn iter(&self) -> impl Iterator<Item = &dyn Module<F>> {
        self.modules.iter().map(|m| m.as_ref())
    }
}

impl<F: Real> From<Vec<Box<dyn Module<F>>>> for ModuleList<F> {
    fn from(modules: Vec<Box<dyn Module<F>>>) -> Self {
        ModuleList { modules }
    }
}

impl<F: Real> Index<usize> for ModuleList<F> {
    type Output = dyn Module<F>;

    fn index(&self, index: usize) -> &Self::Output {
        self.modules[index].as_ref()
    }
}

impl<F: Real> Module<F> for ModuleList<F> {
    /// An error: a list's owner calls its modules itself.
    fn forward(&self, _x: &Tensor<F>) -> Result<Tensor<F>> {
        Err(Error::value("ModuleList", "has no forward: call its modules in turn, or use a Sequential"))
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<F>)> {
        self.iter().enumerate().flat_map(|(i, m)| prefixed(&i.to_string(), m.named_parameters())).collect()
    }

    fn set_training(&self, training: bool) {
        self.iter().for_each(|m| m.set_training(training));
    }
}

/// Modules applied in order, each to the previous one's output (`torch.nn.Sequential`). It is a
/// [`ModuleList`] with a forward, and derefs to it (`push`, `len`, indexing).
#[derive(Default)]
pub struct Sequential<F: Real = f32>(ModuleList<F>);

impl<F: Real> Sequential<F> {
    /// An empty sequence (its forward returns the input).
    pub fn new() -> Self {
        Sequential(ModuleList::new())
    }

    /// The same sequence with `module` appended.
    pub fn with(self, module: impl Module<F> + 'static) -> Self {
        Sequential(self.0.with(module))
    }
}

impl<F: Real> From<Vec<Box<dyn Module<F>>>> for Sequential<F> {
    fn from(modules: Vec<Box<dyn Module<F>>>) -> Self {
        Sequential(ModuleList::from(modules))
    }
}

impl<F: Real> Deref for Sequential<F> {
    type Target = ModuleList<F>;

    fn deref(&self) -> &ModuleList<F> {
        &self.0
    }
}

impl<F: Real> DerefMut for Sequential<F> {
    fn deref_mut(&mut self) -> &mut ModuleList<F> {
        &mut self.0
    }
}

impl<F: Real> Module<F> for Sequential<F> {
    fn forward(&self, x: &Tensor<F>) -> Result<Tensor<F>> {
        self.0.iter().try_fold(x.clone(), |h, module| module.forward(&h))
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<F>)> {
        self.0.named_parameters()
    }

    fn set_training(&self, training: bool) {
        self.0.set_training(training);
    }
}
