//! Limits on what one run may ask for, checked before anything large is allocated: the number of
//! epochs, and the host memory a run needs against what the process can really get (the machine's
//! free memory, a container's or batch scheduler's cgroup, `ulimit -v` and `ulimit -d`).
//!
//! What the estimates miss still ends in one line, never an abort: large buffers are reserved fallibly
//! (`try_vec`), and any other allocation that fails ends the process through `Allocator` with one line
//! and exit status 1. Rayon's threads are started up front (`start_threads`), fewer where the limits
//! leave no room for one a core.

use anyhow::{Result, bail};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Largest `--epochs` a training command takes.
pub const MAX_EPOCHS: usize = 1_000_000;

/// Ok when `--epochs` is between 1 and `MAX_EPOCHS`, otherwise the error line.
pub fn check_epochs(epochs: usize) -> Result<()> {
    if epochs == 0 {
        bail!("--epochs must be at least 1, got 0");
    }
    if epochs > MAX_EPOCHS {
        bail!("--epochs must be at most {MAX_EPOCHS}, got {epochs}");
    }
    Ok(())
}

/// Bytes this process can still allocate: the least of the kernel's MemAvailable, what the cgroup's
/// `memory.max` leaves, and what the address-space and data limits (`ulimit -v`, `ulimit -d`) leave
/// after what the process has mapped already. None where none can be read (the check is then skipped).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|info| {
        let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb.saturating_mul(1024))
    });
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|own| cgroup_left(&own, std::path::Path::new("/sys/fs/cgroup")));
    [meminfo, cgroup, limit_left(Limit::AddressSpace), limit_left(Limit::Data)].into_iter().flatten().min()
}

/// What the memory controllers of the cgroup named in `own` (the text of `/proc/self/cgroup`) and of
/// its parents leave under `root`: the least `memory.max − memory.current` (cgroup v2), or
/// `memory.limit_in_bytes − memory.usage_in_bytes` (v1), the page cache the kernel can drop (the
/// inactive file pages of `memory.stat`) counted as free, as `docker stats` counts it. None without a
/// limit.
pub fn cgroup_left(own: &str, root: &std::path::Path) -> Option<u64> {
    let read = |path: std::path::PathBuf| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    let inactive_file = |dir: &std::path::Path| -> u64 {
        let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
        let value = |key: &str| stat.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok());
        value("total_inactive_file").or_else(|| value("inactive_file")).unwrap_or(0)
    };
    let mut left: Option<u64> = None;
    for line in own.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next(), fields.next()?, fields.next()?);
        let (dir, max, current) = match controllers {
            "" => (root.to_path_buf(), "memory.max", "memory.current"),
            c if c.split(',').any(|c| c == "memory") => {
                (root.join("memory"), "memory.limit_in_bytes", "memory.usage_in_bytes")
            }
            _ => continue,
        };
        let mut at = dir.join(path.trim_start_matches('/'));
        loop {
            if let (Some(max), Some(current)) = (read(at.join(max)), read(at.join(current))) {
                let here = max.saturating_sub(current.saturating_sub(inactive_file(&at)));
                left = Some(left.map_or(here, |l| l.min(here)));
            }
            if at == dir || !at.pop() {
                break;
            }
        }
    }
    left
}

#[derive(Clone, Copy)]
enum Limit {
    /// `RLIMIT_AS` (`ulimit -v`) against the whole mapped size (VmSize).
    AddressSpace,
    /// `RLIMIT_DATA` (`ulimit -d`) against the private writable mappings (VmData).
    Data,
}

#[cfg(target_os = "linux")]
fn limit(which: Limit) -> Option<u64> {
    let resource = match which {
        Limit::AddressSpace => libc::RLIMIT_AS,
        Limit::Data => libc::RLIMIT_DATA,
    };
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only the struct it is given.
    if unsafe { libc::getrlimit(resource, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(limit.rlim_cur)
}

#[cfg(not(target_os = "linux"))]
fn limit(_: Limit) -> Option<u64> {
    None
}

fn limit_left(which: Limit) -> Option<u64> {
    let limit = limit(which)?;
    let key = match which {
        Limit::AddressSpace => "VmSize:",
        Limit::Data => "VmData:",
    };
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = status.lines().find(|l| l.starts_with(key))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(limit.saturating_sub(kb.saturating_mul(1024)))
}

/// Starts rayon's threads, one a core (or `RAYON_NUM_THREADS`), or as many as the process's limits
/// allow: a thread that cannot start would otherwise panic inside rayon at its first use. Under an
/// address-space limit the C allocator keeps one arena, since each of its per-thread arenas reserves
/// 64 MB of address space, which a small `ulimit -v` cannot give.
pub fn start_threads() -> Result<()> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if limit(Limit::AddressSpace).is_some() {
        // SAFETY: mallopt only sets the allocator's parameter; it is called before any thread starts.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    }
    // Rayon's global pool can be built once only, even when building it failed: find the count that
    // starts first (RAYON_NUM_THREADS or one a core, halved until its threads can start).
    let wanted = std::env::var("RAYON_NUM_THREADS").ok().and_then(|n| n.parse().ok()).filter(|&n: &usize| n > 0);
    let mut threads = wanted.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    while threads > 1 && !threads_start(threads) {
        threads /= 2;
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .map_err(|e| anyhow::anyhow!("cannot start a thread ({e}); raise the process's limits (ulimit -v, ulimit -u)"))
}

/// Whether `count` threads can run at once: each is started, then all are joined.
fn threads_start(count: usize) -> bool {
    let mut started = Vec::with_capacity(count);
    for _ in 0..count {
        match std::thread::Builder::new().spawn(|| ()) {
            Ok(handle) => started.push(handle),
            Err(_) => break,
        }
    }
    let all = started.len() == count;
    started.into_iter().for_each(|h| drop(h.join()));
    all
}

thread_local! {
    /// Inside `fallibly`: a failed allocation returns null to its caller instead of ending the process.
    static FALLIBLE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with failed allocations returned to their caller (`try_reserve` then reports them).
pub fn fallibly<R>(f: impl FnOnce() -> R) -> R {
    let before = FALLIBLE.with(|c| c.replace(true));
    let result = f();
    FALLIBLE.with(|c| c.set(before));
    result
}

/// A vector of `len` copies of `value`, reserved fallibly: when the memory is not there, the error line
/// "`what` needs N MB of memory but only M is available; `remedy`".
pub fn try_vec<T: Clone>(len: usize, value: T, what: &str, remedy: &str) -> Result<Vec<T>> {
    let mut vec = Vec::new();
    if fallibly(|| vec.try_reserve_exact(len)).is_err() {
        let bytes = (len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        let available = available_memory().map(|a| format!(" but only {} is available", size(a))).unwrap_or_default();
        bail!("{what} needs {} of memory{available}; {remedy}", size(bytes));
    }
    vec.resize(len, value);
    Ok(vec)
}

/// The system's allocator, except that an allocation that fails outside `fallibly` ends the process
/// with one line on stderr and exit status 1 instead of Rust's abort. The line is written without
/// allocating.
pub struct Allocator;

// SAFETY: every call is passed to `System` unchanged; only a null result is acted on.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is System's.
        checked(unsafe { System.alloc(layout) }, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        checked(unsafe { System.alloc_zeroed(layout) }, layout.size())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        checked(unsafe { System.realloc(ptr, layout, new_size) }, new_size)
    }
}

fn checked(ptr: *mut u8, bytes: usize) -> *mut u8 {
    if ptr.is_null() && !FALLIBLE.try_with(Cell::get).unwrap_or(false) {
        out_of_memory(bytes);
    }
    ptr
}

/// Ends the process after "textnet: error: out of memory: …" on stderr, without allocating.
fn out_of_memory(bytes: usize) -> ! {
    struct Line {
        bytes: [u8; 320],
        len: usize,
    }
    impl std::fmt::Write for Line {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let n = s.len().min(self.bytes.len() - self.len);
            self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
            self.len += n;
            Ok(())
        }
    }
    let mut line = Line { bytes: [0; 320], len: 0 };
    let mb = (bytes as u64).div_ceil(1 << 20);
    let _ = std::fmt::Write::write_fmt(
        &mut line,
        format_args!(
            "textnet: error: out of memory: {mb} MB more could not be allocated; lower --batch or the sizes the run \
             asks for, or raise the process's memory limit (ulimit -v, the container's memory)\n"
        ),
    );
    // SAFETY: write and _exit take a descriptor and a buffer that lives across the call.
    unsafe {
        libc::write(2, line.bytes.as_ptr().cast(), line.len);
        libc::_exit(1)
    }
}

/// Memory a run needs, in parts, each with the flags that shrink it.
pub struct MemoryNeed {
    /// Each part: what it is, its size in bytes, and the flags that shrink it.
    pub parts: Vec<(&'static str, u64, &'static str)>,
}

impl MemoryNeed {
    /// The whole need in bytes (saturating).
    pub fn total(&self) -> u64 {
        self.parts.iter().fold(0u64, |sum, &(_, bytes, _)| sum.saturating_add(bytes))
    }

    /// Fails when the run needs more than `available` bytes, saying what for and which flags to lower
    /// (those of the parts that take at least a quarter of the total). `None` passes.
    pub fn check(&self, available: Option<u64>) -> Result<()> {
        let (Some(available), total) = (available, self.total()) else { return Ok(()) };
        if total <= available {
            return Ok(());
        }
        let parts = self.parts.iter().map(|(what, bytes, _)| format!("{what} {}", size(*bytes))).collect::<Vec<_>>();
        let mut by_size: Vec<_> = self.parts.iter().collect();
        by_size.sort_by_key(|&&(_, bytes, _)| std::cmp::Reverse(bytes));
        let lower = by_size
            .iter()
            .filter(|&&&(_, bytes, _)| bytes >= total / 4)
            .map(|&&(_, _, flags)| flags)
            .collect::<Vec<_>>()
            .join(", or ");
        bail!(
            "this run needs about {} of memory ({}) but only {} is available; lower {lower}",
            size(total),
            parts.join(", "),
            size(available)
        )
    }
}

/// `512 MB`, `11.2 GB`.
pub fn size(bytes: u64) -> String {
    const GB: f64 = (1u64 << 30) as f64;
    let b = bytes as f64;
    if b >= GB { format!("{:.1} GB", b / GB) } else { format!("{} MB", (b / (1u64 << 20) as f64).ceil() as u64) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_limit_is_read_from_the_process_group_and_its_parents() {
        let root = tempfile::tempdir().unwrap();
        let write = |dir: &str, file: &str, text: &str| {
            let dir = root.path().join(dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(file), text).unwrap();
        };
        // cgroup v2: the job's group leaves 3 GB, its parent (the container) 1 GB; "max" is no limit.
        write("box/job", "memory.max", "4294967296\n");
        write("box/job", "memory.current", "1073741824\n");
        write("box", "memory.max", "2147483648\n");
        write("box", "memory.current", "1073741824\n");
        write("", "memory.max", "max\n");
        assert_eq!(cgroup_left("0::/box/job\n", root.path()), Some(1 << 30));
        assert_eq!(cgroup_left("0::/\n", root.path()), None);
        // cgroup v1's memory controller.
        write("memory/slurm", "memory.limit_in_bytes", "536870912");
        write("memory/slurm", "memory.usage_in_bytes", "402653184");
        write("memory/slurm", "memory.stat", "cache 1\ntotal_inactive_file 134217728\n");
        assert_eq!(cgroup_left("5:cpu,cpuacct:/slurm\n4:memory:/slurm\n", root.path()), Some(1 << 28));
    }

    #[test]
    fn a_fallible_vector_that_cannot_be_had_is_an_error_line() {
        let e = try_vec(usize::MAX / 8, 0f64, "the images", "lower --train-limit").unwrap_err().to_string();
        assert!(e.starts_with("the images needs ") && e.ends_with("; lower --train-limit"), "{e}");
        assert_eq!(try_vec(3, 1u8, "x", "y").unwrap(), [1, 1, 1]);
    }
}
