//! direct_conv.rs's tests: the plans cover their results and fit their blocks, a warp's reads take distinct
//! banks, and the sizes agree with fused/nn.cu's.

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

/// The plans of `kernels` for `conv` over `samples` on `sms` SMs: the forward's, the input gradient's and
/// the weight gradient's (with a bias).
fn plans(conv: &Conv2dShape, samples: usize, sms: usize, kernels: ConvKernels) -> [Option<DirectPlan>; 3] {
    [
        forward_plan("t", conv, samples, sms, kernels).unwrap(),
        input_grad_plan("t", conv, samples, sms, kernels).unwrap(),
        weight_grad_plan("t", conv, samples, sms, (true, kernels)).unwrap(),
    ]
}

/// Each convolution of the checks and the ResNet on 1, 8 and 132 SMs: (its shape, its images, the SMs, its
/// name for an assertion).
fn cases() -> impl Iterator<Item = (Conv2dShape, usize, usize, String)> {
    CONV_CHECKS.into_iter().chain(RESNET).flat_map(|(x, w, stride, padding)| {
        [1, 8, 132].map(|sms| {
            let what = format!("{x:?} * {w:?} stride {stride} padding {padding} on {sms} SMs");
            (shape(x, w, stride, padding), x[0], sms, what)
        })
    })
}

#[test]
fn the_plans_cover_every_row_and_tap_and_fit_their_blocks() {
    let (mut direct, mut banded, mut implicit) = (0, 0, 0);
    for (conv, samples, sms, what) in cases() {
        assert!(plans(&conv, samples, sms, ConvKernels::Implicit).iter().all(Option::is_none), "{what}");
        let plans = plans(&conv, samples, sms, ConvKernels::Fma);
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
            assert!(plan.sizes.tile_w as usize >= (4 * groups - 1) * conv.stride + conv.kernel_w, "{what}");
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
    // The selftest reaches both paths, and bands of several rows on an H200.
    assert!(direct > 40 && implicit > 10 && banded >= 4, "{direct} direct, {implicit} implicit, {banded} banded");
}

#[test]
fn the_tensor_core_plans_cover_every_position_and_tap_and_fit_their_blocks() {
    let (mut direct, mut banded, mut chunked) = (0, 0, 0);
    for (conv, samples, sms, what) in cases() {
        let plans = plans(&conv, samples, sms, ConvKernels::TensorCores);
        for plan in plans.iter().flatten() {
            assert_fits(plan, &what);
            assert!(plan.mma, "{what}");
            banded += (plan.sizes.band_rows > 1 && plan.sizes.bands > 1 && sms == 132) as usize;
        }
        direct += plans.iter().flatten().count();
        for plan in plans[..2].iter().flatten() {
            // The warps' m-tiles take the band's positions; the blocks' channels the result's.
            let v = &plan.sizes;
            let positions = (v.band_rows * v.out_w) as usize;
            assert!(plan.threads / 32 * MMA_TILES * 16 >= positions, "{what}: {positions} positions");
            assert!(plan.grid.1 * MMA_OUT >= v.out_channels as usize, "{what}: the blocks' channels");
            assert!(v.tile_w >= (v.out_w - 1) * v.stride + v.kernel_w, "{what}: the tile's columns");
            let k_pad = ((v.chunk * v.kernel_h * v.kernel_w) as usize).next_multiple_of(8);
            // The tile up to 3 floats on, so that the input's first column is 16-byte aligned.
            let floats = k_pad * (MMA_WEIGHT_PITCH + 1) + v.chunk as usize * v.plane as usize + 4;
            // Or the results on their way out, MMA_OUT rows of the block's positions, where they take more.
            let most = plan.threads / 32 * MMA_TILES * 16;
            let result_pitch = most + (36 - most % 32) % 32;
            assert_eq!(plan.shared, floats.max(MMA_OUT * result_pitch) * 4, "{what}: the shared memory");
            assert!(conflict_free(|gid, tig| 2 * tig * result_pitch + gid), "{what}: the results' stores");
            chunked += (v.chunk < v.in_channels) as usize;
        }
        if let Some(plan) = &plans[2] {
            // The channels a block's taps span, from its first tap's, are staged.
            let (khw, taps) = (conv.kernel_h * conv.kernel_w, conv.taps());
            let per_block = plan.threads / 32 * 8 * MMA_GRAD_TILES;
            for t0 in (0..=taps).step_by(per_block) {
                let last = (t0 + per_block - 1).min(taps) / khw;
                let staged = plan.sizes.chunk as usize + (last == conv.channels) as usize;
                assert!(last - t0.min(taps - 1) / khw < staged, "{what}: taps from {t0}");
            }
            assert!(plan.grid.1 * per_block >= (taps + 1) * conv.out_channels.div_ceil(MMA_OUT));
        }
    }
    assert!(direct > 40 && banded >= 4 && chunked >= 1, "{direct} direct, {banded} banded, {chunked} chunked");
}

/// The words a warp's lanes read, each lane's from `word(gid, tig)`, fall in distinct banks but where
/// two lanes read the same word (a broadcast).
fn conflict_free(word: impl Fn(usize, usize) -> usize) -> bool {
    let mut banks = std::collections::BTreeMap::new();
    (0..32).all(|lane| {
        let w = word(lane / 4, lane % 4);
        *banks.entry(w % 32).or_insert(w) == w
    })
}

/// On the tensor cores at stride 1 with a 3×3 kernel, a warp's A and B fragments take distinct banks:
/// the forward's A (8 positions × 4 taps of the tile) at every k-step of every m-tile of the ResNet's
/// band, its B (4 taps × 8 channels of the weights) and the weight gradient's A (8 channels × 4
/// positions of dy).
#[test]
fn the_tensor_cores_fragments_take_distinct_banks() {
    for (x, w, stride, padding) in CONV_CHECKS.into_iter().chain(RESNET).filter(|c| c.2 == 1 && c.1[2..] == [3, 3]) {
        let conv = shape(x, w, stride, padding);
        let what = format!("{x:?} * {w:?} padding {padding}");
        let [forward, _, weight_grad] = plans(&conv, x[0], 132, ConvKernels::TensorCores);
        if let Some(plan) = forward {
            let v = &plan.sizes;
            let (pitch, plane, out_w) = (v.pitch as usize, v.plane as usize, v.out_w as usize);
            let offset = |k: usize| k / 9 * plane + k % 9 / 3 * pitch + k % 3;
            let at = |p: usize| p / out_w * pitch + p % out_w;
            let positions = v.band_rows as usize * out_w;
            for m in (0..positions.next_multiple_of(16)).step_by(16) {
                for k in (0..v.chunk as usize * 9).step_by(8).filter(|k| k + 8 <= v.chunk as usize * 9) {
                    for h in [0, 8] {
                        let word = |gid: usize, tig: usize| at((m + gid + h).min(positions - 1)) + offset(k + tig);
                        assert!(conflict_free(word), "{what}: the forward's A at position {m} tap {k} {v:?}");
                    }
                }
            }
            assert!(conflict_free(|gid, tig| tig * MMA_WEIGHT_PITCH + gid), "the forward's B");
        }
        if let Some(plan) = weight_grad {
            let pitch = mma_dy_pitch(plan.sizes.band_rows as usize, plan.sizes.out_w as usize);
            assert!(conflict_free(|gid, tig| gid * pitch + tig), "{what}: the weight gradient's A");
        }
    }
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
        if let Some(plan) = forward_plan("t", &conv, x[0], 132, ConvKernels::Fma).unwrap() {
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
        if let Some(plan) = weight_grad_plan("t", &conv, x[0], 132, (true, ConvKernels::Fma)).unwrap() {
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
    let names = [
        "DIRECT_OUT",
        "DIRECT_SPLIT",
        "GRAD_OUT",
        "DIRECT_PX",
        "DIRECT_TAPS",
        "THREADS",
        "MMA_OUT",
        "MMA_TILES",
        "MMA_GRAD_TILES",
        "MMA_WEIGHT_PITCH",
    ];
    let kernel = kernel_constants("nn", &[], &names).unwrap();
    let rust = [
        DIRECT_OUT,
        DIRECT_SPLIT,
        GRAD_OUT,
        DIRECT_PX,
        DIRECT_TAPS,
        THREADS,
        MMA_OUT,
        MMA_TILES,
        MMA_GRAD_TILES,
        MMA_WEIGHT_PITCH,
    ]
    .map(|v| v as i64);
    assert_eq!(kernel, rust);
}
