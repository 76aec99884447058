//! `textnet classify`: a saved image classifier on images: PNG, JPEG or PNM files (made 8-bit greyscale
//! of the model's size by `datasets::images`) or IDX image files (every image in them), scaled as in
//! training; with `--labels` the accuracy, loss and confusion matrix too. On the CPU reference. The
//! pipeline whose model kind the file names opens it (`pipelines::ALL`, `pipeline::ImageClassifier`):
//! an MNIST MLP or CNN of `textnet mnist`, or a network of `textnet fit` trained on images.

use crate::datasets::{idx, images};
use crate::harness::classification::Evaluation;
use crate::harness::console;
use crate::ops::cpu::softmax_in_place;
use crate::ops::losses::softmax_xent;
use crate::pipeline::ImageModel;
use anyhow::{Context, Result, anyhow, bail};
use rayon::prelude::*;
use serde_json::json;
use std::path::{Path, PathBuf};

/// Images scored at once.
const CHUNK: usize = 256;

#[derive(clap::Args, Debug)]
/// The flags of `textnet classify`.
pub struct ClassifyArgs {
    /// Images: PNG, JPEG or PGM/PPM files (colour ones converted to greyscale and other sizes resized to
    /// the model's 28×28, as torchvision's Grayscale and Resize do), or IDX image files (raw or .gz)
    #[arg(required = true)]
    pub images: Vec<PathBuf>,
    /// Model file written by `textnet mnist`, or by `textnet fit` on images
    #[arg(short = 'm', long, default_value = "mnist.safetensors")]
    pub model: PathBuf,
    /// IDX labels of the one IDX image file given: report accuracy, loss and the confusion matrix
    #[arg(long, value_name = "IDX")]
    pub labels: Option<PathBuf>,
    /// Draw the confusion matrix (with --labels) to FILE.svg or FILE.png: true classes in rows, predicted
    /// ones in columns, the count in each cell
    #[arg(long, value_name = "FILE", requires = "labels")]
    pub plot: Option<PathBuf>,
    /// Print one JSON object
    #[arg(long, conflicts_with = "tsv")]
    pub json: bool,
    /// Print tab-separated lines: input, class number, class name, probability
    #[arg(long)]
    pub tsv: bool,
    /// No notes on stderr about images converted to the model's 8-bit greyscale size (errors only)
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// What a model file that is no image classifier is refused as.
const EXPECTED: &str = "a textnet MNIST model file or a textnet fit model of images";

/// The model file `bytes` (read from `path`) opened by the pipeline whose kind it names.
fn open(bytes: &[u8], path: &Path) -> Result<ImageModel> {
    let kind = crate::io::modelkind::claimed_by(bytes);
    let hook = crate::pipelines::ALL
        .iter()
        .find(|p| kind.is_some_and(|k| p.models.contains(&k)))
        .and_then(|p| p.image_classifier.as_ref());
    if let Some(hook) = hook {
        return (hook.open)(bytes, path);
    }
    let (_, header) =
        safetensors::SafeTensors::read_metadata(bytes).map_err(|e| anyhow!("not a safetensors file ({e})"))?;
    let meta = header.metadata().clone().unwrap_or_default();
    match (crate::io::modelkind::describe(Some(&meta)), crate::io::modelkind::tag(&meta)) {
        (Some(what), _) => bail!("not {EXPECTED}: {what}"),
        (None, Some(other)) => {
            bail!("not a textnet model file: its metadata names the format {other:?} (expected {EXPECTED})")
        }
        (None, None) => bail!("not a textnet model file: its metadata names no format (expected {EXPECTED})"),
    }
}

/// How the model's inputs are made from pixel bytes: the one scaling textnet's image models record.
fn scale(model: &ImageModel) -> Result<fn(u8) -> f32> {
    if model.class_names.is_empty() {
        bail!("it names no classes");
    }
    if model.scaling != crate::datasets::mnist::INPUT_SCALING {
        bail!("its inputs are {:?}, which classify cannot make from images", model.scaling);
    }
    if model.channels != 1 {
        bail!("it reads images of {} channels; classify makes greyscale ones", model.channels);
    }
    Ok(|p| p as f32 / 255.0)
}

/// The images of one file: their names, their inputs (each pixel byte through `scale`), and whether the
/// file was an IDX image file. An image converted to the model's input gets a note on stderr unless
/// `quiet`.
fn read_images(
    path: &Path,
    model: &ImageModel,
    scale: fn(u8) -> f32,
    quiet: bool,
) -> Result<(Vec<String>, Vec<f32>, bool)> {
    let (width, height) = (model.width, model.height);
    let shown = crate::io::fsutil::shown(path);
    let is_idx = |head: &[u8]| head.starts_with(&[0x1f, 0x8b]) || head.starts_with(&[0, 0, 8, 3]);
    if !crate::io::fsutil::is_stdin(path) {
        // An IDX file is decoded as it is read (it may be gzipped and large), not read whole first.
        let mut head = [0u8; 4];
        let read = std::io::Read::read(&mut crate::io::fsutil::open_input(path, "image file")?, &mut head).unwrap_or(0);
        if is_idx(&head[..read]) {
            let images = idx::read_idx(path, 3)?;
            let (count, rows, cols) = (images.dims[0], images.dims[1], images.dims[2]);
            if count == 0 {
                bail!("{shown}: holds no images");
            }
            if (rows, cols) != (height, width) {
                bail!("{shown}: images are {rows}×{cols} pixels; the model reads {height}×{width}");
            }
            idx::check_float_memory(path, count)?;
            let names = (0..count).map(|i| format!("{shown}#{i}")).collect();
            return Ok((names, images.data.iter().map(|&p| scale(p)).collect(), true));
        }
    }
    let bytes = crate::io::fsutil::read_input(path, "image file")?;
    if bytes.starts_with(&[0, 0, 8, 1]) {
        bail!("{shown} is an IDX label file, not images; give it with --labels");
    }
    if is_idx(&bytes) {
        bail!("{shown}: an IDX image file must be given as a file, not on standard input");
    }
    let image = images::decode_sized(&bytes, width, height).with_context(|| shown.clone())?;
    if let Some(conversion) = &image.conversion
        && !quiet
    {
        console::err(&format!("{shown}: {conversion}"));
    }
    Ok((vec![shown], image.pixels.iter().map(|&p| scale(p)).collect(), false))
}

/// Each image's class and its probability (class, probability), and the loss and confusion matrix
/// against `labels`: the first largest score is the class, as training's evaluations pick it.
fn classify(model: &ImageModel, inputs: &[f32], labels: &[u8]) -> Result<(Evaluation, Vec<(usize, f32)>)> {
    let classes = model.class_names.len();
    let per_image = model.inputs();
    let scores: Vec<Vec<f32>> =
        inputs.par_chunks(CHUNK * per_image).map(|x| (model.scores)(x, x.len() / per_image)).collect();
    let mut evaluation = Evaluation::new(classes);
    let mut predictions = Vec::with_capacity(labels.len());
    let mut d = vec![0.0f32; classes];
    for (logits, &label) in scores.iter().flat_map(|s| s.chunks_exact(classes)).zip(labels) {
        let label = label as usize;
        evaluation.loss += softmax_xent(logits, label, &mut d) as f64;
        let mut probs = logits.to_vec();
        softmax_in_place(&mut probs);
        if probs.iter().any(|p| !p.is_finite()) {
            bail!("the model's output is not finite: its weights are too large to be a trained model");
        }
        let class = logits.iter().enumerate().fold(0, |b, (k, &v)| if v > logits[b] { k } else { b });
        predictions.push((class, probs[class]));
        evaluation.record(label, class);
    }
    assert_eq!(predictions.len(), labels.len(), "a score for every image");
    Ok((evaluation, predictions))
}

/// Runs `textnet classify`.
pub fn run(args: ClassifyArgs) -> Result<()> {
    let mut inputs: Vec<(&str, &Path)> = vec![("model file", args.model.as_path())];
    inputs.extend(args.images.iter().map(|p| ("image file", p.as_path())));
    inputs.extend(args.labels.as_deref().map(|p| ("--labels file", p)));
    // The second reader of standard input would find it empty.
    if inputs.iter().filter(|(_, path)| crate::io::fsutil::is_stdin(path)).count() > 1 {
        bail!("- (standard input) can be given once");
    }
    crate::harness::plot::check(args.plot.as_deref(), None, &inputs)?;
    let bytes = crate::io::fsutil::read_input(&args.model, "model file")?;
    let model = open(&bytes, &args.model)
        .and_then(|model| scale(&model).map(|scale| (model, scale)))
        .with_context(|| format!("model file {}", args.model.display()));
    let (model, scale) = model?;
    let names = &model.class_names;

    let (mut inputs, mut pixels, mut one_idx_file) = (Vec::new(), Vec::new(), false);
    for path in &args.images {
        let (n, p, is_idx) = read_images(path, &model, scale, args.quiet)?;
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
        if let Some(i) = read.data.iter().position(|&l| l as usize >= names.len()) {
            bail!("{}: label {} at index {i} is not a class 0–{}", path.display(), read.data[i], names.len() - 1);
        }
        labels = read.data;
    }
    let (evaluation, predictions) = classify(&model, &pixels, &labels)?;
    if let Some(path) = &args.plot {
        // Files by their names: the picture's title has no room for their directories.
        let name = |p: &Path| p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into());
        let title = format!(
            "{} on {}: {} images, accuracy {:.2}%",
            name(&args.model),
            args.images.first().map_or(String::new(), |p| name(p)),
            crate::harness::report::count(predictions.len()),
            100.0 * evaluation.accuracy()
        );
        crate::harness::plot::confusion_matrix(path, &title, &evaluation, names)?;
        if !args.quiet {
            console::err(&format!("--plot {}: the confusion matrix", path.display()));
        }
    }
    if args.json {
        let items: Vec<_> = predictions
            .iter()
            .zip(&inputs)
            .map(|(&(c, p), input)| json!({"input": input, "class": c, "name": names[c], "probability": p}))
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
        for (&(c, p), input) in predictions.iter().zip(&inputs) {
            console::out(&format!("{input}\t{c}\t{}\t{p:.6}", names[c]));
        }
    } else if args.labels.is_none() || predictions.len() <= 20 {
        let width = inputs.iter().map(|n| n.chars().count()).max().unwrap_or(0);
        for (&(c, p), input) in predictions.iter().zip(&inputs) {
            console::out(&format!("{input:<width$}  {c} {:<12} {p:.4}", names[c]));
        }
    }
    if args.labels.is_some() && !args.tsv {
        console::out(&format!(
            "{} images: accuracy {:.2}%, loss {:.4}",
            crate::harness::report::count(predictions.len()),
            100.0 * evaluation.accuracy(),
            evaluation.mean_loss()
        ));
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        console::out(&evaluation.confusion_table(&names, "images"));
    }
    Ok(())
}
