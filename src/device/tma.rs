//! The host side of the TMA GEMM (fused/gemm_tma.cuh), shared by `bench matmul` and the Transformer: its
//! tiles (shapes, stages, shared memory, the choice per product) and its operands' tensor maps, encoded by
//! the driver and passed to the kernels by value.

use crate::device::launch::StructArg;
use crate::device::quietly;
use crate::ops::gemm::Strided;
use anyhow::{Result, bail};

/// The tiles (BM × BN) of `matmul_bf16_tma_*` (fused/gemm_tma.cuh), one kernel each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmaTile {
    /// 128×256, each consumer warpgroup 64×256.
    M128N256,
    /// 256×128, each consumer warpgroup 128×128.
    M256N128,
    /// 128×192, each consumer warpgroup 64×192.
    M128N192,
    /// 128×128, each consumer warpgroup 64×128.
    M128N128,
}

/// Threads of a `matmul_bf16_tma_*` block: a producer warpgroup and two consumers.
pub const TMA_THREADS: u32 = 384;

impl TmaTile {
    /// All, in the order `choose` prefers them on a tie.
    pub const ALL: [TmaTile; 4] = [TmaTile::M128N256, TmaTile::M256N128, TmaTile::M128N192, TmaTile::M128N128];

    /// BM, BN.
    pub fn shape(self) -> (usize, usize) {
        match self {
            TmaTile::M128N256 => (128, 256),
            TmaTile::M256N128 => (256, 128),
            TmaTile::M128N192 => (128, 192),
            TmaTile::M128N128 => (128, 128),
        }
    }

    /// Chunks of 64 k in flight (`TMA_STAGES_{BM}x{BN}` in fused/matmul.cu).
    pub fn stages(self) -> usize {
        match self {
            TmaTile::M128N256 | TmaTile::M256N128 => 4,
            TmaTile::M128N192 => 5,
            TmaTile::M128N128 => 6,
        }
    }

    /// The kernel's function name in fused/matmul.cu.
    pub fn name(self) -> String {
        let (bm, bn) = self.shape();
        format!("matmul_bf16_tma_{bm}x{bn}")
    }

    /// The name of its kernel for A stored K×M (`a_trans`) or not and B stored N×K (`b_trans`) or not:
    /// `name` for row-major operands, else `matmul_bf16_tma_{nt,tn,tt}_{BM}x{BN}`.
    pub fn layout_name(self, a_trans: bool, b_trans: bool) -> String {
        let (bm, bn) = self.shape();
        match (a_trans, b_trans) {
            (false, false) => self.name(),
            _ => {
                let letter = |t: bool| if t { 't' } else { 'n' };
                format!("matmul_bf16_tma_{}{}_{bm}x{bn}", letter(a_trans), letter(b_trans))
            }
        }
    }

    /// Its blocks for an M×N product on `sms` SMs: one per tile, at most one per SM.
    pub fn blocks(self, m: usize, n: usize, sms: u32) -> u32 {
        self.tiles(m, n).min(sms.max(1) as usize) as u32
    }

    /// Dynamic shared bytes (`GemmTma<BM, BN, STAGES>::SHARED_BYTES`): the stages of BM + BN rows of 64
    /// bf16, 1 KB of alignment, two mbarriers a stage.
    pub fn shared_bytes(self) -> usize {
        let (bm, bn) = self.shape();
        self.stages() * (bm + bn) * 64 * 2 + 1024 + 2 * self.stages() * 8
    }

    /// Tiles of an M×N product.
    pub fn tiles(self, m: usize, n: usize) -> usize {
        let (bm, bn) = self.shape();
        m.div_ceil(bm) * n.div_ceil(bn)
    }

    /// The tile for an M×N·(K) product on `sms` SMs: the least modelled time, tiles in waves over the SMs
    /// (each block runs ⌈tiles / SMs⌉ or fewer), a tile's time its multiply-adds BM·BN·K over its
    /// efficiency plus TILE_OVERHEAD (in multiply-adds) for its start and its epilogue. The efficiencies and the overhead are
    /// fitted to `bench matmul`'s rows of each tile forced at 1024³, 4096³ and the Transformer's products
    /// at widths 384 and 768 (`2026-11-30-h200-b64b2f4`): 128×192 runs 4 % more multiply-adds a second
    /// than 128×256 on equal waves, 128×128 20 % fewer, and a short K favours the tile of fewer waves.
    pub fn choose(m: usize, n: usize, k: usize, sms: usize) -> TmaTile {
        const TILE_OVERHEAD: f64 = 2e6;
        let cost = |tile: TmaTile| {
            let (bm, bn) = tile.shape();
            let efficiency = match tile {
                TmaTile::M128N192 => 1.04,
                TmaTile::M128N128 => 0.8,
                TmaTile::M128N256 | TmaTile::M256N128 => 1.0,
            };
            let waves = tile.tiles(m, n).div_ceil(sms.max(1)) as f64;
            waves * ((bm * bn * k) as f64 / efficiency + TILE_OVERHEAD)
        };
        // The first of the cheapest (min_by keeps the first of equals).
        TmaTile::ALL.into_iter().min_by(|x, y| cost(*x).total_cmp(&cost(*y))).unwrap_or(TmaTile::M128N256)
    }
}

/// One operand of a `gemm_bf16_tma_tiles` product (fused/gemm_tma.cuh) as its tensor map describes it:
/// `extent` rows of m (A) or columns of n (B) by `k`, at device address `address`, stored K-contiguous
/// (`extent` rows of k, `ld` apart; copied in boxes of 64 k × `box_rows`) or not (`k` rows of m or n, `ld`
/// apart; boxes of 64 × 64). Two operands of equal fields have equal maps, so a map may be encoded once and
/// kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TmaOperand {
    /// The device address of element (0, 0).
    pub address: u64,
    /// Whether k runs along the stored rows.
    pub k_contiguous: bool,
    /// Rows of m (A) or columns of n (B).
    pub extent: usize,
    /// The product's k.
    pub k: usize,
    /// Elements between consecutive stored rows.
    pub ld: usize,
    /// The box's rows: the tile's BM (A) or BN (B) when K-contiguous, else 64.
    pub box_rows: usize,
}

impl TmaOperand {
    /// A (M×K, or K×M when `layout.trans`) of a product on `tile`.
    pub fn a(address: u64, layout: Strided, m: usize, k: usize, tile: TmaTile) -> TmaOperand {
        let box_rows = if layout.trans { 64 } else { tile.shape().0 };
        TmaOperand { address, k_contiguous: !layout.trans, extent: m, k, ld: layout.ld, box_rows }
    }

    /// B (K×N, or N×K when `layout.trans`) of a product on `tile`.
    pub fn b(address: u64, layout: Strided, n: usize, k: usize, tile: TmaTile) -> TmaOperand {
        let box_rows = if layout.trans { tile.shape().1 } else { 64 };
        TmaOperand { address, k_contiguous: layout.trans, extent: n, k, ld: layout.ld, box_rows }
    }

    /// The stored matrix's (elements a row, rows).
    fn stored(&self) -> (usize, usize) {
        if self.k_contiguous { (self.k, self.extent) } else { (self.extent, self.k) }
    }

    /// Whether TMA can copy it: rows of whole 16 bytes (ld a multiple of 8) from a 16-byte-aligned start,
    /// no side empty, every side within the map's limits.
    pub fn copyable(&self) -> bool {
        let (inner, outer) = self.stored();
        self.address.is_multiple_of(16)
            && self.ld.is_multiple_of(8)
            && self.ld >= inner
            && inner > 0
            && outer > 0
            && [inner, outer].into_iter().all(|d| d <= u32::MAX as usize)
            && ((self.ld * 2) as u64) < 1 << 40
    }

    /// Its tensor map (CUtensorMap, 128 bytes): 128-byte-swizzled boxes of 64 elements × `box_rows` rows;
    /// reads past either side are zero.
    pub fn encode(&self) -> Result<[u8; 128]> {
        use cudarc::driver::sys;
        let (inner, outer) = self.stored();
        if !self.copyable() {
            bail!("TMA cannot copy a {outer}×{inner} bf16 matrix of row stride {} at {:#x}", self.ld, self.address);
        }
        let dims = [inner as u64, outer as u64];
        let strides = [(self.ld * 2) as u64];
        let boxes = [64u32, self.box_rows as u32];
        let element_strides = [1u32, 1];
        // SAFETY: CUtensorMap is 16 plain words, for which zero bytes are valid.
        let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
        let status = quietly("encoding a TMA tensor map", || {
            // SAFETY: every array holds the rank's entries (strides rank − 1), `map` is writable and aligned
            // as the driver requires; encoding only writes `map` (the address is recorded, not read).
            Ok(unsafe {
                sys::cuTensorMapEncodeTiled(
                    &mut map,
                    sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                    2,
                    self.address as *mut std::ffi::c_void,
                    dims.as_ptr(),
                    strides.as_ptr(),
                    boxes.as_ptr(),
                    element_strides.as_ptr(),
                    sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                    sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                    sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
                )
            })
        })?;
        if status != sys::CUresult::CUDA_SUCCESS {
            bail!(
                "cuTensorMapEncodeTiled refused a {outer}×{inner} bf16 matrix (row stride {}) in boxes of 64×{}: {status:?}",
                self.ld,
                self.box_rows
            );
        }
        let mut bytes = [0u8; 128];
        for (chunk, word) in bytes.chunks_mut(8).zip(map.opaque) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        Ok(bytes)
    }
}

/// The kernel parameter `TmaOperands` (A's map then B's) from the two maps.
pub fn tma_operands(a: &[u8; 128], b: &[u8; 128]) -> StructArg {
    StructArg::new(&[&a[..], &b[..]].concat())
}
