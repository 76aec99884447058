//! Bad input to `sales`: the cases of the bad-input audit of 2026-11-24, each named by its ID.

use crate::common::bad_input;

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
    let mut args = vec!["sales", "ok.csv", "--out", "s.st", "--device", "cpu", "--epochs", "30", "--quiet"];
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
    let mut args = vec!["sales", "ids.csv", "--out", "s.st", "--device", "cpu", "--epochs", "30"];
    args.extend(SCHEMA);
    run_limited(dir.path(), &args, 1 << 31)
        // price, qty, 50,000 levels of cat, and the date's 5 calendar features.
        .fails_with(&["50000 rows × 50007 features: this run needs about", "\"cat\" alone has 50000 levels"]);
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
    // P122: nor the table it reads.
    let args = ["sales", "--model", "s.st", "--predict", "ok.csv", "--predictions", "ok.csv"];
    run(dir.path(), &args).fails_with(&["--predictions ok.csv is the table ok.csv"]);
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
        "--ignore",
        "qty,cat,date",
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
    train("open.csv").fails_with(&["open.csv:2: a quoted field (\"…) opens here and is never closed"]);
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
    let mut args = vec!["sales", "-", "--out", "x.st", "--device", "cpu", "--epochs", "30", "--quiet"];
    args.extend(SCHEMA);
    let mut command = textnet(dir.path(), &args);
    command.stdin(std::fs::File::open(dir.path().join("ok.csv")).unwrap());
    run_for(command, Duration::from_secs(60)).succeeds();
    assert!(dir.path().join("x.st").exists());
}

/// A quote inside an unquoted field (an inch mark) is text, not a quoted field left open.
#[test]
fn d040_a_quote_inside_a_field_is_text() {
    let dir = tempfile::tempdir().unwrap();
    let item = |i: usize| if i == 0 { "Monitor 27\"" } else { ["Desk", "Lamp"][i % 2] };
    let rows: String = (0..40).map(|i| format!("{},{},{},{}\n", i % 9, i % 4, item(i), i % 9 * (i % 4))).collect();
    std::fs::write(dir.path().join("inch.csv"), format!("price,qty,item,total\n{rows}")).unwrap();
    let args = ["sales", "inch.csv", "--target", "total", "--numeric", "price,qty", "--categorical", "item"];
    run(dir.path(), &[&args[..], &["--out", "s.st", "--device", "cpu", "--epochs", "30", "--quiet"]].concat())
        .succeeds();
}

#[test]
fn d054_a_negative_split_reaches_its_own_check() {
    let dir = trained();
    let mut args = vec!["sales", "ok.csv", "--out", "x.st", "--device", "cpu", "--split", "-0.5"];
    args.extend(SCHEMA);
    run(dir.path(), &args).fails_with(&["--split must be between 0 and 1 (exclusive), got -0.5"]);
}

/// W016: predictions that cannot be written to standard output (a full disk) fail the command.
#[test]
fn w016_predictions_lost_on_a_full_stdout_fail_the_command() {
    let dir = trained();
    let mut command = textnet(dir.path(), &["sales", "--model", "s.st", "--predict", "ok.csv"]);
    command.stdout(std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap());
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains("cannot write to standard output: No space left on device"), "stderr: {stderr}");
}

/// S010: Ctrl-C stops the run after the epoch, writes the model and exits with 130.
#[test]
fn s010_ctrl_c_stops_after_the_epoch_and_saves() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big.csv"), table(2000)).unwrap();
    let mut args = vec!["sales", "big.csv", "--out", "s.st", "--device", "cpu", "--epochs", "1000000"];
    args.extend(SCHEMA);
    let mut command = textnet(dir.path(), &args);
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("epoch 1/") {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "no epoch line");
    }
    // SAFETY: kill sends a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) }, 0);
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("still running 30 s after Ctrl-C");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(130), "stderr: {stderr}");
    assert!(stderr.contains("textnet: error: interrupted after epoch"), "stderr: {stderr}");
    assert!(stderr.contains("s.st holds the trained model"), "stderr: {stderr}");
    run(dir.path(), &["sales", "--model", "s.st", "--predict", "big.csv"]).succeeds();
}

/// D040: a field is left open only by a quote that starts it; `""` inside a quoted field is a quote.
#[test]
fn d040_only_a_quote_that_opens_a_field_can_be_left_open() {
    use textnet::sales::table::{ColumnSpec, LoadOptions, Schema, Table};
    let spec = |s: &str| ColumnSpec::parse(s).unwrap();
    let schema = Schema {
        target: spec("total"),
        numeric: vec![spec("qty")],
        categorical: vec![spec("item")],
        date: vec![],
        date_features: None,
        column_names: None,
    };
    let parse = |text: &str| Table::parse("t.csv", text.as_bytes(), &LoadOptions::new(schema.clone()));
    let header = "qty,item,total\n";
    assert!(parse(&format!("{header}1,\"a \"\"27\"\"\"\" b\",2\n3,c,4\n")).is_ok());
    assert!(parse(&format!("{header}1,27\" a,2\n3,c,4\n")).is_ok());
    let open = parse(&format!("{header}1,a,2\n3,\"c,4\n5,d,6\n")).unwrap_err().to_string();
    assert!(open.contains("t.csv:3: a quoted field"), "{open}");
}
