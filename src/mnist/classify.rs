//! `textnet classify`: a saved MNIST model on images: PNG, JPEG or PNM files (made 8-bit greyscale 28×28
//! by `images`) or IDX image files (every image in them), scaled as in training (`super::INPUT_SCALING`);
//! with `--labels` the accuracy, loss and confusion matrix too. On the CPU reference.

use super::Evaluation;
use super::cnn::CnnParams;
use super::idx::{self, CLASSES, IMAGE_SIDE, PIXELS, Split};
use super::images;
use super::model::{self, MlpParams, Workspace};
use crate::console;
use crate::cpu::softmax_in_place;
use crate::ops::losses::softmax_xent;
use anyhow::{Context, Result, bail};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
/// The flags of `textnet classify`.
pub struct ClassifyArgs {
    /// Images: PNG, JPEG or PGM/PPM files (colour ones converted to greyscale and other sizes resized to
    /// 28×28, as torchvision's Grayscale and Resize do), or IDX image files (raw or .gz)
    #[arg(required = true)]
    pub images: Vec<PathBuf>,
    /// Model file written by `textnet mnist`
    #[arg(short = 'm', long, default_value = "mnist.safetensors")]
    pub model: PathBuf,
    /// IDX labels of the one IDX image file given: report accuracy, loss and the confusion matrix
    #[arg(long, value_name = "IDX")]
    pub labels: Option<PathBuf>,
    /// Print one JSON object
    #[arg(long, conflicts_with = "tsv")]
    pub json: bool,
    /// Print tab-separated lines: input, class number, class name, probability
    #[arg(long)]
    pub tsv: bool,
    /// No notes on stderr about images converted to 8-bit greyscale 28×28 (errors only)
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// The images of one file: their names, their pixels, and whether the file was an IDX image file. An
/// image converted to the model's input gets a note on stderr unless `quiet`.
fn read_images(path: &Path, quiet: bool) -> Result<(Vec<String>, Vec<f32>, bool)> {
    let shown = crate::fsutil::shown(path);
    let is_idx = |head: &[u8]| head.starts_with(&[0x1f, 0x8b]) || head.starts_with(&[0, 0, 8, 3]);
    if !crate::fsutil::is_stdin(path) {
        // An IDX file is decoded as it is read (it may be gzipped and large), not read whole first.
        let mut head = [0u8; 4];
        let read = std::io::Read::read(&mut crate::fsutil::open_input(path, "image file")?, &mut head).unwrap_or(0);
        if is_idx(&head[..read]) {
            let images = idx::read_idx(path, 3)?;
            let (count, rows, cols) = (images.dims[0], images.dims[1], images.dims[2]);
            if count == 0 {
                bail!("{shown}: holds no images");
            }
            if (rows, cols) != (IMAGE_SIDE, IMAGE_SIDE) {
                bail!("{shown}: images are {rows}×{cols} pixels; the model reads {IMAGE_SIDE}×{IMAGE_SIDE}");
            }
            idx::check_float_memory(path, count)?;
            let names = (0..count).map(|i| format!("{shown}#{i}")).collect();
            return Ok((names, images.data.iter().map(|&p| p as f32 / 255.0).collect(), true));
        }
    }
    let bytes = crate::fsutil::read_input(path, "image file")?;
    if bytes.starts_with(&[0, 0, 8, 1]) {
        bail!("{shown} is an IDX label file, not images; give it with --labels");
    }
    if is_idx(&bytes) {
        bail!("{shown}: an IDX image file must be given as a file, not on standard input");
    }
    let image = images::decode(&bytes).with_context(|| shown.clone())?;
    if let Some(conversion) = &image.conversion
        && !quiet
    {
        console::err(&format!("{shown}: {conversion}"));
    }
    Ok((vec![shown], image.pixels.iter().map(|&p| p as f32 / 255.0).collect(), false))
}

/// Each image's class and its probability (image index, class, probability), and the loss and confusion
/// matrix against the split's labels.
type Classified = (Evaluation, Vec<(usize, usize, f32)>);

fn classify_mlp(params: &MlpParams, split: &Split) -> Result<Classified> {
    let rows: Vec<u32> = (0..split.len() as u32).collect();
    let mut ws = Workspace::default();
    let mut evaluation = Evaluation::new(CLASSES);
    let mut predictions = Vec::with_capacity(rows.len());
    for chunk in rows.chunks(super::CPU_CHUNK) {
        evaluation.loss += model::forward(params, split, chunk, &mut ws);
        if ws.probs[..chunk.len() * CLASSES].iter().any(|p| !p.is_finite()) {
            bail!("the model's output is not finite: its weights are too large to be a trained model");
        }
        for (s, &row) in chunk.iter().enumerate() {
            let class = ws.predicted[s] as usize;
            predictions.push((row as usize, class, ws.probs[s * CLASSES + class]));
            evaluation.record(split.label(row), class);
        }
    }
    Ok((evaluation, predictions))
}

fn classify_cnn(params: &CnnParams, split: &Split) -> Result<Classified> {
    let mut evaluation = Evaluation::new(CLASSES);
    let mut predictions = Vec::with_capacity(split.len());
    let mut d = vec![0.0f32; CLASSES];
    for row in 0..split.len() as u32 {
        let mut probs = super::cnn::logits(params, split.image(row));
        evaluation.loss += softmax_xent(&probs, split.label(row), &mut d) as f64;
        softmax_in_place(&mut probs);
        if probs.iter().any(|p| !p.is_finite()) {
            bail!("the model's output is not finite: its weights are too large to be a trained model");
        }
        // The first largest, as the MLP's kernels and the CNN's evaluation pick it.
        let class = probs.iter().enumerate().fold(0, |b, (k, &p)| if p > probs[b] { k } else { b });
        predictions.push((row as usize, class, probs[class]));
        evaluation.record(split.label(row), class);
    }
    Ok((evaluation, predictions))
}

/// Runs `textnet classify`.
pub fn run(args: ClassifyArgs) -> Result<()> {
    let bytes = crate::fsutil::read_input(&args.model, "model file")?;
    let (classifier, meta) =
        super::Classifier::from_safetensors(&bytes).with_context(|| format!("model file {}", args.model.display()))?;
    if !classifier.fits_mnist() {
        let (inputs, classes) = match &classifier {
            super::Classifier::Mlp(p) => (p.shape.inputs, p.shape.classes),
            super::Classifier::Cnn(p) => (p.shape.side * p.shape.side, p.shape.classes),
        };
        bail!(
            "{}: a model of {inputs} inputs and {classes} classes; images need {PIXELS} and {CLASSES}",
            args.model.display()
        );
    }
    let names: Vec<String> = meta
        .get("class_names")
        .and_then(|n| serde_json::from_str::<Vec<String>>(n).ok())
        .filter(|n| n.len() == CLASSES)
        .unwrap_or_else(|| (0..CLASSES).map(|c| c.to_string()).collect());

    let (mut inputs, mut pixels, mut one_idx_file) = (Vec::new(), Vec::new(), false);
    for path in &args.images {
        let (n, p, is_idx) = read_images(path, args.quiet)?;
        inputs.extend(n);
        pixels.extend(p);
        one_idx_file = is_idx && args.images.len() == 1;
    }
    let mut labels = vec![0u8; inputs.len()];
    if let Some(path) = &args.labels {
        if !one_idx_file {
            bail!("--labels goes with exactly one IDX image file");
        }
        let read = idx::read_idx(path, 1)?;
        if read.dims[0] != inputs.len() {
            bail!("{} holds {} labels for {} images", path.display(), read.dims[0], inputs.len());
        }
        if let Some(i) = read.data.iter().position(|&l| l as usize >= CLASSES) {
            bail!("{}: label {} at index {i} is not a class 0–{}", path.display(), read.data[i], CLASSES - 1);
        }
        labels = read.data;
    }
    let split = Split { images: pixels, labels, pixels: PIXELS };
    let (evaluation, predictions) = match &classifier {
        super::Classifier::Mlp(params) => classify_mlp(params, &split)?,
        super::Classifier::Cnn(params) => classify_cnn(params, &split)?,
    };
    if args.json {
        let items: Vec<_> = predictions
            .iter()
            .map(|&(i, c, p)| json!({"input": inputs[i], "class": c, "name": names[c], "probability": p}))
            .collect();
        let mut out = json!({"model": args.model.display().to_string(), "predictions": items});
        if args.labels.is_some() {
            out["accuracy"] = json!(evaluation.accuracy());
            out["loss"] = json!(evaluation.mean_loss());
            out["confusion"] = json!(evaluation.confusion_rows());
        }
        console::out(&out.to_string());
        return Ok(());
    }
    if args.tsv {
        for &(i, c, p) in &predictions {
            console::out(&format!("{}\t{c}\t{}\t{p:.6}", inputs[i], names[c]));
        }
    } else if args.labels.is_none() || predictions.len() <= 20 {
        let width = inputs.iter().map(|n| n.chars().count()).max().unwrap_or(0);
        for &(i, c, p) in &predictions {
            console::out(&format!("{:<width$}  {c} {:<12} {:.4}", inputs[i], names[c], p));
        }
    }
    if args.labels.is_some() && !args.tsv {
        console::out(&format!(
            "{} images: accuracy {:.2}%, loss {:.4}",
            crate::report::count(predictions.len()),
            100.0 * evaluation.accuracy(),
            evaluation.mean_loss()
        ));
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        console::out(&evaluation.confusion_table(&names, "images"));
    }
    Ok(())
}
