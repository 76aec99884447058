//! The IDX reader on small files written here, raw and gzipped, well-formed and broken.

use flate2::{Compression, write::GzEncoder};
use std::io::Write;
use std::path::{Path, PathBuf};
use textnet::datasets::mnist::{self, Dataset};
use textnet::mnist::idx::{self, load_split, read_idx};

fn idx_bytes(magic: u32, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = magic.to_be_bytes().to_vec();
    dims.iter().for_each(|d| out.extend(d.to_be_bytes()));
    out.extend_from_slice(data);
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// `n` 28×28 images whose pixel p of image i is (i·7 + p) mod 256, and labels `labels`.
fn sample(n: usize) -> (Vec<u8>, Vec<u8>) {
    let pixels = (0..n * idx::PIXELS).map(|k| ((k / idx::PIXELS) * 7 + k % idx::PIXELS) as u8).collect();
    let labels = (0..n).map(|i| (i * 3 % 10) as u8).collect();
    (pixels, labels)
}

fn images_file(n: usize) -> Vec<u8> {
    idx_bytes(0x803, &[n as u32, 28, 28], &sample(n).0)
}

fn labels_file(n: usize) -> Vec<u8> {
    idx_bytes(0x801, &[n as u32], &sample(n).1)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn check_split(split: &idx::Split, n: usize) {
    let (pixels, labels) = sample(n);
    assert_eq!(split.len(), n);
    assert_eq!(split.pixels, 784);
    assert_eq!(split.labels, labels);
    assert_eq!(split.images.len(), n * 784);
    for (got, &raw) in split.images.iter().zip(&pixels) {
        assert_eq!(*got, raw as f32 / 255.0);
    }
    assert!(split.images.iter().all(|&p| (0.0..=1.0).contains(&p)));
    assert_eq!(split.images.iter().cloned().fold(0.0, f32::max), 1.0);
}

fn error_of(result: anyhow::Result<impl std::fmt::Debug>) -> String {
    format!("{:#}", result.expect_err("expected an error"))
}

#[test]
fn raw_and_gzipped_files_load_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let n = 5;
    let img = write(dir.path(), "img", &images_file(n));
    let lbl = write(dir.path(), "lbl", &labels_file(n));
    check_split(&load_split(&img, &lbl).unwrap(), n);
    let img_gz = write(dir.path(), "img.gz", &gzip(&images_file(n)));
    let lbl_gz = write(dir.path(), "lbl.gz", &gzip(&labels_file(n)));
    check_split(&load_split(&img_gz, &lbl_gz).unwrap(), n);
    // Gzip is recognised by its magic, not the file name.
    let misnamed = write(dir.path(), "img-raw-name", &gzip(&images_file(n)));
    check_split(&load_split(&misnamed, &lbl).unwrap(), n);
}

#[test]
fn truncated_files_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let full = images_file(3);
    let cut_data = write(dir.path(), "cut-data", &full[..full.len() - 1]);
    let e = error_of(read_idx(&cut_data, 3));
    assert!(e.contains("cut-data") && e.contains("truncated") && e.contains("2351"), "{e}");
    let cut_header = write(dir.path(), "cut-header", &full[..10]);
    let e = error_of(read_idx(&cut_header, 3));
    assert!(e.contains("cut-header") && e.contains("truncated") && e.contains("header"), "{e}");
    let empty = write(dir.path(), "empty", &[]);
    assert!(error_of(read_idx(&empty, 1)).contains("truncated"));
    // Gzip of a short payload, and a gzip stream cut in the middle.
    let short_gz = write(dir.path(), "short.gz", &gzip(&full[..full.len() - 100]));
    let e = error_of(read_idx(&short_gz, 3));
    assert!(e.contains("short.gz") && e.contains("truncated"), "{e}");
    let gz = gzip(&full);
    let cut_gz = write(dir.path(), "cut.gz", &gz[..gz.len() / 2]);
    let e = error_of(read_idx(&cut_gz, 3));
    assert!(e.contains("cut.gz") && e.contains("truncated"), "{e}");
}

#[test]
fn wrong_magic_and_trailing_bytes_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let labels = write(dir.path(), "labels", &labels_file(3));
    let e = error_of(read_idx(&labels, 3));
    assert!(e.contains("labels") && e.contains("wrong magic") && e.contains("0x00000801"), "{e}");
    let floats = write(dir.path(), "floats", &idx_bytes(0xD03, &[1, 28, 28], &[0; 784 * 4]));
    assert!(error_of(read_idx(&floats, 3)).contains("wrong magic"));
    let mut long = labels_file(3);
    long.push(0);
    let long = write(dir.path(), "long", &long);
    let e = error_of(read_idx(&long, 1));
    assert!(e.contains("long") && e.contains("unexpected bytes"), "{e}");
}

#[test]
fn splits_are_checked_for_agreement_size_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    let img = write(dir.path(), "img3", &images_file(3));
    let lbl2 = write(dir.path(), "lbl2", &labels_file(2));
    let e = error_of(load_split(&img, &lbl2));
    assert!(e.contains("mismatched counts") && e.contains("img3") && e.contains("lbl2"), "{e}");
    assert!(e.contains("3 images") && e.contains("2 labels"), "{e}");

    let small = write(dir.path(), "small", &idx_bytes(0x803, &[1, 28, 27], &[0; 28 * 27]));
    let lbl1 = write(dir.path(), "lbl1", &labels_file(1));
    let e = error_of(load_split(&small, &lbl1));
    assert!(e.contains("small") && e.contains("28×27"), "{e}");

    let bad_label = write(dir.path(), "bad-label", &idx_bytes(0x801, &[3], &[1, 10, 2]));
    let e = error_of(load_split(&img, &bad_label));
    assert!(e.contains("bad-label") && e.contains("label 10 at index 1"), "{e}");

    // A header promising far more than the file holds is read as truncated, not allocated up front.
    let huge = write(dir.path(), "huge", &idx_bytes(0x803, &[u32::MAX, 28, 28], &[0; 100]));
    assert!(error_of(read_idx(&huge, 3)).contains("truncated"));
}

#[test]
fn a_data_directory_needs_all_four_files() {
    let dir = tempfile::tempdir().unwrap();
    let (n_train, n_test) = (4, 2);
    write(dir.path(), "train-images-idx3-ubyte.gz", &gzip(&images_file(n_train)));
    write(dir.path(), "train-labels-idx1-ubyte", &labels_file(n_train));
    write(dir.path(), "t10k-images-idx3-ubyte", &images_file(n_test));
    let e = error_of(mnist::load(Dataset::Mnist, Some(dir.path()), &|_| {}).map(|d| d.dir));
    assert!(e.contains("t10k-labels-idx1-ubyte") && !e.contains("train-labels-idx1-ubyte not found"), "{e}");
    write(dir.path(), "t10k-labels-idx1-ubyte.gz", &gzip(&labels_file(n_test)));
    let loaded = mnist::load(Dataset::Mnist, Some(dir.path()), &|_| {}).unwrap();
    check_split(&loaded.train, n_train);
    check_split(&loaded.test, n_test);
    assert_eq!(loaded.dir, dir.path());
}

#[test]
fn gzip_members_trailing_bytes_and_checksums() {
    let dir = tempfile::tempdir().unwrap();
    let full = images_file(3);
    // Several members concatenate (as `cat a.gz b.gz` or pigz make them).
    let mut multi = gzip(&full[..1000]);
    multi.extend(gzip(&full[1000..]));
    let multi = write(dir.path(), "multi.gz", &multi);
    assert_eq!(read_idx(&multi, 3).unwrap().data, &full[16..]);

    let mut extra_member = gzip(&full);
    extra_member.extend(gzip(&[0]));
    let extra_member = write(dir.path(), "extra-member.gz", &extra_member);
    let e = error_of(read_idx(&extra_member, 3));
    assert!(e.contains("extra-member.gz") && e.contains("unexpected bytes"), "{e}");

    // An empty member after the data adds no bytes.
    let mut empty_member = gzip(&full);
    empty_member.extend(gzip(&[]));
    let empty_member = write(dir.path(), "empty-member.gz", &empty_member);
    assert_eq!(read_idx(&empty_member, 3).unwrap().data, &full[16..]);

    for (name, tail, expected) in [
        ("garbage.gz", &b"not gzip"[..], "unexpected bytes after the gzip data"),
        ("zeros.gz", &[0u8; 512][..], "unexpected bytes after the gzip data"),
        ("cut-member.gz", &[0x1f][..], "truncated or corrupt gzip data"),
    ] {
        let mut bytes = gzip(&full);
        bytes.extend(tail);
        let path = write(dir.path(), name, &bytes);
        let e = error_of(read_idx(&path, 3));
        assert!(e.contains(name) && e.contains(expected), "{e}");
    }

    // A wrong CRC-32 (the first 4 bytes of the trailer) is reported as corruption, also where the stream
    // holds more bytes than the header promises.
    for (name, payload) in [("bad-crc.gz", full.clone()), ("bad-crc-long.gz", [&full[..], b"x"].concat())] {
        let mut bytes = gzip(&payload);
        let crc_at = bytes.len() - 8;
        bytes[crc_at] ^= 0xff;
        let path = write(dir.path(), name, &bytes);
        let e = error_of(read_idx(&path, 3));
        assert!(e.contains(name) && e.contains("checksum") && !e.contains("unexpected bytes"), "{e}");
    }
}
