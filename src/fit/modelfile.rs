//! The `textnet fit` model file: safetensors whose tensors are `nn.Sequential`'s `state_dict`
//! (`0.weight`, `0.bias`, `3.weight`, …; `Network::tensors`), so `load_state_dict(strict=True)` takes it,
//! and string metadata:
//!
//! * `format`: `textnet-fit` (`modelkind::FIT`); `textnet`: the version that wrote it;
//! * `spec`: the layers, every width written out (`Linear(784, 128), ReLU, Linear(128, 10)`), which
//!   `spec::parse` reads back;
//! * `loss`: `ce` or `mse`;
//! * `input`: JSON, `{"kind": "images", "dataset", "shape": [1, 28, 28] or [784], "scaling"}`,
//!   `{"kind": "array", "shape"}` (a model of the Python package, trained on arrays as they were given) or
//!   `{"kind": "table", "schema": {target, numeric, categorical, date, date_features, column_names,
//!   delimiter, header, columns}, "features", "vocabularies", "feature_mean", "feature_std", "target"}`;
//! * `class_names` (JSON list) for a class target, `target` (JSON `{name, mean, std}`) for a numeric one.
//!
//! Reading a file rebuilds the network from `spec` and `input`, and refuses a file whose tensors are not
//! exactly the ones that network has.

use super::data::{InputSchema, TableSchema, TargetInfo};
use crate::datasets::dates::DateFeatures;
use crate::datasets::table::{ColumnSpec, Schema};
use crate::nn::stack::model::{Loss, Network};
use crate::nn::stack::spec::{self, Shape};
use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// A trained network and what it takes to use it.
#[derive(Clone, Debug, PartialEq)]
pub struct FitModel {
    /// The network (its layers with every width).
    pub net: Network,
    /// Its parameters (flat, `Network` layout).
    pub params: Vec<f32>,
    /// The loss it was trained with.
    pub loss: Loss,
    /// How inputs are read.
    pub input: InputSchema,
    /// What the outputs mean.
    pub target: TargetInfo,
}

fn column_text(spec: &ColumnSpec) -> String {
    match spec {
        ColumnSpec::Name(name) => name.clone(),
        ColumnSpec::Number(n) => n.to_string(),
    }
}

fn shape_dims(shape: Shape) -> Vec<usize> {
    match shape {
        Shape::Flat(n) => vec![n],
        Shape::Image { channels, height, width } => vec![channels, height, width],
    }
}

fn input_json(input: &InputSchema) -> Value {
    match input {
        InputSchema::Images { dataset, shape, scaling } => {
            json!({"kind": "images", "dataset": dataset, "shape": shape_dims(*shape), "scaling": scaling})
        }
        InputSchema::Array { shape } => json!({"kind": "array", "shape": shape_dims(*shape)}),
        InputSchema::Table(t) => {
            let s = &t.schema;
            let specs = |v: &[ColumnSpec]| v.iter().map(column_text).collect::<Vec<_>>();
            json!({
                "kind": "table",
                "schema": {
                    "target": column_text(&s.target), "numeric": specs(&s.numeric),
                    "categorical": specs(&s.categorical), "date": specs(&s.date),
                    "date_features": s.date_features.as_ref().map(|f| f.iter().map(|f| f.name()).collect::<Vec<_>>()),
                    "column_names": s.column_names,
                    "delimiter": (t.delimiter as char).to_string(), "header": t.header, "columns": t.width,
                },
                "features": t.feature_names,
                "vocabularies": t.vocabularies,
                "feature_mean": t.feature_mean,
                "feature_std": t.feature_std,
                "target": t.target_name,
            })
        }
    }
}

/// The model as .safetensors bytes (module comment).
pub fn to_bytes(m: &FitModel) -> Result<Vec<u8>> {
    let mut metadata = BTreeMap::from([
        crate::io::modelkind::FIT.entry(),
        ("textnet".to_string(), crate::VERSION.to_string()),
        ("spec".to_string(), spec::text(&m.net.layers)),
        ("loss".to_string(), m.loss.name().to_string()),
        ("input".to_string(), input_json(&m.input).to_string()),
    ]);
    match &m.target {
        TargetInfo::Classes { names } => metadata.insert("class_names".into(), json!(names).to_string()),
        TargetInfo::Value { name, mean, std } => {
            metadata.insert("target".into(), json!({"name": name, "mean": mean, "std": std}).to_string())
        }
    };
    let tensors = m.net.tensors();
    let views: Vec<(&str, &[f32], Vec<usize>)> =
        tensors.iter().map(|(name, dims, range)| (name.as_str(), &m.params[range.clone()], dims.clone())).collect();
    crate::io::tensorfile::to_bytes(&views, metadata)
}

/// Writes the model to `path` (atomically).
pub fn save(m: &FitModel, path: &Path) -> Result<()> {
    crate::io::fsutil::write_atomic(path, &to_bytes(m)?)
}

/// Reads a fit model file.
pub fn load(path: &Path) -> Result<FitModel> {
    let bytes = crate::io::fsutil::read_input(path, "model file")?;
    from_bytes(&bytes).with_context(|| format!("model file {}", path.display()))
}

fn entry<'a>(meta: &'a HashMap<String, String>, key: &str) -> Result<&'a str> {
    meta.get(key).map(String::as_str).ok_or_else(|| anyhow!("metadata entry {key:?} is missing"))
}

fn parse_json<T: serde::de::DeserializeOwned>(value: &Value, what: &str) -> Result<T> {
    serde_json::from_value(value.clone()).map_err(|e| anyhow!("{what} is not what a fit model holds: {e}"))
}

fn shape_of(input: &Value) -> Result<Shape> {
    let dims: Vec<usize> = parse_json(&input["shape"], "the input's shape")?;
    match dims[..] {
        [n] if n > 0 => Ok(Shape::Flat(n)),
        [channels, height, width] if channels * height * width > 0 => Ok(Shape::Image { channels, height, width }),
        _ => bail!("the input's shape {dims:?} is neither [features] nor [channels, height, width]"),
    }
}

fn input_of(value: &Value) -> Result<InputSchema> {
    match value["kind"].as_str() {
        Some("images") => Ok(InputSchema::Images {
            dataset: parse_json(&value["dataset"], "the input's dataset")?,
            shape: shape_of(value)?,
            scaling: parse_json(&value["scaling"], "the input's scaling")?,
        }),
        Some("array") => Ok(InputSchema::Array { shape: shape_of(value)? }),
        Some("table") => {
            let s = &value["schema"];
            let spec = |v: &Value| -> Result<ColumnSpec> {
                ColumnSpec::parse(v.as_str().ok_or_else(|| anyhow!("a column of the schema is not a string"))?)
            };
            let list = |key: &str| -> Result<Vec<ColumnSpec>> {
                s[key].as_array().ok_or_else(|| anyhow!("schema entry {key:?} is missing"))?.iter().map(spec).collect()
            };
            let date = list("date")?;
            let date_features = s["date_features"]
                .as_array()
                .and_then(|names| names.iter().map(|n| n.as_str().and_then(DateFeatures::from_name)).collect())
                .filter(|f: &Vec<DateFeatures>| f.len() == date.len())
                .ok_or_else(|| anyhow!("schema entry \"date_features\" does not name each date column's features"))?;
            let delimiter = match s["delimiter"].as_str() {
                Some("\t") => b'\t',
                Some(",") => b',',
                _ => bail!("schema entry \"delimiter\" must be a tab or a comma"),
            };
            let schema = Schema {
                target: spec(&s["target"])?,
                numeric: list("numeric")?,
                categorical: list("categorical")?,
                date,
                date_features: Some(date_features),
                column_names: parse_json(&s["column_names"], "the schema's column names")?,
            };
            let t = TableSchema {
                schema,
                delimiter,
                header: s["header"].as_bool().unwrap_or(false),
                width: parse_json(&s["columns"], "the schema's column count")?,
                feature_names: parse_json(&value["features"], "the feature names")?,
                vocabularies: parse_json(&value["vocabularies"], "the vocabularies")?,
                feature_mean: parse_json(&value["feature_mean"], "the feature means")?,
                feature_std: parse_json(&value["feature_std"], "the feature deviations")?,
                target_name: parse_json(&value["target"], "the target's name")?,
            };
            let n = t.feature_names.len();
            crate::datasets::features::check_statistics_count(&t.feature_mean, &t.feature_std, n)?;
            if !t.feature_std.iter().all(|s| s.is_finite() && *s > 0.0) || !t.feature_mean.iter().all(|m| m.is_finite())
            {
                bail!("the feature statistics are not finite positive scales");
            }
            if t.vocabularies.len() != t.schema.categorical.len() {
                bail!(
                    "the schema has {} categorical columns but {} vocabularies",
                    t.schema.categorical.len(),
                    t.vocabularies.len()
                );
            }
            Ok(InputSchema::Table(t))
        }
        _ => bail!("metadata entry \"input\" names no input kind (images, table or array)"),
    }
}

/// The network's input shape for an input schema.
pub fn input_shape(input: &InputSchema) -> Shape {
    match input {
        InputSchema::Images { shape, .. } | InputSchema::Array { shape } => *shape,
        InputSchema::Table(t) => Shape::Flat(t.feature_names.len()),
    }
}

/// Checks that the file holds exactly the tensors `expected` (`Network::tensors`), each of the shape the
/// spec implies, before anything of the spec's sizes is allocated: a spec that lies about its widths is
/// refused by the sizes of the tensors the file really holds.
fn check_tensors(
    tensors: &safetensors::SafeTensors,
    expected: &[(String, Vec<usize>, std::ops::Range<usize>)],
    net: &Network,
) -> Result<()> {
    let spec = || crate::harness::console::abridged(&spec::text(&net.layers));
    for (name, dims, _) in expected {
        let t = tensors
            .tensor(name)
            .map_err(|_| anyhow!("tensor {name} is missing: the spec {:?} has it ({dims:?})", spec()))?;
        if t.shape() != dims.as_slice() {
            bail!("tensor {name} is {:?} but the spec {:?} implies {dims:?}", t.shape(), spec());
        }
    }
    if let Some(extra) = tensors.names().into_iter().find(|n| !expected.iter().any(|(e, _, _)| e == *n)) {
        bail!("tensor {extra} is not one of the spec's {:?}", spec());
    }
    Ok(())
}

/// Parses .safetensors bytes as a fit model; errors when they hold another kind of file, or tensors that
/// do not match the spec.
pub fn from_bytes(bytes: &[u8]) -> Result<FitModel> {
    let (_, header) =
        safetensors::SafeTensors::read_metadata(bytes).map_err(|e| anyhow!("not a safetensors file ({e})"))?;
    let meta = header.metadata().clone().unwrap_or_default();
    crate::io::modelkind::FIT.check(Some(&meta), "textnet fit model file")?;
    let spec = spec::parse(entry(&meta, "spec")?).context("metadata entry \"spec\"")?;
    let loss = match entry(&meta, "loss")? {
        "ce" => Loss::Ce,
        "mse" => Loss::Mse,
        other => bail!("metadata entry \"loss\" is {other:?}, neither ce nor mse"),
    };
    let input_value: Value =
        serde_json::from_str(entry(&meta, "input")?).map_err(|e| anyhow!("metadata entry \"input\": {e}"))?;
    let input = input_of(&input_value)?;
    let net = Network::new(&spec, input_shape(&input)).context("the spec does not fit the input it records")?;
    let target = match loss {
        Loss::Ce => {
            let names: Vec<String> = serde_json::from_str(entry(&meta, "class_names")?)
                .map_err(|e| anyhow!("metadata entry \"class_names\": {e}"))?;
            if names.len() != net.outputs() {
                bail!("the file names {} classes but its network gives {} outputs", names.len(), net.outputs());
            }
            TargetInfo::Classes { names }
        }
        Loss::Mse => {
            let t: Value =
                serde_json::from_str(entry(&meta, "target")?).map_err(|e| anyhow!("metadata entry \"target\": {e}"))?;
            let (mean, std) = (t["mean"].as_f64().unwrap_or(f64::NAN) as f32, t["std"].as_f64().unwrap_or(0.0) as f32);
            if !(mean.is_finite() && std.is_finite() && std > 0.0) {
                bail!("metadata entry \"target\" has no finite mean and positive std");
            }
            TargetInfo::Value { name: parse_json(&t["name"], "the target's name")?, mean, std }
        }
    };
    let tensors = safetensors::SafeTensors::deserialize(bytes).map_err(|e| anyhow!("invalid safetensors file: {e}"))?;
    let expected = net.tensors();
    check_tensors(&tensors, &expected, &net)?;
    // Every size is now one the file's own tensors have, so the parameters fit in memory as the file did.
    let mut params =
        crate::io::resources::try_vec(net.param_count, 0f32, "the model's parameters", "free memory for it")?;
    for (name, dims, range) in &expected {
        params[range.clone()].copy_from_slice(&crate::io::tensorfile::read_f32(&tensors, name, dims)?);
    }
    if !params.iter().all(|p| p.is_finite()) {
        bail!("the parameters contain NaN or infinite values");
    }
    Ok(FitModel { net, params, loss, input, target })
}

impl FitModel {
    /// "classes" or "value", to tell a model of another target apart.
    pub fn target_kind(&self) -> &'static str {
        match self.target {
            TargetInfo::Classes { .. } => "classes",
            TargetInfo::Value { .. } => "value",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_of_arrays_reads_back() {
        for shape in [Shape::Flat(5), Shape::Image { channels: 1, height: 4, width: 4 }] {
            let spec = spec::parse("Flatten, Linear(3), ReLU, Linear(2)").unwrap();
            let net = Network::new(&spec, shape).unwrap();
            let params = net.init(crate::nn::stack::model::Init::Pytorch, 3);
            let model = FitModel {
                net,
                params,
                loss: Loss::Ce,
                input: InputSchema::Array { shape },
                target: TargetInfo::Classes { names: vec!["no".into(), "yes".into()] },
            };
            let read = from_bytes(&to_bytes(&model).unwrap()).unwrap();
            assert_eq!(read, model);
            assert_eq!(input_shape(&read.input), shape);
        }
    }

    #[test]
    fn the_spec_text_reads_back_as_the_same_layers() {
        let text = "Conv2d(1, 4, 3, padding=1), ReLU, MaxPool2d(2), Flatten, Dropout(0.25), Linear(32, bias=false), \
                    GELU, Linear(10)";
        let net = Network::new(&spec::parse(text).unwrap(), Shape::Image { channels: 1, height: 8, width: 8 }).unwrap();
        let written = spec::text(&net.layers);
        assert_eq!(
            written,
            "Conv2d(1, 4, 3, stride=1, padding=1), ReLU, MaxPool2d(2), Flatten, Dropout(0.25), \
             Linear(64, 32, bias=false), GELU, Linear(32, 10)"
        );
        assert_eq!(spec::parse(&written).unwrap().layers, net.layers);
    }
}
