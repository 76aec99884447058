//! The import rule of the tree. The shared layer is seven rooms, each a folder of `src/` (`SHARED_FOLDERS`:
//! the commands of textnet itself, the run harness, the device, files, the maths of `ops`, the `nn` engine
//! and the data sets) beside the modules directly in `src/`; the pipelines (`src/<name>/`, every other
//! folder) stand side by side on it. Read from the source text:
//!
//! - a pipeline imports no other pipeline, and the shared layer imports none: only the list of pipelines
//!   (`pipelines.rs`) and the crate root that declares them (`lib.rs`) name them;
//! - no circle of imports between modules of different rooms (a shared room's modules are its files and
//!   folders; a pipeline is one), none between whole rooms, and none between the files of one folder;
//! - each pipeline imports at most `MOST_ROOMS` shared rooms;
//! - `ops`, the maths and the CPU twins of the kernels, knows neither the command line (clap) nor the
//!   device.

use std::path::{Path, PathBuf};

/// The modules that list the pipelines, above them.
const LISTS: [&str; 2] = ["lib.rs", "pipelines.rs"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Folders of the shared layer (the rest of `src/`'s folders are pipelines).
const SHARED_FOLDERS: [&str; 7] = ["commands", "datasets", "device", "harness", "io", "nn", "ops"];

/// The most shared rooms one pipeline may import.
const MOST_ROOMS: usize = 8;

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

/// Every `crate::…` path in `text`, with `use` groups spelled out: `crate::a::{b, c::{d, self}}` gives
/// `a::b`, `a::c::d` and `a::c`. Comment lines are left out.
fn crate_paths(text: &str) -> Vec<String> {
    fn segment(rest: &str) -> (&str, &str) {
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        (&rest[..end], &rest[end..])
    }
    /// The paths of the path or group at the start of `rest` (after `prefix`), and what follows it.
    fn expand<'a>(prefix: &str, mut rest: &'a str, out: &mut Vec<String>) -> &'a str {
        let mut path = prefix.to_string();
        loop {
            rest = rest.trim_start();
            if let Some(group) = rest.strip_prefix('{') {
                rest = group;
                loop {
                    rest = rest.trim_start();
                    if let Some(after) = rest.strip_prefix('}') {
                        return after;
                    }
                    let before = rest.len();
                    rest = expand(&path, rest, out);
                    if rest.len() == before {
                        // Not a path (`*`, `as`): step over one character.
                        rest = rest.char_indices().nth(1).map_or("", |(at, _)| &rest[at..]);
                    }
                    rest = rest.trim_start().strip_prefix(',').unwrap_or(rest);
                }
            }
            let (name, after) = segment(rest);
            if name.is_empty() {
                out.push(path);
                return rest;
            }
            if name == "self" {
                out.push(path);
                return after;
            }
            path = if path.is_empty() { name.to_string() } else { format!("{path}::{name}") };
            rest = after;
            match rest.strip_prefix("::") {
                Some(next) => rest = next,
                None => {
                    out.push(path);
                    return rest;
                }
            }
        }
    }
    let code: String =
        text.lines().filter(|line| !line.trim_start().starts_with("//")).map(|line| format!("{line}\n")).collect();
    let mut paths = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        expand("", &code[at + "crate::".len()..], &mut paths);
    }
    paths
}

/// `text` without its `#[cfg(test)]` modules (each from that line to the `}` that closes the module at
/// the start of a line).
fn without_tests(text: &str) -> String {
    let mut kept = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]" && lines.peek().is_some_and(|next| next.starts_with("mod ")) {
            lines.by_ref().find(|line| *line == "}");
            continue;
        }
        kept.push_str(line);
        kept.push('\n');
    }
    kept
}

/// The module of `src/` that `path` (as `crate_paths` gives it) lies in: for a shared folder, the folder
/// and its file or folder named next (`device::launch`), or the folder alone for its `mod.rs`; otherwise
/// the first segment (a pipeline, or a module directly in `src/`).
fn module_of(path: &str) -> String {
    let mut segments = path.split("::");
    let first = segments.next().unwrap_or_default();
    if SHARED_FOLDERS.contains(&first)
        && let Some(second) = segments.next()
        && (src().join(first).join(format!("{second}.rs")).is_file() || src().join(first).join(second).is_dir())
    {
        return format!("{first}::{second}");
    }
    first.to_string()
}

/// The room of a module: its first segment.
fn room_of(module: &str) -> &str {
    module.split("::").next().unwrap_or_default()
}

/// Every file of `src/` but `main.rs` and `lib.rs`, with the module it is (`module_of` of its path).
fn modules() -> Vec<(String, PathBuf)> {
    let mut files: Vec<(String, PathBuf)> = rust_files(&src())
        .into_iter()
        .filter_map(|file| {
            let relative = file.strip_prefix(src()).unwrap().with_extension("");
            let path: Vec<String> =
                relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            let path = path.iter().filter(|s| *s != "mod").cloned().collect::<Vec<_>>().join("::");
            (!matches!(path.as_str(), "main" | "lib")).then(|| (module_of(&path), file))
        })
        .collect();
    files.sort();
    files
}

/// The modules of `src/` with the modules of other rooms each imports: the program's imports, its
/// `#[cfg(test)]` modules left out (a unit test may read what it checks from anywhere).
fn module_arrows() -> Vec<(String, Vec<String>)> {
    let mut arrows: Vec<(String, Vec<String>)> = Vec::new();
    for (module, file) in modules() {
        let text = without_tests(&std::fs::read_to_string(&file).unwrap());
        let mut named: Vec<String> = crate_paths(&text)
            .iter()
            .map(|path| module_of(path))
            .filter(|other| room_of(other) != room_of(&module))
            .collect();
        match arrows.iter_mut().find(|(m, _)| *m == module) {
            Some((_, list)) => list.append(&mut named),
            None => arrows.push((module, named)),
        }
    }
    for (_, list) in &mut arrows {
        list.sort();
        list.dedup();
    }
    arrows
}

#[test]
fn no_import_circles_between_rooms() {
    let modules = module_arrows();
    assert!(modules.len() > 40, "{modules:?}");
    if let Some(found) = circle(&modules) {
        panic!("an import circle: {}", found.join(" → "));
    }
}

/// Nor between whole rooms (a shared folder, a module directly in `src/`, a pipeline): the rooms stand in
/// floors, each importing only rooms below it.
#[test]
fn no_import_circles_between_whole_rooms() {
    let mut rooms: Vec<(String, Vec<String>)> = Vec::new();
    for (module, arrows) in module_arrows() {
        let mut named: Vec<String> = arrows.iter().map(|a| room_of(a).to_string()).collect();
        let room = room_of(&module).to_string();
        match rooms.iter_mut().find(|(r, _)| *r == room) {
            Some((_, list)) => list.append(&mut named),
            None => rooms.push((room, named)),
        }
    }
    for (_, list) in &mut rooms {
        list.sort();
        list.dedup();
    }
    assert!(rooms.len() > 12, "{rooms:?}");
    if let Some(found) = circle(&rooms) {
        panic!("an import circle between rooms: {}", found.join(" → "));
    }
}

#[test]
fn each_pipeline_imports_few_shared_rooms() {
    let modules = module_arrows();
    let mut crowded = Vec::new();
    for pipeline in pipelines() {
        let mut rooms: Vec<&str> = modules
            .iter()
            .filter(|(module, _)| *module == pipeline)
            .flat_map(|(_, arrows)| arrows.iter().map(|a| room_of(a)))
            .collect();
        rooms.sort();
        rooms.dedup();
        if rooms.len() > MOST_ROOMS {
            crowded.push(format!("{pipeline}: {} rooms, {}", rooms.len(), rooms.join(", ")));
        }
    }
    assert!(crowded.is_empty(), "pipelines importing more than {MOST_ROOMS} shared rooms:\n{}", crowded.join("\n"));
}

#[test]
fn ops_knows_neither_the_command_line_nor_the_device() {
    let mut found = Vec::new();
    for file in rust_files(&src().join("ops")) {
        let code = without_tests(&std::fs::read_to_string(&file).unwrap());
        let relative = file.strip_prefix(src()).unwrap().display().to_string();
        if code.contains("clap::") {
            found.push(format!("{relative} → clap"));
        }
        if crate_paths(&code).iter().any(|path| room_of(path) == "device") {
            found.push(format!("{relative} → device"));
        }
    }
    assert!(found.is_empty(), "ops importing the command line or the device:\n{}", found.join("\n"));
}

/// The path reader spells out groups and nested groups, and the module reader finds a shared folder's
/// files; a test module is left out of what `ops` is checked on.
#[test]
fn the_path_and_module_readers_read_paths() {
    let paths = crate_paths(
        "use crate::device::{self, Gpu, launch::{Arg, Kernel}};\nlet x = crate::ops::cpu::dot(a);\n// crate::xor",
    );
    assert_eq!(paths, ["device", "device::Gpu", "device::launch::Arg", "device::launch::Kernel", "ops::cpu::dot"]);
    assert_eq!(module_of("device::launch::Arg"), "device::launch");
    assert_eq!(module_of("device::Gpu"), "device");
    assert_eq!(module_of("text::model::TextParams"), "text");
    assert_eq!(module_of("nn::stack::gpu"), "nn::stack");
    let code = without_tests("use a;\n#[cfg(test)]\nmod tests {\n    use crate::device;\n}\nfn b() {}\n");
    assert_eq!(code, "use a;\nfn b() {}\n");
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

/// The circle check finds a circle of three and passes a chain.
#[test]
fn the_circle_check_finds_circles() {
    let room = |name: &str, arrows: &[&str]| (name.to_string(), arrows.iter().map(|a| a.to_string()).collect());
    let chain = [room("a", &["b"]), room("b", &["c"]), room("c", &[])];
    assert_eq!(circle(&chain), None);
    let three = [room("a", &["b"]), room("b", &["c"]), room("c", &["a"])];
    assert_eq!(circle(&three), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
}

/// The files directly in a folder of `src/` (`src/<folder>/NAME.rs`, `mod.rs` aside), each with the
/// siblings it names through `super::NAME` or `crate::<folder>::NAME` paths.
fn files_of(folder: &str) -> Vec<(String, Vec<String>)> {
    let dir = src().join(folder);
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
            let text = code.replace(&format!("crate::{folder}::"), "crate::").replace("super::", "crate::");
            let arrows = named(&text, &names).into_iter().filter(|other| other != file).collect();
            (file.clone(), arrows)
        })
        .collect()
}

#[test]
fn no_import_circles_between_a_folders_files() {
    for folder in pipelines().into_iter().chain(SHARED_FOLDERS.map(String::from)) {
        if let Some(found) = circle(&files_of(&folder)) {
            panic!("an import circle in src/{folder}/: {}", found.join(" → "));
        }
    }
}
