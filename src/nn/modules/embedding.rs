//! `Embedding`: a table of `num_embeddings` rows of `embedding_dim` values looked up by id, initialised as
//! PyTorch's `nn.Embedding` (N(0, 1), the `padding_idx` row zeros). Tensors here hold floats, so ids come
//! beside them (`forward_ids`); `Module::forward` reads a float tensor of integral ids, as a model that
//! passes only tensors needs.

use super::Module;
use crate::nn::cuda::{self, Place, layers};
use crate::nn::embedding::{bad_id, embedding, not_a_row, padding_row};
use crate::nn::error::{Error, Result};
use crate::nn::tensor::Tensor;
use crate::ops::cpu::{Real, SeededRng};
use rand_distr::{Distribution, StandardNormal};

/// Row `id` of `weight` for each id.
#[derive(Clone, Debug)]
pub struct Embedding<F: Real = f32> {
    /// `[num_embeddings, embedding_dim]`.
    pub weight: Tensor<F>,
    /// The row that gets no gradient (negative: from the end), if any.
    pub padding_idx: Option<i64>,
}

impl<F: Real> Embedding<F> {
    /// A table of `num_embeddings` × `embedding_dim` drawn from `rng` as PyTorch's `nn.Embedding`: each
    /// value N(0, 1) in row-major order, then the `padding_idx` row (negative: from the end) set to zeros.
    pub fn new(
        num_embeddings: usize,
        embedding_dim: usize,
        padding_idx: Option<i64>,
        rng: &mut SeededRng,
    ) -> Result<Self> {
        let count = num_embeddings.checked_mul(embedding_dim).ok_or_else(|| {
            Error::shape("Embedding", &[num_embeddings, embedding_dim], "has more elements than memory can address")
        })?;
        let mut draw = || -> F {
            let value: f32 = StandardNormal.sample(rng);
            F::from(value).unwrap_or_else(F::nan)
        };
        let values = (0..count).map(|_| draw()).collect();
        let weight = Tensor::parameter(values, &[num_embeddings, embedding_dim])?;
        if let Some(padding_idx) = padding_idx {
            let row = padding_row(padding_idx, num_embeddings)?;
            weight.update_in_place(|w| w[row * embedding_dim..][..embedding_dim].fill(F::zero()))?;
        }
        Embedding::from_parameters(weight, padding_idx)
    }

    /// A layer of the given table (marked as requiring a gradient), its rows kept as they are.
    pub fn from_parameters(weight: Tensor<F>, padding_idx: Option<i64>) -> Result<Self> {
        let [rows, _] = *weight.shape() else {
            let problem = "is not a weight of two axes [num_embeddings, embedding_dim]";
            return Err(Error::shape("Embedding", weight.shape(), problem));
        };
        padding_idx.map(|p| padding_row(p, rows)).transpose()?;
        weight.set_requires_grad(true)?;
        Ok(Embedding { weight, padding_idx })
    }

    /// The number of rows, V.
    pub fn num_embeddings(&self) -> usize {
        self.weight.shape()[0]
    }

    /// The width of a row, D.
    pub fn embedding_dim(&self) -> usize {
        self.weight.shape()[1]
    }

    /// The rows at `ids` (each in 0..V), in shape `ids_shape` + `[D]`.
    pub fn forward_ids(&self, ids: &[i64], ids_shape: &[usize]) -> Result<Tensor<F>> {
        embedding(&self.weight, ids, ids_shape, self.padding_idx)
    }
}

impl<F: Real> Module<F> for Embedding<F> {
    /// The rows at the ids `x` holds as floats, each an integer in 0..V. On a GPU the ids stay there (a
    /// captured step reads each replay's), and an id that is not a row gives a row of NaN instead of the
    /// host's error, which would need the ids read back.
    fn forward(&self, x: &Tensor<F>) -> Result<Tensor<F>> {
        if let Place::Device(gpu) = cuda::place_of("embedding", &[&self.weight, x])? {
            let padding = self.padding_idx.map(|p| padding_row(p, self.num_embeddings())).transpose()?;
            let shape = [x.shape(), &[self.embedding_dim()]].concat();
            let sizes = (self.num_embeddings(), self.embedding_dim());
            return layers::embedding_ids(&gpu, (&self.weight, x), sizes, padding, shape);
        }
        let ids = (x.to_vec().into_iter().enumerate())
            .map(|(flat, id)| {
                if !id.is_finite() || id.fract() != F::zero() {
                    return Err(bad_id(id, flat, x.shape(), "is not an integer"));
                }
                id.to_i64().ok_or_else(|| not_a_row(id, flat, x.shape(), self.num_embeddings()))
            })
            .collect::<Result<Vec<i64>>>()?;
        self.forward_ids(&ids, x.shape())
    }

    fn named_parameters(&self) -> Vec<(String, Tensor<F>)> {
        vec![("weight".to_string(), self.weight.clone())]
    }
}
