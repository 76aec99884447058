//! File helpers shared by every pipeline.

use anyhow::{Context, Result, bail};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The longest file name, in bytes, that common file systems (ext4, XFS, Btrfs, tmpfs) accept.
const NAME_MAX: usize = 255;

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, flushed to disk, then
/// renamed over the target. A crash or a full disk leaves either the old file or the new one, never half.
/// A file it replaces keeps its permission bits; temporary files that an earlier, interrupted write to
/// the same target left behind are removed. A symbolic link is written through: its target is replaced.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let shown = path;
    let path = &resolve_link(path);
    let dir = parent_dir(path);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create directory {}", dir.display()))?;
    remove_stale_temps(path);
    let tmp = temp_path(path);
    let result = (|| -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        if let Ok(old) = std::fs::metadata(path) {
            file.set_permissions(old.permissions())?;
        }
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("cannot write {}", shown.display()))
}

/// Checks, before any work, that `out` can receive what `write_atomic` will write there: it names a
/// file (no trailing slash, not a directory, device, FIFO or socket), the name fits a file system, the
/// directory exists (it is created) and takes a new file, and it is none of the run's `inputs`
/// (`(what, path)` pairs, e.g. `("corpus", …)`), which writing it would destroy. An existing file
/// without write permission is refused too, as `cp` and `rm` would ask first. The returned lock holds
/// `out` for the run (see `OutputLock`); a symbolic link is checked and locked as its target.
pub fn check_output(out: &Path, inputs: &[(&str, &Path)]) -> Result<OutputLock> {
    check_output_named("--out", out, inputs)
}

/// `check_output` for an output given by another flag, e.g. `--predictions`.
pub fn check_output_named(flag: &str, out: &Path, inputs: &[(&str, &Path)]) -> Result<OutputLock> {
    let shown = out.display();
    if out.as_os_str().is_empty() {
        bail!("{flag} must name a file");
    }
    let name = match out.file_name() {
        Some(name) if !out.as_os_str().as_bytes().ends_with(b"/") => name,
        _ => bail!("{flag} {shown} is a directory name; give a file name"),
    };
    if name.len() > NAME_MAX {
        bail!(
            "{flag} {shown}: the file name is {} bytes long, more than the {NAME_MAX} a file system accepts",
            name.len()
        );
    }
    if let Ok(meta) = std::fs::metadata(out) {
        if meta.is_dir() {
            bail!("{flag} {shown} is a directory; give a file name");
        }
        if !meta.is_file() {
            bail!("{flag} {shown} is not a regular file (a device, FIFO or socket); give a file name");
        }
        for (what, input) in inputs {
            if same_file(input, out) {
                bail!("{flag} {shown} is the {what} {}; writing there would destroy it", input.display());
            }
        }
        if let Err(e) = std::fs::File::open(out) {
            bail!("{flag} {shown} cannot be read ({e}), so it is not replaced; choose another {flag}");
        }
        if meta.permissions().readonly() {
            bail!(
                "{flag} {shown} is write-protected, so it is not replaced (make it writable or choose another {flag})"
            );
        }
    }
    let dir = parent_dir(out);
    std::fs::create_dir_all(dir)
        .with_context(|| format!("{flag} {shown}: cannot create directory {}", dir.display()))?;
    let tmp = temp_path(out);
    std::fs::File::create(&tmp).with_context(|| format!("{flag} {shown}: cannot write in {}", dir.display()))?;
    let _ = std::fs::remove_file(&tmp);
    lock_named(flag, &resolve_link(out))
}

/// `check_output_named` for a file of text or a picture (predictions, a plot), which never replaces a
/// model: a safetensors file there is refused.
pub fn check_data_output(flag: &str, out: &Path, inputs: &[(&str, &Path)]) -> Result<OutputLock> {
    let lock = check_output_named(flag, out, inputs)?;
    let is_model = std::fs::metadata(out).is_ok_and(|m| m.len() > 0)
        && read_input(out, "file").is_ok_and(|b| safetensors::SafeTensors::read_metadata(&b).is_ok());
    if is_model {
        bail!("{flag} {} holds a model file (safetensors); choose another file", out.display());
    }
    Ok(lock)
}

/// Whether `a` and `b` name the same existing file (through links, `..` or another spelling).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// `.NAME.tmp-` for `path`, NAME cut so that the prefix plus a process id and a call number stays within
/// `NAME_MAX`.
fn temp_prefix(path: &Path) -> Vec<u8> {
    let name = path.file_name().map(OsStr::as_bytes).unwrap_or_default();
    const FIXED: usize = ".".len() + ".tmp-".len() + "4294967295".len() + ".18446744073709551615".len();
    let kept = &name[..name.len().min(NAME_MAX - FIXED)];
    [b".", kept, b".tmp-"].concat()
}

/// `.NAME.tmp-PID.N`: a name of this call's own, so that two threads writing one file never share one.
fn temp_path(path: &Path) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = temp_prefix(path);
    name.extend(format!("{}.{call}", std::process::id()).bytes());
    parent_dir(path).join(OsString::from_vec(name))
}

/// Removes `path`'s temporary files whose writing process no longer runs.
fn remove_stale_temps(path: &Path) {
    let prefix = temp_prefix(path);
    let Ok(entries) = std::fs::read_dir(parent_dir(path)) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.as_bytes().strip_prefix(prefix.as_slice()) else { continue };
        // `PID.N`, or the `PID` of older versions.
        let pid = rest.split(|&b| b == b'.').next().unwrap_or_default();
        let Some(pid) = std::str::from_utf8(pid).ok().and_then(|p| p.parse::<u32>().ok()) else { continue };
        // This process's own temporaries belong to writes that may still be going on in other threads.
        let running = pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists();
        if !running && entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Opens an input file for reading. Anything but a regular file (a directory, a FIFO, a device, a
/// socket) is refused, and opening never blocks: a FIFO without a writer would otherwise hang in `open`.
pub fn open_input(path: &Path, what: &str) -> Result<std::fs::File> {
    let not_regular = || {
        let stdin = if path == Path::new("/dev/stdin") { " (for standard input, give - instead)" } else { "" };
        anyhow::anyhow!("{what} {} is not a regular file{stdin}", path.display())
    };
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(not_regular());
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path).with_context(|| format!("cannot open {what} {}", path.display()))?;
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err(not_regular());
    }
    Ok(file)
}

/// Whether `path` is `-`, standard input.
pub fn is_stdin(path: &Path) -> bool {
    path == Path::new("-")
}

/// Reads a whole input file into memory (see `open_input`), or standard input to its end for `-`. A
/// copy, unlike a memory map, cannot fault when another process truncates the file meanwhile.
pub fn read_input(path: &Path, what: &str) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    if is_stdin(path) {
        // A second reader would find it empty and blame the data.
        static READ: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if READ.swap(true, std::sync::atomic::Ordering::Relaxed) {
            bail!("- (standard input) can be given once; the {what} cannot be read from it too");
        }
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes)
            .with_context(|| format!("cannot read the {what} from standard input"))?;
        return Ok(bytes);
    }
    let mut file = open_input(path, what)?;
    let len = file.metadata().map_or(0, |m| m.len());
    if crate::io::resources::fallibly(|| bytes.try_reserve_exact(len as usize)).is_err() {
        let available =
            crate::io::resources::available_memory().map(|a| format!(" ({} available)", crate::io::resources::size(a)));
        bail!(
            "{what} {} takes {} of memory, more than this process can get{}",
            path.display(),
            crate::io::resources::size(len),
            available.unwrap_or_default()
        );
    }
    std::io::Read::read_to_end(&mut file, &mut bytes)
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    Ok(bytes)
}

/// `path` as messages show it: "(standard input)" for `-`.
pub fn shown(path: &Path) -> String {
    if is_stdin(path) { "(standard input)".into() } else { path.display().to_string() }
}

/// The model already at `out`, read by `parse`: `None` when there is no file or an empty one. A file
/// that cannot be read, or that `parse` refuses (not a `kind` model), is refused rather than overwritten.
pub fn existing_model<T>(out: &Path, kind: &str, parse: impl FnOnce(&[u8]) -> Result<T>) -> Result<Option<T>> {
    let Ok(meta) = std::fs::metadata(out) else { return Ok(None) };
    if meta.len() == 0 {
        return Ok(None);
    }
    let bytes = read_input(out, "file").map_err(|e| {
        anyhow::anyhow!("--out {} cannot be read, so it is not replaced: {:#}", out.display(), e.root_cause())
    })?;
    match parse(&bytes) {
        Ok(model) => Ok(Some(model)),
        Err(e) => anyhow::bail!(
            "--out {} exists and is not a textnet {kind} model, so it is not replaced (remove it or choose another \
             --out): {e:#}",
            out.display()
        ),
    }
}

/// Holds `--out` for one run: a second run on the same file is refused at its start instead of the two
/// overwriting each other's epochs. The lock is an exclusive `flock` on `.NAME.lock` beside the file,
/// which holds the holder's process id and is removed when the run ends; the kernel releases it if the
/// process dies, and the next run takes the stale file over. A file of that name that holds anything
/// but a process id is the user's own: it is refused, never taken over.
#[derive(Debug)]
pub struct OutputLock {
    path: PathBuf,
    file: std::fs::File,
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        if same_inode(&self.file, &self.path) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn same_inode(file: &std::fs::File, path: &Path) -> bool {
    let ours = file.metadata().map(|m| (m.dev(), m.ino())).ok();
    ours.is_some() && ours == std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok()
}

/// Locks `out`, given by `flag` (see `OutputLock`).
pub fn lock_named(flag: &str, out: &Path) -> Result<OutputLock> {
    let name = out.file_name().map(OsStr::as_bytes).unwrap_or_default();
    let kept = &name[..name.len().min(NAME_MAX - ".".len() - ".lock".len())];
    let path = parent_dir(out).join(OsString::from_vec([b".", kept, b".lock"].concat()));
    let context = |what: &str| format!("{flag} {}: cannot {what} the lock file {}", out.display(), path.display());
    loop {
        let mut options = std::fs::OpenOptions::new();
        options.read(true).write(true);
        let (mut file, created) = match options.clone().create_new(true).open(&path) {
            Ok(file) => (file, true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match options.open(&path) {
                Ok(file) => (file, false),
                // Removed by its holder between the two opens: try again.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| context("open")),
            },
            Err(e) => return Err(e).with_context(|| context("create")),
        };
        // A process id is at most 10 digits; a longer file is not a lock.
        let mut holder = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::Read::take(&mut file, 64), &mut holder);
        let holder = String::from_utf8_lossy(&holder);
        let holder = holder.trim();
        if holder.len() > 20 || !holder.bytes().all(|b| b.is_ascii_digit()) {
            bail!(
                "{flag} {}: {} beside it is not a textnet lock file, but textnet locks {} under that name; rename that file or choose another {flag}",
                out.display(),
                path.display(),
                out.display()
            );
        }
        // SAFETY: flock takes a descriptor `file` owns and keeps open for the call.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let by = if holder.is_empty() { String::new() } else { format!(" (process {holder})") };
            bail!(
                "{flag} {} is being written by another textnet run{by}; wait for it to end or choose another {flag}",
                out.display()
            );
        }
        // The holder before us may have removed the file between our open and our lock: lock the file
        // that is there now.
        if !same_inode(&file, &path) {
            continue;
        }
        // At offset 0: reading the old holder moved the file's own offset.
        let pid = std::process::id().to_string();
        let written = file.set_len(0).and_then(|()| std::os::unix::fs::FileExt::write_all_at(&file, pid.as_bytes(), 0));
        if let Err(e) = written {
            if created {
                let _ = std::fs::remove_file(&path);
            }
            return Err(e).with_context(|| context("write"));
        }
        return Ok(OutputLock { path, file });
    }
}

/// The file a write to `path` should replace: the target of a symbolic link (so that the link stays a
/// link), else `path` itself.
pub fn resolve_link(path: &Path) -> PathBuf {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => match std::fs::canonicalize(path) {
            Ok(target) => target,
            Err(_) => match std::fs::read_link(path) {
                Ok(target) => parent_dir(path).join(target),
                Err(_) => path.to_path_buf(),
            },
        },
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_threads_writing_one_file_never_share_a_temporary_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.st");
        std::thread::scope(|s| {
            for byte in [b'a', b'b'] {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..50 {
                        write_atomic(path, &[byte; 4096]).unwrap();
                    }
                });
            }
        });
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes == [b'a'; 4096] || bytes == [b'b'; 4096]);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "temporary files left behind");
    }

    #[test]
    fn the_lock_never_takes_over_a_users_own_file_and_removes_only_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("m.st");
        let lock_file = dir.path().join(".m.st.lock");
        std::fs::write(&lock_file, "my notes").unwrap();
        let e = lock_named("--predictions", &out).unwrap_err().to_string();
        assert!(e.starts_with("--predictions ") && e.contains("is not a textnet lock file"), "{e}");
        assert_eq!(std::fs::read(&lock_file).unwrap(), b"my notes");

        // A stale lock (a process id) is taken over, and removed at the end of the run.
        std::fs::write(&lock_file, "4294967295").unwrap();
        let lock = lock_named("--out", &out).unwrap();
        assert_eq!(std::fs::read_to_string(&lock_file).unwrap(), std::process::id().to_string());
        let e = lock_named("--predictions", &out).unwrap_err().to_string();
        assert!(e.contains("being written by another textnet run (process") && e.ends_with("another --predictions"));
        drop(lock);
        assert!(!lock_file.exists());
    }

    #[test]
    fn a_lock_that_cannot_be_written_says_which_file_and_flag() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("p.tsv");
        // A lock name that leads to a device: it opens and locks, but cannot take a process id.
        std::os::unix::fs::symlink("/dev/null", dir.path().join(".p.tsv.lock")).unwrap();
        let e = format!("{:#}", lock_named("--predictions", &out).unwrap_err());
        assert!(e.starts_with("--predictions ") && e.contains("cannot write the lock file"), "{e}");
    }
}
