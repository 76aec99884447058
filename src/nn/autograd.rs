//! Reverse-mode automatic differentiation over the recorded graph (micrograd's and PyTorch's `backward`):
//! the tensors the output depends on in topological order, then each op's backward from the output down,
//! every input's gradient the sum of what its consumers sent it. A leaf that requires a gradient adds it
//! to `.grad()`, so gradients accumulate over backward calls until `zero_grad`.
//!
//! Deterministic: the order is a function of the graph alone (a depth-first walk over each op's inputs in
//! their order), and each sum is taken in that order.
//!
//! On a GPU, an activation whose one reader is a linear layer has its slope taken in that layer's backward
//! (`cuda::backward_fusion`): the walk offers it, and when the layer takes it, the gradient it returns goes
//! to the activation's input and the activation's own backward is skipped. Likewise a direct convolution,
//! the last reader of its input, may add the input's other gradients in its own (`Offers`).
//!
//! Unless asked to keep it, a backward frees the graph it walked (each op's inputs and saved values), as
//! PyTorch does without `retain_graph`; a second backward through it is an error that names the op.

use super::cuda;
use super::error::{Error, Result};
use super::tensor::{Backward, Origin, Storage, Tensor, lock};
use crate::ops::cpu::Real;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

fn key<F: Real>(tensor: &Tensor<F>) -> usize {
    Arc::as_ptr(&tensor.0) as usize
}

impl<F: Real> Tensor<F> {
    /// Back-propagates from this tensor, which must hold one element, then frees the graph.
    pub fn backward(&self) -> Result<()> {
        self.backward_with(None, false)
    }

    /// Back-propagates `grad` (the gradient of some loss with respect to this tensor, of its shape; None
    /// for a tensor of one element, whose gradient is 1), keeping the graph for another backward when
    /// `retain_graph`.
    pub fn backward_with(&self, grad: Option<&Tensor<F>>, retain_graph: bool) -> Result<()> {
        if !self.requires_grad() {
            let problem = format!(
                "the tensor {:?} ({}) requires no gradient: none of its inputs is a parameter, or it was computed \
                 under no_grad",
                self.shape(),
                self.op_name()
            );
            return Err(Error::graph("backward", problem));
        }
        let seed = match grad {
            None if self.numel() == 1 => match &*self.storage() {
                Storage::Host(_) => Storage::Host(vec![F::one()]),
                Storage::Device(buffer) => Storage::Device(cuda::ops::seed(buffer)?),
            },
            None => {
                let problem = "is not a scalar: give the gradient of the output (backward_with)";
                return Err(Error::shape("backward", self.shape(), problem));
            }
            Some(grad) if grad.shape() != self.shape() => {
                let problem = "differ: the gradient (second) must have the output's shape";
                return Err(Error::shapes("backward", self.shape(), grad.shape(), problem));
            }
            Some(grad) if grad.is_on_device() != self.is_on_device() => {
                return Err(Error::device("backward", "the gradient and the output live in two places"));
            }
            Some(grad) => (*grad.storage()).clone(),
        };
        let order = self.topological_order()?;
        let readers = readers(&order);
        let mut pending: HashMap<usize, Storage<F>> = HashMap::from([(key(self), seed)]);
        // Gradients sent to each tensor so far: a tensor's last reader is the one that makes it `readers`.
        let mut arrived: HashMap<usize, usize> = HashMap::new();
        for tensor in order.iter().rev() {
            let Some(grad) = pending.remove(&key(tensor)) else { continue };
            let mut origin = lock(&tensor.0.origin);
            let Origin::Op { op, inputs, backward } = &*origin else {
                drop(origin);
                tensor.accumulate_grad(grad)?;
                continue;
            };
            let needs: Vec<bool> = inputs.iter().map(|t| t.requires_grad()).collect();
            // Fusions offered to this op's backward (`Offers`), which it takes or not.
            let offers = Offers::make(inputs, &pending, &readers, &arrived);
            let (mut slope_taken, mut addend_taken) = (false, false);
            let grads: Vec<Option<Storage<F>>> = match (backward, &grad) {
                (Backward::Host(backward), Storage::Host(grad)) => {
                    backward(grad, &needs)?.into_iter().map(|g| g.map(Storage::Host)).collect()
                }
                (Backward::Device(backward), Storage::Device(grad)) => {
                    let grads = backward(grad, &needs);
                    (slope_taken, addend_taken) = offers.taken();
                    grads?.into_iter().map(|g| g.map(Storage::Device)).collect()
                }
                _ => return Err(Error::device(op, "its gradient reached it in another place than its output")),
            };
            for (i, ((input, input_grad), need)) in inputs.iter().zip(grads).zip(needs).enumerate() {
                let (true, Some(input_grad)) = (need, input_grad) else { continue };
                // The backward took the addend: this gradient holds what the input had, which it replaces.
                if addend_taken && i == 0 {
                    pending.remove(&key(input));
                }
                let to = match &offers.slope {
                    // The backward took the activation's slope: this is the gradient of the activation's
                    // input, and the activation's own backward is done.
                    Some((activation, activation_input, _)) if slope_taken && i == 0 => {
                        if !retain_graph {
                            let name = activation.op_name();
                            *lock(&activation.0.origin) = Origin::Freed { op: name };
                        }
                        activation_input
                    }
                    _ => input,
                };
                send(&mut pending, to, input_grad, op)?;
                *arrived.entry(key(to)).or_insert(0) += 1;
            }
            if !retain_graph {
                *origin = Origin::Freed { op };
            }
        }
        // The weight gradients the walk deferred (cuda::weight_grads) launch now, not at the next op.
        if let Storage::Device(output) = &*self.storage() {
            output.device().launch_pending()?;
        }
        Ok(())
    }

    /// Every tensor this one depends on through inputs that require a gradient (itself included), each
    /// after all of its inputs; an error if a part of the graph was freed.
    fn topological_order(&self) -> Result<Vec<Tensor<F>>> {
        let mut order = Vec::new();
        let mut seen = HashSet::new();
        let mut stack = vec![(self.clone(), false)];
        while let Some((tensor, inputs_done)) = stack.pop() {
            if inputs_done {
                order.push(tensor);
                continue;
            }
            if !seen.insert(key(&tensor)) {
                continue;
            }
            let inputs: Vec<Tensor<F>> = match &*lock(&tensor.0.origin) {
                Origin::Leaf => Vec::new(),
                Origin::Op { inputs, .. } => inputs.iter().filter(|t| t.requires_grad()).cloned().collect(),
                Origin::Freed { op } => {
                    let problem = format!(
                        "the graph through {op} (shape {:?}) was freed by an earlier backward: compute it again, or \
                         keep it with backward_with(grad, true)",
                        tensor.shape()
                    );
                    return Err(Error::graph("backward", problem));
                }
            };
            stack.push((tensor, true));
            stack.extend(inputs.into_iter().rev().filter(|t| !seen.contains(&key(t))).map(|t| (t, false)));
        }
        Ok(order)
    }
}

/// What the walk offers the backward of an op about to run (cuda::backward_fusion): when the op is the last reader of
/// its first input (read once by it), the gradient that input has from its other readers, to be added in the
/// op's backward; and when the input's gradient is then whole there (its one reader, or with that addend),
/// the slope of the activation that made it: the activation's tensor, its input and its output's elements.
struct Offers<F: Real> {
    addend: Option<cuda::DeviceBuffer>,
    slope: Option<(Tensor<F>, Tensor<F>, cuda::DeviceBuffer)>,
}

impl<F: Real> Offers<F> {
    fn make(
        inputs: &[Tensor<F>],
        pending: &HashMap<usize, Storage<F>>,
        readers: &HashMap<usize, usize>,
        arrived: &HashMap<usize, usize>,
    ) -> Self {
        let last_reader = inputs.first().filter(|first| {
            let k = key(first);
            let once = inputs.iter().filter(|t| key(t) == k).count() == 1;
            once && arrived.get(&k).copied().unwrap_or(0) + 1 == readers.get(&k).copied().unwrap_or(0)
        });
        let addend = last_reader.and_then(|first| {
            let storage = first.storage();
            let (Storage::Device(input), Some(Storage::Device(grad))) = (&*storage, pending.get(&key(first))) else {
                return None;
            };
            input.device().offer_addend(input, grad).then(|| input.clone())
        });
        let with_addend = addend.is_some();
        let whole = last_reader.filter(|first| with_addend || readers.get(&key(first)) == Some(&1));
        let slope = whole.and_then(|first| {
            let Storage::Device(output) = &*first.storage() else { return None };
            let activation_input = match &*lock(&first.0.origin) {
                Origin::Op { inputs, .. } if inputs.len() == 1 && inputs[0].requires_grad() => inputs[0].clone(),
                _ => return None,
            };
            // The op that made `first` is the activation itself (its one input is the one the slope reads),
            // not a view sharing its output's elements.
            let (_, slope_input) = output.slope_extra()?;
            let Storage::Device(input) = &*activation_input.storage() else { return None };
            let own = input.same_elements(&slope_input);
            (own && output.device().offer_slope(output, with_addend))
                .then(|| (first.clone(), activation_input, output.clone()))
        });
        Offers { addend, slope }
    }

    /// Ends the offers: whether the backward took the slope, and the addend.
    fn taken(&self) -> (bool, bool) {
        let slope = self.slope.as_ref().is_some_and(|(.., output)| output.device().slope_taken());
        let addend = self.addend.as_ref().is_some_and(|input| input.device().addend_taken());
        (slope, addend)
    }
}

/// How many times each tensor of `order` is an input (that requires a gradient) of an op in `order`.
fn readers<F: Real>(order: &[Tensor<F>]) -> HashMap<usize, usize> {
    let mut count = HashMap::new();
    for tensor in order {
        if let Origin::Op { inputs, .. } = &*lock(&tensor.0.origin) {
            for input in inputs.iter().filter(|t| t.requires_grad()) {
                *count.entry(key(input)).or_insert(0) += 1;
            }
        }
    }
    count
}

/// Adds `grad` to what `pending` holds for `input` (from `op`'s backward).
fn send<F: Real>(
    pending: &mut HashMap<usize, Storage<F>>,
    input: &Tensor<F>,
    grad: Storage<F>,
    op: &'static str,
) -> Result<()> {
    let sum = match (pending.remove(&key(input)), grad) {
        (None, grad) => grad,
        (Some(Storage::Host(mut sum)), Storage::Host(grad)) => {
            sum.iter_mut().zip(grad).for_each(|(s, g)| *s = *s + g);
            Storage::Host(sum)
        }
        (Some(Storage::Device(sum)), Storage::Device(grad)) => Storage::Device(sum.plus(&grad)?),
        _ => return Err(Error::device(op, "gradients of one input reached it in two places")),
    };
    pending.insert(key(input), sum);
    Ok(())
}
