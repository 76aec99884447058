//! Image files as a model's input: PNG, JPEG and PNM (PGM, PPM, PBM, PAM) decoded by the `image` crate,
//! then made 8-bit greyscale of the model's size (28×28 for MNIST) as a torchvision pipeline of
//! `transforms.Grayscale()` and `transforms.Resize((28, 28))` on a PIL image makes them: PIL's ITU-R
//! 601-2 luma, alpha dropped (what PIL's `convert("L")` does), and PIL's bilinear resampling,
//! antialiased when downscaling, in its fixed-point arithmetic. 16-bit samples are first scaled to 8
//! bits. `textnet classify` reads its images through it.

use super::idx::IMAGE_SIDE;
use anyhow::{Result, bail};
use image::DynamicImage;

/// An image as the model reads it, and what was done to get there.
pub struct Decoded {
    /// The model's width × height greyscale bytes, row by row.
    pub pixels: Vec<u8>,
    /// What the file held and how it was converted ("640×480 RGB, converted to greyscale and resized
    /// to 28×28 as torchvision's Grayscale and Resize do"); None when it was 8-bit greyscale of the size.
    pub conversion: Option<String>,
}

/// Decodes a PNG, JPEG or PNM file into an MNIST model's input (28×28).
pub fn decode(bytes: &[u8]) -> Result<Decoded> {
    decode_sized(bytes, IMAGE_SIDE, IMAGE_SIDE)
}

/// Decodes a PNG, JPEG or PNM file into the input of a model of `out_width` × `out_height` images.
pub fn decode_sized(bytes: &[u8], out_width: usize, out_height: usize) -> Result<Decoded> {
    let reader = image::ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format()?;
    let format = match reader.format() {
        Some(format @ (image::ImageFormat::Png | image::ImageFormat::Jpeg | image::ImageFormat::Pnm)) => format,
        _ => bail!("not a PNG, JPEG, PGM/PPM/PBM/PAM or IDX image file"),
    };
    let image = reader.decode().map_err(|e| anyhow::anyhow!("cannot decode the {} ({e})", format_name(format)))?;
    let (width, height) = (image.width() as usize, image.height() as usize);
    if width == 0 || height == 0 {
        bail!("the image is {width}×{height} pixels: it has none");
    }
    let colour = image.color();
    let sixteen_bits = colour.bytes_per_pixel() / colour.channel_count() > 1;
    let (channels, samples) = eight_bit_samples(image);
    let grey: Vec<u8> = match channels {
        1 | 2 => samples.iter().step_by(channels).copied().collect(),
        _ => samples.chunks_exact(channels).map(|p| luma(p[0], p[1], p[2])).collect(),
    };
    let pixels = resize_bilinear(&grey, width, height, out_width, out_height);

    let mut done = Vec::new();
    if sixteen_bits {
        done.push("scaled from 16 to 8 bits".to_string());
    }
    if colour.has_color() {
        done.push("converted to greyscale".into());
    }
    if colour.has_alpha() {
        done.push("alpha dropped".into());
    }
    let resized = (width, height) != (out_width, out_height);
    if resized {
        done.push(format!("resized to {out_width}×{out_height}"));
    }
    if done.is_empty() {
        return Ok(Decoded { pixels, conversion: None });
    }
    let transforms = match (colour.has_color() || colour.has_alpha(), resized) {
        (true, true) => " as torchvision's Grayscale and Resize do",
        (true, false) => " as torchvision's Grayscale does",
        (false, true) => " as torchvision's Resize does",
        (false, false) => "",
    };
    let held = match (colour.has_color(), colour.has_alpha()) {
        (true, true) => "RGBA",
        (true, false) => "RGB",
        (false, true) => "greyscale with alpha",
        (false, false) => "greyscale",
    };
    let depth = if sixteen_bits { "16-bit " } else { "" };
    let done = match done.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => unreachable!("`done` is not empty"),
    };
    Ok(Decoded { pixels, conversion: Some(format!("{width}×{height} {depth}{held}, {done}{transforms}")) })
}

fn format_name(format: image::ImageFormat) -> &'static str {
    match format {
        image::ImageFormat::Png => "PNG",
        image::ImageFormat::Jpeg => "JPEG",
        _ => "PNM image",
    }
}

/// The image's channels (1 to 4: grey, grey+alpha, RGB, RGBA) and its samples in 8 bits, 16-bit ones
/// scaled by 255/65535 and rounded.
fn eight_bit_samples(image: DynamicImage) -> (usize, Vec<u8>) {
    let to_8 = |samples: Vec<u16>| samples.iter().map(|&v| ((v as u32 * 255 + 32767) / 65535) as u8).collect();
    match image {
        DynamicImage::ImageLuma8(b) => (1, b.into_raw()),
        DynamicImage::ImageLumaA8(b) => (2, b.into_raw()),
        DynamicImage::ImageRgb8(b) => (3, b.into_raw()),
        DynamicImage::ImageRgba8(b) => (4, b.into_raw()),
        DynamicImage::ImageLuma16(b) => (1, to_8(b.into_raw())),
        DynamicImage::ImageLumaA16(b) => (2, to_8(b.into_raw())),
        DynamicImage::ImageRgb16(b) => (3, to_8(b.into_raw())),
        DynamicImage::ImageRgba16(b) => (4, to_8(b.into_raw())),
        other => (4, other.to_rgba8().into_raw()),
    }
}

/// ITU-R 601-2 luma, L = R·299/1000 + G·587/1000 + B·114/1000, rounded, in the 16-bit fixed point of
/// PIL's `convert("L")` (which torchvision's Grayscale calls): the same value as PIL's for every colour.
pub fn luma(r: u8, g: u8, b: u8) -> u8 {
    ((r as u32 * 19595 + g as u32 * 38470 + b as u32 * 7471 + 0x8000) >> 16) as u8
}

/// Fraction bits of PIL's resampling weights.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Resamples greyscale `pixels` (`width` × `height`, row by row) to `out_width` × `out_height` as PIL's
/// `Image.resize(size, BILINEAR)` does, which torchvision's Resize calls on PIL images: a triangle
/// filter whose support widens with the downscaling factor (antialias), rows first, then columns,
/// each pass rounded to 8 bits.
pub fn resize_bilinear(pixels: &[u8], width: usize, height: usize, out_width: usize, out_height: usize) -> Vec<u8> {
    let mut image = pixels.to_vec();
    if out_width != width {
        image = resample_rows(&image, width, out_width);
    }
    if out_height != height {
        let columns = transpose(&image, out_width, height);
        image = transpose(&resample_rows(&columns, height, out_height), out_height, out_width);
    }
    image
}

/// Each row of `image` (rows of `width`) resampled to `out_width`.
fn resample_rows(image: &[u8], width: usize, out_width: usize) -> Vec<u8> {
    let taps = bilinear_taps(width, out_width);
    let mut out = Vec::with_capacity(image.len() / width * out_width);
    for row in image.chunks_exact(width) {
        out.extend(taps.iter().map(|(first, weights)| {
            let sum = weights.iter().zip(&row[*first..]).map(|(&w, &p)| w * p as i64).sum::<i64>();
            ((sum + (1 << (PRECISION_BITS - 1))) >> PRECISION_BITS).clamp(0, 255) as u8
        }));
    }
    out
}

/// For each output position along an axis of `size` resampled to `out_size`: the first input position
/// it reads and the fixed-point weights of it and the ones after (PIL's `precompute_coeffs`).
fn bilinear_taps(size: usize, out_size: usize) -> Vec<(usize, Vec<i64>)> {
    let scale = size as f64 / out_size as f64;
    let filter_scale = scale.max(1.0);
    let support = filter_scale;
    (0..out_size)
        .map(|i| {
            let center = (i as f64 + 0.5) * scale;
            // C's (int) casts, truncating toward zero, as PIL has them.
            let first = ((center - support + 0.5) as i64).max(0) as usize;
            let end = ((center + support + 0.5) as i64).min(size as i64) as usize;
            let raw: Vec<f64> = (first..end)
                .map(|x| (1.0 - ((x as f64 - center + 0.5) * (1.0 / filter_scale)).abs()).max(0.0))
                .collect();
            let total: f64 = raw.iter().sum();
            let one = (1i64 << PRECISION_BITS) as f64;
            let weights = raw.iter().map(|w| (w / total * one + 0.5) as i64).collect();
            (first, weights)
        })
        .collect()
}

/// `image` (rows of `width`, `height` rows) with rows and columns swapped.
fn transpose(image: &[u8], width: usize, height: usize) -> Vec<u8> {
    (0..width).flat_map(|x| (0..height).map(move |y| image[y * width + x])).collect()
}
