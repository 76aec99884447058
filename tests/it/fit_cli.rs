//! `textnet fit` end to end on the CPU: images (Fashion-MNIST) and generated tables, the model file's
//! names and metadata, `--predict`, `--patience`, the schedule, the keep-best rules, and
//! every bad input refused before training.

use crate::common::{fails_with, report, s, small_fit_model, stderr, stdout, textnet};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The tensors (name → shape) and metadata of a safetensors file.
fn read_model(path: &Path) -> (HashMap<String, Vec<usize>>, HashMap<String, String>) {
    let bytes = std::fs::read(path).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let shapes = tensors.tensors().into_iter().map(|(name, t)| (name, t.shape().to_vec())).collect();
    (shapes, header.metadata().clone().unwrap())
}

/// A table of `rows` rows: numeric x1, x2, a category of three levels, a numeric target y (linear in
/// them, with a little noise) and a class label (`high` when y is above 0, else `low`).
fn write_table(path: &Path, rows: usize, seed: u64) {
    let mut text = String::from("x1,x2,kind,y,label\n");
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) as f64 / (1u64 << 31) as f64) * 2.0 - 1.0
    };
    for i in 0..rows {
        let (x1, x2, noise) = (next(), next(), next());
        let kind = ["a", "b", "c"][i % 3];
        let y = 3.0 * x1 - 2.0 * x2 + [0.5, -0.5, 1.0][i % 3] + 0.05 * noise;
        let label = if y > 0.3 { "high" } else { "low" };
        text += &format!("{x1:.4},{x2:.4},{kind},{y:.4},{label}\n");
    }
    std::fs::write(path, text).unwrap();
}

fn fit(args: &[&str]) -> std::process::Output {
    textnet(&[&["fit", "--device", "cpu"][..], args].concat())
}

/// The flags that train `layers` on the table at `path` to predict its column y (the label left out).
fn y_args<'a>(path: &'a Path, layers: &'a str) -> Vec<&'a str> {
    vec!["--table", s(path), "--target", "y", "--ignore", "label", "--layers", layers]
}

/// `fit` of `layers` on the table at `path`, predicting y, with `extra` flags.
fn fit_y(path: &Path, layers: &str, extra: &[&str]) -> std::process::Output {
    fit(&[&y_args(path, layers)[..], extra].concat())
}

/// A table in a fresh directory, and the directory.
fn table(rows: usize) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("t.csv");
    write_table(&path, rows, 7);
    (tmp, path)
}

#[test]
fn fit_images_json_run_writes_state_dict_names_and_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("m.safetensors");
    let o = fit(&[
        "--layers",
        "Linear(784, 32), ReLU, Dropout(0.1), Linear(10)",
        "--dataset",
        "fashion",
        "--train-limit",
        "3000",
        "--epochs",
        "2",
        "--json",
        "--quiet",
        "--out",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "--json --quiet prints only the JSON");
    let r = report(&o);
    assert_eq!((r["status"].as_str(), r["command"].as_str()), (Some("ok"), Some("fit")));
    assert_eq!(r["config"]["layers"], "Linear(784, 32), ReLU, Dropout(0.1), Linear(32, 10)");
    assert_eq!(r["config"]["loss"], "ce");
    assert_eq!(r["data"]["train_samples"], 3000);
    assert_eq!(r["data"]["test_samples"], 10000);
    assert_eq!(r["parameters"], 784 * 32 + 32 + 32 * 10 + 10);
    assert_eq!(r["epochs"].as_array().unwrap().len(), 2);
    let accuracy = r["final"]["test_accuracy"].as_f64().unwrap();
    assert!(accuracy > 0.65 && accuracy <= 1.0, "{r}");
    let (tensors, meta) = read_model(&out);
    let expected: HashMap<String, Vec<usize>> =
        [("0.weight", vec![32, 784]), ("0.bias", vec![32]), ("3.weight", vec![10, 32]), ("3.bias", vec![10])]
            .into_iter()
            .map(|(n, d)| (n.to_string(), d))
            .collect();
    assert_eq!(tensors, expected);
    assert_eq!(meta["format"], "textnet-fit");
    assert_eq!(meta["spec"], "Linear(784, 32), ReLU, Dropout(0.1), Linear(32, 10)");
    assert_eq!(meta["loss"], "ce");
    let input: serde_json::Value = serde_json::from_str(&meta["input"]).unwrap();
    assert_eq!(input["kind"], "images");
    assert_eq!(input["dataset"], "fashion");
    assert_eq!(input["shape"], serde_json::json!([784]));
    assert_eq!(input["scaling"], "pixel byte / 255, row-major 28x28");
    let names: Vec<String> = serde_json::from_str(&meta["class_names"]).unwrap();
    assert_eq!((names.len(), names[9].as_str()), (10, "Ankle boot"));

    // The same run repeats to the bit.
    let again = tmp.path().join("again.safetensors");
    let o = fit(&[
        "--layers",
        "Linear(784, 32), ReLU, Dropout(0.1), Linear(10)",
        "--dataset",
        "fashion",
        "--train-limit",
        "3000",
        "--epochs",
        "2",
        "--quiet",
        "--out",
        s(&again),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());
}

#[test]
fn fit_a_conv_spec_reads_images_as_images() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cnn.safetensors");
    let r = small_fit_model("Conv2d(1, 4, 3, padding=1), ReLU, MaxPool2d(4), Flatten, Linear(10)", &out);
    assert_eq!(r["data"]["input_shape"], serde_json::json!([1, 28, 28]));
    assert_eq!(
        r["config"]["layers"],
        "Conv2d(1, 4, 3, stride=1, padding=1), ReLU, MaxPool2d(4), Flatten, Linear(196, 10)"
    );
    let (tensors, _) = read_model(&out);
    assert_eq!(tensors["0.weight"], vec![4, 1, 3, 3]);
    assert_eq!(tensors["4.weight"], vec![10, 196]);
}

#[test]
fn fit_a_numeric_target_reports_mae_and_predicts_in_its_units() {
    let (tmp, path) = table(600);
    let out = tmp.path().join("reg.safetensors");
    let o = fit_y(
        &path,
        "Linear(16), ReLU, Linear(1)",
        &["--epochs", "40", "--batch", "32", "--lr", "0.01", "--json", "--out", s(&out)],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let r = report(&o);
    assert_eq!(r["config"]["loss"], "mse", "a numeric target trains with squared error by default");
    let (mae, baseline) = (r["final"]["test_mae"].as_f64().unwrap(), r["final"]["baseline_mae"].as_f64().unwrap());
    assert!(mae < 0.3 * baseline, "test MAE {mae}, baseline {baseline}");
    assert!(stderr(&o).contains("columns of"), "the columns' roles are printed");
    let (tensors, meta) = read_model(&out);
    assert_eq!(tensors["0.weight"], vec![16, 5], "x1, x2 and three one-hot kinds");
    assert_eq!(meta["loss"], "mse");
    let target: serde_json::Value = serde_json::from_str(&meta["target"]).unwrap();
    assert_eq!(target["name"], "y");
    assert!(target["std"].as_f64().unwrap() > 0.5);
    let input: serde_json::Value = serde_json::from_str(&meta["input"]).unwrap();
    assert_eq!(input["kind"], "table");
    let mut vocabulary: Vec<String> = serde_json::from_value(input["vocabularies"][0].clone()).unwrap();
    vocabulary.sort();
    assert_eq!(vocabulary, ["a", "b", "c"], "the categorical column's values seen in training");

    // Rows to predict, the target left empty: predictions in the target's units.
    let new = tmp.path().join("new.csv");
    std::fs::write(&new, "x1,x2,kind,y,label\n0.5,0.0,a,,high\n-0.5,0.5,b,,low\n").unwrap();
    let o = textnet(&["fit", "--model", s(&out), "--predict", s(&new)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<String> = stdout(&o).lines().map(str::to_string).collect();
    assert_eq!(lines[0], "line\tprediction");
    let first: f64 = lines[1].split('\t').nth(1).unwrap().parse().unwrap();
    let second: f64 = lines[2].split('\t').nth(1).unwrap().parse().unwrap();
    assert!((first - 2.0).abs() < 0.5, "3·0.5 + 0.5 = 2.0, got {first}");
    assert!((second - -3.0).abs() < 0.6, "−1.5 − 1 − 0.5 = −3.0, got {second}");
    // With the target given, the MAE.
    let o = textnet(&["fit", "--model", s(&out), "--predict", s(&path)]);
    assert!(stderr(&o).contains("MAE"), "{}", stderr(&o));
}

#[test]
fn fit_a_text_target_is_a_class_and_predicts_its_names() {
    let (tmp, path) = table(600);
    let out = tmp.path().join("cls.safetensors");
    let o = fit(&[
        "--table",
        s(&path),
        "--target",
        "label",
        "--ignore",
        "y",
        "--layers",
        "Linear(16), Tanh, Linear(2)",
        "--epochs",
        "30",
        "--lr",
        "0.01",
        "--json",
        "--quiet",
        "--out",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = report(&o);
    assert_eq!(r["config"]["loss"], "ce", "a target of words is a class");
    assert!(r["final"]["test_accuracy"].as_f64().unwrap() > 0.85, "{r}");
    let (_, meta) = read_model(&out);
    let names: Vec<String> = serde_json::from_str(&meta["class_names"]).unwrap();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, ["high", "low"], "the classes are the column's values");
    let o = textnet(&["fit", "--model", s(&out), "--predict", s(&path)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).lines().skip(1).all(|l| l.ends_with("\thigh") || l.ends_with("\tlow")));
    assert!(stderr(&o).contains("accuracy"), "{}", stderr(&o));
}

#[test]
fn fit_patience_stops_early_and_keeps_the_best_epoch() {
    let (tmp, path) = table(300);
    let out = tmp.path().join("p.safetensors");
    let o = fit_y(
        &path,
        "Linear(32), ReLU, Linear(1)",
        &[
            "--epochs",
            "200",
            "--lr",
            "0.05",
            "--batch",
            "8",
            "--val-split",
            "0.3",
            "--patience",
            "2",
            "--json",
            "--quiet",
            "--out",
            s(&out),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let r = report(&o);
    let epochs = r["epochs"].as_array().unwrap();
    assert!(epochs.len() < 200, "stopped early: {} epochs", epochs.len());
    let best = epochs
        .iter()
        .min_by(|a, b| a["val_loss"].as_f64().unwrap().total_cmp(&b["val_loss"].as_f64().unwrap()))
        .unwrap();
    assert_eq!(r["kept_epoch"], best["epoch"], "the file keeps the best epoch");
    assert_eq!(epochs.len() as u64, best["epoch"].as_u64().unwrap() + 2, "two epochs without improvement");
    assert_eq!(r["config"]["keep"], "best");
}

#[test]
fn fit_the_schedule_changes_the_run_and_is_reported() {
    let (tmp, path) = table(200);
    let run = |schedule: &str, out: &str| {
        let out = tmp.path().join(out);
        let o = fit_y(
            &path,
            "Linear(8), ReLU, Linear(1)",
            &[
                "--epochs",
                "10",
                "--lr",
                "0.02",
                "--lr-schedule",
                schedule,
                "--warmup",
                "3",
                "--json",
                "--quiet",
                "--out",
                s(&out),
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        (report(&o), std::fs::read(&out).unwrap())
    };
    let (constant, a) = run("constant", "a.safetensors");
    let (cosine, b) = run("cosine", "b.safetensors");
    let (step, c) = run("step", "c.safetensors");
    assert_eq!(
        (cosine["config"]["lr_schedule"].as_str(), cosine["config"]["warmup"].as_u64()),
        (Some("cosine"), Some(3))
    );
    assert_eq!(step["config"]["lr_schedule"], "step");
    assert_eq!(constant["config"]["lr_schedule"], "constant");
    assert!(a != b && b != c && a != c, "each schedule trains differently");
    let o = fit(&[
        "--table",
        s(&path),
        "--target",
        "y",
        "--layers",
        "Linear(1)",
        "--epochs",
        "1",
        "--warmup",
        "1000",
        "--out",
        s(&tmp.path().join("w.safetensors")),
    ]);
    fails_with(&o, &["--warmup 1000 is as long as the whole run"]);
}

#[test]
fn fit_never_replaces_a_better_model_nor_one_of_other_data() {
    let (tmp, path) = table(300);
    let out = tmp.path().join("k.safetensors");
    let args = |epochs: &'static str, lr: &'static str, layers: &'static str| {
        let mut a = y_args(&path, layers);
        a.extend(["--epochs", epochs, "--lr", lr, "--quiet", "--out", s(&out)]);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |a: Vec<String>| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        fit(&a)
    };
    let o = run(args("30", "0.01", "Linear(16), ReLU, Linear(1)"));
    assert!(o.status.success(), "{}", stderr(&o));
    let good = std::fs::read(&out).unwrap();
    // Without --quiet, to see that it says so once: in its error, not also in a closing line.
    let mut worse = args("1", "0.00001", "Linear(16), ReLU, Linear(1)");
    worse.retain(|a| a != "--quiet");
    let o = run(worse);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert_eq!(all.matches("nothing written").count(), 1, "{all}");
    assert_eq!(std::fs::read(&out).unwrap(), good, "the better model stays");
    let o = run(args("1", "0.01", "Linear(8), ReLU, Linear(1)"));
    fails_with(&o, &["holds a fit model of another spec or other data", "--overwrite"]);
    assert_eq!(std::fs::read(&out).unwrap(), good);
}

#[test]
fn fit_refuses_a_file_whose_tensors_do_not_match_its_spec() {
    let (tmp, path) = table(100);
    let out = tmp.path().join("m.safetensors");
    let o =
        fit_y(&path, "Linear(6), ReLU, Linear(1)", &["--epochs", "20", "--lr", "0.01", "--quiet", "--out", s(&out)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&out).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta: std::collections::BTreeMap<String, String> = header.metadata().clone().unwrap().into_iter().collect();
    meta.insert("spec".into(), "Linear(5, 7), ReLU, Linear(7, 1)".into());
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let values: Vec<(String, Vec<f32>, Vec<usize>)> = tensors
        .tensors()
        .into_iter()
        .map(|(n, t)| {
            (n, t.data().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect(), t.shape().to_vec())
        })
        .collect();
    let views: Vec<(&str, &[f32], Vec<usize>)> =
        values.iter().map(|(n, v, d)| (n.as_str(), v.as_slice(), d.clone())).collect();
    let bad = tmp.path().join("bad.safetensors");
    std::fs::write(&bad, textnet::io::tensorfile::to_bytes(&views, meta).unwrap()).unwrap();
    let o = textnet(&["fit", "--model", s(&bad), "--predict", s(&path)]);
    fails_with(&o, &["tensor 0.weight is [6, 5] but the spec", "implies [7, 5]"]);
}

/// Each bad input: one line, exit status 1, before any training (no model file).
#[test]
fn fit_bad_inputs_are_one_line_before_training() {
    let (tmp, path) = table(60);
    let out = tmp.path().join("never.safetensors");
    let table_run = |layers: &str, extra: &[&str]| fit_y(&path, layers, &[&["--out", s(&out)][..], extra].concat());
    let image_run = |layers: &str, extra: &[&str]| {
        let mut a = vec!["--dataset", "fashion", "--train-limit", "100", "--layers", layers, "--out", s(&out)];
        a.extend_from_slice(extra);
        fit(&a)
    };
    fails_with(&table_run("Linear(8), ReLU,, Linear(1)", &[]), &["at character 17", "expected a layer name"]);
    fails_with(
        &image_run("Linear(784, 128), ReLU, Linear(64, 10)", &[]),
        &["layer 3 (Linear) takes 64 inputs but layer 2 gives 128"],
    );
    fails_with(
        &table_run("Linear(9, 4), ReLU, Linear(1)", &[]),
        &["layer 1 (Linear) takes 9 inputs but the data gives 5", "Linear(5)"],
    );
    fails_with(
        &image_run("Conv2d(1, 4, 3), Flatten, Conv2d(4, 4, 3), Linear(10)", &[]),
        &["layer 3 (Conv2d) takes images"],
    );
    fails_with(&table_run("Conv2d(1, 4, 3), Flatten, Linear(1)", &[]), &["layer 1 (Conv2d) takes images, but --table"]);
    fails_with(&image_run("Linear(10)", &["--loss", "mse"]), &["--loss mse needs a numeric target", "--loss ce"]);
    let o =
        fit(&["--table", s(&path), "--target", "label", "--layers", "Linear(1)", "--loss", "mse", "--out", s(&out)]);
    fails_with(&o, &["--loss mse needs a numeric target", "\"high\"", "--loss ce"]);
    fails_with(
        &image_run("Linear(32), ReLU, Linear(3)", &[]),
        &["layer 3 (Linear) gives 3 outputs but the target has 10 classes", "Linear(10)"],
    );
    fails_with(
        &table_run("Linear(4), ReLU, Linear(2)", &[]),
        &["gives 2 outputs but the numeric target y is one value", "Linear(1)"],
    );
    fails_with(
        &image_run("Linear(784, 4000000), ReLU, Linear(10)", &[]),
        &["--layers", "needs about", "lower the widths or channels in --layers"],
    );
    fails_with(&table_run("Linear(1)", &["--patience", "3"]), &["--patience needs --val-split"]);
    fails_with(&table_run("Linear(1)", &["--keep", "best"]), &["--keep best needs --val-split"]);
    let o = fit(&["--layers", "Linear(1)", "--out", s(&out)]);
    fails_with(&o, &["--dataset mnist|fashion, or --table FILE --target COLUMN"]);
    assert!(!out.exists(), "nothing was trained or written");
}
