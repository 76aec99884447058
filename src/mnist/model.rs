//! The MNIST classifier, a one-hidden-layer MLP: its sizes, parameters, initialisation, model file, and
//! its forward pass on the CPU (a model file's figures, `textnet classify`). Over a batch of B images X
//! (B×I), with labels y:
//! ```text
//! z1     = X·W1ᵀ + b1,   a = act(z1)                       (B×H)
//! logits = a·W2ᵀ + b2,   p = softmax(logits)                (B×C)
//! loss   = (1/B) Σ_s −log p[s, y_s]
//! ```
//! It trains as the layer stack `Linear(I, H), act, Linear(H, C)` (`super::mlp`), whose CPU reference
//! and finite-difference checks are `nn::stack`'s. All parameters live in one flat f32 vector, W1 (H×I,
//! row-major) then b1 (H), W2 (C×H), b2 (C): `nn.Linear`'s layouts, and the stack's.

use crate::ops::cpu::SeededRng;
use crate::ops::cpu::dot;
use anyhow::{Context, Result, anyhow, bail};
use rand::SeedableRng;
use rand_distr::{Distribution, Uniform};
use std::collections::HashMap;

pub use crate::ops::activations::Activation;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// The MLP's sizes and hidden activation.
pub struct MlpShape {
    /// Inputs I: pixels per image.
    pub inputs: usize,
    /// Hidden units H.
    pub hidden: usize,
    /// Classes C (outputs).
    pub classes: usize,
    /// Hidden-layer activation.
    pub activation: Activation,
}

pub use crate::ops::mlp::Parts;

/// Largest `--hidden` accepted: beyond it the four parameter-sized buffers (parameters, gradient, two
/// Adam moments) would pass a few GB.
pub const MAX_HIDDEN: usize = 1 << 16;

impl MlpShape {
    /// Ok when the sizes are usable, otherwise the error line.
    pub fn validate(&self) -> Result<()> {
        if self.inputs == 0 || !(2..=256).contains(&self.classes) {
            bail!("the model needs at least one input and 2 to 256 classes (labels are bytes)");
        }
        if self.hidden == 0 || self.hidden > MAX_HIDDEN {
            bail!("--hidden must be between 1 and {MAX_HIDDEN}, got {}", self.hidden);
        }
        Ok(())
    }

    /// Length of the flat parameter vector.
    pub fn param_count(&self) -> usize {
        let MlpShape { inputs: i, hidden: h, classes: c, .. } = *self;
        h * i + h + c * h + c
    }

    /// Names and shapes of the tensors in flat-vector (and file) order.
    pub fn tensor_shapes(&self) -> [(&'static str, Vec<usize>); 4] {
        let MlpShape { inputs: i, hidden: h, classes: c, .. } = *self;
        [("w1", vec![h, i]), ("b1", vec![h]), ("w2", vec![c, h]), ("b2", vec![c])]
    }

    /// `flat` cut into the four parameter tensors.
    pub fn split<'a>(&self, flat: &'a [f32]) -> Parts<&'a [f32]> {
        Parts::of(flat, self.inputs, self.hidden, self.classes)
    }

    /// `flat` cut into the four parameter tensors, writable.
    pub fn split_mut<'a>(&self, flat: &'a mut [f32]) -> Parts<&'a mut [f32]> {
        Parts::of_mut(flat, self.inputs, self.hidden, self.classes)
    }
}

/// `format` metadata of the model file.
pub const FORMAT: &str = crate::io::modelkind::MNIST_MLP.tag;
/// Version of the model file layout, in its metadata.
pub const FORMAT_VERSION: u32 = 1;

/// All trainable parameters, flat (see the module comment for the layout).
#[derive(Clone, Debug, PartialEq)]
pub struct MlpParams {
    /// The sizes.
    pub shape: MlpShape,
    /// Every parameter: W1, b1, W2, b2 (module comment).
    pub flat: Vec<f32>,
}

impl MlpParams {
    /// W1 and W2 Xavier/Glorot uniform, U(±√(6/(fan_in+fan_out))); biases zero.
    pub fn init(shape: MlpShape, seed: u64) -> MlpParams {
        let mut rng = SeededRng::seed_from_u64(seed);
        let mut flat = vec![0.0f32; shape.param_count()];
        let parts = shape.split_mut(&mut flat);
        let MlpShape { inputs: i, hidden: h, classes: c, .. } = shape;
        for (w, fan_in, fan_out) in [(parts.w1, i, h), (parts.w2, h, c)] {
            let limit = (6.0 / (fan_in + fan_out) as f32).sqrt();
            let dist = Uniform::new_inclusive(-limit, limit).expect("finite positive limit");
            w.iter_mut().for_each(|x| *x = dist.sample(&mut rng));
        }
        MlpParams { shape, flat }
    }

    /// The four parameter tensors.
    pub fn parts(&self) -> Parts<&[f32]> {
        self.shape.split(&self.flat)
    }

    /// Whether every parameter is finite.
    pub fn all_finite(&self) -> bool {
        self.flat.iter().all(|x| x.is_finite())
    }

    /// The model as a .safetensors file: tensors w1, b1, w2, b2 (little-endian F32) and string metadata
    /// `format` (`textnet-mnist`), `format_version`, `inputs`, `hidden`, `classes`, `activation`, plus
    /// the caller's `extra` entries (`textnet mnist` adds `dataset`).
    pub fn to_safetensors(&self, extra: &[(&str, &str)]) -> Result<Vec<u8>> {
        let mut offset = 0;
        let mut tensors = Vec::new();
        for (name, dims) in self.shape.tensor_shapes() {
            let len = dims.iter().product::<usize>();
            tensors.push((name, &self.flat[offset..offset + len], dims));
            offset += len;
        }
        let s = self.shape;
        let mut meta: std::collections::BTreeMap<String, String> = [
            (crate::io::modelkind::KEY, FORMAT.to_string()),
            ("format_version", FORMAT_VERSION.to_string()),
            ("inputs", s.inputs.to_string()),
            ("hidden", s.hidden.to_string()),
            ("classes", s.classes.to_string()),
            ("activation", s.activation.name().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        meta.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        crate::io::tensorfile::to_bytes(&tensors, meta)
    }

    /// Reads what `to_safetensors` wrote; returns the parameters and the file's metadata.
    pub fn from_safetensors(bytes: &[u8]) -> Result<(MlpParams, HashMap<String, String>)> {
        let (_, header) = safetensors::SafeTensors::read_metadata(bytes).context("not a safetensors file")?;
        let meta = header.metadata().clone().unwrap_or_default();
        crate::io::modelkind::MNIST_MLP.check(Some(&meta), "textnet MNIST model file")?;
        let number = |key: &str| -> Result<usize> {
            meta.get(key)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| anyhow!("metadata entry {key:?} is missing or not a number"))
        };
        let activation = meta
            .get("activation")
            .and_then(|a| Activation::from_name(a))
            .ok_or_else(|| anyhow!("metadata entry \"activation\" is missing or unknown"))?;
        let shape =
            MlpShape { inputs: number("inputs")?, hidden: number("hidden")?, classes: number("classes")?, activation };
        shape.validate()?;
        let tensors = safetensors::SafeTensors::deserialize(bytes)?;
        // Every tensor is checked before anything is allocated: the metadata alone could ask for any size.
        let mut views = Vec::new();
        for (name, dims) in shape.tensor_shapes() {
            let t = tensors.tensor(name).with_context(|| format!("tensor {name}"))?;
            if t.dtype() != safetensors::Dtype::F32 || t.shape() != dims.as_slice() {
                bail!("tensor {name} is {} of shape {:?}, expected F32 of shape {dims:?}", t.dtype(), t.shape());
            }
            views.push(t);
        }
        let mut flat = Vec::with_capacity(views.iter().map(|t| t.data().len() / 4).sum());
        for t in &views {
            flat.extend(t.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())));
        }
        Ok((MlpParams { shape, flat }, meta))
    }
}

/// The class scores (logits) of one image `x` (for `textnet classify`).
pub fn logits(p: &MlpParams, x: &[f32]) -> Vec<f32> {
    let shape = p.shape;
    let (i, h, c) = (shape.inputs, shape.hidden, shape.classes);
    assert_eq!(x.len(), i, "image size does not match the model's inputs");
    let w = p.parts();
    let a: Vec<f32> = (0..h).map(|j| shape.activation.apply(dot(&w.w1[j * i..][..i], x) + w.b1[j])).collect();
    (0..c).map(|k| dot(&w.w2[k * h..][..h], &a) + w.b2[k]).collect()
}
