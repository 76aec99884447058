//! `nn` on the GPU: a [`Device`] (an opened GPU with `fused/nn.cu` loaded once), the [`DeviceBuffer`]
//! a device tensor's elements live in, and the checks that every operand of an op lives in one place.
//!
//! Eager mode: each op on device tensors launches its kernel at once on the GPU's one stream (no
//! synchronisation until a value is read back), and its backward launches the backward kernels. The
//! shapes are kernel arguments, so one compiled module serves every model. Elements are f32; an f64
//! tensor stays on the host (it is the exact reference the f32 kernels are checked against).
//!
//! | file | what |
//! |---|---|
//! | `mod` | `Device`, `DeviceBuffer`, placement, copies, the kernel table |
//! | `ops` | each op's device forward and backward, the twins of the host paths in `nn/*.rs` |
//! | `layers` | the same for `layer_norm`, `embedding`, `dropout` and `scaled_dot_product_attention` |
//! | `optim` | the optimizer step and `clip_grad_norm`, many tensors a launch (tables passed by value) |
//! | `weight_grads` | linear layers' weight gradients, deferred by the backward and launched together |
//! | `table` | the tables those launches take, in their C layout |
//! | `attention` | `causal_self_attention` on packed q, k, v (`fused/nn_attention.cu`, flash in bf16) |
//! | `shape_ops` | the same for `narrow`/`slice` and `cat` |
//! | `conv` | the same for `conv2d` and `max_pool2d` |
//! | `direct_conv` | conv2d's direct kernels: whether a convolution takes them, their bands and launches |
//! | `capture` | `CapturedStep`: a training step recorded once, replayed as one CUDA graph |
//! | `branch` | the backward's second stream: convolutions' weight gradients beside the input gradients |

pub(crate) mod attention;
mod backward_fusion;
mod branch;
pub mod capture;
pub(crate) mod conv;
pub(crate) mod direct_conv;
pub(crate) mod fusion;
pub(crate) mod layers;
pub(crate) mod ops;
pub(crate) mod optim;
pub(crate) mod shape_ops;
pub(crate) mod table;
pub(crate) mod weight_grads;

use super::error::{Error, Result};
use super::tensor::{Storage, Tensor};
use crate::device::precision::Precision;
use crate::device::{Gpu, launch::Arg, launch::Kernel, launch::StructArg};
use crate::ops::THREADS_PER_BLOCK;
use crate::ops::cpu::Real;
use crate::ops::gemm::tile_shared_floats;
use cudarc::driver::CudaSlice;
use std::any::TypeId;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The kernels of `fused/nn.cu`, loaded once per device.
pub(crate) struct Kernels {
    pub(crate) binary: Kernel,
    /// `nn_add_relu`: a sum of one shape and its ReLU (capture-time fusion).
    pub(crate) add_relu: Kernel,
    pub(crate) binary_grad: Kernel,
    pub(crate) scalar: Kernel,
    pub(crate) scalar_grad: Kernel,
    pub(crate) unary: Kernel,
    pub(crate) unary_grad: Kernel,
    pub(crate) gather: Kernel,
    pub(crate) sum_axis: Kernel,
    pub(crate) sum_axis_parts: Kernel,
    pub(crate) sum_slices: Kernel,
    pub(crate) sum_rows: Kernel,
    pub(crate) expand_axis: Kernel,
    pub(crate) softmax_rows: Kernel,
    pub(crate) softmax_rows_grad: Kernel,
    /// `nn_matmul_*`, `nn_linear_*`, `nn_linear_grad_weight_*` and `nn_linear_grad_*`, each at its tile's place in
    /// [`FP32_TILES`].
    pub(crate) matmul: [Kernel; 3],
    pub(crate) linear: [Kernel; 3],
    pub(crate) linear_grad_weight: [Kernel; 3],
    pub(crate) linear_grad: [Kernel; 3],
    /// `nn_linear_grad_weights`: the deferred weight gradients of several layers, a table of them.
    pub(crate) linear_grad_weights: Kernel,
    /// `nn_linear_cross_entropy_{large,small,tiny}`: a linear layer and the cross-entropy of its output
    /// (capture-time fusion), at the tile's place in [`FP32_TILES`].
    pub(crate) linear_cross_entropy: [Kernel; 3],
    pub(crate) to_bf16: Kernel,
    /// `nn_product_bf16_{nn,nt,tn,tt}`, at `2·trans_a + trans_b`.
    pub(crate) product_bf16: [Kernel; 4],
    /// `nn_product_bf16_{relu,sigmoid,tanh,gelu}`, at the activation's UNARY_* code: a linear layer's
    /// product and the activation after it (capture-time fusion).
    pub(crate) product_bf16_act: [Kernel; 4],
    /// `nn_product_bf16_dropout`: a linear layer's product and the dropout after it (capture-time fusion).
    pub(crate) product_bf16_dropout: Kernel,
    /// `nn_product_bf16_{relu,sigmoid,tanh,gelu}_slope`, at the activation's UNARY_* code: a linear
    /// layer's dx times the slope of the activation before it (the backward's fusion).
    pub(crate) product_bf16_slope: [Kernel; 4],
    pub(crate) cross_entropy: Kernel,
    pub(crate) scale_by: Kernel,
    pub(crate) count_steps: Kernel,
    pub(crate) update_tensors: Kernel,
    pub(crate) fill: Kernel,
    pub(crate) layer_norm: Kernel,
    pub(crate) layer_norm_grad: Kernel,
    pub(crate) layer_norm_grad_affine: Kernel,
    pub(crate) embedding: Kernel,
    pub(crate) embedding_grad: Kernel,
    pub(crate) embedding_ids: Kernel,
    pub(crate) embedding_ids_grad: Kernel,
    pub(crate) dropout: Kernel,
    pub(crate) dropout_draw: Kernel,
    pub(crate) dropout_keyed: Kernel,
    pub(crate) take_step: Kernel,
    pub(crate) sum_squares_chunks: Kernel,
    pub(crate) clip_factor: Kernel,
    pub(crate) scale_chunks: Kernel,
    pub(crate) attention: Kernel,
    pub(crate) attention_grad_q: Kernel,
    pub(crate) attention_grad_kv: Kernel,
    pub(crate) copy_run: Kernel,
    pub(crate) pad_run: Kernel,
    pub(crate) im2col: Kernel,
    pub(crate) col2im: Kernel,
    /// `nn_conv2d_{16,32,64}`, `nn_conv2d_grad_input_{…}` and `nn_conv2d_grad_weight_{…}`, at the tile's
    /// place in [`CONV_TILES`].
    pub(crate) conv: [Kernel; 3],
    pub(crate) conv_grad_input: [Kernel; 3],
    pub(crate) conv_grad_weight: [Kernel; 3],
    /// `nn_conv2d_direct` (the forward, and the input gradient with the kernel flipped) and
    /// `nn_conv2d_direct_grad_weight` (direct_conv.rs), and the same on the tensor cores, `nn_conv2d_mma`
    /// and `nn_conv2d_mma_grad_weight`.
    pub(crate) conv_direct: Kernel,
    pub(crate) conv_direct_grad_weight: Kernel,
    pub(crate) conv_mma: Kernel,
    pub(crate) conv_mma_grad_weight: Kernel,
    pub(crate) max_pool: Kernel,
    pub(crate) max_pool_grad: Kernel,
    pub(crate) max_pool_grad_tiled: Kernel,
}

/// A GPU that `nn` tensors can live on: the opened [`Gpu`], `nn`'s kernels on it, and the buffers freed
/// so far, kept for reuse by size (a caching allocator, as PyTorch's: on the one stream, a buffer freed
/// after its last launch is enqueued may serve the next launch at once, and an eager op then makes no
/// driver call but its launch).
pub struct Device {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) kernels: Kernels,
    /// Dynamic shared memory of the fp32 products, bytes, at each tile's place in [`FP32_TILES`].
    pub(crate) gemm_shared: [u32; 3],
    /// Dynamic shared memory of the implicit conv products, bytes, at each tile's place in [`CONV_TILES`].
    pub(crate) conv_shared: [u32; 3],
    /// Dynamic shared memory of `nn_linear_cross_entropy_{tile}`, bytes: its [`logits_tile`]'s (the tiny
    /// tile's: none, [`logit_block_rows`]).
    pub(crate) logits_shared: [u32; 3],
    /// Dynamic shared memory of `nn_product_bf16` (Bf16Tile's), bytes.
    pub(crate) gemm_shared_bf16: u32,
    /// The arrival counters of the kernels whose last block finishes their work ([`Ticket`]), each left
    /// at 0 by its kernel.
    tickets: [CudaSlice<u32>; 2],
    /// The products' precision ([`Device::set_precision`]), as `Precision as u8`.
    precision: std::sync::atomic::AtomicU8,
    free: Arc<Pool>,
    /// While a step is captured, the pool its buffers come from and go back to (`capture`).
    capturing: Mutex<Option<Arc<Pool>>>,
    /// Capture-time fusion's state (`fusion`).
    fusion: Mutex<fusion::Fusion>,
    /// Whether a step is being recorded or fused now (`fusion`): an eager op then skips the state's lock.
    fusing: AtomicBool,
    /// Whether the backward takes an activation's slope in its reader's epilogue (`fusion`; off with
    /// `TEXTNET_FUSION=0`).
    backward_fusion: AtomicBool,
    /// Whether `nn`'s launches ask for programmatic dependent launch (TEXTNET_NN_PDL=1; off by default).
    /// Every kernel of fused/nn.cu and nn_attention.cu begins by waiting for the kernels before it
    /// (begin_after_previous_grid), so each may; but on an H200 (`2026-11-30-h200-53d2008`) the early
    /// blocks cost more than they saved: the ResNet example's step ran at 113k images/s with it and 168k
    /// without, `bench nn`'s captured MLP step took 24.4 µs and 21.9 µs, its residual MLP 70.0 and 71.9 µs.
    programmatic: bool,
    /// Which kernels fp32 convolutions take where the direct ones fit (direct_conv.rs's [`ConvKernels`], as
    /// a u8): the tensor cores' by default, the CUDA cores' with TEXTNET_DIRECT_CONV=fma, the implicit
    /// products with TEXTNET_DIRECT_CONV=0. The checks run all three.
    conv_kernels: std::sync::atomic::AtomicU8,
    /// The activation slope offered to the backward about to run (`backward_fusion`), and how many were
    /// taken.
    slope_offer: Mutex<Option<backward_fusion::SlopeOffer>>,
    slopes_taken: std::sync::atomic::AtomicUsize,
    /// The gradient offered to be added in the backward about to run (`backward_fusion`), and how many
    /// were taken.
    addend_offer: Mutex<Option<backward_fusion::AddendOffer>>,
    addends_taken: std::sync::atomic::AtomicUsize,
    /// Writes into existing buffers so far (refills, in-place updates): a result fused ahead of its reader
    /// is taken only when none came between (`fusion`).
    pub(crate) in_place_writes: std::sync::atomic::AtomicUsize,
    /// The weight gradients the backward deferred, launched before anything else (`weight_grads`).
    pending_weight_grads: Mutex<Vec<weight_grads::WeightGradJob>>,
    /// The backward's second stream (`branch`).
    branch: branch::Branch,
}

/// Freed device memory by capacity (floats).
pub(crate) type Pool = Mutex<HashMap<usize, Vec<CudaSlice<f32>>>>;

fn pop(pool: &Pool, capacity: usize) -> Option<CudaSlice<f32>> {
    pool.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&capacity).and_then(Vec::pop)
}

/// Buffers are allocated in multiples of this many floats (256 bytes), so near sizes share a pool.
const POOL_GRAIN: usize = 64;

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.gpu.describe())
    }
}

/// The kernel module `nn`'s device tensors use (it takes no sizes).
pub fn module_request() -> crate::device::compile::ModuleRequest {
    ("nn", Vec::new())
}

fn driver(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::device(op, format!("the GPU reported {e}"))
}

fn launch_error(op: &'static str) -> impl Fn(anyhow::Error) -> Error {
    move |e| Error::device(op, format!("{e:#}"))
}

impl Device {
    /// Opens GPU `ordinal` (0 is the first) and loads `nn`'s kernels on it.
    pub fn open(ordinal: usize) -> Result<Arc<Device>> {
        let gpu = Gpu::open(ordinal).map_err(|e| Error::device("Device::open", format!("{e:#}")))?;
        Device::on(Arc::new(gpu))
    }

    /// `nn`'s kernels loaded on an opened GPU.
    pub fn on(gpu: Arc<Gpu>) -> Result<Arc<Device>> {
        let load = || -> anyhow::Result<Kernels> {
            let module = gpu.module(&module_request())?;
            let k = |name: &str| Gpu::function(&module, name);
            Ok(Kernels {
                binary: k("nn_binary")?,
                add_relu: k("nn_add_relu")?,
                binary_grad: k("nn_binary_grad")?,
                scalar: k("nn_scalar")?,
                scalar_grad: k("nn_scalar_grad")?,
                unary: k("nn_unary")?,
                unary_grad: k("nn_unary_grad")?,
                gather: k("nn_gather")?,
                sum_axis: k("nn_sum_axis")?,
                sum_axis_parts: k("nn_sum_axis_parts")?,
                sum_slices: k("nn_sum_slices")?,
                sum_rows: k("nn_sum_rows")?,
                expand_axis: k("nn_expand_axis")?,
                softmax_rows: k("nn_softmax_rows")?,
                softmax_rows_grad: k("nn_softmax_rows_grad")?,
                matmul: [k("nn_matmul_large")?, k("nn_matmul_small")?, k("nn_matmul_tiny")?],
                linear: [k("nn_linear_large")?, k("nn_linear_small")?, k("nn_linear_tiny")?],
                linear_grad_weight: [
                    k("nn_linear_grad_weight_large")?,
                    k("nn_linear_grad_weight_small")?,
                    k("nn_linear_grad_weight_tiny")?,
                ],
                linear_grad: [k("nn_linear_grad_large")?, k("nn_linear_grad_small")?, k("nn_linear_grad_tiny")?],
                linear_grad_weights: k("nn_linear_grad_weights")?,
                linear_cross_entropy: [
                    k("nn_linear_cross_entropy_large")?,
                    k("nn_linear_cross_entropy_small")?,
                    k("nn_linear_cross_entropy_tiny")?,
                ],
                to_bf16: k("nn_to_bf16")?,
                product_bf16: [
                    k("nn_product_bf16_nn")?,
                    k("nn_product_bf16_nt")?,
                    k("nn_product_bf16_tn")?,
                    k("nn_product_bf16_tt")?,
                ],
                product_bf16_act: [
                    k("nn_product_bf16_relu")?,
                    k("nn_product_bf16_sigmoid")?,
                    k("nn_product_bf16_tanh")?,
                    k("nn_product_bf16_gelu")?,
                ],
                product_bf16_dropout: k("nn_product_bf16_dropout")?,
                product_bf16_slope: [
                    k("nn_product_bf16_relu_slope")?,
                    k("nn_product_bf16_sigmoid_slope")?,
                    k("nn_product_bf16_tanh_slope")?,
                    k("nn_product_bf16_gelu_slope")?,
                ],
                cross_entropy: k("nn_cross_entropy")?,
                scale_by: k("nn_scale_by")?,
                count_steps: k("nn_count_steps")?,
                update_tensors: k("nn_update_tensors")?,
                fill: k("nn_fill")?,
                layer_norm: k("nn_layer_norm")?,
                layer_norm_grad: k("nn_layer_norm_grad")?,
                layer_norm_grad_affine: k("nn_layer_norm_grad_affine")?,
                embedding: k("nn_embedding")?,
                embedding_grad: k("nn_embedding_grad")?,
                embedding_ids: k("nn_embedding_ids")?,
                embedding_ids_grad: k("nn_embedding_ids_grad")?,
                dropout: k("nn_dropout")?,
                dropout_draw: k("nn_dropout_draw")?,
                dropout_keyed: k("nn_dropout_keyed")?,
                take_step: k("nn_take_step")?,
                sum_squares_chunks: k("nn_sum_squares_chunks")?,
                clip_factor: k("nn_clip_factor")?,
                scale_chunks: k("nn_scale_chunks")?,
                attention: k("nn_attention")?,
                attention_grad_q: k("nn_attention_grad_q")?,
                attention_grad_kv: k("nn_attention_grad_kv")?,
                copy_run: k("nn_copy_run")?,
                pad_run: k("nn_pad_run")?,
                im2col: k("nn_im2col")?,
                col2im: k("nn_col2im")?,
                conv: [k("nn_conv2d_16")?, k("nn_conv2d_32")?, k("nn_conv2d_64")?],
                conv_grad_input: [
                    k("nn_conv2d_grad_input_16")?,
                    k("nn_conv2d_grad_input_32")?,
                    k("nn_conv2d_grad_input_64")?,
                ],
                conv_grad_weight: [
                    k("nn_conv2d_grad_weight_16")?,
                    k("nn_conv2d_grad_weight_32")?,
                    k("nn_conv2d_grad_weight_64")?,
                ],
                conv_direct: k("nn_conv2d_direct")?,
                conv_direct_grad_weight: k("nn_conv2d_direct_grad_weight")?,
                conv_mma: k("nn_conv2d_mma")?,
                conv_mma_grad_weight: k("nn_conv2d_mma_grad_weight")?,
                max_pool: k("nn_max_pool")?,
                max_pool_grad: k("nn_max_pool_grad")?,
                max_pool_grad_tiled: k("nn_max_pool_grad_tiled")?,
            })
        };
        let kernels = load().map_err(launch_error("Device::open"))?;
        let shared_bytes = |(bm, bn, bk, tm, tn)| (tile_shared_floats(bm, bn, bk, tm, tn) * 4) as u32;
        let gemm_shared = FP32_TILES.map(shared_bytes);
        let conv_shared = CONV_TILES.map(shared_bytes);
        // The tiny tile's loss kernel forms its logits without staging them (`logit_block_rows`).
        let logits_shared =
            std::array::from_fn(|t| if t == TINY_TILE { 0 } else { shared_bytes(logits_tile(FP32_TILES[t])) });
        let zeroed = || gpu.stream.alloc_zeros::<u32>(1).map_err(driver("Device::open"));
        let tickets = [zeroed()?, zeroed()?];
        let gemm_shared_bf16 =
            (crate::ops::gemm::bf16_tile_shared_floats(crate::device::compile::has_wgmma(gpu.compute_capability)) * 4)
                as u32;
        let fused_products =
            kernels.product_bf16_act.iter().chain([&kernels.product_bf16_dropout]).chain(&kernels.product_bf16_slope);
        for kernel in kernels.product_bf16.iter().chain(fused_products) {
            gpu.reserve_shared(kernel, gemm_shared_bf16 as usize, "nothing: the bf16 tile")
                .map_err(launch_error("Device::open"))?;
        }
        let branch = branch::Branch::beside(&gpu.stream)?;
        Ok(Arc::new(Device {
            gpu,
            kernels,
            gemm_shared,
            conv_shared,
            logits_shared,
            gemm_shared_bf16,
            tickets,
            precision: std::sync::atomic::AtomicU8::new(Precision::Fp32 as u8),
            fusion: Mutex::default(),
            fusing: AtomicBool::new(false),
            backward_fusion: AtomicBool::new(std::env::var_os("TEXTNET_FUSION").is_none_or(|v| v != "0")),
            programmatic: std::env::var_os("TEXTNET_NN_PDL").is_some_and(|v| v == "1"),
            conv_kernels: std::sync::atomic::AtomicU8::new(direct_conv::ConvKernels::from_env() as u8),
            slope_offer: Mutex::default(),
            slopes_taken: Default::default(),
            addend_offer: Mutex::default(),
            addends_taken: Default::default(),
            in_place_writes: Default::default(),
            pending_weight_grads: Mutex::default(),
            branch,
            free: Arc::default(),
            capturing: Mutex::default(),
        }))
    }

    /// How the products multiply on this device from now on:
    /// - `Fp32` (the default): `matmul` and `linear` on the CUDA cores, the convolutions' direct kernels on
    ///   the tensor cores in 3xTF32 (fp32's accuracy);
    /// - `Tf32`: the convolutions' direct kernels in one TF32 product (operands truncated to a 10-bit
    ///   mantissa, fp32 sums), as PyTorch's convolutions by default (`torch.backends.cudnn.allow_tf32`);
    ///   `matmul` and `linear` stay fp32, as PyTorch's by default;
    /// - `Bf16`: `matmul`, `linear` and the convolutions on the bf16 tensor cores, operands rounded to bf16
    ///   and summed in fp32, as PyTorch's bf16 autocast.
    ///
    /// One setting for the whole device, as `torch.set_float32_matmul_precision`. Tensors, LayerNorm,
    /// softmax, losses and the optimizer stay fp32.
    pub fn set_precision(&self, precision: Precision) -> Result<()> {
        self.precision.store(precision as u8, Ordering::Relaxed);
        Ok(())
    }

    /// The products' precision ([`Device::set_precision`]).
    pub fn precision(&self) -> Precision {
        match self.precision.load(Ordering::Relaxed) {
            p if p == Precision::Bf16 as u8 => Precision::Bf16,
            p if p == Precision::Tf32 as u8 => Precision::Tf32,
            _ => Precision::Fp32,
        }
    }

    /// Whether products run on the bf16 tensor cores now.
    pub(crate) fn bf16_products(&self) -> bool {
        self.precision() == Precision::Bf16
    }

    /// The GPU in words.
    pub fn describe(&self) -> String {
        self.gpu.describe()
    }

    /// Waits until every launch so far has finished (a timing's end; reading a value back waits anyway).
    pub fn synchronize(&self) -> Result<()> {
        self.launch_pending()?;
        self.join_branch()?;
        self.gpu.stream.synchronize().map_err(driver("synchronize"))
    }

    /// A buffer of `n` floats whose contents the caller overwrites before reading: a freed one of its
    /// size, or a new one (after returning every cached buffer to the driver, if the first try fails).
    pub(crate) fn alloc(self: &Arc<Self>, op: &'static str, n: usize) -> Result<DeviceBuffer> {
        let capacity = n.max(1).div_ceil(POOL_GRAIN) * POOL_GRAIN;
        let capturing = self.capturing.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(pool) = capturing {
            // A captured step's buffers come from the memory the step used before and stay the step's:
            // a new allocation would be a node of the graph, and the graph replays at fixed addresses.
            let Some(slice) = pop(&pool, capacity).or_else(|| pop(&self.free, capacity)) else {
                return Err(Error::device(op, "the captured step asked for memory its eager run did not use"));
            };
            let buffer = DeviceBuffer {
                block: Arc::new(Block { slice: Some(slice), home: pool, fused: Mutex::default() }),
                len: n,
                device: Arc::clone(self),
            };
            self.allocated(&buffer);
            return Ok(buffer);
        }
        let slice = match pop(&self.free, capacity) {
            Some(slice) => slice,
            // SAFETY (both allocations): every caller writes all n elements before any read.
            None => match unsafe { self.gpu.stream.alloc::<f32>(capacity) } {
                Ok(slice) => slice,
                Err(_) => {
                    self.free.lock().unwrap_or_else(|p| p.into_inner()).clear();
                    // SAFETY: as above.
                    unsafe { self.gpu.stream.alloc::<f32>(capacity) }.map_err(driver(op))?
                }
            },
        };
        let block = Block { slice: Some(slice), home: Arc::clone(&self.free), fused: Mutex::default() };
        let buffer = DeviceBuffer { block: Arc::new(block), len: n, device: Arc::clone(self) };
        self.allocated(&buffer);
        Ok(buffer)
    }

    /// A buffer holding `values`.
    pub(crate) fn upload(self: &Arc<Self>, op: &'static str, values: &[f32]) -> Result<DeviceBuffer> {
        let mut buffer = self.alloc(op, values.len())?;
        buffer.overwrite(op, values)?;
        Ok(buffer)
    }

    /// Integers for a kernel (embedding ids), as a device buffer.
    pub(crate) fn upload_i32(&self, op: &'static str, values: &[i32]) -> Result<CudaSlice<i32>> {
        self.refuse_copy_while_capturing(op)?;
        let values = if values.is_empty() { &[0][..] } else { values };
        self.gpu.stream.clone_htod(values).map_err(driver(op))
    }

    /// Launches `kernel` over `blocks` blocks of 256 threads with `shared` bytes of dynamic shared memory.
    pub(crate) fn launch(
        &self,
        op: &'static str,
        kernel: &Kernel,
        blocks: (u32, u32),
        shared: u32,
        args: &[Arg],
    ) -> Result<()> {
        // The weight gradients the backward deferred read what was written before this launch, and run
        // beside it.
        self.launch_pending_beside()?;
        self.branch_failure(op)?;
        let stream = self.stream_now();
        self.gpu
            .launch_on(stream, kernel, blocks, THREADS_PER_BLOCK, shared, self.programmatic, args)
            .map_err(launch_error(op))
    }

    /// `launch` of a kernel whose first parameter is `table`, a struct passed by value, then `args`.
    pub(crate) fn launch_struct(
        &self,
        op: &'static str,
        kernel: &Kernel,
        (blocks, shared): ((u32, u32), u32),
        table: &StructArg,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_struct_sized(op, kernel, (blocks, THREADS_PER_BLOCK, shared), table, args)
    }

    /// `launch_struct` with blocks of `threads` threads (at most 256, a multiple of 32), for a kernel that
    /// strides its loops by the block's size.
    pub(crate) fn launch_struct_sized(
        &self,
        op: &'static str,
        kernel: &Kernel,
        (blocks, threads, shared): ((u32, u32), u32, u32),
        table: &StructArg,
        args: &[Arg],
    ) -> Result<()> {
        self.launch_pending_beside()?;
        self.branch_failure(op)?;
        let shape = (blocks, threads, shared, self.programmatic);
        self.gpu.launch_on_with_struct(self.stream_now(), kernel, shape, Some(table), args).map_err(launch_error(op))
    }

    /// Blocks for a grid-stride loop over `n` elements: enough to fill the GPU, no more than `n` needs.
    pub(crate) fn blocks_for(&self, n: usize) -> (u32, u32) {
        let needed = n.div_ceil(THREADS_PER_BLOCK as usize).max(1);
        (needed.min(self.gpu.sm_count as usize * 8) as u32, 1)
    }

    /// Whether a step is being captured on this device now.
    pub(crate) fn is_capturing(&self) -> bool {
        self.capturing.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// An error while a step is captured: a copy between the host and the GPU would be recorded with
    /// this moment's host values (the replays would not see new ones), or wait on a graph not yet run.
    fn refuse_copy_while_capturing(&self, op: &'static str) -> Result<()> {
        if self.is_capturing() {
            let problem = "copies between the host and the GPU cannot be part of a captured step: give its inputs as \
                           device tensors (cross_entropy_ids for targets) and read values after run()";
            return Err(Error::device(op, problem));
        }
        Ok(())
    }

    /// The address of a buffer, for a kernel argument.
    pub(crate) fn arg(&self, buffer: &DeviceBuffer) -> Arg {
        Arg::buf(&self.gpu, buffer.slice())
    }

    /// The address of `ticket`'s arrival counter, for a kernel argument.
    pub(crate) fn ticket(&self, ticket: Ticket) -> Arg {
        Arg::buf(&self.gpu, &self.tickets[ticket as usize])
    }
}

/// The tiles of the fp32 products (`TileLarge`, `TileSmall` and `TileTiny` in fused/nn.cu), as (rows,
/// columns, depth staged, rows a thread, columns a thread): 64 × 64 outputs, 16 deep, 4 × 4 a thread;
/// 16 × 16, 64 deep, 2 × 2 a thread (k split four ways in the block); 8 × 8, 256 deep (k split sixteen ways).
pub(crate) const FP32_TILES: [(usize, usize, usize, usize, usize); 3] =
    [(64, 64, 16, 4, 4), (16, 16, 64, 2, 2), (8, 8, 256, 2, 2)];
/// The smallest tile's place in [`FP32_TILES`], the last.
pub(crate) const TINY_TILE: usize = FP32_TILES.len() - 1;

/// The tiles of the implicit conv products (`ConvTile16`, `ConvTile32` and `TileLarge` in fused/nn.cu), as
/// [`FP32_TILES`]'s: 16, 32 and 64 rows (channels), 4 × 4 outputs a thread. A product takes the first whose
/// rows cover its channels, else the last.
pub(crate) const CONV_TILES: [(usize, usize, usize, usize, usize); 3] =
    [(16, 256, 8, 4, 4), (32, 128, 8, 4, 4), FP32_TILES[0]];

/// The tile `nn_linear_cross_entropy` forms its logits with, for the fp32 tile `tile` (fused/nn.cu's
/// LogitsTile): 16 columns where the tile is narrower, the columns a thread widened with them, so that the
/// block's threads split k as the tile's do.
pub(crate) const fn logits_tile(tile: (usize, usize, usize, usize, usize)) -> (usize, usize, usize, usize, usize) {
    let (bm, bn, bk, tm, tn) = tile;
    if bn < 16 { (bm, 16, bk, tm, tn * (16 / bn)) } else { tile }
}

/// The rows a block of `nn_linear_cross_entropy_{tile}` takes, for the fp32 tile at `tile` in [`FP32_TILES`]:
/// the tile's, but the tiny tile's blocks take 2 (fused/nn.cu's LOGIT_ROWS), each group of the tile's k split
/// summed by threads of its own, so that a small batch's head takes many SMs.
pub(crate) const fn logit_block_rows(tile: usize) -> usize {
    if tile == TINY_TILE { 2 } else { FP32_TILES[tile].0 }
}

/// The kernels that count their blocks' arrivals, each in a counter of its own.
#[derive(Clone, Copy)]
pub(crate) enum Ticket {
    /// `nn_cross_entropy`: its last block takes the mean.
    CrossEntropy,
    /// `nn_update_tensors`: its last block advances the step counts.
    Update,
}

/// Device memory that goes back to its pool (the device's, or a captured step's) when the last buffer
/// sharing it is dropped.
struct Block {
    slice: Option<CudaSlice<f32>>,
    home: Arc<Pool>,
    /// Capture-time fusion's marks and results (`fusion`).
    fused: Mutex<fusion::Fused>,
}

impl Block {
    fn fused(&self) -> std::sync::MutexGuard<'_, fusion::Fused> {
        self.fused.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Some(slice) = self.slice.take() {
            let mut free = self.home.lock().unwrap_or_else(|p| p.into_inner());
            free.entry(slice.len()).or_default().push(slice);
        }
    }
}

/// A buffer held without keeping it alive or counting as sharing it: a parameter that capture-time fusion
/// will read must stay unshared, so that the optimizer keeps updating it in place.
#[derive(Clone)]
pub(crate) struct WeakBuffer {
    block: std::sync::Weak<Block>,
    len: usize,
}

impl WeakBuffer {
    /// The buffer, while something else keeps it alive.
    pub(crate) fn upgrade(&self, device: &Arc<Device>) -> Option<DeviceBuffer> {
        Some(DeviceBuffer { block: self.block.upgrade()?, len: self.len, device: Arc::clone(device) })
    }

    /// Whether `buffer` holds the same elements.
    pub(crate) fn is(&self, buffer: &DeviceBuffer) -> bool {
        std::ptr::eq(self.block.as_ptr(), Arc::as_ptr(&buffer.block))
    }
}

/// The elements of a device tensor: f32 on one [`Device`]. Cloning shares them.
#[derive(Clone)]
pub struct DeviceBuffer {
    block: Arc<Block>,
    pub(crate) len: usize,
    pub(crate) device: Arc<Device>,
}

impl DeviceBuffer {
    /// The device memory (its capacity may exceed `len`), for a use by the stream launches go to now:
    /// after the branch that made it, if one did (`branch`).
    fn slice(&self) -> &CudaSlice<f32> {
        self.device.settle(self);
        self.block.slice.as_ref().expect("a live block holds its memory")
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the elements live on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// A copy of the elements in host memory (waits for the launches that write them).
    pub fn to_host(&self, op: &'static str) -> Result<Vec<f32>> {
        if self.len == 0 {
            return Ok(Vec::new());
        }
        self.device.refuse_copy_while_capturing(op)?;
        self.device.launch_pending()?;
        self.device.gpu.stream.clone_dtoh(&self.slice().slice(..self.len)).map_err(driver(op))
    }

    /// Writes `values` (as many as it holds) into these elements in place; they must not be shared.
    pub(crate) fn overwrite(&mut self, op: &'static str, values: &[f32]) -> Result<()> {
        if values.len() != self.len {
            return Err(Error::device(op, format!("{} values for a buffer of {}", values.len(), self.len)));
        }
        self.device.refuse_copy_while_capturing(op)?;
        let device = Arc::clone(&self.device);
        device.launch_pending()?;
        device.join_branch()?;
        device.in_place_writes.fetch_add(1, Ordering::Relaxed);
        let Some(block) = Arc::get_mut(&mut self.block) else {
            return Err(Error::device(op, "the elements are shared, so they cannot change in place"));
        };
        let slice = block.slice.as_mut().expect("a live block holds its memory");
        if !values.is_empty() {
            device.gpu.stream.memcpy_htod(values, &mut slice.slice_mut(..values.len())).map_err(driver(op))?;
        }
        Ok(())
    }

    /// The device address of the elements (a captured step's inputs must keep theirs).
    pub(crate) fn address(&self) -> u64 {
        use cudarc::driver::DevicePtr;
        self.slice().device_ptr(&self.device.gpu.stream).0
    }

    /// Whether no other buffer shares these elements (a write to them is seen by this buffer alone).
    pub(crate) fn is_unshared(&self) -> bool {
        self.device.release(self);
        Arc::strong_count(&self.block) == 1
    }

    /// Whether `other` holds these very elements.
    pub(crate) fn same_elements(&self, other: &DeviceBuffer) -> bool {
        Arc::ptr_eq(&self.block, &other.block)
    }

    /// What identifies these elements (not their address, which a freed buffer's successor may take)
    /// while they live.
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.block) as usize
    }

    /// A handle that neither keeps these elements alive nor shares them (`WeakBuffer`).
    pub(crate) fn downgrade(&self) -> WeakBuffer {
        WeakBuffer { block: Arc::downgrade(&self.block), len: self.len }
    }

    /// Writes `source`'s elements (as many as this holds, on the same device) into these, in place, in
    /// stream order: no trip through the host. They must not be shared.
    pub(crate) fn overwrite_from(&mut self, op: &'static str, source: &DeviceBuffer) -> Result<()> {
        if source.len != self.len || !Arc::ptr_eq(&source.device, &self.device) {
            return Err(Error::device(op, "the source is not a buffer of as many elements on this GPU"));
        }
        let device = Arc::clone(&self.device);
        device.launch_pending()?;
        device.join_branch()?;
        device.in_place_writes.fetch_add(1, Ordering::Relaxed);
        let Some(block) = Arc::get_mut(&mut self.block) else {
            return Err(Error::device(op, "the elements are shared, so they cannot change in place"));
        };
        let target = block.slice.as_mut().expect("a live block holds its memory");
        if self.len > 0 {
            let from = source.slice().slice(..self.len);
            device.gpu.stream.memcpy_dtod(&from, &mut target.slice_mut(..self.len)).map_err(driver(op))?;
        }
        Ok(())
    }

    /// A copy of the elements in a new buffer on the same device.
    pub(crate) fn duplicate(&self, op: &'static str) -> Result<DeviceBuffer> {
        self.device.launch_pending()?;
        let mut copy = self.device.alloc(op, self.len)?;
        let block = Arc::get_mut(&mut copy.block).expect("a new buffer is not shared");
        let target = block.slice.as_mut().expect("a live block holds its memory");
        self.device.gpu.stream.memcpy_dtod(self.slice(), target).map_err(driver(op))?;
        Ok(copy)
    }

    /// self + other, elementwise, in a new buffer (gradients meeting at one tensor): one launch of
    /// `nn_binary`, whose sum has the bits of a copy of self plus other.
    pub(crate) fn plus(&self, other: &DeviceBuffer) -> Result<DeviceBuffer> {
        const NAME: &str = "backward";
        let n = ops::int(NAME, self.len)?;
        ops::launch_binary(&self.device, NAME, ops::OP_ADD, (self, other), self.len, ([1, 1, 1, n], [[0, 0, 0, 1]; 2]))
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer({} floats on {})", self.len, self.device.gpu.describe())
    }
}

impl PartialEq for DeviceBuffer {
    /// The same elements (shared), not equal values: comparing values would need a copy back.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.block, &other.block)
    }
}

/// Where an op's operands live: all on the host, or all on one device.
pub(crate) enum Place {
    Host,
    Device(Arc<Device>),
}

/// The one place all of `tensors` live, or an error naming `op` when they live in two.
pub(crate) fn place_of<F: Real>(op: &'static str, tensors: &[&Tensor<F>]) -> Result<Place> {
    let mut place: Option<Arc<Device>> = None;
    let mut host = false;
    for tensor in tensors {
        match &*tensor.storage() {
            Storage::Host(_) => host = true,
            Storage::Device(buffer) => match &place {
                Some(device) if !Arc::ptr_eq(device, &buffer.device) => {
                    return Err(Error::device(op, "the tensors live on two different GPUs"));
                }
                _ => place = Some(Arc::clone(&buffer.device)),
            },
        }
    }
    match (place, host) {
        (None, _) => Ok(Place::Host),
        (Some(_), true) => {
            let shapes: Vec<String> = tensors
                .iter()
                .map(|t| format!("{:?} on the {}", t.shape(), if t.is_on_device() { "GPU" } else { "host" }))
                .collect();
            let problem =
                format!("the tensors live in two places ({}): move them to one with to_device", shapes.join(", "));
            Err(Error::device(op, problem))
        }
        (Some(device), false) => {
            if TypeId::of::<F>() != TypeId::of::<f32>() {
                return Err(Error::device(op, "device tensors hold f32 only"));
            }
            Ok(Place::Device(device))
        }
    }
}

/// `values` in F (f32 to f32 is the identity).
pub(crate) fn from_f32<F: Real>(values: Vec<f32>) -> Vec<F> {
    values.into_iter().map(|v| F::from(v).unwrap_or_else(F::nan)).collect()
}

/// `values` as f32, for an upload.
pub(crate) fn to_f32<F: Real>(values: &[F]) -> Vec<f32> {
    values.iter().map(|v| v.to_f32().unwrap_or(f32::NAN)).collect()
}

#[cfg(test)]
mod tests {
    use super::{CONV_TILES, FP32_TILES, THREADS_PER_BLOCK, logits_tile};

    /// The sizes of each `MatTile` named in `names`, as fused/nn.cu declares them.
    fn declared_tiles(names: &[&str]) -> Vec<Vec<usize>> {
        let file = include_str!("../../../fused/nn.cu");
        names
            .iter()
            .map(|name| {
                let declaration = format!("using {name} = MatTile<");
                let at = file.find(&declaration).unwrap_or_else(|| panic!("{name} not declared")) + declaration.len();
                let sizes = &file[at..at + file[at..].find('>').unwrap()];
                sizes.split(',').map(|v| v.trim().parse().unwrap()).collect()
            })
            .collect()
    }

    #[test]
    fn the_fp32_tiles_are_the_kernel_files() {
        let ours: Vec<Vec<usize>> = FP32_TILES.iter().map(|&(a, b, c, d, e)| vec![a, b, c, d, e]).collect();
        assert_eq!(declared_tiles(&["TileLarge", "TileSmall", "TileTiny"]), ours);
        let ours: Vec<Vec<usize>> = CONV_TILES.iter().map(|&(a, b, c, d, e)| vec![a, b, c, d, e]).collect();
        assert_eq!(declared_tiles(&["ConvTile16", "ConvTile32", "TileLarge"]), ours);
        let file = include_str!("../../../fused/nn.cu");
        for (suffix, tile) in [("16", "ConvTile16"), ("32", "ConvTile32"), ("64", "TileLarge")] {
            assert!(file.contains(&format!("NN_CONV_PRODUCTS({suffix}, {tile})")), "{suffix}: {tile}");
        }
    }

    #[test]
    fn the_logits_tiles_split_k_as_their_fp32_tiles() {
        let file = include_str!("../../../fused/nn.cu");
        let declaration = "using LogitsTile = MatTile<T::BM, (T::BN < 16 ? 16 : T::BN), T::BK, T::TM, T::TN * (T::BN < 16 ? 16 / T::BN : 1)>;";
        assert!(file.contains(declaration), "fused/nn.cu's LogitsTile is not the one logits_tile mirrors");
        let ksplit = |(bm, bn, _, tm, tn): (usize, usize, usize, usize, usize)| {
            THREADS_PER_BLOCK as usize / ((bm / tm) * (bn / tn))
        };
        for tile in FP32_TILES {
            let widened = logits_tile(tile);
            assert!(widened.1 >= 16 && widened.1.is_multiple_of(tile.1), "{tile:?} → {widened:?}");
            assert_eq!((widened.0, widened.2, widened.3), (tile.0, tile.2, tile.3));
            assert_eq!(ksplit(widened), ksplit(tile), "{tile:?} → {widened:?}");
        }
    }
}
