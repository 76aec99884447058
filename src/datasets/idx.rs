//! IDX files, the container MNIST and Fashion-MNIST ship in, and the in-memory split they load into.
//!
//! An IDX file is a big-endian u32 magic number (two zero bytes, a type code — 0x08 for unsigned bytes —
//! and the number of dimensions), one big-endian u32 per dimension, then the data, row-major. Images
//! are 0x00000803 (count × 28 × 28), labels 0x00000801 (count). Either file may be gzipped, in one member
//! or several; the reader tells by the gzip magic, not the file name. One reader serves both kinds;
//! `load_split` pairs them.
//!
//! A split is held as one contiguous f32 image buffer (pixels scaled to `[0,1]`) and one u8 label buffer,
//! so a GPU backend uploads each with a single copy.

use anyhow::{Context, Result, bail};
use flate2::bufread::GzDecoder;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

/// Side of an (Fashion-)MNIST image in pixels.
pub const IMAGE_SIDE: usize = 28;
/// Pixels per image.
pub const PIXELS: usize = IMAGE_SIDE * IMAGE_SIDE;
/// Number of classes.
pub const CLASSES: usize = 10;

/// Type code of unsigned-byte data, the third byte of the magic number.
const UBYTE: u32 = 0x08;

/// One IDX file of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idx {
    /// The size of each dimension, e.g. [count, 28, 28].
    pub dims: Vec<usize>,
    /// ∏ dims bytes, row-major.
    pub data: Vec<u8>,
}

/// Reads an IDX file of unsigned bytes that must have `ndims` dimensions (3 for images, 1 for labels).
/// Errors start with the file's path and say what is wrong with it.
pub fn read_idx(path: &Path, ndims: usize) -> Result<Idx> {
    let file = crate::io::fsutil::open_input(path, "IDX file")?;
    let mut buffered = BufReader::new(file);
    let gzipped = buffered.fill_buf().map(|head| head.starts_with(&[0x1f, 0x8b])).unwrap_or(false);
    let reader: Box<dyn Read> =
        if gzipped { Box::new(GzMembers { member: Some(GzDecoder::new(buffered)) }) } else { Box::new(buffered) };
    parse_idx(reader, ndims, gzipped).with_context(|| path.display().to_string())
}

/// The members of a gzip file decoded one after another, like `flate2::read::MultiGzDecoder`, except
/// that bytes after the last member which do not start another one are an error of their own
/// (`NotGzip`), not a corrupt header.
struct GzMembers {
    member: Option<GzDecoder<BufReader<File>>>,
}

#[derive(Debug)]
struct NotGzip;

impl std::fmt::Display for NotGzip {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("bytes after the gzip data that are not gzip")
    }
}

impl std::error::Error for NotGzip {}

impl Read for GzMembers {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(member) = &mut self.member {
            let n = member.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            let mut rest = self.member.take().map(GzDecoder::into_inner).expect("a member");
            match rest.fill_buf()? {
                [] => {}
                [0x1f, ..] => self.member = Some(GzDecoder::new(rest)),
                _ => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, NotGzip)),
            }
        }
        Ok(0)
    }
}

/// Reads into `buf` until it is full or the stream ends; returns how many bytes arrived.
fn read_up_to(reader: &mut dyn Read, buf: &mut [u8], gzipped: bool) -> Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.get_ref().is_some_and(|inner| inner.is::<NotGzip>()) => {
                bail!("unexpected bytes after the gzip data (they do not start another gzip member)")
            }
            Err(e) if gzipped => bail!("truncated or corrupt gzip data ({e})"),
            Err(e) => return Err(e).context("read error"),
        }
    }
    Ok(filled)
}

fn parse_idx(mut reader: Box<dyn Read>, ndims: usize, gzipped: bool) -> Result<Idx> {
    let reader = &mut *reader;
    let expected_magic = UBYTE << 8 | ndims as u32;
    let header_len = 4 + 4 * ndims;
    let mut header = vec![0u8; header_len];
    let got = read_up_to(reader, &mut header, gzipped)?;
    if got >= 4 {
        let magic = u32::from_be_bytes(header[..4].try_into().unwrap());
        if magic != expected_magic {
            bail!(
                "wrong magic number 0x{magic:08x}, expected 0x{expected_magic:08x} (IDX unsigned bytes, {ndims} \
                 dimension{}): not an MNIST {} file",
                if ndims == 1 { "" } else { "s" },
                if ndims == 1 { "label" } else { "image" }
            );
        }
    }
    if got < header_len {
        bail!("truncated: the IDX header needs {header_len} bytes, the file has only {got}");
    }
    let dims: Vec<usize> =
        header[4..].chunks_exact(4).map(|b| u32::from_be_bytes(b.try_into().unwrap()) as usize).collect();
    let shown = dims.iter().map(usize::to_string).collect::<Vec<_>>().join("×");
    let len = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .with_context(|| format!("dimensions {shown} are too large"))?;
    // The header is not trusted with the allocation size: read what is there, then compare.
    let mut data = Vec::with_capacity(len.min(64 << 20));
    let mut body = (&mut *reader).take(len as u64);
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let n = read_up_to(&mut body, &mut chunk, gzipped)?;
        data.extend_from_slice(&chunk[..n]);
        if n < chunk.len() {
            break;
        }
    }
    if data.len() < len {
        bail!("truncated: the header promises {shown} = {len} data bytes but only {} follow", data.len());
    }
    // To the end, so that a corrupt gzip stream is reported as such even where it decodes to extra bytes.
    let mut extra = 0;
    loop {
        match read_up_to(reader, &mut chunk, gzipped)? {
            0 => break,
            n => extra += n,
        }
    }
    if extra > 0 {
        bail!("unexpected bytes after the {len} data bytes that the header ({shown}) promises");
    }
    Ok(Idx { dims, data })
}

/// Images and labels of one split, row i of `images` being the image of `labels[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// len × pixels, row-major, each pixel in `[0,1]`.
    pub images: Vec<f32>,
    /// The class of each image.
    pub labels: Vec<u8>,
    /// Values per image (784 for MNIST).
    pub pixels: usize,
}

impl Split {
    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the split holds no image.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    #[inline]
    /// The pixels of image `index`.
    pub fn image(&self, index: u32) -> &[f32] {
        &self.images[index as usize * self.pixels..][..self.pixels]
    }

    #[inline]
    /// The label of image `index`.
    pub fn label(&self, index: u32) -> usize {
        self.labels[index as usize] as usize
    }

    /// Keeps only the first `n` samples.
    pub fn truncate(&mut self, n: usize) {
        self.labels.truncate(n);
        self.images.truncate(n * self.pixels);
    }
}

/// Loads an image file and its label file, checking each and that they agree.
pub fn load_split(images_path: &Path, labels_path: &Path) -> Result<Split> {
    let images = read_idx(images_path, 3)?;
    let labels = read_idx(labels_path, 1)?;
    let (count, rows, cols) = (images.dims[0], images.dims[1], images.dims[2]);
    if (rows, cols) != (IMAGE_SIDE, IMAGE_SIDE) {
        bail!("{}: images are {rows}×{cols} pixels, expected {IMAGE_SIDE}×{IMAGE_SIDE}", images_path.display());
    }
    if count != labels.dims[0] {
        bail!(
            "mismatched counts: {} holds {count} images but {} holds {} labels",
            images_path.display(),
            labels_path.display(),
            labels.dims[0]
        );
    }
    if count == 0 {
        bail!("{}: holds no images", images_path.display());
    }
    if let Some(i) = labels.data.iter().position(|&l| l as usize >= CLASSES) {
        bail!("{}: label {} at index {i} is not a class 0–{}", labels_path.display(), labels.data[i], CLASSES - 1);
    }
    check_float_memory(images_path, count)?;
    // datasets::mnist::INPUT_SCALING says this in the model file.
    let mut floats = crate::io::resources::try_vec(
        images.data.len(),
        0f32,
        "the images as 32-bit floats",
        "use fewer images (--train-limit when training)",
    )?;
    floats.iter_mut().zip(&images.data).for_each(|(f, &p)| *f = p as f32 / 255.0);
    Ok(Split { images: floats, labels: labels.data, pixels: PIXELS })
}

/// Refuses `count` images whose 32-bit float copy would not fit in the memory left, before making it
/// (an allocation that fails aborts).
pub fn check_float_memory(path: &Path, count: usize) -> Result<()> {
    let bytes = (count as u64).saturating_mul((PIXELS * std::mem::size_of::<f32>()) as u64);
    if let Some(available) = crate::io::resources::available_memory()
        && bytes > available
    {
        bail!(
            "{}: {count} images take {} as 32-bit floats but only {} of memory is available",
            path.display(),
            crate::io::resources::size(bytes),
            crate::io::resources::size(available)
        );
    }
    Ok(())
}
