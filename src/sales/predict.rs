//! `textnet sales --model M --predict NEW`: a sales model's predictions for new rows.

use super::args::SalesArgs;
use super::data::feature_memory;
use super::model::{self, SalesShape};
use super::modelfile;
use super::table::{HeaderMode, LoadOptions, Table};
use crate::datasets::features::Split;
use crate::io::fsutil;
use crate::io::resources::available_memory;
use anyhow::{Result, anyhow, bail};
use std::path::Path;

/// `--model M --predict NEW`: one line per good row of NEW, its file line and the prediction in the
/// target's units; the MAE over the rows that give the target.
pub(super) fn predict(args: &SalesArgs, model_path: &Path, new: &Path) -> Result<()> {
    let _lock = match &args.predictions {
        Some(path) => Some(fsutil::check_data_output("--predictions", path, &[("model", model_path), ("table", new)])?),
        None => None,
    };
    let m = modelfile::load(model_path)?;
    let mut options = LoadOptions::new(m.schema.clone());
    options.delimiter = Some(m.delimiter);
    options.header = if m.header { HeaderMode::Present } else { HeaderMode::Absent };
    options.skip_bad_rows = args.skip_bad_rows;
    options.width = m.width;
    options.target_optional = true;
    let table = Table::read(new, &options)?;
    if table.rows.is_empty() {
        bail!("{}: no usable rows to predict", new.display());
    }
    // The feature rows and their standardised copy.
    let SalesShape { inputs, hidden } = m.params.shape;
    feature_memory(table.rows.len(), inputs, 2, hidden, "the rows of --predict (predict them in parts)")
        .check(available_memory())
        .map_err(|e| anyhow!("{}: {e}", new.display()))?;
    let split = Split::of_rows(&table, &table.rows, &m.vocabularies);
    if split.features != m.params.shape.inputs {
        bail!("{} gives {} features but the model takes {}", new.display(), split.features, m.params.shape.inputs);
    }
    let x = m.stats.normalize(&split);
    let mut out = String::from("line\tprediction\n");
    let (mut with_target, mut error_sum) = (0usize, 0f64);
    let predictions = model::predict(&m.params, &x.x)?;
    for (i, &prediction) in predictions.iter().enumerate() {
        let y = m.stats.target_value(prediction);
        out += &format!("{}\t{y}\n", split.lines[i]);
        if split.y[i].is_finite() {
            with_target += 1;
            error_sum += (y as f64 - split.y[i] as f64).abs();
        }
    }
    crate::harness::console::predictions(&out, args.predictions.as_deref(), table.skipped, args.run.quiet)?;
    if with_target > 0 && !args.run.quiet {
        let mae = error_sum / with_target as f64;
        crate::harness::console::err(&format!("MAE over {with_target} rows with a {}: {mae:.4}", m.target_name));
    }
    Ok(())
}
