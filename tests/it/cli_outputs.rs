//! What `train` and `mnist` write, and when, through the binary on the CPU: a model saved after every
//! kept epoch, never replaced by a worse one, never written over an input or to a place found unusable
//! only after training, kept when stdout closes or Ctrl-C stops the run; and `train --resume`.

use crate::common::text::{shakespeare, train_args, train_until_ctrl_c};
use crate::common::{text, textnet, textnet_without_reader};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use textnet::text::modelfile::TextModel;

/// Runs textnet expecting exit status 1 and one line on stderr containing `expected`; returns stdout.
fn fails<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S], expected: &str) -> String {
    let out = textnet(args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?} should fail; stderr: {stderr}");
    assert!(stderr.starts_with("textnet: error: ") && stderr.trim_end().lines().count() == 1, "{args:?}: {stderr}");
    assert!(stderr.contains(expected), "{args:?}: {stderr:?} lacks {expected:?}");
    text(&out.stdout)
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}\n{}", text(&out.stdout), text(&out.stderr)))
}

fn val_losses(summary: &serde_json::Value) -> Vec<f64> {
    summary["epochs"].as_array().unwrap().iter().map(|e| e["val_loss"].as_f64().unwrap()).collect()
}

fn argmin(values: &[f64]) -> usize {
    (0..values.len()).min_by(|&a, &b| values[a].total_cmp(&values[b])).unwrap() + 1
}

#[test]
fn a_diverged_or_worse_run_leaves_a_good_model_alone() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("keep.safetensors");
    assert!(textnet(&train_args(&shakespeare(), &model, &["--epochs", "2"])).status.success());
    let good = std::fs::read(&model).unwrap();

    let stdout =
        fails(&train_args(&shakespeare(), &model, &["--lr", "1e30", "--json", "--quiet"]), "diverged in epoch 1");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&stdout).unwrap()["status"], "diverged");
    assert_eq!(std::fs::read(&model).unwrap(), good, "a diverged run replaced the model");

    let stdout = fails(
        &train_args(&shakespeare(), &model, &["--lr", "1e-6", "--epochs", "1", "--json", "--quiet"]),
        "unchanged",
    );
    let summary: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((summary["status"].as_str(), summary["kept_epoch"].as_null()), (Some("not_better"), Some(())));
    assert!(summary["baseline_val_loss"].as_f64().unwrap() < val_losses(&summary)[0]);
    assert_eq!(std::fs::read(&model).unwrap(), good, "a worse run replaced the model");
}

#[test]
fn keep_best_holds_the_epoch_of_lowest_val_loss() {
    let dir = tempfile::tempdir().unwrap();
    let (best, last, again) = (dir.path().join("best"), dir.path().join("last"), dir.path().join("again"));
    // A high rate on a small slice overfits, so the validation loss goes up again.
    let flags = ["--lr", "0.3", "--max-tokens", "4000", "--epochs", "6", "--json"];
    let summary = json(&textnet(&train_args(&shakespeare(), &best, &flags)));
    let losses = val_losses(&summary);
    let kept = argmin(&losses);
    assert_eq!(summary["kept_epoch"], kept, "{losses:?}");
    assert!(kept < 6, "the run did not overfit, so the test proves nothing: {losses:?}");
    let summary = json(&textnet(&train_args(&shakespeare(), &last, &[&flags[..], &["--keep", "last"]].concat())));
    assert_eq!(summary["kept_epoch"], 6);
    // The kept file is that epoch's model: a run stopped there writes the same parameters.
    let mut short = flags.to_vec();
    let epochs = kept.to_string();
    short[5] = &epochs;
    assert!(textnet(&train_args(&shakespeare(), &again, &short)).status.success());
    let load = |path: &Path| TextModel::load(path).unwrap();
    assert!(load(&best) == load(&again), "the file does not hold epoch {kept}");
    assert!(load(&best) != load(&last));
}

#[test]
fn out_that_is_an_input_or_cannot_be_written_fails_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.txt");
    std::fs::copy(shakespeare(), &corpus).unwrap();
    let original = std::fs::read(&corpus).unwrap();
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let long = dir.path().join("x".repeat(256));
    let link = dir.path().join("link.txt");
    std::os::unix::fs::symlink(&corpus, &link).unwrap();
    let cases: [(PathBuf, &str); 8] = [
        (corpus.clone(), "is the corpus"),
        (link, "is the corpus"),
        ("/dev/null".into(), "not a regular file"),
        (fifo, "not a regular file"),
        (file.join("m.safetensors"), "cannot create directory"),
        (PathBuf::from(format!("{}/", dir.path().join("new").display())), "is a directory name"),
        (long, "256 bytes long"),
        ("/sys/m.safetensors".into(), "cannot write in /sys"),
    ];
    for (out, expected) in cases {
        let stdout = fails(&train_args(&corpus, &out, &[]), expected);
        assert!(!stdout.contains("epoch"), "{out:?}: the run trained first:\n{stdout}");
    }
    assert_eq!(std::fs::read(&corpus).unwrap(), original);

    // Anything at --out that is not a text model is kept too.
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, b"my notes").unwrap();
    fails(&train_args(&corpus, &notes, &[]), "not a textnet text model");
    assert_eq!(std::fs::read(&notes).unwrap(), b"my notes");
}

#[test]
fn long_names_stale_temporaries_and_file_modes() {
    let dir = tempfile::tempdir().unwrap();
    // 250 bytes: the name fits, its temporary name must too.
    let model = dir.path().join(format!("{}.safetensors", "m".repeat(238)));
    // The temporary name keeps 218 bytes of the name, room for `.tmp-PID.CALL` at their longest.
    let stale = dir.path().join(format!(".{}.tmp-4294967295.0", "m".repeat(218)));
    std::fs::write(&stale, b"left by an interrupted save").unwrap();
    let out = textnet(&train_args(&shakespeare(), &model, &["--epochs", "1"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(model.is_file() && !stale.exists());

    std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o600)).unwrap();
    let m = model.to_str().unwrap();
    let corpus = shakespeare();
    let resumed = textnet(&[
        "train",
        corpus.to_str().unwrap(),
        "--out",
        m,
        "--resume",
        m,
        "--device",
        "cpu",
        "--max-tokens",
        "20000",
        "--epochs",
        "1",
    ]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert!(text(&resumed.stdout).contains("holds epoch 1"), "{}", text(&resumed.stdout));
    assert_eq!(std::fs::metadata(&model).unwrap().permissions().mode() & 0o777, 0o600);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != model.file_name().unwrap())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_closed_stdout_keeps_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    let mut child = Command::new(env!("CARGO_BIN_EXE_textnet"))
        .args(train_args(&shakespeare(), &model, &["--epochs", "3"]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.unwrap().starts_with("epoch 1/3")));
    drop(lines);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
    assert!(TextModel::load(&model).is_ok());

    // `predict … | head -0`: the reader is gone before the first line.
    let out = textnet_without_reader(&["predict", "--model", model.to_str().unwrap(), "--context", "to be or"]);
    assert_eq!((out.status.code(), text(&out.stderr).as_str()), (Some(0), ""));

    let mnist = dir.path().join("mnist.safetensors");
    let mut child = Command::new(env!("CARGO_BIN_EXE_textnet"))
        .args(["mnist", "--dataset", "fashion", "--device", "cpu", "--train-limit", "1000", "--hidden", "16"])
        .args(["--epochs", "2", "--json", "--out", mnist.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(mnist.is_file());
}

#[test]
fn ctrl_c_stops_after_the_epoch_is_saved() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    let (out, rest) = train_until_ctrl_c(&model, &["--keep", "last"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    let last = stderr.lines().last().unwrap();
    assert!(last.starts_with("textnet: error: interrupted after epoch") && last.contains("holds epoch"), "{stderr}");
    let epochs = rest.iter().filter(|l| l.starts_with("epoch ")).count();
    assert!(epochs <= 2, "it went on training: {rest:?}");
    assert!(TextModel::load(&model).is_ok());
}

#[test]
fn resume_continues_a_saved_model() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.safetensors");
    let summary = json(&textnet(&train_args(&shakespeare(), &first, &["--epochs", "1", "--json"])));
    let first_loss = val_losses(&summary)[0];

    let next = dir.path().join("next.safetensors");
    let resume = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["train", shakespeare().to_str().unwrap(), "--out", next.to_str().unwrap()]
            .into_iter()
            .chain(["--resume", first.to_str().unwrap(), "--device", "cpu", "--max-tokens", "20000", "--json"])
            .map(String::from)
            .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let summary = json(&textnet(&resume(&["--epochs", "1"])));
    assert_eq!(summary["status"], "ok");
    // The model's vocabulary and shape, not the defaults (8192 entries, embed 64).
    assert_eq!((summary["data"]["vocab_size"].as_u64(), summary["config"]["embed"].as_u64()), (Some(300), Some(8)));
    let baseline = summary["baseline_val_loss"].as_f64().unwrap();
    assert!((baseline - first_loss).abs() < 1e-9, "{baseline} vs {first_loss}");
    assert!(val_losses(&summary)[0] < first_loss);
    assert_eq!(TextModel::load(&next).unwrap().vocab, TextModel::load(&first).unwrap().vocab);

    let mnist = dir.path().join("mnist.safetensors");
    let o = textnet(
        &["mnist", "--dataset", "fashion", "--device", "cpu", "--train-limit", "500", "--hidden", "8"]
            .into_iter()
            .chain(["--epochs", "1", "--quiet", "--out", mnist.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let mut args = resume(&[]);
    args[5] = mnist.to_str().unwrap().to_string();
    fails(&args, "it is an MNIST MLP classifier");
    // The shape comes from the model: clap refuses the flags that would change it.
    for flag in [["--embed", "16"], ["--context", "4"], ["--max-vocab", "50"]] {
        let o = textnet(&resume(&flag));
        assert_eq!(o.status.code(), Some(2), "{flag:?}");
        assert!(text(&o.stderr).contains("cannot be used with"), "{}", text(&o.stderr));
    }
}

/// `mnist` on a slice of Fashion-MNIST, writing `out`, then `extra`.
fn mnist(out: &Path, extra: &[&str]) -> Output {
    let base = ["mnist", "--dataset", "fashion", "--device", "cpu", "--train-limit", "2000", "--hidden", "16"];
    textnet(&[&base[..], &["--json", "--quiet", "--out", out.to_str().unwrap()], extra].concat())
}

#[test]
fn mnist_keeps_best_only_with_a_validation_split() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    fails(&["mnist", "--dataset", "fashion", "--device", "cpu", "--keep", "best"], "needs --val-split");
    for bad in ["0", "1", "-0.1", "nan"] {
        fails(&["mnist", "--dataset", "fashion", "--device", "cpu", "--val-split", bad], "--val-split");
    }

    let o = mnist(&model, &["--epochs", "2"]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((report["config"]["keep"].as_str(), report["kept_epoch"].as_u64()), (Some("last"), Some(2)));

    // Adam at a high rate overfits 1600 images quickly, so later epochs validate worse.
    let o = mnist(&model, &["--epochs", "5", "--val-split", "0.2", "--keep", "best", "--lr", "0.02"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let data = &report["data"];
    assert_eq!((data["train_samples"].as_u64(), data["val_samples"].as_u64()), (Some(1600), Some(400)));
    let losses: Vec<f64> =
        report["epochs"].as_array().unwrap().iter().map(|e| e["val_loss"].as_f64().unwrap()).collect();
    let kept = argmin(&losses);
    assert_eq!(report["kept_epoch"], kept, "{losses:?}");
    let kept_test = report["epochs"][kept - 1]["test_accuracy"].as_f64().unwrap();
    assert_eq!(report["final"]["test_accuracy"].as_f64().unwrap(), kept_test, "the final figures are the kept epoch's");
    let good = std::fs::read(&model).unwrap();

    // A later run that diverges or ends worse on the same validation images leaves the file alone (at
    // lr 1e-6 the model stays at chance level, which is never written).
    let o = mnist(&model, &["--epochs", "1", "--val-split", "0.2", "--lr", "1e-6"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("unchanged"), "{}", text(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let baseline = report["baseline_val_loss"].as_f64();
    assert_eq!((report["status"].as_str(), baseline), (Some("not_learned"), Some(losses[kept - 1])));
    let o = mnist(&model, &["--epochs", "1", "--val-split", "0.2", "--lr", "1e30"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("diverged"), "{}", text(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((report["status"].as_str(), &report["diverged"]["epoch"]), (Some("diverged"), &serde_json::json!(1)));
    assert_eq!((report["kept_epoch"].as_null(), report["final"].as_null()), (Some(()), Some(())));
    assert_eq!(std::fs::read(&model).unwrap(), good);
}

#[test]
fn mnist_out_that_is_a_data_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = Path::new("/usr/share/datasets/fashion-mnist");
    for name in [
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ] {
        std::fs::copy(data.join(name), dir.path().join(name)).unwrap();
    }
    let labels = dir.path().join("train-labels-idx1-ubyte.gz");
    let original = std::fs::read(&labels).unwrap();
    let args = ["mnist", "--data", dir.path().to_str().unwrap(), "--device", "cpu", "--epochs", "1"];
    let stdout =
        fails(&[&args[..], &["--train-limit", "100", "--out", labels.to_str().unwrap()]].concat(), "is the data file");
    assert!(!stdout.contains("epoch"), "{stdout}");
    assert_eq!(std::fs::read(&labels).unwrap(), original);
    // A raw file there would be read instead of the .gz one next time.
    let raw = dir.path().join("train-labels-idx1-ubyte");
    fails(&[&args[..], &["--out", raw.to_str().unwrap()]].concat(), "would be read as a data file");
    assert!(!raw.exists());
    fails(&[&args[..], &["--out", "/dev/null"]].concat(), "not a regular file");
}
