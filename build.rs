//! Embeds every `fused/*.cu` kernel file into the binary.
//!
//! Local `#include "x.cuh"` lines are inlined (src/fused_source.rs; NVRTC then needs no include paths), and each resolved
//! source gets a SHA-256 content hash that names its cached PTX at run time. The generated
//! `$OUT_DIR/kernels.rs` holds one `KernelSource` per `.cu` file, sorted by name.

#[path = "src/fused_source.rs"]
mod fused_source;

use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::{env, fs};

fn main() {
    let fused = Path::new("fused");
    println!("cargo:rerun-if-changed=fused");
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));

    let mut units: Vec<PathBuf> = fs::read_dir(fused)
        .expect("fused/ must exist")
        .map(|entry| entry.expect("readable fused/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "cu"))
        .collect();
    units.sort();

    let mut table = String::from("pub const KERNEL_SOURCES: &[KernelSource] = &[\n");
    for unit in &units {
        println!("cargo:rerun-if-changed={}", unit.display());
        let name = unit.file_stem().unwrap().to_str().unwrap().to_owned();
        let source = fused_source::resolve_includes(unit, &mut BTreeSet::new(), &mut |file| {
            println!("cargo:rerun-if-changed={}", file.display())
        })
        .unwrap_or_else(|e| panic!("read {e}"));
        let hash: String = Sha256::digest(source.as_bytes()).iter().take(12).map(|b| format!("{b:02x}")).collect();
        let resolved = out_dir.join(format!("{name}.cu"));
        fs::write(&resolved, &source).expect("write resolved kernel source");
        writeln!(
            table,
            "    KernelSource {{ name: {name:?}, hash: {hash:?}, source: include_str!({:?}) }},",
            resolved.display().to_string()
        )
        .unwrap();
    }
    table.push_str("];\n");
    fs::write(out_dir.join("kernels.rs"), table).expect("write kernels.rs");
}
