//! conv2d's direct kernels (`nn_conv2d_direct` and `nn_conv2d_direct_grad_weight`, fused/nn.cu §"conv2d
//! direct"): where a band of an image's rows fits in shared memory, a block stages it once and reads every
//! window from it, in place of the implicit products (`conv.rs`), which stage each window element through
//! index arithmetic. This file plans them: whether a convolution takes them, its bands, how many channels
//! a block stages at a time, its grid and shared memory.
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
/// Threads a block (fused/common.cuh's THREADS).
const THREADS: usize = 256;
/// The shared memory a direct block takes, floats: 48 KiB, what any launch gets.
const DIRECT_SHARED_FLOATS: usize = 12 * 1024;
/// The most result channels a direct convolution has; more fill the implicit products' tiles.
const DIRECT_MAX_CHANNELS: usize = 64;
/// The most floats the weight gradient's slices take together (64 MiB).
const DIRECT_MAX_PARTIALS: usize = 16 << 20;
/// Blocks an SM the forward's (and input gradient's) bands aim for, and the weight gradient's, where the
/// images allow: a weight-gradient block has fewer threads at work (8 channels × 4 taps each).
const WINDOW_BLOCKS_PER_SM: usize = 2;
const WEIGHT_GRAD_BLOCKS_PER_SM: usize = 4;

kernel_struct! {
    /// One direct convolution (`DirectConv` in fused/nn.cu): the operand read through windows, `in`
    /// `[N, in_channels, in_h, in_w]`, the result `[N, out_channels, out_h, out_w]`, `band_rows` output rows
    /// a block (`bands` of them), `chunk` input channels staged at a time in tiles of `tile_h × tile_w`, rows
    /// `pitch` floats apart and channels `plane` apart (padded so that a warp's reads take distinct banks).
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

/// A direct launch: its sizes, grid, threads a block and dynamic shared memory (bytes).
pub(super) struct DirectPlan {
    sizes: DirectConv,
    grid: (usize, usize),
    threads: usize,
    shared: usize,
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
    // Of the bands from half that tall up, the one whose blocks leave the fewest threads idle (a block's
    // threads are whole warps), then the one that cuts the image evenly.
    let idle = |r: usize| (out_h.div_ceil(r) * window_threads(splits, r, groups), out_h.div_ceil(r) * r - out_h);
    let rows = (tallest.div_ceil(2)..=tallest).min_by_key(|&r| (idle(r), std::cmp::Reverse(r))).unwrap_or(tallest);
    let chunk = (DIRECT_SHARED_FLOATS / per_channel(rows)).min(channels).max(1);
    let sizes = DirectConv::of(op, walk, samples, (rows, chunk), tile(rows))?;
    let grid = (samples * out_h.div_ceil(rows), o_blocks);
    let threads = window_threads(splits, rows, groups);
    Ok(Some(DirectPlan { sizes, grid, threads, shared: chunk * per_channel(rows) * 4 }))
}

/// The forward's direct plan, or None (`window_plan`).
pub(super) fn forward_plan(
    op: &'static str,
    conv: &Conv2dShape,
    samples: usize,
    sms: usize,
) -> Result<Option<DirectPlan>> {
    let walk = Walk {
        input: (conv.channels, conv.height, conv.width),
        output: (conv.out_channels, conv.out_height, conv.out_width),
        kernel: (conv.kernel_h, conv.kernel_w),
        stride: conv.stride,
        pad: (conv.padding as isize, conv.padding as isize),
        flip: false,
    };
    window_plan(op, &walk, samples, sms)
}

/// The input gradient's direct plan at stride 1 (the forward's walk over dy, the kernel flipped, padding KH
/// − 1 − p and KW − 1 − p), or None.
pub(super) fn input_grad_plan(
    op: &'static str,
    conv: &Conv2dShape,
    samples: usize,
    sms: usize,
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
    window_plan(op, &walk, samples, sms)
}

/// The weight gradient's direct plan (`with_bias`: a column of ones after the taps), or None where it has
/// more output channels than [`DIRECT_MAX_CHANNELS`], a band of one row does not fit, or the slices would
/// take more than [`DIRECT_MAX_PARTIALS`] floats.
pub(super) fn weight_grad_plan(
    op: &'static str,
    conv: &Conv2dShape,
    samples: usize,
    sms: usize,
    with_bias: bool,
) -> Result<Option<DirectPlan>> {
    let (outputs, out_h, out_w) = (conv.out_channels, conv.out_height, conv.out_width);
    let (kh, kw, stride) = (conv.kernel_h, conv.kernel_w, conv.stride);
    if outputs > DIRECT_MAX_CHANNELS || samples == 0 || out_h == 0 || out_w == 0 {
        return Ok(None);
    }
    let (taps, columns) = (conv.taps(), conv.taps() + with_bias as usize);
    // Thread pairs a block, 4 taps each: enough for the columns, whole warps, at most DIRECT_TAPS / 4.
    let lanes = columns.div_ceil(4).next_multiple_of(16).min(DIRECT_TAPS / 4);
    let blocks = outputs.div_ceil(GRAD_OUT) * columns.div_ceil(4 * lanes);
    let chunk = ((4 * lanes - 1) / (kh * kw) + 2).min(conv.channels);
    let tile_w = (out_w - 1) * stride + kw;
    // A warp's threads take consecutive taps: a row pitch ≡ KW and a plane ≡ KH·KW put them in consecutive
    // banks.
    let pitch = pitch_from(tile_w, kw);
    let tile = |rows: usize| {
        let h = (rows - 1) * stride + kh;
        Tile { h, w: tile_w, pitch, plane: pitch_from(h * pitch, kh * kw) }
    };
    // The staged channels, then a plane of ones for the bias's tap.
    let floats = |rows: usize| rows * out_w * GRAD_OUT + (chunk + 1) * tile(rows).plane;
    let rows = band_rows(out_h, (samples * blocks, sms, WEIGHT_GRAD_BLOCKS_PER_SM), out_h);
    let Some(rows) = fitting_rows(rows, floats) else { return Ok(None) };
    let slices = samples * out_h.div_ceil(rows);
    if slices.saturating_mul(outputs * (taps + 1)) > DIRECT_MAX_PARTIALS {
        return Ok(None);
    }
    let walk = Walk {
        input: (conv.channels, conv.height, conv.width),
        output: (outputs, out_h, out_w),
        kernel: (kh, kw),
        stride,
        pad: (conv.padding as isize, conv.padding as isize),
        flip: false,
    };
    let sizes = DirectConv::of(op, &walk, samples, (rows, chunk), tile(rows))?;
    Ok(Some(DirectPlan { sizes, grid: (slices, blocks), threads: 2 * lanes, shared: floats(rows) * 4 }))
}

impl Device {
    /// Whether fp32 convolutions take the direct kernels where they fit; off, the implicit products take
    /// every one. The checks run both.
    pub(crate) fn set_direct_convs(&self, on: bool) {
        self.direct_convs.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub(super) fn direct_convs(&self) -> bool {
        self.direct_convs.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// `nn_conv2d_direct` by `plan`: `out` from `input` and `weight` (+ `bias`), the forward or (a flipped plan)
/// the input gradient.
pub(super) fn launch_windows(
    device: &Arc<Device>,
    op: &'static str,
    plan: &DirectPlan,
    (input, weight, bias): (&DeviceBuffer, &DeviceBuffer, Option<&DeviceBuffer>),
    out: &DeviceBuffer,
) -> Result<()> {
    let args = [device.arg(input), device.arg(weight), optional(device, bias), device.arg(out)];
    let launch = (launch_grid(op, plan.grid)?, plan.threads as u32, plan.shared as u32);
    device.launch_struct_sized(op, &device.kernels.conv_direct, launch, &StructArg::of(&plan.sizes), &args)
}

/// `nn_conv2d_direct_grad_weight` by `plan`: each band's dw `[O, C·KH·KW]` and, with a plan made
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
    let kernel = &device.kernels.conv_direct_grad_weight;
    device.launch_struct_sized(op, kernel, launch, &StructArg::of(&plan.sizes), &args)?;
    Ok((dw_parts, db_parts, slices))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::compile::kernel_constants;
    use crate::device::kernel_struct::assert_kernel_layout;
    use crate::nn::checks::CONV_CHECKS;

    /// The ResNet example's convolutions (the stem and a block's), as nn/checks.rs's CONV_CHECKS.
    const RESNET: [([usize; 4], [usize; 4], usize, usize); 2] =
        [([128, 1, 28, 28], [16, 1, 3, 3], 1, 1), ([128, 16, 28, 28], [16, 16, 3, 3], 1, 1)];

    fn shape(x: [usize; 4], w: [usize; 4], stride: usize, padding: usize) -> Conv2dShape {
        Conv2dShape::new((x[1], x[2], x[3]), w[0], (w[2], w[3]), stride, padding).unwrap()
    }

    /// A plan's bands cover the result's rows, none empty; its blocks fit their threads and shared memory.
    fn assert_fits(plan: &DirectPlan, what: &str) {
        let v = &plan.sizes;
        let (rows, bands, out_h) = (v.band_rows as usize, v.bands as usize, v.out_h as usize);
        assert!(rows >= 1 && bands * rows >= out_h && (bands - 1) * rows < out_h, "{what}: bands {v:?}");
        assert_eq!(plan.grid.0, v.samples as usize * bands, "{what}: a block a sample's band");
        assert!(plan.threads <= THREADS && plan.threads.is_multiple_of(32), "{what}: {} threads", plan.threads);
        assert!(plan.shared <= DIRECT_SHARED_FLOATS * 4 && v.chunk >= 1, "{what}: {v:?}");
        let tile_h = (rows - 1) * v.stride as usize + v.kernel_h as usize;
        assert_eq!(v.tile_h as usize, tile_h, "{what}: the tile's rows");
        assert!(v.pitch >= v.tile_w && v.plane >= v.tile_h * v.pitch, "{what}: the pitches {v:?}");
    }

    #[test]
    fn the_plans_cover_every_row_and_tap_and_fit_their_blocks() {
        let (mut direct, mut banded, mut implicit) = (0, 0, 0);
        for (x, w, stride, padding) in CONV_CHECKS.into_iter().chain(RESNET) {
            let conv = shape(x, w, stride, padding);
            for sms in [1, 8, 132] {
                let what = format!("{x:?} * {w:?} stride {stride} padding {padding} on {sms} SMs");
                let plans = [
                    forward_plan("t", &conv, x[0], sms).unwrap(),
                    input_grad_plan("t", &conv, x[0], sms).unwrap(),
                    weight_grad_plan("t", &conv, x[0], sms, true).unwrap(),
                ];
                for plan in plans.iter().flatten() {
                    assert_fits(plan, &what);
                    banded += (plan.sizes.band_rows > 1 && plan.sizes.bands > 1 && sms == 132) as usize;
                }
                direct += plans.iter().flatten().count();
                implicit += plans.iter().filter(|p| p.is_none()).count();
                if let Some(plan) = &plans[0] {
                    let groups = conv.out_width.div_ceil(DIRECT_PX);
                    let splits = conv.out_channels.div_ceil(DIRECT_OUT).min(DIRECT_SPLIT);
                    let wanted = splits * plan.sizes.band_rows as usize * groups;
                    assert!(plan.threads >= wanted, "{what}: a thread a row's group and split");
                    let channels = plan.grid.1 * DIRECT_SPLIT * DIRECT_OUT;
                    assert!(channels >= conv.out_channels, "{what}: the blocks' channels");
                    assert!(plan.sizes.tile_w as usize >= (4 * groups - 1) * stride + conv.kernel_w, "{what}");
                }
                if let Some(plan) = &plans[2] {
                    // The channels a block's taps span, from its first tap's, are staged.
                    let (khw, taps) = (conv.kernel_h * conv.kernel_w, conv.taps());
                    let per_block = 2 * plan.threads;
                    for t0 in (0..=taps).step_by(per_block) {
                        let last = (t0 + per_block - 1).min(taps - 1) / khw;
                        assert!(last - t0.min(taps - 1) / khw < plan.sizes.chunk as usize, "{what}: taps from {t0}");
                    }
                    assert!(plan.grid.1 * per_block >= (taps + 1) * conv.out_channels.div_ceil(GRAD_OUT));
                }
            }
        }
        // The selftest reaches both paths, and bands of several rows on an H200.
        assert!(direct > 40 && implicit > 10 && banded >= 4, "{direct} direct, {implicit} implicit, {banded} banded");
    }

    /// At stride 1, a warp's reads of the staged tile fall in distinct banks: the forward's threads
    /// (consecutive row, g; a quarter warp's float4s where a 3×3 walk packs its positions) and the weight
    /// gradient's (consecutive taps).
    #[test]
    fn a_warps_reads_take_distinct_banks() {
        let distinct = |words: Vec<usize>| {
            let banks: std::collections::BTreeSet<usize> = words.iter().map(|w| w % 32).collect();
            banks.len() == words.len()
        };
        let distinct_quads = |words: Vec<usize>| {
            let quads: std::collections::BTreeSet<usize> = words.iter().map(|w| w % 32 / 4).collect();
            quads.len() == words.len()
        };
        let mut seen = 0;
        for (x, w, stride, padding) in CONV_CHECKS.into_iter().chain(RESNET).filter(|c| c.2 == 1) {
            let conv = shape(x, w, stride, padding);
            let what = format!("{x:?} * {w:?} padding {padding}");
            if let Some(plan) = forward_plan("t", &conv, x[0], 132).unwrap() {
                let v = &plan.sizes;
                let groups = (v.out_w as usize).div_ceil(DIRECT_PX);
                let lanes = (v.band_rows as usize * groups).min(32);
                let word = |k: usize| k / groups * v.pitch as usize;
                if (v.kernel_h, v.kernel_w) == (3, 3) {
                    // Packed: a quarter warp's float4s, DIRECT_PX words each, take distinct banks.
                    assert!(v.pitch % 4 == 0 && v.plane % 4 == 0, "{what}: float4s unaligned {v:?}");
                    for quarter in (0..lanes).collect::<Vec<_>>().chunks(8) {
                        let words = quarter.iter().map(|&k| word(k) + DIRECT_PX * (k % groups)).collect();
                        assert!(distinct_quads(words), "{what}: packed forward {v:?}");
                    }
                } else {
                    assert!(distinct((0..lanes).map(|k| word(k) + k % groups).collect()), "{what}: forward {v:?}");
                }
                seen += 1;
            }
            if let Some(plan) = weight_grad_plan("t", &conv, x[0], 132, true).unwrap() {
                let v = &plan.sizes;
                let (kh, kw) = (v.kernel_h as usize, v.kernel_w as usize);
                let lanes = (conv.taps()).min(32);
                let words = (0..lanes)
                    .map(|t| t / (kh * kw) * v.plane as usize + t % (kh * kw) / kw * v.pitch as usize + t % kw)
                    .collect();
                assert!(distinct(words), "{what}: weight gradient {v:?}");
                seen += 1;
            }
        }
        assert!(seen >= 10, "{seen} plans");
    }

    #[test]
    fn the_direct_sizes_are_the_kernel_files() {
        assert_kernel_layout::<DirectConv>("nn", &[]);
        let names = ["DIRECT_OUT", "DIRECT_SPLIT", "GRAD_OUT", "DIRECT_PX", "DIRECT_TAPS", "THREADS"];
        let kernel = kernel_constants("nn", &[], &names).unwrap();
        let rust = [DIRECT_OUT, DIRECT_SPLIT, GRAD_OUT, DIRECT_PX, DIRECT_TAPS, THREADS].map(|v| v as i64);
        assert_eq!(kernel, rust);
    }
}
