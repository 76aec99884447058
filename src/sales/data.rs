//! The table a `textnet sales` run reads: its schema (the --resume model's, inferred from --target, or
//! sales.tsv's), the features and splits, and whether they fit in host memory.

use super::args::SalesArgs;
use super::model::SalesShape;
use super::modelfile::SalesModel;
use super::table::{HeaderMode, LoadOptions, Schema, Table};
use crate::datasets::features::{Dataset, SplitOrder};
use crate::harness::report::Display;
use crate::io::fsutil;
use crate::io::resources::{MemoryNeed, available_memory};
use anyhow::{Result, anyhow, bail};
use std::path::Path;

/// Reads the table `file`: its schema that of the --resume model, inferred from --target, or the default
/// sales.tsv one. Returns the table, how it was read and the inferred schema's warnings (printed).
pub(super) fn read_table(
    args: &SalesArgs,
    file: &Path,
    resumed: Option<&SalesModel>,
    display: &Display,
) -> Result<(Table, LoadOptions, Vec<String>)> {
    let bytes = fsutil::read_input(file, "table")?;
    let source = fsutil::shown(file);
    let inferred = match resumed {
        Some(_) => None,
        None => args.columns.infer(&source, &bytes, &|line| display.line(line))?,
    };
    let warnings = inferred.as_ref().map_or_else(Vec::new, |i| i.warnings(&source));
    warnings.iter().for_each(|w| display.warning(w));
    let mut options = LoadOptions::new(match (resumed, &inferred) {
        (Some(m), _) => m.schema.clone(),
        (None, Some(inferred)) => inferred.schema.clone(),
        (None, None) => Schema::sales_tsv(),
    });
    options.skip_bad_rows = args.skip_bad_rows;
    options.train_fraction = args.split;
    if let Some(m) = resumed {
        options.delimiter = Some(m.delimiter);
        options.header = if m.header { HeaderMode::Present } else { HeaderMode::Absent };
        options.width = m.width;
    }
    let table = Table::parse(&source, &bytes, &options).map_err(|e| match (resumed, &inferred) {
        (Some(_), _) => anyhow!(
            "--resume {}: {source} does not match the table the model was trained on: {e:#}",
            args.resume.as_deref().unwrap_or(Path::new("")).display()
        ),
        (None, Some(inferred)) => inferred.explain(e),
        (None, None) => anyhow!(
            "{e:#} (without --target the 10-column sales.tsv schema is assumed; for another table give --target, \
             and its other columns' roles are inferred)"
        ),
    })?;
    check_feature_memory(&table, resumed.map_or(args.hidden, |m| m.params.shape.hidden))?;
    Ok((table, options, warnings))
}

/// The features and splits of `table` (with the --resume model's vocabularies, which must give its
/// features), the validation rows held out; says where the split looks uneven and how many rows were bad.
pub(super) fn dataset(
    args: &SalesArgs,
    table: &Table,
    resumed: Option<&SalesModel>,
    display: &Display,
) -> Result<Dataset> {
    let vocabularies = resumed.map(|m| m.vocabularies.as_slice());
    let mut data = Dataset::from_table_with(table, args.split, args.split_order, args.run.seed, vocabularies)?;
    if let Some(m) = resumed
        && (m.feature_names != data.feature_names || m.target_name != data.target_name)
    {
        bail!(
            "--resume {}: {} does not match the model: it gives the features {:?} and target {:?}, the model \
             takes {:?} and {:?}",
            args.resume.as_deref().unwrap_or(Path::new("")).display(),
            table.source,
            data.feature_names,
            data.target_name,
            m.feature_names,
            m.target_name
        );
    }
    if let Some(fraction) = args.val_split {
        data.hold_out(fraction)?;
    }
    if let Some(warning) = data.split_shift() {
        let hint = match args.split_order {
            SplitOrder::File => " (the file may be sorted: --split-order shuffled mixes the rows first)",
            SplitOrder::Shuffled => "",
        };
        display.line(&format!("{warning}{hint}"));
    }
    if data.skipped > 0 {
        display.line(&format!(
            "skipped {} bad row{} (the first: {})",
            data.skipped,
            if data.skipped == 1 { "" } else { "s" },
            data.first_skipped.as_deref().unwrap_or("?")
        ));
    }
    Ok(data)
}

/// What a run on `rows` rows of `features` features (`copies` f32 copies of them at once) and a model
/// of `hidden` units needs in memory, counted before it is allocated (an allocation that fails aborts).
pub(super) fn feature_memory(
    rows: usize,
    features: usize,
    copies: u64,
    hidden: usize,
    fewer_rows: &'static str,
) -> MemoryNeed {
    let parameters = SalesShape { inputs: features, hidden }.param_count() as u64;
    let values = (rows as u64).saturating_mul(features as u64);
    MemoryNeed {
        parts: vec![
            ("the one-hot feature rows", values.saturating_mul(4 * copies), fewer_rows),
            // Parameters, gradients and the optimizer's two moments.
            ("the model", parameters.saturating_mul(16), "--hidden"),
        ],
    }
}

/// Refuses a training table whose one-hot feature rows would not fit in memory, naming the categorical
/// column with the most levels: an identifier given as one has a level per row.
fn check_feature_memory(table: &Table, hidden: usize) -> Result<()> {
    let levels: usize = table.levels.iter().map(Vec::len).sum();
    let dates: usize = table.date_features.iter().map(|f| f.count()).sum();
    let features = table.columns.numeric.len() + levels + dates;
    // Copies of the rows at once: the split's, the trainer's standardised (on a GPU: staged) one, and the
    // test rows' for a model at --out.
    let need = feature_memory(table.rows.len(), features, 3, hidden, "--categorical (fewer or narrower columns)");
    need.check(available_memory()).map_err(|e| {
        let widest = table.columns.categorical.iter().zip(&table.levels).max_by_key(|(_, levels)| levels.len());
        let culprit = widest.map_or(String::new(), |(c, levels)| {
            format!(
                "; the categorical column {:?} alone has {} levels (a column with a level per row, such as an \
                 identifier, does not belong in --categorical)",
                c.name,
                levels.len()
            )
        });
        anyhow!("{}: {} rows × {features} features: {e}{culprit}", table.source, table.rows.len())
    })
}
