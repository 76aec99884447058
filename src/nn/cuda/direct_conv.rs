//! conv2d's direct kernels (`nn_conv2d_direct` and `nn_conv2d_direct_grad_weight`, fused/nn.cu §"conv2d
//! direct"): where a band of an image's rows fits in shared memory, a block stages it once and reads every
//! window from it, in place of the implicit products (`conv.rs`), which stage each window element through
//! index arithmetic. This file plans them: whether a convolution takes them, its bands, how many channels
//! a block stages at a time, its grid and shared memory.
//!
//! Each comes in two kinds ([`ConvKernels`]): on the tensor cores (`nn_conv2d_mma` and
//! `nn_conv2d_mma_grad_weight`: the windows as m16n8k8 TF32 products in 3xTF32, fp32's accuracy, the
//! default) and on the CUDA cores (`nn_conv2d_direct` and `nn_conv2d_direct_grad_weight`: fp32 FMAs in the
//! CPU twin's order of additions).
//!
//! They take small-channel convolutions, the ones whose products are too thin to fill a GEMM tile: at most
//! [`DIRECT_MAX_CHANNELS`] result channels (the output's for the forward and the weight gradient, the
//! input's for the input gradient, which is direct at stride 1 only). The weight gradient's bands each sum
//! into a slice of their own, which the launch layer adds in order, so it is direct only while those slices
//! stay under [`DIRECT_MAX_PARTIALS`] floats.

use super::Device;
use super::conv::launch_grid;
use super::ops::{int, optional, slices_for};
use crate::device::kernel_struct::kernel_struct;
use crate::device::launch::StructArg;
use crate::device::precision::Precision;
use crate::nn::cuda::DeviceBuffer;
use crate::nn::error::{Error, Result};
use crate::ops::conv::Conv2dShape;
use std::sync::Arc;

/// fused/nn.cu's DIRECT_OUT (result channels a window thread), DIRECT_SPLIT (groups of such threads a window
/// block, sharing its staged band), GRAD_OUT (result channels a weight-gradient block), DIRECT_PX (positions
/// a thread) and DIRECT_TAPS (the most taps a weight-gradient block takes).
const DIRECT_OUT: usize = 8;
const DIRECT_SPLIT: usize = 2;
const GRAD_OUT: usize = 16;
const DIRECT_PX: usize = 4;
const DIRECT_TAPS: usize = 512;
/// fused/nn.cu's MMA_OUT (result channels a tensor-core block), MMA_TILES (m16 tiles of positions a
/// forward warp), MMA_GRAD_TILES (n8 tiles of taps a weight-gradient warp) and MMA_WEIGHT_PITCH (floats
/// between two taps' staged weights).
const MMA_OUT: usize = 16;
const MMA_TILES: usize = 4;
const MMA_GRAD_TILES: usize = 3;
const MMA_WEIGHT_PITCH: usize = 24;
/// Warps a block (fused/common.cuh's WARPS).
const WARPS: usize = THREADS / 32;
/// Threads a block (fused/common.cuh's THREADS).
const THREADS: usize = 256;
/// The shared memory a direct block takes, floats: 48 KiB, what any launch gets.
const DIRECT_SHARED_FLOATS: usize = 12 * 1024;
/// The most result channels a direct convolution has; more fill the implicit products' tiles.
const DIRECT_MAX_CHANNELS: usize = 64;
/// The most floats the weight gradient's slices take together (64 MiB).
const DIRECT_MAX_PARTIALS: usize = 16 << 20;
/// Blocks an SM the forward's (and input gradient's) bands aim for, and the weight gradient's, where the
/// images allow. The weight gradient's bands are also its slices, which a second pass adds: at 4 an SM the
/// ResNet example's step (16 channels, 28 × 28, batch 128) ran 342 µs, at 2 339 µs (at 8, 349).
const WINDOW_BLOCKS_PER_SM: usize = 2;
const WEIGHT_GRAD_BLOCKS_PER_SM: usize = 2;

kernel_struct! {
    /// One direct convolution (`DirectConv` in fused/nn.cu): the operand read through windows, `in`
    /// `[N, in_channels, in_h, in_w]`, the result `[N, out_channels, out_h, out_w]`, `band_rows` output rows
    /// a block (`bands` of them), `chunk` input channels staged at a time in tiles of `tile_h × tile_w`, rows
    /// `pitch` floats apart and channels `plane` apart (padded so that a warp's reads take distinct banks);
    /// `tf32` 1 where the tensor-core kernels take one TF32 product ([`Device::set_precision`]'s `Tf32`),
    /// 0 for 3xTF32.
    struct DirectConv {
        samples: i32,
        in_channels: i32,
        in_h: i32,
        in_w: i32,
        out_channels: i32,
        out_h: i32,
        out_w: i32,
        kernel_h: i32,
        kernel_w: i32,
        stride: i32,
        pad_y: i32,
        pad_x: i32,
        flip: i32,
        band_rows: i32,
        bands: i32,
        chunk: i32,
        tile_h: i32,
        tile_w: i32,
        pitch: i32,
        plane: i32,
        tf32: i32,
    }
}

/// A channel's staged rows in shared memory: `h × w` elements, rows `pitch` floats apart, the next channel's
/// `plane` floats on.
#[derive(Clone, Copy)]
struct Tile {
    h: usize,
    w: usize,
    pitch: usize,
    plane: usize,
}

/// Which kernels take an fp32 convolution's products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ConvKernels {
    /// The implicit products (conv.rs) for every convolution.
    Implicit,
    /// The direct kernels on the CUDA cores where they fit: fp32 FMAs in the CPU twin's order.
    Fma,
    /// The direct kernels on the tensor cores where they fit (3xTF32).
    TensorCores,
}

impl ConvKernels {
    pub(crate) const ALL: [ConvKernels; 3] = [ConvKernels::TensorCores, ConvKernels::Fma, ConvKernels::Implicit];

    /// TEXTNET_DIRECT_CONV's choice: `0` the implicit products, `fma` the CUDA cores, else the tensor cores.
    pub(super) fn from_env() -> ConvKernels {
        match std::env::var("TEXTNET_DIRECT_CONV").as_deref() {
            Ok("0") => ConvKernels::Implicit,
            Ok("fma") => ConvKernels::Fma,
            _ => ConvKernels::TensorCores,
        }
    }

    fn from_u8(v: u8) -> ConvKernels {
        Self::ALL.into_iter().find(|k| *k as u8 == v).unwrap_or(ConvKernels::TensorCores)
    }

    /// What the checks call it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ConvKernels::Implicit => "implicit products",
            ConvKernels::Fma => "direct on the CUDA cores where it fits",
            ConvKernels::TensorCores => "direct on the tensor cores where it fits",
        }
    }
}

/// A direct launch: its sizes, grid, threads a block, dynamic shared memory (bytes) and whether it runs on
/// the tensor cores.
pub(super) struct DirectPlan {
    sizes: DirectConv,
    grid: (usize, usize),
    threads: usize,
    shared: usize,
    mma: bool,
}

impl DirectPlan {
    /// The kernel's sizes at the device's precision now: one TF32 product a tap on the tensor cores at
    /// `Tf32`.
    fn sizes_on(&self, device: &Device) -> DirectConv {
        DirectConv { tf32: (self.mma && device.precision() == Precision::Tf32) as i32, ..self.sizes }
    }
}

/// The sizes of a window walk before it is cut into bands: (channels, height, width) in and out, the kernel,
/// stride, padding (rows, columns) and whether the weight is flipped (the input gradient).
struct Walk {
    input: (usize, usize, usize),
    output: (usize, usize, usize),
    kernel: (usize, usize),
    stride: usize,
    pad: (isize, isize),
    flip: bool,
}

/// Output rows a band, so that the grid has `per_sm` blocks an SM where the images allow it (`blocks` is
/// the grid without bands), at most `most` and at least 1.
fn band_rows(out_h: usize, (blocks, sms, per_sm): (usize, usize, usize), most: usize) -> usize {
    let bands = slices_for(sms, blocks, out_h, (per_sm, 1));
    out_h.div_ceil(bands).clamp(1, most.max(1))
}

/// The largest band rows ≤ `rows` whose shared memory `floats(rows)` fits, or None.
fn fitting_rows(rows: usize, floats: impl Fn(usize) -> usize) -> Option<usize> {
    (1..=rows).rev().find(|&r| floats(r) <= DIRECT_SHARED_FLOATS)
}

/// The least number ≥ `at_least` that is ≡ `residue` (mod 32; `residue` may be any size): a pitch of shared
/// memory at which a warp's reads `residue` words apart a step take distinct banks.
fn pitch_from(at_least: usize, residue: usize) -> usize {
    at_least + (residue + 32 - at_least % 32) % 32
}

/// A block's threads for `splits` groups of bands of `rows` rows of `groups` threads: whole warps.
fn window_threads(splits: usize, rows: usize, groups: usize) -> usize {
    (splits * rows * groups).next_multiple_of(32)
}

/// Of the band heights from half `tallest` up, the one whose blocks leave the fewest threads idle (by
/// `threads(rows)`, a block's), then the one that cuts the `out_h` rows evenly, then the tallest.
fn least_idle_rows(tallest: usize, out_h: usize, threads: impl Fn(usize) -> usize) -> usize {
    let idle = |r: usize| (out_h.div_ceil(r) * threads(r), out_h.div_ceil(r) * r - out_h);
    (tallest.div_ceil(2)..=tallest).min_by_key(|&r| (idle(r), std::cmp::Reverse(r))).unwrap_or(tallest)
}

impl DirectConv {
    fn of(
        op: &'static str,
        walk: &Walk,
        samples: usize,
        (band_rows, chunk): (usize, usize),
        Tile { h, w, pitch, plane }: Tile,
    ) -> Result<DirectConv> {
        let signed =
            |v: isize| i32::try_from(v).map_err(|_| Error::device(op, "has a padding past what a kernel's int holds"));
        Ok(DirectConv {
            samples: int(op, samples)?,
            in_channels: int(op, walk.input.0)?,
            in_h: int(op, walk.input.1)?,
            in_w: int(op, walk.input.2)?,
            out_channels: int(op, walk.output.0)?,
            out_h: int(op, walk.output.1)?,
            out_w: int(op, walk.output.2)?,
            kernel_h: int(op, walk.kernel.0)?,
            kernel_w: int(op, walk.kernel.1)?,
            stride: int(op, walk.stride)?,
            pad_y: signed(walk.pad.0)?,
            pad_x: signed(walk.pad.1)?,
            flip: walk.flip as i32,
            band_rows: int(op, band_rows)?,
            bands: int(op, walk.output.1.div_ceil(band_rows))?,
            chunk: int(op, chunk)?,
            tile_h: int(op, h)?,
            tile_w: int(op, w)?,
            pitch: int(op, pitch)?,
            plane: int(op, plane)?,
            tf32: 0,
        })
    }
}

/// `nn_conv2d_direct`'s plan for `walk` over `samples` images on `sms` SMs, or None where it does not take
/// it (more result channels than [`DIRECT_MAX_CHANNELS`], a row wider than a block's threads take, a band
/// of one row with one channel larger than the shared memory).
fn window_plan(op: &'static str, walk: &Walk, samples: usize, sms: usize) -> Result<Option<DirectPlan>> {
    let ((channels, ..), (outputs, out_h, out_w)) = (walk.input, walk.output);
    let ((kh, kw), stride) = (walk.kernel, walk.stride);
    let groups = out_w.div_ceil(DIRECT_PX);
    // The thread groups a block sets to work: one where the result has DIRECT_OUT channels or fewer.
    let splits = outputs.div_ceil(DIRECT_OUT).min(DIRECT_SPLIT);
    if outputs > DIRECT_MAX_CHANNELS || splits * groups > THREADS || samples == 0 || out_h == 0 || out_w == 0 {
        return Ok(None);
    }
    let o_blocks = outputs.div_ceil(DIRECT_SPLIT * DIRECT_OUT);
    let tile_w = (groups * DIRECT_PX - 1) * stride + kw;
    // A warp's threads are consecutive (row, g): a row pitch ≡ groups puts their reads in consecutive banks,
    // and ≡ DIRECT_PX·groups their float4 reads where a 3×3 walk at stride 1 packs a thread's positions side
    // by side (fused/nn.cu's direct_packed).
    let packed = (kh, kw, stride) == (3, 3, 1);
    let pitch = pitch_from(tile_w, if packed { DIRECT_PX * groups } else { groups });
    let tile = |rows: usize| {
        let h = (rows - 1) * stride + kh;
        Tile { h, w: tile_w, pitch, plane: h * pitch }
    };
    let per_channel = |rows: usize| kh * kw * DIRECT_SPLIT * DIRECT_OUT + tile(rows).plane;
    let tallest = band_rows(out_h, (samples * o_blocks, sms, WINDOW_BLOCKS_PER_SM), THREADS / (splits * groups));
    let Some(tallest) = fitting_rows(tallest, per_channel) else { return Ok(None) };
    let rows = least_idle_rows(tallest, out_h, |r| window_threads(splits, r, groups));
    let chunk = (DIRECT_SHARED_FLOATS / per_channel(rows)).min(channels).max(1);
    let sizes = DirectConv::of(op, walk, samples, (rows, chunk), tile(rows))?;
    let grid = (samples * out_h.div_ceil(rows), o_blocks);
    let threads = window_threads(splits, rows, groups);
    Ok(Some(DirectPlan { sizes, grid, threads, shared: chunk * per_channel(rows) * 4, mma: false }))
}

/// `nn_conv2d_mma`'s plan for `walk` over `samples` images on `sms` SMs, or None where it does not take it
/// (more result channels than [`DIRECT_MAX_CHANNELS`], a row of more positions than a block's warps take,
/// a band of one row with one channel larger than the shared memory).
fn mma_window_plan(op: &'static str, walk: &Walk, samples: usize, sms: usize) -> Result<Option<DirectPlan>> {
    let ((channels, ..), (outputs, out_h, out_w)) = (walk.input, walk.output);
    let ((kh, kw), stride) = (walk.kernel, walk.stride);
    let per_warp = 16 * MMA_TILES;
    if outputs > DIRECT_MAX_CHANNELS || out_w > WARPS * per_warp || samples == 0 || out_h == 0 || out_w == 0 {
        return Ok(None);
    }
    let o_blocks = outputs.div_ceil(MMA_OUT);
    let tile_w = (out_w - 1) * stride + kw;
    // A warp's A fragment reads 8 positions (a word apart at stride 1) at 4 consecutive taps, which span at
    // most two kernel rows of a 3×3 kernel: a row pitch and a plane ≡ 16 (mod 32) put the two rows' words
    // in distinct banks.
    let pitch = pitch_from(tile_w, 16);
    let tile = |rows: usize| {
        let h = (rows - 1) * stride + kh;
        Tile { h, w: tile_w, pitch, plane: pitch_from(h * pitch, 16) }
    };
    // The chunk's weights at MMA_WEIGHT_PITCH and its taps' offsets, then its tile, up to 3 floats on so
    // that the input's first column is 16-byte aligned.
    let floats = |rows: usize, chunk: usize| {
        (chunk * kh * kw).next_multiple_of(8) * (MMA_WEIGHT_PITCH + 1) + chunk * tile(rows).plane + 4
    };
    let tallest = band_rows(out_h, (samples * o_blocks, sms, WINDOW_BLOCKS_PER_SM), WARPS * per_warp / out_w);
    // The tallest band (at most that tall) whose chunk takes every channel, where one fits: a second
    // chunk would stage again while the block's warps wait.
    let whole = fitting_rows(tallest, |r| floats(r, channels));
    let Some(tallest) = whole.or_else(|| fitting_rows(tallest, |r| floats(r, 1))) else { return Ok(None) };
    let threads = |rows: usize| (rows * out_w).div_ceil(per_warp) * 32;
    let rows = least_idle_rows(tallest, out_h, threads);
    let chunk = (1..=channels).rev().find(|&c| floats(rows, c) <= DIRECT_SHARED_FLOATS).unwrap_or(1);
    let sizes = DirectConv::of(op, walk, samples, (rows, chunk), tile(rows))?;
    let grid = (samples * out_h.div_ceil(rows), o_blocks);
    let shared = floats(rows, chunk).max(mma_result_floats(threads(rows))) * 4;
    Ok(Some(DirectPlan { sizes, grid, threads: threads(rows), shared, mma: true }))
}

/// The shared memory of `nn_conv2d_mma`'s results on their way out, floats, for blocks of `threads`: MMA_OUT
/// rows of the block's positions at a pitch ≡ 4 (mod 32) (fused/nn.cu's `mma_result_pitch`).
fn mma_result_floats(threads: usize) -> usize {
    MMA_OUT * pitch_from(threads / 32 * MMA_TILES * 16, 4)
}

/// The plan of `kernels` for `walk`, or None where it takes none (the implicit products then do).
fn windows(
    op: &'static str,
    walk: &Walk,
    samples: usize,
    sms: usize,
    kernels: ConvKernels,
) -> Result<Option<DirectPlan>> {
    match kernels {
        ConvKernels::Implicit => Ok(None),
        ConvKernels::Fma => window_plan(op, walk, samples, sms),
        ConvKernels::TensorCores => mma_window_plan(op, walk, samples, sms),
    }
}

/// The forward's direct plan, or None (`window_plan`).
pub(super) fn forward_plan(
    op: &'static str,
    conv: &Conv2dShape,
    samples: usize,
    sms: usize,
    kernels: ConvKernels,
) -> Result<Option<DirectPlan>> {
    let walk = Walk {
        input: (conv.channels, conv.height, conv.width),
        output: (conv.out_channels, conv.out_height, conv.out_width),
        kernel: (conv.kernel_h, conv.kernel_w),
        stride: conv.stride,
        pad: (conv.padding as isize, conv.padding as isize),
        flip: false,
    };
    windows(op, &walk, samples, sms, kernels)
}

/// The input gradient's direct plan at stride 1 (the forward's walk over dy, the kernel flipped, padding KH
/// − 1 − p and KW − 1 − p), or None.
pub(super) fn input_grad_plan(
    op: &'static str,
    conv: &Conv2dShape,
    samples: usize,
    sms: usize,
    kernels: ConvKernels,
) -> Result<Option<DirectPlan>> {
    if conv.stride != 1 {
        return Ok(None);
    }
    let walk = Walk {
        input: (conv.out_channels, conv.out_height, conv.out_width),
        output: (conv.channels, conv.height, conv.width),
        kernel: (conv.kernel_h, conv.kernel_w),
        stride: 1,
        pad: (conv.kernel_h as isize - 1 - conv.padding as isize, conv.kernel_w as isize - 1 - conv.padding as isize),
        flip: true,
    };
    windows(op, &walk, samples, sms, kernels)
}

/// The weight gradient's direct plan of `kernels` (`with_bias`: a column of ones after the taps), or None
/// where it has more output channels than [`DIRECT_MAX_CHANNELS`], a band of one row does not fit, or the
/// slices would take more than [`DIRECT_MAX_PARTIALS`] floats.
pub(super) fn weight_grad_plan(
    op: &'static str,
    conv: &Conv2dShape,
    samples: usize,
    sms: usize,
    (with_bias, kernels): (bool, ConvKernels),
) -> Result<Option<DirectPlan>> {
    let (outputs, out_h, out_w) = (conv.out_channels, conv.out_height, conv.out_width);
    if outputs > DIRECT_MAX_CHANNELS || samples == 0 || out_h == 0 || out_w == 0 {
        return Ok(None);
    }
    let plan = match kernels {
        ConvKernels::Implicit => return Ok(None),
        ConvKernels::Fma => fma_weight_grad_plan(conv, samples, sms, with_bias),
        ConvKernels::TensorCores => mma_weight_grad_plan(conv, samples, sms, with_bias),
    };
    let Some(WeightGradLayout { rows, chunk, tile, blocks, threads, floats }) = plan else { return Ok(None) };
    let slices = samples * out_h.div_ceil(rows);
    if slices.saturating_mul(outputs * (conv.taps() + 1)) > DIRECT_MAX_PARTIALS {
        return Ok(None);
    }
    let walk = Walk {
        input: (conv.channels, conv.height, conv.width),
        output: (outputs, out_h, out_w),
        kernel: (conv.kernel_h, conv.kernel_w),
        stride: conv.stride,
        pad: (conv.padding as isize, conv.padding as isize),
        flip: false,
    };
    let sizes = DirectConv::of(op, &walk, samples, (rows, chunk), tile)?;
    let mma = kernels == ConvKernels::TensorCores;
    Ok(Some(DirectPlan { sizes, grid: (slices, blocks), threads, shared: floats * 4, mma }))
}

/// A weight gradient's layout, before its slices are counted: the band's rows, the channels staged, their
/// tile, blocks a band (the grid's y), threads a block and shared memory (floats).
struct WeightGradLayout {
    rows: usize,
    chunk: usize,
    tile: Tile,
    blocks: usize,
    threads: usize,
    floats: usize,
}

/// The pitches of a weight gradient's tiles of `rows` rows: a row pitch ≡ KW and a plane ≡ KH·KW (mod 32),
/// so that consecutive taps fall in consecutive banks.
fn weight_grad_tile(conv: &Conv2dShape, rows: usize) -> Tile {
    let (kh, kw, stride) = (conv.kernel_h, conv.kernel_w, conv.stride);
    let w = (conv.out_width - 1) * stride + kw;
    let (h, pitch) = ((rows - 1) * stride + kh, pitch_from(w, kw));
    Tile { h, w, pitch, plane: pitch_from(h * pitch, kh * kw) }
}

/// `nn_conv2d_direct_grad_weight`'s layout, or None where a band of one row does not fit.
fn fma_weight_grad_plan(conv: &Conv2dShape, samples: usize, sms: usize, with_bias: bool) -> Option<WeightGradLayout> {
    let (outputs, out_h, out_w) = (conv.out_channels, conv.out_height, conv.out_width);
    let (kh, kw) = (conv.kernel_h, conv.kernel_w);
    let columns = conv.taps() + with_bias as usize;
    // Thread pairs a block, 4 taps each: enough for the columns, whole warps, at most DIRECT_TAPS / 4.
    let lanes = columns.div_ceil(4).next_multiple_of(16).min(DIRECT_TAPS / 4);
    let blocks = outputs.div_ceil(GRAD_OUT) * columns.div_ceil(4 * lanes);
    let chunk = ((4 * lanes - 1) / (kh * kw) + 2).min(conv.channels);
    // dy [position][o], the staged channels, then a plane of ones for the bias's tap.
    let floats = |rows: usize| rows * out_w * GRAD_OUT + (chunk + 1) * weight_grad_tile(conv, rows).plane;
    let rows = band_rows(out_h, (samples * blocks, sms, WEIGHT_GRAD_BLOCKS_PER_SM), out_h);
    let rows = fitting_rows(rows, floats)?;
    let tile = weight_grad_tile(conv, rows);
    Some(WeightGradLayout { rows, chunk, tile, blocks, threads: 2 * lanes, floats: floats(rows) })
}

/// The row pitch of `nn_conv2d_mma_grad_weight`'s staged dy for bands of `rows` rows: their positions
/// rounded up to 8, ≡ 4 (mod 32), so that a warp's A fragments (8 channels × 4 positions) take distinct
/// banks.
fn mma_dy_pitch(rows: usize, out_w: usize) -> usize {
    pitch_from((rows * out_w).next_multiple_of(8), 4)
}

/// `nn_conv2d_mma_grad_weight`'s layout: as many warps as the columns' n8 tiles want, MMA_GRAD_TILES each,
/// at most a block's; None where a band of one row does not fit.
fn mma_weight_grad_plan(conv: &Conv2dShape, samples: usize, sms: usize, with_bias: bool) -> Option<WeightGradLayout> {
    let (outputs, out_h, out_w) = (conv.out_channels, conv.out_height, conv.out_width);
    let columns = conv.taps() + with_bias as usize;
    let warps = columns.div_ceil(8 * MMA_GRAD_TILES).min(WARPS);
    let per_block = warps * 8 * MMA_GRAD_TILES;
    let blocks = outputs.div_ceil(MMA_OUT) * columns.div_ceil(per_block);
    let chunk = ((per_block - 1) / (conv.kernel_h * conv.kernel_w) + 2).min(conv.channels);
    // dy [o][position], the staged channels, then a plane of ones for the bias's tap, then the positions'
    // offsets in the tile.
    let floats = |rows: usize| {
        let positions = (rows * out_w).next_multiple_of(8);
        MMA_OUT * mma_dy_pitch(rows, out_w) + (chunk + 1) * weight_grad_tile(conv, rows).plane + positions
    };
    let rows = band_rows(out_h, (samples * blocks, sms, WEIGHT_GRAD_BLOCKS_PER_SM), out_h);
    let rows = fitting_rows(rows, floats)?;
    let tile = weight_grad_tile(conv, rows);
    Some(WeightGradLayout { rows, chunk, tile, blocks, threads: warps * 32, floats: floats(rows) })
}

/// Whether `conv` over `samples` images takes the tensor-core kernels on `device` for its forward, its input
/// gradient and its weight gradient alike (with the kernels chosen now): the shapes on which the checks
/// hold `Precision::Tf32` to its twin.
pub(crate) fn all_on_tensor_cores(
    device: &Device,
    conv: &Conv2dShape,
    samples: usize,
    with_bias: bool,
) -> Result<bool> {
    const NAME: &str = "conv2d";
    let (sms, kernels) = (device.gpu.sm_count as usize, device.conv_kernels());
    let mma = |plan: Option<DirectPlan>| plan.is_some_and(|p| p.mma);
    Ok(mma(forward_plan(NAME, conv, samples, sms, kernels)?)
        && mma(input_grad_plan(NAME, conv, samples, sms, kernels)?)
        && mma(weight_grad_plan(NAME, conv, samples, sms, (with_bias, kernels))?))
}

impl Device {
    /// Which kernels fp32 convolutions take from now on. The checks run each.
    pub(crate) fn set_conv_kernels(&self, kernels: ConvKernels) {
        self.conv_kernels.store(kernels as u8, std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn conv_kernels(&self) -> ConvKernels {
        ConvKernels::from_u8(self.conv_kernels.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// What a window walk fuses into its stores (fused/nn.cu's `WindowEpilogue`): the forward's ReLU of its
/// result into `out` of its own, or the input gradient times the slope of the ReLU whose output `out` is the
/// convolution's input.
pub(super) enum WindowFusion<'a> {
    None,
    Relu {
        out: &'a DeviceBuffer,
    },
    /// The input gradient: `addend` added to each result, then times the slope of the ReLU whose output is
    /// `relu_out` (either may be absent).
    Gradient {
        addend: Option<&'a DeviceBuffer>,
        relu_out: Option<&'a DeviceBuffer>,
    },
    /// `sum` = `residual` + the result and `out` = its ReLU (a residual block's sum and the ReLU after it).
    ResidualRelu {
        residual: &'a DeviceBuffer,
        sum: &'a DeviceBuffer,
        out: &'a DeviceBuffer,
    },
}

/// `nn_conv2d_direct`, or `nn_conv2d_mma` for a tensor-core plan, by `plan`: `out` from `input` and
/// `weight` (+ `bias`), the forward or (a flipped plan) the input gradient, with `fusion` in its stores.
pub(super) fn launch_windows(
    device: &Arc<Device>,
    op: &'static str,
    plan: &DirectPlan,
    (input, weight, bias): (&DeviceBuffer, &DeviceBuffer, Option<&DeviceBuffer>),
    (out, fusion): (&DeviceBuffer, WindowFusion<'_>),
) -> Result<()> {
    let (activated, relu_out, residual, sum, addend) = match fusion {
        WindowFusion::None => (None, None, None, None, None),
        WindowFusion::Relu { out } => (Some(out), None, None, None, None),
        WindowFusion::Gradient { addend, relu_out } => (None, relu_out, None, None, addend),
        WindowFusion::ResidualRelu { residual, sum, out } => (Some(out), None, Some(residual), Some(sum), None),
    };
    let args = [device.arg(input), device.arg(weight), optional(device, bias), device.arg(out)];
    let epilogue = [activated, relu_out, residual, sum, addend].map(|b| optional(device, b));
    let args = [&args[..], &epilogue].concat();
    let launch = (launch_grid(op, plan.grid)?, plan.threads as u32, plan.shared as u32);
    let kernel = if plan.mma { &device.kernels.conv_mma } else { &device.kernels.conv_direct };
    device.launch_struct_sized(op, kernel, launch, &StructArg::of(&plan.sizes_on(device)), &args)
}

/// `nn_conv2d_direct_grad_weight`, or `nn_conv2d_mma_grad_weight` for a tensor-core plan, by `plan`: each
/// band's dw `[O, C·KH·KW]` and, with a plan made
/// `with_bias`, db `[O]` in a slice of its own, and the number of slices (which the caller adds in order).
pub(super) fn grad_weight_slices(
    device: &Arc<Device>,
    op: &'static str,
    plan: &DirectPlan,
    (dy, x): (&DeviceBuffer, &DeviceBuffer),
    (outputs, taps, with_bias): (usize, usize, bool),
) -> Result<(DeviceBuffer, Option<DeviceBuffer>, usize)> {
    let slices = plan.grid.0;
    let dw_parts = device.alloc(op, slices * outputs * taps)?;
    let db_parts = if with_bias { Some(device.alloc(op, slices * outputs)?) } else { None };
    let args = [device.arg(dy), device.arg(x), device.arg(&dw_parts), optional(device, db_parts.as_ref())];
    let launch = (launch_grid(op, plan.grid)?, plan.threads as u32, plan.shared as u32);
    let kernels = &device.kernels;
    let kernel = if plan.mma { &kernels.conv_mma_grad_weight } else { &kernels.conv_direct_grad_weight };
    device.launch_struct_sized(op, kernel, launch, &StructArg::of(&plan.sizes_on(device)), &args)?;
    Ok((dw_parts, db_parts, slices))
}

#[cfg(test)]
mod tests;
