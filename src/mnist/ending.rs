//! How a `textnet mnist` run ends beyond what every command says: its `--json` report.

use super::Evaluation;
use super::ModelKind;
use super::args::MnistArgs;
use super::cli::RunInfo;
use super::epochs::Saver;
use crate::harness::args::OptimArgs;
use crate::harness::report::{self, EpochRow, Report, Status};
use serde_json::json;

impl MnistArgs {
    /// The `--json` report of a run that ended with `status`, its epochs `rows` and the epoch `saver` kept;
    /// `(setup_s, training_s)`: how long building the trainer and the epochs took. `diverged` is the
    /// caller's to fill in.
    pub(super) fn report(
        &self,
        run: &RunInfo,
        status: Status,
        rows: Vec<EpochRow>,
        saver: &Saver,
        params_count: usize,
        (setup_s, training_s): (f64, f64),
    ) -> Report {
        let args = self;
        let confusion = saver.kept_eval.as_ref().map(Evaluation::confusion_rows);
        let mut final_extra = serde_json::Map::new();
        final_extra.insert("confusion".into(), json!(confusion));
        // Where the command's time went: when opening the device and reading the data (side by side)
        // ended, counted from the start; then building the trainer (uploads, kernel modules), and the
        // epochs with their evaluations and saves.
        final_extra.insert(
            "wall_s".into(),
            json!({"device_open": run.device_s, "data": run.data_s, "setup": setup_s, "training": training_s, "total": run.started.elapsed().as_secs_f64()}),
        );
        let config = report::with_flags(
            json!({
                "dataset": args.dataset.name(),
                "data": args.data.as_ref().map(|p| p.display().to_string()),
                "keep": args.keep.name(),
                "model": report::flag_value(&args.model),
                "hidden": (args.model == ModelKind::Mlp).then_some(run.shape.hidden),
                "activation": (args.model == ModelKind::Mlp).then(|| run.shape.activation.name()),
                "epochs": args.epochs,
                "batch": args.batch,
                "train_limit": args.train_limit,
                "val_split": args.val_split,
                "resume": args.resume.as_ref().map(|p| p.display().to_string()),
            }),
            &[&args.run, &OptimArgs::of(&run.optim), &args.schedule],
        );
        Report {
            textnet: crate::VERSION,
            command: "mnist",
            status,
            config,
            device: report::DeviceFields::of(&run.backend),
            data: json!({
                "dataset": args.dataset.name(),
                "dir": run.data_dir.display().to_string(),
                "train_samples": run.n_train,
                "val_samples": run.n_val,
                "test_samples": run.n_test,
                "class_names": args.dataset.class_names(),
            }),
            parameters: params_count,
            final_metrics: report::final_metrics(&rows, saver.keeper.kept_epoch(), final_extra),
            epochs: rows,
            model: args.run.out.display().to_string(),
            kept_epoch: saver.keeper.kept_epoch(),
            baseline_val_loss: saver.keeper.baseline,
            diverged: None,
        }
    }
}
