//! The launch layer of fused/matmul.cu (grids and shared memory as its header gives them) and of cuBLAS.

use crate::device::{self, Arg, Gpu, ModuleRequest, THREADS_PER_BLOCK, quietly};
use crate::ops::gemm::{G128, G128_STAGED_FLOATS};
use anyhow::{Context, Result, anyhow, bail};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use cudarc::driver::CudaSlice;
use std::sync::Arc;

/// matmul_tile64's gemm_tile sizes: BM = BN, BK, TM = TN.
const TILE64: (usize, usize, usize) = (64, 16, 4);

/// The kernels of fused/matmul.cu.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `matmul_naive`: one thread per element of C.
    Naive,
    /// `matmul_tile128`: 128×128 tiles of C per block.
    Tile128,
    /// `matmul_tile64`: 64×64 tiles, four times the blocks of Tile128.
    Tile64,
    /// `matmul_tile128_split2`: 128×128 tiles with K split over two blocks, added with atomics.
    Tile128Split2,
}

impl Kernel {
    /// Every kernel, in the order the bench lists them.
    pub const ALL: [Kernel; 4] = [Kernel::Naive, Kernel::Tile128, Kernel::Tile64, Kernel::Tile128Split2];

    /// The kernel's function name in fused/matmul.cu.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Naive => "matmul_naive",
            Kernel::Tile128 => "matmul_tile128",
            Kernel::Tile64 => "matmul_tile64",
            Kernel::Tile128Split2 => "matmul_tile128_split2",
        }
    }

    /// Blocks (x over N, y over M) and dynamic shared bytes for an M×N result.
    fn layout(self, m: usize, n: usize) -> ((usize, usize), usize) {
        let f = std::mem::size_of::<f32>();
        match self {
            Kernel::Naive => ((n.div_ceil(THREADS_PER_BLOCK as usize), m), 0),
            Kernel::Tile128 => ((n.div_ceil(G128), m.div_ceil(G128)), 2 * G128_STAGED_FLOATS * f),
            Kernel::Tile128Split2 => ((2 * n.div_ceil(G128), m.div_ceil(G128)), 2 * G128_STAGED_FLOATS * f),
            Kernel::Tile64 => {
                let (b, bk, t) = TILE64;
                let shared = crate::ops::gemm::tile_shared_floats(b, b, bk, t, t) * f;
                ((n.div_ceil(b), m.div_ceil(b)), shared)
            }
        }
    }
}

/// The kernel module (`fused/matmul.cu` takes no sizes).
pub const MODULE: ModuleRequest = ("matmul", Vec::new());

/// The compiled kernels.
pub struct GpuMatmul {
    gpu: Arc<Gpu>,
    functions: Vec<device::Kernel>,
}

impl GpuMatmul {
    /// Loads fused/matmul.cu on `gpu` and looks up its kernels.
    pub fn new(gpu: Arc<Gpu>) -> Result<GpuMatmul> {
        let module = gpu.module(&MODULE)?;
        let functions = Kernel::ALL.iter().map(|k| Gpu::function(&module, k.name())).collect::<Result<_>>()?;
        Ok(GpuMatmul { gpu, functions })
    }

    /// Queues C = A·B (row-major A M×K, B K×N, C M×N) by `kernel`.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &self,
        kernel: Kernel,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        check_shape(a, b, c, m, n, k)?;
        let ((bx, by), shared) = kernel.layout(m, n);
        if by > 65_535 {
            bail!("{} cannot launch {by} block rows (at most 65535)", kernel.name());
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        let gpu = &self.gpu;
        if kernel == Kernel::Tile128Split2 {
            gpu.stream.memset_zeros(c).context("clearing C")?;
        }
        let args = [
            Arg::buf(gpu, a),
            Arg::buf(gpu, b),
            Arg::buf(gpu, c),
            Arg::i32(m as i32),
            Arg::i32(n as i32),
            Arg::i32(k as i32),
        ];
        let function = &self.functions[kernel as usize];
        gpu.launch(function, (bx as u32, by as u32), shared as u32, false, &args)
    }
}

fn check_shape(a: &CudaSlice<f32>, b: &CudaSlice<f32>, c: &CudaSlice<f32>, m: usize, n: usize, k: usize) -> Result<()> {
    if a.len() != m * k || b.len() != k * n || c.len() != m * n {
        bail!("buffers of {}, {} and {} floats are not {m}×{k}, {k}×{n} and {m}×{n}", a.len(), b.len(), c.len());
    }
    if [m, n, k].into_iter().any(|d| d > i32::MAX as usize) {
        bail!("{m}×{k}·{k}×{n} has a side past i32");
    }
    Ok(())
}

/// cuBLAS on the GPU's stream.
pub struct Cublas {
    blas: CudaBlas,
}

impl Cublas {
    /// A cuBLAS handle, or an error saying why there is none (libcublas missing or unusable).
    pub fn new(gpu: &Gpu) -> Result<Cublas> {
        // SAFETY: only tries dlopen on cudarc's candidate library names.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            bail!("libcublas could not be loaded");
        }
        let blas = quietly("cuBLAS", || {
            CudaBlas::new(gpu.stream.clone()).map_err(|e| anyhow!("cannot create a handle: {e}"))
        })?;
        Ok(Cublas { blas })
    }

    /// Queues C = A·B (row-major, as `GpuMatmul::enqueue`) by sgemm: column-major, that is Cᵀ = Bᵀ·Aᵀ.
    pub fn enqueue(
        &self,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        check_shape(a, b, c, m, n, k)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let (m, n, k) = (m as i32, n as i32, k as i32);
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: n,
            n: m,
            k,
            alpha: 1.0f32,
            lda: n,
            ldb: k.max(1),
            beta: 0.0f32,
            ldc: n,
        };
        // SAFETY: the buffers hold the sizes check_shape confirmed, so sgemm stays inside them.
        unsafe { self.blas.gemm(cfg, b, a, c) }.context("cuBLAS sgemm")
    }
}
