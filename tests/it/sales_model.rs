//! The sales regressor: its initialisation, its trainer (fit's network `Linear(n, H), ReLU, Linear(H, 1)`,
//! whose gradients fit's finite-difference checks cover) holding the parameters in the sales layout, and a
//! training run on a generated table that halves the baseline's mean absolute error.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;
use textnet::datasets::features::{Dataset, SplitOrder, Stats};
use textnet::device::Backend;
use textnet::harness::run::{TEST, Trainer};
use textnet::ops::optim::{OptimConfig, OptimKind};
use textnet::sales::model::network;
use textnet::sales::model::{SalesParams, SalesShape, Shuffle, baseline_mae, evaluate, predict};
use textnet::sales::table::{LoadOptions, Schema, Table};
use textnet::sales::train::FitSales;

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
fn predictions_read_the_parameters_in_the_sales_layout() {
    let shape = SalesShape { inputs: 5, hidden: 6 };
    assert_eq!(network(shape).unwrap().param_count, shape.param_count());
    let p = SalesParams::init(shape, 3);
    let rows = [[0.5f32, -1.0, 0.25, 2.0, -0.75], [-0.3, 0.8, 1.5, -2.0, 0.1]];
    let got = predict(&p, rows.as_flattened()).unwrap();
    let w = p.parts();
    for (x, got) in rows.iter().zip(&got) {
        // y = b2 + Σ_j w2[j]·relu(W1[j]·x + b1[j]), W1 row-major [hidden][inputs].
        let want: f64 = w.b2[0] as f64
            + (0..6)
                .map(|j| {
                    let z: f64 = (0..5).map(|i| w.w1[j * 5 + i] as f64 * x[i] as f64).sum::<f64>() + w.b1[j] as f64;
                    w.w2[j] as f64 * z.max(0.0)
                })
                .sum::<f64>();
        assert!((*got as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "{got} vs {want}");
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
    let start = Instant::now();
    let mut trainer =
        FitSales::new(&Backend::Cpu, &data, SalesParams::init(shape, 1), OptimConfig::new(OptimKind::Adam), None, 64)
            .unwrap();
    let mut shuffle = Shuffle::new(data.train.rows, 1);
    let rates = vec![OptimConfig::new(OptimKind::Adam).lr; data.train.rows.div_ceil(64)];
    let losses: Vec<f64> = (0..20)
        .map(|_| {
            trainer.train_epoch(shuffle.next_epoch(), 64, &rates, &mut |_, _| {}).unwrap() / train_split.rows as f64
        })
        .collect();
    let p = trainer.params().unwrap();
    assert_eq!(trainer.evaluate(TEST).unwrap(), evaluate(&p, &test_split, &stats).unwrap());
    let secs = start.elapsed().as_secs_f64();
    let eval = evaluate(&p, &test_split, &stats).unwrap();
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
