//! What build.rs and the run-time compiler must agree on, in std alone so that build.rs can include it:
//! inlining the local `#include "x.cuh"` lines of a `fused/*.cu` file (NVRTC then needs no include
//! paths; build.rs embeds every kernel file through it, and `TEXTNET_FUSED_DIR` reads kernel files
//! through it at run time), NVRTC's options, and the name of a compiled module (the key of the kernel
//! cache and of the modules build.rs compiles ahead of time).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The text of `path` with each quoted include (relative to the including file) inlined once per
/// translation unit; `visit` sees every file read.
pub fn resolve_includes(
    path: &Path,
    seen: &mut BTreeSet<PathBuf>,
    visit: &mut dyn FnMut(&Path),
) -> std::io::Result<String> {
    visit(path);
    let text =
        std::fs::read_to_string(path).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("#include \"") {
            let file = rest.split('"').next().unwrap_or_default();
            let include = path.parent().unwrap_or(Path::new(".")).join(file);
            if seen.insert(include.clone()) {
                out.push_str(&format!("// ---- begin {file} ----\n"));
                out.push_str(&resolve_includes(&include, seen, visit)?);
                out.push_str(&format!("// ---- end {file} ----\n"));
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

/// NVRTC's options for machine code of architecture `sm` (e.g. "sm_90"), with extra options such as
/// `-DNAME=value`.
pub fn nvrtc_options(sm: &str, extra: &[String]) -> Vec<String> {
    [format!("--gpu-architecture={sm}"), "--std=c++17".into(), "-default-device".into()]
        .into_iter()
        .chain(extra.iter().cloned())
        .collect()
}

/// The name of kernel file `unit` (of content hash `hash`) compiled for `sm` with `extra` options.
pub fn cubin_name(unit: &str, hash: &str, sm: &str, extra: &[String]) -> String {
    let options: Vec<String> = extra.iter().map(|o| o.trim_start_matches('-').replace('=', "")).collect();
    format!("{unit}-{hash}-{sm}-{}.cubin", options.join("-"))
}
