//! The import rule of the tree: pipelines (`src/<name>/`) stand side by side on the shared layer (the
//! modules directly in `src/`), and neither imports upward. Only the list of pipelines (`pipelines.rs`)
//! and the crate root that declares them (`lib.rs`) name them. Read from the source
//! text: every `crate::<pipeline>` path outside its own pipeline is an arrow the rule forbids.

use std::path::{Path, PathBuf};

/// The modules that list the pipelines, above them.
const LISTS: [&str; 2] = ["lib.rs", "pipelines.rs"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn pipelines() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(src())
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The pipelines `text` names through `crate::NAME` paths (whole path segments only).
fn named(text: &str, pipelines: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for name in pipelines {
        let path = format!("crate::{name}");
        let mut rest = text;
        while let Some(at) = rest.find(&path) {
            let after = rest[at + path.len()..].chars().next();
            if !after.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                found.push(name.clone());
                break;
            }
            rest = &rest[at + path.len()..];
        }
    }
    found
}

#[test]
fn pipelines_import_only_the_shared_layer() {
    let pipelines = pipelines();
    assert!(pipelines.len() >= 6, "pipelines found: {pipelines:?}");
    let mut arrows = Vec::new();
    for pipeline in &pipelines {
        for file in rust_files(&src().join(pipeline)) {
            let text = std::fs::read_to_string(&file).unwrap();
            for other in named(&text, &pipelines).into_iter().filter(|other| other != pipeline) {
                arrows.push(format!("{} → {other}", file.strip_prefix(src()).unwrap().display()));
            }
        }
    }
    assert!(arrows.is_empty(), "pipelines importing other pipelines:\n{}", arrows.join("\n"));
}

#[test]
fn the_shared_layer_imports_no_pipeline() {
    let pipelines = pipelines();
    let mut arrows = Vec::new();
    for file in rust_files(&src()) {
        let relative = file.strip_prefix(src()).unwrap();
        let shared = relative.components().count() == 1 && !LISTS.contains(&relative.to_str().unwrap());
        if shared {
            for pipeline in named(&std::fs::read_to_string(&file).unwrap(), &pipelines) {
                arrows.push(format!("{} → {pipeline}", relative.display()));
            }
        }
    }
    assert!(arrows.is_empty(), "shared modules importing pipelines:\n{}", arrows.join("\n"));
}

/// The check itself: it sees a real arrow, and not a name that only starts like a pipeline's.
#[test]
fn the_check_finds_arrows_and_only_arrows() {
    let pipelines = vec!["text".to_string(), "xor".to_string()];
    assert_eq!(named("use crate::text::model::X;", &pipelines), ["text"]);
    assert_eq!(named("let y = crate::xor::modelfile::KIND;", &pipelines), ["xor"]);
    assert!(named("use crate::textual::X; use crate::xorshift;", &pipelines).is_empty());
}
