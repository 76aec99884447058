//! The Transformer's ops in `textnet::nn` — `layer_norm`, `embedding` (and `index_rows`, its gather along any tensor's
//! first axis), `dropout`, `scaled_dot_product_attention` — and their modules (`LayerNorm`, `Embedding`, `Dropout`):
//! every gradient against f64 central finite differences over seeded shapes with odd sizes and axes of size 1 (T = 1, D
//! odd, causal and not, weight and bias absent and present, the first, the last and repeated ids); layer_norm's and
//! attention's values against naive formulas written out here (so the checks are not the op against itself); dropout's
//! mask against the kernels' hash, its kept fraction, its seeding and its gradient; each bad input's one-line error;
//! the modules' parameter names, initial values and switch.

use crate::common::gradcheck::{check, input, values};
use rand::{RngExt, SeedableRng};
use textnet::nn::{
    self, Dropout, Embedding, LayerNorm, Module, Tensor, causal_self_attention, dropout, embedding, index_rows,
    index_rows_tensor, layer_norm, scaled_dot_product_attention,
};
use textnet::ops::cpu::SeededRng;
use textnet::ops::dropout::{DropoutKey, Mask, dropout_scale};
use textnet::ops::layernorm::layer_norm_rows;

/// `result`'s error as its one line, which must be `expected` exactly.
fn fails_with<T: std::fmt::Debug>(result: nn::Result<T>, expected: &str) {
    let err = result.unwrap_err().to_string();
    assert_eq!(err, expected);
    assert_eq!(err.lines().count(), 1);
}

/// The largest difference between two equally long slices.
fn max_difference(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

#[test]
fn layer_norm_matches_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(21);
    for shape in [vec![5], vec![3, 7], vec![2, 1, 4], vec![1, 1], vec![4, 1], vec![2, 3, 9]] {
        let width = *shape.last().unwrap();
        let x = input(&mut rng, &shape, -2.0, 2.0, 0.0);
        let (w, b) = (input(&mut rng, &[width], -1.5, 1.5, 0.0), input(&mut rng, &[width], -1.0, 1.0, 0.0));
        check("layer_norm", std::slice::from_ref(&x), &|t| layer_norm(&t[0], None, None, 1e-5));
        check("layer_norm (weight)", &[x.clone(), w.clone()], &|t| layer_norm(&t[0], Some(&t[1]), None, 1e-5));
        check("layer_norm (bias)", &[x.clone(), b.clone()], &|t| layer_norm(&t[0], None, Some(&t[1]), 1e-5));
        check("layer_norm (both, eps 0.1)", &[x, w, b], &|t| layer_norm(&t[0], Some(&t[1]), Some(&t[2]), 0.1));
    }
}

/// LayerNorm written out: each row of `width` less its mean, over √(biased variance + ε), times w plus b.
fn naive_layer_norm(x: &[f64], width: usize, w: &[f64], b: &[f64], eps: f64) -> Vec<f64> {
    let mut out = Vec::new();
    for row in x.chunks(width) {
        let mean = row.iter().sum::<f64>() / width as f64;
        let variance = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / width as f64;
        out.extend(row.iter().zip(w).zip(b).map(|((v, w), b)| (v - mean) / (variance + eps).sqrt() * w + b));
    }
    out
}

#[test]
fn layer_norm_values_match_the_formula_and_the_pipelines_twin() {
    let mut rng = SeededRng::seed_from_u64(22);
    let (x, w, b) =
        (values(&mut rng, 4 * 7, -3.0, 3.0), values(&mut rng, 7, -2.0, 2.0), values(&mut rng, 7, -1.0, 1.0));
    let tensor = |v: &[f64], shape: &[usize]| Tensor::from_slice(v, shape).unwrap();
    for eps in [1e-5, 0.5] {
        let out = layer_norm(&tensor(&x, &[4, 7]), Some(&tensor(&w, &[7])), Some(&tensor(&b, &[7])), eps).unwrap();
        assert!(max_difference(&out.to_vec(), &naive_layer_norm(&x, 7, &w, &b, eps)) < 1e-12);
    }
    let (ones, zeros) = (vec![1.0; 7], vec![0.0; 7]);
    let plain = layer_norm(&tensor(&x, &[2, 2, 7]), None, None, 1e-5).unwrap();
    assert_eq!(plain.shape(), [2, 2, 7]);
    assert!(max_difference(&plain.to_vec(), &naive_layer_norm(&x, 7, &ones, &zeros, 1e-5)) < 1e-12);
    // In f32 at ε = 1e-5, the values the Transformer pipeline computes, to the bit.
    let single = |v: &[f64]| v.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    let (x32, w32, b32) = (single(&x), single(&w), single(&b));
    let op = layer_norm(
        &Tensor::from_slice(&x32, &[4, 7]).unwrap(),
        Some(&Tensor::from_slice(&w32, &[7]).unwrap()),
        Some(&Tensor::from_slice(&b32, &[7]).unwrap()),
        1e-5,
    )
    .unwrap();
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    assert_eq!(bits(&op.to_vec()), bits(&layer_norm_rows(&x32, &w32, &b32).0));
}

#[test]
fn embedding_matches_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(23);
    // The first id, the last, and repeats (whose gradients add up), in several shapes of ids.
    let cases: [(usize, usize, Vec<i64>, Vec<usize>); 5] = [
        (5, 3, vec![0, 4, 2, 4, 4, 0], vec![2, 3]),
        (7, 1, vec![6], vec![]),
        (1, 5, vec![0, 0, 0], vec![3]),
        (3, 4, vec![2, 1, 2, 0], vec![2, 1, 2]),
        (4, 3, vec![], vec![0]),
    ];
    for (rows, dims, ids, ids_shape) in cases {
        let weight = input(&mut rng, &[rows, dims], -2.0, 2.0, 0.0);
        check("embedding", &[weight], &|t| embedding(&t[0], &ids, &ids_shape, None));
    }
}

#[test]
fn embedding_looks_up_rows_and_adds_repeated_ids_gradients() {
    // Weight [4, 2] holding 10·row + column; ids [[3, 0, 3], [1, 3, 0]].
    let weight = Tensor::parameter(vec![0.0f64, 1.0, 10.0, 11.0, 20.0, 21.0, 30.0, 31.0], &[4, 2]).unwrap();
    let ids = [3, 0, 3, 1, 3, 0];
    let out = embedding(&weight, &ids, &[2, 3], None).unwrap();
    assert_eq!(out.shape(), [2, 3, 2]);
    assert_eq!(out.to_vec(), [30.0, 31.0, 0.0, 1.0, 30.0, 31.0, 10.0, 11.0, 30.0, 31.0, 0.0, 1.0]);
    let grad: Vec<f64> = (1..=12).map(f64::from).collect();
    let backward = |padding_idx| {
        weight.zero_grad();
        let out = embedding(&weight, &ids, &[2, 3], padding_idx).unwrap();
        out.backward_with(Some(&Tensor::from_slice(&grad, &[2, 3, 2]).unwrap()), false).unwrap();
        weight.grad().unwrap().to_vec()
    };
    // Row 0: positions 1 and 5; row 1: position 3; row 2: none; row 3: positions 0, 2 and 4.
    let expected = [3.0 + 11.0, 4.0 + 12.0, 7.0, 8.0, 0.0, 0.0, 1.0 + 5.0 + 9.0, 2.0 + 6.0 + 10.0];
    assert_eq!(backward(None), expected);
    // padding_idx: that row's gradient is zero (−1 counts from the end: row 3), the others unchanged.
    let mut without_row_0 = expected;
    without_row_0[..2].fill(0.0);
    assert_eq!(backward(Some(0)), without_row_0);
    let mut without_row_3 = expected;
    without_row_3[6..].fill(0.0);
    assert_eq!(backward(Some(-1)), without_row_3);
    // The padding row's values still come out, as PyTorch's.
    assert_eq!(embedding(&weight, &[3], &[1], Some(3)).unwrap().to_vec(), [30.0, 31.0]);
}

#[test]
fn index_rows_matches_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(33);
    // 1-D, 2-D and 4-D tensors; the first row, the last, negative ids and repeats; ids of no axis, of two
    // and none at all.
    let cases: [(Vec<usize>, Vec<i64>, Vec<usize>); 6] = [
        (vec![5], vec![0, 4, -1, 2], vec![4]),
        (vec![4, 3], vec![0, 3, 3, 1, -4, 0], vec![3, 2]),
        (vec![3, 2, 1, 3], vec![2, -3, 2], vec![3]),
        (vec![1, 5], vec![0, 0, -1], vec![1, 3]),
        (vec![6, 2], vec![5], vec![]),
        (vec![4, 3], vec![], vec![0]),
    ];
    for (shape, ids, ids_shape) in cases {
        let x = input(&mut rng, &shape, -2.0, 2.0, 0.0);
        check("index_rows", std::slice::from_ref(&x), &|t| index_rows(&t[0], &ids, &ids_shape));
        let floats: Vec<f64> = ids.iter().map(|&id| id as f64).collect();
        let held = Tensor::from_vec(floats, &ids_shape).unwrap();
        check("index_rows_tensor", &[x], &|t| index_rows_tensor(&t[0], &held));
    }
}

#[test]
fn index_rows_picks_slices_along_the_first_axis_and_adds_repeated_ids_gradients() {
    // x [3, 2, 2] holding 10·row + position; ids [[2, -3], [2, 1]] (−3 is row 0).
    let values: Vec<f64> = (0..3).flat_map(|row| (0..4).map(move |p| f64::from(10 * row + p))).collect();
    let x = Tensor::parameter(values, &[3, 2, 2]).unwrap();
    let out = index_rows(&x, &[2, -3, 2, 1], &[2, 2]).unwrap();
    assert_eq!(out.shape(), [2, 2, 2, 2]);
    let expected = [20.0, 21.0, 22.0, 23.0, 0.0, 1.0, 2.0, 3.0, 20.0, 21.0, 22.0, 23.0, 10.0, 11.0, 12.0, 13.0];
    assert_eq!(out.to_vec(), expected);
    let held = Tensor::from_slice(&[2.0, -3.0, 2.0, 1.0], &[2, 2]).unwrap();
    assert_eq!(index_rows_tensor(&x, &held).unwrap().to_vec(), expected);
    let grad: Vec<f64> = (1..=16).map(f64::from).collect();
    out.backward_with(Some(&Tensor::from_slice(&grad, out.shape()).unwrap()), false).unwrap();
    // Row 0: position 1; row 1: position 3; row 2: positions 0 and 2, added in that order.
    let row = |at: usize| &grad[at * 4..][..4];
    let twice: Vec<f64> = row(0).iter().zip(row(2)).map(|(a, b)| a + b).collect();
    assert_eq!(x.grad().unwrap().to_vec(), [row(1), row(3), &twice].concat());
    // A 1-D tensor gives the ids' shape; a scalar id drops the axis.
    let line = Tensor::from_slice(&[5.0f32, 6.0, 7.0], &[3]).unwrap();
    let picked = index_rows(&line, &[-1, 0, 0, 1], &[2, 2]).unwrap();
    assert_eq!((picked.shape(), picked.to_vec()), (&[2, 2][..], vec![7.0, 5.0, 5.0, 6.0]));
    assert_eq!(index_rows(&line, &[1], &[]).unwrap().shape(), [] as [usize; 0]);
    // No gradient wanted, none recorded: x keeps its flags, and a computed x passes its gradient back.
    assert!(!index_rows(&line, &[0], &[1]).unwrap().requires_grad() && !line.requires_grad());
    let doubled = x.mul_scalar(2.0).unwrap();
    x.zero_grad();
    index_rows(&doubled, &[1], &[1]).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec(), [[0.0; 4], [2.0; 4], [0.0; 4]].concat());
}

#[test]
fn index_rows_refuses_ids_out_of_range_in_one_line() {
    let x = Tensor::<f32>::zeros(&[5, 3]).unwrap();
    let range = "is out of range for axis 0 of size 5";
    fails_with(index_rows(&x, &[0, 5], &[2]), &format!("index: id 5 at position [1] {range}"));
    fails_with(index_rows(&x, &[0, 1, -6], &[1, 3]), &format!("index: id -6 at position [0, 2] {range}"));
    fails_with(index_rows(&x, &[i64::MIN], &[]), &format!("index: id {} at position [] {range}", i64::MIN));
    fails_with(index_rows(&x, &[0, 1, 2], &[2, 2]), "index: shape [2, 2] holds 4 ids, but 3 were given");
    fails_with(index_rows(&Tensor::scalar(1.0f32), &[0], &[1]), "index: shape [] has no axis 0 to index");
    fails_with(
        index_rows(&Tensor::<f32>::zeros(&[0, 2]).unwrap(), &[0], &[1]),
        "index: id 0 at position [0] is out of range for axis 0 of size 0",
    );
    let held = |v: &[f32], shape: &[usize]| index_rows_tensor(&x, &Tensor::from_slice(v, shape).unwrap());
    fails_with(held(&[0.0, 1.5], &[2]), "index: id 1.5 at position [1] is not an integer");
    fails_with(held(&[f32::NAN], &[1, 1]), "index: id NaN at position [0, 0] is not an integer");
    fails_with(held(&[1e30], &[1]), &format!("index: id 1e30 at position [0] {range}"));
    fails_with(held(&[-5.0, 5.0], &[2]), &format!("index: id 5 at position [1] {range}"));
}

#[test]
fn dropout_draws_the_kernels_mask_and_scales_the_survivors() {
    let (p, seed, step, site) = (0.3f32, 9, 4, 2);
    let x = Tensor::parameter(values(&mut SeededRng::seed_from_u64(24), 3 * 5 * 7, -2.0, 2.0), &[3, 5, 7]).unwrap();
    let y = dropout(&x, p, true, seed, step, site).unwrap();
    let mask = Mask::new(Some(DropoutKey { seed, step }), site, p).unwrap();
    let factors: Vec<f64> = (0..x.numel()).map(|e| f64::from(mask.factor(e))).collect();
    let expected: Vec<f64> = x.to_vec().iter().zip(&factors).map(|(v, f)| v * f).collect();
    assert_eq!(y.to_vec(), expected);
    assert!(factors.iter().all(|&f| f == 0.0 || f == f64::from(dropout_scale(p))));
    // The gradient is the same mask times the same scale.
    let g = values(&mut SeededRng::seed_from_u64(25), x.numel(), -1.0, 1.0);
    y.backward_with(Some(&Tensor::from_slice(&g, x.shape()).unwrap()), false).unwrap();
    let expected: Vec<f64> = g.iter().zip(&factors).map(|(g, f)| g * f).collect();
    assert_eq!(x.grad().unwrap().to_vec(), expected);
    // And finite differences agree (the op is linear in x, so closely).
    let x = input(&mut SeededRng::seed_from_u64(26), &[2, 9], -2.0, 2.0, 0.0);
    check("dropout", &[x], &|t| dropout(&t[0], 0.5, true, 1, 2, 3));
}

#[test]
fn dropout_keeps_about_one_minus_p() {
    let ones = Tensor::<f32>::full(&[100_000], 1.0).unwrap();
    for p in [0.1f32, 0.5, 0.9] {
        let kept = dropout(&ones, p, true, 5, 0, 0).unwrap().to_vec().iter().filter(|&&v| v != 0.0).count();
        let fraction = kept as f64 / 100_000.0;
        assert!((fraction - (1.0 - f64::from(p))).abs() < 0.01, "p {p}: kept {fraction}");
    }
}

#[test]
fn dropout_repeats_with_its_key_and_changes_with_it() {
    let x = Tensor::<f32>::full(&[4, 64], 1.0).unwrap();
    let mask = |seed, step, site| dropout(&x, 0.5, true, seed, step, site).unwrap().to_vec();
    assert_eq!(mask(1, 2, 0), mask(1, 2, 0));
    assert_ne!(mask(1, 2, 0), mask(1, 3, 0), "another step");
    assert_ne!(mask(1, 2, 0), mask(2, 2, 0), "another seed");
    assert_ne!(mask(1, 2, 0), mask(1, 2, 1), "another site");
}

#[test]
fn dropout_is_the_input_outside_training_and_at_p_0_and_zeroes_at_p_1() {
    let x = Tensor::parameter(vec![1.5f64, -2.0, 3.0], &[3]).unwrap();
    for (p, training) in [(0.5, false), (1.0, false), (0.0, true)] {
        assert!(dropout(&x, p, training, 1, 0, 0).unwrap().same(&x), "p {p}, training {training}");
    }
    // p = 1 drops everything, as PyTorch's; no gradient passes.
    let y = dropout(&x, 1.0, true, 1, 0, 0).unwrap();
    assert_eq!(y.to_vec(), [0.0; 3]);
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec(), [0.0; 3]);
}

/// Attention written out: for each batch, head and query i, the scores q_i·k_j/√D over keys j (j ≤ i when
/// causal), their softmax, and the weighted sum of the v_j.
fn naive_attention(q: &[f64], k: &[f64], v: &[f64], shape: [usize; 4], causal: bool) -> Vec<f64> {
    let [batch, heads, time, dims] = shape;
    let mut out = vec![0.0; q.len()];
    for bh in 0..batch * heads {
        let row = |m: &[f64], t: usize| m[(bh * time + t) * dims..][..dims].to_vec();
        for i in 0..time {
            let keys = if causal { i + 1 } else { time };
            let scores: Vec<f64> = (0..keys)
                .map(|j| row(q, i).iter().zip(row(k, j)).map(|(a, b)| a * b).sum::<f64>() / (dims as f64).sqrt())
                .collect();
            let total: f64 = scores.iter().map(|s| s.exp()).sum();
            for (j, s) in scores.iter().enumerate() {
                for (d, value) in row(v, j).iter().enumerate() {
                    out[(bh * time + i) * dims + d] += s.exp() / total * value;
                }
            }
        }
    }
    out
}

/// The shapes attention is checked over: one element, T = 1, odd sizes, D of 1 and 7.
const ATTENTION_SHAPES: [[usize; 4]; 5] = [[1, 1, 1, 1], [2, 3, 5, 3], [1, 2, 1, 5], [2, 1, 4, 7], [1, 2, 6, 1]];

#[test]
fn attention_matches_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(27);
    for shape in ATTENTION_SHAPES {
        let qkv: Vec<_> = (0..3).map(|_| input(&mut rng, &shape, -1.5, 1.5, 0.0)).collect();
        for causal in [true, false] {
            let name = if causal { "attention (causal)" } else { "attention" };
            check(name, &qkv, &|t| scaled_dot_product_attention(&t[0], &t[1], &t[2], causal));
        }
        // One tensor as q, k and v: its gradient is the sum of the three.
        check("self-attention of one tensor", &qkv[..1], &|t| scaled_dot_product_attention(&t[0], &t[0], &t[0], true));
    }
}

#[test]
fn attention_values_match_the_formula() {
    let mut rng = SeededRng::seed_from_u64(28);
    for shape in ATTENTION_SHAPES {
        let [q, k, v] = [(); 3].map(|_| values(&mut rng, shape.iter().product(), -2.0, 2.0));
        for causal in [true, false] {
            let tensor = |v: &[f64]| Tensor::from_slice(v, &shape).unwrap();
            let out = scaled_dot_product_attention(&tensor(&q), &tensor(&k), &tensor(&v), causal).unwrap();
            assert_eq!(out.shape(), shape);
            let naive = naive_attention(&q, &k, &v, shape, causal);
            assert!(max_difference(&out.to_vec(), &naive) < 1e-12, "{shape:?}, causal {causal}");
        }
    }
    // The first query attends to the first key only under the mask, so it is v's first row.
    let arange = |n: usize| Tensor::from_vec((0..n).map(|i| i as f64).collect(), &[1, 1, 3, 2]).unwrap();
    let out = scaled_dot_product_attention(&arange(6), &arange(6), &arange(6), true).unwrap().to_vec();
    assert_eq!(out[..2], [0.0, 1.0]);
}

#[test]
fn the_ops_compose_into_a_block_that_matches_finite_differences() {
    // embedding → layer_norm → causal attention (one head) → layer_norm: a Transformer block's skeleton.
    let mut rng = SeededRng::seed_from_u64(29);
    let inputs = [
        input(&mut rng, &[6, 5], -1.0, 1.0, 0.0),
        input(&mut rng, &[5], 0.5, 1.5, 0.0),
        input(&mut rng, &[5], -0.5, 0.5, 0.0),
    ];
    check("block", &inputs, &|t| {
        let x = embedding(&t[0], &[5, 0, 3, 3], &[1, 1, 4], None)?;
        let h = layer_norm(&x, Some(&t[1]), Some(&t[2]), 1e-5)?;
        let attended = scaled_dot_product_attention(&h, &h.mul_scalar(0.5)?, &x, true)?;
        layer_norm(&attended.add(&x)?, Some(&t[1]), None, 1e-5)
    });
}

#[test]
fn each_bad_input_is_one_line_naming_the_op_and_shapes() {
    let t = |shape: &[usize]| Tensor::<f32>::zeros(shape).unwrap();
    fails_with(layer_norm(&t(&[]), None, None, 1e-5), "layer_norm: shape [] has no last axis to normalise over");
    fails_with(
        layer_norm(&t(&[2, 3]), Some(&t(&[2])), None, 1e-5),
        "layer_norm: shapes [2, 3] and [2] do not match: the weight must be [D], D the input's last axis",
    );
    fails_with(
        layer_norm(&t(&[2, 3]), Some(&t(&[3])), Some(&t(&[1, 3])), 1e-5),
        "layer_norm: shapes [2, 3] and [1, 3] do not match: the bias must be [D], D the input's last axis",
    );
    fails_with(layer_norm(&t(&[2, 3]), None, None, -1.0), "layer_norm: eps must be a finite number ≥ 0, got -1");
    fails_with(layer_norm(&t(&[2, 3]), None, None, f64::NAN), "layer_norm: eps must be a finite number ≥ 0, got NaN");

    let weight = t(&[5, 3]);
    fails_with(
        embedding(&t(&[5]), &[0], &[1], None),
        "embedding: shape [5] is not a weight of two axes [num_embeddings, embedding_dim]",
    );
    fails_with(embedding(&weight, &[0, 1, 2], &[2, 2], None), "embedding: shape [2, 2] holds 4 ids, but 3 were given");
    fails_with(
        embedding(&weight, &[0, 1, 2, 3, 4, 5], &[2, 3], None),
        "embedding: id 5 at position [1, 2] is not a row of the weight's 0..5",
    );
    fails_with(
        embedding(&weight, &[0, -1], &[2], None),
        "embedding: id -1 at position [1] is not a row of the weight's 0..5",
    );
    fails_with(embedding(&weight, &[7], &[], None), "embedding: id 7 at position [] is not a row of the weight's 0..5");
    fails_with(embedding(&weight, &[0], &[1], Some(5)), "embedding: padding_idx 5 is not a row of the weight (-5..5)");
    fails_with(
        embedding(&weight, &[0], &[1], Some(-6)),
        "embedding: padding_idx -6 is not a row of the weight (-5..5)",
    );

    for p in [-0.1f32, 1.5, f32::NAN] {
        fails_with(
            dropout(&t(&[3]), p, true, 0, 0, 0),
            &format!("dropout: the probability must be in [0, 1], got {p}"),
        );
    }
    fails_with(Dropout::new(2.0, 0), "dropout: the probability must be in [0, 1], got 2");

    let sdpa = |q: &[usize], k: &[usize], v: &[usize]| scaled_dot_product_attention(&t(q), &t(k), &t(v), false);
    fails_with(
        sdpa(&[2, 5, 3], &[2, 5, 3], &[2, 5, 3]),
        "scaled_dot_product_attention: shape [2, 5, 3] is not [batch, heads, time, dims]",
    );
    fails_with(
        sdpa(&[1, 2, 5, 3], &[1, 2, 4, 3], &[1, 2, 5, 3]),
        "scaled_dot_product_attention: shapes [1, 2, 5, 3] and [1, 2, 4, 3] differ: k must have q's shape [batch, \
         heads, time, dims]",
    );
    fails_with(
        sdpa(&[1, 2, 5, 3], &[1, 2, 5, 3], &[1, 2, 5, 4]),
        "scaled_dot_product_attention: shapes [1, 2, 5, 3] and [1, 2, 5, 4] differ: v must have q's shape [batch, \
         heads, time, dims]",
    );

    let rng = &mut SeededRng::seed_from_u64(30);
    let layer = Embedding::<f32>::new(5, 3, None, rng).unwrap();
    let ids = |v: &[f32], shape: &[usize]| layer.forward(&Tensor::from_slice(v, shape).unwrap());
    fails_with(ids(&[0.0, 1.5], &[2]), "embedding: id 1.5 at position [1] is not an integer");
    fails_with(ids(&[f32::NAN], &[1, 1]), "embedding: id NaN at position [0, 0] is not an integer");
    fails_with(ids(&[5.0, 0.0], &[1, 2]), "embedding: id 5 at position [0, 0] is not a row of the weight's 0..5");
    fails_with(ids(&[1e30], &[1]), "embedding: id 1e30 at position [0] is not a row of the weight's 0..5");
    fails_with(
        Embedding::<f32>::new(5, 3, Some(9), rng),
        "embedding: padding_idx 9 is not a row of the weight (-5..5)",
    );
    fails_with(
        Embedding::from_parameters(t(&[5]), None),
        "Embedding: shape [5] is not a weight of two axes [num_embeddings, embedding_dim]",
    );
    fails_with(
        LayerNorm::<f32>::new(4, false).unwrap().forward(&t(&[2, 3])),
        "LayerNorm: shapes [2, 3] and [4] do not match: the input's last axis must be the layer's width (second)",
    );
}

#[test]
fn embedding_is_initialised_as_pytorchs_and_seeded() {
    let layer =
        |seed, padding_idx| Embedding::<f32>::new(50, 41, padding_idx, &mut SeededRng::seed_from_u64(seed)).unwrap();
    let (a, b, c) = (layer(3, None), layer(3, None), layer(4, None));
    assert_eq!(a.weight.to_vec(), b.weight.to_vec());
    assert_ne!(a.weight.to_vec(), c.weight.to_vec());
    let names: Vec<String> = a.named_parameters().into_iter().map(|(name, _)| name).collect();
    assert_eq!(names, ["weight"]);
    assert_eq!((a.weight.shape(), a.num_embeddings(), a.embedding_dim()), (&[50, 41][..], 50, 41));
    assert!(a.weight.requires_grad() && a.weight.is_leaf());
    // N(0, 1): over 2050 values the mean lies within 0.1 of 0 and the standard deviation within 0.1 of 1.
    let w: Vec<f64> = a.weight.to_vec().iter().map(|&v| f64::from(v)).collect();
    let mean = w.iter().sum::<f64>() / w.len() as f64;
    let std = (w.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
    assert!(mean.abs() < 0.1 && (std - 1.0).abs() < 0.1, "mean {mean}, std {std}");
    // padding_idx's row starts at zeros; the others are the same draws.
    let padded = layer(3, Some(-2)).weight.to_vec();
    assert_eq!(padded[48 * 41..49 * 41], [0.0; 41]);
    assert_eq!(padded[..48 * 41], a.weight.to_vec()[..48 * 41]);
    // forward reads float ids as forward_ids reads integers.
    let by_ids = a.forward_ids(&[49, 0, 7], &[3, 1]).unwrap();
    let by_floats = a.forward(&Tensor::from_slice(&[49.0, 0.0, 7.0], &[3, 1]).unwrap()).unwrap();
    assert_eq!((by_ids.shape(), by_ids.to_vec()), (&[3, 1, 41][..], by_floats.to_vec()));
    assert_eq!(by_ids.to_vec()[..41], a.weight.to_vec()[49 * 41..]);
}

#[test]
fn layer_norm_starts_as_pytorchs() {
    let layer = LayerNorm::<f64>::new(5, true).unwrap();
    let named = layer.named_parameters();
    let names: Vec<&str> = named.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["weight", "bias"]);
    assert_eq!((named[0].1.to_vec(), named[1].1.to_vec()), (vec![1.0; 5], vec![0.0; 5]));
    assert!(named.iter().all(|(_, p)| p.requires_grad() && p.shape() == [5]));
    assert_eq!((layer.eps, layer.width()), (1e-5, 5));
    // Ones and zeros change nothing: the layer is layer_norm without weight and bias.
    let x = Tensor::from_vec(values(&mut SeededRng::seed_from_u64(31), 15, -2.0, 2.0), &[3, 5]).unwrap();
    let plain = layer_norm(&x, None, None, 1e-5).unwrap().to_vec();
    assert_eq!(layer.forward(&x).unwrap().to_vec(), plain);
    let bare = LayerNorm::<f64>::new(5, false).unwrap().with_eps(0.25);
    assert!(bare.named_parameters().is_empty());
    assert_eq!(bare.forward(&x).unwrap().to_vec(), layer_norm(&x, None, None, 0.25).unwrap().to_vec());
    // Its parameters get gradients.
    layer.forward(&x).unwrap().mul(&x).unwrap().sum_all().unwrap().backward().unwrap();
    assert!(layer.parameters().iter().all(|p| p.grad().is_some()));
}

#[test]
fn dropout_layer_draws_a_new_mask_each_call_until_switched_off() {
    let x = Tensor::<f32>::full(&[8, 16], 1.0).unwrap();
    let layer = Dropout::new(0.5, 7).unwrap();
    assert!(layer.is_training() && Module::<f32>::named_parameters(&layer).is_empty());
    let (first, second) = (layer.forward(&x).unwrap().to_vec(), layer.forward(&x).unwrap().to_vec());
    assert_ne!(first, second, "each call draws the next step's mask");
    assert_eq!(first, dropout(&x, 0.5, true, 7, 0, 0).unwrap().to_vec());
    assert_eq!(second, dropout(&x, 0.5, true, 7, 1, 0).unwrap().to_vec());
    assert_eq!(layer.step(), 2);
    // The same seed replays the same masks; another site draws others.
    let again = Dropout::new(0.5, 7).unwrap();
    assert_eq!(again.forward(&x).unwrap().to_vec(), first);
    assert_ne!(Dropout::new(0.5, 7).unwrap().with_site(1).forward(&x).unwrap().to_vec(), first);
    // eval: the input itself, and the step stays.
    Module::<f32>::set_training(&layer, false);
    assert!(!layer.is_training());
    assert!(layer.forward(&x).unwrap().same(&x));
    assert_eq!(layer.step(), 2);
    Module::<f32>::set_training(&layer, true);
    assert_eq!(layer.forward(&x).unwrap().to_vec(), dropout(&x, 0.5, true, 7, 2, 0).unwrap().to_vec());
    assert_eq!(layer.p(), 0.5);
}

#[test]
fn embedding_ids_are_checked_with_random_shapes() {
    // Seeded random shapes of ids, each with one id out of range at a random place: the error names it.
    let mut rng = SeededRng::seed_from_u64(32);
    let weight = Tensor::<f64>::zeros(&[6, 2]).unwrap();
    for _ in 0..8 {
        let shape: Vec<usize> = (0..rng.random_range(1..4)).map(|_| rng.random_range(1..4)).collect();
        let count: usize = shape.iter().product();
        let mut ids: Vec<i64> = (0..count).map(|_| rng.random_range(0..6)).collect();
        assert_eq!(embedding(&weight, &ids, &shape, None).unwrap().shape(), [&shape[..], &[2]].concat());
        let bad = rng.random_range(0..count);
        ids[bad] = 6;
        let err = embedding(&weight, &ids, &shape, None).unwrap_err().to_string();
        let mut rest = bad;
        let mut at = vec![0; shape.len()];
        for (i, &size) in at.iter_mut().zip(&shape).rev() {
            *i = rest % size;
            rest /= size;
        }
        assert_eq!(err, format!("embedding: id 6 at position {at:?} is not a row of the weight's 0..6"));
    }
}

/// (batch, time, heads, head size) of the packed attention checks: one element, T = 1, odd sizes, heads of 1.
const PACKED_SHAPES: [[usize; 4]; 4] = [[1, 1, 1, 1], [2, 3, 1, 5], [1, 5, 2, 3], [2, 4, 3, 1]];

#[test]
fn causal_self_attention_matches_finite_differences_with_and_without_dropout() {
    let mut rng = SeededRng::seed_from_u64(31);
    for [b, t, heads, hs] in PACKED_SHAPES {
        let qkv = input(&mut rng, &[b, t, 3 * heads * hs], -1.5, 1.5, 0.0);
        check("causal_self_attention", std::slice::from_ref(&qkv), &|x| causal_self_attention(&x[0], heads, None));
        // A layer made per call draws the same mask (its step 0) each time the check evaluates the op.
        check("causal_self_attention (dropout)", std::slice::from_ref(&qkv), &|x| {
            causal_self_attention(&x[0], heads, Some(&Dropout::new(0.3, 5)?.with_site(2)))
        });
    }
}

#[test]
fn causal_self_attention_is_the_split_heads_sdp_attention() {
    let mut rng = SeededRng::seed_from_u64(32);
    for [b, t, heads, hs] in PACKED_SHAPES {
        let c = heads * hs;
        let qkv = Tensor::from_vec(values(&mut rng, b * t * 3 * c, -2.0, 2.0), &[b, t, 3 * c]).unwrap();
        let packed = causal_self_attention(&qkv, heads, None).unwrap();
        // nanoGPT's: split, view as heads, transpose, attend, transpose back, view.
        let head = |i: usize| qkv.narrow(2, i * c, c).unwrap().reshape(&[b, t, heads, hs]).unwrap().transpose(1, 2);
        let split = scaled_dot_product_attention(&head(0).unwrap(), &head(1).unwrap(), &head(2).unwrap(), true)
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .reshape(&[b, t, c])
            .unwrap();
        assert_eq!(packed.shape(), [b, t, c]);
        assert!(max_difference(&packed.to_vec(), &split.to_vec()) < 1e-12, "{:?}", [b, t, heads, hs]);
    }
    // In training, the layer's next mask drops probabilities (so y changes); outside training nothing.
    let qkv = Tensor::from_vec(values(&mut rng, 2 * 6 * 3 * 4, -2.0, 2.0), &[2, 6, 12]).unwrap();
    let plain = causal_self_attention(&qkv, 2, None).unwrap().to_vec();
    let layer = Dropout::new(0.5, 9).unwrap();
    assert_ne!(causal_self_attention(&qkv, 2, Some(&layer)).unwrap().to_vec(), plain);
    assert_eq!(layer.step(), 1);
    Module::<f64>::set_training(&layer, false);
    assert_eq!(causal_self_attention(&qkv, 2, Some(&layer)).unwrap().to_vec(), plain);
}

#[test]
fn causal_self_attention_refuses_bad_shapes_in_one_line() {
    let qkv = Tensor::<f32>::zeros(&[2, 3, 12]).unwrap();
    fails_with(
        causal_self_attention(&Tensor::<f32>::zeros(&[3, 12]).unwrap(), 2, None),
        "causal_self_attention: shape [3, 12] is not [batch, time, 3·embedding]",
    );
    fails_with(
        causal_self_attention(&qkv, 5, None),
        "causal_self_attention: shape [2, 3, 12] has a last axis that does not split into q, k and v of 5 heads each",
    );
    fails_with(
        causal_self_attention(&qkv, 0, None),
        "causal_self_attention: shape [2, 3, 12] has a last axis that does not split into q, k and v of 0 heads each",
    );
    fails_with(
        causal_self_attention(&qkv, 2, Some(&Dropout::new(1.0, 1).unwrap())),
        "causal_self_attention: dropout on the attention probabilities takes p < 1",
    );
}
