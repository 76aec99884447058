//! Lines for the user that never panic and never stop a run: a closed stdout (`| head -1`) or stderr
//! only silences them. After the first failed write to a stream nothing more is sent to it, so a run
//! that lost its reader goes on to save its model and exits quietly.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

/// `text` and a newline on stdout.
pub fn out(text: &str) {
    if !STDOUT_CLOSED.load(Ordering::Relaxed) {
        let mut stdout = std::io::stdout().lock();
        if writeln!(stdout, "{text}").and_then(|()| stdout.flush()).is_err() {
            STDOUT_CLOSED.store(true, Ordering::Relaxed);
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
