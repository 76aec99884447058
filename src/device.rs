//! Device layer: picks CPU or CUDA (`--device auto|cuda|cpu`), compiles the embedded `fused/*.cu`
//! kernels with NVRTC for the GPU's own compute capability (machine code cached on disk by content hash), and
//! holds the launch helpers every pipeline shares (dynamic shared memory opt-in, error context).
//!
//! cudarc loads libcuda and libnvrtc at run time and panics when one is missing or lacks a symbol;
//! every entry into cudarc from here runs under `quietly`, which turns such a panic into an error.

use crate::phases;
use anyhow::{Context, Result, anyhow, bail};
use cudarc::driver::sys::CUfunction_attribute_enum as FuncAttr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr};
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;


include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

/// One `fused/*.cu` file, with its local includes inlined by build.rs.
#[derive(Debug)]
pub struct KernelSource {
    pub name: &'static str,
    /// Content hash naming the cached machine code; empty for a source read at run time (not cached).
    pub hash: &'static str,
    pub source: &'static str,
}

/// The kernel file `fused/{name}.cu`: the copy embedded at build time or, when `TEXTNET_FUSED_DIR` names a
/// directory, `{name}.cu` read from there (for trying a kernel change without rebuilding; such sources are
/// compiled afresh, never cached).
pub fn kernel_source(name: &str) -> Result<&'static KernelSource> {
    match std::env::var_os("TEXTNET_FUSED_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => kernel_source_from(Path::new(&dir), name),
        None => KERNEL_SOURCES
            .iter()
            .find(|k| k.name == name)
            .ok_or_else(|| anyhow!("kernel file fused/{name}.cu is not embedded in this binary")),
    }
}

fn kernel_source_from(dir: &Path, name: &str) -> Result<&'static KernelSource> {
    static LOADED: Mutex<Vec<&'static KernelSource>> = Mutex::new(Vec::new());
    let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(unit) = loaded.iter().find(|k| k.name == name) {
        return Ok(unit);
    }
    let path = dir.join(format!("{name}.cu"));
    let source = crate::fused_source::resolve_includes(&path, &mut Default::default(), &mut |_| {})
        .with_context(|| format!("cannot read kernel file {name}.cu from TEXTNET_FUSED_DIR"))?;
    eprintln!("note: fused/{name}.cu read from {} (TEXTNET_FUSED_DIR)", path.display());
    // Kept for the life of the process, as the embedded sources are.
    let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
    let unit: &'static KernelSource =
        Box::leak(Box::new(KernelSource { name, hash: "", source: Box::leak(source.into_boxed_str()) }));
    loaded.push(unit);
    Ok(unit)
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
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
pub enum Backend {
    Cpu,
    Cuda(Arc<Gpu>),
}

impl Backend {
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

/// Runs `f`, turning a panic inside it (cudarc's missing-library or missing-symbol panics) into an error,
/// without the panic message or a backtrace reaching the terminal.
pub fn quietly<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    static HOOK_LOCK: Mutex<()> = Mutex::new(());
    let _guard = HOOK_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(previous);
    match outcome {
        Ok(result) => result,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("unknown failure");
            let msg = msg.split(" - searched for").next().unwrap_or(msg);
            Err(anyhow!("{what}: {msg}"))
        }
    }
}

/// Checks that libnvrtc can be loaded, with a message that says what to install.
pub fn nvrtc_available() -> Result<()> {
    // SAFETY: only tries dlopen on cudarc's candidate library names.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        bail!(
            "NVRTC (libnvrtc.so) not found: install the CUDA toolkit's NVRTC, or `pip install \
             nvidia-cuda-nvrtc-cu12` and add its nvidia/cuda_nvrtc/lib to LD_LIBRARY_PATH"
        )
    }
}

/// An opened CUDA GPU: one context, one stream, the device limits the launch code needs, and the
/// kernel modules loaded so far.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sm_count: u32,
    /// Largest dynamic shared memory a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin).
    pub max_shared_optin: usize,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
}

impl Gpu {
    pub fn open(ordinal: usize) -> Result<Gpu> {
        // SAFETY: only tries dlopen on cudarc's candidate library names.
        if !phases::timed(|| unsafe { cudarc::driver::sys::is_culib_present() }, |_| "found the driver (libcuda)".into()) {
            bail!("no NVIDIA driver: libcuda.so could not be loaded (install the NVIDIA driver)");
        }
        phases::timed(nvrtc_available, |_| "found NVRTC (libnvrtc)".into())?;
        let started = Instant::now();
        let gpu = quietly("CUDA initialisation failed", || {
            use cudarc::driver::sys::CUdevice_attribute as Attr;
            let count = CudaContext::device_count().map_err(|e| anyhow!("the driver reports {e}"))?;
            if count <= ordinal as i32 {
                bail!("no CUDA GPU found (the driver sees {count})");
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

    pub fn describe(&self) -> String {
        let (major, minor) = self.compute_capability;
        format!("{}, sm_{major}{minor}, {} SMs", self.name, self.sm_count)
    }

    /// The module of `fused/{unit}.cu` compiled with `defines` (the model's fixed sizes, as `-DNAME=value`),
    /// compiled and loaded on first use and kept for the life of this `Gpu`.
    pub fn module(&self, request: &ModuleRequest) -> Result<Arc<CudaModule>> {
        let (unit, defines) = (request.0, define_options(&request.1));
        let key = format!("{unit} {}", defines.join(" "));
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(module) = modules.get(&key) {
            return Ok(module.clone());
        }
        let cubin = compile_cached(kernel_source(unit)?, self.compute_capability, &defines)?;
        let load = || {
            quietly("loading kernels", || {
                self.ctx
                    .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
                    .map_err(|e| anyhow!("the driver rejected fused/{unit}.cu: {e}"))
            })
        };
        let module = phases::timed(load, |_| format!("loaded fused/{unit}.cu {}", defines.join(" ")))?;
        modules.insert(key, module.clone());
        Ok(module)
    }

    /// One kernel of a loaded module, with the error naming it, and its parameters' sizes read once so
    /// that every launch can be checked against them.
    pub fn function(module: &Arc<CudaModule>, kernel: &str) -> Result<Kernel> {
        let func = module.load_function(kernel).with_context(|| format!("kernel {kernel} not found"))?;
        let params = parameter_sizes(&func);
        Ok(Kernel { name: kernel.into(), func, params: params.map(Into::into) })
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

/// A kernel ready to launch: its name (for errors) and the byte size of each of its parameters, as the
/// compiled code declares them (`None` where the driver is older than CUDA 12.4 and cannot say).
#[derive(Clone)]
pub struct Kernel {
    pub name: Arc<str>,
    func: CudaFunction,
    params: Option<Arc<[usize]>>,
}

impl std::ops::Deref for Kernel {
    type Target = CudaFunction;
    fn deref(&self) -> &CudaFunction {
        &self.func
    }
}

/// The byte sizes of `func`'s parameters, from `cuFuncGetParamInfo`, which answers an error past the last.
fn parameter_sizes(func: &CudaFunction) -> Option<Vec<usize>> {
    use cudarc::driver::sys;
    quietly("reading a kernel's parameters", || {
        let mut sizes = Vec::new();
        loop {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: a live function handle and two writable usizes.
            let status = unsafe { sys::cuFuncGetParamInfo(func.cu_function(), sizes.len(), &mut offset, &mut size) };
            if status != sys::CUresult::CUDA_SUCCESS {
                return Ok(sizes);
            }
            sizes.push(size);
        }
    })
    .ok()
}

impl Kernel {
    /// The byte size of each parameter, as the driver reports them (None: it cannot).
    pub fn parameter_sizes(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }
}

/// An error unless `args` match the parameters of kernel `name` (`sizes`, in bytes) in number and size: a
/// pointer (8 bytes) where it takes a pointer, a 32-bit word where it takes an int, unsigned or float.
pub fn check_arguments(name: &str, sizes: &[usize], args: &[Arg]) -> Result<()> {
    if sizes.len() != args.len() {
        bail!("internal: {name} takes {} arguments, given {}", sizes.len(), args.len());
    }
    for (i, (size, arg)) in sizes.iter().zip(args).enumerate() {
        let given = match arg {
            Arg::Ptr(_) => 8,
            Arg::Word(_) => 4,
        };
        if *size != given {
            bail!("internal: argument {i} of {name} is {size} bytes, given {given} ({arg:?})");
        }
    }
    Ok(())
}

/// One kernel argument: a device buffer's address or a 32-bit scalar (i32, u32 or f32 bits).
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    Word(u32),
}

impl Arg {
    pub fn buf<T>(gpu: &Gpu, slice: &CudaSlice<T>) -> Arg {
        let (ptr, _no_sync_needed) = slice.device_ptr(&gpu.stream);
        Arg::Ptr(ptr)
    }
    pub fn i32(v: i32) -> Arg {
        Arg::Word(v as u32)
    }
    pub fn u32(v: u32) -> Arg {
        Arg::Word(v)
    }
    pub fn f32(v: f32) -> Arg {
        Arg::Word(v.to_bits())
    }
}

impl Gpu {
    /// Launches `func` on the GPU's stream: a grid of `blocks` (x, y) blocks of 256 threads, `shared`
    /// bytes of dynamic shared memory. With `programmatic`, the kernel may start before the previous one finishes (programmatic
    /// dependent launch; the kernel must call grid_dependency_wait() before reading what that one writes).
    pub fn launch(
        &self,
        kernel: &Kernel,
        blocks: (u32, u32),
        shared: u32,
        programmatic: bool,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_sized(kernel, blocks, THREADS_PER_BLOCK, shared, programmatic, args)
    }

    /// `launch` with blocks of `threads` threads, for a kernel compiled for that block size.
    pub fn launch_sized(
        &self,
        kernel: &Kernel,
        blocks: (u32, u32),
        threads: u32,
        shared: u32,
        programmatic: bool,
        args: &[Arg],
    ) -> Result<()> {
        use cudarc::driver::sys;
        if let Some(sizes) = kernel.parameter_sizes() {
            check_arguments(&kernel.name, sizes, args)?;
        }
        // Every argument lives in a u64; a 32-bit scalar in its low (first, little-endian) four bytes.
        let mut storage: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p,
                Arg::Word(w) => w as u64,
            })
            .collect();
        let mut params: Vec<*mut std::ffi::c_void> = storage.iter_mut().map(|v| v as *mut u64 as *mut _).collect();
        // SAFETY: CUlaunchAttribute is a plain C struct and union, for which all zero bytes are valid.
        let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attribute.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: blocks.0,
            gridDimY: blocks.1,
            gridDimZ: 1,
            blockDimX: threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared,
            hStream: self.stream.cu_stream(),
            attrs: &mut attribute,
            numAttrs: (programmatic && programmatic_launch_enabled()) as u32,
        };
        // SAFETY: `params` holds one pointer per kernel parameter, each to a live u64 of `storage`.
        let status =
            unsafe { sys::cuLaunchKernelEx(&config, kernel.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) };
        if status != sys::CUresult::CUDA_SUCCESS {
            bail!("launching {} failed: {status:?}", kernel.name);
        }
        Ok(())
    }
}

/// Captures what `enqueue` launches on `stream` (it gets `target`, typically a trainer) as one CUDA
/// graph. The capture is ended even when `enqueue` fails, so the stream is usable afterwards.
pub fn capture_graph<T>(
    stream: &Arc<CudaStream>,
    target: &mut T,
    enqueue: impl FnOnce(&mut T) -> Result<()>,
) -> Result<cudarc::driver::CudaGraph> {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let enqueued = enqueue(target);
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    enqueued?;
    let graph = graph.context("capturing kernels as a CUDA graph")?;
    graph.context("CUDA graph capture produced no graph")
}

/// Threads per block of every fused kernel (THREADS in fused/common.cuh).
pub const THREADS_PER_BLOCK: u32 = 256;

/// NVRTC target for a compute capability: the virtual architecture, so the driver JITs for the exact GPU.
pub fn nvrtc_arch(compute_capability: (i32, i32)) -> String {
    format!("compute_{}{}", compute_capability.0, compute_capability.1)
}


/// The values of integer constant expressions as kernel file `unit` computes them with `defines` (e.g.
/// `GemmTile<64, 64, 16, 4, 4>::SHARED_FLOATS`), read from the PTX of the file with the expressions
/// appended as constants. The launch code's mirrors of kernel sizes are tested against this, so a size
/// has one source, the kernel file. Needs NVRTC, not a GPU.
pub fn kernel_constants(unit: &str, defines: &[(&str, i64)], expressions: &[&str]) -> Result<Vec<i64>> {
    let mut source = kernel_source(unit)?.source.to_string();
    for (i, e) in expressions.iter().enumerate() {
        source.push_str(&format!("extern \"C\" __constant__ long long textnet_probe_{i} = (long long)({e});\n"));
    }
    let ptx = compile_ptx_source(unit, &source, (9, 0), &define_options(defines))?;
    (0..expressions.len())
        .map(|i| {
            let name = format!("textnet_probe_{i} = ");
            let line = ptx.lines().find(|l| l.contains(&name));
            let value = line.and_then(|l| l.split(&name).nth(1)).map(|v| v.trim_end_matches(';').trim());
            value
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| anyhow!("no value for {} in the PTX of fused/{unit}.cu", expressions[i]))
        })
        .collect()
}

/// Compiles `unit` to PTX with NVRTC (no cache), with extra options such as `-DNAME=value`.
/// Errors carry NVRTC's log.
pub fn compile_ptx(unit: &KernelSource, compute_capability: (i32, i32), extra: &[String]) -> Result<String> {
    compile_ptx_source(unit.name, unit.source, compute_capability, extra)
}

/// `compile_ptx` of the text `source`, named as fused/{name}.cu in errors.
fn compile_ptx_source(name: &str, source: &str, compute_capability: (i32, i32), extra: &[String]) -> Result<String> {
    nvrtc_available()?;
    quietly("NVRTC", || {
        let opts = cudarc::nvrtc::CompileOptions {
            options: crate::fused_source::nvrtc_options(&nvrtc_arch(compute_capability), extra),
            name: Some(format!("{name}.cu")),
            ..Default::default()
        };
        match cudarc::nvrtc::compile_ptx_with_opts(source, opts) {
            Ok(ptx) => Ok(ptx.to_src()),
            Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => {
                bail!("NVRTC could not compile fused/{name}.cu:\n{}", log.to_string_lossy())
            }
            Err(e) => bail!("NVRTC failed on fused/{name}.cu: {e:?}"),
        }
    })
}

/// Compiles `unit` with NVRTC to the machine code of one GPU architecture (a CUBIN for sm_XY), so that
/// loading it leaves the driver nothing to compile: the driver's own PTX compile took most of a first
/// selftest's 90 s, one module after another, where NVRTC's run on every core ahead of time
/// (`precompile`). Errors carry NVRTC's log.
pub fn compile_cubin(unit: &KernelSource, compute_capability: (i32, i32), extra: &[String]) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    /// Destroys the program however the compile ends.
    struct Program(sys::nvrtcProgram);
    impl Drop for Program {
        fn drop(&mut self) {
            // SAFETY: a program created by nvrtcCreateProgram, destroyed once.
            let _ = unsafe { result::destroy_program(self.0) };
        }
    }
    nvrtc_available()?;
    quietly("NVRTC", || {
        let failed = |e: result::NvrtcError| anyhow!("NVRTC failed on fused/{}.cu: {e}", unit.name);
        let source = std::ffi::CString::new(unit.source).context("kernel source holds a NUL byte")?;
        let name = std::ffi::CString::new(format!("{}.cu", unit.name)).context("kernel name holds a NUL byte")?;
        let program = Program(result::create_program(&source, Some(&name)).map_err(failed)?);
        let (major, minor) = compute_capability;
        let options = crate::fused_source::nvrtc_options(&format!("sm_{major}{minor}"), extra);
        // SAFETY: `program` is live; the options are plain C strings.
        if unsafe { result::compile_program(program.0, &options) }.is_err() {
            // SAFETY: as above; the log is NUL-terminated.
            let log = unsafe { result::get_program_log(program.0) }
                .map(|log| log.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect::<String>())
                .unwrap_or_default();
            bail!("NVRTC could not compile fused/{}.cu:\n{log}", unit.name);
        }
        let mut size = 0usize;
        // SAFETY: `program` compiled; the buffer holds the size NVRTC reported.
        unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size).result() }.map_err(failed)?;
        let mut cubin = vec![0u8; size];
        unsafe { sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast()).result() }.map_err(failed)?;
        Ok(cubin)
    })
}

/// Whether kernels may overlap the one before them (programmatic dependent launch). `TEXTNET_NO_PDL=1`
/// turns it off: every kernel then waits for the previous one to finish (slower, same results), for
/// ruling overlap in or out when a driver misbehaves.
fn programmatic_launch_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os("TEXTNET_NO_PDL").is_none_or(|v| v.is_empty() || v == "0"))
}

fn define_options(defines: &[(&str, i64)]) -> Vec<String> {
    defines.iter().map(|(name, value)| format!("-D{name}={value}")).collect()
}

/// A kernel file and the sizes it is compiled for, as `Gpu::module` takes them.
pub type ModuleRequest = (&'static str, Vec<(&'static str, i64)>);

/// Compiles every requested module on every core, into the cache that `Gpu::module` reads: a run
/// that needs many sizes (the selftest) then waits for the slowest compile instead of their sum. Errors
/// are left for `Gpu::module` to report.
pub fn precompile(compute_capability: (i32, i32), requests: &[ModuleRequest]) {
    use rayon::prelude::*;
    let unique: std::collections::BTreeSet<&ModuleRequest> = requests.iter().collect();
    unique.into_par_iter().for_each(|(unit, defines)| {
        if let Ok(source) = kernel_source(unit) {
            let _ = compile_cached(source, compute_capability, &define_options(defines));
        }
    });
}

/// Where compiled kernels are kept: `$TEXTNET_CACHE`, else the user's cache directory.
pub fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("TEXTNET_CACHE").map(PathBuf::from).or_else(|| dirs::cache_dir().map(|d| d.join("textnet")))
}

include!(concat!(env!("OUT_DIR"), "/precompiled.rs"));

/// The machine code build.rs compiled ahead of time for `unit` (fused/precompiled.txt lists which
/// modules, for sm_80 and sm_90): for this architecture, or else for the same major version at minor 0,
/// which runs on every later minor version (a GPU of sm_86 or sm_89 runs sm_80 code).
fn precompiled(unit: &KernelSource, compute_capability: (i32, i32), extra: &[String]) -> Option<&'static [u8]> {
    if unit.hash.is_empty() {
        return None;
    }
    let (major, minor) = compute_capability;
    let names = [format!("sm_{major}{minor}"), format!("sm_{major}0")]
        .map(|sm| crate::fused_source::cubin_name(unit.name, unit.hash, &sm, extra));
    names.iter().find_map(|name| PRECOMPILED.iter().find(|(n, _)| n == name).map(|(_, cubin)| *cubin))
}

/// Whether this binary holds machine code compiled at build time (none where build.rs found no NVRTC),
/// and why not.
pub fn precompiled_count() -> (usize, &'static str) {
    (PRECOMPILED.len(), PRECOMPILED_NOTE)
}

/// `compile_cubin` behind the machine code compiled at build time, a cache in memory for the life of the
/// process, and one on disk, keyed by the source hash, the options and the architecture. A disk cache
/// that cannot be read or written only costs a recompile.
pub fn compile_cached(unit: &KernelSource, compute_capability: (i32, i32), extra: &[String]) -> Result<Vec<u8>> {
    static MEMORY: Mutex<Option<HashMap<String, Vec<u8>>>> = Mutex::new(None);
    let (major, minor) = compute_capability;
    let name = crate::fused_source::cubin_name(unit.name, unit.hash, &format!("sm_{major}{minor}"), extra);
    let memory = || MEMORY.lock().unwrap_or_else(|p| p.into_inner());
    let file = cache_dir().filter(|_| !unit.hash.is_empty()).map(|dir| dir.join("cubin").join(&name));
    if let Some(cubin) = memory().as_ref().and_then(|m| m.get(&name).cloned()) {
        return Ok(cubin);
    }
    if let Some(cubin) = precompiled(unit, compute_capability, extra) {
        phases::note(Instant::now(), &format!("fused/{}.cu {}: compiled at build time", unit.name, extra.join(" ")));
        return Ok(cubin.to_vec());
    }
    let read = || file.as_ref().and_then(|f| std::fs::read(f).ok());
    let described = |found: &Option<Vec<u8>>| {
        let how = if found.is_some() { "read from the cache" } else { "not in the cache" };
        format!("fused/{}.cu {}: {how}", unit.name, extra.join(" "))
    };
    if let Some(cubin) = phases::timed(read, described) {
        memory().get_or_insert_default().insert(name, cubin.clone());
        return Ok(cubin);
    }
    let compile = || compile_cubin(unit, compute_capability, extra);
    let cubin = phases::timed(compile, |_| format!("compiled fused/{}.cu {}", unit.name, extra.join(" ")))?;
    if let Some(file) = file {
        let _ = crate::fsutil::write_atomic(&file, &cubin);
    }
    if !unit.hash.is_empty() {
        memory().get_or_insert_default().insert(name, cubin.clone());
    }
    Ok(cubin)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unless the build was asked not to (TEXTNET_PRECOMPILE=0), every module fused/precompiled.txt lists
    /// is in the binary for both architectures; a build that found no NVRTC fails this.
    #[test]
    fn every_listed_module_was_compiled_at_build_time() {
        let (count, note) = precompiled_count();
        if note.contains("TEXTNET_PRECOMPILE=0") {
            return;
        }
        let manifest = include_str!("../fused/precompiled.txt");
        let listed = manifest.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).count();
        assert_eq!(count, 2 * listed, "{note}");
    }

    #[test]
    fn kernel_constants_are_read_from_the_kernel_file() {
        let values = kernel_constants("matmul", &[], &["THREADS", "WARPS * 3", "G128_LD"]).unwrap();
        assert_eq!(values, [THREADS_PER_BLOCK as i64, 24, 132]);
        assert!(kernel_constants("matmul", &[], &["NO_SUCH_NAME"]).is_err());
    }

    #[test]
    fn arguments_are_checked_in_number_and_size() {
        let sizes = [8, 4, 4];
        assert!(check_arguments("k", &sizes, &[Arg::Ptr(0), Arg::i32(1), Arg::f32(1.0)]).is_ok());
        let err = check_arguments("k", &sizes, &[Arg::Ptr(0), Arg::i32(1)]).unwrap_err().to_string();
        assert_eq!(err, "internal: k takes 3 arguments, given 2");
        let err = check_arguments("k", &sizes, &[Arg::Ptr(0), Arg::Ptr(0), Arg::f32(1.0)]).unwrap_err().to_string();
        assert!(err.starts_with("internal: argument 1 of k is 4 bytes, given 8"), "{err}");
    }
}
