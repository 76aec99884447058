//! How a `textnet fit` run ends beyond what every command says: its `--json` report.

use super::args::FitArgs;
use super::cli::Setup;
use super::data::TargetInfo;
use crate::harness::args::OptimArgs;
use crate::harness::checkpoint::Keeper;
use crate::harness::report::{self, EpochRow, Report, Status};
use crate::nn::stack::Samples;
use crate::nn::stack::spec::{self, Shape};
use serde_json::json;

impl FitArgs {
    /// The `--json` report of a run that ended with `status`, its epochs `rows` and what `keeper` kept
    /// (`diverged` is the caller's to fill in).
    pub(super) fn report(
        &self,
        setup: &Setup,
        status: Status,
        rows: Vec<EpochRow>,
        keeper: &Keeper,
        training_s: f64,
    ) -> Report {
        let args = self;
        let data = &setup.data;
        let mut extra = serde_json::Map::new();
        if let Some(mae) = setup.baseline_mae {
            extra.insert("baseline_mae".into(), json!(mae));
        }
        extra.insert("wall_s".into(), json!({"training": training_s, "total": setup.started.elapsed().as_secs_f64()}));
        let (dataset, table) = match &args.dataset {
            Some(d) => (Some(d.name()), None),
            None => (None, args.tabular.table.as_ref().map(|p| p.display().to_string())),
        };
        let classes = match &data.target {
            TargetInfo::Classes { names } => Some(names.clone()),
            TargetInfo::Value { .. } => None,
        };
        Report {
            textnet: crate::VERSION,
            command: "fit",
            status,
            config: report::with_flags(
                json!({
                    "layers": spec::text(&setup.net.layers),
                    "dataset": dataset,
                    "table": table,
                    "target": args.tabular.target.as_ref().map(|t| t.to_string()),
                    "loss": data.loss.name(),
                    "init": report::flag_value(&args.init),
                    "patience": args.patience,
                    "epochs": args.epochs,
                    "batch": args.batch,
                    "train_limit": args.train_limit,
                    "val_split": args.val_split,
                    "split": args.tabular.table.as_ref().map(|_| args.tabular.split),
                    "keep": args.keep().name(),
                }),
                &[&args.run, &OptimArgs::of(&setup.optim), &args.schedule],
            ),
            device: report::DeviceFields::of(&setup.backend),
            data: json!({
                "source": data.source,
                "input": crate::nn::stack::model::size(data.input),
                "input_shape": match data.input {
                    Shape::Flat(n) => vec![n],
                    Shape::Image { channels, height, width } => vec![channels, height, width],
                },
                "train_samples": data.train.rows(),
                "val_samples": data.val.as_ref().map_or(0, Samples::rows),
                "test_samples": data.test.rows(),
                "skipped_rows": data.skipped,
                "class_names": classes,
                "warnings": data.warnings,
            }),
            parameters: setup.net.param_count,
            final_metrics: report::final_metrics(&rows, keeper.kept_epoch(), extra),
            epochs: rows,
            model: args.run.out.display().to_string(),
            kept_epoch: keeper.kept_epoch(),
            baseline_val_loss: keeper.baseline,
            diverged: None,
        }
    }
}
