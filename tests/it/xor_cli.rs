//! `textnet xor` end to end on the CPU: what it learns and prints, the model file, and one-line errors.

use crate::common::{fails_with, report, stderr, stdout, textnet};
use safetensors::SafeTensors;
use std::path::Path;
use std::process::{Command, Output};
use textnet::ops::activations::Activation;
use textnet::xor::model::{self, INPUTS, TARGETS, XorParams};
use textnet::xor::modelfile;

/// `xor --device cpu --out OUT` with `extra` flags.
fn xor(out: &Path, extra: &[&str]) -> Output {
    textnet(&[&["xor", "--device", "cpu", "--out", out.to_str().unwrap()], extra].concat())
}

#[test]
fn default_run_learns_xor_and_writes_what_it_reports() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("xor.safetensors");
    let o = xor(&out, &["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = report(&o);
    assert_eq!((r["command"].as_str(), r["status"].as_str()), (Some("xor"), Some("ok")));
    assert_eq!(r["kept_epoch"], 5000);
    assert_eq!(r["parameters"], 17);
    let epochs: Vec<u64> = r["epochs"].as_array().unwrap().iter().map(|row| row["epoch"].as_u64().unwrap()).collect();
    assert_eq!(epochs, (0..10).map(|i| i * 500 + 1).collect::<Vec<_>>());

    let final_loss = r["final"]["loss"].as_f64().unwrap();
    assert!(final_loss < 0.01, "{final_loss}");
    let predictions: Vec<f32> =
        r["final"]["predictions"].as_array().unwrap().iter().map(|y| y.as_f64().unwrap() as f32).collect();
    for ((y, t), x) in predictions.iter().zip(TARGETS).zip(INPUTS) {
        assert_eq!(*y > 0.5, t > 0.5, "{x:?}: prediction {y}, target {t}");
    }
    assert_eq!(r["final"]["correct"], true);

    // The file holds what the CPU reference trains from the same start, in PyTorch's layouts.
    let loaded = modelfile::load(&out).unwrap();
    let mut want = XorParams::init(4, Activation::Sigmoid, 1);
    let losses = model::train(&mut want, &[0.5; 5000], 500);
    assert_eq!(loaded, want);
    let reported: Vec<f32> =
        r["epochs"].as_array().unwrap().iter().map(|row| row["train_loss"].as_f64().unwrap() as f32).collect();
    assert_eq!(reported, losses);
    assert_eq!(model::loss_and_grads(&loaded).0, final_loss as f32);
    for (k, x) in INPUTS.iter().enumerate() {
        assert_eq!(model::predict(&loaded, *x), predictions[k]);
    }
    let bytes = std::fs::read(&out).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    for (name, shape) in [("w1", vec![4, 2]), ("b1", vec![4]), ("w2", vec![1, 4]), ("b2", vec![1])] {
        assert_eq!(file.tensor(name).unwrap().shape(), shape.as_slice(), "{name}");
    }
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().clone().unwrap();
    assert_eq!(
        (meta["format"].as_str(), meta["activation"].as_str(), meta["hidden"].as_str()),
        ("textnet-xor", "sigmoid", "4")
    );
}

/// A run of 400 epochs (XOR is not learned yet: the loss still moves), the loss recorded every 20, under
/// `--lr-schedule`/`--warmup` (`flags`): its JSON report, and the losses it recorded.
fn scheduled_run(dir: &Path, name: &str, flags: &[&str]) -> (serde_json::Value, Vec<f32>) {
    let run = ["--epochs", "400", "--log-every", "20", "--json", "--quiet"];
    let o = xor(&dir.join(name), &[&run[..], flags].concat());
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", stderr(&o));
    let r = report(&o);
    let losses = r["epochs"].as_array().unwrap().iter().map(|row| row["train_loss"].as_f64().unwrap() as f32).collect();
    (r, losses)
}

#[test]
fn the_learning_rate_schedule_is_the_reference_s_epoch_by_epoch() {
    use textnet::ops::optim::{LrSchedule, LrScheduleKind};
    let dir = tempfile::tempdir().unwrap();
    let reference = |schedule: LrSchedule| {
        let mut params = XorParams::init(4, Activation::Sigmoid, 1);
        model::train(&mut params, &schedule.rates(0.5, 400), 20)
    };
    let (_, constant) = scheduled_run(dir.path(), "constant.safetensors", &[]);
    assert_eq!(constant, reference(LrSchedule::default()));
    for (flags, kind, warmup, min_lr) in [
        (&["--lr-schedule", "cosine", "--min-lr", "0"][..], LrScheduleKind::Cosine, 0, 0.0),
        (&["--lr-schedule", "cosine", "--warmup", "100", "--min-lr", "0.05"], LrScheduleKind::Cosine, 100, 0.05),
        (&["--warmup", "100"], LrScheduleKind::Constant, 100, 0.0),
        (&["--lr-schedule", "step"], LrScheduleKind::Step, 0, 0.0),
    ] {
        let (r, losses) = scheduled_run(dir.path(), &format!("xor{}.safetensors", flags.join("")), flags);
        let schedule = LrSchedule { kind, warmup, min_lr };
        assert_eq!(losses, reference(schedule), "{flags:?}");
        assert_ne!(losses[1..], constant[1..], "{flags:?} trained as the constant rate does");
        let config = &r["config"];
        assert_eq!(config["lr_schedule"], kind.name(), "{flags:?}");
        assert_eq!(config["warmup"], warmup, "{flags:?}");
        assert_eq!(config["min_lr"].as_f64().unwrap() as f32, min_lr, "{flags:?}");
    }
    let (r, _) = scheduled_run(dir.path(), "again.safetensors", &[]);
    assert_eq!((r["config"]["lr_schedule"].as_str(), r["config"]["warmup"].as_u64()), (Some("constant"), Some(0)));

    // The description line says what the schedule is.
    let o = xor(&dir.path().join("said.safetensors"), &["--lr-schedule", "cosine", "--warmup", "100"]);
    let text = stdout(&o) + &stderr(&o);
    assert!(
        text.contains("SGD lr 0.5 on all 4 points, cosine schedule to 0, 100 warm-up steps, 5000 epochs"),
        "{text}"
    );
}

#[test]
fn human_output_is_the_loss_every_500_epochs_and_the_truth_table() {
    let dir = tempfile::tempdir().unwrap();
    let o = xor(&dir.path().join("xor.safetensors"), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let loss_lines: Vec<&str> = text.lines().filter(|l| l.starts_with("epoch ")).collect();
    assert_eq!(loss_lines.len(), 10, "{text}");
    assert!(loss_lines[0].starts_with("epoch 1/5000: loss ") && loss_lines[9].starts_with("epoch 4501/5000: loss "));
    assert!(text.contains("x1 x2 | target | prediction\n 0  0 |      0 |"), "{text}");
    assert!(text.contains("every point is on the right side of 0.5: XOR learned"), "{text}");
    assert!(text.contains("xor.safetensors holds the trained model"), "{text}");
    assert_eq!(stderr(&o), "");

    // With --json the same lines go to stderr.
    let o = xor(&dir.path().join("xor2.safetensors"), &["--json", "--epochs", "1000", "--report-every", "250"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().filter(|l| l.starts_with("epoch ")).count(), 4, "{}", stderr(&o));
    assert_eq!(report(&o)["epochs"].as_array().unwrap().len(), 4);
}

#[test]
fn quiet_prints_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("xor.safetensors");
    let o = xor(&out, &["--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!((stdout(&o).as_str(), stderr(&o).as_str()), ("", ""));
    assert!(out.exists());
}

#[test]
fn bad_inputs_are_one_line_errors_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("xor.safetensors");
    for (flags, expected) in [
        (&["--hidden", "0"][..], "--hidden must be at least 1"),
        (&["--lr", "-1"], "--lr must be a positive finite number"),
        (&["--lr", "nan"], "--lr must be a positive finite number"),
        (&["--lr", "0"], "--lr must be a positive finite number"),
        (&["--epochs", "0"], "--epochs must be at least 1"),
        (&["--epochs", "100000000"], "--epochs must be at most"),
        (&["--log-every", "0"], "--log-every must be at least 1"),
        (&["--hidden", "100000000000000"], "lower --hidden"),
        (&["--lr-schedule", "cosine", "--min-lr", "1"], "--min-lr 1 is above --lr 0.5"),
        (&["--min-lr", "0.1"], "--min-lr applies to --lr-schedule cosine only"),
        (&["--lr-schedule", "cosine", "--min-lr", "-1"], "--min-lr must be a finite number ≥ 0"),
        (&["--warmup", "5000"], "--warmup 5000 is as long as the whole run (5000 optimizer steps)"),
        (&["--epochs", "10", "--lr-schedule", "step", "--warmup", "12"], "--warmup 12 is as long"),
    ] {
        fails_with(&xor(&out, flags), &[expected]);
        assert!(!out.exists(), "{flags:?}");
    }
    fails_with(&xor(dir.path(), &[]), &["is a directory"]);

    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "keep me").unwrap();
    fails_with(&xor(&notes, &[]), &["is not a textnet XOR model, so it is not replaced"]);
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "keep me");
}

#[test]
fn divergence_writes_nothing_and_suggests_a_lower_lr() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("xor.safetensors");
    let o = xor(&out, &["--lr", "2", "--json", "--quiet"]);
    fails_with(&o, &["lower --lr"]);
    let r = report(&o);
    assert_eq!(r["status"], "diverged");
    assert!(r["diverged"]["epoch"].as_u64().is_some() && r["final"].is_null() && r["kept_epoch"].is_null());
    assert!(!out.exists());
}

#[test]
fn a_model_is_replaced_only_by_one_at_least_as_good() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("xor.safetensors");
    assert!(xor(&out, &["--quiet"]).status.success());
    let trained = modelfile::load(&out).unwrap();

    let o = xor(&out, &["--epochs", "300", "--json", "--quiet"]);
    fails_with(&o, &["nothing written"]);
    let r = report(&o);
    assert_eq!((r["status"].as_str(), r["kept_epoch"].is_null()), (Some("not_better"), true));
    assert!(r["baseline_val_loss"].as_f64().unwrap() < 0.01);
    assert_eq!(modelfile::load(&out).unwrap(), trained);

    // The same run again is as good, so it succeeds (and writes the same model).
    let o = xor(&out, &["--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(modelfile::load(&out).unwrap(), trained);
}

#[test]
fn device_cuda_never_panics() {
    // Without a usable GPU this is a one-line error; with one it trains.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("xor.safetensors");
    let o = textnet(&["xor", "--device", "cuda", "--out", out.to_str().unwrap()]);
    if !o.status.success() {
        fails_with(&o, &["--device cuda"]);
        assert!(!out.exists());
    }
    let o = textnet(&["xor", "--device", "cuda", "--hidden", "1025", "--out", out.to_str().unwrap()]);
    assert!(!o.status.success());
    fails_with(&o, &[""]);
}

/// Files written before the kind moved to `format` name it in `kind`, and still load.
#[test]
fn a_file_with_the_old_kind_entry_loads() {
    let params = XorParams::init(3, Activation::Tanh, 7);
    let bytes = modelfile::to_bytes(&params).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta = header.metadata().clone().unwrap();
    meta.remove("format");
    meta.insert("kind".into(), "xor".into());
    let old = safetensors::serialize(file.tensors(), Some(meta)).unwrap();
    assert_eq!(modelfile::from_bytes(&old).unwrap(), params);
}

#[test]
fn the_loader_refuses_other_files() {
    let params = XorParams::init(3, Activation::Tanh, 7);
    let bytes = modelfile::to_bytes(&params).unwrap();
    assert_eq!(modelfile::from_bytes(&bytes).unwrap(), params);
    let err = |bytes: &[u8]| format!("{:#}", modelfile::from_bytes(bytes).unwrap_err());
    assert!(err(b"hello").contains("not a safetensors file"));
    assert!(err(&bytes[..bytes.len() - 4]).contains("safetensors"));
    // Edits of the header that keep its length.
    let edited = |from: &str, to: &str| {
        let at = bytes.windows(from.len()).position(|w| w == from.as_bytes()).expect(from);
        let mut edited = bytes.clone();
        edited[at..at + to.len()].copy_from_slice(to.as_bytes());
        edited
    };
    assert!(err(&edited("\"textnet-xor\"", "\"textnet-abc\"")).contains("names the format \"textnet-abc\""));
    assert!(err(&edited("\"hidden\":\"3\"", "\"hidden\":\"4\"")).contains("tensor w1"));
    assert!(err(&edited("\"activation\":\"tanh\"", "\"activation\":\"tank\"")).contains("activation"));
}

/// The example run of docs/commands/xor.md is what the command prints (`...` standing for the lines it
/// leaves out).
#[test]
fn the_documented_example_is_the_real_output() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands/xor.md")).unwrap();
    let start = page.find("$ textnet xor --device cpu\n").expect("the example") + "$ textnet xor --device cpu\n".len();
    let example: Vec<&str> = page[start..page[start..].find("```").unwrap() + start].lines().collect();
    let dir = tempfile::tempdir().unwrap();
    let o =
        Command::new(env!("CARGO_BIN_EXE_textnet")).args(["xor", "--device", "cpu"]).current_dir(dir.path()).output();
    let o = o.unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let printed = stdout(&o);
    let mut lines = printed.lines();
    for want in example {
        if want == "..." {
            continue;
        }
        assert!(lines.any(|got| got == want), "documented line {want:?} is not printed in order:\n{printed}");
    }
}
