//! `textnet sales` on tables as people write them: the schema inferred from `--target` alone (and
//! overridden per column), dates in every accepted form with their calendar features, a CSV quoted as
//! the King County house-sales table is (invented rows), the best epoch by validation rows, predicting
//! rows without a target, and `--resume`.

use crate::common::{fails_with, report, s, stderr, stdout, textnet};
use std::path::{Path, PathBuf};

/// A small deterministic generator of invented values.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Header and rows quoted as in kc_house_data.csv (quoted id, date and some numbers, unquoted others;
/// dates as 20141013T000000); every value invented. `price` is a function of the other columns.
fn house_sales(rows: usize, seed: u64) -> String {
    let mut r = Lcg(seed);
    let mut text = String::from(
        "\"id\",\"date\",\"price\",\"bedrooms\",\"bathrooms\",\"sqft_living\",\"floors\",\"waterfront\",\"zipcode\",\"lat\"\n",
    );
    for i in 0..rows {
        let id = 1_000_000_000 + 7919 * i as u64 + r.next(7000);
        let (month, day) = (1 + r.next(12), 1 + r.next(28));
        let year = 2014 + (month < 6) as u64;
        let bedrooms = 1 + r.next(5);
        let bathrooms = ["1", "1.5", "2", "2.25", "3"][r.next(5) as usize];
        let sqft = 600 + 10 * r.next(300);
        let floors = ["1", "2", "1.5"][r.next(3) as usize];
        let waterfront = (r.next(10) == 0) as u64;
        let zipcode = 98001 + r.next(4);
        let lat = 47.2 + r.next(5000) as f64 / 10_000.0;
        let price = 50_000 + 150 * sqft + 10_000 * bedrooms + 200_000 * waterfront + 1000 * (zipcode - 98001);
        text += &format!(
            "\"{id}\",\"{year}{month:02}{day:02}T000000\",{price},\"{bedrooms}\",\"{bathrooms}\",{sqft},\"{floors}\",{waterfront},\"{zipcode}\",{lat:.4}\n"
        );
    }
    text
}

fn train_args<'a>(table: &'a Path, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    [&["sales", s(table), "--device", "cpu", "--out", s(out)][..], extra].concat()
}

#[test]
fn the_target_alone_is_enough_and_each_column_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let table = write(dir.path(), "kc.csv", &house_sales(300, 3));
    let out = dir.path().join("kc.safetensors");
    let o = textnet(&train_args(&table, &out, &["--target", "price", "--epochs", "40", "--json"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for line in [
        "  id: ignored (an identifier: named id)",
        "  date: date (every value reads as a date, none with a time of day)",
        "  price: target (--target)",
        "  bedrooms: numeric (every value is a number)",
        "  bathrooms: numeric (every value is a number)",
        "  zipcode: numeric (every value is a number)",
        "  lat: numeric (every value is a number)",
    ] {
        assert!(err.lines().any(|l| l == line), "no line {line:?} in:\n{err}");
    }
    let r = report(&o);
    let features: Vec<&str> = r["data"]["features"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    assert!(!features.iter().any(|f| f.starts_with("id")), "{features:?}");
    assert!(features.contains(&"date (year)") && features.contains(&"date (day of week sin)"), "{features:?}");
    assert!(!features.iter().any(|f| f.contains("hour")), "midnight only: {features:?}");
    let mae = r["final"]["test_mae"].as_f64().unwrap();
    let baseline = r["final"]["baseline_mae"].as_f64().unwrap();
    assert!(mae < 0.5 * baseline, "test MAE {mae} against baseline {baseline}");

    // Overrides per column, and silence with --quiet.
    let o = textnet(&train_args(
        &table,
        &out,
        &["--target", "price", "--epochs", "30", "--overwrite", "--categorical", "bedrooms", "--ignore", "zipcode,lat"],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("  bedrooms: categorical (--categorical)"), "{text}");
    assert!(text.contains("  zipcode: ignored (--ignore)") && text.contains("  lat: ignored (--ignore)"), "{text}");
    let quiet = textnet(&train_args(&table, &out, &["--target", "price", "--epochs", "30", "--overwrite", "--quiet"]));
    assert!(quiet.status.success(), "{}", stderr(&quiet));
    assert_eq!(stdout(&quiet) + &stderr(&quiet), "");
}

#[test]
fn identifiers_and_text_columns_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from(",order,row,kind,note,qty,total\n");
    for i in 0..60 {
        let kind = ["box", "bag", "crate"][i % 3];
        let row = 100 + (i * 7) % 60;
        text += &format!("{i},A-{:04},{row},{kind},\"free text {i}\",{},{}\n", 7 * i + 3, 1 + i % 4, (1 + i % 4) * 10);
    }
    let table = write(dir.path(), "t.csv", &text);
    let out = dir.path().join("t.safetensors");
    let o = textnet(&train_args(&table, &out, &["--target", "total", "--epochs", "30"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for line in [
        "  column 1: ignored (an identifier: the column has no name)",
        "  order: ignored (an identifier: every value is different)",
        "  row: ignored (an identifier: consecutive whole numbers, each once)",
        "  kind: categorical (3 distinct values)",
        "  note: ignored (an identifier: every value is different)",
        "  qty: numeric (every value is a number)",
    ] {
        assert!(text.lines().any(|l| l == line), "no line {line:?} in:\n{text}");
    }
    // Overriding the inference of a column the table cannot hold as asked is a one-line error.
    fails_with(&textnet(&train_args(&table, &out, &["--target", "total", "--numeric", "kind"])), &["t.csv:2:4"]);
}

#[test]
fn every_date_form_reads_and_gives_calendar_features() {
    let dir = tempfile::tempdir().unwrap();
    // (name, the date of month, day and hour, whether the column has times of day other than midnight)
    type Form = fn(u32, u32, u32) -> String;
    let forms: [(&str, Form, bool); 8] = [
        ("iso", |m, d, _| format!("2014-{m:02}-{d:02}"), false),
        ("iso-midnight", |m, d, _| format!("2014-{m:02}-{d:02}T00:00:00"), false),
        ("iso-minutes", |m, d, h| format!("2014-{m:02}-{d:02} {h:02}:08"), true),
        ("basic-time", |m, d, _| format!("2014{m:02}{d:02}T000000"), false),
        ("basic", |m, d, _| format!("2014{m:02}{d:02}"), false),
        ("zone", |m, d, h| format!("2014-{m:02}-{d:02}T{h:02}:08:00+02:00"), true),
        ("day-first", |m, d, _| format!("{d:02}/{m:02}/2014"), false),
        ("month-first", |m, d, _| format!("{m:02}/{d:02}/2014"), false),
    ];
    for (name, form, times) in forms {
        let mut text = String::from("when,x,y\n");
        for i in 0..80u32 {
            let (m, d, h) = (1 + i % 12, 1 + (i * 7) % 28, (i * 5) % 24);
            text += &format!("{},{},{}\n", form(m, d, h), i % 9, m * 10 + i % 9);
        }
        let table = write(dir.path(), &format!("{name}.csv"), &text);
        let out = dir.path().join(format!("{name}.safetensors"));
        let o = textnet(&train_args(&table, &out, &["--target", "y", "--epochs", "30", "--json"]));
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let kind = if times { "some with a time of day" } else { "none with a time of day" };
        assert!(
            stderr(&o).contains(&format!("  when: date (every value reads as a date, {kind})")),
            "{name}: {}",
            stderr(&o)
        );
        let r = report(&o);
        let features: Vec<&str> =
            r["data"]["features"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
        let mut want = vec![
            "x",
            "when (year)",
            "when (day of year sin)",
            "when (day of year cos)",
            "when (day of week sin)",
            "when (day of week cos)",
        ];
        if times {
            want.extend(["when (hour sin)", "when (hour cos)"]);
        }
        assert_eq!(features, want, "{name}");
        // The model reads the same form when it predicts.
        let p = textnet(&["sales", "--model", s(&out), "--predict", s(&table)]);
        assert!(p.status.success(), "{name}: {}", stderr(&p));
    }
}

#[test]
fn keep_best_chooses_by_validation_rows() {
    let dir = tempfile::tempdir().unwrap();
    let table = write(dir.path(), "kc.csv", &house_sales(200, 5));
    let out = dir.path().join("m.safetensors");
    fails_with(
        &textnet(&train_args(&table, &out, &["--target", "price", "--keep", "best"])),
        &["--keep best needs --val-split"],
    );
    fails_with(
        &textnet(&train_args(&table, &out, &["--target", "price", "--val-split", "1.5"])),
        &["--val-split must be a fraction between 0 and 1"],
    );
    let o = textnet(&train_args(
        &table,
        &out,
        &["--target", "price", "--val-split", "0.25", "--keep", "best", "--epochs", "8", "--lr", "0.05", "--json"],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let r = report(&o);
    assert_eq!(r["config"]["keep"], "best");
    assert_eq!((r["data"]["train_samples"].as_u64(), r["data"]["val_samples"].as_u64()), (Some(120), Some(40)));
    assert_eq!(r["data"]["test_samples"], 40);
    let epochs = r["epochs"].as_array().unwrap();
    let val: Vec<f64> = epochs.iter().map(|e| e["val_mae"].as_f64().unwrap()).collect();
    let best = (0..val.len()).min_by(|&a, &b| val[a].total_cmp(&val[b])).unwrap() + 1;
    assert_eq!(r["kept_epoch"].as_u64(), Some(best as u64), "val MAE by epoch {val:?}");
    assert_eq!(r["final"]["test_mae"], epochs[best - 1]["test_mae"]);
    assert!(stderr(&o).contains(&format!("holds epoch {best}")), "{}", stderr(&o));
}

#[test]
fn predict_needs_no_target_and_reports_the_mae_when_there_is_one() {
    let dir = tempfile::tempdir().unwrap();
    let table = write(dir.path(), "kc.csv", &house_sales(300, 7));
    let out = dir.path().join("m.safetensors");
    let o = textnet(&train_args(&table, &out, &["--target", "price", "--epochs", "20", "--quiet"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let new = house_sales(20, 8);
    let predict = |file: &Path| textnet(&["sales", "--model", s(&out), "--predict", s(file)]);
    let predictions = |o: &std::process::Output| -> Vec<String> {
        assert!(o.status.success(), "{}", stderr(o));
        stdout(o).lines().skip(1).map(|l| l.split('\t').nth(1).unwrap().to_string()).collect()
    };

    // With the target: predictions, and the MAE on stderr.
    let with = predict(&write(dir.path(), "with.csv", &new));
    assert!(stderr(&with).contains("MAE over 20 rows with a price: "), "{}", stderr(&with));
    let want = predictions(&with);
    assert_eq!(want.len(), 20);

    // The price column left out, or left empty: the same predictions, no MAE.
    let without: String = new
        .lines()
        .map(|l| {
            let mut fields: Vec<&str> = l.split(',').collect();
            fields.remove(2);
            fields.join(",") + "\n"
        })
        .collect();
    let o = predict(&write(dir.path(), "without.csv", &without));
    assert_eq!(predictions(&o), want);
    assert!(!stderr(&o).contains("MAE"), "{}", stderr(&o));
    let empty: String = new
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let mut fields: Vec<&str> = l.split(',').collect();
            if i > 0 {
                fields[2] = "";
            }
            fields.join(",") + "\n"
        })
        .collect();
    let o = predict(&write(dir.path(), "empty.csv", &empty));
    assert_eq!(predictions(&o), want);
    assert!(!stderr(&o).contains("MAE"), "{}", stderr(&o));

    // Another number of columns is refused, naming the counts.
    let short: String = new.lines().map(|l| l.rsplitn(3, ',').nth(2).unwrap().to_string() + "\n").collect();
    fails_with(&predict(&write(dir.path(), "short.csv", &short)), &["short.csv has 8 columns", "10"]);
}

#[test]
fn predict_does_not_ask_for_the_training_file() {
    let help = stdout(&textnet(&["sales", "--help"]));
    assert!(help.contains("textnet sales --model <M> --predict <NEW>"), "{help}");
    let o = textnet(&["sales", "--predict", "new.csv"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let missing = err.split("(usage:").next().unwrap();
    assert!(missing.contains("--model <M>") && !missing.contains("<FILE>"), "{err}");
}

#[test]
fn resume_goes_on_from_the_model_and_refuses_another_table() {
    let dir = tempfile::tempdir().unwrap();
    let table = write(dir.path(), "kc.csv", &house_sales(300, 9));
    let first = dir.path().join("first.safetensors");
    let o = textnet(&train_args(&table, &first, &["--target", "price", "--epochs", "30", "--json"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let first_mae = report(&o)["final"]["test_mae"].as_f64().unwrap();

    let more = dir.path().join("more.safetensors");
    let o = textnet(&train_args(&table, &more, &["--resume", s(&first), "--epochs", "10", "--json"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let r = report(&o);
    assert_eq!(r["config"]["resume"], s(&first));
    let mae = r["final"]["test_mae"].as_f64().unwrap();
    assert!(mae < first_mae, "resumed MAE {mae}, first {first_mae}");
    assert!(stderr(&o).contains(&format!("--resume {}: test MAE {first_mae:.4}", s(&first))), "{}", stderr(&o));
    let a = textnet::sales::modelfile::load(&first).unwrap();
    let b = textnet::sales::modelfile::load(&more).unwrap();
    assert_eq!((a.schema, a.stats, a.feature_names), (b.schema, b.stats, b.feature_names));

    // Resumed into itself: a worse run leaves it alone.
    let before = std::fs::read(&more).unwrap();
    let o = textnet(&train_args(&table, &more, &["--resume", s(&more), "--epochs", "1", "--lr", "1"]));
    if !o.status.success() {
        assert_eq!(std::fs::read(&more).unwrap(), before);
    }

    // A table of other columns, and flags that would change the schema.
    let other = write(dir.path(), "other.csv", "a,price\n1,2\n3,4\n5,6\n");
    fails_with(&textnet(&train_args(&other, &more, &["--resume", s(&first)])), &["--resume", "does not match"]);
    let o = textnet(&train_args(&table, &more, &["--resume", s(&first), "--target", "price"]));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}
