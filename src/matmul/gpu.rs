//! The launch layer of fused/matmul.cu (grids and shared memory as its header gives them) and of cuBLAS.

use crate::device::tma::{TMA_THREADS, TmaOperand, TmaTile, tma_operands};
use crate::device::{self, Gpu, compile::ModuleRequest, compile::has_wgmma, launch::Arg, quietly};
use crate::ops::THREADS_PER_BLOCK;
use crate::ops::gemm::Strided;
use crate::ops::gemm::{G128, G128_STAGED_FLOATS, bf16_async_shared_floats, bf16_shared_floats, wgmma_shared_floats};
use anyhow::{Context, Result, anyhow, bail};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys, sys::cublasOperation_t};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
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

/// The bf16 kernels of fused/matmul.cu that read bf16 operands (bits in u16): row-major A M×K, B K×N.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// `matmul_bf16`: gemm_tile_bf16 through functors, 128×128 tiles.
    Tile,
    /// `matmul_bf16_async`: gemm_tile_bf16_async, 128×128 tiles fed by cp.async.
    Async,
    /// `matmul_bf16_wgmma`: gemm_tile_bf16_wgmma, 128×128 tiles on Hopper's `wgmma` (sm_90a only).
    Wgmma,
    /// `matmul_bf16_tma_*`: gemm_bf16_tma, TMA copies and `wgmma` in a producer/consumer pipeline over
    /// persistent blocks, the tile picked per shape (`TmaTile::choose`; sm_90a only, N and K multiples of 8).
    Tma,
}

/// The side of the bf16 kernels' square tiles, and matmul_bf16's k per chunk.
const BF16_TILE: (usize, usize) = (128, 32);
/// `matmul_bf16_async`'s chunks in flight (`ASYNC_STAGES`) and k per chunk (`ASYNC_BK`).
pub const ASYNC_STAGES: usize = 3;
/// See `ASYNC_STAGES`.
pub const ASYNC_BK: usize = 64;
/// `matmul_bf16_wgmma`'s chunks (`WGMMA_STAGES`).
pub const WGMMA_STAGES: usize = 3;

impl Bf16Kernel {
    /// All, in the order the bench lists them.
    pub const ALL: [Bf16Kernel; 4] = [Bf16Kernel::Tile, Bf16Kernel::Async, Bf16Kernel::Wgmma, Bf16Kernel::Tma];
    /// Those of one 128×128 tile per block of 256 threads, launched alike.
    const FIXED_TILE: [Bf16Kernel; 3] = [Bf16Kernel::Tile, Bf16Kernel::Async, Bf16Kernel::Wgmma];

    /// Whether the kernel runs on `gpu` (`matmul_bf16_wgmma` and `matmul_bf16_tma_*` need `wgmma`).
    pub fn runs_on(self, gpu: &Gpu) -> bool {
        !matches!(self, Bf16Kernel::Wgmma | Bf16Kernel::Tma) || has_wgmma(gpu.compute_capability)
    }

    /// Whether the kernel takes an M×K · K×N product: any, but `matmul_bf16_tma_*` only N and K multiples
    /// of 8 (its operands' rows whole 16-byte units, as TMA copies them).
    pub fn takes(self, _m: usize, n: usize, k: usize) -> bool {
        self != Bf16Kernel::Tma || (n.is_multiple_of(8) && k.is_multiple_of(8))
    }

    /// The kernel's function name in fused/matmul.cu.
    pub fn name(self) -> &'static str {
        match self {
            Bf16Kernel::Tile => "matmul_bf16",
            Bf16Kernel::Async => "matmul_bf16_async",
            Bf16Kernel::Wgmma => "matmul_bf16_wgmma",
            Bf16Kernel::Tma => "matmul_bf16_tma",
        }
    }

    /// Dynamic shared bytes: two chunk buffers, ASYNC_STAGES or WGMMA_STAGES (`matmul_bf16_tma_*`: its
    /// tile's, `TmaTile::shared_bytes`).
    fn shared_bytes(self) -> usize {
        let side = BF16_TILE.0;
        let floats = match self {
            Bf16Kernel::Tile => bf16_shared_floats(side, side, BF16_TILE.1),
            Bf16Kernel::Async => bf16_async_shared_floats(side, side, ASYNC_BK, ASYNC_STAGES),
            Bf16Kernel::Wgmma => wgmma_shared_floats(WGMMA_STAGES),
            Bf16Kernel::Tma => 0,
        };
        floats * std::mem::size_of::<f32>()
    }
}

/// gemm_tile_bf16 on fp32 operands in one layout, with square tiles of `side` (128 or 64) and k chunks of
/// 32: `gemm_bf16_{nn,nt,tn,tt}_{side}` (A M×K, or K×M with `a_trans`; B K×N, or N×K with `b_trans`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bf16Tile {
    /// A is stored K×M.
    pub a_trans: bool,
    /// B is stored N×K.
    pub b_trans: bool,
    /// The tile's side.
    pub side: usize,
}

impl Bf16Tile {
    /// The tile sides compiled.
    pub const SIDES: [usize; 2] = [128, 64];

    /// Every layout and side.
    pub fn all() -> impl Iterator<Item = Bf16Tile> {
        Self::SIDES.into_iter().flat_map(|side| {
            [(false, false), (false, true), (true, false), (true, true)].map(|(a_trans, b_trans)| Bf16Tile {
                a_trans,
                b_trans,
                side,
            })
        })
    }

    /// The kernel's function name in fused/matmul.cu.
    pub fn name(self) -> String {
        let letter = |t: bool| if t { 't' } else { 'n' };
        format!("gemm_bf16_{}{}_{}", letter(self.a_trans), letter(self.b_trans), self.side)
    }

    /// Blocks of an M×N product (x over N, y over M), for one row slice.
    pub fn blocks(self, m: usize, n: usize) -> (usize, usize) {
        (n.div_ceil(self.side), m.div_ceil(self.side))
    }

    fn shared_bytes(self) -> usize {
        bf16_shared_floats(self.side, self.side, BF16_TILE.1) * std::mem::size_of::<f32>()
    }
}

/// `gemm_bf16_async_*`'s tile side, k per chunk and chunks in flight (`LINEAR_TILE`, `LINEAR_BK`,
/// `LINEAR_STAGES`): the Transformer's linear-layer tile.
pub const LINEAR_TILE: (usize, usize, usize) = (128, 32, 4);

/// The name of `gemm_bf16_async_*` for A stored K×M (`a_trans`) or not and B stored N×K (`b_trans`) or not.
pub fn linear_kernel(a_trans: bool, b_trans: bool) -> String {
    let letter = |t: bool| if t { 't' } else { 'n' };
    format!("gemm_bf16_async_{}{}", letter(a_trans), letter(b_trans))
}

/// The kernel module (`fused/matmul.cu` takes no sizes).
pub const MODULE: ModuleRequest = ("matmul", Vec::new());

/// The compiled kernels.
pub struct GpuMatmul {
    gpu: Arc<Gpu>,
    functions: Vec<device::launch::Kernel>,
    bf16: Vec<device::launch::Kernel>,
    tiles: Vec<(Bf16Tile, device::launch::Kernel)>,
    /// gemm_bf16_async_{nn, nt, tn, tt}.
    linear: Vec<device::launch::Kernel>,
    /// matmul_bf16_tma_* by tile and layout (2·a_trans + b_trans), where the GPU has `wgmma` (none
    /// elsewhere: their shared memory may exceed the GPU's).
    tma: Vec<((TmaTile, usize), device::launch::Kernel)>,
}

impl GpuMatmul {
    /// Loads fused/matmul.cu on `gpu` and looks up its kernels.
    pub fn new(gpu: Arc<Gpu>) -> Result<GpuMatmul> {
        let module = gpu.module(&MODULE)?;
        let functions = Kernel::ALL.iter().map(|k| Gpu::function(&module, k.name())).collect::<Result<_>>()?;
        let function = |name: &str, shared: usize| {
            let function = Gpu::function(&module, name)?;
            gpu.reserve_shared(&function, shared, "the tile")?;
            Ok(function)
        };
        let bf16 =
            Bf16Kernel::FIXED_TILE.iter().map(|k| function(k.name(), k.shared_bytes())).collect::<Result<_>>()?;
        let tiles = Bf16Tile::all().map(|t| Ok((t, function(&t.name(), t.shared_bytes())?))).collect::<Result<_>>()?;
        let linear = [(false, false), (false, true), (true, false), (true, true)]
            .into_iter()
            .map(|(a_trans, b_trans)| function(&linear_kernel(a_trans, b_trans), linear_shared_bytes()))
            .collect::<Result<_>>()?;
        let tma = match has_wgmma(gpu.compute_capability) {
            true => TmaTile::ALL
                .iter()
                .flat_map(|&t| (0..4).map(move |layout| (t, layout)))
                .map(|(t, layout)| {
                    let name = t.layout_name(layout >= 2, layout % 2 == 1);
                    Ok(((t, layout), function(&name, t.shared_bytes())?))
                })
                .collect::<Result<_>>()?,
            false => Vec::new(),
        };
        Ok(GpuMatmul { gpu, functions, bf16, tiles, linear, tma })
    }

    /// Queues C = A·B of bf16 operands (row-major A M×K, B K×N, fp32 C M×N) by `kernel`.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue_bf16(
        &self,
        kernel: Bf16Kernel,
        a: &CudaSlice<u16>,
        b: &CudaSlice<u16>,
        c: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if kernel == Bf16Kernel::Tma {
            return self.enqueue_tma(None, a, b, c, m, n, k);
        }
        check_shape(a.len(), b.len(), c.len(), m, n, k)?;
        let side = BF16_TILE.0;
        let args = [
            Arg::buf(&self.gpu, a),
            Arg::buf(&self.gpu, b),
            Arg::buf(&self.gpu, c),
            Arg::i32(m as i32),
            Arg::i32(n as i32),
            Arg::i32(k as i32),
        ];
        self.launch(&self.bf16[kernel as usize], (n.div_ceil(side), m.div_ceil(side)), kernel.shared_bytes(), &args)
    }

    /// Queues C = A·B of bf16 operands (row-major A M×K, B K×N, fp32 C M×N) by `matmul_bf16_tma_*` with
    /// `tile`, or the one `TmaTile::choose` picks: min(tiles, SMs) persistent blocks, A and B passed as
    /// tensor maps. N and K must be multiples of 8, and the GPU must have `wgmma`.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue_tma(
        &self,
        tile: Option<TmaTile>,
        a: &CudaSlice<u16>,
        b: &CudaSlice<u16>,
        c: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        check_shape(a.len(), b.len(), c.len(), m, n, k)?;
        if !Bf16Kernel::Tma.takes(m, n, k) {
            bail!(
                "matmul_bf16_tma needs N and K multiples of 8 (TMA copies rows of whole 16 bytes), not {m}×{k}·{k}×{n}"
            );
        }
        let (a_layout, b_layout) = (Strided { trans: false, ld: k }, Strided { trans: false, ld: n });
        self.enqueue_tma_strided(tile, (a, a_layout), (b, b_layout), c, m, n, k)
    }

    /// Queues C = A·B (M×N, row-major fp32) by `matmul_bf16_tma_*` in the layout of its operands: A M×K, or
    /// K×M when `a_layout.trans`; B K×N, or N×K when `b_layout.trans`; each with its leading dimension, a
    /// multiple of 8 (TMA copies rows of whole 16 bytes). `tile` as `enqueue_tma`'s.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue_tma_strided(
        &self,
        tile: Option<TmaTile>,
        (a, a_layout): (&CudaSlice<u16>, Strided),
        (b, b_layout): (&CudaSlice<u16>, Strided),
        c: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if c.len() != m * n {
            bail!("C of {} floats is not {m}×{n}", c.len());
        }
        check_strided((a.len(), a_layout), (b.len(), b_layout), (m, n, k), n)?;
        if [m, n, k].into_iter().any(|d| d > i32::MAX as usize) {
            bail!("{m}×{k}·{k}×{n} has a side past i32");
        }
        if m == 0 || n == 0 {
            return Ok(());
        }
        let tile = tile.unwrap_or_else(|| TmaTile::choose(m, n, k, self.gpu.sm_count as usize));
        let layout = 2 * a_layout.trans as usize + b_layout.trans as usize;
        let Some((_, function)) = self.tma.iter().find(|(key, _)| *key == (tile, layout)) else {
            bail!("{} needs a GPU with wgmma (sm_90a), not {}", tile.name(), self.gpu.describe());
        };
        if k == 0 {
            // A tensor map has no empty side: the product of nothing is zero.
            return self.gpu.stream.memset_zeros(c).context("clearing C");
        }
        let (a_address, _a_read) = a.device_ptr(&self.gpu.stream);
        let (b_address, _b_read) = b.device_ptr(&self.gpu.stream);
        let a_map = TmaOperand::a(a_address, a_layout, m, k, tile);
        let b_map = TmaOperand::b(b_address, b_layout, n, k, tile);
        if !a_map.copyable() || !b_map.copyable() {
            bail!(
                "matmul_bf16_tma needs leading dimensions multiples of 8 and 16-byte-aligned operands (ld {} and {})",
                a_layout.ld,
                b_layout.ld
            );
        }
        let maps = tma_operands(&a_map.encode()?, &b_map.encode()?);
        let blocks = tile.blocks(m, n, self.gpu.sm_count);
        let args = [Arg::buf(&self.gpu, c), Arg::i32(m as i32), Arg::i32(n as i32), Arg::i32(k as i32)];
        let shape = ((blocks, 1), TMA_THREADS, tile.shared_bytes() as u32, false);
        self.gpu.launch_sized_with_struct(function, shape, &maps, &args)
    }

    /// Queues gemm_tile_bf16 by `tile` on fp32 operands (A M×K or K×M, B K×N or N×K, as `tile` says) with K
    /// cut into `slices` row slices: slice s's product goes to C[s·M·N …] (C holds slices·M·N floats).
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue_tile(
        &self,
        tile: Bf16Tile,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
        slices: usize,
    ) -> Result<()> {
        if slices == 0 || c.len() != slices * m * n {
            bail!("C of {} floats is not {slices} slices of {m}×{n}", c.len());
        }
        check_shape(a.len(), b.len(), m * n, m, n, k)?;
        let function = &self.tiles.iter().find(|(t, _)| *t == tile).context("no such bf16 tile")?.1;
        let args = [
            Arg::buf(&self.gpu, a),
            Arg::buf(&self.gpu, b),
            Arg::buf(&self.gpu, c),
            Arg::i32(m as i32),
            Arg::i32(n as i32),
            Arg::i32(k as i32),
            Arg::i32(slices as i32),
        ];
        let (bx, by) = tile.blocks(m, n);
        self.launch(function, (slices * bx, by), tile.shared_bytes(), &args)
    }

    /// Queues C = A·B (M×N, row-major) by `gemm_bf16_async_*` (gemm_tile_bf16_async with the Transformer's
    /// linear-layer tile) on bf16 operands lying as `a_layout` (M×K, or K×M when transposed) and
    /// `b_layout` (K×N, or N×K) say, column `ones_col` of B read as 1, with K cut into `slices` row slices:
    /// slice s's product goes to C[s·M·N …] (C holds slices·M·N floats). The ones column is never read
    /// from memory, so when it is B's last, B's memory may end before it (`[x | 1]` over x alone).
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue_linear(
        &self,
        (a, a_layout): (&CudaSlice<u16>, Strided),
        (b, b_layout): (&CudaSlice<u16>, Strided),
        c: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
        ones_col: Option<usize>,
        slices: usize,
    ) -> Result<()> {
        if slices == 0 || c.len() != slices * m * n {
            bail!("C of {} floats is not {slices} slices of {m}×{n}", c.len());
        }
        if let Some(col) = ones_col
            && col >= n
        {
            bail!("the ones column {col} is past B's {n} columns");
        }
        let stored_n = if ones_col.is_some_and(|col| col + 1 == n) { n - 1 } else { n };
        check_strided((a.len(), a_layout), (b.len(), b_layout), (m, n, k), stored_n)?;
        if [m, n, k, a_layout.ld, b_layout.ld, slices].into_iter().any(|d| d > i32::MAX as usize) {
            bail!("{m}×{k}·{k}×{n} (ld {} and {}) has a size past i32", a_layout.ld, b_layout.ld);
        }
        let layout = 2 * a_layout.trans as usize + b_layout.trans as usize;
        let args = [
            Arg::buf(&self.gpu, a),
            Arg::buf(&self.gpu, b),
            Arg::buf(&self.gpu, c),
            Arg::i32(m as i32),
            Arg::i32(n as i32),
            Arg::i32(k as i32),
            Arg::i32(a_layout.ld as i32),
            Arg::i32(b_layout.ld as i32),
            Arg::i32(ones_col.map_or(-1, |c| c as i32)),
            Arg::i32(slices as i32),
        ];
        let side = LINEAR_TILE.0;
        let blocks = (slices * n.div_ceil(side), m.div_ceil(side));
        self.launch(&self.linear[layout], blocks, linear_shared_bytes(), &args)
    }

    fn launch(
        &self,
        function: &device::launch::Kernel,
        (bx, by): (usize, usize),
        shared: usize,
        args: &[Arg],
    ) -> Result<()> {
        if by > 65_535 || bx > i32::MAX as usize {
            bail!("{} cannot launch {bx}×{by} blocks", function.name);
        }
        if bx == 0 || by == 0 {
            return Ok(());
        }
        self.gpu.launch(function, (bx as u32, by as u32), shared as u32, false, args)
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
        check_shape(a.len(), b.len(), c.len(), m, n, k)?;
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

/// Dynamic shared bytes of `gemm_bf16_async_*`.
fn linear_shared_bytes() -> usize {
    let (side, bk, stages) = LINEAR_TILE;
    bf16_async_shared_floats(side, side, bk, stages) * std::mem::size_of::<f32>()
}

/// Refuses operands of `a` and `b` elements too short for an M×K · K×N product as their layouts store them,
/// B with `stored_n` of its N columns in memory.
fn check_strided(
    (a, a_layout): (usize, Strided),
    (b, b_layout): (usize, Strided),
    (m, n, k): (usize, usize, usize),
    stored_n: usize,
) -> Result<()> {
    let fits = |len: usize, (rows, cols): (usize, usize), ld: usize| {
        rows == 0 || cols == 0 || (ld >= cols && (rows - 1) * ld + cols <= len)
    };
    let a_shape = if a_layout.trans { (k, m) } else { (m, k) };
    let b_shape = if b_layout.trans { (stored_n, k) } else { (k, stored_n) };
    if !fits(a, a_shape, a_layout.ld) || !fits(b, b_shape, b_layout.ld) {
        bail!("operands of {a} and {b} elements (ld {} and {}) do not fit {m}×{k} · {k}×{n}", a_layout.ld, b_layout.ld);
    }
    Ok(())
}

/// An error unless buffers of `a`, `b` and `c` elements hold M×K, K×N and M×N and every side fits an i32.
fn check_shape(a: usize, b: usize, c: usize, m: usize, n: usize, k: usize) -> Result<()> {
    if a != m * k || b != k * n || c != m * n {
        bail!("buffers of {a}, {b} and {c} elements are not {m}×{k}, {k}×{n} and {m}×{n}");
    }
    if [m, n, k].into_iter().any(|d| d > i32::MAX as usize) {
        bail!("{m}×{k}·{k}×{n} has a side past i32");
    }
    Ok(())
}

/// cuBLAS on the GPU's stream.
pub struct Cublas {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
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
        Ok(Cublas { blas, stream: gpu.stream.clone() })
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
        check_shape(a.len(), b.len(), c.len(), m, n, k)?;
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
    /// Queues C = A·B of bf16 operands (row-major, as `GpuMatmul::enqueue_bf16`) by cublasGemmEx: bf16
    /// inputs, fp32 output and compute, column-major Cᵀ = Bᵀ·Aᵀ.
    pub fn enqueue_bf16(
        &self,
        a: &CudaSlice<u16>,
        b: &CudaSlice<u16>,
        c: &mut CudaSlice<f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        use std::ffi::c_void;
        check_shape(a.len(), b.len(), c.len(), m, n, k)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let (m, n, k) = (m as i32, n as i32, k as i32);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (a, _a_read) = a.device_ptr(&self.stream);
        let (b, _b_read) = b.device_ptr(&self.stream);
        let (c, _c_written) = c.device_ptr_mut(&self.stream);
        let bf16 = sys::cudaDataType::CUDA_R_16BF;
        // SAFETY: the handle is live and bound to this stream; the buffers hold the sizes check_shape
        // confirmed, so the product stays inside them; alpha and beta outlive the call, which reads them
        // before it returns (host pointer mode).
        let status = unsafe {
            sys::cublasGemmEx(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_N,
                cublasOperation_t::CUBLAS_OP_N,
                n,
                m,
                k,
                (&alpha as *const f32).cast::<c_void>(),
                b as *const c_void,
                bf16,
                n,
                a as *const c_void,
                bf16,
                k.max(1),
                (&beta as *const f32).cast::<c_void>(),
                c as *mut c_void,
                sys::cudaDataType::CUDA_R_32F,
                n,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        if status != sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            bail!("cublasGemmEx (bf16) failed: {status:?}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::compile::kernel_constants;

    #[test]
    fn async_sizes_match_the_kernel_file() {
        let kernel = kernel_constants("matmul", &[], &["ASYNC_STAGES", "ASYNC_BK", "WGMMA_STAGES"]).unwrap();
        assert_eq!(kernel, [ASYNC_STAGES as i64, ASYNC_BK as i64, WGMMA_STAGES as i64]);
        let kernel = kernel_constants("matmul", &[], &["LINEAR_TILE", "LINEAR_BK", "LINEAR_STAGES"]).unwrap();
        assert_eq!(kernel, [LINEAR_TILE.0 as i64, LINEAR_TILE.1 as i64, LINEAR_TILE.2 as i64]);
    }

    #[test]
    fn tma_sizes_match_the_kernel_file() {
        let expressions: Vec<String> = TmaTile::ALL
            .iter()
            .flat_map(|t| {
                let (bm, bn) = t.shape();
                [
                    format!("TMA_STAGES_{bm}x{bn}"),
                    format!("GemmTma<{bm}, {bn}, TMA_STAGES_{bm}x{bn}>::SHARED_BYTES"),
                    format!("GemmTma<{bm}, {bn}, TMA_STAGES_{bm}x{bn}>::BLOCK_THREADS"),
                ]
            })
            .collect();
        let expressions: Vec<&str> = expressions.iter().map(String::as_str).collect();
        let kernel = kernel_constants("matmul", &[], &expressions).unwrap();
        let host: Vec<i64> = TmaTile::ALL
            .iter()
            .flat_map(|t| [t.stages() as i64, t.shared_bytes() as i64, TMA_THREADS as i64])
            .collect();
        assert_eq!(kernel, host);
        assert!(kernel_constants("matmul", &[], &["sizeof(TmaOperands)"]).unwrap() == [256]);
    }

    #[test]
    fn tma_tiles_fit_the_problem() {
        // 4096³ on an H200's 132 SMs: 512 tiles of 128×256 (four waves) over 704 of 128×192 (six).
        assert_eq!(TmaTile::choose(4096, 4096, 4096, 132), TmaTile::M128N256);
        // 1024³: 32 large tiles leave 100 SMs idle; 64 of 128×128 take half the time.
        assert_eq!(TmaTile::choose(1024, 1024, 1024, 132), TmaTile::M128N128);
        // The qkv product at nanoGPT's shape: six whole columns of 192 in six waves, where 256 wide leaves a
        // half-empty fifth column in five.
        assert_eq!(TmaTile::choose(16384, 1152, 384, 132), TmaTile::M128N192);
        // Its MLP (N 1536, K 384): 128×256's six waves over 128×192's eight, the tiles' overhead counting.
        assert_eq!(TmaTile::choose(16384, 1536, 384, 132), TmaTile::M128N256);
        // One tile either way: the smallest.
        assert_eq!(TmaTile::choose(64, 64, 64, 132), TmaTile::M128N128);
        for tile in TmaTile::ALL {
            // Every tile's shared memory fits an H100/H200 (227 KB opt-in).
            assert!(tile.shared_bytes() <= 227 * 1024, "{tile:?}");
        }
        assert!(Bf16Kernel::Tma.takes(77, 136, 40) && !Bf16Kernel::Tma.takes(77, 131, 40));
        assert!(!Bf16Kernel::Tma.takes(64, 64, 45) && Bf16Kernel::Async.takes(1, 1, 1));
    }

    #[test]
    fn tile_names_cover_every_layout_and_side() {
        let names: Vec<String> = Bf16Tile::all().map(Bf16Tile::name).collect();
        assert_eq!(names.len(), 8);
        assert!(names.contains(&"gemm_bf16_nt_128".to_string()) && names.contains(&"gemm_bf16_tn_64".to_string()));
    }
}
