//! The native half of `textnet.nn.Dropout`: the engine's `nn::Dropout` layer, whose step counter moves to
//! the GPU at its first forward there, so that a captured step's replays draw step after step's masks
//! (on the CPU each forward in training draws from the host's counter). Also nanoGPT's attention with
//! such a layer dropping its probabilities (`nn::causal_self_attention`), which captures alike.
//!
//! A layer's seed and site come from the seeding state when it is made: `manual_seed(s)` sets the seed
//! every layer made after it shares and starts the sites at 0; each layer made takes the next site, so
//! two layers draw independent masks, and a model built again after the same `manual_seed` draws the same
//! ones. Taking a site draws nothing from the generator of `randn` and the initial parameters.

use crate::errors::nn_error;
use crate::tensor::{Data, PyTensor, float_op, not_float};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::{Mutex, MutexGuard, PoisonError};
use textnet::nn::{self, Module};

/// The seed of the dropout layers made from now on, and the site the next one takes.
fn sites() -> MutexGuard<'static, (u32, usize)> {
    static SITES: Mutex<(u32, usize)> = Mutex::new((0, 0));
    SITES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `manual_seed(seed)`'s part here: the layers made after it share `seed` (its two halves folded into
/// the 32 bits of a dropout seed), at sites from 0.
pub(crate) fn reseed_sites(seed: u64) {
    *sites() = ((seed ^ (seed >> 32)) as u32, 0);
}

/// A dropout layer (`textnet.nn.Dropout`'s engine).
#[pyclass(name = "DropoutLayer", module = "textnet._native", frozen)]
pub(crate) struct PyDropout {
    layer: nn::Dropout,
    seed: u32,
    site: usize,
}

impl PyDropout {
    /// The engine's layer, in training or not as `training` says.
    fn switched(&self, training: bool) -> &nn::Dropout {
        Module::<f32>::set_training(&self.layer, training);
        &self.layer
    }
}

#[pymethods]
impl PyDropout {
    /// A layer dropping with probability `p`, under the seed and the next site of the seeding state, or
    /// under `seed` and `site` when both are given.
    #[new]
    #[pyo3(signature = (p, seed = None, site = None))]
    fn new(p: f32, seed: Option<u32>, site: Option<usize>) -> PyResult<Self> {
        let (seed, site) = match (seed, site) {
            (Some(seed), Some(site)) => (seed, site),
            (None, None) => {
                let mut state = sites();
                state.1 += 1;
                (state.0, state.1 - 1)
            }
            _ => return Err(PyValueError::new_err("Dropout: give both seed and site, or neither")),
        };
        let layer = nn::Dropout::new(p, seed).map_err(nn_error)?.with_site(site);
        Ok(PyDropout { layer, seed, site })
    }

    /// `copy.deepcopy`: the same layer (p, seed, site, the step it draws next) with a step counter of its
    /// own, so that the copy drops as the original would and each advances apart.
    fn __deepcopy__(&self, _memo: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(PyDropout { layer: self.layer.deep_copy().map_err(nn_error)?, seed: self.seed, site: self.site })
    }

    /// `input` with dropout when `training` (the mask of the layer's next step, the step counted), else
    /// `input` itself.
    fn forward(&self, input: PyRef<'_, PyTensor>, training: bool) -> PyResult<PyTensor> {
        let layer = self.switched(training);
        float_op!("dropout", &input.data, |x| layer.forward(x)).map(PyTensor::of)
    }

    #[getter]
    fn p(&self) -> f32 {
        self.layer.p()
    }

    #[getter]
    fn seed(&self) -> u32 {
        self.seed
    }

    #[getter]
    fn site(&self) -> usize {
        self.site
    }

    /// The step whose mask the next forward in training draws (counted on the host: the forwards run
    /// op by op, not a captured step's replays).
    #[getter]
    fn step(&self) -> u32 {
        self.layer.step()
    }
}

/// Causal self-attention of `qkv` `[B, T, 3C]` (each position's [q | k | v], `heads` heads in each
/// third) to `[B, T, C]`, its probabilities dropped by `dropout`'s next mask when `training`.
#[pyfunction]
#[pyo3(signature = (qkv, heads, dropout = None, training = true))]
pub(crate) fn causal_self_attention(
    py: Python<'_>,
    qkv: PyRef<'_, PyTensor>,
    heads: usize,
    dropout: Option<PyRef<'_, PyDropout>>,
    training: bool,
) -> PyResult<PyTensor> {
    let layer = dropout.as_ref().map(|d| d.switched(training));
    float_op!("causal_self_attention", &qkv.data, |x| py.detach(|| nn::causal_self_attention(x, heads, layer)))
        .map(PyTensor::of)
}
