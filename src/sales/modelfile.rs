//! The sales model file: `.safetensors` with the tensors `w1` `[H,n]`, `b1` `[H]`, `w2` `[1,H]`, `b2` `[1]`
//! (PyTorch's `nn.Linear` layouts) and string metadata: `kind` (`sales`), `hidden`, and as JSON what it
//! takes to read new rows the same way and to undo the standardisation: the schema (column specs, column
//! names, delimiter, header, the number of columns, each date column's features; a file without the
//! last two reads the day of year alone and any number of columns), the feature and target names, each categorical column's vocabulary (one-hot
//! order), and the training split's feature and target mean and std.

use super::dates::DateFeatures;
use super::model::{SalesParams, SalesShape};
use super::table::{ColumnSpec, Schema};
use crate::datasets::features::{Stats, check_statistics_count};
use anyhow::{Context, Result, anyhow, bail};
use safetensors::SafeTensors;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;

/// The model file's `format` tag.
pub const KIND: &str = crate::io::modelkind::SALES.tag;

/// A trained model and everything needed to use it on new rows.
#[derive(Clone, Debug, PartialEq)]
pub struct SalesModel {
    /// The trained parameters.
    pub params: SalesParams,
    /// The training split's means and deviations, to standardise new rows and undo it on predictions.
    pub stats: Stats,
    /// Which columns are the target and the features.
    pub schema: Schema,
    /// The training table's field separator, `b'\t'` or `b','`.
    pub delimiter: u8,
    /// Whether the training table had a header row.
    pub header: bool,
    /// The number of columns of the training table's rows.
    pub width: Option<usize>,
    /// The name of each feature (`Dataset::feature_names`).
    pub feature_names: Vec<String>,
    /// The target column's name.
    pub target_name: String,
    /// Each categorical column's vocabulary, for its one-hot features.
    pub vocabularies: Vec<Vec<String>>,
}

fn spec_text(spec: &ColumnSpec) -> String {
    match spec {
        ColumnSpec::Name(name) => name.clone(),
        ColumnSpec::Number(n) => n.to_string(),
    }
}

fn specs(specs: &[ColumnSpec]) -> Vec<String> {
    specs.iter().map(spec_text).collect()
}

/// The model as .safetensors bytes (module comment).
pub fn to_bytes(m: &SalesModel) -> Result<Vec<u8>> {
    let s = &m.schema;
    let metadata = BTreeMap::from([
        crate::io::modelkind::SALES.entry(),
        ("hidden".to_string(), m.params.shape.hidden.to_string()),
        ("textnet".to_string(), crate::VERSION.to_string()),
        (
            "schema".to_string(),
            json!({
                "target": spec_text(&s.target), "numeric": specs(&s.numeric), "categorical": specs(&s.categorical),
                "date": specs(&s.date), "column_names": s.column_names,
                "delimiter": (m.delimiter as char).to_string(), "header": m.header, "columns": m.width,
                "date_features": s.date_features.as_ref().map(|f| f.iter().map(|f| f.name()).collect::<Vec<_>>()),
            })
            .to_string(),
        ),
        ("features".to_string(), json!(m.feature_names).to_string()),
        ("target".to_string(), m.target_name.clone()),
        ("vocabularies".to_string(), json!(m.vocabularies).to_string()),
        (
            "stats".to_string(),
            json!({
                "feature_mean": m.stats.feature_mean, "feature_std": m.stats.feature_std,
                "target_mean": m.stats.target_mean, "target_std": m.stats.target_std,
            })
            .to_string(),
        ),
    ]);
    let p = m.params.parts();
    let (h, n) = (m.params.shape.hidden, m.params.shape.inputs);
    crate::io::tensorfile::to_bytes(
        &[("w1", p.w1, vec![h, n]), ("b1", p.b1, vec![h]), ("w2", p.w2, vec![1, h]), ("b2", p.b2, vec![1])],
        metadata,
    )
}

/// Writes the model to `path` (atomically).
pub fn save(m: &SalesModel, path: &Path) -> Result<()> {
    crate::io::fsutil::write_atomic(path, &to_bytes(m)?)
}

/// Reads a sales model file.
pub fn load(path: &Path) -> Result<SalesModel> {
    let bytes = crate::io::fsutil::read_input(path, "model file")?;
    from_bytes(&bytes).with_context(|| format!("model file {}", path.display()))
}

fn parse_json<T: serde::de::DeserializeOwned>(
    meta: &std::collections::HashMap<String, String>,
    key: &str,
) -> Result<T> {
    let text = meta.get(key).ok_or_else(|| anyhow!("metadata entry {key:?} is missing"))?;
    serde_json::from_str(text).map_err(|e| anyhow!("metadata entry {key:?} is not what a sales model holds: {e}"))
}

/// Parses .safetensors bytes as a sales model; errors when they hold another kind of model.
pub fn from_bytes(bytes: &[u8]) -> Result<SalesModel> {
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| anyhow!("not a safetensors file ({e})"))?;
    let meta = header.metadata().clone().unwrap_or_default();
    crate::io::modelkind::SALES.check(Some(&meta), "textnet sales model file")?;
    let hidden: usize = meta
        .get("hidden")
        .and_then(|h| h.parse().ok())
        .filter(|&h| h >= 1)
        .ok_or_else(|| anyhow!("metadata entry \"hidden\" is missing or not a positive number"))?;
    let feature_names: Vec<String> = parse_json(&meta, "features")?;
    let vocabularies: Vec<Vec<String>> = parse_json(&meta, "vocabularies")?;
    let target_name = meta.get("target").cloned().ok_or_else(|| anyhow!("metadata entry \"target\" is missing"))?;
    let schema: Value = parse_json(&meta, "schema")?;
    let stats: Value = parse_json(&meta, "stats")?;
    let spec = |v: &Value| -> Result<ColumnSpec> {
        ColumnSpec::parse(v.as_str().ok_or_else(|| anyhow!("a column spec is not a string"))?)
    };
    let spec_list = |key: &str| -> Result<Vec<ColumnSpec>> {
        schema[key].as_array().ok_or_else(|| anyhow!("schema entry {key:?} is missing"))?.iter().map(spec).collect()
    };
    let floats = |key: &str| -> Result<Vec<f32>> {
        serde_json::from_value(stats[key].clone()).map_err(|_| anyhow!("stats entry {key:?} is missing or not numbers"))
    };
    let float = |key: &str| -> Result<f32> {
        stats[key].as_f64().map(|v| v as f32).ok_or_else(|| anyhow!("stats entry {key:?} is missing"))
    };
    let delimiter = match schema["delimiter"].as_str() {
        Some("\t") => b'\t',
        Some(",") => b',',
        _ => bail!("schema entry \"delimiter\" must be a tab or a comma"),
    };
    let stats = Stats {
        feature_mean: floats("feature_mean")?,
        feature_std: floats("feature_std")?,
        target_mean: float("target_mean")?,
        target_std: float("target_std")?,
    };
    let n = feature_names.len();
    check_statistics_count(&stats.feature_mean, &stats.feature_std, n)?;
    let means_finite = stats.feature_mean.iter().chain([&stats.target_mean]).all(|v| v.is_finite());
    let scales_positive = stats.feature_std.iter().chain([&stats.target_std]).all(|&s| s.is_finite() && s > 0.0);
    if !(means_finite && scales_positive) {
        bail!(
            "the statistics are not finite positive scales (a mean or standard deviation is NaN, infinite or not above 0)"
        );
    }
    let date_count = spec_list("date")?.len();
    let date_features: Vec<DateFeatures> = match schema["date_features"].as_array() {
        None => vec![DateFeatures::DayOfYear; date_count],
        Some(names) => names
            .iter()
            .map(|n| n.as_str().and_then(DateFeatures::from_name))
            .collect::<Option<Vec<_>>>()
            .filter(|f| f.len() == date_count)
            .ok_or_else(|| anyhow!("schema entry \"date_features\" does not name the features of each date column"))?,
    };
    let schema_parsed = Schema {
        target: spec(&schema["target"])?,
        numeric: spec_list("numeric")?,
        categorical: spec_list("categorical")?,
        date: spec_list("date")?,
        date_features: Some(date_features.clone()),
        column_names: serde_json::from_value(schema["column_names"].clone()).unwrap_or(None),
    };
    if vocabularies.len() != schema_parsed.categorical.len() {
        bail!(
            "the schema has {} categorical columns but the file lists {} vocabularies",
            schema_parsed.categorical.len(),
            vocabularies.len()
        );
    }
    let inputs = schema_parsed.numeric.len()
        + vocabularies.iter().map(Vec::len).sum::<usize>()
        + date_features.iter().map(|f| f.count()).sum::<usize>();
    if inputs != n {
        bail!("the schema and vocabularies make {inputs} features but the model names {n}");
    }
    let tensors = SafeTensors::deserialize(bytes).map_err(|e| anyhow!("invalid safetensors file: {e}"))?;
    let read = |name: &str, dims: &[usize]| crate::io::tensorfile::read_f32(&tensors, name, dims);
    let shape = SalesShape { inputs: n, hidden };
    let mut flat = read("w1", &[hidden, n])?;
    flat.extend(read("b1", &[hidden])?);
    flat.extend(read("w2", &[1, hidden])?);
    flat.extend(read("b2", &[1])?);
    let params = SalesParams { shape, flat };
    if !params.all_finite() {
        bail!("the parameters contain NaN or infinite values");
    }
    Ok(SalesModel {
        params,
        stats,
        schema: schema_parsed,
        delimiter,
        header: schema["header"].as_bool().unwrap_or(false),
        width: schema["columns"].as_u64().map(|w| w as usize),
        feature_names,
        target_name,
        vocabularies,
    })
}
