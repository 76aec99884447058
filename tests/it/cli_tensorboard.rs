//! `--tensorboard DIR`: every training command writes TensorBoard event files as it trains. Read back
//! through the same prost messages, each of the report's epoch rows is there as scalars at its step
//! (the transformer's optimizer step, else the epoch) under its tag, the transformer's steps each with
//! their loss, and the report's config as the HParams plugin's hyperparameters; a bad DIR is refused
//! before training, writing nothing.

use crate::common::text::{shakespeare, train_args};
use crate::common::{fails_with, report, s, stderr, textnet};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use textnet::harness::tensorboard::{self, proto};

/// The one event file in `dir`, by the name TensorBoard looks for.
fn event_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    files[0].clone()
}

/// The scalars of the events, by tag then step, and the HParams plugin's summaries, in order.
struct Read {
    scalars: BTreeMap<String, BTreeMap<i64, f32>>,
    hparams: Vec<proto::HParamsData>,
}

fn read(dir: &Path) -> Read {
    let events = tensorboard::read_events(&event_file(dir)).unwrap();
    assert_eq!(events[0].what, Some(proto::What::FileVersion("brain.Event:2".into())));
    let mut read = Read { scalars: BTreeMap::new(), hparams: Vec::new() };
    for event in &events[1..] {
        let Some(proto::What::Summary(summary)) = &event.what else { panic!("{event:?}") };
        for value in &summary.value {
            match value.simple_value {
                Some(v) => {
                    let steps = read.scalars.entry(value.tag.clone()).or_default();
                    assert!(steps.insert(event.step, v).is_none(), "{} twice at step {}", value.tag, event.step);
                }
                None => read.hparams.push(tensorboard::hparams_data(value).expect("an HParams summary")),
            }
        }
    }
    read
}

/// Every numeric figure of every row of report `r` is the scalar of its tag at the row's step; the config
/// is the hyperparameters, the tags the metrics, and the status how the run ended.
fn matches_report(command: &str, r: &Value, read: &Read) {
    let rows = r["epochs"].as_array().unwrap();
    assert!(!rows.is_empty(), "{command}");
    let mut tags = std::collections::BTreeSet::new();
    for row in rows {
        let step = row.get("step").unwrap_or(&row["epoch"]).as_i64().unwrap();
        for (key, value) in row.as_object().unwrap() {
            let Some(value) = value.as_f64().filter(|_| !["epoch", "step", "elapsed_s"].contains(&key.as_str())) else {
                continue;
            };
            let tag = tensorboard::tag(key);
            let written = read.scalars.get(&tag).and_then(|steps| steps.get(&step));
            assert_eq!(written, Some(&(value as f32)), "{command}: {tag} at step {step}");
            tags.insert(tag);
        }
    }
    for needed in ["loss/train", "lr", "samples_per_s"] {
        assert!(tags.contains(needed), "{command}: no {needed}");
    }
    let [
        proto::HParamsData::Experiment(experiment),
        proto::HParamsData::SessionStartInfo(start),
        proto::HParamsData::SessionEndInfo(end),
    ] = &read.hparams[..]
    else {
        panic!("{command}: {:?}", read.hparams)
    };
    for (key, value) in r["config"].as_object().unwrap() {
        let kind = start.hparams.get(key).and_then(|v| v.kind.clone());
        let expected = match value {
            Value::Null => None,
            Value::Bool(b) => Some(proto::Kind::BoolValue(*b)),
            Value::Number(n) => Some(proto::Kind::NumberValue(n.as_f64().unwrap())),
            Value::String(s) => Some(proto::Kind::StringValue(s.clone())),
            other => Some(proto::Kind::StringValue(other.to_string())),
        };
        assert_eq!(kind, expected, "{command}: hyperparameter {key}");
        assert_eq!(experiment.hparam_infos.iter().any(|i| &i.name == key), expected.is_some(), "{command}: {key}");
    }
    let metrics: std::collections::BTreeSet<String> =
        experiment.metric_infos.iter().map(|m| m.name.as_ref().unwrap().tag.clone()).collect();
    assert!(tags.is_subset(&metrics), "{command}: metrics {metrics:?}");
    assert_eq!(end.status, proto::Status::Success as i32, "{command}");
}

#[test]
fn every_training_command_writes_its_rows_and_settings_as_tensorboard_events() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let corpus = shakespeare();
    let table = d.join("sales.tsv");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/make-sales.py");
    let made = Command::new("python3").args([script, "--rows", "600", "--out", s(&table)]).status().unwrap();
    assert!(made.success());
    let words = |list: &[&str]| list.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    let runs: Vec<(&str, Vec<String>)> = vec![
        (
            "xor",
            words(&["xor", "--device", "cpu", "--epochs", "1000", "--log-every", "100", "--lr-schedule", "cosine"]),
        ),
        ("train", train_args(&corpus, &d.join("train.safetensors"), &["--epochs", "2"])),
        (
            "mnist",
            words(&["mnist", "--dataset", "fashion", "--device", "cpu", "--train-limit", "500", "--hidden", "8"])
                .into_iter()
                .chain(words(&["--epochs", "2", "--val-split", "0.2"]))
                .collect(),
        ),
        (
            "sales",
            words(&["sales", s(&table), "--device", "cpu", "--epochs", "10", "--val-split", "0.2", "--keep", "best"]),
        ),
        (
            "transformer",
            words(&["transformer", s(&corpus), "--device", "cpu", "--embed", "16", "--heads", "2", "--block", "8"])
                .into_iter()
                .chain(words(&["--batch", "4", "--steps", "20", "--eval-every", "10"]))
                .collect(),
        ),
        (
            "fit",
            words(&["fit", "--layers", "Linear(16), ReLU, Linear(10)", "--dataset", "fashion", "--train-limit", "500"])
                .into_iter()
                .chain(words(&["--epochs", "2", "--device", "cpu"]))
                .collect(),
        ),
    ];
    for (command, mut args) in runs {
        let board = d.join("runs").join(command);
        if !args.iter().any(|a| a == "--out") {
            args.extend(["--out".into(), s(&d.join(format!("{command}.safetensors"))).to_string()]);
        }
        args.extend(["--json", "--quiet", "--tensorboard", s(&board)].map(String::from));
        let o = textnet(&args);
        assert!(o.status.success(), "{command}: {}", stderr(&o));
        let r = report(&o);
        assert_eq!(r["config"]["tensorboard"].as_str(), Some(s(&board)), "{command}");
        let read = read(&board);
        matches_report(command, &r, &read);
        if command == "transformer" {
            // Each optimizer step's loss, and each evaluation's training loss their mean.
            let steps = &read.scalars["loss/train_step"];
            assert_eq!(steps.keys().copied().collect::<Vec<_>>(), (1..=20).collect::<Vec<i64>>());
            for row in r["epochs"].as_array().unwrap() {
                let last = row["step"].as_i64().unwrap();
                let losses: Vec<f64> = steps.range(last - 9..=last).map(|(_, &v)| f64::from(v)).collect();
                let mean = losses.iter().sum::<f64>() / losses.len() as f64;
                assert!((mean - row["train_loss"].as_f64().unwrap()).abs() < 1e-5, "step {last}");
                assert_eq!(f64::from(steps[&last]), row["last_step_loss"].as_f64().unwrap() as f32 as f64);
            }
        }
    }
}

#[test]
fn a_tensorboard_dir_that_cannot_hold_the_files_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let file = d.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let out = d.join("x.safetensors");
    for (board, says) in [(file.clone(), "not a directory"), (file.join("below"), "cannot create the directory")] {
        let o = textnet(&["xor", "--device", "cpu", "--tensorboard", s(&board), "--out", s(&out)]);
        fails_with(&o, &[&format!("--tensorboard {}: {says}", board.display())]);
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
        assert!(!out.exists(), "no training, no model");
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}
