//! A captured graph that reads its inputs where they are: the kernel nodes whose parameters hold an address
//! inside one of the graph's input buffers are found once, after the capture ([`Rebinding::find`]), and a
//! replay can then read other buffers of the same sizes instead ([`Rebinding::bind`]), by rewriting those
//! nodes' parameters in the instantiated graph (`cuGraphExecKernelNodeSetParams`, which leaves replays
//! already queued as they were). No copy into the inputs, so a new batch costs the GPU nothing; PyTorch's
//! CUDA graphs copy each batch into their static inputs instead.
//!
//! An address is found as an 8-byte word at an 8-byte-aligned offset of a parameter of 8 bytes or more (a
//! pointer argument, or a pointer field of a struct passed by value) that lies inside an input's bytes; a
//! replay moves it to the same offset inside the new buffer. A graph whose inputs something else touches
//! (a copy or a set node on their bytes, a child graph, a host node, a kernel node whose parameters the
//! driver does not describe) is not rebound: `find` gives None and the caller copies into the inputs.

use anyhow::{Result, bail};
use cudarc::driver::sys;
use std::ffi::c_void;

/// One input address inside a kernel node's parameters: the word at `offset` of parameter `param` is
/// input `input`'s address plus `delta`.
struct Patch {
    param: usize,
    offset: usize,
    input: usize,
    delta: u64,
}

/// A kernel node of the graph that reads or writes an input: its parameters as captured, and where the
/// input addresses are in them.
struct Site {
    node: sys::CUgraphNode,
    params: sys::CUDA_KERNEL_NODE_PARAMS,
    values: Vec<Vec<u8>>,
    patches: Vec<Patch>,
}

/// Where a captured graph's kernels take the addresses of its inputs, and the buffers they take now.
pub struct Rebinding {
    sites: Vec<Site>,
    /// The address each input's words point into now (at first, the captured inputs').
    bound: Vec<u64>,
}

impl Rebinding {
    /// The kernel nodes of `graph` (instantiated as `exec`) whose parameters point into `inputs` (each an
    /// address and a length in bytes), or None when the graph touches an input otherwise (see the module's
    /// text). Needs the graph's context current on this thread. Every driver entry point `bind` calls is
    /// called here once (the first site's parameters set to what they are), so that a missing one fails
    /// here, where the caller catches cudarc's panic, and not in `bind`.
    pub fn find(graph: sys::CUgraph, exec: sys::CUgraphExec, inputs: &[(u64, usize)]) -> Result<Option<Rebinding>> {
        let inside = |address: u64| {
            let input = inputs.iter().position(|&(start, bytes)| address.wrapping_sub(start) < bytes as u64)?;
            Some((input, address - inputs[input].0))
        };
        let overlaps = |start: u64, bytes: u64| {
            inputs.iter().any(|&(from, len)| start < from + len as u64 && from < start.saturating_add(bytes))
        };
        let mut sites = Vec::new();
        for node in nodes(graph)? {
            let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: a node of a live graph and a writable enum.
            check("reading a graph node's type", unsafe { sys::cuGraphNodeGetType(node, &mut kind) })?;
            match kind {
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => match kernel_site(node, &inside)? {
                    Some(Some(site)) => sites.push(site),
                    Some(None) => {}
                    None => return Ok(None),
                },
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY => {
                    // Not zeroed: its memory types are enums without a zero.
                    let mut copy = std::mem::MaybeUninit::<sys::CUDA_MEMCPY3D>::uninit();
                    // SAFETY: a memcpy node of a live graph and a writable parameter struct.
                    check("reading a copy node", unsafe { sys::cuGraphMemcpyNodeGetParams(node, copy.as_mut_ptr()) })?;
                    // SAFETY: the driver filled it.
                    let copy = unsafe { copy.assume_init() };
                    let rows = (copy.Height.max(1) * copy.Depth.max(1)) as u64;
                    let span = |x: usize, pitch: usize| x as u64 + copy.WidthInBytes as u64 + rows * pitch as u64;
                    if overlaps(copy.srcDevice, span(copy.srcXInBytes, copy.srcPitch))
                        || overlaps(copy.dstDevice, span(copy.dstXInBytes, copy.dstPitch))
                    {
                        return Ok(None);
                    }
                }
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET => {
                    // SAFETY: all zero bytes are a valid CUDA_MEMSET_NODE_PARAMS, which the driver then fills.
                    let mut set: sys::CUDA_MEMSET_NODE_PARAMS = unsafe { std::mem::zeroed() };
                    // SAFETY: a memset node of a live graph and a writable parameter struct.
                    check("reading a set node", unsafe { sys::cuGraphMemsetNodeGetParams(node, &mut set) })?;
                    let bytes = (set.height.max(1) * set.pitch.max(set.width * set.elementSize as usize)) as u64;
                    if overlaps(set.dst, bytes) {
                        return Ok(None);
                    }
                }
                sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY
                | sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_WAIT_EVENT
                | sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EVENT_RECORD => {}
                _ => return Ok(None),
            }
        }
        let rebinding = Rebinding { sites, bound: inputs.iter().map(|&(address, _)| address).collect() };
        if let Some(site) = rebinding.sites.first() {
            set_params(exec, site, site.values.clone())?;
        }
        Ok(Some(rebinding))
    }

    /// Has the kernels of `exec` (the graph `find` read, instantiated) take input `i`'s words inside
    /// `addresses[i]` from the next launch on. The buffers must be as long as the inputs and live until
    /// the launches that read them are done.
    pub fn bind(&mut self, exec: sys::CUgraphExec, addresses: &[u64]) -> Result<()> {
        if addresses.len() != self.bound.len() {
            bail!("internal: {} addresses for a graph of {} inputs", addresses.len(), self.bound.len());
        }
        if addresses == self.bound {
            return Ok(());
        }
        for site in &self.sites {
            if site.patches.iter().all(|p| addresses[p.input] == self.bound[p.input]) {
                continue;
            }
            let mut values = site.values.clone();
            for patch in &site.patches {
                let word = (addresses[patch.input] + patch.delta).to_ne_bytes();
                values[patch.param][patch.offset..patch.offset + 8].copy_from_slice(&word);
            }
            set_params(exec, site, values)?;
        }
        self.bound = addresses.to_vec();
        Ok(())
    }

    /// How many kernel nodes read or write an input.
    pub fn kernels(&self) -> usize {
        self.sites.len()
    }
}

/// Sets `site`'s node in `exec` to its captured parameters with `values` as the arguments.
fn set_params(exec: sys::CUgraphExec, site: &Site, mut values: Vec<Vec<u8>>) -> Result<()> {
    let mut pointers: Vec<*mut c_void> = values.iter_mut().map(|v| v.as_mut_ptr().cast()).collect();
    let mut params = site.params;
    params.kernelParams = pointers.as_mut_ptr();
    params.extra = std::ptr::null_mut();
    // SAFETY: a node of the graph `exec` was instantiated from, and parameters of the sizes the function
    // declares, alive for the call (the driver copies them).
    check("rebinding a graph's input", unsafe { sys::cuGraphExecKernelNodeSetParams_v2(exec, site.node, &params) })
}

/// The nodes of `graph`.
fn nodes(graph: sys::CUgraph) -> Result<Vec<sys::CUgraphNode>> {
    let mut count = 0usize;
    // SAFETY: a live graph; a null array asks for the count only.
    check("listing a graph's nodes", unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut count) })?;
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: an array of `count` writable handles.
    check("listing a graph's nodes", unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut count) })?;
    nodes.truncate(count);
    Ok(nodes)
}

/// The kernel node `node` as a site when its parameters hold input addresses (`inside` names the input an
/// address falls in and its offset there), Some(None) when they hold none, None when its parameters
/// cannot be read.
fn kernel_site(node: sys::CUgraphNode, inside: &impl Fn(u64) -> Option<(usize, u64)>) -> Result<Option<Option<Site>>> {
    // SAFETY: all zero bytes are a valid CUDA_KERNEL_NODE_PARAMS, which the driver then fills.
    let mut params: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: a kernel node of a live graph and a writable parameter struct.
    check("reading a kernel node", unsafe { sys::cuGraphKernelNodeGetParams_v2(node, &mut params) })?;
    if params.func.is_null() || params.kernelParams.is_null() || !params.extra.is_null() {
        return Ok(None);
    }
    let mut values = Vec::new();
    let mut patches = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: a live function handle and two writable usizes; an index past the last parameter fails.
        let status = unsafe { sys::cuFuncGetParamInfo(params.func, values.len(), &mut offset, &mut size) };
        if status != sys::CUresult::CUDA_SUCCESS {
            break;
        }
        // SAFETY: the node owns one pointer per parameter, each to `size` bytes (as the function declares).
        let bytes = unsafe { std::slice::from_raw_parts(*params.kernelParams.add(values.len()) as *const u8, size) };
        for word in (0..size.saturating_sub(7)).step_by(8) {
            let address = u64::from_ne_bytes(bytes[word..word + 8].try_into().expect("8 bytes"));
            if let Some((input, delta)) = inside(address) {
                patches.push(Patch { param: values.len(), offset: word, input, delta });
            }
        }
        values.push(bytes.to_vec());
    }
    if values.is_empty() {
        return Ok(None);
    }
    Ok(Some((!patches.is_empty()).then_some(Site { node, params, values, patches })))
}

fn check(what: &str, status: sys::CUresult) -> Result<()> {
    if status != sys::CUresult::CUDA_SUCCESS {
        bail!("{what}: {status:?}");
    }
    Ok(())
}
