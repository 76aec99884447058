//! How a `textnet sales` run ends beyond what every command says: its `--json` report.

use super::args::SalesArgs;
use super::cli::Setup;
use super::model::Evaluation;
use crate::harness::args::OptimArgs;
use crate::harness::checkpoint::Keeper;
use crate::harness::report::{self, EpochRow, Report, Status};
use anyhow::Result;
use serde_json::json;

impl SalesArgs {
    /// The `--json` report of a run that ended with `status`, its epochs `history`, the evaluation of the
    /// epoch written (`kept_eval`, of epoch `kept_epoch`); `diverged` is the caller's to fill in.
    pub(super) fn report(
        &self,
        setup: &Setup,
        status: Status,
        history: Vec<EpochRow>,
        keeper: Option<&Keeper>,
        kept_eval: Option<Evaluation>,
        kept_epoch: Option<usize>,
    ) -> Result<Report> {
        let args = self;
        let data = &setup.data;
        let final_metrics = kept_eval.map(|eval| {
            let mut figures = serde_json::Map::new();
            figures.insert("test_mae".into(), json!(eval.mae));
            figures.insert("test_mse".into(), json!(eval.mse));
            figures.insert("baseline_mae".into(), json!(setup.baseline_mae));
            if let Some((_, val_mae)) = keeper.and_then(|k| k.kept) {
                figures.insert("val_mae".into(), json!(val_mae));
            }
            figures
        });
        let o = args.optim.config()?;
        Ok(Report {
            textnet: crate::VERSION,
            command: "sales",
            status,
            config: sales_config(
                json!({
                    "keep": args.keep.name(),
                    "val_split": args.val_split,
                    "resume": args.resume.as_ref().map(|p| p.display().to_string()),
                    "hidden": setup.shape.hidden,
                    "epochs": args.epochs,
                    "batch": args.batch,
                    "split": args.split,
                    "split_order": args.split_order.name(),
                }),
                &[&args.run, &OptimArgs::of(&o), &args.schedule],
            ),
            device: report::DeviceFields::of(&setup.backend),
            data: json!({
                "file": data.source,
                "train_samples": data.train.rows,
                "val_samples": data.val.rows,
                "test_samples": data.test.rows,
                "skipped_rows": data.skipped,
                "features": data.feature_names,
                "target": data.target_name,
                "warnings": setup.warnings,
            }),
            parameters: setup.shape.param_count(),
            epochs: history,
            final_metrics,
            model: args.run.out.display().to_string(),
            kept_epoch,
            baseline_val_loss: keeper.and_then(|k| k.baseline),
            diverged: None,
        })
    }
}

/// The report's `config`, which for `sales` has never listed `overwrite` or `momentum` (its shape is
/// pinned by `tests/it/cli_report.rs`).
fn sales_config(own: serde_json::Value, groups: &[&dyn report::FlagGroup]) -> serde_json::Value {
    let mut config = report::with_flags(own, groups);
    if let Some(entries) = config.as_object_mut() {
        entries.remove("overwrite");
        entries.remove("momentum");
    }
    config
}
