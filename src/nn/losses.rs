//! The losses, fused (one op each, as the kernels of `fused/losses.cuh` are): `cross_entropy` of logits
//! against class indices with an index to ignore, the mean over the rows not ignored, from
//! `ops::losses::softmax_xent`; and `mse`, the mean of `ops::losses::squared_error` over every element.

use super::cuda::{self, Place, ops as device};
use super::error::{Error, Result};
use super::tensor::{Storage, Tensor};
use crate::ops::cpu::Real;
use crate::ops::losses::{softmax_xent, squared_error};
use std::sync::Arc;

impl<F: Real> Tensor<F> {
    /// The mean over rows of −log softmax(row)`[target]`: logits `[.., classes]`, one target a row (in the
    /// logits' row-major order); rows whose target is `ignore_index` count for nothing. Shape `[]`.
    pub fn cross_entropy(&self, targets: &[i64], ignore_index: Option<i64>) -> Result<Tensor<F>> {
        let classes = *self
            .shape()
            .last()
            .ok_or_else(|| Error::shape("cross_entropy", self.shape(), "has no axis of classes"))?;
        let rows: usize = self.shape()[..self.rank() - 1].iter().product();
        if targets.len() != rows {
            let problem = "do not match: one target for each row of the logits (second shape: the targets')";
            return Err(Error::shapes("cross_entropy", self.shape(), &[targets.len()], problem));
        }
        let (row_classes, counted) = checked_targets(targets, ignore_index, classes)?;
        if let Place::Device(gpu) = cuda::place_of("cross_entropy", &[self])? {
            // Ids as floats for the kernel; a row to ignore as −1, which no class is (NaN when none is:
            // every row then counts, which the kernel uses).
            let ids: Vec<f32> = row_classes.iter().map(|c| c.map_or(-1.0, |c| c as f32)).collect();
            let ids = gpu.upload("cross_entropy", &ids)?;
            let ignore = if ignore_index.is_some() { -1.0 } else { f32::NAN };
            return device::cross_entropy(&gpu, self, &ids, ignore, (rows, classes));
        }
        let logits = self.storage();
        let mut softmax_minus_onehot = vec![F::zero(); logits.host().len()];
        let mut total = F::zero();
        let pairs =
            logits.host().chunks_exact(classes.max(1)).zip(softmax_minus_onehot.chunks_exact_mut(classes.max(1)));
        for ((logits, d), class) in pairs.zip(row_classes) {
            if let Some(class) = class {
                total = total + softmax_xent(logits, class, d);
            }
        }
        let count = F::from(counted).unwrap_or_else(F::nan);
        let backward = move |grad: &[F], _needs: &[bool]| {
            let scale = grad[0] / count;
            Ok(vec![Some(softmax_minus_onehot.iter().map(|&d| d * scale).collect())])
        };
        let loss = Arc::new(Storage::Host(vec![total / count]));
        Ok(Tensor::from_op("cross_entropy", loss, Vec::new(), &[self], Box::new(backward)))
    }

    /// `cross_entropy` with the targets in a tensor of class ids, one a row (in the logits' row-major
    /// order). On the device the ids stay there (a captured step reads each replay's), and an id that is
    /// not a class gives a NaN loss instead of the host's error, which would need the ids read back.
    pub fn cross_entropy_ids(&self, targets: &Tensor<F>, ignore_index: Option<i64>) -> Result<Tensor<F>> {
        const OP: &str = "cross_entropy";
        let classes = *self.shape().last().ok_or_else(|| Error::shape(OP, self.shape(), "has no axis of classes"))?;
        let rows: usize = self.shape()[..self.rank() - 1].iter().product();
        if targets.numel() != rows {
            let problem = "do not match: one target for each row of the logits (second shape: the targets')";
            return Err(Error::shapes(OP, self.shape(), targets.shape(), problem));
        }
        if let Place::Device(gpu) = cuda::place_of(OP, &[self, targets])? {
            let Storage::Device(ids) = &*targets.storage() else { unreachable!("placed on the device") };
            let ignore = ignore_index.map_or(f32::NAN, |i| i as f32);
            return device::cross_entropy(&gpu, self, ids, ignore, (rows, classes));
        }
        let ids = targets.values()?;
        let as_ids: Option<Vec<i64>> =
            ids.iter().map(|v| v.to_f64().filter(|v| v.fract() == 0.0 && v.abs() < 9e15).map(|v| v as i64)).collect();
        let ids = as_ids.ok_or_else(|| Error::value(OP, "a target is not a whole number"))?;
        self.cross_entropy(&ids, ignore_index)
    }

    /// The mean of (self − target)² over every element; the shapes must be equal. Shape `[]`.
    pub fn mse(&self, target: &Tensor<F>) -> Result<Tensor<F>> {
        if self.shape() != target.shape() {
            return Err(Error::shapes("mse", self.shape(), target.shape(), "differ"));
        }
        if let Place::Device(gpu) = cuda::place_of("mse", &[self, target])? {
            return device::mse(&gpu, self, target);
        }
        let n = self.numel();
        let count = F::from(n).unwrap_or_else(F::nan);
        let scale = (F::one() + F::one()) / count;
        let (predictions, targets) = (self.storage(), target.storage());
        let mut total = F::zero();
        let d_predictions: Vec<F> = (predictions.host().iter().zip(targets.host()))
            .map(|(&y, &t)| {
                let (loss, d) = squared_error(y, t, scale);
                total = total + loss;
                d
            })
            .collect();
        let backward = move |grad: &[F], needs: &[bool]| {
            let g = grad[0];
            let grad_predictions = needs[0].then(|| d_predictions.iter().map(|&d| d * g).collect());
            let grad_targets = needs[1].then(|| d_predictions.iter().map(|&d| -d * g).collect());
            Ok(vec![grad_predictions, grad_targets])
        };
        let loss = Arc::new(Storage::Host(vec![total / count]));
        Ok(Tensor::from_op("mse", loss, Vec::new(), &[self, target], Box::new(backward)))
    }
}

/// Each row's class (None for a row whose target is `ignore_index`) and the number of rows counted; an
/// error for a target outside 0..classes, or when every row is ignored.
fn checked_targets(targets: &[i64], ignore_index: Option<i64>, classes: usize) -> Result<(Vec<Option<usize>>, usize)> {
    let mut counted = 0;
    let mut row_classes = Vec::with_capacity(targets.len());
    for (row, &target) in targets.iter().enumerate() {
        if Some(target) == ignore_index {
            row_classes.push(None);
            continue;
        }
        let class = usize::try_from(target).ok().filter(|&c| c < classes).ok_or_else(|| {
            Error::value("cross_entropy", format!("target {target} of row {row} is not a class of 0..{classes}"))
        })?;
        row_classes.push(Some(class));
        counted += 1;
    }
    if counted == 0 {
        let ignored = ignore_index.map_or(String::new(), |i| format!(" (ignore_index {i})"));
        return Err(Error::value("cross_entropy", format!("no row is left to average over{ignored}")));
    }
    Ok((row_classes, counted))
}
