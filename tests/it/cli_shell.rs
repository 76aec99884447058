//! What a shell user expects of a command-line tool: completion scripts and a manual page generated from
//! the same flags as `--help`, and no colour where NO_COLOR is set.

use crate::common::{stderr, stdout, textnet};
use std::process::Command;

#[test]
fn completion_scripts_name_every_command_and_flag() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = textnet(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let script = stdout(&o);
        for word in ["transformer", "classify", "selftest", "resume", "overwrite"] {
            assert!(script.contains(word), "{shell}: {word} missing");
        }
    }
    let o = textnet(&["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("invalid value 'tcsh'"), "{}", stderr(&o));
}

#[test]
fn the_manual_page_is_roff_with_the_commands() {
    let o = textnet(&["man"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let page = stdout(&o);
    assert!(page.starts_with(".ie") || page.starts_with(".TH"), "{}", &page[..page.len().min(200)]);
    assert!(page.contains(".TH textnet 1"), "no title line");
    for command in ["train", "transformer", "mnist", "sales", "generate"] {
        assert!(page.contains(command), "{command} missing");
    }
}

/// The pages textnet's page refers to exist: `textnet man COMMAND` prints the page it names
/// `textnet-COMMAND(1)`, a bench's too, and an unknown name is one line naming the known ones.
#[test]
fn every_page_the_manual_refers_to_can_be_printed() {
    let page = |path: &[&str]| {
        let o = textnet(&[&["man"][..], path].concat());
        assert!(o.status.success(), "{path:?}: {}", stderr(&o));
        stdout(&o)
    };
    // roff writes a hyphen as `\-`.
    let references = |page: &str| -> Vec<String> {
        let lines = page.lines().map(|l| l.replace("\\-", "-"));
        lines.filter_map(|l| l.strip_prefix("textnet-")?.strip_suffix("(1)").map(String::from)).collect()
    };
    let top = references(&page(&[]));
    for command in ["train", "fit", "transformer", "generate", "bench", "man"] {
        assert!(top.iter().any(|c| c == command), "textnet-{command}(1) missing from {top:?}");
    }
    assert!(!top.iter().any(|c| c == "help"), "a page for clap's help command: {top:?}");
    let source = format!("\"textnet {}\"", env!("CARGO_PKG_VERSION"));
    for command in &top {
        let sub = page(&[command]);
        assert!(sub.contains(&format!(".TH textnet-{command} 1  {source}")), "{command}: no title line");
        assert!(sub.contains(&format!("textnet {command}")), "{command}: no synopsis");
        let nested_pages = references(&sub);
        assert!(!nested_pages.iter().any(|c| c.ends_with("-help")), "a page for clap's help command: {nested_pages:?}");
        for nested in nested_pages {
            let path = nested.strip_prefix(&format!("{command}-")).unwrap_or_else(|| panic!("{command}: {nested}"));
            let nested_page = page(&[command, path]);
            assert!(nested_page.contains(&format!(".TH textnet-{nested} 1")), "{nested}: no title line");
        }
    }
    assert!(page(&["fit"]).contains("layers"), "fit's page has its flags");
    let o = textnet(&["man", "trian"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("`textnet` has no command `trian` (its commands: "), "{}", stderr(&o));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    let o = textnet(&["man", "generate", "x"]);
    assert!(stderr(&o).contains("`textnet generate` has no commands"), "{}", stderr(&o));
}

/// Help is coloured only where colour is wanted: forced with CLICOLOR_FORCE, and never with NO_COLOR
/// (https://no-color.org), which wins. The rest of textnet's output has no colour at all.
#[test]
fn no_color_turns_colour_off() {
    let help = |no_color: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_textnet"));
        command.args(["train", "--help"]).env("CLICOLOR_FORCE", "1").env_remove("NO_COLOR");
        if no_color {
            command.env("NO_COLOR", "1");
        }
        String::from_utf8(command.output().unwrap().stdout).unwrap()
    };
    assert!(help(false).contains('\u{1b}'), "CLICOLOR_FORCE gives colour");
    assert!(!help(true).contains('\u{1b}'), "NO_COLOR takes it away");
}
