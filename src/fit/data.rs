//! What `textnet fit` trains on, from either source, as `Samples` per split:
//!
//! * `--dataset mnist|fashion [--data DIR]`: the IDX files (`datasets::mnist`), pixels / 255 (as
//!   `datasets::mnist::INPUT_SCALING` says), flat 784 values, or 1×28×28 images when the spec starts with
//!   an image layer (`Conv2d`, `MaxPool2d`, `Flatten`). The labels are classes; the test split is the
//!   dataset's.
//! * `--table FILE --target COL`: the table reader (`datasets::table`, column roles by
//!   `datasets::infer`), features as `datasets::features` lays them out, standardised with the training
//!   rows' mean and deviation. With cross-entropy the target is a class label (any text; the classes are
//!   its values in order of first appearance in the file); with squared error it is a number,
//!   standardised for training, its mean and deviation kept to report MAE in the file's units. The test
//!   rows are the last `1 − --split` of a seeded shuffle (or of the file), as `sales` splits.
//!
//! Without `--loss`, images and a target column whose values are not numbers (all, or all but a few, as
//! `datasets::infer` decides) train with cross-entropy, a numeric target with squared error: its few other
//! values are then bad rows, not classes. Validation samples (`--val-split`) are the last of the training
//! ones, after `--train-limit`.

use crate::datasets::features::{Dataset as TableData, Split, SplitOrder, Stats};
use crate::datasets::idx;
use crate::datasets::infer::{self, Overrides, Role, TargetValues};
use crate::datasets::mnist::{self, Dataset};
use crate::datasets::table::{BadRowError, ColumnSpec, LoadOptions, Schema, Table};
use crate::nn::stack::Samples;
use crate::nn::stack::Target;
use crate::nn::stack::model::Loss;
use crate::nn::stack::spec::{Layer, Shape, Spec};
use anyhow::{Result, anyhow, bail};
use std::path::{Path, PathBuf};

/// Where the samples come from.
#[derive(Clone, Debug)]
pub enum Source {
    /// MNIST or Fashion-MNIST, from `dir` or the usual places.
    Images {
        /// Which dataset.
        dataset: Dataset,
        /// `--data`.
        dir: Option<PathBuf>,
    },
    /// A table.
    Table {
        /// `--table`.
        file: PathBuf,
        /// `--target`.
        target: ColumnSpec,
        /// `--numeric`, `--categorical`, `--date`, `--ignore`.
        overrides: Overrides,
        /// `--split`: the share of the rows that trains.
        split: f64,
        /// `--split-order`.
        order: SplitOrder,
        /// `--skip-bad-rows`.
        skip_bad_rows: bool,
    },
}

/// How the samples are cut and what they are measured with.
#[derive(Clone, Copy, Debug)]
pub struct Request {
    /// `--loss`, if given.
    pub loss: Option<Loss>,
    /// `--seed` (the table's shuffle).
    pub seed: u64,
    /// `--train-limit`.
    pub train_limit: Option<usize>,
    /// `--val-split`.
    pub val_split: Option<f64>,
}

/// What the model's inputs are, recorded in its file so new samples are read the same way.
#[derive(Clone, Debug, PartialEq)]
pub enum InputSchema {
    /// Images of a dataset.
    Images {
        /// `mnist` or `fashion`.
        dataset: String,
        /// The network's input: flat 784, or 1×28×28.
        shape: Shape,
        /// `datasets::mnist::INPUT_SCALING`.
        scaling: String,
    },
    /// Rows of a table.
    Table(TableSchema),
    /// Arrays given to the Python package, taken as they are: the network's input shape. A 28×28 one
    /// (784 values, or 1×28×28) is read by `textnet classify` as an image scaled as `datasets::mnist`'s
    /// (`textnet.datasets.mnist` gives its arrays so).
    Array {
        /// Flat features, or channels × height × width.
        shape: Shape,
    },
}

/// How a table's rows become a model's inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct TableSchema {
    /// Which columns are the target and the features (the date features as the training table settled them).
    pub schema: Schema,
    /// `b'\t'` or `b','`.
    pub delimiter: u8,
    /// Whether the table has a header row.
    pub header: bool,
    /// Columns per row.
    pub width: usize,
    /// The name of each feature.
    pub feature_names: Vec<String>,
    /// Each categorical column's vocabulary (its one-hot order).
    pub vocabularies: Vec<Vec<String>>,
    /// The training rows' feature means and deviations (the inputs are (value − mean) / std).
    pub feature_mean: Vec<f32>,
    /// See `feature_mean`.
    pub feature_std: Vec<f32>,
    /// The target column's name.
    pub target_name: String,
}

/// What the target is.
#[derive(Clone, Debug, PartialEq)]
pub enum TargetInfo {
    /// Classes, by index.
    Classes {
        /// The name of each class.
        names: Vec<String>,
    },
    /// A number, trained on as (value − mean) / std.
    Value {
        /// The target column's name.
        name: String,
        /// The training rows' mean.
        mean: f32,
        /// The training rows' (population) standard deviation; 1 for a constant target.
        std: f32,
    },
}

/// The splits and what they are.
#[derive(Clone, Debug)]
pub struct Data {
    /// The network's input shape.
    pub input: Shape,
    /// The loss to train with.
    pub loss: Loss,
    /// What the target is.
    pub target: TargetInfo,
    /// How inputs are read.
    pub schema: InputSchema,
    /// The training samples.
    pub train: Samples,
    /// The validation samples (`--val-split`).
    pub val: Option<Samples>,
    /// The test samples.
    pub test: Samples,
    /// With a numeric target: the test and validation targets in the file's units.
    pub test_values: Vec<f32>,
    /// See `test_values`.
    pub val_values: Vec<f32>,
    /// Where the data was read from, for lines and the report ("Fashion-MNIST from DIR", the table).
    pub source: String,
    /// Training samples before `--train-limit`.
    pub full_train: usize,
    /// The files read (which `--out` must not be).
    pub files: Vec<PathBuf>,
    /// Lines to print before training (the columns' roles, skipped rows, a split warning).
    pub notes: Vec<String>,
    /// Columns the inferred schema leaves out (`Inferred::warnings`): printed also with --quiet, and in
    /// the report.
    pub warnings: Vec<String>,
    /// Bad rows skipped (tables).
    pub skipped: usize,
}

impl Data {
    /// Bytes of the samples and targets of every split.
    pub fn samples_bytes(&self) -> u64 {
        self.train.bytes() + self.test.bytes() + self.val.as_ref().map_or(0, Samples::bytes)
    }

    /// The number of classes, or 1 output for a value.
    pub fn outputs(&self) -> usize {
        match &self.target {
            TargetInfo::Classes { names } => names.len(),
            TargetInfo::Value { .. } => 1,
        }
    }
}

/// Whether a spec reads images: its first layer is one of the image layers.
pub fn reads_images(spec: &Spec) -> bool {
    matches!(spec.layers.first(), Some(Layer::Conv2d { .. } | Layer::MaxPool2d(_) | Layer::Flatten))
}

/// The input shape of MNIST images for `spec`.
pub fn image_shape(spec: &Spec) -> Shape {
    if reads_images(spec) {
        Shape::Image { channels: 1, height: idx::IMAGE_SIDE, width: idx::IMAGE_SIDE }
    } else {
        Shape::Flat(idx::PIXELS)
    }
}

/// Reads `source` for `spec` (module comment); `log` receives notes while reading (downloads).
pub fn load(source: &Source, spec: &Spec, request: Request, log: &dyn Fn(&str)) -> Result<Data> {
    match source {
        Source::Images { dataset, dir } => images(*dataset, dir.as_deref(), spec, request, log),
        Source::Table { file, target, overrides, split, order, skip_bad_rows } => {
            table(file, target, overrides, *split, *order, *skip_bad_rows, request)
        }
    }
}

/// How many of `n` training `what` (samples, rows) a validation fraction holds out: at least one, and never
/// all of them.
pub fn check_val_room(n: usize, fraction: f64, what: &str) -> Result<usize> {
    let n_val = ((n as f64 * fraction).ceil() as usize).max(1);
    if n_val >= n {
        bail!("--val-split {fraction} of {n} training {what} leaves none to train on");
    }
    Ok(n_val)
}

fn images(dataset: Dataset, dir: Option<&Path>, spec: &Spec, request: Request, log: &dyn Fn(&str)) -> Result<Data> {
    if request.loss == Some(Loss::Mse) {
        bail!(
            "--loss mse needs a numeric target, but {} labels its images with classes: use --loss ce",
            dataset.title()
        );
    }
    let data = mnist::load(dataset, dir, log)?;
    let mut train = data.train;
    let full_train = train.len();
    if let Some(limit) = request.train_limit {
        train.truncate(limit);
    }
    let samples = image_samples;
    let val = match request.val_split {
        Some(fraction) => {
            let n = train.len();
            let keep = n - check_val_room(n, fraction, "images")?;
            let val = idx::Split {
                images: train.images[keep * train.pixels..].to_vec(),
                labels: train.labels[keep..].to_vec(),
                pixels: train.pixels,
            };
            train.truncate(keep);
            Some(samples(&val))
        }
        None => None,
    };
    let files = mnist::FILES.iter().flat_map(|f| [data.dir.join(f), data.dir.join(format!("{f}.gz"))]).collect();
    Ok(Data {
        input: image_shape(spec),
        loss: Loss::Ce,
        target: TargetInfo::Classes { names: dataset.class_names().iter().map(|s| s.to_string()).collect() },
        schema: InputSchema::Images {
            dataset: dataset.name().to_string(),
            shape: image_shape(spec),
            scaling: mnist::INPUT_SCALING.to_string(),
        },
        train: samples(&train),
        val,
        test: samples(&data.test),
        test_values: Vec::new(),
        val_values: Vec::new(),
        source: format!("{} from {}", dataset.title(), data.dir.display()),
        full_train,
        files,
        notes: Vec::new(),
        warnings: Vec::new(),
        skipped: 0,
    })
}

#[allow(clippy::too_many_arguments)]
fn table(
    file: &Path,
    target: &ColumnSpec,
    overrides: &Overrides,
    split: f64,
    order: SplitOrder,
    skip_bad_rows: bool,
    request: Request,
) -> Result<Data> {
    let bytes = crate::io::fsutil::read_input(file, "table")?;
    let source = crate::io::fsutil::shown(file);
    let inferred = infer::infer(&source, &bytes, target, overrides)?;
    let mut notes = vec![format!("columns of {source}:")];
    notes.extend(inferred.choices.iter().map(|c| c.line()));
    let loss = match (request.loss, &inferred.target) {
        (Some(loss), _) => loss,
        (None, TargetValues::Labels(_)) => Loss::Ce,
        (None, _) => Loss::Mse,
    };
    if let (Loss::Mse, TargetValues::Labels(label)) = (loss, &inferred.target) {
        let name = inferred.choices.iter().find(|c| c.role == Role::Target).map_or("", |c| c.name.as_str());
        bail!(
            "--loss mse needs a numeric target, but {source}:{}: the target {name} is {:?}; use --loss ce to predict \
             it as a class",
            label.line,
            crate::harness::console::abridged(&label.text)
        );
    }
    let mut options = LoadOptions::new(inferred.schema.clone());
    options.skip_bad_rows = skip_bad_rows;
    options.train_fraction = split;
    options.target_labels = loss == Loss::Ce;
    let table = Table::parse(&source, &bytes, &options).map_err(|e| {
        // A target of numbers but for a few values may be class labels, some written as numbers.
        let target_index = inferred.choices.iter().position(|c| c.role == Role::Target);
        let in_target = e.downcast_ref::<BadRowError>().is_some_and(|bad| Some(bad.column - 1) == target_index);
        let mostly = matches!(inferred.target, TargetValues::MostlyNumbers(_)) && request.loss.is_none();
        match inferred.explain(e) {
            e if in_target && mostly => anyhow!("{e:#}; or --loss ce reads the target as class labels"),
            e => e,
        }
    })?;
    let target_name = table.columns.target.as_ref().map_or_else(|| target.to_string(), |c| c.name.clone());
    let labels = table.target_levels.clone();
    if loss == Loss::Ce && labels.len() < 2 {
        bail!(
            "{source}: the target {target_name} has {} class{} ({}), so there is nothing to tell apart",
            labels.len(),
            if labels.len() == 1 { "" } else { "es" },
            labels.iter().map(|l| format!("{l:?}")).collect::<Vec<_>>().join(", ")
        );
    }
    let mut data = TableData::from_table(&table, split, order, request.seed)?;
    let full_train = data.train.rows;
    if let Some(limit) = request.train_limit
        && limit < data.train.rows
    {
        data.train.split_off(limit);
    }
    if let Some(fraction) = request.val_split {
        check_val_room(data.train.rows, fraction, "rows")?;
        data.hold_out(fraction)?;
    }
    if data.skipped > 0 {
        notes.push(format!(
            "skipped {} bad row{} (the first: {})",
            data.skipped,
            if data.skipped == 1 { "" } else { "s" },
            data.first_skipped.as_deref().unwrap_or("?")
        ));
    }
    if loss == Loss::Mse
        && let Some(warning) = data.split_shift()
    {
        notes.push(warning);
    }
    let stats = Stats::of(&data.train);
    let target = match loss {
        Loss::Ce => TargetInfo::Classes { names: labels },
        Loss::Mse => TargetInfo::Value { name: target_name.clone(), mean: stats.target_mean, std: stats.target_std },
    };
    let samples = |s: &Split| {
        let n = stats.normalize(s);
        let target = match loss {
            Loss::Ce => Target::Classes(s.y.iter().map(|&y| y as u32).collect()),
            Loss::Mse => Target::Values(n.y),
        };
        Samples { features: s.features, x: n.x, target }
    };
    let val = (!data.val.is_empty()).then(|| samples(&data.val));
    let schema = TableSchema {
        schema: Schema { date_features: Some(table.date_features.clone()), ..options.schema },
        delimiter: table.delimiter,
        header: table.header.is_some(),
        width: table.width,
        feature_names: data.feature_names.clone(),
        vocabularies: data.vocabularies.clone(),
        feature_mean: stats.feature_mean.clone(),
        feature_std: stats.feature_std.clone(),
        target_name,
    };
    let values = |s: &Split| if loss == Loss::Mse { s.y.clone() } else { Vec::new() };
    let warnings = inferred.warnings(&source);
    Ok(Data {
        input: Shape::Flat(data.features()),
        loss,
        target,
        train: samples(&data.train),
        val,
        test: samples(&data.test),
        test_values: values(&data.test),
        val_values: values(&data.val),
        source,
        full_train,
        files: vec![file.to_path_buf()],
        notes,
        warnings,
        skipped: data.skipped,
        schema: InputSchema::Table(schema),
    })
    .and_then(|d: Data| if d.train.rows() == 0 { Err(anyhow!("no training rows")) } else { Ok(d) })
}

/// A split of (Fashion-)MNIST as `fit` reads it: pixels / 255, the class of each image.
pub fn image_samples(split: &idx::Split) -> Samples {
    Samples {
        features: split.pixels,
        x: split.images.clone(),
        target: Target::Classes(split.labels.iter().map(|&l| l as u32).collect()),
    }
}

impl Data {
    /// "classes" or "value".
    pub fn target_kind(&self) -> &'static str {
        match self.target {
            TargetInfo::Classes { .. } => "classes",
            TargetInfo::Value { .. } => "value",
        }
    }
}
