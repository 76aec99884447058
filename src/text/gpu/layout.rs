//! How the text kernels split the work for a model shape on a device: block counts, tile rows and shared
//! memory of each kernel (mirroring fused/text.cu, text_batch.cu and text_sample.cu; the constants are
//! tested against those files), and which path a step of B samples takes.

use super::super::model::TextShape;
use crate::device::compile::ModuleRequest;
use crate::ops::THREADS_PER_BLOCK;
use crate::ops::gemm::{G128_BK, G128_LD, G128_STAGED_FLOATS};
use anyhow::{Result, bail};

pub(super) const WARPS: usize = 8;
/// Steps of at least this many samples take the tiled-matmul kernels of `fused/text_batch.cu`.
pub const TILED_MIN_BATCH: usize = 64;
/// Tile edge, text_batch_backward's K per block and text_batch_update's samples per ∂W1 block of
/// fused/text_batch.cu (TILE, SLICE, B_SLICE).
pub(super) const TILE: usize = 128;
pub(super) const SLICE: usize = 1024;
pub(super) const B_SLICE: usize = 128;
/// Floats of text_batch_backward's shared memory after its two staged operands: the ∂W2 blocks' sample
/// records [SLICE] (4 floats each) and ∂b2 sums [WARPS][TILE].
pub(super) const TILED_BACKWARD_EXTRA: usize = 4 * SLICE + WARPS * TILE;
/// Blocks of text_batch_update that apply the W2 update.
pub(super) const W2_UPDATE_BLOCKS: usize = 132;
/// Samples per evaluation launch.
pub(super) const EVAL_BATCH: usize = 256;
/// Most samples a text.cu kernel handles together for `shape` (TEXT_SB).
pub fn max_chunk(shape: TextShape) -> usize {
    (2048 / shape.hidden.max(1)).min(2048 / shape.embed.max(1)).clamp(1, 8)
}

/// The kernel modules a trainer of `shape` compiles for steps of `batch` samples (see `device::compile::precompile`).
pub fn modules(shape: TextShape, batch: usize) -> Vec<ModuleRequest> {
    let mut out = vec![module_request("text_batch", shape, None)];
    // The single-sample kernels read W2 rows as float4s (`TextLayout::sample_fits`).
    if shape.hidden.is_multiple_of(4) {
        out.push(module_request("text_sample", shape, None));
    }
    for chunk in [1, batch.clamp(1, max_chunk(shape))] {
        out.push(module_request("text", shape, Some(chunk)));
    }
    out
}

/// The module of kernel file `unit` for `shape`; `text.cu` also takes the samples per chunk (TEXT_SB).
pub fn module_request(unit: &'static str, shape: TextShape, chunk: Option<usize>) -> ModuleRequest {
    let mut defines = vec![("TEXT_D", shape.embed as i64), ("TEXT_H", shape.hidden as i64)];
    defines.extend(chunk.map(|c| ("TEXT_SB", c as i64)));
    (unit, defines)
}

/// Steps captured in one CUDA graph.
pub(super) const GRAPH_STEPS: usize = 128;
/// Bytes of W2 rows text_forward / text_backward stage in shared memory at once (a block's rows for the
/// benchmark shape, 63 × 256 floats, fit in one tile).
pub(super) const W2_TILE_BYTES: usize = 72 * 1024;
/// text_update forms the whole dx in every block (W1 staged in shared memory) when its shared memory stays
/// under this, leaving room beside it on the SM for the step's other kernels.
pub(super) const UPDATE_WHOLE_DX_SHARED: usize = 112 * 1024;
/// Hidden units per sample_backward block (HS in fused/text_sample.cu).
pub(super) const SAMPLE_UNITS: usize = 16;
/// sample_forward's static __shared__ arrays (three of WARPS entries: 128 bytes), which count against the
/// same per-block limit as its dynamic shared memory.
pub(super) const SAMPLE_FORWARD_STATIC_SHARED: usize = 128;
/// The kernels keep per-lane register arrays of H/32 and D/32 values.
pub const MAX_HIDDEN: usize = 2048;
/// Largest embedding width D the kernels take.
pub const MAX_EMBED: usize = 1024;

/// How the kernels split the work, derived from the model shape and the device.
#[derive(Clone, Copy, Debug)]
pub struct TextLayout {
    /// The model's sizes.
    pub shape: TextShape,
    /// Most samples a kernel handles together (TEXT_SB); a step of B samples uses min(B, max_chunk).
    pub max_chunk: usize,
    /// Vocabulary rows per block of text_forward / text_backward.
    pub rows_per_block: usize,
    /// W2 rows of a block staged in shared memory at once (≤ rows_per_block).
    pub tile_rows: usize,
    /// Blocks of text_forward / text_backward (G).
    pub grid: usize,
    /// Blocks of text_update (one hidden row per warp).
    pub update_grid: usize,
    /// Whether text_batch_forward's tiles fit the device's shared memory (else large batches also take
    /// the chunked kernels).
    pub tiled_fits: bool,
    /// Whether single-sample steps take fused/text_sample.cu (H a multiple of 4, a block's W2 rows in
    /// shared memory at once); else fused/text.cu.
    pub sample_fits: bool,
}

pub(super) const F32: usize = std::mem::size_of::<f32>();

impl TextLayout {
    /// The layout for `shape` on a GPU of `sm_count` multiprocessors and `max_shared` bytes of shared memory a block
    /// may use; errors when the kernels cannot take the shape.
    pub fn new(shape: TextShape, sm_count: usize, max_shared: usize) -> Result<TextLayout> {
        let TextShape { vocab: v, embed: d, hidden: h, .. } = shape;
        if h > MAX_HIDDEN {
            bail!("--hidden {h} is above the GPU kernels' limit of {MAX_HIDDEN}; lower --hidden or use --device cpu");
        }
        if d > MAX_EMBED {
            bail!("--embed {d} is above the GPU kernels' limit of {MAX_EMBED}; lower --embed or use --device cpu");
        }
        let max_chunk = max_chunk(shape);
        let mut layout = TextLayout {
            shape,
            max_chunk,
            rows_per_block: 1,
            tile_rows: 1,
            grid: v,
            update_grid: h.div_ceil(WARPS),
            tiled_fits: false,
            sample_fits: false,
        };
        layout.tiled_fits = layout.tiled_forward_shared() <= max_shared;
        // Rows per block: the vocabulary spread over every SM, fewer where text_backward's shared memory
        // (a tile of W2 rows, and its W2 gradient rows when B > SB) would not fit.
        let tile_cap = (W2_TILE_BYTES / (h * F32)).max(1);
        let fixed = ((1 + WARPS) * max_chunk * h + tile_cap * (h + 1)) * F32;
        let fit_rows = max_shared.saturating_sub(fixed) / ((h + 1 + max_chunk) * F32);
        if fit_rows == 0 {
            bail!(
                "--hidden {h} needs more shared memory per block than this GPU has ({} KB); lower --hidden",
                max_shared / 1024
            );
        }
        layout.rows_per_block = v.div_ceil(sm_count).min(fit_rows).max(1);
        layout.tile_rows = layout.rows_per_block.min(tile_cap);
        layout.grid = v.div_ceil(layout.rows_per_block);
        layout.sample_fits = h % 4 == 0 && layout.sample_forward_shared() + SAMPLE_FORWARD_STATIC_SHARED <= max_shared;
        Ok(layout)
    }

    /// The flag to name when `bytes` of shared memory per block exceed `max_shared`: `--context` where a
    /// one-token context would fit, else `flag`.
    pub fn flag_at_fault(
        &self,
        bytes: &dyn Fn(&TextLayout) -> usize,
        max_shared: usize,
        flag: &'static str,
    ) -> &'static str {
        let one_token = TextLayout { shape: TextShape { context: 1, ..self.shape }, ..*self };
        if bytes(self) > max_shared && bytes(&one_token) <= max_shared { "--context" } else { flag }
    }

    /// Whether a step of `batch` samples takes the tiled kernels.
    pub fn tiled(&self, batch: usize) -> bool {
        batch >= TILED_MIN_BATCH && self.tiled_fits
    }

    /// text_batch_forward: hT `[H][LD]` and xT `[D][LD]` (H and D rounded up to whole chunks), one staged
    /// operand.
    pub fn tiled_forward_shared(&self) -> usize {
        let (h, d) = (self.shape.hidden.next_multiple_of(G128_BK), self.shape.embed.next_multiple_of(G128_BK));
        ((h + d) * G128_LD + G128_STAGED_FLOATS) * F32
    }

    /// Bytes of text_batch_hidden_bf16's shared memory: x of a sample tile and one staged operand.
    pub fn tiled_hidden_shared(&self) -> usize {
        (self.shape.embed.next_multiple_of(G128_BK) * G128_LD + G128_STAGED_FLOATS) * F32
    }

    /// Vocabulary tiles of text_batch_forward.
    pub fn vocab_tiles(&self) -> usize {
        self.shape.vocab.div_ceil(TILE)
    }

    /// Samples a kernel handles together for a step of `batch` samples.
    pub fn chunk(&self, batch: usize) -> usize {
        batch.clamp(1, self.max_chunk)
    }

    /// text_hidden: xs `[chunk][D]`, context tokens `[chunk][N]`.
    pub fn hidden_shared(&self, chunk: usize) -> usize {
        chunk * (self.shape.embed + self.shape.context) * F32
    }

    /// text_forward: W2 tile `[tile_rows][H]`, hs `[chunk][H]`, b2 tile `[tile_rows]`.
    pub fn forward_shared(&self, chunk: usize) -> usize {
        (self.tile_rows * (self.shape.hidden + 1) + chunk * self.shape.hidden) * F32
    }

    /// W2 and b2 tiles [tile_rows][H + 1], hs `[chunk][H]`, dh_warp `[WARPS][chunk][H]`, dl `[chunk][R]`, and
    /// for batches above the chunk gw2 `[R][H]` and gb2 `[R]`.
    pub fn backward_shared(&self, chunk: usize, batch_above_chunk: bool) -> usize {
        let (h, r) = (self.shape.hidden, self.rows_per_block);
        let tile = self.tile_rows * (h + 1);
        (tile + (1 + WARPS) * chunk * h + chunk * r + if batch_above_chunk { r * (h + 1) } else { 0 }) * F32
    }

    /// sample_forward: hs `[H]`, hp `[H]`, the block's W2 rows `[R][LD]`, bs, ls, es [R rounded up to 4].
    pub fn sample_forward_shared(&self) -> usize {
        let (h, r) = (self.shape.hidden, self.rows_per_block);
        let ld = h.next_multiple_of(32) + 16; // LD in fused/text_sample.cu
        (2 * h + r * ld + 3 * r.next_multiple_of(4)) * F32
    }

    /// Blocks of sample_backward: SAMPLE_UNITS hidden units each.
    pub fn sample_backward_grid(&self) -> usize {
        self.shape.hidden.div_ceil(SAMPLE_UNITS)
    }

    /// sample_backward: W1 rows `[HS][D]`, xs `[D]`, scale `[G]`, sums `[THREADS/HS][HS]`, dz `[HS]`.
    pub fn sample_backward_shared(&self) -> usize {
        let threads = THREADS_PER_BLOCK as usize;
        (SAMPLE_UNITS * self.shape.embed + self.shape.embed + self.grid + threads + SAMPLE_UNITS) * F32
    }

    /// sample_update: context `[N]`, next context `[N]`, next rows `[N][D]`, delta `[D]`, xn `[D]`.
    pub fn sample_update_shared(&self) -> usize {
        let TextShape { embed: d, context: n, .. } = self.shape;
        (2 * n + n * d + 2 * d) * F32
    }

    /// Whether every text_update block (compiled for `chunk`) forms the whole dx and the next step's z1 of its
    /// rows, rather than the last block forming the next step's hidden layer (steps of one chunk only).
    pub fn update_whole_dx(&self, chunk: usize) -> bool {
        self.update_shared(chunk, true) <= UPDATE_WHOLE_DX_SHARED
    }

    /// text_update: W1 `[H][D]` with `whole_dx`, xs `[chunk][D]`, dx_warp `[WARPS][chunk][D]`, dz `[chunk][WARPS]`,
    /// this and the next step's context tokens `[chunk][N]`, and with `whole_dx` the next step's embedding rows
    /// `[chunk][N][D]` and dz1 of every hidden row `[chunk][H]`.
    pub fn update_shared(&self, chunk: usize, whole_dx: bool) -> usize {
        let TextShape { embed: d, hidden: h, context: n, .. } = self.shape;
        let whole = if whole_dx { chunk * n * d + chunk * h + h * d } else { 0 };
        ((1 + WARPS) * chunk * d + chunk * WARPS + 2 * chunk * n + whole) * F32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::compile::kernel_constants;

    #[test]
    fn sizes_match_the_kernel_files() {
        let batch = kernel_constants("text_batch", &[], &["TILE", "SLICE", "B_SLICE", "WARPS"]).unwrap();
        assert_eq!(batch, [TILE, SLICE, B_SLICE, WARPS].map(|v| v as i64));
        let sample = kernel_constants("text_sample", &[], &["HS"]).unwrap();
        assert_eq!(sample, [SAMPLE_UNITS as i64]);
    }
}
