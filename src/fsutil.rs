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
/// the same target left behind are removed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
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
    result.with_context(|| format!("cannot write {}", path.display()))
}

/// Checks, before any work, that `out` can receive what `write_atomic` will write there: it names a
/// file (no trailing slash, not a directory, device, FIFO or socket), the name fits a file system, the
/// directory exists (it is created) and takes a new file, and it is none of the run's `inputs`
/// (`(what, path)` pairs, e.g. `("corpus", …)`), which writing it would destroy.
pub fn check_output(out: &Path, inputs: &[(&str, &Path)]) -> Result<()> {
    let shown = out.display();
    if out.as_os_str().is_empty() {
        bail!("--out must name a file");
    }
    let name = match out.file_name() {
        Some(name) if !out.as_os_str().as_bytes().ends_with(b"/") => name,
        _ => bail!("--out {shown} is a directory name; give a file name"),
    };
    if name.len() > NAME_MAX {
        bail!(
            "--out {shown}: the file name is {} bytes long, more than the {NAME_MAX} a file system accepts",
            name.len()
        );
    }
    if let Ok(meta) = std::fs::metadata(out) {
        if meta.is_dir() {
            bail!("--out {shown} is a directory; give a file name");
        }
        if !meta.is_file() {
            bail!("--out {shown} is not a regular file (a device, FIFO or socket); give a file name");
        }
        for (what, input) in inputs {
            if same_file(input, out) {
                bail!("--out {shown} is the {what} {}; writing the model there would destroy it", input.display());
            }
        }
    }
    let dir = parent_dir(out);
    std::fs::create_dir_all(dir)
        .with_context(|| format!("--out {shown}: cannot create directory {}", dir.display()))?;
    let tmp = temp_path(out);
    std::fs::File::create(&tmp).with_context(|| format!("--out {shown}: cannot write in {}", dir.display()))?;
    let _ = std::fs::remove_file(&tmp);
    Ok(())
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

/// `.NAME.tmp-` for `path`, NAME cut so that the prefix plus any process id stays within `NAME_MAX`.
fn temp_prefix(path: &Path) -> Vec<u8> {
    let name = path.file_name().map(OsStr::as_bytes).unwrap_or_default();
    const FIXED: usize = ".".len() + ".tmp-".len() + "4294967295".len();
    let kept = &name[..name.len().min(NAME_MAX - FIXED)];
    [b".", kept, b".tmp-"].concat()
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = temp_prefix(path);
    name.extend(std::process::id().to_string().bytes());
    parent_dir(path).join(OsString::from_vec(name))
}

/// Removes `path`'s temporary files whose writing process no longer runs.
fn remove_stale_temps(path: &Path) {
    let prefix = temp_prefix(path);
    let Ok(entries) = std::fs::read_dir(parent_dir(path)) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.as_bytes().strip_prefix(prefix.as_slice()) else { continue };
        let Some(pid) = std::str::from_utf8(pid).ok().and_then(|p| p.parse::<u32>().ok()) else { continue };
        let running = pid == std::process::id() || Path::new("/proc").join(pid.to_string()).exists();
        if !running && entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Opens an input file for reading. Anything but a regular file (a directory, a FIFO, a device) is
/// refused, and opening never blocks: a FIFO without a writer would otherwise hang in `open`.
pub fn open_input(path: &Path, what: &str) -> Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path).with_context(|| format!("cannot open {what} {}", path.display()))?;
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        anyhow::bail!("{what} {} is not a regular file", path.display());
    }
    Ok(file)
}

/// Reads a whole input file into memory (see `open_input`). A copy, unlike a memory map, cannot fault
/// when another process truncates the file meanwhile.
pub fn read_input(path: &Path, what: &str) -> Result<Vec<u8>> {
    let mut file = open_input(path, what)?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes)
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    Ok(bytes)
}

/// The model already at `out`, read by `parse`: `None` when there is no file or an empty one. A file
/// `parse` refuses is not a `kind` model, and is refused rather than overwritten.
pub fn existing_model<T>(out: &Path, kind: &str, parse: impl FnOnce(&[u8]) -> Result<T>) -> Result<Option<T>> {
    let Ok(meta) = std::fs::metadata(out) else { return Ok(None) };
    if meta.len() == 0 {
        return Ok(None);
    }
    match read_input(out, "file").and_then(|bytes| parse(&bytes)) {
        Ok(model) => Ok(Some(model)),
        Err(e) => anyhow::bail!(
            "--out {} exists and is not a textnet {kind} model, so it is not replaced (remove it or choose another \
             --out): {e:#}",
            out.display()
        ),
    }
}
