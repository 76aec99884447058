//! `textnet::nn`'s layout ops (`permute`, `narrow`/`slice`, `cat`) and image ops (`conv2d`, `max_pool2d`)
//! against central finite differences in f64, for every input: odd sizes, size-1 axes, N = 1, C = 1,
//! stride 2, padding 1, a kernel of 1 and a kernel as large as the input, negative axes, a `cat` of three
//! with an empty piece. The image ops' forward against plain loops written here from PyTorch's
//! definitions; max pooling's ties and padding; each bad input's one-line error; the `Conv2d` and
//! `MaxPool2d` modules.

use crate::common::gradcheck::{check, fails_with, input};
use crate::common::relative;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use textnet::nn::{Conv2d, MaxPool2d, Module, Tensor, cat, conv2d, max_pool2d};
use textnet::ops::cpu::{SeededRng, linear_init};

#[test]
fn permute_matches_finite_differences_and_moves_the_elements() {
    let mut rng = SeededRng::seed_from_u64(21);
    let cases: [(&[usize], &[isize]); 6] = [
        (&[2, 3, 4], &[2, 0, 1]),
        (&[2, 3, 4], &[-1, 0, -2]),
        (&[3, 5], &[1, 0]),
        (&[7], &[0]),
        (&[1, 3, 1, 5], &[3, 1, 0, 2]),
        (&[2, 1, 3], &[0, 1, 2]),
    ];
    for (shape, axes) in cases {
        check("permute", &[input(&mut rng, shape, -2.0, 2.0, 0.0)], &|t| t[0].permute(axes));
    }
    // Output axis i is input axis axes[i]: element [i][j][k] of x is [k][i][j] of x.permute([2, 0, 1]).
    let x = Tensor::from_vec((0..24).map(f64::from).collect(), &[2, 3, 4]).unwrap();
    let y = x.permute(&[2, 0, 1]).unwrap();
    assert_eq!(y.shape(), [4, 2, 3]);
    let (xs, ys) = (x.to_vec(), y.to_vec());
    for (i, j, k) in (0..2).flat_map(|i| (0..3).flat_map(move |j| (0..4).map(move |k| (i, j, k)))) {
        assert_eq!(xs[(i * 3 + j) * 4 + k], ys[(k * 2 + i) * 3 + j]);
    }
    assert_eq!(x.permute(&[0, 2, 1]).unwrap().to_vec(), x.transpose(1, 2).unwrap().to_vec());
}

#[test]
fn narrow_and_slice_match_finite_differences_and_take_the_run() {
    let mut rng = SeededRng::seed_from_u64(22);
    let cases: [(&[usize], isize, usize, usize); 6] = [
        (&[5, 3], 0, 1, 3),
        (&[5, 3], -1, 2, 1),
        (&[2, 7, 3], 1, 2, 5),
        (&[2, 1, 3], 1, 0, 1),
        (&[3, 4], 1, 4, 0),
        (&[9], -1, 0, 9),
    ];
    for (shape, axis, start, len) in cases {
        let x = input(&mut rng, shape, -2.0, 2.0, 0.0);
        check("narrow", std::slice::from_ref(&x), &|t| t[0].narrow(axis, start, len));
        check("slice", &[x], &|t| t[0].slice(axis, start..start + len));
    }
    let x = Tensor::from_vec((0..12).map(f64::from).collect(), &[3, 4]).unwrap();
    let y = x.narrow(-1, 1, 2).unwrap();
    assert_eq!((y.shape(), y.to_vec()), (&[3, 2][..], vec![1.0, 2.0, 5.0, 6.0, 9.0, 10.0]));
    assert_eq!(x.slice(0, 2..3).unwrap().to_vec(), [8.0, 9.0, 10.0, 11.0]);
}

#[test]
fn cat_matches_finite_differences_and_joins_in_order() {
    let mut rng = SeededRng::seed_from_u64(23);
    let cases: [(&[&[usize]], isize); 5] = [
        (&[&[2, 3, 2], &[2, 0, 2], &[2, 5, 2]], 1),
        (&[&[3, 1], &[3, 4], &[3, 2]], -1),
        (&[&[1, 3], &[4, 3]], 0),
        (&[&[5]], 0),
        (&[&[2, 1, 3], &[2, 1, 3], &[2, 1, 3]], -3),
    ];
    for (shapes, axis) in cases {
        let inputs: Vec<_> = shapes.iter().map(|s| input(&mut rng, s, -2.0, 2.0, 0.0)).collect();
        check("cat", &inputs, &|t| cat(&t.iter().collect::<Vec<_>>(), axis));
    }
    // The same tensor twice: its gradient is the sum of both places.
    check("cat (x, x)", &[input(&mut rng, &[2, 3], -2.0, 2.0, 0.0)], &|t| cat(&[&t[0], &t[0]], 1));
    let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let b = Tensor::from_vec(vec![5.0f64, 6.0], &[2, 1]).unwrap();
    let empty = Tensor::<f64>::zeros(&[2, 0]).unwrap();
    let joined = cat(&[&a, &empty, &b], -1).unwrap();
    assert_eq!((joined.shape(), joined.to_vec()), (&[2, 3][..], vec![1.0, 2.0, 5.0, 3.0, 4.0, 6.0]));
}

/// PyTorch's conv2d written out: out[n][o][y][x] = b[o] + Σ_{c,ky,kx} w[o][c][ky][kx]·x[n][c][y·s+ky−p][x·s+kx−p],
/// zero outside the input.
fn naive_conv2d(x: &Tensor<f64>, w: &Tensor<f64>, b: Option<&Tensor<f64>>, stride: usize, pad: usize) -> Vec<f64> {
    let ([n, c, h, wd], [o, _, kh, kw]) =
        (<[usize; 4]>::try_from(x.shape()).unwrap(), <[usize; 4]>::try_from(w.shape()).unwrap());
    let (xs, ws, bs) = (x.to_vec(), w.to_vec(), b.map(|b| b.to_vec()));
    let (oh, ow) = ((h + 2 * pad - kh) / stride + 1, (wd + 2 * pad - kw) / stride + 1);
    let mut out = Vec::new();
    for (s, co, oy, ox) in (0..n)
        .flat_map(|s| (0..o).flat_map(move |co| (0..oh).flat_map(move |oy| (0..ow).map(move |ox| (s, co, oy, ox)))))
    {
        let mut sum = bs.as_ref().map_or(0.0, |b| b[co]);
        for (ci, ky, kx) in (0..c).flat_map(|ci| (0..kh).flat_map(move |ky| (0..kw).map(move |kx| (ci, ky, kx)))) {
            let (iy, ix) = ((oy * stride + ky) as isize - pad as isize, (ox * stride + kx) as isize - pad as isize);
            if (0..h as isize).contains(&iy) && (0..wd as isize).contains(&ix) {
                sum +=
                    ws[((co * c + ci) * kh + ky) * kw + kx] * xs[((s * c + ci) * h + iy as usize) * wd + ix as usize];
            }
        }
        out.push(sum);
    }
    out
}

/// PyTorch's max_pool2d written out: the largest of each window over the input padded with −∞.
fn naive_max_pool2d(x: &Tensor<f64>, k: usize, stride: usize, pad: usize) -> Vec<f64> {
    let [n, c, h, w] = <[usize; 4]>::try_from(x.shape()).unwrap();
    let xs = x.to_vec();
    let (oh, ow) = ((h + 2 * pad - k) / stride + 1, (w + 2 * pad - k) / stride + 1);
    let mut out = Vec::new();
    for plane in 0..n * c {
        for (oy, ox) in (0..oh).flat_map(|oy| (0..ow).map(move |ox| (oy, ox))) {
            let mut best = f64::NEG_INFINITY;
            for (ky, kx) in (0..k).flat_map(|ky| (0..k).map(move |kx| (ky, kx))) {
                let (iy, ix) = ((oy * stride + ky) as isize - pad as isize, (ox * stride + kx) as isize - pad as isize);
                if (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix) {
                    best = best.max(xs[(plane * h + iy as usize) * w + ix as usize]);
                }
            }
            out.push(best);
        }
    }
    out
}

/// (input `[N, C, H, W]`, out channels, (KH, KW), stride, padding, bias): fixed edge cases, then seeded
/// random ones.
type ConvCase = ([usize; 4], usize, (usize, usize), usize, usize, bool);

fn conv_cases(rng: &mut SeededRng) -> Vec<ConvCase> {
    let mut cases = vec![
        ([2, 3, 5, 7], 4, (3, 3), 1, 1, true),
        ([1, 1, 6, 5], 2, (3, 2), 2, 1, true), // N = 1, C = 1, stride 2, padding 1, a kernel not square
        ([3, 2, 4, 3], 3, (1, 1), 1, 0, false), // kernel 1
        ([2, 2, 3, 5], 2, (3, 5), 1, 0, true), // kernel = input: one output position
        ([1, 2, 3, 3], 1, (3, 3), 2, 1, true), // kernel = input, padded, stride 2
        ([1, 2, 5, 4], 2, (2, 2), 2, 2, false), // corner windows wholly in the padding
        ([2, 1, 1, 1], 3, (1, 1), 1, 0, true),
    ];
    for _ in 0..4 {
        let (h, w) = (rng.random_range(1..8), rng.random_range(1..8));
        let (kh, kw) = (rng.random_range(1..=h.min(4)), rng.random_range(1..=w.min(4)));
        let shape = [rng.random_range(1..3), rng.random_range(1..4), h, w];
        cases.push((
            shape,
            rng.random_range(1..4),
            (kh, kw),
            rng.random_range(1..3),
            rng.random_range(0..2),
            rng.random_bool(0.5),
        ));
    }
    cases
}

#[test]
fn conv2d_matches_finite_differences_and_the_plain_loops() {
    let mut rng = SeededRng::seed_from_u64(24);
    for (x_shape, out_channels, (kh, kw), stride, padding, bias) in conv_cases(&mut rng) {
        let mut inputs = vec![
            input(&mut rng, &x_shape, -1.0, 1.0, 0.0),
            input(&mut rng, &[out_channels, x_shape[1], kh, kw], -1.0, 1.0, 0.0),
        ];
        if bias {
            inputs.push(input(&mut rng, &[out_channels], -1.0, 1.0, 0.0));
        }
        let op = |t: &[Tensor<f64>]| conv2d(&t[0], &t[1], t.get(2), stride, padding);
        let name = format!(
            "conv2d {x_shape:?} by {:?}, stride {stride}, padding {padding}",
            [out_channels, x_shape[1], kh, kw]
        );
        check(&name, &inputs, &op);
        let tensors: Vec<Tensor<f64>> = inputs.iter().map(|(v, s)| Tensor::from_slice(v, s).unwrap()).collect();
        let out = op(&tensors).unwrap();
        let expected = naive_conv2d(&tensors[0], &tensors[1], tensors.get(2), stride, padding);
        assert_eq!(out.numel(), expected.len(), "{name}");
        assert!(relative(&out.to_vec(), &expected) < 1e-14, "{name}");
    }
}

/// Values of `shape` that are a shuffle of 0, 0.01, 0.02, …, shifted to straddle 0: no two closer than a
/// finite difference's step could bridge, so no window's winner changes under it.
fn distinct(rng: &mut SeededRng, shape: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let count: usize = shape.iter().product();
    let mut values: Vec<f64> = (0..count).map(|i| i as f64 * 0.01 - count as f64 * 0.005).collect();
    values.shuffle(rng);
    (values, shape.to_vec())
}

#[test]
fn max_pool2d_matches_finite_differences_and_the_plain_loops() {
    let mut rng = SeededRng::seed_from_u64(25);
    let mut cases: Vec<([usize; 4], usize, usize, usize)> = vec![
        ([2, 3, 5, 7], 2, 2, 0),
        ([1, 1, 5, 5], 3, 2, 1), // N = 1, C = 1, stride 2, padding 1
        ([2, 2, 4, 6], 3, 1, 1), // overlapping windows: an element can win several
        ([1, 2, 3, 3], 3, 3, 0), // kernel = input
        ([2, 1, 4, 3], 1, 1, 0), // kernel 1
        ([1, 1, 5, 4], 2, 3, 1), // stride past the kernel: some inputs in no window
    ];
    for _ in 0..4 {
        let (h, w) = (rng.random_range(1..8), rng.random_range(1..8));
        let k = rng.random_range(1..=h.min(w).min(4));
        cases.push((
            [rng.random_range(1..3), rng.random_range(1..4), h, w],
            k,
            rng.random_range(1..4),
            rng.random_range(0..=k / 2),
        ));
    }
    for (shape, k, stride, padding) in cases {
        let name = format!("max_pool2d {shape:?}, kernel {k}, stride {stride}, padding {padding}");
        let x = distinct(&mut rng, &shape);
        check(&name, std::slice::from_ref(&x), &|t| max_pool2d(&t[0], k, stride, padding));
        let x = Tensor::from_vec(x.0, &x.1).unwrap();
        assert_eq!(
            max_pool2d(&x, k, stride, padding).unwrap().to_vec(),
            naive_max_pool2d(&x, k, stride, padding),
            "{name}"
        );
    }
}

#[test]
fn max_pool2d_gives_a_tie_to_the_first_element_and_never_picks_the_padding() {
    // One window of four equal values: the gradient goes to the first in row-major order.
    let x = Tensor::parameter(vec![2.0f64; 4], &[1, 1, 2, 2]).unwrap();
    max_pool2d(&x, 2, 2, 0).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec(), [1.0, 0.0, 0.0, 0.0]);
    // A tie across rows: [[1, 3], [3, 0]] sends it to the 3 of the first row.
    let x = Tensor::parameter(vec![1.0f64, 3.0, 3.0, 0.0], &[1, 1, 2, 2]).unwrap();
    max_pool2d(&x, 2, 2, 0).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec(), [0.0, 1.0, 0.0, 0.0]);
    // All negative, padded by 1: every window's max is an input, never the −∞ padding.
    let x = Tensor::from_vec(vec![-5.0f64, -4.0, -3.0, -2.0], &[1, 1, 2, 2]).unwrap();
    assert_eq!(max_pool2d(&x, 2, 1, 1).unwrap().to_vec(), [-5.0, -4.0, -4.0, -3.0, -2.0, -2.0, -3.0, -2.0, -2.0]);
    // A NaN never wins (as in the kernels): the window's largest number does.
    let x = Tensor::from_vec(vec![1.0f64, f64::NAN, 0.5, -1.0], &[1, 1, 2, 2]).unwrap();
    assert_eq!(max_pool2d(&x, 2, 2, 0).unwrap().to_vec(), [1.0]);
}

#[test]
fn the_image_ops_repeat_to_the_bit() {
    let mut rng = SeededRng::seed_from_u64(26);
    let (x, w, b) = (
        input(&mut rng, &[3, 2, 6, 5], -1.0, 1.0, 0.0),
        input(&mut rng, &[4, 2, 3, 3], -1.0, 1.0, 0.0),
        input(&mut rng, &[4], -1.0, 1.0, 0.0),
    );
    let run = || {
        let params: Vec<Tensor<f32>> = [&x, &w, &b]
            .iter()
            .map(|(v, s)| Tensor::parameter(v.iter().map(|&v| v as f32).collect(), s).unwrap())
            .collect();
        let y = conv2d(&params[0], &params[1], Some(&params[2]), 2, 1).unwrap();
        max_pool2d(&y, 2, 1, 1).unwrap().tanh().unwrap().sum_all().unwrap().backward().unwrap();
        params.iter().flat_map(|p| p.grad().unwrap().to_vec()).map(f32::to_bits).collect::<Vec<u32>>()
    };
    assert_eq!(run(), run());
}

#[test]
fn each_bad_input_is_one_line_naming_the_op_and_shapes() {
    let t = |shape: &[usize]| Tensor::<f32>::zeros(shape).unwrap();
    fails_with(
        conv2d(&t(&[2, 3, 5, 5]), &t(&[4, 2, 3, 3]), None, 1, 0),
        "conv2d: shapes [2, 3, 5, 5] and [4, 2, 3, 3] do not match: the input's channels (axis 1) must be the weight's \
         (axis 1)",
    );
    fails_with(
        conv2d(&t(&[1, 1, 3, 4]), &t(&[1, 1, 6, 2]), None, 1, 1),
        "conv2d: shape [1, 1, 3, 4] padded by 1 is smaller than the 6×2 kernel",
    );
    fails_with(
        conv2d(&t(&[1, 3, 3]), &t(&[1, 3, 1, 1]), None, 1, 0),
        "conv2d: shape [1, 3, 3] is not a batch of images of four axes [N, C, H, W]",
    );
    fails_with(
        conv2d(&t(&[1, 3, 3, 3]), &t(&[3, 1, 1]), None, 1, 0),
        "conv2d: shape [3, 1, 1] is not a weight of four axes [O, C, KH, KW]",
    );
    fails_with(
        conv2d(&t(&[1, 3, 3, 3]), &t(&[4, 3, 1, 1]), Some(&t(&[3])), 1, 0),
        "conv2d: shapes [4, 3, 1, 1] and [3] do not match: the bias must be [O]",
    );
    fails_with(conv2d(&t(&[1, 3, 3, 3]), &t(&[4, 3, 1, 1]), None, 0, 0), "conv2d: the stride must be 1 or more");
    fails_with(
        conv2d(&t(&[1, 3, 3, 3]), &t(&[4, 3, 0, 1]), None, 1, 0),
        "conv2d: shape [4, 3, 0, 1] has an empty kernel",
    );
    fails_with(
        max_pool2d(&t(&[1, 1, 2, 2]), 5, 1, 1),
        "max_pool2d: shape [1, 1, 2, 2] padded by 1 is smaller than the 5×5 window",
    );
    fails_with(
        max_pool2d(&t(&[1, 1, 5, 5]), 3, 1, 2),
        "max_pool2d: the padding (2) must be at most half the kernel (3)",
    );
    fails_with(
        max_pool2d(&t(&[1, 1, 5, 5]), 0, 1, 0),
        "max_pool2d: the kernel (0) and the stride (1) must be 1 or more",
    );
    fails_with(
        max_pool2d(&t(&[5, 5]), 2, 2, 0),
        "max_pool2d: shape [5, 5] is not a batch of images of four axes [N, C, H, W]",
    );
    fails_with(
        t(&[2, 3, 4]).permute(&[0, 0, 1]),
        "permute: shape [2, 3, 4] cannot take the axes [0, 0, 1]: each of its 3 axes must appear once",
    );
    fails_with(
        t(&[2, 3, 4]).permute(&[1, 0]),
        "permute: shape [2, 3, 4] cannot take the axes [1, 0]: each of its 3 axes must appear once",
    );
    fails_with(t(&[2, 3, 4]).permute(&[0, 1, 3]), "permute: shape [2, 3, 4] has no axis 3 (3 axes)");
    fails_with(t(&[2, 3, 4]).permute(&[-4, 1, 2]), "permute: shape [2, 3, 4] has no axis -4 (3 axes)");
    fails_with(t(&[2, 5]).narrow(1, 3, 3), "narrow: shape [2, 5] has no elements 3..6 along axis 1 (of size 5)");
    fails_with(t(&[2, 5]).narrow(2, 0, 1), "narrow: shape [2, 5] has no axis 2 (2 axes)");
    let backwards = std::ops::Range { start: 4, end: 2 };
    fails_with(t(&[2, 5]).slice(-1, backwards), "slice: shape [2, 5] has no elements 4..2 along axis 1 (of size 5)");
    fails_with(cat::<f32>(&[], 0), "cat: needs at least one tensor to join");
    fails_with(
        cat(&[&t(&[2, 3]), &t(&[3, 3])], 1),
        "cat: shapes [2, 3] and [3, 3] differ off the axis they are joined along",
    );
    fails_with(
        cat(&[&t(&[2, 3]), &t(&[2, 3, 1])], 0),
        "cat: shapes [2, 3] and [2, 3, 1] differ off the axis they are joined along",
    );
    fails_with(cat(&[&t(&[2, 3]), &t(&[2, 3])], 2), "cat: shape [2, 3] has no axis 2 (2 axes)");
}

#[test]
fn conv2d_module_draws_as_pytorch_and_names_its_parameters() {
    let layer = Conv2d::<f64>::new(3, 4, 2, (2, 1), true, &mut SeededRng::seed_from_u64(5)).unwrap();
    let names: Vec<(String, Vec<usize>)> =
        layer.named_parameters().into_iter().map(|(name, p)| (name, p.shape().to_vec())).collect();
    assert_eq!(names, [("weight".to_string(), vec![4, 3, 2, 2]), ("bias".to_string(), vec![4])]);
    // Weight then bias from the same stream, each U(±1/√fan_in) with fan_in = C·KH·KW = 12.
    let mut rng = SeededRng::seed_from_u64(5);
    let (mut weight, mut bias) = (vec![0f32; 48], vec![0f32; 4]);
    linear_init(&mut weight, 12, &mut rng);
    linear_init(&mut bias, 12, &mut rng);
    let as_f64 = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<f64>>();
    assert_eq!(layer.weight.to_vec(), as_f64(weight));
    assert_eq!(layer.bias.as_ref().unwrap().to_vec(), as_f64(bias));
    assert!(layer.weight.to_vec().iter().all(|w| w.abs() <= 1.0 / 12f64.sqrt()));
    let x = Tensor::from_vec((0..2 * 3 * 5 * 4).map(|i| f64::from(i) * 0.1).collect(), &[2, 3, 5, 4]).unwrap();
    let direct = conv2d(&x, &layer.weight, layer.bias.as_ref(), 2, 1).unwrap();
    assert_eq!(layer.forward(&x).unwrap().to_vec(), direct.to_vec());
    assert_eq!(direct.shape(), [2, 4, 3, 3]);
    let plain = Conv2d::<f32>::new(1, 2, 3, (1, 0), false, &mut SeededRng::seed_from_u64(5)).unwrap();
    assert_eq!(plain.named_parameters().len(), 1);
    assert!(plain.weight.requires_grad());
    fails_with(
        Conv2d::from_parameters(Tensor::<f32>::zeros(&[2, 1, 3, 3]).unwrap(), Some(Tensor::zeros(&[3]).unwrap()), 1, 0),
        "Conv2d: shapes [2, 1, 3, 3] and [3] do not match: the bias must be [O]",
    );
}

#[test]
fn max_pool2d_module_has_no_parameters_and_pools() {
    let pool = MaxPool2d::new(2).with_stride(1).with_padding(1);
    assert_eq!((pool.kernel, pool.stride, pool.padding), (2, 1, 1));
    assert!(Module::<f32>::named_parameters(&pool).is_empty());
    let x = Tensor::from_vec((0..2 * 3 * 4).map(|i| i as f32).collect(), &[1, 2, 3, 4]).unwrap();
    assert_eq!(pool.forward(&x).unwrap().to_vec(), max_pool2d(&x, 2, 1, 1).unwrap().to_vec());
    assert_eq!(MaxPool2d::new(2).forward(&x).unwrap().shape(), [1, 2, 1, 2]);
}
