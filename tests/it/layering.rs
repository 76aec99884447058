//! The import rule of the tree: pipelines (`src/<name>/`) stand side by side on the shared layer (the
//! modules directly in `src/`, and the folders of `SHARED_FOLDERS`, among them `nn`, the engine that
//! `fit`, `mnist`'s MLP and `sales` train on), and neither imports upward nor sideways. Only the list of
//! pipelines (`pipelines.rs`) and the crate root that declares them (`lib.rs`) name them.
//! Read from the source text: every other `crate::<pipeline>` path outside its own pipeline is an arrow
//! the rule forbids. Inside a pipeline, no two of its files import each other, directly or round a circle.

use std::path::{Path, PathBuf};

/// The modules that list the pipelines, above them.
const LISTS: [&str; 2] = ["lib.rs", "pipelines.rs"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Folders of the shared layer (the rest of `src/`'s folders are pipelines).
const SHARED_FOLDERS: [&str; 3] = ["datasets", "nn", "ops"];

fn pipelines() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(src())
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_dir())
        .filter(|e| !SHARED_FOLDERS.contains(&e.file_name().to_str().unwrap()))
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
        let top = relative.components().next().unwrap().as_os_str().to_str().unwrap();
        let shared = (relative.components().count() == 1 && !LISTS.contains(&top)) || SHARED_FOLDERS.contains(&top);
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

/// The rooms of the house: each shared module (`src/NAME.rs`) and each pipeline (`src/NAME/`), with the
/// rooms each names through `crate::NAME` paths.
fn rooms() -> Vec<(String, Vec<String>)> {
    let mut names: Vec<String> = std::fs::read_dir(src())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().trim_end_matches(".rs").to_string())
        .filter(|name| !matches!(name.as_str(), "main" | "lib"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|room| {
            let dir = src().join(room);
            let files = if dir.is_dir() { rust_files(&dir) } else { vec![src().join(format!("{room}.rs"))] };
            let text: String = files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect();
            let arrows = named(&text, &names).into_iter().filter(|other| other != room).collect();
            (room.clone(), arrows)
        })
        .collect()
}

/// A circle of rooms, if there is one: each names the next, and the last the first.
fn circle(rooms: &[(String, Vec<String>)]) -> Option<Vec<String>> {
    fn visit(
        room: &str,
        rooms: &[(String, Vec<String>)],
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|r| r == room) {
            return Some(path[at..].iter().cloned().chain([room.to_string()]).collect());
        }
        if done.iter().any(|r| r == room) {
            return None;
        }
        path.push(room.to_string());
        let arrows = rooms.iter().find(|(r, _)| r == room).map(|(_, a)| a.clone()).unwrap_or_default();
        for next in &arrows {
            if let Some(found) = visit(next, rooms, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.push(room.to_string());
        None
    }
    let mut done = Vec::new();
    rooms.iter().find_map(|(room, _)| visit(room, rooms, &mut Vec::new(), &mut done))
}

#[test]
fn no_import_circles_between_rooms() {
    let rooms = rooms();
    assert!(rooms.len() > 10, "{rooms:?}");
    if let Some(found) = circle(&rooms) {
        panic!("an import circle: {}", found.join(" → "));
    }
}

/// The circle check finds a circle of three and passes a chain.
#[test]
fn the_circle_check_finds_circles() {
    let room = |name: &str, arrows: &[&str]| (name.to_string(), arrows.iter().map(|a| a.to_string()).collect());
    let chain = [room("a", &["b"]), room("b", &["c"]), room("c", &[])];
    assert_eq!(circle(&chain), None);
    let three = [room("a", &["b"]), room("b", &["c"]), room("c", &["a"])];
    assert_eq!(circle(&three), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
}

/// The files directly in a pipeline's folder (`src/<pipeline>/NAME.rs`, `mod.rs` aside), each with the
/// siblings it names through `super::NAME` or `crate::<pipeline>::NAME` paths.
fn files_of(pipeline: &str) -> Vec<(String, Vec<String>)> {
    let dir = src().join(pipeline);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|name| name != "mod")
        .collect();
    names.sort();
    names
        .iter()
        .map(|file| {
            // Code lines only (a comment may point at a sibling); both spellings of a sibling become
            // `crate::NAME`, the path `named` looks for.
            let code: String = std::fs::read_to_string(dir.join(format!("{file}.rs")))
                .unwrap()
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .map(|line| format!("{line}\n"))
                .collect();
            let text = code.replace(&format!("crate::{pipeline}::"), "crate::").replace("super::", "crate::");
            let arrows = named(&text, &names).into_iter().filter(|other| other != file).collect();
            (file.clone(), arrows)
        })
        .collect()
}

#[test]
fn no_import_circles_between_a_pipelines_files() {
    for pipeline in pipelines() {
        if let Some(found) = circle(&files_of(&pipeline)) {
            panic!("an import circle in src/{pipeline}/: {}", found.join(" → "));
        }
    }
}
