//! Bad values in the tables of `fit` and `sales` whose columns' roles are inferred, and the messages of
//! runs on such tables: the cases of the bad-input audit of 2026-11-28, each named by its ID. One bad
//! value never changes what a column is: it stops the run at FILE:LINE:COLUMN, or `--skip-bad-rows`
//! drops its row.

use crate::common::bad_input;

use bad_input::run;
use std::path::Path;

/// A small deterministic generator of invented values in [-1, 1) (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// `rows` rows of `a,b,y` (y = a + 2b), each field `cell(row, column, value)`.
fn table(rows: usize, cell: impl Fn(usize, usize, String) -> String) -> String {
    let mut r = Rng(5);
    let mut text = String::from("a,b,y\n");
    for i in 0..rows {
        let (a, b) = (r.next(), r.next());
        let fields: Vec<String> =
            [a, b, a + 2.0 * b].iter().enumerate().map(|(k, v)| cell(i, k, format!("{v:.4}"))).collect();
        text += &(fields.join(",") + "\n");
    }
    text
}

/// `table` with `value` as column `column` (0-based) of row `row` (0-based; line `row + 2`).
fn one_bad(rows: usize, row: usize, column: usize, value: &str) -> String {
    table(rows, |i, k, v| if (i, k) == (row, column) { value.to_string() } else { v })
}

/// A small network for a numeric target.
const MLP: &str = "Linear(8), ReLU, Linear(1)";

fn write(dir: &Path, name: &str, text: impl AsRef<[u8]>) {
    std::fs::write(dir.join(name), text).unwrap();
}

/// `fit` of the network `layers` on the table `file` of `dir`, predicting `target`, with `extra` flags.
fn fit(dir: &Path, file: &str, target: &str, layers: &str, extra: &[&str]) -> bad_input::Run {
    let mut args = vec!["fit", "--table", file, "--target", target, "--layers", layers];
    args.extend_from_slice(&["--device", "cpu", "--out", "m.st"]);
    run(dir, &[&args[..], extra].concat())
}

/// `sales` on the table `file` of `dir`, predicting `target`, with `extra` flags.
fn sales(dir: &Path, file: &str, target: &str, extra: &[&str]) -> bad_input::Run {
    let args = ["sales", file, "--target", target, "--device", "cpu", "--out", "s.st"];
    run(dir, &[&args[..], extra].concat())
}

#[test]
fn ft13_ft14_ft11_one_bad_number_stops_at_its_cell_and_skip_bad_rows_drops_it() {
    let dir = tempfile::tempdir().unwrap();
    for (name, value) in [("nan.csv", "NaN"), ("inf.csv", "inf"), ("typo.csv", "x")] {
        write(dir.path(), name, one_bad(200, 50, 1, value));
        let place = format!("{name}:52:2: b: \"{value}\"");
        // NaN and inf are numbers written wrong; "x" is no number, but the other values make b numeric.
        let why = match value {
            "x" => "b is a numeric column because every value but 1 is a number: use --skip-bad-rows",
            _ => "(use --skip-bad-rows to drop such rows)",
        };
        fit(dir.path(), name, "y", MLP, &[]).fails_with(&[&place, why]);
        sales(dir.path(), name, "y", &[]).fails_with(&[&place, why]);
        assert!(!dir.path().join("m.st").exists() && !dir.path().join("s.st").exists());
    }
    let skipped = fit(dir.path(), "typo.csv", "y", MLP, &["--skip-bad-rows", "--json", "--epochs", "30"]);
    skipped.succeeds();
    let report: serde_json::Value = serde_json::from_str(&skipped.stdout).unwrap();
    assert_eq!(report["data"]["skipped_rows"], 1, "{report}");
    assert_eq!(report["data"]["input"], 2, "a and b are both features: {report}");
    assert!(skipped.stderr.contains("  b: numeric (every value but 1 is a number; the first other: line 52, \"x\")"));
}

#[test]
fn si11_one_impossible_date_stops_at_its_cell() {
    let dir = tempfile::tempdir().unwrap();
    let dates = table(200, |i, k, v| match (i, k) {
        (100, 1) => "2024-02-30".to_string(),
        (_, 1) => format!("2024-02-{:02}", i % 28 + 1),
        _ => v,
    });
    write(dir.path(), "d.csv", dates);
    sales(dir.path(), "d.csv", "y", &[]).fails_with(&[
        "d.csv:102:2: b: \"2024-02-30\": February 2024 has no day 30",
        "b is a date column because every value but 1 reads as a date",
    ]);
}

#[test]
fn si13_dates_with_two_digit_years_are_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let dates = table(200, |i, k, v| if k == 1 { format!("{}/{}/24", i % 12 + 1, i % 28 + 1) } else { v });
    write(dir.path(), "d.csv", dates);
    let o = sales(dir.path(), "d.csv", "y", &["--epochs", "1"]);
    let line = o.stdout.lines().find(|l| l.starts_with("  b: ")).unwrap_or_default().to_string();
    assert!(line.contains("they look like dates with two-digit years, which are not read"), "{}", o.stdout);
}

#[test]
fn si25_latin1_text_stops_at_its_cell() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = b"a,ville,y\n".to_vec();
    for i in 0..200 {
        text.extend(format!("{i}.5,").as_bytes());
        text.extend([b"Orl\xe9ans".as_slice(), b"N\xeemes", b"Besan\xe7on"][i % 3]);
        text.extend(format!(",{}\n", i % 7).as_bytes());
    }
    write(dir.path(), "latin1.csv", text);
    let o = sales(dir.path(), "latin1.csv", "y", &[]);
    o.fails_with(&["latin1.csv:2:2: ville: not valid UTF-8 text"]);
    assert!(!o.stdout.contains("no values"), "{}", o.stdout);
}

#[test]
fn ft15_ft16_a_bad_number_in_the_target_is_no_class() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "inf.csv", one_bad(200, 7, 2, "-inf"));
    write(dir.path(), "huge.csv", one_bad(200, 7, 2, "4e38"));
    for (name, what) in [("inf.csv", "\"-inf\" is infinite"), ("huge.csv", "\"4e38\" is beyond the range of 32-bit")] {
        let o = fit(dir.path(), name, "y", MLP, &[]);
        o.fails_with(&[&format!("{name}:9:3: y: {what}"), "--skip-bad-rows"]);
        assert!(!o.stderr.contains("classes") && !o.stderr.contains("--loss ce"), "{}", o.stderr);
    }
    // A word among numbers may make the target labels: --loss ce is named then.
    write(dir.path(), "word.csv", one_bad(200, 7, 2, "unknown"));
    fit(dir.path(), "word.csv", "y", MLP, &[])
        .fails_with(&["word.csv:9:3: y: \"unknown\" is not a number", "--loss ce reads the target as class labels"]);
}

#[test]
fn ft44_empty_cells_of_a_numeric_target_expect_a_number() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "t.csv", table(200, |i, k, v| if k == 2 && i % 10 == 0 { String::new() } else { v }));
    let expected = "t.csv:2:3: y: empty field, expected a number (use --skip-bad-rows to drop such rows)";
    fit(dir.path(), "t.csv", "y", MLP, &[]).fails_with(&[expected]);
    sales(dir.path(), "t.csv", "y", &[]).fails_with(&[expected]);
}

#[test]
fn ft09_a_constant_target_has_nothing_to_learn() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "t.csv", table(200, |_, k, v| if k == 2 { "7".to_string() } else { v }));
    let expected = "t.csv: the target y is constant (7): nothing to learn";
    fit(dir.path(), "t.csv", "y", MLP, &[]).fails_with(&[expected]);
    sales(dir.path(), "t.csv", "y", &[]).fails_with(&[expected]);
}

#[test]
fn si24_a_nul_byte_is_named_at_its_field() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "nul.csv", one_bad(200, 9, 1, "x\0y"));
    sales(dir.path(), "nul.csv", "y", &[]).fails_with(&["nul.csv:11:2: a NUL byte in the field"]);
}

#[test]
fn fp18_a_table_of_the_other_delimiter_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "t.csv", table(300, |_, _, v| v));
    fit(dir.path(), "t.csv", "y", MLP, &["--quiet", "--epochs", "60"]).succeeds();
    write(dir.path(), "t.tsv", table(20, |_, _, v| v).replace(',', "\t"));
    run(dir.path(), &["fit", "--model", "m.st", "--predict", "t.tsv"])
        .fails_with(&["t.tsv: the model reads comma-separated rows but this file is tab-separated"]);
}

/// Two classes, drawn at random: nothing a model can learn, so every run of it ends "did not learn".
fn noise_classes(rows: usize) -> String {
    let mut r = Rng(9);
    let rows: String =
        (0..rows).map(|_| format!("{:.4},{}\n", r.next(), ["p", "q"][(r.next() > 0.0) as usize])).collect();
    format!("x,class\n{rows}")
}

#[test]
fn vs09_vs12_a_run_on_too_few_training_rows_says_so() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "c.csv", noise_classes(150));
    fit(dir.path(), "c.csv", "class", "Linear(2)", &["--val-split", "0.991"])
        .fails_with(&["did not learn", "1 training sample is too few to learn from"]);
    write(dir.path(), "t.csv", table(300, |_, _, v| v));
    sales(dir.path(), "t.csv", "y", &["--val-split", "0.99"])
        .fails_with(&["did not learn", "2 training rows are too few to learn from"]);
}

#[test]
fn vs19_a_run_whose_loss_barely_moved_is_told_to_raise_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "c.csv", noise_classes(400));
    let o = fit(dir.path(), "c.csv", "class", "Linear(2)", &["--lr", "1e-9", "--epochs", "1"]);
    o.fails_with(&["did not learn", "its loss barely moved", "raise --lr (this run used 0.000000001)"]);
    assert!(!o.stderr.contains("lower --lr"), "{}", o.stderr);
}

#[test]
fn a_column_left_out_for_its_values_is_a_warning_also_with_quiet_and_in_the_report() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "t.csv", table(200, |i, k, v| if k == 0 { format!("note {i}") } else { v }));
    let warning = "warning: t.csv: column a is left out (an identifier: every value is different)";
    for o in [
        fit(dir.path(), "t.csv", "y", "Linear(1)", &["--quiet", "--json"]),
        sales(dir.path(), "t.csv", "y", &["--quiet", "--json"]),
    ] {
        assert!(o.stderr.lines().any(|l| l.starts_with(warning)), "{}", o.stderr);
        let report: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
        let warnings = report["data"]["warnings"].as_array().unwrap();
        assert!(warnings.len() == 1 && warnings[0].as_str().unwrap().starts_with(warning), "{report}");
    }
}

#[test]
fn mf56_statistics_of_another_length_are_named() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "t.csv", table(300, |_, _, v| v));
    sales(dir.path(), "t.csv", "y", &["--quiet"]).succeeds();
    bad_input::with_metadata(&dir.path().join("s.st"), &dir.path().join("std64.st"), |meta| {
        let mut stats: serde_json::Value = serde_json::from_str(meta["stats"].as_str().unwrap()).unwrap();
        stats["feature_std"] = serde_json::json!(vec![1.0; 64]);
        meta.insert("stats".into(), serde_json::Value::String(stats.to_string()));
    });
    run(dir.path(), &["sales", "--model", "std64.st", "--predict", "t.csv"])
        .fails_with(&["the statistics list 64 standard deviations for 2 features"]);

    // The same lie in a fit model's input.
    fit(dir.path(), "t.csv", "y", "Linear(1)", &["--quiet", "--epochs", "40", "--lr", "0.01"]).succeeds();
    bad_input::with_metadata(&dir.path().join("m.st"), &dir.path().join("fit64.st"), |meta| {
        let mut input: serde_json::Value = serde_json::from_str(meta["input"].as_str().unwrap()).unwrap();
        input["feature_std"] = serde_json::json!(vec![1.0; 64]);
        meta.insert("input".into(), serde_json::Value::String(input.to_string()));
    });
    run(dir.path(), &["fit", "--model", "fit64.st", "--predict", "t.csv"])
        .fails_with(&["the statistics list 64 standard deviations for 2 features"]);
}
