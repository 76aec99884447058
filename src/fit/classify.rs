//! A `textnet fit` model file of images opened as an image classifier for the shared `textnet classify`
//! (through `PIPELINE`'s `image_classifier`): the image shape and scaling its `input` records, its class
//! names, and the CPU reference's forward (`model::forward`, dropout off). A model trained on a table is
//! refused with the command that takes it.

use super::data::{InputSchema, TargetInfo};
use super::modelfile;
use crate::datasets::idx::{IMAGE_SIDE, PIXELS};
use crate::nn::stack::model;
use crate::nn::stack::spec::Shape;
use crate::pipeline::ImageModel;
use anyhow::{Result, bail};
use std::path::Path;

/// Opens a fit model file of images, read from `path`, as an image classifier.
pub fn open(bytes: &[u8], path: &Path) -> Result<ImageModel> {
    let m = modelfile::from_bytes(bytes)?;
    let (shape, scaling) = match &m.input {
        InputSchema::Images { shape, scaling, .. } => (*shape, scaling.clone()),
        // Arrays of 28×28 values are taken as `textnet.datasets.mnist` gives them (data.rs).
        InputSchema::Array { shape } => (*shape, crate::datasets::mnist::INPUT_SCALING.to_string()),
        InputSchema::Table(_) => {
            bail!("this model was trained on a table; use textnet fit --model {} --predict FILE", path.display())
        }
    };
    let (channels, height, width) = match shape {
        Shape::Image { channels, height, width } => (channels, height, width),
        // A flat input reads the dataset's 28×28 images row by row.
        Shape::Flat(n) if n == PIXELS => (1, IMAGE_SIDE, IMAGE_SIDE),
        Shape::Flat(n) => bail!("its input is {n} values, not the {PIXELS} pixels of a 28×28 image"),
    };
    let class_names = match &m.target {
        TargetInfo::Classes { names } => names.clone(),
        TargetInfo::Value { name, .. } => bail!("it predicts a value ({name}), not classes"),
    };
    let scores = Box::new(move |x: &[f32], rows: usize| {
        let mut trace = model::forward(&m.net, &m.params, x, rows, None);
        trace.values.pop().expect("the network's output")
    });
    Ok(ImageModel { channels, height, width, scaling, class_names, scores })
}
