//! `textnet fit --model M --predict FILE`: a table model's predictions for the rows of a table.

use super::args::FitArgs;
use super::data::{InputSchema, TargetInfo};
use super::modelfile;
use crate::datasets::features::Split;
use crate::datasets::table::{HeaderMode, LoadOptions, Table};
use crate::io::fsutil;
use crate::nn::stack::model::Loss;
use crate::ops::cpu::argmax;
use anyhow::{Result, bail};
use std::path::Path;

/// `--model M --predict FILE`: one line per good row of FILE, its file line and the prediction (the class
/// name, or the value in the target's units); the accuracy or MAE over the rows that give the target.
pub(super) fn predict(args: &FitArgs, model_path: &Path, new: &Path) -> Result<()> {
    let _lock = match &args.predictions {
        Some(path) => Some(fsutil::check_data_output("--predictions", path, &[("model", model_path), ("table", new)])?),
        None => None,
    };
    let m = modelfile::load(model_path)?;
    let t = match &m.input {
        InputSchema::Table(t) => t,
        InputSchema::Array { .. } => bail!(
            "{} is a model of arrays; predict with it in Python: textnet.load({:?}).predict(X)",
            model_path.display(),
            model_path.display().to_string()
        ),
        InputSchema::Images { .. } => bail!(
            "{} is a model of images; classify images with textnet classify --model {} IMAGE…",
            model_path.display(),
            model_path.display()
        ),
    };
    let mut options = LoadOptions::new(t.schema.clone());
    options.delimiter = Some(t.delimiter);
    options.header = if t.header { HeaderMode::Present } else { HeaderMode::Absent };
    options.skip_bad_rows = args.tabular.skip_bad_rows;
    options.width = Some(t.width);
    options.target_optional = true;
    options.target_labels = m.loss == Loss::Ce;
    let table = Table::read(new, &options)?;
    let split = Split::of_rows(&table, &table.rows, &t.vocabularies);
    if split.features != m.net.inputs() {
        bail!("{} gives {} features but the model takes {}", new.display(), split.features, m.net.inputs());
    }
    let mut x = split.x.clone();
    for row in x.chunks_mut(split.features.max(1)) {
        for ((v, mean), std) in row.iter_mut().zip(&t.feature_mean).zip(&t.feature_std) {
            *v = (*v - mean) / std;
        }
    }
    let trace = crate::nn::stack::model::forward(&m.net, &m.params, &x, split.rows, None);
    let out = trace.values.last().expect("an output");
    let k = m.net.outputs();
    let mut text = String::from("line\tprediction\n");
    let (mut with_target, mut score) = (0usize, 0f64);
    for (i, o) in out.chunks(k).enumerate() {
        match &m.target {
            TargetInfo::Classes { names } => {
                let class = argmax(o);
                text += &format!("{}\t{}\n", split.lines[i], names[class]);
                if split.y[i].is_finite() {
                    let label = &table.target_levels[split.y[i] as usize];
                    with_target += 1;
                    score += f64::from(u8::from(*label == names[class]));
                }
            }
            TargetInfo::Value { mean, std, .. } => {
                let y = o[0] * std + mean;
                text += &format!("{}\t{y}\n", split.lines[i]);
                if split.y[i].is_finite() {
                    with_target += 1;
                    score += (y as f64 - split.y[i] as f64).abs();
                }
            }
        }
    }
    crate::harness::console::predictions(&text, args.predictions.as_deref(), table.skipped, args.run.quiet)?;
    if with_target > 0 && !args.run.quiet {
        let figure = match &m.target {
            TargetInfo::Classes { .. } => format!("accuracy {:.2}%", 100.0 * score / with_target as f64),
            TargetInfo::Value { .. } => format!("MAE {:.4}", score / with_target as f64),
        };
        crate::harness::console::err(&format!("{figure} over {with_target} rows with a {}", t.target_name));
    }
    Ok(())
}
