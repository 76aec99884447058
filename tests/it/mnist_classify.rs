//! `textnet classify`: a saved MNIST model on PNG, PGM and IDX images gives the model's own predictions,
//! evaluates an IDX test set as training did, and refuses images it cannot read as the model's input.

use crate::common::{small_mnist_model, text, textnet};
use std::path::Path;
use textnet::mnist::idx::{load_split, read_idx};
use textnet::mnist::images::{decode, luma, resize_bilinear};
use textnet::mnist::model::{self, MlpParams};

const DATA: &str = "/usr/share/datasets/fashion-mnist";

fn write_png(path: &Path, pixels: &[u8], width: u32, color: png::ColorType) {
    let file = std::fs::File::create(path).unwrap();
    let mut encoder = png::Encoder::new(file, width, 28);
    encoder.set_color(color);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header().unwrap().write_image_data(pixels).unwrap();
}

#[test]
fn images_in_every_format_get_the_models_predictions() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("m.safetensors");
    let train = textnet(&[
        "mnist",
        "--dataset",
        "fashion",
        "--device",
        "cpu",
        "--epochs",
        "1",
        "--hidden",
        "16",
        "--train-limit",
        "3000",
        "--quiet",
        "--json",
        "--out",
        model_path.to_str().unwrap(),
    ]);
    assert!(train.status.success(), "{}", text(&train.stderr));
    let report: serde_json::Value = serde_json::from_slice(&train.stdout).unwrap();

    // The first three test images as a binary PGM, a plain PGM and a PNG.
    let images = read_idx(&Path::new(DATA).join("t10k-images-idx3-ubyte.gz"), 3).unwrap();
    let pixels = |i: usize| &images.data[i * 784..(i + 1) * 784];
    let p5 = dir.path().join("a.pgm");
    std::fs::write(&p5, [b"P5\n# a comment\n28 28\n255\n".as_slice(), pixels(0)].concat()).unwrap();
    let p2 = dir.path().join("b.pgm");
    let plain: Vec<String> = pixels(1).iter().map(|p| p.to_string()).collect();
    std::fs::write(&p2, format!("P2 28 28 255\n{}\n", plain.join(" "))).unwrap();
    let png_path = dir.path().join("c.png");
    write_png(&png_path, pixels(2), 28, png::ColorType::Grayscale);

    let out = textnet(&[
        "classify",
        "--model",
        model_path.to_str().unwrap(),
        "--json",
        p5.to_str().unwrap(),
        p2.to_str().unwrap(),
        png_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let (params, _) = MlpParams::from_safetensors(&std::fs::read(&model_path).unwrap()).unwrap();
    let split = load_split(
        &Path::new(DATA).join("t10k-images-idx3-ubyte.gz"),
        &Path::new(DATA).join("t10k-labels-idx1-ubyte.gz"),
    )
    .unwrap();
    let mut predicted = Vec::new();
    for i in 0..3 {
        let logits = model::logits(&params, split.image(i));
        let class = textnet::ops::cpu::argmax(&logits);
        let total: f64 = logits.iter().map(|&l| ((l - logits[class]) as f64).exp()).sum();
        assert_eq!(got["predictions"][i as usize]["class"], serde_json::json!(class), "image {i}");
        let p = got["predictions"][i as usize]["probability"].as_f64().unwrap();
        assert!((p - 1.0 / total).abs() < 1e-6, "{p} vs {}", 1.0 / total);
        predicted.push(class);
    }
    assert_eq!(
        got["predictions"][0]["name"].as_str().unwrap(),
        ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
            [predicted[0]]
    );

    // The IDX test set with its labels: the accuracy the training run reported.
    let eval = textnet(&[
        "classify",
        "--model",
        model_path.to_str().unwrap(),
        "--json",
        &format!("{DATA}/t10k-images-idx3-ubyte.gz"),
        "--labels",
        &format!("{DATA}/t10k-labels-idx1-ubyte.gz"),
    ]);
    assert!(eval.status.success(), "{}", text(&eval.stderr));
    let eval: serde_json::Value = serde_json::from_slice(&eval.stdout).unwrap();
    assert_eq!(eval["predictions"].as_array().unwrap().len(), 10_000);
    assert_eq!(eval["accuracy"], report["final"]["test_accuracy"]);

    // TSV: one line per image.
    let tsv = textnet(&["classify", "--model", model_path.to_str().unwrap(), "--tsv", p5.to_str().unwrap()]);
    let line = text(&tsv.stdout);
    assert_eq!(line.trim_end().split('\t').count(), 4, "{line}");
}

#[test]
fn images_the_model_cannot_read_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("m.safetensors");
    small_mnist_model(&model_path, 300);
    let text_file = dir.path().join("note.txt");
    std::fs::write(&text_file, "hello").unwrap();
    let cut = dir.path().join("cut.png");
    let mut png_bytes = Vec::new();
    image::GrayImage::new(28, 28).write_to(&mut std::io::Cursor::new(&mut png_bytes), image::ImageFormat::Png).unwrap();
    std::fs::write(&cut, &png_bytes[..png_bytes.len() / 2]).unwrap();
    let short_pgm = dir.path().join("short.pgm");
    std::fs::write(&short_pgm, [b"P5 28 28 255\n".as_slice(), &[0u8; 100]].concat()).unwrap();
    for (input, expected) in [
        (&text_file, "not a PNG, JPEG, PGM/PPM/PBM/PAM or IDX image file"),
        (&cut, "cannot decode the PNG"),
        (&short_pgm, "cannot decode the PNM image"),
    ] {
        let out = textnet(&["classify", "--model", model_path.to_str().unwrap(), input.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{input:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected) && stderr.trim_end().lines().count() == 1, "{input:?}: {stderr}");
    }
    // A model file of another kind.
    let out = textnet(&["classify", "--model", text_file.to_str().unwrap(), short_pgm.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
}

/// Runs `classify --json` on `inputs` and returns the report and stderr.
fn classify_json(model: &Path, inputs: &[&Path], extra: &[&str]) -> (serde_json::Value, String) {
    let mut args = vec!["classify", "--model", model.to_str().unwrap(), "--json"];
    args.extend(extra);
    args.extend(inputs.iter().map(|p| p.to_str().unwrap()));
    let out = textnet(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    (serde_json::from_slice(&out.stdout).unwrap(), text(&out.stderr))
}

/// A colour whose luma (PIL's `convert("L")`, which torchvision's Grayscale calls) is `grey`, varied from
/// pixel to pixel: blue and a first red picked by the pixel, green solved for (white stays white).
fn colour_of_grey(grey: u8, at: usize) -> [u8; 3] {
    let b = ((at * 91 + 40) % 256 * grey as usize / 255) as u8;
    (0..256)
        .map(|k| ((at * 37 + k) % 256) as u8)
        .flat_map(|r| (0..=255u8).map(move |g| [r, g, b]))
        .find(|&[r, g, b]| luma(r, g, b) == grey)
        .unwrap_or([grey; 3])
}

#[test]
fn luma_and_resize_are_pils_as_torchvision_calls_them() {
    // PIL's convert("L") on these colours (Pillow 12), and the formula within its rounding.
    for (rgb, pil) in [
        ([255, 0, 0], 76),
        ([0, 255, 0], 150),
        ([0, 0, 255], 29),
        ([200, 100, 50], 124),
        ([17, 250, 3], 152),
        ([75, 238, 12], 164),
    ] {
        let got = luma(rgb[0], rgb[1], rgb[2]);
        assert_eq!(got, pil, "{rgb:?}");
        let formula = rgb[0] as f64 * 299.0 / 1000.0 + rgb[1] as f64 * 587.0 / 1000.0 + rgb[2] as f64 * 114.0 / 1000.0;
        assert!((got as f64 - formula).abs() <= 0.5011, "{rgb:?}: {got} against {formula}");
    }
    // PIL's Image.resize(size, BILINEAR) of a W×H image of pixels (53x + 101y + 7) mod 256 (Pillow 12).
    let image = |w: usize, h: usize| -> Vec<u8> {
        (0..h).flat_map(|y| (0..w).map(move |x| ((x * 53 + y * 101 + 7) % 256) as u8)).collect()
    };
    assert_eq!(resize_bilinear(&image(5, 3), 5, 3, 2, 2), [93, 134, 110, 100]);
    let up = [
        7, 37, 75, 113, 151, 189, 219, 47, 77, 115, 153, 118, 127, 157, 108, 138, 176, 214, 69, 34, 64, 169, 111, 83,
        121, 86, 95, 125, 209, 93, 21, 59, 97, 135, 165,
    ];
    assert_eq!(resize_bilinear(&image(5, 3), 5, 3, 7, 5), up);
    let down = resize_bilinear(&image(61, 45), 61, 45, 28, 28);
    let first_row = [
        91, 129, 99, 136, 119, 131, 139, 128, 153, 129, 164, 141, 121, 92, 128, 112, 122, 131, 120, 145, 121, 156, 134,
        154, 91, 119, 105, 115,
    ];
    assert_eq!(down[..28], first_row);
    assert_eq!(down.iter().map(|&p| p as u32).sum::<u32>(), 99787);
}

#[test]
fn colour_and_larger_images_are_made_greyscale_28x28_as_torchvision_does() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("m.safetensors");
    small_mnist_model(&model_path, 3000);
    let images = read_idx(&Path::new(DATA).join("t10k-images-idx3-ubyte.gz"), 3).unwrap();
    let pixels = |i: usize| &images.data[i * 784..(i + 1) * 784];

    // Test image 0 as greyscale, as RGB of the same luma, as RGBA of that with any alpha (dropped, as
    // PIL's convert("L") drops it), and as 16-bit greyscale: the same input, so the same predictions.
    let grey = dir.path().join("grey.png");
    write_png(&grey, pixels(0), 28, png::ColorType::Grayscale);
    let rgb_pixels: Vec<[u8; 3]> = pixels(0).iter().enumerate().map(|(at, &p)| colour_of_grey(p, at)).collect();
    let coloured = rgb_pixels.iter().filter(|c| c[0] != c[1] || c[1] != c[2]).count();
    assert!(coloured > 200, "{coloured} pixels of colour");
    let rgb = dir.path().join("rgb.png");
    write_png(&rgb, rgb_pixels.concat().as_slice(), 28, png::ColorType::Rgb);
    let rgba = dir.path().join("rgba.png");
    let rgba_pixels: Vec<u8> =
        rgb_pixels.iter().enumerate().flat_map(|(at, c)| [c[0], c[1], c[2], (at * 13 % 256) as u8]).collect();
    write_png(&rgba, &rgba_pixels, 28, png::ColorType::Rgba);
    let deep = dir.path().join("deep.png");
    let mut encoder = png::Encoder::new(std::fs::File::create(&deep).unwrap(), 28, 28);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::Sixteen);
    let wide: Vec<u8> = pixels(0).iter().flat_map(|&p| (p as u16 * 257).to_be_bytes()).collect();
    encoder.write_header().unwrap().write_image_data(&wide).unwrap();

    let inputs = [grey.as_path(), rgb.as_path(), rgba.as_path(), deep.as_path()];
    let (got, notes) = classify_json(&model_path, &inputs, &[]);
    let first = &got["predictions"][0];
    for i in 1..4 {
        let other = &got["predictions"][i];
        assert_eq!((&other["class"], &other["probability"]), (&first["class"], &first["probability"]), "{i}");
    }
    let notes: Vec<&str> = notes.lines().collect();
    assert_eq!(
        notes,
        [
            format!("{}: 28×28 RGB, converted to greyscale as torchvision's Grayscale does", rgb.display()),
            format!(
                "{}: 28×28 RGBA, converted to greyscale and alpha dropped as torchvision's Grayscale does",
                rgba.display()
            ),
            format!("{}: 28×28 16-bit greyscale, scaled from 16 to 8 bits", deep.display()),
        ]
    );
    let (_, quiet) = classify_json(&model_path, &inputs, &["--quiet"]);
    assert_eq!(quiet, "");

    // Test image 1 upscaled 2× (each pixel a 2×2 block) to 56×56, as RGB: resized back, its pixels blurred
    // as PIL's antialiased bilinear blurs them, and the same class.
    let big: Vec<u8> = (0..56 * 56).flat_map(|i| [pixels(1)[(i / 56 / 2) * 28 + (i % 56) / 2]; 3]).collect();
    let big_path = dir.path().join("big.png");
    let file = std::fs::File::create(&big_path).unwrap();
    let mut encoder = png::Encoder::new(file, 56, 56);
    encoder.set_color(png::ColorType::Rgb);
    encoder.write_header().unwrap().write_image_data(&big).unwrap();
    let decoded = decode(&std::fs::read(&big_path).unwrap()).unwrap();
    // Along each axis PIL's 2× downscale weighs a pixel's own 2×2 block 3/4 and each neighbouring block
    // 1/8 (at an edge: 6/7 and 1/7); each pass rounds to 8 bits, so within one of this in floating point.
    let blur = |line: &dyn Fn(usize) -> f64, i: usize| match i {
        0 => (6.0 * line(0) + line(1)) / 7.0,
        27 => (line(26) + 6.0 * line(27)) / 7.0,
        _ => (line(i - 1) + 6.0 * line(i) + line(i + 1)) / 8.0,
    };
    let rows: Vec<f64> = (0..784).map(|i| blur(&|x| pixels(1)[i / 28 * 28 + x] as f64, i % 28)).collect();
    for i in 0..784 {
        let expected = blur(&|y| rows[y * 28 + i % 28], i / 28);
        assert!((decoded.pixels[i] as f64 - expected).abs() <= 1.01, "pixel {i}: {} {expected}", decoded.pixels[i]);
    }
    let small = dir.path().join("small.png");
    write_png(&small, pixels(1), 28, png::ColorType::Grayscale);
    let (got, notes) = classify_json(&model_path, &[&small, &big_path], &[]);
    assert_eq!(got["predictions"][0]["class"], got["predictions"][1]["class"]);
    assert_eq!(
        notes.trim_end(),
        format!(
            "{}: 56×56 RGB, converted to greyscale and resized to 28×28 as torchvision's Grayscale and Resize do",
            big_path.display()
        )
    );

    // A JPEG and a binary PPM of the same colour image.
    let colour = image::RgbImage::from_raw(28, 28, rgb_pixels.concat()).unwrap();
    let jpeg = dir.path().join("photo.jpg");
    colour.save(&jpeg).unwrap();
    let ppm = dir.path().join("photo.ppm");
    std::fs::write(&ppm, [b"P6 28 28 255\n".as_slice(), &rgb_pixels.concat()].concat()).unwrap();
    let (got, _) = classify_json(&model_path, &[&ppm, &jpeg], &[]);
    assert_eq!(got["predictions"][0]["probability"], first["probability"]);
    assert_eq!(got["predictions"].as_array().unwrap().len(), 2);
}

#[test]
fn labels_print_the_confusion_matrix_after_the_accuracy() {
    let dir = tempfile::tempdir().unwrap();
    let model_path = dir.path().join("m.safetensors");
    small_mnist_model(&model_path, 300);
    let images = format!("{DATA}/t10k-images-idx3-ubyte.gz");
    let labels = format!("{DATA}/t10k-labels-idx1-ubyte.gz");
    let out = textnet(&["classify", "--model", model_path.to_str().unwrap(), &images, "--labels", &labels]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed = text(&out.stdout);
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), 13, "{printed}");
    assert!(lines[0].starts_with("10,000 images: accuracy "), "{printed}");
    assert!(lines[1].starts_with("confusion matrix, 10,000 images (rows: true class, columns: predicted)"));
    assert!(lines[2].trim_start().starts_with("0      1      2"), "{printed}");
    assert!(lines[3].starts_with("0 T-shirt/top ") && lines[12].starts_with("9 Ankle boot "), "{printed}");
    // Aligned: every row as long as the header, the counts of a row summing to the class's 1000 images.
    assert!(lines[2..].iter().all(|l| l.chars().count() == lines[2].chars().count()), "{printed}");
    let rows: Vec<Vec<u64>> = lines[3..]
        .iter()
        .map(|l| l.split_whitespace().filter_map(|w| w.parse().ok()).skip(1).take(10).collect())
        .collect();
    assert!(rows.iter().all(|r| r.len() == 10 && r.iter().sum::<u64>() == 1000), "{rows:?}");

    // The same matrix in --json, as rows.
    let (report, _) = classify_json(&model_path, &[Path::new(&images)], &["--labels", &labels]);
    assert_eq!(report["confusion"], serde_json::json!(rows));
}
