//! The CPU twin of the convolution and max-pool kernels: a 2-D convolution (cross-correlation, as
//! PyTorch's `conv2d`) and a max pool over one sample's `[C][H][W]` values, forward and backward, on flat
//! row-major slices in PyTorch's layouts (weight `[O][C][KH][KW]`). It mirrors fused/fit.cu's
//! `conv_forward`, `conv_weight_partials`/`conv_backward_input`, `pool_forward`/`pool_backward`, and
//! fused/mnist_cnn.cu's `conv_at`, `conv_relu_pool` and the conv sums of `cnn_update`.
//!
//! Order of the sums (the same every run): an output starts from its bias (or 0) and adds weight·input
//! over its taps, input channel, then kernel row, then kernel column, skipping the taps that fall in the
//! padding. The backward walks the outputs in row-major order and, for each, adds its gradient to the
//! bias's, then over the same taps adds gradient·input to the weight's and gradient·weight to the
//! input's: a scatter, so a sample's input gradient sums in output order (the GPU gathers in kernel order
//! and rounds differently).
//!
//! The batch path (`forward_samples`, `backward_samples`, what `textnet fit`'s CPU reference and
//! `nn::conv2d` run) computes the same sums as matrix products through `crate::ops::cpu::gemm`, the kernel of
//! the dense layers: each sample's input is unfolded into a `[C·KH·KW][OH·OW]` matrix (`unfold`, zeros in
//! the padding), its output is W·unfold(x) plus the bias, the weight's gradient adds dy·unfold(x)ᵀ sample
//! after sample, and the input's gradient is Wᵀ·dy folded back (`fold_add`, in tap order, then output
//! position). `gemm`'s blocks set the order of each sum, fixed by the shapes alone, so a run repeats to
//! the bit; it is not the scalar loops' order above, and the two round differently.
//!
//! The max pool keeps the first largest element of each window in row-major window order (ties go to the
//! first); padding counts as −∞ and a NaN never wins (every comparison with it is false, as in the
//! kernels; PyTorch's would propagate the NaN). A window no element beats −∞ in (all −∞ or NaN) keeps its
//! first element inside the input (fit.cu's `pool_forward` keeps the sample's element 0 there). The
//! backward routes each output's gradient to its winner.

use crate::ops::cpu::{Mat, Real, gemm};
use num_traits::Float;
use std::ops::Range;

/// The inputs of one output along an axis: `start..start + kernel` less the padding, as input indices.
fn span(output: usize, stride: usize, padding: usize, kernel: usize, size: usize) -> Range<usize> {
    let start = output * stride;
    start.saturating_sub(padding)..(start + kernel).saturating_sub(padding).min(size)
}

/// `(size + 2·padding − kernel) / stride + 1`, the number of windows along an axis; None when the kernel
/// does not fit the padded input or the stride is 0.
fn windows(size: usize, kernel: usize, stride: usize, padding: usize) -> Option<usize> {
    let padded = size.checked_add(padding.checked_mul(2)?)?;
    (stride > 0 && kernel > 0 && kernel <= padded).then(|| (padded - kernel) / stride + 1)
}

/// The sizes of a 2-D convolution of one sample: `[channels][height][width]` in, `[out_channels]
/// [out_height][out_width]` out, a `kernel_h`×`kernel_w` kernel moved by `stride` over the input padded
/// by `padding` zeros on every side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dShape {
    /// Input channels C.
    pub channels: usize,
    /// Input height H.
    pub height: usize,
    /// Input width W.
    pub width: usize,
    /// Output channels O.
    pub out_channels: usize,
    /// Kernel height KH.
    pub kernel_h: usize,
    /// Kernel width KW.
    pub kernel_w: usize,
    /// Step between windows, both axes.
    pub stride: usize,
    /// Zeros added on each side, both axes.
    pub padding: usize,
    /// Output height, (H + 2·padding − KH) / stride + 1.
    pub out_height: usize,
    /// Output width, (W + 2·padding − KW) / stride + 1.
    pub out_width: usize,
}

/// Which gradients a convolution's backward adds to (each None when not wanted).
pub struct ConvGrads<'a, F> {
    /// The weight's, `[O][C][KH][KW]`.
    pub weight: Option<&'a mut [F]>,
    /// The bias's, `[O]`.
    pub bias: Option<&'a mut [F]>,
    /// The input's, `[C][H][W]`.
    pub input: Option<&'a mut [F]>,
}

/// What a convolution's backward does with an output whose gradient is zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroGrads {
    /// Adds its zero products like any other (fit.cu's kernels; a NaN or infinite input then gives NaN,
    /// as in PyTorch).
    Add,
    /// Skips it (mnist_cnn.cu's `cnn_update`, where ReLU and pooling leave most gradients at zero). The
    /// same bits for finite inputs: the products are zeros, and sums that start at +0 never become −0.
    Skip,
}

impl Conv2dShape {
    /// The convolution of these sizes; None when the kernel is empty or larger than the padded input, or
    /// the stride is 0.
    pub fn new(
        (channels, height, width): (usize, usize, usize),
        out_channels: usize,
        (kernel_h, kernel_w): (usize, usize),
        stride: usize,
        padding: usize,
    ) -> Option<Conv2dShape> {
        let out_height = windows(height, kernel_h, stride, padding)?;
        let out_width = windows(width, kernel_w, stride, padding)?;
        Some(Conv2dShape {
            channels,
            height,
            width,
            out_channels,
            kernel_h,
            kernel_w,
            stride,
            padding,
            out_height,
            out_width,
        })
    }

    /// Values of one input sample, C·H·W.
    pub fn input_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// Values of one output sample, O·OH·OW.
    pub fn output_len(&self) -> usize {
        self.out_channels * self.out_height * self.out_width
    }

    /// Weights of one output channel, C·KH·KW (its fan-in).
    pub fn taps(&self) -> usize {
        self.channels * self.kernel_h * self.kernel_w
    }

    /// Elements of the weight, O·C·KH·KW.
    pub fn weight_len(&self) -> usize {
        self.out_channels * self.taps()
    }

    /// Calls `visit(tap, at)` for every tap of output position (oy, ox) that lies inside the input, in the
    /// order input channel, kernel row, kernel column: `tap` its weight's offset within an output
    /// channel's `[C][KH][KW]`, `at` the input element's offset in `[C][H][W]`.
    #[inline]
    pub fn for_each_tap(&self, oy: usize, ox: usize, mut visit: impl FnMut(usize, usize)) {
        let rows = span(oy, self.stride, self.padding, self.kernel_h, self.height);
        let cols = span(ox, self.stride, self.padding, self.kernel_w, self.width);
        // Kernel row ky reads input row oy·stride + ky − padding.
        let (ky0, kx0) = (rows.start + self.padding - oy * self.stride, cols.start + self.padding - ox * self.stride);
        for ci in 0..self.channels {
            for (ky, iy) in (ky0..).zip(rows.clone()) {
                let tap_row = (ci * self.kernel_h + ky) * self.kernel_w;
                let input_row = (ci * self.height + iy) * self.width;
                for (kx, ix) in (kx0..).zip(cols.clone()) {
                    visit(tap_row + kx, input_row + ix);
                }
            }
        }
    }

    /// One sample's output `y` (`[O][OH][OW]`) from its input `x`, the weight `w` and the bias `b`.
    pub fn forward<F: Float>(&self, x: &[F], w: &[F], b: Option<&[F]>, y: &mut [F]) {
        let positions = self.out_height * self.out_width;
        for (co, plane) in y[..self.output_len()].chunks_exact_mut(positions.max(1)).enumerate() {
            let weights = &w[co * self.taps()..][..self.taps()];
            for (p, out) in plane.iter_mut().enumerate() {
                let mut acc = b.map_or(F::zero(), |b| b[co]);
                self.for_each_tap(p / self.out_width, p % self.out_width, |tap, at| acc = acc + weights[tap] * x[at]);
                *out = acc;
            }
        }
    }

    /// One sample's backward: from its input `x`, the weight `w` and its output's gradient `dy`, adds to
    /// each gradient `grads` holds (the input's for this sample; the weight's and bias's accumulate over
    /// the samples a caller feeds in turn).
    pub fn backward<F: Float>(&self, x: &[F], w: &[F], dy: &[F], grads: ConvGrads<'_, F>, zeros: ZeroGrads) {
        let ConvGrads { weight: mut gw, bias: mut gb, input: mut dx } = grads;
        let positions = self.out_height * self.out_width;
        for (co, plane) in dy[..self.output_len()].chunks_exact(positions.max(1)).enumerate() {
            let weights = &w[co * self.taps()..][..self.taps()];
            let mut gw = gw.as_deref_mut().map(|gw| &mut gw[co * self.taps()..][..self.taps()]);
            for (p, &g) in plane.iter().enumerate() {
                if zeros == ZeroGrads::Skip && g == F::zero() {
                    continue;
                }
                if let Some(gb) = gb.as_deref_mut() {
                    gb[co] = gb[co] + g;
                }
                self.for_each_tap(p / self.out_width, p % self.out_width, |tap, at| {
                    if let Some(gw) = gw.as_deref_mut() {
                        gw[tap] = gw[tap] + g * x[at];
                    }
                    if let Some(dx) = dx.as_deref_mut() {
                        dx[at] = dx[at] + g * weights[tap];
                    }
                });
            }
        }
    }
}

impl Conv2dShape {
    /// Output positions per channel, OH·OW.
    pub fn positions(&self) -> usize {
        self.out_height * self.out_width
    }

    /// Calls `visit(start, inside)` for each row of the unfolded input (tap, then output row): `start` is
    /// where its OW values begin in the `[C·KH·KW][OH·OW]` matrix; `inside` is None when the whole row
    /// reads padding, else the output columns that read the input and the input offset the first of them
    /// reads (the next ones read `stride` further on).
    fn for_each_unfolded_row(&self, mut visit: impl FnMut(usize, Option<(Range<usize>, usize)>)) {
        let (stride, padding) = (self.stride, self.padding);
        let mut start = 0;
        for ci in 0..self.channels {
            for ky in 0..self.kernel_h {
                for kx in 0..self.kernel_w {
                    // Output column ox reads input column ox·stride + kx − padding, inside for ox in lo..hi.
                    let lo = padding.saturating_sub(kx).div_ceil(stride).min(self.out_width);
                    let hi = (self.width + padding)
                        .checked_sub(kx)
                        .map_or(0, |end| end.div_ceil(stride))
                        .min(self.out_width);
                    for oy in 0..self.out_height {
                        let iy = (oy * stride + ky).checked_sub(padding).filter(|&iy| iy < self.height);
                        let inside = match iy {
                            Some(iy) if lo < hi => {
                                Some((lo..hi, (ci * self.height + iy) * self.width + lo * stride + kx - padding))
                            }
                            _ => None,
                        };
                        visit(start, inside);
                        start += self.out_width;
                    }
                }
            }
        }
    }

    /// One sample's input `x` unfolded into `col` (`[C·KH·KW][OH·OW]`): row `tap` holds the input element
    /// that tap reads at every output position, 0 where it reads the padding.
    pub fn unfold<F: Float>(&self, x: &[F], col: &mut [F]) {
        let (width, stride) = (self.out_width, self.stride);
        self.for_each_unfolded_row(|start, inside| {
            let row = &mut col[start..][..width];
            let Some((cols, first)) = inside else { return row.fill(F::zero()) };
            row[..cols.start].fill(F::zero());
            row[cols.end..].fill(F::zero());
            let row = &mut row[cols.clone()];
            if stride == 1 {
                row.copy_from_slice(&x[first..][..cols.len()]);
            } else {
                row.iter_mut().enumerate().for_each(|(k, v)| *v = x[first + k * stride]);
            }
        });
    }

    /// The transpose of `unfold`: adds each element of `col` that reads the input to the element it reads
    /// in `dx` (`[C][H][W]`).
    pub fn fold_add<F: Float>(&self, col: &[F], dx: &mut [F]) {
        let stride = self.stride;
        self.for_each_unfolded_row(|start, inside| {
            if let Some((cols, first)) = inside {
                for (k, &g) in col[start + cols.start..start + cols.end].iter().enumerate() {
                    dx[first + k * stride] = dx[first + k * stride] + g;
                }
            }
        });
    }

    /// The outputs `y` (`[N][O][OH][OW]`) of the samples `x` (`[N][C][H][W]`, N from its length), as
    /// products (module comment): each sample's W·unfold(x) added to its bias (or 0).
    pub fn forward_samples<F: Real>(&self, x: &[F], w: &[F], b: Option<&[F]>, y: &mut [F]) {
        let (taps, positions) = (self.taps(), self.positions());
        let weight = Mat::rows_of(w, self.out_channels, taps);
        let mut col = vec![F::zero(); taps * positions];
        for (x, y) in x.chunks_exact(self.input_len().max(1)).zip(y.chunks_exact_mut(self.output_len().max(1))) {
            self.unfold(x, &mut col);
            for (co, plane) in y.chunks_exact_mut(positions).enumerate() {
                plane.fill(b.map_or(F::zero(), |b| b[co]));
            }
            gemm(weight, Mat::rows_of(&col, taps, positions), F::one(), y);
        }
    }

    /// The backward of `forward_samples` from the samples `x`, the weight `w` and the outputs' gradient
    /// `dy`: adds to the weight's and bias's gradients sample after sample, and to each sample's input
    /// gradient (`grads.input` is `[N][C][H][W]`).
    pub fn backward_samples<F: Real>(&self, x: &[F], w: &[F], dy: &[F], grads: ConvGrads<'_, F>) {
        let ConvGrads { weight: mut gw, bias: mut gb, input: mut dx } = grads;
        let (taps, positions) = (self.taps(), self.positions());
        let weight_t = Mat::rows_of(w, self.out_channels, taps).t();
        let mut col = vec![F::zero(); taps * positions];
        let samples = x.chunks_exact(self.input_len().max(1)).zip(dy.chunks_exact(self.output_len().max(1)));
        for (s, (x, dy)) in samples.enumerate() {
            let dy_mat = Mat::rows_of(dy, self.out_channels, positions);
            if let Some(gb) = gb.as_deref_mut() {
                for (g, plane) in gb.iter_mut().zip(dy.chunks_exact(positions)) {
                    *g = plane.iter().fold(*g, |acc, &d| acc + d);
                }
            }
            if let Some(gw) = gw.as_deref_mut() {
                self.unfold(x, &mut col);
                gemm(dy_mat, Mat::rows_of(&col, taps, positions).t(), F::one(), &mut gw[..self.weight_len()]);
            }
            if let Some(dx) = dx.as_deref_mut() {
                gemm(weight_t, dy_mat, F::zero(), &mut col);
                self.fold_add(&col, &mut dx[s * self.input_len()..][..self.input_len()]);
            }
        }
    }
}

/// The sizes of a 2-D max pool of one sample: `[channels][height][width]` in, `[channels][out_height]
/// [out_width]` out, `kernel`×`kernel` windows moved by `stride` over the input padded by `padding` (−∞).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2dShape {
    /// Channels C.
    pub channels: usize,
    /// Input height H.
    pub height: usize,
    /// Input width W.
    pub width: usize,
    /// Window side.
    pub kernel: usize,
    /// Step between windows, both axes.
    pub stride: usize,
    /// −∞ added on each side, both axes.
    pub padding: usize,
    /// Output height, (H + 2·padding − kernel) / stride + 1.
    pub out_height: usize,
    /// Output width, (W + 2·padding − kernel) / stride + 1.
    pub out_width: usize,
}

impl MaxPool2dShape {
    /// The pool of these sizes; None when the kernel is empty or larger than the padded input, the stride
    /// is 0, or the padding is more than half the kernel (a window could then lie in the padding alone).
    pub fn new(
        (channels, height, width): (usize, usize, usize),
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Option<MaxPool2dShape> {
        if padding > kernel / 2 {
            return None;
        }
        let out_height = windows(height, kernel, stride, padding)?;
        let out_width = windows(width, kernel, stride, padding)?;
        Some(MaxPool2dShape { channels, height, width, kernel, stride, padding, out_height, out_width })
    }

    /// Values of one input sample, C·H·W.
    pub fn input_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// Values of one output sample, C·OH·OW.
    pub fn output_len(&self) -> usize {
        self.channels * self.out_height * self.out_width
    }

    /// The input offsets (in `[C][H][W]`) of the window of output `o` (in `[C][OH][OW]`) that lie inside
    /// the input, in row-major window order.
    pub fn window(&self, o: usize) -> impl Iterator<Item = usize> + use<> {
        let (c, oy, ox) =
            (o / (self.out_height * self.out_width), o / self.out_width % self.out_height, o % self.out_width);
        let rows = span(oy, self.stride, self.padding, self.kernel, self.height);
        let cols = span(ox, self.stride, self.padding, self.kernel, self.width);
        let (height, width) = (self.height, self.width);
        rows.flat_map(move |iy| cols.clone().map(move |ix| (c * height + iy) * width + ix))
    }

    /// One sample's pooled output `y` of `map` applied to each input value (the identity for a plain max
    /// pool; the MNIST CNN pools after ReLU), and each output's winner: its input offset in the sample.
    /// A row of outputs is formed together, each window's elements read in its row-major order.
    pub fn forward_mapped<F: Float>(&self, x: &[F], map: impl Fn(F) -> F, y: &mut [F], winners: &mut [u32]) {
        let (side, stride, padding) = (self.width, self.stride, self.padding);
        // Per output of a row: its best value so far and that value's input offset.
        let mut best = vec![(F::neg_infinity(), 0); self.out_width];
        let out_rows =
            y[..self.output_len()].chunks_exact_mut(self.out_width).zip(winners.chunks_exact_mut(self.out_width));
        for (r, (out, won)) in out_rows.enumerate() {
            let plane = r / self.out_height * self.height * side;
            let rows = span(r % self.out_height, stride, padding, self.kernel, self.height);
            // Padding ≤ kernel / 2, so every window holds an input element: it wins when no value beats −∞.
            for (ox, b) in best.iter_mut().enumerate() {
                *b =
                    (F::neg_infinity(), plane + rows.start * side + span(ox, stride, padding, self.kernel, side).start);
            }
            for iy in rows {
                let row = &x[plane + iy * side..][..side];
                for kx in 0..self.kernel {
                    for (ox, b) in best.iter_mut().enumerate() {
                        // Input column ox·stride + kx − padding; below 0 it wraps past the row's end.
                        let ix = (ox * stride + kx).wrapping_sub(padding);
                        if ix < side {
                            let v = map(row[ix]);
                            if v > b.0 {
                                *b = (v, plane + iy * side + ix);
                            }
                        }
                    }
                }
            }
            for ((o, w), &(v, at)) in out.iter_mut().zip(won.iter_mut()).zip(&best) {
                *o = v;
                *w = at as u32;
            }
        }
    }

    /// `forward_mapped` with no map: the max pool of `x`.
    pub fn forward<F: Float>(&self, x: &[F], y: &mut [F], winners: &mut [u32]) {
        self.forward_mapped(x, |v| v, y, winners);
    }

    /// One sample's backward: adds each output's gradient `dy` to its winner's in `dx`.
    pub fn backward<F: Float>(&self, dy: &[F], winners: &[u32], dx: &mut [F]) {
        for (&g, &at) in dy[..self.output_len()].iter().zip(winners) {
            dx[at as usize] = dx[at as usize] + g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_pytorchs_formula() {
        let conv = Conv2dShape::new((3, 13, 11), 5, (4, 4), 2, 2).unwrap();
        assert_eq!((conv.out_height, conv.out_width), (7, 6));
        assert_eq!(Conv2dShape::new((1, 3, 3), 1, (3, 3), 1, 0).map(|c| c.out_height), Some(1));
        assert_eq!(Conv2dShape::new((1, 3, 3), 1, (4, 3), 1, 0), None);
        assert_eq!(Conv2dShape::new((1, 3, 3), 1, (3, 3), 0, 0), None);
        let pool = MaxPool2dShape::new((2, 7, 5), 3, 2, 1).unwrap();
        assert_eq!((pool.out_height, pool.out_width), (4, 3));
        assert_eq!(MaxPool2dShape::new((2, 7, 5), 3, 2, 2), None);
    }

    /// Values in [−1, 1) that repeat only after `count`.
    fn values(count: usize, seed: usize) -> Vec<f64> {
        (0..count).map(|i| ((i * 7919 + seed * 104_729) % 2003) as f64 / 1001.5 - 1.0).collect()
    }

    #[test]
    fn the_products_compute_the_loops_sums() {
        // Stride 1 and 2, padding 0 to 2, non-square kernels, and a row wider than the padded input reads.
        let cases = [((2, 6, 5), 3, (3, 2), 1, 0), ((3, 7, 8), 4, (4, 3), 2, 2), ((1, 5, 5), 2, (2, 5), 3, 1)];
        for (input, out_channels, kernel, stride, padding) in cases {
            let conv = Conv2dShape::new(input, out_channels, kernel, stride, padding).unwrap();
            let samples = 3;
            let x = values(samples * conv.input_len(), 1);
            let (w, b) = (values(conv.weight_len(), 2), values(out_channels, 3));
            let dy = values(samples * conv.output_len(), 4);
            let mut y = vec![0.0; samples * conv.output_len()];
            conv.forward_samples(&x, &w, Some(&b), &mut y);
            let (mut gw, mut gb, mut dx) = (vec![0.0; w.len()], vec![0.0; b.len()], vec![0.0; x.len()]);
            let grads = ConvGrads { weight: Some(&mut gw[..]), bias: Some(&mut gb[..]), input: Some(&mut dx[..]) };
            conv.backward_samples(&x, &w, &dy, grads);

            let mut y_loops = vec![0.0; y.len()];
            let (mut gw_loops, mut gb_loops, mut dx_loops) =
                (vec![0.0; w.len()], vec![0.0; b.len()], vec![0.0; x.len()]);
            for s in 0..samples {
                let (xs, dys) =
                    (&x[s * conv.input_len()..][..conv.input_len()], &dy[s * conv.output_len()..][..conv.output_len()]);
                conv.forward(xs, &w, Some(&b), &mut y_loops[s * conv.output_len()..][..conv.output_len()]);
                let grads = ConvGrads {
                    weight: Some(&mut gw_loops[..]),
                    bias: Some(&mut gb_loops[..]),
                    input: Some(&mut dx_loops[s * conv.input_len()..][..conv.input_len()]),
                };
                conv.backward(xs, &w, dys, grads, ZeroGrads::Add);
            }
            for (name, got, want) in
                [("y", &y, &y_loops), ("dw", &gw, &gw_loops), ("db", &gb, &gb_loops), ("dx", &dx, &dx_loops)]
            {
                let worst = got.iter().zip(want.iter()).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                assert!(worst < 1e-12, "{name} of {conv:?}: {worst}");
                assert!(want.iter().any(|&v| v != 0.0), "{name} of {conv:?} is all zeros");
            }
        }
    }

    #[test]
    fn a_window_in_the_padding_corner_holds_only_inputs() {
        let pool = MaxPool2dShape::new((2, 5, 5), 3, 2, 1).unwrap();
        assert_eq!((pool.out_height, pool.out_width), (3, 3));
        assert_eq!(pool.window(0).collect::<Vec<_>>(), [0, 1, 5, 6]);
        assert_eq!(pool.window(4).collect::<Vec<_>>(), [6, 7, 8, 11, 12, 13, 16, 17, 18]);
        assert_eq!(pool.window(9 + 8).collect::<Vec<_>>(), [25 + 18, 25 + 19, 25 + 23, 25 + 24]);
    }
}
