//! Lines for the user that never panic. A closed stdout (`| head -1`, EPIPE) only silences them: after
//! it nothing more is sent there, a run that lost its reader goes on to save its model and exits
//! quietly, and readers of standard input (`predict`) stop. Any other failed write to stdout (a full
//! disk, /dev/full, an I/O error) loses the command's product, so it is kept and `finish` turns it into
//! the command's error and a non-zero exit.

use std::io::{ErrorKind, Write};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);
/// The first failed write to stdout that was not EPIPE.
static STDOUT_ERROR: Mutex<Option<std::io::Error>> = Mutex::new(None);

/// `text` and a newline on stdout.
pub fn out(text: &str) {
    print(&format!("{text}\n"));
}

/// `text` on stdout, flushed at once (no newline added): a piece of a line that streams.
pub fn print(text: &str) {
    if !STDOUT_CLOSED.load(Ordering::Relaxed) {
        let mut stdout = std::io::stdout().lock();
        if let Err(e) = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
            if e.kind() != ErrorKind::BrokenPipe {
                STDOUT_ERROR.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            }
        }
    }
}

/// `text` and a newline on stderr.
pub fn err(text: &str) {
    if !STDERR_CLOSED.load(Ordering::Relaxed) && writeln!(std::io::stderr(), "{text}").is_err() {
        STDERR_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// `text` on stderr when `to_stderr`, else on stdout.
pub fn line(to_stderr: bool, text: &str) {
    if to_stderr { err(text) } else { out(text) }
}

/// Whether stdout can take no more lines (its reader is gone, or a write failed).
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

/// The end of every command: an error if something written to stdout was lost to anything but EPIPE.
pub fn finish() -> anyhow::Result<()> {
    match STDOUT_ERROR.lock().unwrap_or_else(|p| p.into_inner()).take() {
        Some(e) => Err(anyhow::anyhow!("cannot write to standard output: {e}; what it should have printed is lost")),
        None => Ok(()),
    }
}

/// Most characters of a user's value (a spec, a cell, a path) that an error line quotes.
pub const QUOTE_LIMIT: usize = 200;

/// `text` as an error line quotes it: whole when it is at most `QUOTE_LIMIT` characters, else its first
/// and last characters around "…" and its length, so that a 6 MB spec makes a line a person can read.
pub fn abridged(text: &str) -> String {
    let count = text.chars().count();
    if count <= QUOTE_LIMIT {
        return text.to_string();
    }
    let head: String = text.chars().take(QUOTE_LIMIT / 2).collect();
    let tail: String = text.chars().skip(count - QUOTE_LIMIT / 4).collect();
    format!("{head} … {tail} ({count} characters)")
}

/// A `--predict` run's TSV: written to `to` (atomically), else printed on stdout; then, unless `quiet`, how
/// many of the table's rows were skipped as bad.
pub fn predictions(tsv: &str, to: Option<&std::path::Path>, skipped_rows: usize, quiet: bool) -> anyhow::Result<()> {
    match to {
        Some(path) => crate::io::fsutil::write_atomic(path, tsv.as_bytes())?,
        None => out(tsv.trim_end()),
    }
    if skipped_rows > 0 && !quiet {
        err(&format!("skipped {skipped_rows} bad row{}", if skipped_rows == 1 { "" } else { "s" }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abridged_keeps_short_text_and_cuts_long_text_on_characters() {
        assert_eq!(abridged("ReLU, Linear(10)"), "ReLU, Linear(10)");
        let long = "é".repeat(QUOTE_LIMIT + 1);
        let cut = abridged(&long);
        assert!(cut.chars().count() < QUOTE_LIMIT, "{cut}");
        assert!(cut.ends_with(&format!("({} characters)", QUOTE_LIMIT + 1)), "{cut}");
        assert_eq!(abridged(&"x".repeat(QUOTE_LIMIT)), "x".repeat(QUOTE_LIMIT));
    }
}
