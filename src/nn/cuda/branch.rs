//! The backward's second stream: a convolution's weight gradient, and linear layers' deferred ones
//! (weight_grads.rs), run beside the chain of input gradients, as `fit`'s stack runs its convolutions'
//! (`nn/stack/gpu.rs`), so that the two fill the SMs together where each alone leaves most of them idle
//! (the ResNet example's kernels reach 20–40 % of an H200's warps). Captured, the two streams become two
//! branches of the step's graph.
//!
//! [`Device::on_branch`] forks: the branch stream waits for everything launched so far, then takes every
//! launch of the work it runs. Nothing the branch touches may change under it, so until the join:
//! - the buffers it reads and every buffer allocated inside it are held, so that the pool cannot hand
//!   their memory to a launch of the main stream;
//! - the main stream may read the buffers allocated inside it (its results) only after joining: a kernel
//!   argument, a table's address, a copy or a read to the host of one of them joins first
//!   ([`Device::settle`], on every access to a buffer's memory);
//! - an in-place write, `synchronize`, and the end of a capture join whatever is open.
//!
//! The join makes the main stream wait for the branch and releases what it held. The kernels and their
//! inputs are the same as on one stream, so the results are the same bits. `TEXTNET_BRANCH=0` keeps
//! everything on one stream.

use super::{Device, DeviceBuffer, driver};
use crate::nn::error::{Error, Result};
use cudarc::driver::{CudaEvent, CudaStream};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The branch stream and what its open work holds.
pub(super) struct Branch {
    stream: Arc<CudaStream>,
    /// Whether `on_branch` forks (TEXTNET_BRANCH=0 and `Device::set_branch(false)`: no).
    enabled: AtomicBool,
    /// How many times it forked.
    forks: AtomicUsize,
    /// Whether launches go to the branch stream now (inside `on_branch`).
    on: AtomicBool,
    /// Whether the branch has work the main stream has not joined.
    open: AtomicBool,
    held: std::sync::Mutex<Held>,
    /// A join that failed where no error could be returned (`settle`): the next launch returns it.
    failed: std::sync::Mutex<Option<String>>,
}

#[derive(Default)]
struct Held {
    buffers: Vec<DeviceBuffer>,
    /// The identities of the held buffers (`DeviceBuffer::identity`), and of those allocated inside the
    /// branch (its results).
    ids: HashSet<usize>,
    results: HashSet<usize>,
    /// The branch's work so far, recorded at its last fork's end: what the join waits for.
    done: Option<CudaEvent>,
}

impl Branch {
    /// A branch stream beside `main`, forking unless `TEXTNET_BRANCH=0`.
    pub(super) fn beside(main: &CudaStream) -> Result<Branch> {
        let stream = main.fork().map_err(driver("Device::open"))?;
        Ok(Branch {
            stream,
            enabled: AtomicBool::new(std::env::var_os("TEXTNET_BRANCH").is_none_or(|v| v != "0")),
            forks: AtomicUsize::new(0),
            on: AtomicBool::new(false),
            open: AtomicBool::new(false),
            held: Default::default(),
            failed: Default::default(),
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Device {
    /// The stream a launch goes to now: the branch's inside `on_branch`, else the GPU's.
    pub(super) fn stream_now(&self) -> &Arc<CudaStream> {
        if self.branch.on.load(Ordering::Relaxed) { &self.branch.stream } else { &self.gpu.stream }
    }

    /// Whether convolutions' weight gradients run on the backward's second stream from now on (the checks
    /// compare both ways); joins what is open before turning it off.
    pub(crate) fn set_branch(&self, on: bool) -> Result<()> {
        self.join_branch()?;
        self.branch.enabled.store(on, Ordering::Relaxed);
        Ok(())
    }

    /// How many times the backward has forked its second stream so far.
    pub(crate) fn branches(&self) -> usize {
        self.branch.forks.load(Ordering::Relaxed)
    }

    /// Runs `work` on the branch stream, after everything launched so far, holding `reads` (the buffers
    /// it reads that were made before it) and what it allocates until the join. With the branch off, or
    /// inside a branch already, `work` runs where launches go now.
    pub(crate) fn on_branch<T>(&self, reads: &[&DeviceBuffer], work: impl FnOnce() -> Result<T>) -> Result<T> {
        let branch = &self.branch;
        if !branch.enabled.load(Ordering::Relaxed) || branch.on.load(Ordering::Relaxed) {
            return work();
        }
        branch.forks.fetch_add(1, Ordering::Relaxed);
        self.launch_pending()?;
        let op = "backward";
        let forked = self.gpu.stream.record_event(None).map_err(driver(op))?;
        branch.stream.wait(&forked).map_err(driver(op))?;
        {
            let mut held = branch.held();
            held.ids.extend(reads.iter().map(|b| b.identity()));
            held.buffers.extend(reads.iter().map(|&b| b.clone()));
        }
        branch.open.store(true, Ordering::Relaxed);
        branch.on.store(true, Ordering::Relaxed);
        let result = work();
        branch.on.store(false, Ordering::Relaxed);
        let done = branch.stream.record_event(None).map_err(driver(op))?;
        branch.held().done = Some(done);
        result
    }

    /// A buffer allocated now: held, and marked as the branch's result, inside `on_branch`.
    pub(super) fn allocated(&self, buffer: &DeviceBuffer) {
        let branch = &self.branch;
        if branch.on.load(Ordering::Relaxed) {
            let mut held = branch.held();
            held.results.insert(buffer.identity());
            held.ids.insert(buffer.identity());
            held.buffers.push(buffer.clone());
        }
    }

    /// Joins the branch before the main stream touches `buffer`, where the branch made it. A failed join
    /// is kept for the next launch to return.
    pub(super) fn settle(&self, buffer: &DeviceBuffer) {
        self.join_where(buffer, |held, id| held.results.contains(&id));
    }

    /// Joins the branch where it holds `buffer` (read or made there), so that a write in place may see it
    /// unshared.
    pub(super) fn release(&self, buffer: &DeviceBuffer) {
        self.join_where(buffer, |held, id| held.ids.contains(&id));
    }

    fn join_where(&self, buffer: &DeviceBuffer, holds: impl Fn(&Held, usize) -> bool) {
        let branch = &self.branch;
        if !branch.open.load(Ordering::Relaxed) || branch.on.load(Ordering::Relaxed) {
            return;
        }
        let held = holds(&branch.held(), buffer.identity());
        if held && let Err(e) = self.join_branch() {
            *branch.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
        }
    }

    /// The error of a join that failed in `settle`, for `op`'s launch to return.
    pub(super) fn branch_failure(&self, op: &'static str) -> Result<()> {
        match self.branch.failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(problem) => Err(Error::device(op, problem)),
            None => Ok(()),
        }
    }

    /// Makes the main stream wait for the branch's work so far and releases what that work held.
    pub(crate) fn join_branch(&self) -> Result<()> {
        let branch = &self.branch;
        if !branch.open.load(Ordering::Relaxed) {
            return Ok(());
        }
        let released = {
            let mut held = branch.held();
            if let Some(done) = &held.done {
                self.gpu.stream.wait(done).map_err(driver("backward"))?;
            }
            branch.open.store(false, Ordering::Relaxed);
            std::mem::take(&mut *held)
        };
        drop(released);
        Ok(())
    }
}
