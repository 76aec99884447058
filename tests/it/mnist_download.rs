//! The MNIST download: a file whose SHA-256 is not the published one is not kept, and a failed download
//! leaves no empty cache folder behind. A local HTTP server stands in for the mirror
//! (`TEXTNET_MNIST_MIRROR`).

use crate::common::text;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

/// Serves `body` to every request on a loopback port, for at most `requests` requests.
fn serve(body: &'static [u8], requests: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}/", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().take(requests) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            let _ = stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body));
        }
    });
    address
}

#[test]
fn a_download_with_the_wrong_checksum_is_not_kept() {
    let cache = tempfile::tempdir().unwrap();
    let mirror = serve(b"not the MNIST training images", 4);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_textnet"))
        .args(["mnist", "--dataset", "mnist", "--device", "cpu", "--epochs", "1"])
        .env("TEXTNET_CACHE", cache.path())
        .env("TEXTNET_DATA", cache.path().join("none"))
        .env("TEXTNET_MNIST_MIRROR", &mirror)
        .current_dir(cache.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("is not the published 440fcabf"), "{stderr}");
    assert!(stderr.contains("put train-images-idx3-ubyte"), "the offline advice stays: {stderr}");
    assert!(!cache.path().join("mnist").exists(), "a failed download left its folder behind");
}

#[test]
fn an_unreachable_mirror_leaves_nothing_behind() {
    let cache = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_textnet"))
        .args(["mnist", "--dataset", "mnist", "--device", "cpu", "--epochs", "1"])
        .env("TEXTNET_CACHE", cache.path())
        .env("TEXTNET_DATA", cache.path().join("none"))
        .env("TEXTNET_MNIST_MIRROR", format!("http://127.0.0.1:{port}/"))
        .current_dir(cache.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr).trim_end().lines().count(), 1, "{}", text(&out.stderr));
    assert!(!cache.path().join("mnist").exists());
}
