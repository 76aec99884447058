//! The transformer's CPU reference against central finite differences in f64: the gradient of every
//! parameter element, for full-length sequences and for sequences shorter than the block; the exposed
//! activation gradients (d logits, d x entering block 0, and each stage's row sums against its bias's
//! checked gradient); and wrong gradients fail the same comparison. With dropout too: the masks are
//! fixed for a step, so its loss is a smooth function of the parameters with its own exact gradient.

use crate::common::relative;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Normal};
use textnet::ops::cpu::SeededRng;
use textnet::ops::dropout::DropoutKey;
use textnet::ops::losses::softmax_xent;
use textnet::transformer::model::{Backward, Config, Dropout, Layout, backward, forward, init, loss_and_grad};

const CONFIG: Config = Config { vocab: 7, block: 5, embed: 8, heads: 2, layers: 2, bias: true, tie_weights: false };
const H: f64 = 1e-5;
const TOLERANCE: f64 = 1e-6;

/// `init`'s parameters moved by Normal(0, 0.3) noise, so that no path is near zero or the identity
/// (LayerNorm weights away from 1, biases away from 0, attention far from uniform).
fn params(config: &Config, seed: u64) -> Vec<f64> {
    let mut rng = SeededRng::seed_from_u64(seed);
    let noise = Normal::new(0.0, 0.3).unwrap();
    init(config, seed).iter().map(|&v| v as f64 + noise.sample(&mut rng)).collect()
}

fn ids(n: usize, vocab: usize, rng: &mut SeededRng) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

/// Dropout 0.3 in step `step` of a run of seed 11.
fn dropout(step: u32) -> Option<Dropout> {
    Some(Dropout { p: 0.3, key: DropoutKey { seed: 11, step } })
}

fn loss(config: &Config, params: &[f64], tokens: &[u32], targets: &[u32], batch: usize, drop: Option<Dropout>) -> f64 {
    forward(config, params, tokens, batch, Some(targets), drop).loss.unwrap()
}

/// Central differences of the mean loss over every parameter.
fn numeric(
    config: &Config,
    params: &[f64],
    tokens: &[u32],
    targets: &[u32],
    batch: usize,
    drop: Option<Dropout>,
) -> Vec<f64> {
    let mut q = params.to_vec();
    (0..params.len())
        .map(|i| {
            q[i] = params[i] + H;
            let up = loss(config, &q, tokens, targets, batch, drop);
            q[i] = params[i] - H;
            let down = loss(config, &q, tokens, targets, batch, drop);
            q[i] = params[i];
            (up - down) / (2.0 * H)
        })
        .collect()
}

/// The tensors whose analytic gradient is more than `TOLERANCE` (relative) from the numeric one.
fn mismatches(layout: &Layout, analytic: &[f64], numeric: &[f64]) -> Vec<String> {
    layout
        .tensors()
        .iter()
        .filter(|t| {
            let err = relative(&analytic[t.range()], &numeric[t.range()]);
            err.is_nan() || err >= TOLERANCE
        })
        .map(|t| t.name.clone())
        .collect()
}

/// A batch: `batch` sequences of `seq` positions.
fn problem(config: &Config, batch: usize, seq: usize, seed: u64) -> (Vec<f64>, Vec<u32>, Vec<u32>) {
    let mut rng = SeededRng::seed_from_u64(seed + 100);
    (params(config, seed), ids(batch * seq, config.vocab, &mut rng), ids(batch * seq, config.vocab, &mut rng))
}

fn check_every_parameter(batch: usize, seq: usize, seed: u64, drop: Option<Dropout>) {
    check_model(&CONFIG, batch, seq, seed, drop);
}

fn check_model(config: &Config, batch: usize, seq: usize, seed: u64, drop: Option<Dropout>) {
    let (params, tokens, targets) = problem(config, batch, seq, seed);
    let (loss, grad) = loss_and_grad(config, &params, &tokens, &targets, batch, drop);
    let layout = Layout::new(config);
    let c = config.embed;
    for t in layout.tensors() {
        // Exactly zero: the embeddings of ids not in the batch, the positions past the sequence, and q and
        // k when a sequence has one position (its softmax is 1 whatever the score). Nothing else.
        let idle = |i: usize| match t.name.as_str() {
            // A tied head reads every row of tok_emb.
            "tok_emb.weight" => !config.tie_weights && !tokens.contains(&((i / c) as u32)),
            "pos_emb.weight" => i / c >= seq,
            name if name.ends_with("attn.qkv.weight") => seq == 1 && i < 2 * c * c,
            name if name.ends_with("attn.qkv.bias") => seq == 1 && i < 2 * c,
            _ => false,
        };
        // Dropout may zero more (an embedding element dropped wherever it occurs).
        for (i, g) in grad[t.range()].iter().enumerate() {
            if drop.is_none() || idle(i) {
                assert_eq!(*g == 0.0, idle(i), "{} element {i}: gradient {g}", t.name);
            }
        }
    }
    let fd = numeric(config, &params, &tokens, &targets, batch, drop);
    let bad = mismatches(&layout, &grad, &fd);
    assert!(bad.is_empty(), "B {batch} T {seq} dropout {drop:?}: relative errors over {TOLERANCE:e}: {bad:?}");
    let worst = layout.tensors().iter().map(|t| relative(&grad[t.range()], &fd[t.range()])).fold(0.0, f64::max);
    println!("B {batch} T {seq}: loss {loss:.6}, worst relative error of a tensor {worst:.1e}");
}

#[test]
fn every_parameter_gradient_matches_finite_differences() {
    check_every_parameter(2, CONFIG.block, 1, None);
}

#[test]
fn sequences_shorter_than_the_block_too() {
    check_every_parameter(3, 3, 2, None);
    check_every_parameter(1, 1, 3, None);
}

/// Without biases, with the head tied to tok_emb (its gradient the sum of both uses), and both.
#[test]
fn without_biases_and_with_tied_weights_too() {
    for (bias, tie_weights) in [(false, false), (true, true), (false, true)] {
        let config = Config { bias, tie_weights, ..CONFIG };
        check_model(&config, 2, CONFIG.block, 9, None);
        check_model(&config, 2, 3, 10, dropout(3));
    }
}

#[test]
fn every_parameter_gradient_matches_finite_differences_with_dropout() {
    check_every_parameter(2, CONFIG.block, 1, dropout(0));
    check_every_parameter(3, 3, 2, dropout(5));
}

/// Dropout changes the loss, draws another mask each step, and is the identity at p = 0.
#[test]
fn dropout_masks_differ_by_step_and_p_zero_is_none() {
    let (params, tokens, targets) = problem(&CONFIG, 2, CONFIG.block, 8);
    let plain = loss(&CONFIG, &params, &tokens, &targets, 2, None);
    let (first, second) = (
        loss(&CONFIG, &params, &tokens, &targets, 2, dropout(0)),
        loss(&CONFIG, &params, &tokens, &targets, 2, dropout(1)),
    );
    assert!(first != plain && second != plain && first != second, "{plain} {first} {second}");
    assert_eq!(first, loss(&CONFIG, &params, &tokens, &targets, 2, dropout(0)), "a step's masks repeat");
    let off = Some(Dropout { p: 0.0, ..dropout(0).unwrap() });
    assert_eq!(plain.to_bits(), loss(&CONFIG, &params, &tokens, &targets, 2, off).to_bits());
}

#[test]
fn backward_and_loss_and_grad_agree_to_the_bit() {
    let (params, tokens, targets) = problem(&CONFIG, 3, 4, 4);
    for drop in [None, dropout(2)] {
        let f = forward(&CONFIG, &params, &tokens, 3, Some(&targets), drop);
        let back = backward(&CONFIG, &params, &f, &targets);
        let (loss, grad) = loss_and_grad(&CONFIG, &params, &tokens, &targets, 3, drop);
        assert_eq!(f.loss.unwrap().to_bits(), loss.to_bits());
        assert!(back.grad.iter().zip(&grad).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

/// d logits against differences of the loss as a function of the logits.
#[test]
fn d_logits_matches_finite_differences() {
    let (params, tokens, targets) = problem(&CONFIG, 2, 4, 5);
    let f = forward(&CONFIG, &params, &tokens, 2, Some(&targets), None);
    let back = backward(&CONFIG, &params, &f, &targets);
    let v = CONFIG.vocab;
    let loss_of = |logits: &[f64]| -> f64 {
        let mut d = vec![0.0; v];
        logits.chunks(v).zip(&targets).map(|(row, &t)| softmax_xent(row, t as usize, &mut d)).sum::<f64>()
            / targets.len() as f64
    };
    assert!((loss_of(&f.logits) - f.loss.unwrap()).abs() < 1e-15);
    let mut logits = f.logits.clone();
    let fd: Vec<f64> = (0..logits.len())
        .map(|i| {
            logits[i] = f.logits[i] + H;
            let up = loss_of(&logits);
            logits[i] = f.logits[i] - H;
            let down = loss_of(&logits);
            logits[i] = f.logits[i];
            (up - down) / (2.0 * H)
        })
        .collect();
    let err = relative(&back.d_logits, &fd);
    assert!(err < TOLERANCE, "d logits: relative error {err:.1e}");
}

/// d x entering block 0 against differences of the loss: with every token of the batch different, moving
/// a token's embedding moves x at that one position only.
#[test]
fn d_x_of_the_first_block_matches_finite_differences() {
    let config = Config { vocab: 12, ..CONFIG };
    let (batch, seq) = (2, 5);
    let mut rng = SeededRng::seed_from_u64(6);
    let params = params(&config, 6);
    let mut tokens: Vec<u32> = (1..=10).collect();
    for i in (1..tokens.len()).rev() {
        tokens.swap(i, rng.random_range(0..=i));
    }
    let targets = ids(batch * seq, config.vocab, &mut rng);
    let f = forward(&config, &params, &tokens, batch, Some(&targets), None);
    let back = backward(&config, &params, &f, &targets);
    let c = config.embed;
    let mut q = params.clone();
    let mut fd = Vec::new();
    for &token in &tokens {
        for i in token as usize * c..(token as usize + 1) * c {
            q[i] = params[i] + H;
            let up = loss(&config, &q, &tokens, &targets, batch, None);
            q[i] = params[i] - H;
            let down = loss(&config, &q, &tokens, &targets, batch, None);
            q[i] = params[i];
            fd.push((up - down) / (2.0 * H));
        }
    }
    let err = relative(&back.blocks[0].d_x, &fd);
    assert!(err < TOLERANCE, "d x of block 0: relative error {err:.1e}");
}

/// Column sums of `rows` (rows of `width`).
fn column_sums(rows: &[f64], width: usize) -> Vec<f64> {
    let mut sums = vec![0.0; width];
    for row in rows.chunks(width) {
        sums.iter_mut().zip(row).for_each(|(s, r)| *s += r);
    }
    sums
}

/// Each stage's activation gradient sums, over the positions, to the gradient of the bias added at that
/// stage, which the finite differences above check: the fields hold the gradients the backward pass used.
#[test]
fn activation_gradients_sum_to_their_bias_gradients() {
    let (params, tokens, targets) = problem(&CONFIG, 2, 4, 7);
    let f = forward(&CONFIG, &params, &tokens, 2, Some(&targets), None);
    let back: Backward<f64> = backward(&CONFIG, &params, &f, &targets);
    let layout = Layout::new(&CONFIG);
    let bias = |name: &str| &back.grad[layout.get(name).unwrap().range()];
    let close = |sums: Vec<f64>, name: &str| {
        let err = relative(&sums, bias(name));
        assert!(err < 1e-12, "{name}: the activation gradient sums to {sums:?}, not {:?}", bias(name));
    };
    let (c, ff, v) = (CONFIG.embed, CONFIG.ffn(), CONFIG.vocab);
    close(column_sums(&back.d_logits, v), "head.bias");
    close(column_sums(&back.d_xf, c), "ln_f.bias");
    for (l, b) in back.blocks.iter().enumerate() {
        close(column_sums(&b.d_x_out, c), &format!("blocks.{l}.mlp.proj.bias"));
        close(column_sums(&b.d_u, ff), &format!("blocks.{l}.mlp.fc.bias"));
        close(column_sums(&b.d_ln2, c), &format!("blocks.{l}.ln2.bias"));
        close(column_sums(&b.d_x_attn, c), &format!("blocks.{l}.attn.proj.bias"));
        close(column_sums(&b.d_qkv, 3 * c), &format!("blocks.{l}.attn.qkv.bias"));
        close(column_sums(&b.d_ln1, c), &format!("blocks.{l}.ln1.bias"));
        // Through the softmax: every row of d scores sums to zero, and nothing lies above the diagonal.
        let t = f.seq;
        for (row, (ds, da)) in b.d_scores.chunks(t).zip(b.d_att.chunks(t)).enumerate() {
            let pos = row % t;
            assert!(ds.iter().sum::<f64>().abs() < 1e-15);
            assert!(ds[pos + 1..].iter().chain(&da[pos + 1..]).all(|&x| x == 0.0));
        }
    }
    // The residual stream's gradient flows into the embeddings.
    let x0 = &back.blocks[0].d_x;
    let mut pos = vec![0.0; CONFIG.block * c];
    for (i, row) in x0.chunks(c).enumerate() {
        let t = i % f.seq;
        pos[t * c..][..c].iter_mut().zip(row).for_each(|(p, r)| *p += r);
    }
    close(pos, "pos_emb.weight");
}

/// A gradient off by 1 % in one element, off by 0.1 % over a whole tensor, or with its q and k parts
/// swapped, fails the comparison that passes above.
#[test]
fn a_wrong_gradient_fails_the_comparison() {
    let (params, tokens, targets) = problem(&CONFIG, 2, CONFIG.block, 1);
    let (_, grad) = loss_and_grad(&CONFIG, &params, &tokens, &targets, 2, None);
    let fd = numeric(&CONFIG, &params, &tokens, &targets, 2, None);
    let layout = Layout::new(&CONFIG);
    assert!(mismatches(&layout, &grad, &fd).is_empty());
    let qkv = layout.get("blocks.1.attn.qkv.weight").unwrap().range();

    let mut one = grad.clone();
    let largest = qkv.clone().max_by(|&a, &b| grad[a].abs().total_cmp(&grad[b].abs())).unwrap();
    one[largest] *= 1.01;
    assert_eq!(mismatches(&layout, &one, &fd), ["blocks.1.attn.qkv.weight"]);

    let mut scaled = grad.clone();
    let fc = layout.get("blocks.0.mlp.fc.weight").unwrap().range();
    scaled[fc].iter_mut().for_each(|g| *g *= 1.001);
    assert_eq!(mismatches(&layout, &scaled, &fd), ["blocks.0.mlp.fc.weight"]);

    let mut swapped = grad.clone();
    let c = CONFIG.embed;
    let (q, k) = swapped[qkv].split_at_mut(c * c);
    q.swap_with_slice(&mut k[..c * c]);
    assert_eq!(mismatches(&layout, &swapped, &fd), ["blocks.1.attn.qkv.weight"]);
}
