//! The documentation cannot drift from the code: every relative link in README.md and docs/ leads to a
//! file (and, for `#anchor`, to a heading of it), and every command example in a ```` ```console ```` block
//! runs with this build's binary and exits 0. A block whose fence follows the line `<!-- docs: parse only,
//! WHY -->` (it needs a GPU, or files the reader brings) is only parsed: each `$ textnet …` line runs with
//! `--help` appended, so clap still reads every flag before it. Examples are written at a size that runs
//! in seconds on the CPU. And every command `textnet --help` lists has its page, docs/commands/NAME.md,
//! showing its `Usage:` line as `--help` prints it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const PARSE_ONLY: &str = "<!-- docs: parse only";

/// README.md and every Markdown file under docs/, in a fixed order.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "md") {
                found.push(path);
            }
        }
    }
    let mut found = vec![Path::new(ROOT).join("README.md")];
    walk(&Path::new(ROOT).join("docs"), &mut found);
    found
}

/// A page's lines, each with whether it lies inside a fenced code block (the fences themselves count as
/// inside).
fn lines_with_fences(text: &str) -> Vec<(&str, bool)> {
    let mut fence: Option<&str> = None;
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            match fence {
                Some(open) if trimmed.starts_with(open) => {
                    fence = None;
                    (line, true)
                }
                Some(_) => (line, true),
                None if trimmed.starts_with("```") || trimmed.starts_with("~~~") => {
                    fence = Some(&trimmed[..3]);
                    (line, true)
                }
                None => (line, false),
            }
        })
        .collect()
}

/// The line without its inline code spans (a link inside backticks is text, not a link).
fn without_code_spans(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// The targets of a line's inline links and images, `[text](target)`.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchor for a heading: lower case, letters, digits, `-` and `_` kept, spaces made `-`, the rest
/// dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings, repeats numbered as GitHub numbers them (`name`, `name-1`, …).
fn anchors(page: &Path) -> HashSet<String> {
    let text = std::fs::read_to_string(page).unwrap();
    let mut found = HashSet::new();
    for (line, fenced) in lines_with_fences(&text) {
        let Some(heading) = line.strip_prefix('#').map(|h| h.trim_start_matches('#')) else { continue };
        if fenced || !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading);
        let mut anchor = base.clone();
        let mut n = 0;
        while !found.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    found
}

#[test]
fn the_slugs_are_githubs() {
    assert_eq!(slug("MNIST CNN (`2026-11-24-h100-141ccf3`)"), "mnist-cnn-2026-11-24-h100-141ccf3");
    assert_eq!(slug("`textnet fit --layers SPEC`"), "textnet-fit---layers-spec");
    assert_eq!(slug("Rust: `textnet::nn`"), "rust-textnetnn");
    assert_eq!(link_targets("see [a](x.md#b) and `[c](not-a-link)` and ![d](e.png \"title\")"), ["x.md#b", "e.png"]);
}

#[test]
fn every_relative_link_leads_to_a_file_and_heading() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (number, (line, fenced)) in lines_with_fences(&text).into_iter().enumerate() {
            if fenced {
                continue;
            }
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let file = if path.is_empty() { page.clone() } else { page.parent().unwrap().join(path) };
                let at = format!("{}:{}: {target}", page.strip_prefix(ROOT).unwrap().display(), number + 1);
                if !file.exists() {
                    broken.push(format!("{at}: no such file"));
                } else if !anchor.is_empty()
                    && file.extension().is_some_and(|e| e == "md")
                    && !anchors(&file).contains(anchor)
                {
                    broken.push(format!("{at}: no such heading"));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} links found: is the scanner broken?");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// An example block: where it is, whether it only parses, and its `$ ` lines without the prompt.
struct Example {
    at: String,
    parse_only: bool,
    commands: Vec<String>,
}

fn examples() -> Vec<Example> {
    let mut found = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            if lines[i].trim() != "```console" {
                i += 1;
                continue;
            }
            let previous = lines[..i].iter().rev().find(|l| !l.trim().is_empty()).copied().unwrap_or("");
            let start = i;
            i += 1;
            let mut commands = Vec::new();
            while i < lines.len() && !lines[i].trim_start().starts_with("```") {
                if let Some(command) = lines[i].strip_prefix("$ ") {
                    commands.push(command.to_string());
                }
                i += 1;
            }
            let at = format!("{}:{}", page.strip_prefix(ROOT).unwrap().display(), start + 1);
            assert!(!commands.is_empty(), "{at}: a console block without a `$ ` line");
            found.push(Example { at, parse_only: previous.trim_start().starts_with(PARSE_ONLY), commands });
            i += 1;
        }
    }
    found
}

/// Runs `script` with bash in `dir`, the binary first on PATH; the failure, if any, with what it printed.
fn run_script(script: &str, dir: &Path) -> Result<(), String> {
    let bin = Path::new(env!("CARGO_BIN_EXE_textnet")).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let o = Command::new("bash").args(["-c", script]).current_dir(dir).env("PATH", path).output().unwrap();
    match o.status.success() {
        true => Ok(()),
        false => Err(format!(
            "exit status {:?}\n--- stdout (end)\n{}\n--- stderr (end)\n{}",
            o.status.code(),
            tail(&o.stdout),
            tail(&o.stderr)
        )),
    }
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

#[test]
fn every_command_example_runs() {
    let examples = examples();
    assert!(examples.iter().filter(|e| !e.parse_only).count() >= 10, "too few examples found");
    let mut failed = Vec::new();
    for example in examples {
        // Each block in a folder of its own, where the repository's corpus and scripts are at hand.
        let dir = tempfile::tempdir().unwrap();
        for shared in ["corpus", "scripts"] {
            std::os::unix::fs::symlink(Path::new(ROOT).join(shared), dir.path().join(shared)).unwrap();
        }
        let script = match example.parse_only {
            false => format!("set -e\n{}", example.commands.join("\n")),
            true => {
                let mut lines = vec!["set -e".to_string()];
                for command in &example.commands {
                    assert!(
                        command.starts_with("textnet ") && !command.contains(['|', '>', ';', '&']),
                        "{}: a parse-only example is one textnet command a line: {command}",
                        example.at
                    );
                    lines.push(format!("{command} --help > /dev/null"));
                }
                lines.join("\n")
            }
        };
        if let Err(why) = run_script(&script, dir.path()) {
            failed.push(format!("{}: {}\n{why}", example.at, example.commands.join("; ")));
        }
    }
    assert!(failed.is_empty(), "examples that failed:\n{}", failed.join("\n\n"));
}

/// The command names `textnet --help` lists, without clap's `help`.
fn command_names() -> Vec<String> {
    let help = Command::new(env!("CARGO_BIN_EXE_textnet")).arg("--help").output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let listed = help.split("Commands:\n").nth(1).expect("a list of commands");
    let listed = listed.split("\n\n").next().unwrap();
    listed
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|&name| name != "help")
        .map(String::from)
        .collect()
}

#[test]
fn every_command_has_a_page_with_its_usage() {
    let names = command_names();
    assert!(names.len() >= 15, "{names:?}");
    for name in names {
        let page = Path::new(ROOT).join("docs/commands").join(format!("{name}.md"));
        let text = std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        let help = Command::new(env!("CARGO_BIN_EXE_textnet")).args([&name, "--help"]).output().unwrap();
        let help = String::from_utf8(help.stdout).unwrap();
        let usage = help.lines().find(|line| line.starts_with("Usage: ")).expect("a usage line");
        assert!(
            text.lines().any(|line| line == usage),
            "docs/commands/{name}.md lacks `textnet {name} --help`'s `{usage}`"
        );
    }
}
