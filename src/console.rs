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
