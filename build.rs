//! Embeds every `fused/*.cu` kernel file into the binary and, when asked, the machine code of the modules
//! that `fused/precompiled.txt` lists, compiled ahead of time, so that a first run on a fresh machine
//! compiles nothing.
//!
//! Local `#include "x.cuh"` lines are inlined (src/device/fused_source.rs; NVRTC then needs no include paths), and
//! each resolved source gets a SHA-256 content hash that names its compiled modules at run time. The
//! generated `$OUT_DIR/kernels.rs` holds one `KernelSource` per `.cu` file, sorted by name.
//!
//! The modules are compiled only when asked (src/device/precompile_choice.rs): `TEXTNET_PRECOMPILE=1`, or the
//! `precompile` feature unless `TEXTNET_PRECOMPILE=0`. Otherwise the binary holds none and compiles each
//! module on first use. NVRTC is then required: `TEXTNET_NVRTC` (the library's path), the loader's own
//! search, or the `nvidia-cuda-nvrtc-cu12` wheel of `target/test-venv` or of `python3`. The modules are
//! compiled on every core, with progress as cargo warnings. `$OUT_DIR/precompiled.rs` holds the table
//! (`PRECOMPILED`) and a line saying how it was made.

#[path = "src/device/fused_source.rs"]
mod fused_source;
#[path = "src/device/precompile_choice.rs"]
mod precompile_choice;

use precompile_choice::{PrecompileChoice, precompile_choice};

use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::ffi::{CString, c_char, c_int, c_void};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use std::{env, fs};

/// The architectures compiled ahead of time: Ampere (and Ada, which runs sm_80 code) and Hopper (sm_90a,
/// with `wgmma`; `sm_target` in src/device/compile.rs names the same).
const ARCHITECTURES: [&str; 2] = ["sm_80", "sm_90a"];

struct Unit {
    name: String,
    hash: String,
    source: String,
}

fn main() {
    let fused = Path::new("fused");
    println!("cargo:rerun-if-changed=fused");
    println!("cargo:rerun-if-env-changed=TEXTNET_PRECOMPILE");
    println!("cargo:rerun-if-env-changed=TEXTNET_NVRTC");
    println!("cargo:rerun-if-changed=src/device/precompile_choice.rs");
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));

    let mut paths: Vec<PathBuf> = fs::read_dir(fused)
        .expect("fused/ must exist")
        .map(|entry| entry.expect("readable fused/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "cu"))
        .collect();
    paths.sort();

    let mut units = Vec::new();
    let mut table = String::from("pub const KERNEL_SOURCES: &[KernelSource] = &[\n");
    for path in &paths {
        println!("cargo:rerun-if-changed={}", path.display());
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let source = fused_source::resolve_includes(path, &mut BTreeSet::new(), &mut |file| {
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
        units.push(Unit { name, hash, source });
    }
    table.push_str("];\n");
    fs::write(out_dir.join("kernels.rs"), table).expect("write kernels.rs");

    let manifest = fs::read_to_string(fused.join("precompiled.txt")).expect("read fused/precompiled.txt");
    let (compiled, note) = precompile(&units, &manifest, &out_dir.join("cubin"));
    let mut table = String::from("pub const PRECOMPILED: &[(&str, &[u8])] = &[\n");
    for (name, path) in &compiled {
        writeln!(table, "    ({name:?}, include_bytes!({:?})),", path.display().to_string()).unwrap();
    }
    writeln!(table, "];\npub const PRECOMPILED_NOTE: &str = {note:?};").unwrap();
    fs::write(out_dir.join("precompiled.rs"), table).expect("write precompiled.rs");
}

/// Compiles every module of `manifest` for every architecture on every core into `dir`, when asked to:
/// the names and files compiled, and a line saying what was done.
fn precompile(units: &[Unit], manifest: &str, dir: &Path) -> (Vec<(String, PathBuf)>, String) {
    let variable = env::var("TEXTNET_PRECOMPILE").ok();
    let feature = env::var_os("CARGO_FEATURE_PRECOMPILE").is_some();
    match precompile_choice(variable.as_deref(), feature) {
        Ok(PrecompileChoice::Compile) => {}
        Ok(PrecompileChoice::Skip(why)) => return (Vec::new(), format!("none: {why}")),
        Err(e) => fail(&e),
    }
    let Some(nvrtc) = Nvrtc::find() else {
        fail(
            "compiling the GPU kernels at build time needs NVRTC: set TEXTNET_NVRTC to libnvrtc.so's path, or \
             pip install nvidia-cuda-nvrtc-cu12 into python3; or build without TEXTNET_PRECOMPILE=1 (and the \
             precompile feature) to compile them on first use",
        )
    };
    fs::create_dir_all(dir).expect("create the cubin folder");
    let mut jobs = Vec::new();
    for line in manifest.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap();
        let unit = units
            .iter()
            .find(|u| u.name == name)
            .unwrap_or_else(|| fail(&format!("fused/precompiled.txt: no {name}.cu")));
        let defines: Vec<String> = words.map(|w| format!("-D{w}")).collect();
        jobs.extend(ARCHITECTURES.map(|sm| (unit, sm, defines.clone())));
    }
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len().max(1));
    let started = Instant::now();
    // Cargo shows these lines when the build script ends, or as they come with `cargo build -vv`.
    println!("cargo:warning=compiling {} kernel modules with {} on {workers} threads", jobs.len(), nvrtc.path);
    let report_every = jobs.len().div_ceil(10).max(1);
    let (next, finished, reused) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
    let (compiled, failed) = (Mutex::new(Vec::new()), Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some((unit, sm, defines)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    // The name holds the source's content hash: a module an earlier run of this build
                    // script compiled from the same text and sizes is taken as it is.
                    let name = fused_source::cubin_name(&unit.name, &unit.hash, sm, defines);
                    let path = dir.join(&name);
                    if path.exists() {
                        reused.fetch_add(1, Ordering::Relaxed);
                        compiled.lock().unwrap().push((name, path));
                        finished.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let options = fused_source::nvrtc_options(sm, defines);
                    match nvrtc.compile(&unit.name, &unit.source, &options) {
                        Ok(cubin) => {
                            // Written whole, then renamed: an interrupted build leaves no partial module.
                            let partial = path.with_extension("partial");
                            fs::write(&partial, cubin).expect("write a compiled module");
                            fs::rename(&partial, &path).expect("write a compiled module");
                            compiled.lock().unwrap().push((name, path));
                        }
                        Err(e) => {
                            failed.lock().unwrap().push(format!("{}.cu {} for {sm}: {e}", unit.name, defines.join(" ")))
                        }
                    }
                    let count = finished.fetch_add(1, Ordering::Relaxed) + 1;
                    if count % report_every == 0 || count == jobs.len() {
                        let seconds = started.elapsed().as_secs_f64();
                        println!("cargo:warning=compiled {count}/{} kernel modules in {seconds:.0} s", jobs.len());
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap();
    if !failed.is_empty() {
        failed.iter().for_each(|f| println!("cargo:warning={f}"));
        fail(&format!("{} of {} kernel modules did not compile (the warnings above)", failed.len(), jobs.len()));
    }
    let mut compiled = compiled.into_inner().unwrap();
    compiled.sort();
    let reused = reused.into_inner();
    if reused > 0 {
        println!("cargo:warning={reused} of the {} kernel modules were compiled by an earlier build", jobs.len());
    }
    let note = format!("{} modules compiled at build time by {}", compiled.len(), nvrtc.path);
    (compiled, note)
}

/// Ends the build with `message` (cargo prints the build script's output under the error).
fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(1)
}

type Program = *mut c_void;

/// The few NVRTC functions build.rs calls, from the library loaded by path.
struct Nvrtc {
    library: libloading::Library,
    path: String,
}

impl Nvrtc {
    fn find() -> Option<Nvrtc> {
        let mut candidates: Vec<String> = env::var("TEXTNET_NVRTC").into_iter().collect();
        candidates.extend(["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"].map(String::from));
        let venv = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join("target/test-venv/bin/python");
        for python in [venv.as_path(), Path::new("python3")] {
            candidates.extend(wheel_libraries(python));
        }
        candidates.into_iter().find_map(|path| {
            // SAFETY: loading NVRTC runs no initialisation code with requirements of ours.
            let library = unsafe { libloading::Library::new(&path) }.ok()?;
            Some(Nvrtc { library, path })
        })
    }

    fn compile(&self, name: &str, source: &str, options: &[String]) -> Result<Vec<u8>, String> {
        type Create = unsafe extern "C" fn(
            *mut Program,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> c_int;
        type Compile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
        type Size = unsafe extern "C" fn(Program, *mut usize) -> c_int;
        type Read = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
        type Destroy = unsafe extern "C" fn(*mut Program) -> c_int;
        // SAFETY: `get` is unsafe because it cannot check the type asked for; asked for as a bare
        // `*const c_void`, any address dlsym returns is a valid value of that type. Nothing is called here,
        // and the library outlives each use (it is `self`'s). Casting to a signature is the next block.
        let symbol = |n: &[u8]| unsafe { self.library.get::<*const c_void>(n) }.map_err(|e| e.to_string());
        // SAFETY: each symbol is cast to its signature in nvrtc.h.
        unsafe {
            let create: Create = std::mem::transmute(*symbol(b"nvrtcCreateProgram")?);
            let compile: Compile = std::mem::transmute(*symbol(b"nvrtcCompileProgram")?);
            let log_size: Size = std::mem::transmute(*symbol(b"nvrtcGetProgramLogSize")?);
            let log: Read = std::mem::transmute(*symbol(b"nvrtcGetProgramLog")?);
            let cubin_size: Size = std::mem::transmute(*symbol(b"nvrtcGetCUBINSize")?);
            let cubin: Read = std::mem::transmute(*symbol(b"nvrtcGetCUBIN")?);
            let destroy: Destroy = std::mem::transmute(*symbol(b"nvrtcDestroyProgram")?);
            let source = CString::new(source).map_err(|e| e.to_string())?;
            let file = CString::new(format!("{name}.cu")).unwrap();
            let options: Vec<CString> = options.iter().map(|o| CString::new(o.as_str()).unwrap()).collect();
            let pointers: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
            let mut program: Program = std::ptr::null_mut();
            if create(&mut program, source.as_ptr(), file.as_ptr(), 0, std::ptr::null(), std::ptr::null()) != 0 {
                return Err("nvrtcCreateProgram failed".into());
            }
            let read = |size: Size, read: Read| {
                let mut n = 0usize;
                size(program, &mut n);
                let mut bytes = vec![0u8; n];
                read(program, bytes.as_mut_ptr().cast());
                bytes
            };
            let result = if compile(program, pointers.len() as c_int, pointers.as_ptr()) == 0 {
                Ok(read(cubin_size, cubin))
            } else {
                Err(String::from_utf8_lossy(&read(log_size, log)).trim_end_matches('\0').trim().replace('\n', " | "))
            };
            destroy(&mut program);
            result
        }
    }
}

/// The NVRTC libraries of the `nvidia-cuda-nvrtc-cu12` wheel that `python` imports, if any.
fn wheel_libraries(python: &Path) -> Vec<String> {
    let script = "import nvidia.cuda_nvrtc as m, os; print(os.path.join(list(m.__path__)[0], 'lib'))";
    let Ok(out) = std::process::Command::new(python).args(["-c", script]).output() else {
        return Vec::new();
    };
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let Ok(entries) = fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut libraries: Vec<String> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc.so")))
        .map(|p| p.display().to_string())
        .collect();
    libraries.sort();
    libraries
}
