//! `--plot FILE.svg|png`: every training command draws its training curves, `classify --labels` its
//! confusion matrix; a bad `--plot` is refused before any work, writing nothing; an interrupted or
//! diverged run draws the epochs it has, and one with none draws nothing.

use crate::common::text::{shakespeare, train_args, train_until_ctrl_c};
use crate::common::{fails_with, report, s, small_fit_model, stderr, stdout, textnet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The first bytes of every PNG file.
const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// The PNG at `path`, decoded: its width and height, after checking it is 8-bit RGB of a plausible size.
fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.starts_with(PNG_SIGNATURE), "{} is no PNG", path.display());
    assert!((5_000..3_000_000).contains(&bytes.len()), "{}: {} bytes", path.display(), bytes.len());
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes)).read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((frame.color_type, frame.bit_depth), (png::ColorType::Rgb, png::BitDepth::Eight));
    // A drawing, not a blank page: white, and ink in the colours of the curves.
    let pixels = &pixels[..frame.buffer_size()];
    let white = pixels.chunks(3).filter(|p| *p == [255, 255, 255]).count();
    let coloured = pixels.chunks(3).filter(|p| p.iter().max().unwrap() - p.iter().min().unwrap() > 60).count();
    assert!(white > pixels.len() / 3 / 2 && coloured > 100, "{}: {white} white, {coloured} coloured", path.display());
    (frame.width, frame.height)
}

/// The SVG at `path`, after checking it is one: its text.
fn svg(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"), "{}", path.display());
    text
}

fn xor(dir: &Path, extra: &[&str]) -> Output {
    let out = dir.join("x.safetensors");
    textnet(&[&["xor", "--device", "cpu", "--epochs", "2000", "--out", s(&out)][..], extra].concat())
}

fn sales_table(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/make-sales.py");
    let status =
        Command::new("python3").args([script, "--rows", "600", "--out", s(&path)]).status().expect("runs python3");
    assert!(status.success());
    path
}

/// `--plot` given to `command`, and what it drew (`svg`'s text), once for each training command: the
/// report's config names it, and the picture names the series of the rows.
#[test]
fn every_training_command_draws_its_curves() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let picture = |name: &str| d.join(format!("{name}.svg"));
    let table = sales_table(d, "sales.tsv");
    let corpus = shakespeare();
    let runs: Vec<(&str, Vec<String>, &[&str])> = vec![
        ("xor", ["xor", "--device", "cpu", "--epochs", "2000", "--out"].map(String::from).to_vec(), &["train loss"]),
        (
            "train",
            train_args(&corpus, &d.join("t.safetensors"), &["--epochs", "2"]),
            &["train loss", "val loss", "val accuracy", "val top-5 accuracy", "val perplexity"],
        ),
        (
            "mnist",
            ["mnist", "--dataset", "fashion", "--device", "cpu", "--train-limit", "1000", "--hidden", "8"]
                .into_iter()
                .chain(["--epochs", "2", "--val-split", "0.2"])
                .map(String::from)
                .collect(),
            &["train loss", "val loss", "test loss", "val accuracy", "test accuracy"],
        ),
        (
            "sales",
            ["sales", s(&table), "--device", "cpu", "--epochs", "10", "--val-split", "0.2", "--keep", "best"]
                .map(String::from)
                .to_vec(),
            &["train loss", "val loss", "test loss", "val MAE", "test MAE"],
        ),
        (
            "transformer",
            ["transformer", s(&corpus), "--device", "cpu", "--embed", "32", "--heads", "2", "--block", "16"]
                .into_iter()
                .chain(["--batch", "4", "--steps", "30", "--eval-every", "10"])
                .map(String::from)
                .collect(),
            &["train loss", "val loss", "\nstep\n"],
        ),
        (
            "fit",
            ["fit", "--layers", "Linear(16), ReLU, Linear(10)", "--dataset", "fashion", "--train-limit", "1000"]
                .into_iter()
                .chain(["--epochs", "2", "--device", "cpu"])
                .map(String::from)
                .collect(),
            &["train loss", "test loss", "test accuracy"],
        ),
    ];
    for (command, mut args, series) in runs {
        let plot = picture(command);
        if command == "xor" {
            args.push(s(&d.join("x.safetensors")).to_string());
        } else if !args.iter().any(|a| a == "--out") {
            args.extend([String::from("--out"), s(&d.join(format!("{command}.safetensors"))).to_string()]);
        }
        args.extend(["--json", "--plot", s(&plot)].map(String::from));
        let o = textnet(&args);
        let r = report(&o);
        assert!(o.status.success(), "{command}: {}", stderr(&o));
        assert_eq!(r["config"]["plot"].as_str(), Some(s(&plot)), "{command}");
        let text = svg(&plot);
        for name in series {
            assert!(text.contains(name), "{command}: the picture lacks {name:?}");
        }
        // The axes' names, each a text of its own.
        let x = if command == "transformer" { "\nstep\n" } else { "\nepoch\n" };
        assert!(text.contains(x) && text.contains("\nloss\n"), "{command}: axes");
        assert!(stderr(&o).contains(&format!("--plot {}: the training curves", plot.display())), "{command}");
    }
    // Without --plot, the config says so, and no picture is drawn.
    let r = report(&xor(d, &["--json", "--overwrite"]));
    assert!(r["config"]["plot"].is_null());
}

#[test]
fn a_png_plot_is_a_png_of_the_curves() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("curves.PNG");
    let o = xor(dir.path(), &["--plot", s(&plot)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("the training curves (4 points)"), "{}", stdout(&o));
    let (width, height) = png_size(&plot);
    assert_eq!(width, 960);
    assert!((400..600).contains(&height), "one panel: {height}");

    // A panel per figure: fit's loss and accuracy stack two.
    let model = dir.path().join("fit.safetensors");
    let plot = dir.path().join("fit.png");
    let args = ["--layers", "Linear(16), ReLU, Linear(10)", "--dataset", "fashion", "--train-limit", "1000"];
    let o = textnet(
        &[&["fit", "--device", "cpu", "--epochs", "1"][..], &args, &["--out", s(&model), "--plot", s(&plot)]].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (_, two_panels) = png_size(&plot);
    assert!(two_panels > height + 300, "{two_panels} against {height}");
}

/// Each bad `--plot` gets its one-line error and exit status 1 before any work: neither the picture nor
/// the model is written, no directory is made.
#[test]
fn a_bad_plot_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = d.join("x.safetensors");
    // xor with `--plot PLOT`, refused with each of `expected`.
    let refused = |plot: &Path, expected: &[&str]| {
        let o = textnet(&["xor", "--device", "cpu", "--out", s(&model), "--plot", s(plot)]);
        fails_with(&o, expected);
        assert!(!model.exists(), "--plot {}: the model was written", plot.display());
        assert!(stdout(&o).is_empty(), "--plot {}: it trained: {}", plot.display(), stdout(&o));
    };

    let jpeg = d.join("curves.jpg");
    refused(&jpeg, &["--plot", "curves.jpg", "ending in .svg or .png"]);
    assert!(!jpeg.exists());
    refused(&d.join("curves"), &["ending in .svg or .png"]);

    let missing = d.join("no-such-dir").join("curves.png");
    refused(&missing, &["the directory", "no-such-dir", "does not exist"]);
    assert!(!d.join("no-such-dir").exists(), "the directory was made");

    std::fs::create_dir(d.join("dir.png")).unwrap();
    refused(&d.join("dir.png"), &["--plot", "dir.png is a directory"]);

    // --plot on --out: the same name, also spelt otherwise, refused before either is written.
    let same = d.join("m.png");
    let o = textnet(&["xor", "--device", "cpu", "--out", s(&same), "--plot", s(&same)]);
    fails_with(&o, &["--plot", "is also --out, the model file"]);
    let other_spelling = d.join(".").join("m.png");
    let o = textnet(&["xor", "--device", "cpu", "--out", s(&same), "--plot", s(&other_spelling)]);
    fails_with(&o, &["is also --out"]);
    assert!(!same.exists());

    // --plot on an input: the table sales trains on (named like a picture), kept as it was.
    let table = sales_table(d, "table.svg");
    let before = std::fs::read(&table).unwrap();
    let o = textnet(&["sales", s(&table), "--device", "cpu", "--out", s(&model), "--plot", s(&table)]);
    fails_with(&o, &["--plot", "is the table", "writing there would destroy it"]);
    assert_eq!(std::fs::read(&table).unwrap(), before);
    assert!(!model.exists());

    // --plot names a training picture: not with the prediction of sales or fit.
    for command in ["sales", "fit"] {
        let o = textnet(&[command, "--model", "m.safetensors", "--predict", "t.tsv", "--plot", "p.png"]);
        assert_eq!(o.status.code(), Some(2), "{command}: {}", stderr(&o));
        assert!(stderr(&o).contains("--plot"), "{command}: {}", stderr(&o));
    }
}

#[test]
fn a_diverged_run_draws_the_epochs_it_has_and_one_without_any_draws_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // XOR at a huge rate: its first recorded loss is finite, the next is not.
    let plot = dir.path().join("diverged.png");
    let o = xor(dir.path(), &["--lr", "1e30", "--plot", s(&plot)]);
    fails_with(&o, &["diverged"]);
    assert!(stdout(&o).contains("the training curves (1 point)"), "{}", stdout(&o));
    png_size(&plot);

    // The text model diverges in its first epoch: nothing to draw, so nothing is written, and the run
    // fails as it would without --plot.
    let plot = dir.path().join("none.svg");
    let model = dir.path().join("t.safetensors");
    let o = textnet(&train_args(&shakespeare(), &model, &["--lr", "1e30", "--plot", s(&plot)]));
    fails_with(&o, &["diverged in epoch 1"]);
    assert!(!stderr(&o).contains("--plot"), "{}", stderr(&o));
    assert!(stdout(&o).contains("not written: no epoch completed"), "{}", stdout(&o));
    assert!(!plot.exists());
}

#[test]
fn ctrl_c_still_draws_the_epochs_done() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.safetensors");
    let plot = dir.path().join("stopped.png");
    let (out, rest) = train_until_ctrl_c(&model, &["--plot", s(&plot)]);
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(rest.iter().any(|l| l.contains("the training curves")), "{rest:?}");
    png_size(&plot);
}

#[test]
fn classify_draws_the_confusion_matrix() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("fit.safetensors");
    small_fit_model("Linear(16), ReLU, Linear(10)", &model);
    let data = Path::new("/usr/share/datasets/fashion-mnist");
    let (images, labels) = (data.join("t10k-images-idx3-ubyte.gz"), data.join("t10k-labels-idx1-ubyte.gz"));
    let classify = |extra: &[&str]| {
        textnet(&[&["classify", s(&images), "--labels", s(&labels), "--model", s(&model)][..], extra].concat())
    };

    let plot = dir.path().join("confusion.svg");
    let o = classify(&["--plot", s(&plot), "--tsv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("the confusion matrix"), "{}", stderr(&o));
    let text = svg(&plot);
    for name in ["0 T-shirt/top", "9 Ankle boot", "predicted class", "true class", "recall", "10,000 images"] {
        assert!(text.contains(name), "the matrix lacks {name:?}");
    }
    // The counts in the cells: the diagonal's add up to the accuracy the command reports.
    let r = report(&classify(&["--json"]));
    let confusion = r["confusion"].as_array().unwrap();
    for (k, row) in confusion.iter().enumerate() {
        let count = row[k].as_u64().unwrap();
        assert!(text.contains(&format!("\n{count}\n")), "the cell {k},{k} ({count}) is not in the picture");
    }

    let plot = dir.path().join("confusion.png");
    assert!(classify(&["--plot", s(&plot), "--quiet"]).status.success());
    let (width, height) = png_size(&plot);
    assert!(width > 10 * 40 && height > 10 * 40, "{width}×{height}");

    // Without --labels there is no matrix: a usage error; a bad extension is refused before any work.
    let o = textnet(&["classify", s(&images), "--model", s(&model), "--plot", s(&plot)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--labels"), "{}", stderr(&o));
    let o = classify(&["--plot", s(&dir.path().join("m.gif"))]);
    fails_with(&o, &["ending in .svg or .png"]);
    assert!(stdout(&o).is_empty());
}
