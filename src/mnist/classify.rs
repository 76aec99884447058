//! An MNIST model file, MLP or CNN, opened as an image classifier for the shared `textnet classify`
//! (through `PIPELINE`'s `image_classifier`): 28×28 greyscale images scaled as in training
//! (`super::INPUT_SCALING`), the class names the file records, and the CPU reference's logits.

use super::idx::{CLASSES, IMAGE_SIDE, PIXELS};
use super::{Classifier, cnn, model};
use crate::pipeline::{ImageModel, Scores};
use anyhow::{Result, bail};
use std::path::Path;

/// Opens an MNIST model file (either kind) as an image classifier.
pub fn open(bytes: &[u8], _path: &Path) -> Result<ImageModel> {
    let (classifier, meta) = Classifier::from_safetensors(bytes)?;
    if !classifier.fits_mnist() {
        let (inputs, classes) = match &classifier {
            Classifier::Mlp(p) => (p.shape.inputs, p.shape.classes),
            Classifier::Cnn(p) => (p.shape.side * p.shape.side, p.shape.classes),
        };
        bail!("a model of {inputs} inputs and {classes} classes; images need {PIXELS} and {CLASSES}");
    }
    let class_names: Vec<String> = meta
        .get("class_names")
        .and_then(|n| serde_json::from_str::<Vec<String>>(n).ok())
        .filter(|n| n.len() == CLASSES)
        .unwrap_or_else(|| (0..CLASSES).map(|c| c.to_string()).collect());
    let scores: Scores = match classifier {
        Classifier::Mlp(p) => Box::new(move |x, rows| {
            x.chunks_exact(PIXELS).take(rows).flat_map(|image| model::logits(&p, image)).collect()
        }),
        Classifier::Cnn(p) => Box::new(move |x, rows| {
            x.chunks_exact(PIXELS).take(rows).flat_map(|image| cnn::logits(&p, image)).collect()
        }),
    };
    Ok(ImageModel {
        channels: 1,
        height: IMAGE_SIDE,
        width: IMAGE_SIDE,
        scaling: super::INPUT_SCALING.to_string(),
        class_names,
        scores,
    })
}
