//! Ctrl-C during training: the first one asks the run to stop once the current epoch is saved, a second
//! one ends the process at once (an interrupted save leaves only a temporary file, which the next save
//! of the same target removes).

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);
/// Set where the embedding program (the Python package) catches Ctrl-C itself and calls `request`.
static HOSTED: AtomicBool = AtomicBool::new(false);

/// The exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_STATUS: i32 = 130;

/// Installs the handler. Where it cannot be installed, Ctrl-C keeps its default effect.
pub fn install() {
    if HOSTED.load(Ordering::SeqCst) {
        return;
    }
    let _ = ctrlc::set_handler(|| {
        if REQUESTED.swap(true, Ordering::SeqCst) {
            std::process::exit(EXIT_STATUS);
        }
        crate::harness::console::err("textnet: stopping after this epoch is saved (Ctrl-C again to stop at once)");
    });
}

/// For a program that embeds textnet and catches Ctrl-C itself (Python raises `KeyboardInterrupt`):
/// `install` then leaves the signal alone, and the host calls `request` instead.
pub fn hosted() {
    HOSTED.store(true, Ordering::SeqCst);
}

/// Asks the run to stop after the current epoch, as a first Ctrl-C does.
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Forgets a request, before the next run of a program that runs several.
pub fn reset() {
    REQUESTED.store(false, Ordering::SeqCst);
}

/// Whether Ctrl-C was pressed.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// The error of a run that Ctrl-C stopped early, saying what was saved; `main` exits with `EXIT_STATUS`.
#[derive(Debug)]
pub struct Interrupted(pub String);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Interrupted {}
