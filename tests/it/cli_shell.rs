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
