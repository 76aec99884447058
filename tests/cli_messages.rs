//! Small things users noticed in the output: one `device:` line, "1 epoch", and `--data` naming a file.

mod text_common;

use text_common::{shakespeare, text, textnet, train_args};

#[test]
fn train_says_its_device_once_and_counts_epochs_in_english() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.safetensors");
    let run = textnet(&train_args(&shakespeare(), &out, &["--device", "auto", "--epochs", "1"]));
    assert!(run.status.success(), "{}", text(&run.stderr));
    let all = format!("{}{}", text(&run.stdout), text(&run.stderr));
    assert_eq!(all.lines().filter(|l| l.starts_with("device:")).count(), 1, "{all}");
    assert!(all.contains(", 1 epoch\n"), "{all}");
    assert!(!all.contains("1 epochs"), "{all}");
}

#[test]
fn mnist_data_that_is_a_file_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("train-images-idx3-ubyte");
    std::fs::write(&file, b"not a directory").unwrap();
    let run = textnet(&["mnist", "--data", file.to_str().unwrap(), "--device", "cpu", "--epochs", "1"]);
    assert_eq!(run.status.code(), Some(1));
    let stderr = text(&run.stderr);
    assert!(stderr.contains("is a file; give the directory"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}
