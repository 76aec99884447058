//! `textnet.save` and `textnet.load`'s native half: named tensors to and from a safetensors file, each in
//! its own dtype (F32, F64 or I64), under the names given (a module's `state_dict` names, PyTorch's).

use crate::errors::{nn_error, value_error};
use crate::tensor::{Data, PyTensor};
use anyhow::anyhow;
use pyo3::prelude::*;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};
use std::path::PathBuf;
use std::sync::Arc;
use textnet::nn::Tensor;

/// The dtype and little-endian bytes of `data` (read back from the GPU).
fn encoded(data: &Data) -> PyResult<(Dtype, Vec<u8>)> {
    Ok(match data {
        Data::F32(t) => (Dtype::F32, t.values().map_err(nn_error)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        Data::F64(t) => (Dtype::F64, t.values().map_err(nn_error)?.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ids => {
            let (values, _) = ids.host_ids()?.unwrap_or_default();
            (Dtype::I64, values.iter().flat_map(|v| v.to_le_bytes()).collect())
        }
    })
}

/// Writes `tensors` (name, tensor) to `path` as a safetensors file, replacing it only once the new one is
/// whole on disk.
#[pyfunction]
pub(crate) fn save_tensors(path: PathBuf, tensors: Vec<(String, PyRef<'_, PyTensor>)>) -> PyResult<()> {
    let mut files = Vec::with_capacity(tensors.len());
    for (name, tensor) in &tensors {
        let (dtype, bytes) = encoded(&tensor.data)?;
        files.push((name.as_str(), dtype, tensor.data.shape().to_vec(), bytes));
    }
    let views = (files.iter())
        .map(|(name, dtype, shape, bytes)| Ok((*name, TensorView::new(*dtype, shape.clone(), bytes)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()
        .and_then(|views| safetensors::serialize(views, None))
        .map_err(|e| value_error(anyhow!("save: {} cannot be encoded: {e}", path.display())))?;
    textnet::io::fsutil::write_atomic(&path, &views).map_err(value_error)
}

/// The tensors of the safetensors file at `path`, in the file's order: F32 and F64 as floats, I64 as
/// int64 ids.
#[pyfunction]
pub(crate) fn load_tensors(path: PathBuf) -> PyResult<Vec<(String, PyTensor)>> {
    let bytes = textnet::io::fsutil::read_input(&path, "file").map_err(value_error)?;
    let shown = path.display();
    let refused =
        |e: safetensors::SafeTensorError| value_error(anyhow!("load: {shown} is not a safetensors file ({e})"));
    let (_, metadata) = SafeTensors::read_metadata(&bytes).map_err(refused)?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(refused)?;
    let mut loaded = Vec::with_capacity(tensors.len());
    for name in metadata.offset_keys() {
        let view = tensors.tensor(&name).map_err(refused)?;
        let (raw, shape) = (view.data(), view.shape());
        let data = match view.dtype() {
            Dtype::F32 => {
                let values = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                Data::F32(Tensor::from_vec(values, shape).map_err(nn_error)?)
            }
            Dtype::F64 => {
                let values =
                    raw.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default())).collect();
                Data::F64(Tensor::from_vec(values, shape).map_err(nn_error)?)
            }
            Dtype::I64 => {
                let values =
                    raw.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default())).collect();
                Data::Ids { values: Arc::new(values), shape: shape.to_vec() }
            }
            other => {
                return Err(value_error(anyhow!(
                    "load: {shown} holds {name} as {other:?}; textnet reads F32, F64 and I64 tensors"
                )));
            }
        };
        loaded.push((name, PyTensor::of(data)));
    }
    Ok(loaded)
}
