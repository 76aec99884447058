//! `textnet sales` end to end on the CPU: training on a generated sales.tsv slice and on a CSV with a
//! header, the report, the model file, predictions, keep-best, and one-line errors for bad input.

use crate::common::{fails_with, s, stderr, stdout, textnet};
use std::path::{Path, PathBuf};
use std::process::Command;
use textnet::sales::model;
use textnet::sales::modelfile;

/// 3000 rows of the generator's sales.tsv in `dir`.
fn sales_table(dir: &Path) -> PathBuf {
    let path = dir.join("sales.tsv");
    let root = env!("CARGO_MANIFEST_DIR");
    let status = Command::new("python3")
        .args([&format!("{root}/scripts/make-sales.py"), "--rows", "3000", "--out", path.to_str().unwrap()])
        .status()
        .expect("runs python3");
    assert!(status.success());
    path
}

#[test]
fn trains_beats_the_baseline_reports_and_predicts() {
    let dir = tempfile::tempdir().unwrap();
    let table = sales_table(dir.path());
    let out = dir.path().join("m.safetensors");
    // In file order, as the generator's table is meant to be split (the last rows test).
    let sales = |extra: &[&str]| {
        textnet(
            &[&["sales", s(&table), "--device", "cpu", "--split-order", "file", "--out", s(&out)][..], extra].concat(),
        )
    };
    let o = sales(&["--epochs", "30", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["command"], "sales");
    assert_eq!(r["config"]["split_order"], "file");
    assert_eq!(r["status"], "ok");
    assert_eq!(r["epochs"].as_array().unwrap().len(), 30);
    assert_eq!(r["data"]["train_samples"], 2400);
    let baseline = r["final"]["baseline_mae"].as_f64().unwrap();
    let mae = r["final"]["test_mae"].as_f64().unwrap();
    assert!(mae < 0.5 * baseline, "test MAE {mae} against baseline {baseline}");
    assert_eq!(r["epochs"][29]["test_mae"].as_f64(), Some(mae));
    assert!(stderr(&o).contains("baseline test MAE"), "{}", stderr(&o));

    // The file holds what the run reported, and predictions come from it.
    let m = modelfile::load(&out).unwrap();
    assert_eq!(m.params.shape.hidden, 32);
    assert_eq!(m.feature_names.len(), m.params.shape.inputs);
    let p = textnet(&["sales", "--model", s(&out), "--predict", s(&table)]);
    assert!(p.status.success(), "{}", stderr(&p));
    let lines: Vec<String> = stdout(&p).lines().skip(1).map(String::from).collect();
    assert_eq!(lines.len(), 3000);
    // Row 2401 is the first test row: its prediction is the model's.
    let options = textnet::sales::table::LoadOptions::new(m.schema.clone());
    let t = textnet::sales::table::Table::read(&table, &options).unwrap();
    let split = textnet::datasets::features::Split::of_rows(&t, &t.rows[2400..2401], &m.vocabularies);
    let want = m.stats.target_value(model::predict(&m.params, m.stats.normalize(&split).row(0)).unwrap()[0]);
    let got: f32 = lines[2400].split('\t').nth(1).unwrap().parse().unwrap();
    assert_eq!(lines[2400].split('\t').next(), Some("2401"));
    assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "{got} vs {want}");

    // A worse run (3 epochs) leaves the file's bytes alone and says so, once.
    let before = std::fs::read(&out).unwrap();
    let o = sales(&["--epochs", "3"]);
    fails_with(&o, &["is above the"]);
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert_eq!(all.matches("nothing written").count(), 1, "{all}");
    assert_eq!(std::fs::read(&out).unwrap(), before);
}

#[test]
fn any_table_by_header_names() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let mut text = String::from("width,height,kind,when,area\n");
    for i in 0..200 {
        let (w, h) = (1 + i % 7, 2 + i % 5);
        let kind = ["box", "flat", "tall"][i % 3];
        text += &format!("{w},{h},\"{kind}, x\",2024-03-{:02},{}\n", 1 + i % 28, w * h);
    }
    std::fs::write(&csv, text).unwrap();
    let out = dir.path().join("t.safetensors");
    let o = textnet(&[
        "sales",
        s(&csv),
        "--target",
        "area",
        "--numeric",
        "width,height",
        "--categorical",
        "kind",
        "--date",
        "when",
        "--device",
        "cpu",
        "--epochs",
        "30",
        "--out",
        s(&out),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Two numbers, three one-hot, the date's year, day of year and day of week (sin, cos).
    assert_eq!(r["data"]["features"].as_array().unwrap().len(), 2 + 3 + 5);
    assert_eq!(r["data"]["target"], "area");
}

#[test]
fn bad_input_gets_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.safetensors");
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let mut rows = String::from("a,b,y\n");
    for i in 0..20 {
        rows += &format!("{i},{},{}\n", i % 3, 2 * i);
    }
    let train = |p: &Path, extra: &[&str]| {
        textnet(
            &[
                &[
                    "sales",
                    s(p),
                    "--target",
                    "y",
                    "--numeric",
                    "a,b",
                    "--device",
                    "cpu",
                    "--epochs",
                    "30",
                    "--out",
                    s(&out),
                ],
                extra,
            ]
            .concat(),
        )
    };
    fails_with(&train(&file("nan.csv", &(rows.clone() + "3,NaN,4\n")), &[]), &["nan.csv:22:2"]);
    fails_with(&train(&file("word.csv", &(rows.clone() + "3,x,4\n")), &[]), &["word.csv:22:2"]);
    fails_with(&train(&file("short.csv", &(rows.clone() + "3,4\n")), &[]), &["short.csv:22"]);
    fails_with(&train(&file("empty.csv", ""), &[]), &["is empty"]);
    fails_with(&train(&file("one.csv", "a,b,y\n1,2,3\n"), &[]), &["too few to split"]);
    let skipped = train(&file("skip.csv", &(rows.clone() + "3,x,4\n4,,5\n")), &["--skip-bad-rows"]);
    assert!(skipped.status.success(), "{}", stderr(&skipped));
    assert!(stdout(&skipped).contains("skipped 2 bad rows"), "{}", stdout(&skipped));
    fails_with(&textnet(&["sales", s(&dir.path().join("skip.csv")), "--numeric", "a"]), &["name its --target"]);

    // A model file of another kind, as --model or as --out.
    let xor = dir.path().join("xor.safetensors");
    assert!(textnet(&["xor", "--device", "cpu", "--epochs", "1000", "--out", s(&xor)]).status.success());
    fails_with(
        &textnet(&["sales", "--model", s(&xor), "--predict", s(&dir.path().join("skip.csv"))]),
        &["not a textnet sales model"],
    );
    let o = textnet(&[
        "sales",
        s(&dir.path().join("skip.csv")),
        "--target",
        "y",
        "--numeric",
        "a,b",
        "--skip-bad-rows",
        "--device",
        "cpu",
        "--out",
        s(&xor),
    ]);
    fails_with(&o, &["is not a textnet sales model"]);
}

/// A table sorted by its target splits as a random one by default; in file order the run warns that
/// its test rows are unlike its training rows.
#[test]
fn a_sorted_table_is_shuffled_before_it_splits() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("sorted.csv");
    // y = i, sorted; x = i / 10 tells it (so that a model can learn it from the shuffled rows).
    let rows: String = (0..500).map(|i| format!("{},{i}\n", i / 10)).collect();
    std::fs::write(&csv, format!("x,y\n{rows}")).unwrap();
    let run = |extra: &[&str]| {
        let out = dir.path().join("m.safetensors");
        let args = ["sales", s(&csv), "--target", "y", "--numeric", "x", "--device", "cpu", "--epochs", "30"];
        textnet(&[&args[..], &["--overwrite", "--out", s(&out)], extra].concat())
    };
    let shuffled = run(&[]);
    assert!(shuffled.status.success(), "{}", stderr(&shuffled));
    assert!(stdout(&shuffled).contains("rows shuffled by the seed") && !stdout(&shuffled).contains("warning"));
    let file = run(&["--split-order", "file"]);
    let text = stdout(&file);
    assert!(text.contains("in file order"), "{text}");
    assert!(
        text.contains("warning: the test rows' y (mean 449.5000") && text.contains("--split-order shuffled"),
        "{text}"
    );
}

#[test]
fn the_schedule_changes_the_run_and_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let table = sales_table(dir.path());
    let run = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let args = ["sales", s(&table), "--device", "cpu", "--epochs", "4", "--out", s(&out), "--json"];
        let o = textnet(&[&args[..], extra].concat());
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (r, std::fs::read(&out).unwrap())
    };
    let (constant, constant_model) = run("c.st", &[]);
    let (cosine, cosine_model) =
        run("k.st", &["--lr-schedule", "cosine", "--warmup", "10", "--min-lr", "1e-5", "--grad-clip", "1"]);
    assert_eq!(
        (constant["config"]["lr_schedule"].as_str(), constant["config"]["warmup"].as_u64()),
        (Some("constant"), Some(0))
    );
    assert_eq!(
        (cosine["config"]["lr_schedule"].as_str(), cosine["config"]["warmup"].as_u64()),
        (Some("cosine"), Some(10))
    );
    assert_eq!((cosine["config"]["min_lr"].as_f64(), cosine["config"]["clip_norm"].as_f64()), (Some(1e-5), Some(1.0)));
    assert_ne!(constant_model, cosine_model);
    // 4 epochs of 2400 rows in batches of 64: 152 steps.
    let o = textnet(&[
        "sales",
        s(&table),
        "--device",
        "cpu",
        "--epochs",
        "4",
        "--warmup",
        "152",
        "--out",
        s(&dir.path().join("w.st")),
    ]);
    fails_with(&o, &["--warmup 152 is as long as the whole run (152 optimizer steps)"]);
}
