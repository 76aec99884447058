//! Launching a kernel: `Kernel` (a compiled function and its parameters' sizes), `Arg` and `StructArg`
//! (what a launch passes), the one launch path every pipeline shares (`Gpu::launch` and its variants:
//! programmatic dependent launch where asked, each launch checked against the kernel's own parameter
//! sizes), and CUDA graph capture.

use super::{Gpu, quietly};
use crate::ops::THREADS_PER_BLOCK;
use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;

/// A kernel ready to launch: its name (for errors) and the byte size of each of its parameters, as the
/// compiled code declares them (`None` where the driver is older than CUDA 12.4 and cannot say).
#[derive(Clone)]
pub struct Kernel {
    /// The kernel's function name.
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
    check_parameters(name, sizes, &[], args)
}

/// `check_arguments` for a kernel given structs of `tables` bytes each before `args`.
fn check_parameters(name: &str, sizes: &[usize], tables: &[usize], args: &[Arg]) -> Result<()> {
    let leading = tables.len();
    if sizes.len() != leading + args.len() {
        bail!("internal: {name} takes {} arguments, given {}", sizes.len(), leading + args.len());
    }
    for (i, (&size, &bytes)) in sizes.iter().zip(tables).enumerate() {
        if size != bytes {
            bail!("internal: argument {i} of {name} is {size} bytes, given a struct of {bytes}");
        }
    }
    for (i, (size, arg)) in sizes[leading..].iter().zip(args).enumerate() {
        let given = match arg {
            Arg::Ptr(_) => 8,
            Arg::Word(_) => 4,
        };
        if *size != given {
            bail!("internal: argument {} of {name} is {size} bytes, given {given} ({arg:?})", leading + i);
        }
    }
    Ok(())
}

/// The most bytes of parameters one kernel launch may pass (CUDA's limit on every GPU and driver; newer
/// ones allow more on Volta and later).
pub const KERNEL_PARAMETER_BYTES: usize = 4096;

/// A struct passed to a kernel by value as its first parameter: its bytes in the C layout the kernel
/// declares (built by the caller), kept in 8-byte words so the driver reads them from an aligned address.
/// A table of tensors travels this way, as PyTorch's multi_tensor_apply passes its TensorListMetadata.
#[derive(Clone, Debug)]
pub struct StructArg {
    words: Vec<u64>,
    bytes: usize,
}

impl StructArg {
    /// The struct whose bytes are `bytes`.
    pub fn new(bytes: &[u8]) -> StructArg {
        let words = bytes.chunks(8).map(|c| {
            let mut word = [0u8; 8];
            word[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(word)
        });
        StructArg { words: words.collect(), bytes: bytes.len() }
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Its bytes, as the driver reads them.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.words.iter().flat_map(|w| w.to_le_bytes()).take(self.bytes).collect()
    }
}

/// One kernel argument: a device buffer's address or a 32-bit scalar (i32, u32 or f32 bits).
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A device address.
    Ptr(u64),
    /// The bits of a 32-bit scalar.
    Word(u32),
}

impl Arg {
    /// The device address of `slice`.
    pub fn buf<T>(gpu: &Gpu, slice: &CudaSlice<T>) -> Arg {
        let (ptr, _no_sync_needed) = slice.device_ptr(&gpu.stream);
        Arg::Ptr(ptr)
    }
    /// An `int` argument.
    pub fn i32(v: i32) -> Arg {
        Arg::Word(v as u32)
    }
    /// An `unsigned int` argument.
    pub fn u32(v: u32) -> Arg {
        Arg::Word(v)
    }
    /// A `float` argument.
    pub fn f32(v: f32) -> Arg {
        Arg::Word(v.to_bits())
    }
}

impl Gpu {
    /// One kernel of a loaded module, with the error naming it, and its parameters' sizes read once so
    /// that every launch can be checked against them.
    pub fn function(module: &Arc<CudaModule>, kernel: &str) -> Result<Kernel> {
        let func = module.load_function(kernel).with_context(|| format!("kernel {kernel} not found"))?;
        let params = parameter_sizes(&func);
        Ok(Kernel { name: kernel.into(), func, params: params.map(Into::into) })
    }

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
        self.launch_on(&self.stream, kernel, blocks, threads, shared, programmatic, args)
    }

    /// As `launch_sized`, on `stream` (one of this GPU's context) instead of the GPU's own.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_on(
        &self,
        stream: &CudaStream,
        kernel: &Kernel,
        blocks: (u32, u32),
        threads: u32,
        shared: u32,
        programmatic: bool,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_on_with_struct(stream, kernel, (blocks, threads, shared, programmatic), None, args)
    }

    /// As `launch_on`, with `table` (when given) as the kernel's first parameter, passed by value.
    pub fn launch_on_with_struct(
        &self,
        stream: &CudaStream,
        kernel: &Kernel,
        (blocks, threads, shared, programmatic): ((u32, u32), u32, u32, bool),
        table: Option<&StructArg>,
        args: &[Arg],
    ) -> Result<()> {
        let shape = LaunchShape { blocks, threads, shared, programmatic };
        launch_parameters(stream, kernel, shape, table.as_slice(), args)
    }

    /// `launch_sized` of a kernel whose one parameter is the struct `args`, passed by value (a
    /// `KernelStruct`'s `StructArg::of`).
    pub fn launch_struct(
        &self,
        kernel: &Kernel,
        (blocks, threads, shared, programmatic): ((u32, u32), u32, u32, bool),
        args: &StructArg,
    ) -> Result<()> {
        self.launch_sized_with_struct(kernel, (blocks, threads, shared, programmatic), args, &[])
    }

    /// `launch` of a kernel whose first parameter is the struct `table`, passed by value, and `args` the
    /// rest.
    pub fn launch_with_struct(
        &self,
        kernel: &Kernel,
        (blocks, shared, programmatic): ((u32, u32), u32, bool),
        table: &StructArg,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_with_structs(kernel, (blocks, shared, programmatic), &[table], args)
    }

    /// `launch` of a kernel whose first parameters are the structs `tables`, in order, each passed by
    /// value, and `args` the rest.
    pub fn launch_with_structs(
        &self,
        kernel: &Kernel,
        (blocks, shared, programmatic): ((u32, u32), u32, bool),
        tables: &[&StructArg],
        args: &[Arg],
    ) -> Result<()> {
        let shape = LaunchShape { blocks, threads: THREADS_PER_BLOCK, shared, programmatic };
        launch_parameters(&self.stream, kernel, shape, tables, args)
    }

    /// `launch_with_struct` with blocks of `threads` threads, for a kernel compiled for that block size.
    pub fn launch_sized_with_struct(
        &self,
        kernel: &Kernel,
        (blocks, threads, shared, programmatic): ((u32, u32), u32, u32, bool),
        table: &StructArg,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_on_with_struct(&self.stream, kernel, (blocks, threads, shared, programmatic), Some(table), args)
    }
}

/// The most scalar arguments one launch passes (after its structs, if any).
const MAX_SCALAR_ARGUMENTS: usize = 48;
/// The most structs one launch passes before its scalar arguments.
const MAX_STRUCT_ARGUMENTS: usize = 2;

/// A launch's grid, block size, dynamic shared memory (bytes) and whether it may start early.
struct LaunchShape {
    blocks: (u32, u32),
    threads: u32,
    shared: u32,
    programmatic: bool,
}

/// Launches `kernel` on `stream` with `tables` as its first parameters and `args` after them.
fn launch_parameters(
    stream: &CudaStream,
    kernel: &Kernel,
    LaunchShape { blocks, threads, shared, programmatic }: LaunchShape,
    tables: &[&StructArg],
    args: &[Arg],
) -> Result<()> {
    use cudarc::driver::sys;
    if tables.len() > MAX_STRUCT_ARGUMENTS {
        bail!(
            "internal: {} is given {} structs, more than a launch takes ({MAX_STRUCT_ARGUMENTS})",
            kernel.name,
            tables.len()
        );
    }
    if let Some(sizes) = kernel.parameter_sizes() {
        // The structs' sizes on the stack, as everything else here: no allocation per launch.
        let mut bytes = [0usize; MAX_STRUCT_ARGUMENTS];
        for (size, table) in bytes.iter_mut().zip(tables) {
            *size = table.len();
        }
        check_parameters(&kernel.name, sizes, &bytes[..tables.len()], args)?;
    }
    // Every scalar argument lives in a u64, a 32-bit one in its low (first, little-endian) four bytes;
    // the struct in its own words (the driver reads each parameter's declared size from its pointer). On
    // the stack: an eager op's launch is most of its host time.
    if args.len() > MAX_SCALAR_ARGUMENTS {
        bail!(
            "internal: {} is given {} arguments, more than a launch takes ({MAX_SCALAR_ARGUMENTS})",
            kernel.name,
            args.len()
        );
    }
    let mut storage = [0u64; MAX_SCALAR_ARGUMENTS];
    for (word, arg) in storage.iter_mut().zip(args) {
        *word = match *arg {
            Arg::Ptr(p) => p,
            Arg::Word(w) => w as u64,
        };
    }
    let mut params = [std::ptr::null_mut::<std::ffi::c_void>(); MAX_SCALAR_ARGUMENTS + MAX_STRUCT_ARGUMENTS];
    let structs = tables.iter().map(|t| t.words.as_ptr() as *mut std::ffi::c_void);
    let scalars = storage[..args.len()].iter_mut().map(|v| v as *mut u64 as *mut std::ffi::c_void);
    for (slot, param) in params.iter_mut().zip(structs.chain(scalars)) {
        *slot = param;
    }
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
        hStream: stream.cu_stream(),
        attrs: &mut attribute,
        numAttrs: (programmatic && programmatic_launch_enabled()) as u32,
    };
    // SAFETY: `params` holds one pointer per kernel parameter: each struct's live words first (as many
    // bytes as the kernel declares, where the driver could say so; the driver only reads them), then
    // each to a live u64 of `storage`.
    let status =
        unsafe { sys::cuLaunchKernelEx(&config, kernel.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) };
    if status != sys::CUresult::CUDA_SUCCESS {
        bail!("launching {} failed: {status:?}", kernel.name);
    }
    Ok(())
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

/// Whether kernels may overlap the one before them (programmatic dependent launch). `TEXTNET_NO_PDL=1`
/// turns it off: every kernel then waits for the previous one to finish (slower, same results), for
/// ruling overlap in or out when a driver misbehaves.
fn programmatic_launch_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os("TEXTNET_NO_PDL").is_none_or(|v| v.is_empty() || v == "0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked_in_number_and_size() {
        let sizes = [8, 4, 4];
        assert!(check_arguments("k", &sizes, &[Arg::Ptr(0), Arg::i32(1), Arg::f32(1.0)]).is_ok());
        let err = check_arguments("k", &sizes, &[Arg::Ptr(0), Arg::i32(1)]).unwrap_err().to_string();
        assert_eq!(err, "internal: k takes 3 arguments, given 2");
        let err = check_arguments("k", &sizes, &[Arg::Ptr(0), Arg::Ptr(0), Arg::f32(1.0)]).unwrap_err().to_string();
        assert!(err.starts_with("internal: argument 1 of k is 4 bytes, given 8"), "{err}");
        // A struct first, checked by its size; the arguments after it counted from 1.
        let sizes = [3592, 8, 4];
        assert!(check_parameters("k", &sizes, &[3592], &[Arg::Ptr(0), Arg::i32(1)]).is_ok());
        let err = check_parameters("k", &sizes, &[3584], &[Arg::Ptr(0), Arg::i32(1)]).unwrap_err().to_string();
        assert_eq!(err, "internal: argument 0 of k is 3592 bytes, given a struct of 3584");
        let err = check_parameters("k", &sizes, &[3592], &[Arg::Ptr(0), Arg::Ptr(0)]).unwrap_err().to_string();
        assert!(err.starts_with("internal: argument 2 of k is 4 bytes, given 8"), "{err}");
        let err = check_parameters("k", &sizes, &[3592], &[Arg::Ptr(0)]).unwrap_err().to_string();
        assert_eq!(err, "internal: k takes 3 arguments, given 2");
        // Two structs first, each checked by its size.
        let sizes = [320, 28, 4];
        assert!(check_parameters("k", &sizes, &[320, 28], &[Arg::i32(1)]).is_ok());
        let err = check_parameters("k", &sizes, &[320, 32], &[Arg::i32(1)]).unwrap_err().to_string();
        assert_eq!(err, "internal: argument 1 of k is 28 bytes, given a struct of 32");
    }

    #[test]
    fn a_struct_argument_keeps_its_bytes_in_order() {
        let bytes: Vec<u8> = (1..=13).collect();
        let table = StructArg::new(&bytes);
        assert_eq!(table.len(), 13);
        // The driver reads the bytes from the words' address: little-endian words, the tail zero-padded.
        let read: Vec<u8> = table.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(read.len(), 16);
        assert_eq!(&read[..13], &bytes[..]);
        assert_eq!(&read[13..], [0, 0, 0]);
    }
}
