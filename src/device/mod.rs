//! The device: picks CPU or CUDA (`--device auto|cuda|cpu`), finds the CUDA libraries the loader does not
//! (NVRTC, NCCL) and opens a GPU (`Gpu`: its context, its stream, the limits the launch code needs, and the
//! kernel modules loaded so far). `compile` turns the embedded `fused/*.cu` files into machine code with
//! NVRTC (cached on disk by content hash, or compiled at build time); `launch` holds `Kernel`, `Arg` and
//! the one launch path every pipeline shares, `kernel_struct` the typed structs kernels take by value,
//! `rebind` a captured graph reading other input buffers; `nccl`, `parallel` and `rendezvous` train on several GPUs;
//! `precision` names the number formats a run computes in; `phases` says where start-up time goes
//! (`--verbose`: finding the libraries, opening the GPU, compiling and loading modules).
//!
//! cudarc loads libcuda and libnvrtc at run time and panics when one is missing or lacks a symbol;
//! every entry into cudarc from here runs under `quietly`, which turns such a panic into an error.

pub mod compile;
pub(crate) mod fused_source;
pub mod kernel_struct;
pub mod launch;
pub mod nccl;
pub mod parallel;
pub mod phases;
pub mod precision;
#[cfg(test)]
mod precompile_choice;
pub mod rebind;
pub mod rendezvous;
pub mod tma;

use anyhow::{Context, Result, anyhow, bail};
use cudarc::driver::sys::CUfunction_attribute_enum as FuncAttr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
/// The `--device` flag: where to train.
pub enum DeviceChoice {
    /// A CUDA GPU when one is usable, otherwise the CPU
    #[default]
    Auto,
    /// A CUDA GPU, or an error saying why none is usable
    Cuda,
    /// The CPU reference implementation
    Cpu,
}

/// Where a pipeline runs.
#[derive(Clone)]
pub enum Backend {
    /// The CPU reference.
    Cpu,
    /// A CUDA GPU.
    Cuda(Arc<Gpu>),
}

impl Backend {
    /// Where it runs in words, e.g. "cpu" or "cuda (NVIDIA H100, sm_90, 132 SMs)".
    pub fn describe(&self) -> String {
        match self {
            Backend::Cpu => "cpu".into(),
            Backend::Cuda(gpu) => format!("{} ({})", self.id(), gpu.describe()),
        }
    }

    /// The device as PyTorch names it: "cpu" or "cuda:0".
    pub fn id(&self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda(_) => "cuda:0",
        }
    }
}

/// Resolves `--device`.
pub fn select(choice: DeviceChoice) -> Result<Backend> {
    Ok(select_described(choice)?.0)
}

/// Resolves `--device` and describes the result for the command's own `device:` line, with what `auto`
/// found: "cuda (NVIDIA H100 …) (--device auto found a usable GPU)" or "cpu (--device auto: no usable GPU:
/// why)".
pub fn select_described(choice: DeviceChoice) -> Result<(Backend, String)> {
    let (backend, reason) = match choice {
        DeviceChoice::Cpu => (Backend::Cpu, "--device cpu".to_string()),
        DeviceChoice::Cuda => {
            let backend = Gpu::open(0).map(|gpu| Backend::Cuda(Arc::new(gpu))).context("--device cuda")?;
            (backend, "--device cuda".into())
        }
        DeviceChoice::Auto => match Gpu::open(0) {
            Ok(gpu) => (Backend::Cuda(Arc::new(gpu)), "--device auto found a usable GPU".into()),
            Err(why) => (Backend::Cpu, format!("--device auto: no usable GPU: {why:#}")),
        },
    };
    let described = match choice {
        DeviceChoice::Auto => format!("{} ({reason})", backend.describe()),
        _ => backend.describe(),
    };
    let _ = SELECTION_REASON.set(reason);
    Ok((backend, described))
}

/// Why this process's run trains where it does (set by `select_described`, for the report's
/// `device_reason`).
static SELECTION_REASON: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The reason `select_described` gave, if it was called.
pub fn selection_reason() -> Option<&'static str> {
    SELECTION_REASON.get().map(String::as_str)
}

/// The text a panic carries ("unknown failure" when it is neither a `String` nor a `&str`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("unknown failure")
}

/// Runs `f`, turning a panic inside it (cudarc's missing-library or missing-symbol panics) into an error,
/// without the panic message or a backtrace reaching the terminal. The panic hook, installed once, stays
/// silent only on a thread inside `quietly`, so threads do not wait on each other (a kernel module loaded
/// on one thread while another compiles).
pub fn quietly<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    thread_local! {
        static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                previous(info);
            }
        }));
    });
    let outer = QUIET.with(|q| q.replace(true));
    let outcome = catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(outer));
    match outcome {
        Ok(result) => result,
        Err(payload) => {
            let msg = panic_message(payload.as_ref());
            let msg = msg.split(" - searched for").next().unwrap_or(msg);
            Err(anyhow!("{what}: {msg}"))
        }
    }
}

/// Checks that libnvrtc can be loaded, with a message that says what to install. When the loader's own
/// search finds none, NVRTC is looked for as `nvrtc_search` says and loaded from there.
pub fn nvrtc_available() -> Result<()> {
    // SAFETY: only tries dlopen on cudarc's candidate library names.
    let present = || unsafe { cudarc::nvrtc::sys::is_culib_present() };
    if present() || (preload_nvrtc() && present()) {
        Ok(())
    } else {
        bail!(
            "NVRTC (libnvrtc.so) not found: install the CUDA toolkit's NVRTC, or `pip install \
             nvidia-cuda-nvrtc-cu12` (or `pip install textnet[cuda]`) into the Python that `python3` runs, or \
             set TEXTNET_NVRTC to the library's path"
        )
    }
}

/// Folders the Python package found NVRTC in (`add_nvrtc_dir`).
static NVRTC_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Adds a folder to look for libnvrtc in (the Python package passes its `nvidia-cuda-nvrtc` wheel's).
pub fn add_nvrtc_dir(dir: PathBuf) {
    NVRTC_DIRS.lock().unwrap_or_else(|p| p.into_inner()).push(dir);
}

/// Where NVRTC is looked for when the loader does not find it (`library_search` with `TEXTNET_NVRTC`).
pub fn nvrtc_search() -> Vec<PathBuf> {
    library_search("TEXTNET_NVRTC")
}

/// Where a CUDA library the loader does not find (NVRTC, NCCL) is looked for, in order:
///
/// 1. the variable `env` (`TEXTNET_NVRTC`, `TEXTNET_NCCL`): the library, or its folder;
/// 2. folders the Python package added (`add_nvrtc_dir`);
/// 3. the `nvidia-*` wheels of the virtual environment the executable is installed in
///    (`<venv>/bin/textnet` → `<venv>/lib/python3.*/site-packages/nvidia/*/lib`);
/// 4. the `nvidia-*` wheels of the Python that `python3` runs (`nvidia/cuda_nvrtc/lib` of
///    `nvidia-cuda-nvrtc-cu12`, `nvidia/nccl/lib` of `nvidia-nccl-cu12`, `nvidia/cu13/lib` of CUDA 13's).
///
/// So nobody sets `LD_LIBRARY_PATH` by hand.
pub fn library_search(env: &str) -> Vec<PathBuf> {
    let mut places = Vec::new();
    if let Some(path) = std::env::var_os(env) {
        places.push(PathBuf::from(path));
    }
    places.extend(NVRTC_DIRS.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned());
    let nvidia_libs = |nvidia: &Path| -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(nvidia)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path().join("lib")))
            .collect();
        dirs.sort();
        dirs
    };
    if let Some(venv) = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.parent()?.join("lib"))) {
        for python in std::fs::read_dir(venv).into_iter().flatten().filter_map(|e| e.ok()) {
            places.extend(nvidia_libs(&python.path().join("site-packages/nvidia")));
        }
    }
    let script =
        "import nvidia, os; print('\\n'.join(os.path.join(p, d) for p in nvidia.__path__ for d in os.listdir(p)))";
    if let Ok(out) =
        std::process::Command::new("python3").args(["-c", script]).stderr(std::process::Stdio::null()).output()
    {
        places.extend(String::from_utf8_lossy(&out.stdout).lines().map(|dir| Path::new(dir).join("lib")));
    }
    places
}

/// Loads the first library named `stem*` (`libnvrtc.so`, `libnccl.so`) found in `places` and keeps it
/// loaded, so that a later load by name (cudarc's `libnvrtc.so.12`, `nccl`'s `libnccl.so.2`) finds it
/// (the loader matches a loaded library by its soname). Returns whether one was loaded.
pub(crate) fn preload_library(stem: &str, places: Vec<PathBuf>) -> bool {
    for place in places {
        let mut candidates = vec![place.clone()];
        if place.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(&place)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(stem)))
                .collect();
            found.sort();
            candidates = found;
        }
        for library in candidates.iter().filter(|p| p.is_file()) {
            // SAFETY: loading the library runs only its initialisers; it stays loaded for the process's
            // life (cudarc holds its own handle to it).
            if let Ok(lib) = unsafe { libloading::Library::new(library) } {
                std::mem::forget(lib);
                return true;
            }
        }
    }
    false
}

/// `preload_library` for NVRTC, once.
fn preload_nvrtc() -> bool {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOADED.get_or_init(|| preload_library("libnvrtc.so", nvrtc_search()))
}

/// Checks that the driver (libcuda) loads.
fn driver_available() -> Result<()> {
    // SAFETY: only tries dlopen on cudarc's candidate library names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        bail!("no NVIDIA driver: libcuda.so could not be loaded (install the NVIDIA driver)");
    }
    Ok(())
}

/// How many CUDA GPUs the driver sees.
pub fn gpu_count() -> Result<usize> {
    driver_available()?;
    quietly("CUDA initialisation failed", || {
        Ok(CudaContext::device_count().map_err(|e| anyhow!("the driver reports {e}"))? as usize)
    })
}

/// An opened CUDA GPU: one context, one stream, the device limits the launch code needs, and the
/// kernel modules loaded so far.
pub struct Gpu {
    /// The CUDA context.
    pub ctx: Arc<CudaContext>,
    /// The stream every copy and launch goes on.
    pub stream: Arc<CudaStream>,
    /// The device name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0).
    pub compute_capability: (i32, i32),
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
    /// Largest dynamic shared memory a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin).
    pub max_shared_optin: usize,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
}

impl Gpu {
    /// Opens GPU `ordinal` (0 is the first): loads the driver, creates its context and stream.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        let searched = |what: &'static str| {
            move |r: &Result<()>| format!("{} {what}", if r.is_ok() { "found" } else { "did not find" })
        };
        phases::timed(driver_available, searched("the driver (libcuda)"))?;
        phases::timed(nvrtc_available, searched("NVRTC (libnvrtc)"))?;
        let started = Instant::now();
        let gpu = quietly("CUDA initialisation failed", || {
            use cudarc::driver::sys::CUdevice_attribute as Attr;
            let count = CudaContext::device_count().map_err(|e| anyhow!("the driver reports {e}"))?;
            if count == 0 {
                bail!("no CUDA GPU found (the driver sees 0)");
            }
            if count <= ordinal as i32 {
                bail!("there is no GPU {ordinal}: this host has {count} (0 to {})", count - 1);
            }
            let ctx =
                CudaContext::new(ordinal).map_err(|e| anyhow!("cannot create a context on GPU {ordinal}: {e}"))?;
            // One stream, no cross-stream event bookkeeping: it would add event records to captured graphs.
            // SAFETY: nothing is allocated yet, and every buffer of this context lives on the one stream
            // made below, so no access needs the events cudarc would record.
            unsafe { ctx.disable_event_tracking() };
            // A stream of our own: the legacy default stream cannot be captured into a CUDA graph.
            let stream = ctx.new_stream().map_err(|e| anyhow!("cannot create a stream: {e}"))?;
            let name = ctx.name()?;
            let compute_capability = ctx.compute_capability()?;
            let sm_count = ctx.attribute(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
            let max_shared_optin = ctx.attribute(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? as usize;
            Ok(Gpu { ctx, stream, name, compute_capability, sm_count, max_shared_optin, modules: Mutex::default() })
        })?;
        phases::note(started, &format!("opened GPU {ordinal} (driver initialised, context and stream created)"));
        Ok(gpu)
    }

    /// The GPU in words: "NAME, sm_XY, N SMs".
    pub fn describe(&self) -> String {
        let (major, minor) = self.compute_capability;
        format!("{}, sm_{major}{minor}, {} SMs", self.name, self.sm_count)
    }

    /// Asks for the largest shared-memory carveout of the SM's unified L1/shared storage for `func`. Kernels
    /// that follow one another with programmatic dependent launch should all ask: blocks of kernels with
    /// different carveouts cannot share an SM, so the next kernel's blocks would wait for the SM to drain.
    pub fn prefer_shared_carveout(&self, func: &CudaFunction) -> Result<()> {
        func.set_attribute(FuncAttr::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
            .context("cannot set the shared-memory carveout")
    }

    /// Allows `func` to use `bytes` of dynamic shared memory, opting in above the 48 KB default. When the
    /// device cannot give that much, the error names the flag that shrinks it (`hint`, e.g. "--hidden").
    pub fn reserve_shared(&self, func: &CudaFunction, bytes: usize, hint: &str) -> Result<()> {
        let static_bytes = func.shared_size_bytes().unwrap_or(0) as usize;
        if bytes + static_bytes > self.max_shared_optin {
            bail!(
                "this model shape needs {} KB of shared memory per block but {} allows {} KB; lower {hint}",
                (bytes + static_bytes).div_ceil(1024),
                self.name,
                self.max_shared_optin / 1024
            );
        }
        func.set_attribute(FuncAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)
            .with_context(|| format!("cannot opt in to {bytes} bytes of dynamic shared memory"))
    }
}

#[cfg(test)]
mod tests {
    use super::quietly;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn a_panic_inside_quietly_is_an_error_naming_what_failed() {
        let result: anyhow::Result<()> = quietly("loading kernels", || panic!("no such symbol - searched for x"));
        assert_eq!(result.unwrap_err().to_string(), "loading kernels: no such symbol");
    }

    /// One thread inside `quietly` (a compile) does not hold another out of it (a module load): the
    /// second signals the first from inside its own.
    #[test]
    fn threads_enter_quietly_at_once() {
        let (tx, rx) = channel();
        let waiting = std::thread::spawn(move || {
            quietly("waiting", || rx.recv_timeout(Duration::from_secs(60)).map_err(|e| anyhow::anyhow!("{e}")))
        });
        std::thread::sleep(Duration::from_millis(50));
        quietly("signalling", || tx.send(()).map_err(|e| anyhow::anyhow!("{e}"))).unwrap();
        waiting.join().unwrap().unwrap();
    }
}
