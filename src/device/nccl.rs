//! NCCL, the collective-communication library of PyTorch DDP and llm.c: the all-reduce that data-parallel
//! training averages gradients with, and ZeRO-1's reduce-scatter and all-gather, over NVLink within a host
//! and over the network across hosts.
//!
//! The library is loaded at run time, as NVRTC is: from the system's loader path, else from `TEXTNET_NCCL`
//! or the `nvidia-nccl-cu12`/`-cu13` wheel of the Python that `python3` runs (`device::library_search`),
//! so nobody sets `LD_LIBRARY_PATH`. It is loaded here rather than through cudarc's `nccl` module because
//! cudarc 0.19 looks for `libnccl.so`, `libnccl.so.13`, `.12`, … `.1` but never `libnccl.so.2`, the only
//! name NCCL 2 ships under in its wheels and system packages (the unversioned link comes only with the
//! development package). The handful of entry points used are declared below from `nccl.h`.

use crate::device::{library_search, preload_library};
use anyhow::{Result, anyhow, bail};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

/// `ncclUniqueId`: what every rank needs to join one communicator, made by rank 0.
pub const UNIQUE_ID_BYTES: usize = 128;

type RawComm = *mut c_void;
type NcclResult = c_int;
/// `ncclFloat32`, `ncclFloat64` and `ncclSum`, `ncclAvg` of `nccl.h`.
const FLOAT32: c_int = 7;
const FLOAT64: c_int = 8;
const SUM: c_int = 0;
const AVG: c_int = 4;
/// `ncclInProgress`: an operation still running (the only non-zero result that is not an error).
const IN_PROGRESS: NcclResult = 7;

struct Library {
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    get_unique_id: unsafe extern "C" fn(*mut [u8; UNIQUE_ID_BYTES]) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut RawComm, c_int, [u8; UNIQUE_ID_BYTES], c_int) -> NcclResult,
    comm_init_all: unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> NcclResult,
    comm_abort: unsafe extern "C" fn(RawComm) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(RawComm) -> NcclResult,
    comm_get_async_error: unsafe extern "C" fn(RawComm, *mut NcclResult) -> NcclResult,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        cudarc::driver::sys::CUstream,
    ) -> NcclResult,
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        cudarc::driver::sys::CUstream,
    ) -> NcclResult,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        RawComm,
        cudarc::driver::sys::CUstream,
    ) -> NcclResult,
    group_start: unsafe extern "C" fn() -> NcclResult,
    group_end: unsafe extern "C" fn() -> NcclResult,
    get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    _library: libloading::Library,
}

/// The loaded library, or why it could not be loaded.
fn library() -> Result<&'static Library> {
    static LIBRARY: OnceLock<std::result::Result<Library, String>> = OnceLock::new();
    LIBRARY.get_or_init(load).as_ref().map_err(|e| anyhow!("{e}"))
}

fn load() -> std::result::Result<Library, String> {
    // SAFETY: loading NCCL runs only its initialisers.
    let by_name = unsafe { libloading::Library::new("libnccl.so.2") };
    let library = match by_name {
        Ok(library) => library,
        Err(_) => {
            let places = library_search("TEXTNET_NCCL");
            if !preload_library("libnccl.so", places) {
                return Err("NCCL (libnccl.so.2) not found: install NCCL, or `pip install nvidia-nccl-cu12` (or \
                            -cu13) into the Python that `python3` runs, or set TEXTNET_NCCL to the library's path"
                    .into());
            }
            // Loaded above under its soname, so this finds that copy.
            // SAFETY: as above.
            unsafe { libloading::Library::new("libnccl.so.2") }.map_err(|e| format!("loading NCCL: {e}"))?
        }
    };
    // SAFETY: each symbol is NCCL 2's function of that name, with the signature nccl.h gives it.
    unsafe {
        macro_rules! symbol {
            ($name:literal) => {
                *library.get($name).map_err(|e| format!("NCCL lacks {}: {e}", String::from_utf8_lossy($name)))?
            };
        }
        Ok(Library {
            get_version: symbol!(b"ncclGetVersion"),
            get_unique_id: symbol!(b"ncclGetUniqueId"),
            comm_init_rank: symbol!(b"ncclCommInitRank"),
            comm_init_all: symbol!(b"ncclCommInitAll"),
            comm_abort: symbol!(b"ncclCommAbort"),
            comm_destroy: symbol!(b"ncclCommDestroy"),
            comm_get_async_error: symbol!(b"ncclCommGetAsyncError"),
            all_reduce: symbol!(b"ncclAllReduce"),
            reduce_scatter: symbol!(b"ncclReduceScatter"),
            all_gather: symbol!(b"ncclAllGather"),
            group_start: symbol!(b"ncclGroupStart"),
            group_end: symbol!(b"ncclGroupEnd"),
            get_error_string: symbol!(b"ncclGetErrorString"),
            _library: library,
        })
    }
}

/// An error of NCCL's, as one line.
fn check(result: NcclResult, what: &str) -> Result<()> {
    if result == 0 {
        return Ok(());
    }
    let text = library()
        .ok()
        // SAFETY: ncclGetErrorString returns a static C string for any result.
        .map(|l| unsafe { CStr::from_ptr((l.get_error_string)(result)) }.to_string_lossy().into_owned())
        .unwrap_or_default();
    bail!("NCCL {what} failed: {text} (result {result})")
}

/// NCCL's version, e.g. "2.27.3": also the check that the library loads.
pub fn version() -> Result<String> {
    let lib = library()?;
    let mut code: c_int = 0;
    // SAFETY: writes one int.
    check(unsafe { (lib.get_version)(&mut code) }, "ncclGetVersion")?;
    Ok(format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100))
}

/// A new unique id, made by rank 0 and sent to the others (`rendezvous`).
pub fn unique_id() -> Result<Vec<u8>> {
    let lib = library()?;
    let mut id = [0u8; UNIQUE_ID_BYTES];
    // SAFETY: writes 128 bytes.
    check(unsafe { (lib.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
    Ok(id.to_vec())
}

/// Runs `f` between ncclGroupStart and ncclGroupEnd: how one thread issues a collective on several
/// communicators of one process (one per GPU) without waiting on itself.
pub fn group<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let lib = library()?;
    // SAFETY: no arguments.
    check(unsafe { (lib.group_start)() }, "ncclGroupStart")?;
    let out = f();
    // SAFETY: closes the group opened above.
    let ended = check(unsafe { (lib.group_end)() }, "ncclGroupEnd");
    let out = out?;
    ended?;
    Ok(out)
}

/// One rank's communicator: which GPU it drives is fixed when made (the context current then, or the
/// ordinal given to `Comm::all_local`).
pub struct Comm {
    raw: RawComm,
    lib: &'static Library,
    aborted: bool,
}

// SAFETY: an NCCL communicator may be used from any one thread at a time; ncclCommAbort may be called from
// another thread while an operation is in flight (that is its purpose).
unsafe impl Send for Comm {}

impl Comm {
    /// Rank `rank` of `world_size` ranks, over the id rank 0 made; the GPU is the calling thread's current
    /// context's. Returns when every rank has joined.
    pub fn join(world_size: usize, rank: usize, id: &[u8]) -> Result<Comm> {
        let lib = library()?;
        let id: [u8; UNIQUE_ID_BYTES] =
            id.try_into().map_err(|_| anyhow!("internal: an NCCL id of {} bytes", id.len()))?;
        let mut raw: RawComm = std::ptr::null_mut();
        // SAFETY: writes one communicator handle.
        check(unsafe { (lib.comm_init_rank)(&mut raw, world_size as c_int, id, rank as c_int) }, "ncclCommInitRank")?;
        Ok(Comm { raw, lib, aborted: false })
    }

    /// One communicator for each of these GPUs of this process, rank i on `ordinals[i]`.
    pub fn all_local(ordinals: &[usize]) -> Result<Vec<Comm>> {
        let lib = library()?;
        let devices: Vec<c_int> = ordinals.iter().map(|&o| o as c_int).collect();
        let mut raw: Vec<RawComm> = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: writes devices.len() handles.
        check(
            unsafe { (lib.comm_init_all)(raw.as_mut_ptr(), devices.len() as c_int, devices.as_ptr()) },
            "ncclCommInitAll",
        )?;
        Ok(raw.into_iter().map(|raw| Comm { raw, lib, aborted: false }).collect())
    }

    fn all_reduce(
        &self,
        ptr: u64,
        count: usize,
        datatype: c_int,
        op: c_int,
        stream: &cudarc::driver::CudaStream,
    ) -> Result<()> {
        // SAFETY: ptr holds `count` elements of `datatype` on this communicator's GPU, reduced in place on
        // `stream`, a stream of that GPU.
        let result = unsafe {
            (self.lib.all_reduce)(
                ptr as *const c_void,
                ptr as *mut c_void,
                count,
                datatype,
                op,
                self.raw,
                stream.cu_stream(),
            )
        };
        check(result, "all-reduce")
    }

    /// Replaces `count` floats at device address `ptr` with their mean over the ranks, on `stream`.
    pub fn average_f32(&self, ptr: u64, count: usize, stream: &cudarc::driver::CudaStream) -> Result<()> {
        self.all_reduce(ptr, count, FLOAT32, AVG, stream)
    }

    /// Replaces `count` doubles at device address `ptr` with their sum over the ranks, on `stream`.
    pub fn sum_f64(&self, ptr: u64, count: usize, stream: &cudarc::driver::CudaStream) -> Result<()> {
        self.all_reduce(ptr, count, FLOAT64, SUM, stream)
    }

    /// ZeRO's reduce-scatter, in place: the `ranks`·`shard` floats at device address `ptr` are averaged
    /// over the ranks, and this rank (`rank`) receives its shard of the mean, floats rank·shard … of them
    /// (the others are left as they were), on `stream`.
    pub fn average_shard_f32(
        &self,
        ptr: u64,
        shard: usize,
        rank: usize,
        stream: &cudarc::driver::CudaStream,
    ) -> Result<()> {
        let mine = ptr + 4 * (rank * shard) as u64;
        // SAFETY: ptr holds ranks·shard floats on this communicator's GPU; NCCL's in-place form (the
        // receive buffer at the rank's shard of the send buffer), on a stream of that GPU.
        let result = unsafe {
            (self.lib.reduce_scatter)(
                ptr as *const c_void,
                mine as *mut c_void,
                shard,
                FLOAT32,
                AVG,
                self.raw,
                stream.cu_stream(),
            )
        };
        check(result, "reduce-scatter")
    }

    /// ZeRO's all-gather, in place: every rank's shard of `shard` floats (rank r's at floats r·shard … of
    /// the buffer at device address `ptr`) copied into every rank's buffer, on `stream`.
    pub fn gather_shards_f32(
        &self,
        ptr: u64,
        shard: usize,
        rank: usize,
        stream: &cudarc::driver::CudaStream,
    ) -> Result<()> {
        let mine = ptr + 4 * (rank * shard) as u64;
        // SAFETY: ptr holds ranks·shard floats on this communicator's GPU; NCCL's in-place form (the send
        // buffer at the rank's shard of the receive buffer), on a stream of that GPU.
        let result = unsafe {
            (self.lib.all_gather)(
                mine as *const c_void,
                ptr as *mut c_void,
                shard,
                FLOAT32,
                self.raw,
                stream.cu_stream(),
            )
        };
        check(result, "all-gather")
    }

    /// An error NCCL met while running this communicator's operations (a peer gone, a network failure).
    pub fn async_error(&self) -> Result<()> {
        let mut state: NcclResult = 0;
        // SAFETY: writes one int.
        check(unsafe { (self.lib.comm_get_async_error)(self.raw, &mut state) }, "ncclCommGetAsyncError")?;
        if state == IN_PROGRESS { Ok(()) } else { check(state, "communication") }
    }

    /// Ends this communicator's operations in flight (which then fail) so that nothing waits on them.
    pub fn abort(&mut self) {
        if !self.aborted {
            self.aborted = true;
            // SAFETY: the handle is live; after this it is never used again.
            unsafe { (self.lib.comm_abort)(self.raw) };
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if !self.aborted {
            // SAFETY: the handle is live and dropped once.
            unsafe { (self.lib.comm_destroy)(self.raw) };
        }
    }
}
