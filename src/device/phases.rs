//! `--verbose`: where a command's start-up time goes. Each phase (loading the driver and NVRTC, creating
//! the CUDA context, compiling or reading each kernel module, loading it) prints one line on stderr: the
//! time since the process started and the phase's own duration. Silent unless `--verbose` is given.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

static VERBOSE: AtomicBool = AtomicBool::new(false);
static STARTED: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Turns the phase lines on or off; call it first thing, so that times count from the process start.
pub fn set_verbose(on: bool) {
    LazyLock::force(&STARTED);
    VERBOSE.store(on, Ordering::Relaxed);
}

/// Whether `--verbose` turned the phase lines on.
pub fn verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

/// Runs `work`, and with `--verbose` prints how long it took, described by `what` (called after `work`,
/// so that it can say what `work` found, e.g. whether a kernel came from the cache).
pub fn timed<T>(work: impl FnOnce() -> T, what: impl FnOnce(&T) -> String) -> T {
    if !verbose() {
        return work();
    }
    let started = Instant::now();
    let result = work();
    note(started, &what(&result));
    result
}

/// With `--verbose`, one phase line for something that began at `started`.
pub fn note(started: Instant, what: &str) {
    if verbose() {
        let (at, took) = (STARTED.elapsed().as_secs_f64(), started.elapsed().as_secs_f64());
        eprintln!("textnet: {at:>7.2} s  {took:>6.2} s  {what}");
    }
}
