//! Bad input to `sales`: the cases of the bad-input audit of 2026-11-24, each named by its ID.

mod bad_input;

use bad_input::{bytes, run, run_for, run_limited, textnet};
use std::path::Path;
use std::time::Duration;

/// `rows` rows of price, qty, cat, date, total (total = price × qty + noise), comma-separated.
fn table(rows: usize) -> String {
    let mut state = 11u64;
    let mut next = move |n: u64| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    let mut text = String::from("price,qty,cat,date,total\n");
    for _ in 0..rows {
        let (price, qty) = (1 + next(100), 1 + next(10));
        let cat = ["a", "b", "c"][next(3) as usize];
        let date = format!("2024-{:02}-{:02}", 1 + next(12), 1 + next(28));
        text += &format!("{price},{qty},{cat},{date},{}\n", price * qty + next(5));
    }
    text
}

const SCHEMA: [&str; 8] = ["--target", "total", "--numeric", "price,qty", "--categorical", "cat", "--date", "date"];

/// A folder with `ok.csv` and a sales model `s.st` trained on it.
fn trained() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok.csv"), table(300)).unwrap();
    let mut args = vec!["sales", "ok.csv", "--out", "s.st", "--device", "cpu", "--epochs", "5", "--quiet"];
    args.extend(SCHEMA);
    run(dir.path(), &args).succeeds();
    dir
}

/// `model` rewritten to `out` with the JSON in metadata entry `key` passed through `change`.
fn with_metadata(model: &Path, out: &Path, key: &str, change: impl FnOnce(&mut serde_json::Value)) {
    bad_input::with_metadata(model, out, |meta| {
        let mut value: serde_json::Value = serde_json::from_str(meta[key].as_str().unwrap()).unwrap();
        change(&mut value);
        meta.insert(key.into(), serde_json::Value::String(value.to_string()));
    });
}

fn mkfifo(path: &Path) {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated name it is given.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o644) }, 0);
}

#[test]
fn d045_p124_a_fifo_is_refused_at_once() {
    let dir = trained();
    mkfifo(&dir.path().join("f"));
    let mut args = vec!["sales", "f", "--out", "new.st", "--device", "cpu"];
    args.extend(SCHEMA);
    run_for(textnet(dir.path(), &args), Duration::from_secs(10)).fails_with(&["table f is not a regular file"]);
    let predict = ["sales", "--model", "s.st", "--predict", "f"];
    run_for(textnet(dir.path(), &predict), Duration::from_secs(10)).fails_with(&["table f is not a regular file"]);
}

#[test]
fn d046_a_device_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["sales", "/dev/zero", "--out", "s.st", "--device", "cpu"];
    args.extend(SCHEMA);
    run_limited(dir.path(), &args, 1 << 31).fails_with(&["table /dev/zero is not a regular file"]);
}

/// An identifier given as a categorical column: 50,000 levels, a one-hot matrix of 30 GB.
#[test]
fn d014_a_one_hot_matrix_too_large_for_memory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rows: String = (0..50_000).map(|i| format!("{},{},id{i},2024-01-01,{}\n", i % 97, i % 10, i % 977)).collect();
    std::fs::write(dir.path().join("ids.csv"), format!("price,qty,cat,date,total\n{rows}")).unwrap();
    let mut args = vec!["sales", "ids.csv", "--out", "s.st", "--device", "cpu", "--epochs", "1"];
    args.extend(SCHEMA);
    run_limited(dir.path(), &args, 1 << 31)
        .fails_with(&["one-hot features need about", "\"cat\" alone has 50000 levels"]);
    assert!(!dir.path().join("s.st").exists());
}

#[test]
fn p113_p115_vocabularies_must_match_the_schema() {
    let dir = trained();
    let model = dir.path().join("s.st");
    with_metadata(&model, &dir.path().join("extra.st"), "vocabularies", |v| {
        v.as_array_mut().unwrap().push(serde_json::json!(["x"]))
    });
    with_metadata(&model, &dir.path().join("nocat.st"), "schema", |v| v["categorical"] = serde_json::json!([]));
    for crafted in ["extra.st", "nocat.st"] {
        run(dir.path(), &["sales", "--model", crafted, "--predict", "ok.csv"])
            .fails_with(&["categorical columns but the file lists"]);
    }
}

#[test]
fn p111_p112_statistics_must_be_finite_positive_scales() {
    let dir = trained();
    let model = dir.path().join("s.st");
    with_metadata(&model, &dir.path().join("std0.st"), "stats", |v| {
        let n = v["feature_std"].as_array().unwrap().len();
        v["feature_std"] = serde_json::json!(vec![0.0; n]);
    });
    with_metadata(&model, &dir.path().join("huge.st"), "stats", |v| v["target_std"] = serde_json::json!(1e300));
    for crafted in ["std0.st", "huge.st"] {
        run(dir.path(), &["sales", "--model", crafted, "--predict", "ok.csv"])
            .fails_with(&["the statistics are not finite positive"]);
    }
}

#[test]
fn p123_predictions_never_overwrite_a_model_file() {
    let dir = trained();
    std::fs::copy(dir.path().join("s.st"), dir.path().join("precious.safetensors")).unwrap();
    let before = bytes(&dir.path().join("precious.safetensors"));
    let args = ["sales", "--model", "s.st", "--predict", "ok.csv", "--predictions", "precious.safetensors"];
    run(dir.path(), &args).fails_with(&["--predictions precious.safetensors holds a model file"]);
    assert_eq!(bytes(&dir.path().join("precious.safetensors")), before);
    let args = ["sales", "--model", "s.st", "--predict", "ok.csv", "--predictions", "s.st"];
    run(dir.path(), &args).fails_with(&["--predictions s.st is the model s.st"]);
}

#[test]
fn a_sales_model_of_other_features_at_out_is_kept_unless_overwrite() {
    let dir = trained();
    let before = bytes(&dir.path().join("s.st"));
    let args = [
        "sales",
        "ok.csv",
        "--out",
        "s.st",
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--target",
        "total",
        "--numeric",
        "price",
    ];
    run(dir.path(), &args).fails_with(&["holds a sales model of other features", "--overwrite"]);
    assert_eq!(bytes(&dir.path().join("s.st")), before);
    run(dir.path(), &[&args[..], &["--overwrite", "--quiet"]].concat()).succeeds();
}

#[test]
fn d023_d040_d041_p109_tables_that_cannot_be_read_say_why() {
    let dir = trained();
    let write = |name: &str, text: &[u8]| std::fs::write(dir.path().join(name), text).unwrap();
    write("semi.csv", b"price;qty;total\n1,5;2;3\n2,5;3;8\n");
    write("open.csv", b"price,qty,total\n1,2,\"3\n4,5,6\n");
    let utf16: Vec<u8> = "\u{feff}price,qty,total\n1,2,3\n".encode_utf16().flat_map(u16::to_le_bytes).collect();
    write("utf16.csv", &utf16);
    write("tabs.tsv", table(20).replace(',', "\t").as_bytes());
    let train =
        |file: &str| run(dir.path(), &["sales", file, "--target", "total", "--numeric", "price,qty", "--out", "x.st"]);
    train("semi.csv").fails_with(&["semicolon-separated tables are not read"]);
    train("open.csv").fails_with(&["a quoted field (\"…) is never closed"]);
    train("utf16.csv").fails_with(&["is not UTF-8 text", "convert it to UTF-8"]);
    run(dir.path(), &["sales", "--model", "s.st", "--predict", "tabs.tsv"])
        .fails_with(&["the model reads comma-separated rows", "tab-separated"]);
}

#[test]
fn d083_without_target_the_default_schema_is_named() {
    let dir = trained();
    run(dir.path(), &["sales", "ok.csv", "--out", "x.st"])
        .fails_with(&["without --target the 10-column sales.tsv schema is assumed"]);
}

#[test]
fn d049_the_table_can_come_from_standard_input() {
    let dir = trained();
    let mut args = vec!["sales", "-", "--out", "x.st", "--device", "cpu", "--epochs", "2", "--quiet"];
    args.extend(SCHEMA);
    let mut command = textnet(dir.path(), &args);
    command.stdin(std::fs::File::open(dir.path().join("ok.csv")).unwrap());
    run_for(command, Duration::from_secs(60)).succeeds();
    assert!(dir.path().join("x.st").exists());
}
