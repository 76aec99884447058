//! `textnet::nn` against central finite differences in f64: the gradient of every op, with respect to
//! every input element, over seeded random shapes with odd sizes and broadcast axes ([3, 1] with [1, 4],
//! a scalar, a trailing axis); then what the graph promises (gradients accumulate over backward calls,
//! `no_grad` records nothing, `detach` cuts the graph, a freed graph refuses a second backward, the same
//! run repeats to the bit), each bad input's one-line error and `Linear`'s init (the optimizers: `nn_optim`).
//!
//! Each op's check is the loss L = Σ c ⊙ op(inputs) for fixed random c (the op's output gradient, given to
//! `backward_with`), so every output element weighs in with its own factor.

use crate::common::gradcheck::{Op, TOLERANCE, check, fails_with, gradients, input, values};
use crate::common::relative;
use rand::{RngExt, SeedableRng};
use textnet::nn::{self, Linear, Module, Tensor, linear, no_grad};
use textnet::ops::cpu::SeededRng;

/// Pairs of shapes that broadcast: equal, [3, 1] with [1, 4], a scalar, a trailing axis, missing leading
/// axes, and seeded random odd sizes with random axes of size 1.
fn broadcast_pairs(rng: &mut SeededRng) -> Vec<(Vec<usize>, Vec<usize>)> {
    let mut pairs = vec![
        (vec![2, 3], vec![2, 3]),
        (vec![3, 1], vec![1, 4]),
        (vec![], vec![2, 3]),
        (vec![2, 3], vec![]),
        (vec![2, 3], vec![3]),
        (vec![5, 1, 3], vec![4, 1]),
        (vec![1], vec![7]),
    ];
    for _ in 0..4 {
        let full: Vec<usize> = (0..rng.random_range(1..4)).map(|_| [1, 2, 3, 5][rng.random_range(0..4)]).collect();
        let mut thin = full.clone();
        thin.iter_mut().for_each(|d| *d = if rng.random_bool(0.5) { 1 } else { *d });
        let drop = rng.random_range(0..=thin.len());
        pairs.push((full, thin[drop..].to_vec()));
    }
    pairs
}

#[test]
fn broadcast_binary_ops_match_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(1);
    let ops: [(&str, &Op<'_>); 4] = [
        ("add", &|t| t[0].add(&t[1])),
        ("sub", &|t| t[0].sub(&t[1])),
        ("mul", &|t| t[0].mul(&t[1])),
        ("div", &|t| t[0].div(&t[1])),
    ];
    for (a, b) in broadcast_pairs(&mut rng) {
        for (name, op) in ops {
            for (x, y) in [(&a, &b), (&b, &a)] {
                let inputs = [input(&mut rng, x, -2.0, 2.0, 0.0), input(&mut rng, y, -2.0, 2.0, 0.5)];
                check(name, &inputs, op);
            }
        }
    }
    // The same tensor on both sides: its gradient is the sum of both paths.
    check("mul (x·x)", &[input(&mut rng, &[3, 5], -2.0, 2.0, 0.0)], &|t| t[0].mul(&t[0]));
}

#[test]
fn scalar_forms_match_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(2);
    let ops: [(&str, &Op<'_>); 4] = [
        ("add_scalar", &|t| t[0].add_scalar(1.5)),
        ("sub_scalar", &|t| t[0].sub_scalar(-0.25)),
        ("mul_scalar", &|t| t[0].mul_scalar(-3.0)),
        ("div_scalar", &|t| t[0].div_scalar(0.7)),
    ];
    for (name, op) in ops {
        for shape in [vec![], vec![5], vec![3, 1, 2]] {
            check(name, &[input(&mut rng, &shape, -2.0, 2.0, 0.0)], op);
        }
    }
}

#[test]
fn unary_ops_match_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(3);
    let ops: [(&str, &Op<'_>, f64, f64, f64); 7] = [
        ("relu", &|t| t[0].relu(), -2.0, 2.0, 1e-3),
        ("gelu", &|t| t[0].gelu(), -3.0, 3.0, 0.0),
        ("tanh", &|t| t[0].tanh(), -2.0, 2.0, 0.0),
        ("sigmoid", &|t| t[0].sigmoid(), -4.0, 4.0, 0.0),
        ("exp", &|t| t[0].exp(), -2.0, 2.0, 0.0),
        ("log", &|t| t[0].log(), 0.2, 3.0, 0.0),
        ("neg", &|t| t[0].neg(), -2.0, 2.0, 0.0),
    ];
    for (name, op, low, high, clear) in ops {
        for shape in [vec![], vec![7], vec![3, 5], vec![2, 1, 3]] {
            check(name, &[input(&mut rng, &shape, low, high, clear)], op);
        }
    }
}

#[test]
fn reductions_match_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(4);
    for shape in [vec![7], vec![3, 5], vec![2, 3, 4], vec![1, 5, 1]] {
        let x = input(&mut rng, &shape, -2.0, 2.0, 0.0);
        check("sum_all", std::slice::from_ref(&x), &|t| t[0].sum_all());
        check("mean_all", std::slice::from_ref(&x), &|t| t[0].mean_all());
        let rank = shape.len() as isize;
        for axis in -rank..rank {
            for keepdim in [false, true] {
                check("sum", std::slice::from_ref(&x), &|t| t[0].sum(axis, keepdim));
                check("mean", std::slice::from_ref(&x), &|t| t[0].mean(axis, keepdim));
            }
        }
    }
}

#[test]
fn softmaxes_match_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(5);
    for shape in [vec![5], vec![3, 7], vec![2, 3, 4], vec![4, 1]] {
        let x = input(&mut rng, &shape, -3.0, 3.0, 0.0);
        check("softmax", std::slice::from_ref(&x), &|t| t[0].softmax());
        check("log_softmax", std::slice::from_ref(&x), &|t| t[0].log_softmax());
    }
}

#[test]
fn products_match_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(6);
    let pairs = [
        (vec![3, 4], vec![4, 5]),
        (vec![1, 1], vec![1, 1]),
        (vec![2, 3, 4], vec![2, 4, 5]),
        (vec![2, 3, 4], vec![4, 5]),
        (vec![3, 4], vec![2, 4, 5]),
        (vec![2, 1, 3, 2], vec![2, 1, 2, 3]),
    ];
    for (a, b) in pairs {
        let inputs = [input(&mut rng, &a, -1.0, 1.0, 0.0), input(&mut rng, &b, -1.0, 1.0, 0.0)];
        check("matmul", &inputs, &|t| t[0].matmul(&t[1]));
    }
    for (x, outputs, bias) in
        [(vec![5, 3], 4, true), (vec![2, 3, 3], 2, false), (vec![3], 2, true), (vec![7, 1], 1, true)]
    {
        let inputs_width = *x.last().unwrap();
        let mut inputs =
            vec![input(&mut rng, &x, -1.0, 1.0, 0.0), input(&mut rng, &[outputs, inputs_width], -1.0, 1.0, 0.0)];
        if bias {
            inputs.push(input(&mut rng, &[outputs], -1.0, 1.0, 0.0));
            check("linear", &inputs, &|t| linear(&t[0], &t[1], Some(&t[2])));
        } else {
            check("linear", &inputs, &|t| linear(&t[0], &t[1], None));
        }
    }
}

#[test]
fn losses_match_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(8);
    for (shape, ignore) in [(vec![6, 5], Some(-100)), (vec![2, 3, 4], Some(2)), (vec![1, 3], None), (vec![4], None)] {
        let rows: usize = shape[..shape.len() - 1].iter().product();
        let classes = *shape.last().unwrap() as i64;
        let mut targets: Vec<i64> = (0..rows).map(|_| rng.random_range(0..classes)).collect();
        if let Some(ignored) = ignore
            && rows > 1
        {
            targets[rows / 2] = ignored;
        }
        let logits = input(&mut rng, &shape, -3.0, 3.0, 0.0);
        check("cross_entropy", &[logits], &|t| t[0].cross_entropy(&targets, ignore));
    }
    for shape in [vec![], vec![5], vec![3, 4]] {
        let inputs = [input(&mut rng, &shape, -2.0, 2.0, 0.0), input(&mut rng, &shape, -2.0, 2.0, 0.0)];
        check("mse", &inputs, &|t| t[0].mse(&t[1]));
    }
}

#[test]
fn cross_entropy_ignores_the_ignored_rows() {
    // Row 1 ignored: the loss is row 0's, and row 1's logits get no gradient.
    let logits = Tensor::parameter(vec![1.0f64, 2.0, 0.5, 3.0, -1.0, 0.0], &[2, 3]).unwrap();
    let loss = logits.cross_entropy(&[2, -100], Some(-100)).unwrap();
    let row0 = Tensor::from_slice(&[1.0f64, 2.0, 0.5], &[1, 3]).unwrap().cross_entropy(&[2], None).unwrap();
    assert_eq!(loss.item().unwrap(), row0.item().unwrap());
    loss.backward().unwrap();
    assert_eq!(&logits.grad().unwrap().to_vec()[3..], [0.0; 3]);
}

#[test]
fn layout_ops_match_finite_differences() {
    let mut rng = SeededRng::seed_from_u64(9);
    let x = input(&mut rng, &[2, 3, 4], -2.0, 2.0, 0.0);
    check("reshape", std::slice::from_ref(&x), &|t| t[0].reshape(&[4, 6]));
    check("view", std::slice::from_ref(&x), &|t| t[0].view(&[24]));
    for (a, b) in [(0, 2), (-1, -2), (1, 1), (0, 1)] {
        check("transpose", std::slice::from_ref(&x), &|t| t[0].transpose(a, b));
    }
    let t = Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap().transpose(0, 1).unwrap();
    assert_eq!((t.shape(), t.to_vec()), (&[3, 2][..], vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]));
}

#[test]
fn a_small_network_matches_finite_differences() {
    // linear → gelu → linear + residual → log_softmax → a picked-out mean: the ops composed.
    let mut rng = SeededRng::seed_from_u64(10);
    let inputs = [
        input(&mut rng, &[4, 3], -1.0, 1.0, 0.0),
        input(&mut rng, &[5, 3], -1.0, 1.0, 0.0),
        input(&mut rng, &[5], -1.0, 1.0, 0.0),
        input(&mut rng, &[3, 5], -1.0, 1.0, 0.0),
    ];
    check("network", &inputs, &|t| {
        let hidden = linear(&t[0], &t[1], Some(&t[2]))?.gelu()?;
        let out = linear(&hidden, &t[3], None)?.add(&t[0])?.tanh()?;
        out.log_softmax()?.cross_entropy(&[0, 2, 1, 2], None)
    });
}

#[test]
fn a_wrong_gradient_fails_the_comparison() {
    // The comparison must see a real error: one gradient entry off by 1 % fails it.
    let mut rng = SeededRng::seed_from_u64(11);
    let inputs = [input(&mut rng, &[3, 4], -1.0, 1.0, 0.0), input(&mut rng, &[4, 2], -1.0, 1.0, 0.0)];
    let (analytic, numeric) = gradients(&inputs, &|t| t[0].matmul(&t[1]), 7);
    assert!(relative(&analytic[1], &numeric[1]) < TOLERANCE);
    let mut wrong = analytic[1].clone();
    wrong[3] *= 1.01;
    assert!(relative(&wrong, &numeric[1]) > TOLERANCE);
}

fn square_sum(p: &Tensor<f64>) -> Tensor<f64> {
    p.mul(p).unwrap().sum_all().unwrap()
}

#[test]
fn gradients_accumulate_over_backward_calls() {
    let p = Tensor::parameter(vec![1.0f64, -2.0, 3.0], &[3]).unwrap();
    square_sum(&p).backward().unwrap();
    assert_eq!(p.grad().unwrap().to_vec(), [2.0, -4.0, 6.0]);
    square_sum(&p).backward().unwrap();
    assert_eq!(p.grad().unwrap().to_vec(), [4.0, -8.0, 12.0]);
    // A graph kept by the first backward can be walked again, and adds again.
    let loss = square_sum(&p);
    loss.backward_with(None, true).unwrap();
    loss.backward().unwrap();
    assert_eq!(p.grad().unwrap().to_vec(), [8.0, -16.0, 24.0]);
    p.zero_grad();
    assert!(p.grad().is_none());
}

#[test]
fn a_freed_graph_refuses_a_second_backward() {
    let p = Tensor::parameter(vec![1.0f64, 2.0], &[2]).unwrap();
    let loss = square_sum(&p);
    loss.backward().unwrap();
    let err = loss.backward().unwrap_err().to_string();
    assert_eq!(
        err,
        "backward: the graph through sum (shape []) was freed by an earlier backward: compute it again, or keep it \
         with backward_with(grad, true)"
    );
    assert_eq!(p.grad().unwrap().to_vec(), [2.0, 4.0], "the refused backward changed nothing");
}

#[test]
fn no_grad_records_nothing() {
    let p = Tensor::parameter(vec![1.0f64, 2.0], &[2]).unwrap();
    {
        let _off = no_grad();
        assert!(!nn::is_grad_enabled());
        let y = square_sum(&p);
        assert!(!y.requires_grad() && y.is_leaf());
        assert_eq!(y.item().unwrap(), 5.0);
        assert!(
            y.backward().unwrap_err().to_string().starts_with("backward: the tensor [] (leaf) requires no gradient")
        );
        let _nested = no_grad();
    }
    assert!(nn::is_grad_enabled());
    let y = square_sum(&p);
    assert!(y.requires_grad() && !y.is_leaf() && y.op_name() == "sum");
}

#[test]
fn detach_cuts_the_graph() {
    let p = Tensor::parameter(vec![3.0f64], &[1]).unwrap();
    let y = p.mul(&p).unwrap();
    // d/dp (p² · stop(p²)) = 2p · p² with the detached factor held constant.
    let loss = y.mul(&y.detach()).unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    assert_eq!(p.grad().unwrap().to_vec(), [2.0 * 3.0 * 9.0]);
    assert!(!y.detach().requires_grad() && y.detach().is_leaf());
}

#[test]
fn an_in_place_change_after_the_forward_does_not_reach_its_backward() {
    // mul saves its inputs; changing the parameter before the backward copies it first (copy on write).
    let p = Tensor::parameter(vec![2.0f64], &[1]).unwrap();
    let loss = p.mul(&p).unwrap().sum_all().unwrap();
    p.copy_from_slice(&[100.0]).unwrap();
    loss.backward().unwrap();
    assert_eq!(p.grad().unwrap().to_vec(), [4.0]);
    assert_eq!(p.to_vec(), [100.0]);
}

#[test]
fn copy_from_takes_another_tensors_elements_in_place_and_refuses_another_count() {
    let p = Tensor::parameter(vec![2.0f64, 3.0], &[2]).unwrap();
    let loss = p.mul(&p).unwrap().sum_all().unwrap();
    let source = Tensor::from_vec(vec![7.0f64, 8.0], &[1, 2]).unwrap();
    p.copy_from(&source).unwrap();
    loss.backward().unwrap();
    // The backward recorded before the copy keeps the old values (copy on write), as copy_from_slice's.
    assert_eq!(p.grad().unwrap().to_vec(), [4.0, 6.0]);
    assert_eq!(p.to_vec(), [7.0, 8.0]);
    let err = p.copy_from(&Tensor::from_vec(vec![1.0f64; 3], &[3]).unwrap()).unwrap_err().to_string();
    assert!(err.starts_with("copy_from: shapes [2] and [3] differ in their number of elements"), "{err}");
}

/// The gradients of a small network after one backward.
fn run_once() -> Vec<Vec<f32>> {
    let mut rng = SeededRng::seed_from_u64(12);
    let (l1, l2) = (Linear::<f32>::new(7, 33, true, &mut rng).unwrap(), Linear::new(33, 5, true, &mut rng).unwrap());
    let x = Tensor::from_vec(values(&mut rng, 11 * 7, -1.0, 1.0).iter().map(|&v| v as f32).collect(), &[11, 7]);
    let logits = l2.forward(&l1.forward(&x.unwrap()).unwrap().relu().unwrap()).unwrap();
    logits.cross_entropy(&[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0], None).unwrap().backward().unwrap();
    l1.parameters().iter().chain(&l2.parameters()).map(|p| p.grad().unwrap().to_vec()).collect()
}

#[test]
fn the_same_run_repeats_to_the_bit() {
    let (a, b) = (run_once(), run_once());
    let bits = |g: &Vec<Vec<f32>>| g.iter().flatten().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn f32_gradients_agree_with_f64() {
    // The f32 instantiation runs the same code: its gradients are the f64 ones to f32's precision.
    let mut rng = SeededRng::seed_from_u64(13);
    let (x, w, b) = (values(&mut rng, 12, -1.0, 1.0), values(&mut rng, 15, -1.0, 1.0), values(&mut rng, 5, -1.0, 1.0));
    fn grads<F: textnet::ops::cpu::Real>(x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
        let of = |v: &[f64]| v.iter().map(|&v| F::from(v).unwrap()).collect::<Vec<F>>();
        let (x, w) = (Tensor::parameter(of(x), &[4, 3]).unwrap(), Tensor::parameter(of(w), &[5, 3]).unwrap());
        let b = Tensor::parameter(of(b), &[5]).unwrap();
        let y = linear(&x, &w, Some(&b)).unwrap().sigmoid().unwrap().softmax().unwrap();
        y.mul(&y).unwrap().mean_all().unwrap().backward().unwrap();
        [x, w, b]
            .iter()
            .flat_map(|p| p.grad().unwrap().to_vec())
            .map(|v| num_traits::ToPrimitive::to_f64(&v).unwrap())
            .collect()
    }
    let (single, double) = (grads::<f32>(&x, &w, &b), grads::<f64>(&x, &w, &b));
    assert!(relative(&single, &double) < 1e-5, "{single:?}\n{double:?}");
}

#[test]
fn each_bad_input_is_one_line_naming_the_op_and_shapes() {
    let t = |shape: &[usize]| Tensor::<f32>::zeros(shape).unwrap();
    let p = |shape: &[usize]| {
        let t = t(shape);
        t.set_requires_grad(true).unwrap();
        t
    };
    fails_with(t(&[2, 3]).add(&t(&[4])), "add: shapes [2, 3] and [4] do not broadcast");
    fails_with(t(&[3, 2]).mul(&t(&[2, 3])), "mul: shapes [3, 2] and [2, 3] do not broadcast");
    fails_with(t(&[2, 3]).matmul(&t(&[4, 5])), "matmul: shapes [2, 3] and [4, 5] do not multiply");
    fails_with(
        t(&[3]).matmul(&t(&[3, 2])),
        "matmul: shapes [3] and [3, 2] do not multiply: each needs two axes or more",
    );
    fails_with(
        t(&[2, 2, 3]).matmul(&t(&[3, 3, 4])),
        "matmul: shapes [2, 2, 3] and [3, 3, 4] do not multiply: their leading (batch) axes differ",
    );
    fails_with(
        linear(&t(&[5, 3]), &t(&[4, 2]), None),
        "linear: shapes [5, 3] and [4, 2] do not multiply: the input's last axis must be the weight's second ([out, in])",
    );
    fails_with(
        linear(&t(&[5, 3]), &t(&[4, 3]), Some(&t(&[3]))),
        "linear: shapes [4, 3] and [3] do not match: the bias must be [out]",
    );
    fails_with(linear(&t(&[5, 3]), &t(&[3]), None), "linear: shape [3] is not a weight of two axes [out, in]");
    fails_with(
        p(&[2, 3]).relu().unwrap().backward(),
        "backward: shape [2, 3] is not a scalar: give the gradient of the output (backward_with)",
    );
    fails_with(
        p(&[2, 3]).relu().unwrap().backward_with(Some(&t(&[3, 2])), false),
        "backward: shapes [2, 3] and [3, 2] differ: the gradient (second) must have the output's shape",
    );
    fails_with(t(&[2, 3]).sum(2, false), "sum: shape [2, 3] has no axis 2 (2 axes)");
    fails_with(t(&[2, 3]).mean(-3, true), "mean: shape [2, 3] has no axis -3 (2 axes)");
    fails_with(t(&[2, 3]).transpose(0, 5), "transpose: shape [2, 3] has no axis 5 (2 axes)");
    fails_with(t(&[]).softmax(), "softmax: shape [] has no last axis to normalise over");
    fails_with(t(&[2, 3]).reshape(&[4]), "reshape: shapes [2, 3] and [4] hold different numbers of elements");
    fails_with(t(&[2, 3]).mse(&t(&[3, 2])), "mse: shapes [2, 3] and [3, 2] differ");
    fails_with(
        t(&[4, 5]).cross_entropy(&[0, 1, 2], None),
        "cross_entropy: shapes [4, 5] and [3] do not match: one target for each row of the logits (second shape: the \
         targets')",
    );
    fails_with(t(&[2, 5]).cross_entropy(&[0, 5], None), "cross_entropy: target 5 of row 1 is not a class of 0..5");
    fails_with(t(&[2, 5]).cross_entropy(&[0, -1], None), "cross_entropy: target -1 of row 1 is not a class of 0..5");
    fails_with(
        t(&[2, 5]).cross_entropy(&[-100, -100], Some(-100)),
        "cross_entropy: no row is left to average over (ignore_index -100)",
    );
    fails_with(
        Tensor::from_vec(vec![1.0f32; 5], &[2, 3]),
        "from_vec: shape [2, 3] holds 6 elements, but 5 values were given",
    );
    fails_with(
        Tensor::<f32>::zeros(&[usize::MAX, 2]),
        "full: shape [18446744073709551615, 2] has more elements than memory can address",
    );
    fails_with(t(&[2]).item(), "item: shape [2] is not one element");
    fails_with(
        p(&[2]).relu().unwrap().set_requires_grad(false),
        "set_requires_grad: the result of relu follows its inputs; detach it first",
    );
}

#[test]
fn linear_is_initialised_as_pytorchs_and_seeded() {
    let layer = |seed| Linear::<f32>::new(9, 4, true, &mut SeededRng::seed_from_u64(seed)).unwrap();
    let (a, b, c) = (layer(3), layer(3), layer(4));
    assert_eq!(a.weight.to_vec(), b.weight.to_vec());
    assert_ne!(a.weight.to_vec(), c.weight.to_vec());
    assert_eq!(
        (a.inputs(), a.outputs(), a.weight.shape(), a.bias.as_ref().unwrap().shape()),
        (9, 4, &[4, 9][..], &[4][..])
    );
    let bound = 1.0 / 3.0;
    assert!(a.parameters().iter().flat_map(|p| p.to_vec()).all(|v| v.abs() <= bound));
    assert!(a.parameters().iter().all(|p| p.requires_grad() && p.is_leaf()));
}
