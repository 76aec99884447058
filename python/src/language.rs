//! `LanguageModel`: a model file of `textnet train` or `textnet transformer` held in memory, for
//! `textnet.TextModel` and `textnet.Transformer`.

use crate::errors::value_error;
use crate::{save_model, save_onnx};
use anyhow::Context;
use numpy::{IntoPyArray, PyArray2, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rand::SeedableRng;
use std::path::PathBuf;
use textnet::ops::cpu::SeededRng;
use textnet::text::modelfile::TextModel;
use textnet::transformer::modelfile::TransformerModel;

/// A model file of `textnet train` or `textnet transformer`, held in memory.
#[pyclass(module = "textnet._native")]
pub(crate) struct LanguageModel {
    bytes: Vec<u8>,
    /// The text model read from `bytes`, for `predict` (None for a Transformer).
    text: Option<TextModel>,
    /// "text" or "transformer".
    #[pyo3(get)]
    kind: &'static str,
}

impl LanguageModel {
    /// The Transformer these bytes hold; a text model is refused.
    fn transformer(&self) -> PyResult<TransformerModel> {
        if self.kind != "transformer" {
            return Err(PyValueError::new_err("this takes a Transformer; a text model predicts (predict)"));
        }
        TransformerModel::from_bytes(&self.bytes).map_err(value_error)
    }
}

#[pymethods]
impl LanguageModel {
    /// Reads a model file of `kind` ("text" or "transformer").
    #[staticmethod]
    fn load(py: Python<'_>, path: PathBuf, kind: &str) -> PyResult<LanguageModel> {
        let bytes = py.detach(|| textnet::io::fsutil::read_input(&path, "model file")).map_err(value_error)?;
        let mut text = None;
        let kind = match kind {
            "text" => {
                let model = TextModel::from_bytes(&bytes)
                    .with_context(|| format!("model file {}", path.display()))
                    .map_err(value_error)?;
                text = Some(model);
                "text"
            }
            "transformer" => {
                textnet::transformer::modelfile::TransformerModel::from_bytes(&bytes)
                    .with_context(|| format!("model file {}", path.display()))
                    .map_err(value_error)?;
                "transformer"
            }
            other => {
                return Err(PyValueError::new_err(format!("kind must be \"text\" or \"transformer\", got {other:?}")));
            }
        };
        Ok(LanguageModel { bytes, text, kind })
    }

    /// Writes the model file as `save_model` does.
    #[pyo3(signature = (path, overwrite=false))]
    fn save(&self, py: Python<'_>, path: PathBuf, overwrite: bool) -> PyResult<()> {
        let kind =
            if self.kind == "text" { &textnet::io::modelkind::TEXT } else { &textnet::io::modelkind::TRANSFORMER };
        py.detach(|| save_model(&path, &self.bytes, kind, overwrite)).map_err(value_error)
    }

    /// The ids of `text`'s characters in a Transformer's vocabulary (unknown ones as the unknown id 0).
    fn encode(&self, text: &str) -> PyResult<Vec<u32>> {
        Ok(self.transformer()?.vocab.encode(text).0)
    }

    /// A Transformer's scores for the next character after each position of `ids` (at most `block` of
    /// them), `[len(ids), vocab]`, from the CPU reference without dropout.
    fn logits<'py>(&self, py: Python<'py>, ids: Vec<u32>) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let model = self.transformer()?;
        let c = model.config;
        if ids.is_empty() || ids.len() > c.block {
            return Err(PyValueError::new_err(format!(
                "ids must hold 1 to {} ids (block), got {}",
                c.block,
                ids.len()
            )));
        }
        if let Some(id) = ids.iter().find(|&&id| id as usize >= c.vocab) {
            return Err(PyValueError::new_err(format!("id {id} is not in the vocabulary of {} ids", c.vocab)));
        }
        let forward = py.detach(|| textnet::transformer::model::forward::<f32>(&c, &model.params, &ids, 1, None, None));
        forward.logits.into_pyarray(py).reshape([ids.len(), c.vocab])
    }

    /// Writes a Transformer as an ONNX file (`textnet export --onnx`).
    fn export_onnx(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let model = self.transformer()?;
        py.detach(|| save_onnx(&path, &textnet::transformer::onnx::export(&model)?)).map_err(value_error)
    }

    /// The `top` likeliest next tokens after `text`, as (token, probability) pairs (text models).
    #[pyo3(signature = (text, top=5))]
    fn predict(&self, text: &str, top: usize) -> PyResult<Vec<(String, f32)>> {
        let Some(model) = &self.text else {
            return Err(PyValueError::new_err("predict takes a text model; a Transformer generates (generate)"));
        };
        if top == 0 {
            return Err(PyValueError::new_err("top must be at least 1"));
        }
        let prediction = textnet::text::predict::predict(model, text, top, false).map_err(value_error)?;
        Ok(prediction.top.into_iter().map(|c| (c.token, c.probability)).collect())
    }

    /// A continuation of `prompt`: `length` tokens (characters for a Transformer) sampled at
    /// `temperature`, among the `top_k` likeliest and the `top_p` nucleus, from `seed`; it ends early after
    /// a `stop` string. Returns the generated text (without the prompt).
    #[pyo3(signature = (prompt="", length=50, temperature=1.0, top_k=None, top_p=None, seed=1, stop=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &str,
        length: usize,
        temperature: f32,
        top_k: Option<usize>,
        top_p: Option<f32>,
        seed: u64,
        stop: Vec<String>,
    ) -> PyResult<String> {
        let args = textnet::commands::generate::GenerateArgs {
            prompt: Some(prompt.to_string()),
            prompt_flag: None,
            length,
            temperature,
            top_k,
            top_p,
            num_samples: 1,
            stop,
            seed,
            model: PathBuf::new(),
            json: false,
        };
        let sampling = args.check().map_err(|e| {
            PyValueError::new_err(
                format!("{e:#}").replace("--top-k", "top_k").replace("--top-p", "top_p").replace("--", ""),
            )
        })?;
        py.detach(|| -> anyhow::Result<String> {
            let mut generator = match self.kind {
                "text" => textnet::text::generate::open(&self.bytes)?,
                _ => textnet::transformer::generate::open(&self.bytes)?,
            };
            let prompt = generator.read_prompt(args.prompt())?;
            let mut rng = SeededRng::seed_from_u64(seed);
            let sample = textnet::ops::sampling::continuation(
                generator.as_mut(),
                &prompt,
                &sampling,
                args.length,
                &args.stop,
                &mut rng,
                &mut |_| true,
            )?;
            Ok(sample.text)
        })
        .map_err(value_error)
    }
}
