//! A module's parameters by name, PyTorch's `state_dict`: taken from a module, written to a safetensors
//! file (f32, the format every model file of this crate uses, through `tensorfile`), and read back into
//! a module of the same shapes, in place. The names are PyTorch's (`0.weight`, `blocks.0.attn.bias`), so
//! a file loads into the same PyTorch model (`safetensors.torch.load_file`, then `load_state_dict`).
//!
//! A file is written atomically (`fsutil::write_atomic`: a temporary file renamed over the target), so a
//! failed save leaves the old file whole; a load checks every name and shape before it changes anything.

use super::error::{Error, Result};
use super::modules::Module;
use super::tensor::Tensor;
use crate::ops::cpu::Real;
use safetensors::tensor::Dtype;
use std::collections::HashMap;
use std::path::Path;

/// A named list of tensors: a module's parameters under their names.
pub type StateDict<F = f32> = Vec<(String, Tensor<F>)>;

/// The parameters of `module` under their names, in `named_parameters`' order, as tensors outside the
/// graph that share the parameters' elements (as PyTorch's `state_dict`, a later step shows in them).
pub fn state_dict<F: Real>(module: &dyn Module<F>) -> StateDict<F> {
    module.named_parameters().into_iter().map(|(name, p)| (name, p.detach())).collect()
}

/// Writes the parameters of `module` to `path` as a safetensors file of f32 tensors (an f64 module's
/// values are rounded to f32). The file is replaced only once the new one is whole on disk.
pub fn save_state_dict<F: Real>(module: &dyn Module<F>, path: impl AsRef<Path>) -> Result<()> {
    let (op, path) = ("save_state_dict", path.as_ref());
    let named = module.named_parameters();
    by_name(op, "the model", named.iter().map(|(name, p)| (name.as_str(), p)))?;
    let values: Vec<Vec<f32>> =
        named.iter().map(|(_, p)| p.to_vec().into_iter().map(|v| v.to_f32().unwrap_or(f32::NAN)).collect()).collect();
    let tensors: Vec<(&str, &[f32], Vec<usize>)> =
        named.iter().zip(&values).map(|((name, p), v)| (name.as_str(), v.as_slice(), p.shape().to_vec())).collect();
    let bytes = crate::io::tensorfile::to_bytes(&tensors, Default::default())
        .map_err(|e| Error::file(op, path, format!("cannot be encoded: {e:#}")))?;
    crate::io::fsutil::write_atomic(path, &bytes)
        .map_err(|e| Error::file(op, path, format!("cannot be written: {}", e.root_cause())))
}

/// The tensors of the safetensors file at `path`, in the file's order; every one must be f32.
pub fn read_state_dict<F: Real>(path: impl AsRef<Path>) -> Result<StateDict<F>> {
    let (op, path) = ("load_state_dict", path.as_ref());
    let bytes = std::fs::read(path).map_err(|e| Error::file(op, path, format!("cannot be read: {e}")))?;
    let not_safetensors =
        |e: safetensors::SafeTensorError| Error::file(op, path, format!("is not a safetensors file ({e})"));
    let (_, metadata) = safetensors::SafeTensors::read_metadata(&bytes).map_err(not_safetensors)?;
    let tensors = safetensors::SafeTensors::deserialize(&bytes).map_err(not_safetensors)?;
    let mut state = Vec::with_capacity(tensors.len());
    for name in metadata.offset_keys() {
        let view = tensors.tensor(&name).map_err(not_safetensors)?;
        if view.dtype() != Dtype::F32 {
            let problem = format!("holds {name} as {:?}; a state dict is read from F32 tensors only", view.dtype());
            return Err(Error::file(op, path, problem));
        }
        let values = crate::io::tensorfile::read_f32(&tensors, &name, view.shape())
            .map_err(|e| Error::file(op, path, format!("is not a safetensors file ({e:#})")))?;
        let values = values.into_iter().map(|v| F::from(v).unwrap_or_else(F::nan)).collect();
        state.push((name, Tensor::from_vec(values, view.shape())?));
    }
    Ok(state)
}

/// Copies the tensors of `state` into the parameters of `module` of the same names, in place. Every
/// shape must match; with `strict`, every parameter must be in `state` and every tensor of `state` a
/// parameter (PyTorch's `strict`), otherwise the names that match are loaded and the rest left. Nothing
/// changes when the state is refused; the error names the first parameter at fault.
pub fn load_state_dict<F: Real>(module: &dyn Module<F>, state: &[(String, Tensor<F>)], strict: bool) -> Result<()> {
    load(module, state, strict, "the state dict")
}

/// `load_state_dict` from the safetensors file at `path` (see `read_state_dict`).
pub fn load_state_dict_file<F: Real>(module: &dyn Module<F>, path: impl AsRef<Path>, strict: bool) -> Result<()> {
    load(module, &read_state_dict(path)?, strict, "the file")
}

fn load<F: Real>(module: &dyn Module<F>, state: &[(String, Tensor<F>)], strict: bool, source: &str) -> Result<()> {
    let op = "load_state_dict";
    let named = module.named_parameters();
    let model = by_name(op, "the model", named.iter().map(|(name, p)| (name.as_str(), p)))?;
    let given = by_name(op, source, state.iter().map(|(name, t)| (name.as_str(), t)))?;
    let mut copies = Vec::with_capacity(named.len());
    for (name, parameter) in &named {
        match given.get(name.as_str()) {
            None if strict => {
                let problem = format!("{name} {:?} of the model is missing from {source}", parameter.shape());
                return Err(Error::value(op, problem));
            }
            None => {}
            Some(tensor) if tensor.shape() != parameter.shape() => {
                let problem =
                    format!("{name} is {:?} in {source} but {:?} in the model", tensor.shape(), parameter.shape());
                return Err(Error::value(op, problem));
            }
            Some(tensor) => copies.push((parameter, tensor)),
        }
    }
    if strict && let Some((name, tensor)) = state.iter().find(|(name, _)| !model.contains_key(name.as_str())) {
        return Err(Error::value(op, format!("{name} {:?} in {source} is not in the model", tensor.shape())));
    }
    for (parameter, tensor) in copies {
        parameter.copy_from_slice(tensor.storage().host())?;
    }
    Ok(())
}

/// `named` as a map from name to tensor, or an error when `whose` (the model, the file) names two
/// tensors alike.
fn by_name<'a, F: Real>(
    op: &'static str,
    whose: &str,
    named: impl Iterator<Item = (&'a str, &'a Tensor<F>)>,
) -> Result<HashMap<&'a str, &'a Tensor<F>>> {
    let mut map = HashMap::new();
    for (name, tensor) in named {
        if map.insert(name, tensor).is_some() {
            return Err(Error::value(op, format!("{whose} names two tensors {name}")));
        }
    }
    Ok(map)
}
