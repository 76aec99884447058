//! Work off the GIL: a worker thread trains while the calling thread hands its events to Python and
//! checks for Ctrl-C; the GPU, opened once per process.

use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError};
use pyo3::prelude::*;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use textnet::device::{Backend, DeviceChoice, Gpu};

/// What the worker reports while it trains.
pub(crate) enum Event {
    /// `done` of `total` training samples of epoch `epoch`.
    Progress { epoch: usize, done: usize, total: usize },
    /// Epoch `epoch` is about to train, its first step planned at `lr`. The worker waits for `answer`: a
    /// rate for every step of the epoch, or None for the planned ones; a sender dropped unanswered ends
    /// the run before the epoch.
    Starting { epoch: usize, lr: f32, answer: Sender<Option<f32>> },
    /// Epoch `epoch` finished with these figures, and its parameters when they were asked for. The
    /// worker waits for `answer`: whether to end the run here; a sender dropped unanswered ends it too.
    Epoch {
        epoch: usize,
        logs: Vec<(&'static str, f64)>,
        /// The epoch's training samples per second and the learning rate of its last step.
        speed_and_lr: (f64, f32),
        params: Option<Vec<f32>>,
        answer: Sender<bool>,
    },
    /// The first step of epoch `epoch` is about to train (`done` = 0), or a step has trained: `done` of
    /// the epoch's `total` samples so far, `loss_sum` their summed loss. Sent only when asked for; the
    /// worker waits for `answer` (a sender dropped unanswered ends the run after the epoch).
    Step { epoch: usize, done: usize, total: usize, loss_sum: f64, answer: Sender<()> },
}

/// Runs `work` on a worker thread without the GIL, handing its events to `on_event` on this thread, and
/// checking for Ctrl-C meanwhile. An event dropped unhandled (after an exception) drops its answer's
/// sender, which a worker waiting on it takes as the end of the run. Returns the work's result and whether Ctrl-C (or an exception in
/// `on_event`, returned instead) asked it to stop early. The work's error becomes `error(e)`.
pub(crate) fn drive<T: Send>(
    py: Python<'_>,
    work: impl FnOnce(&Sender<Event>) -> anyhow::Result<T> + Send,
    mut on_event: impl FnMut(Python<'_>, Event) -> PyResult<()>,
    error: fn(anyhow::Error) -> PyErr,
) -> PyResult<(T, bool)> {
    textnet::harness::interrupt::reset();
    let (tx, mut rx) = mpsc::channel();
    let (outcome, interrupted, callback_error) = std::thread::scope(|scope| {
        let worker = scope.spawn(move || work(&tx));
        let (mut interrupted, mut callback_error) = (false, None);
        loop {
            // The receiver is Send but not Sync: it goes into the GIL-free wait and comes back.
            let (back, received) = py.detach(move || {
                let received = rx.recv_timeout(Duration::from_millis(50));
                (rx, received)
            });
            rx = back;
            match received {
                Ok(event) if callback_error.is_none() => {
                    // Ctrl-C may surface inside a callback, as Python runs its signal handler there.
                    if let Err(e) = on_event(py, event) {
                        textnet::harness::interrupt::request();
                        if e.is_instance_of::<PyKeyboardInterrupt>(py) {
                            interrupted = true;
                        } else {
                            callback_error = Some(e);
                        }
                    }
                }
                Ok(_) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if let Err(e) = py.check_signals() {
                textnet::harness::interrupt::request();
                if e.is_instance_of::<PyKeyboardInterrupt>(py) {
                    interrupted = true;
                } else {
                    callback_error.get_or_insert(e);
                }
            }
        }
        let outcome = py.detach(|| worker.join());
        (outcome, interrupted, callback_error)
    });
    textnet::harness::interrupt::reset();
    let result = match outcome {
        Ok(result) => result.map_err(error)?,
        Err(panic) => {
            let what = textnet::device::panic_message(panic.as_ref());
            return Err(PyRuntimeError::new_err(format!(
                "textnet: internal error: {what} (this is a bug; please report it)"
            )));
        }
    };
    if let Some(e) = callback_error {
        return Err(e);
    }
    Ok((result, interrupted))
}

/// The GPU, opened once per process and shared by every later call.
static GPU: Mutex<Option<Arc<Gpu>>> = Mutex::new(None);

/// The backend `device` ("auto", "cuda" or "cpu") resolves to, and its description.
pub(crate) fn backend(device: DeviceChoice) -> anyhow::Result<Backend> {
    if device == DeviceChoice::Cpu {
        return Ok(Backend::Cpu);
    }
    let mut opened = GPU.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(gpu) = opened.as_ref() {
        return Ok(Backend::Cuda(gpu.clone()));
    }
    let backend = textnet::device::select(device)?;
    if let Backend::Cuda(gpu) = &backend {
        *opened = Some(gpu.clone());
    }
    Ok(backend)
}

pub(crate) fn device_name(backend: &Backend) -> String {
    match backend {
        Backend::Cpu => "cpu".into(),
        Backend::Cuda(gpu) => format!("cuda ({})", gpu.describe()),
    }
}
