//! Limits on what one run may ask for, checked before anything large is allocated: the number of
//! epochs, and the host memory a run needs against what the machine can give it (an allocation that
//! fails aborts the process instead of returning an error).

use anyhow::{Result, bail};

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

/// Bytes this process can still allocate: the kernel's MemAvailable, or less when an address-space
/// limit (`ulimit -v`) leaves less. None where neither can be read (the check is then skipped).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|info| {
        let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb.saturating_mul(1024))
    });
    match (meminfo, address_space_left()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(target_os = "linux")]
fn address_space_left() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    let pages: u64 = std::fs::read_to_string("/proc/self/statm").ok()?.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page_size = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    Some(limit.rlim_cur.saturating_sub(pages.saturating_mul(page_size)))
}

#[cfg(not(target_os = "linux"))]
fn address_space_left() -> Option<u64> {
    None
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
