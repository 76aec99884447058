//! File helpers shared by every pipeline.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, flushed to disk, then
/// renamed over the target. A crash or a full disk leaves either the old file or the new one, never half.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create directory {}", dir.display()))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("cannot write {}", path.display()))
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
