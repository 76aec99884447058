//! The sales CPU reference: analytic gradients against central finite differences for every parameter,
//! and a training run on a generated table that halves the baseline's mean absolute error.

use crate::common::relative;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;
use textnet::ops::optim::{OptimConfig, OptimKind};
use textnet::sales::data::{Dataset, Split, SplitOrder, Stats};
use textnet::sales::model::{SalesParams, SalesShape, Schedule, baseline_mae, evaluate, loss_and_grad, predict, train};
use textnet::sales::table::{LoadOptions, Schema, Table};

const EPS: f32 = 1e-3;

/// A small standardised split: 5 features (one of them one-hot like), target a nonlinear function.
fn small_split(rows: usize) -> Split {
    let features = 5;
    let mut x = Vec::new();
    let mut y = Vec::new();
    for i in 0..rows {
        let r: Vec<f32> = (0..features).map(|j| ((i * 7 + j * 13) % 11) as f32 / 5.0 - 1.0).collect();
        y.push(r[0] * r[1] + 0.5 * r[2] - r[3].abs());
        x.extend(r);
    }
    Split { rows, features, x, y, lines: (1..=rows as u64).collect() }
}

/// The smallest |z| over the rows and hidden units, against how far one perturbation can move a z.
fn clear_of_kinks(p: &SalesParams, data: &Split) -> bool {
    let n = p.shape.inputs;
    let w = p.parts();
    (0..data.rows).all(|r| {
        let x = data.row(r);
        let reach = EPS * x.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        (0..p.shape.hidden).all(|j| {
            let z: f32 = w.w1[j * n..][..n].iter().zip(x).map(|(a, b)| a * b).sum::<f32>() + w.b1[j];
            z.abs() > 3.0 * reach
        })
    })
}

fn gradients(p: &SalesParams, data: &Split, rows: &[u32]) -> (Vec<f64>, Vec<f64>) {
    let mut grad = vec![0.0; p.flat.len()];
    loss_and_grad(p, data, rows, &mut grad);
    let analytic: Vec<f64> = grad.iter().map(|&g| g as f64).collect();
    let numeric = (0..p.flat.len())
        .map(|i| {
            let at = |delta: f32| {
                let mut q = p.clone();
                q.flat[i] += delta;
                loss_and_grad(&q, data, rows, &mut vec![0.0; q.flat.len()])
            };
            (at(EPS) - at(-EPS)) / (2.0 * EPS as f64)
        })
        .collect();
    (analytic, numeric)
}

#[test]
fn every_gradient_matches_finite_differences() {
    let data = small_split(12);
    let rows: Vec<u32> = vec![3, 0, 7, 11, 5, 8, 2, 9];
    let shape = SalesShape { inputs: 5, hidden: 6 };
    let p = (1..).map(|seed| SalesParams::init(shape, seed)).find(|p| clear_of_kinks(p, &data)).unwrap();
    let (analytic, numeric) = gradients(&p, &data, &rows);
    assert_eq!(analytic.len(), 6 * 5 + 6 + 6 + 1);
    assert!(analytic.iter().all(|g| g.is_finite()));
    // Some hidden units are active, some not: the gradient is neither all zero nor all non-zero.
    assert!(analytic.iter().filter(|g| **g != 0.0).count() > analytic.len() / 3);
    let err = relative(&numeric, &analytic);
    assert!(err < 1e-3, "relative error {err:.2e}\nanalytic {analytic:?}\nnumeric  {numeric:?}");
}

#[test]
fn a_wrong_gradient_fails_the_comparison() {
    let data = small_split(12);
    let rows: Vec<u32> = (0..8).collect();
    let shape = SalesShape { inputs: 5, hidden: 6 };
    let p = (1..).map(|seed| SalesParams::init(shape, seed)).find(|p| clear_of_kinks(p, &data)).unwrap();
    let (analytic, numeric) = gradients(&p, &data, &rows);
    assert!(relative(&numeric, &analytic) < 1e-3);
    // One entry off by 5 %, in each tensor in turn: the comparison fails.
    for range in [0..30, 30..36, 36..42, 42..43] {
        let mut wrong = analytic.clone();
        let i = range.clone().max_by(|&a, &b| wrong[a].abs().total_cmp(&wrong[b].abs())).unwrap();
        assert!(wrong[i] != 0.0);
        wrong[i] *= 1.05;
        assert!(relative(&numeric, &wrong) > 1e-3, "entry {i} of {range:?}");
    }
}

#[test]
fn init_is_pytorch_linear_and_seeded() {
    let shape = SalesShape { inputs: 19, hidden: 32 };
    let p = SalesParams::init(shape, 7);
    assert_eq!(p, SalesParams::init(shape, 7));
    assert_ne!(p, SalesParams::init(shape, 8));
    let w = p.parts();
    let (l1, l2) = (1.0 / 19f32.sqrt(), 1.0 / 32f32.sqrt());
    assert!(w.w1.iter().chain(w.b1).all(|v| v.abs() <= l1));
    assert!(w.w2.iter().chain(w.b2).all(|v| v.abs() <= l2));
    assert!(w.w1.iter().any(|v| v.abs() > 0.9 * l1) && w.w2.iter().any(|v| v.abs() > 0.9 * l2));
    assert_eq!(w.w1.len(), 32 * 19);
    assert_eq!(w.b2.len(), 1);
}

#[test]
fn the_batch_gradient_is_the_mean_of_single_row_gradients() {
    let data = small_split(12);
    let p = SalesParams::init(SalesShape { inputs: 5, hidden: 6 }, 3);
    let rows: Vec<u32> = vec![1, 4, 9];
    let mut batch = vec![0.0; p.flat.len()];
    let loss = loss_and_grad(&p, &data, &rows, &mut batch);
    let mut sum = vec![0.0f32; p.flat.len()];
    let mut loss_sum = 0.0;
    for &r in &rows {
        let mut g = vec![0.0; p.flat.len()];
        loss_sum += loss_and_grad(&p, &data, &[r], &mut g);
        sum.iter_mut().zip(&g).for_each(|(s, g)| *s += g / 3.0);
        let err = predict(&p, data.row(r as usize)) - data.y[r as usize];
        assert!((loss_and_grad(&p, &data, &[r], &mut g) - (err * err) as f64).abs() < 1e-6);
    }
    assert!((loss - loss_sum / 3.0).abs() < 1e-6);
    for (a, b) in batch.iter().zip(&sum) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

/// A `rows`-row table from scripts/make-sales.py, in a temporary directory.
fn generated(rows: usize, seed: u64) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sales.tsv");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/make-sales.py");
    let status = Command::new("python3")
        .arg(&script)
        .args(["--rows", &rows.to_string(), "--seed", &seed.to_string(), "--out"])
        .arg(&path)
        .status()
        .expect("python3 runs scripts/make-sales.py");
    assert!(status.success());
    (dir, path)
}

#[test]
fn twenty_epochs_on_a_generated_table_halve_the_baseline_error() {
    let (_dir, path) = generated(20_000, 1);
    let table = Table::read(&path, &LoadOptions::new(Schema::sales_tsv())).unwrap();
    assert_eq!((table.rows.len(), table.skipped), (20_000, 0));
    let data = Dataset::from_table(&table, 0.8, SplitOrder::File, 0).unwrap();
    assert_eq!((data.train.rows, data.test.rows), (16_000, 4_000));
    let stats = Stats::of(&data.train);
    let (train_split, test_split) = (stats.normalize(&data.train), stats.normalize(&data.test));
    let shape = SalesShape { inputs: data.features(), hidden: 32 };
    let mut p = SalesParams::init(shape, 1);
    let start = Instant::now();
    let losses =
        train(&mut p, OptimConfig::new(OptimKind::Adam), &train_split, Schedule { epochs: 20, batch: 64, seed: 1 })
            .unwrap();
    let secs = start.elapsed().as_secs_f64();
    let eval = evaluate(&p, &test_split, &stats);
    let baseline = baseline_mae(&test_split, &stats);
    eprintln!(
        "{} features; train loss {:.4} → {:.4}; test MSE {:.4}, MAE {:.3} vs baseline {:.3} ({:.3}×) in {secs:.2} s",
        shape.inputs,
        losses[0],
        losses[19],
        eval.mse,
        eval.mae,
        baseline,
        eval.mae / baseline
    );
    assert!(losses[19] < losses[0]);
    assert!(eval.mae <= 0.5 * baseline, "test MAE {} vs baseline {baseline}", eval.mae);
}
