//! The batched CPU trainer (`text::cpu_batch`) against the single-sample reference (`text::model`):
//! its gradients are `model::backward`'s, its step `model::train_step`'s, its evaluation
//! `model::evaluate`'s; its exp is `f32::exp` within 2 ulp; its gradients agree with finite differences
//! of its own loss; its results do not depend on the number of threads. Then `textnet train` on the CPU
//! through the binary: it says what it will do and how long that should take before training, with
//! the CPU's defaults or the flags given.

use crate::common::text::{shakespeare, train_args};
use crate::common::{text, textnet};
use rand::{RngExt, SeedableRng};
use std::sync::Arc;
use textnet::harness::check::rel_error;
use textnet::ops::cpu::SeededRng;
use textnet::text::cpu_batch::{BatchTrainer, exp_nonpositive, gradients};
use textnet::text::model::{self, TextParams, TextShape, context_of};
use textnet::text::{CpuTrainer, TextTrainer};

const SHAPE: TextShape = TextShape { vocab: 53, embed: 12, hidden: 20, context: 3 };

/// A random token stream (token 0 and repeats within a context included), parameters with non-zero
/// biases, and `batch` random target positions (some twice).
fn problem(seed: u64, batch: usize) -> (TextParams, Arc<[u32]>, Vec<u32>) {
    let mut rng = SeededRng::seed_from_u64(seed);
    let tokens: Vec<u32> = (0..400).map(|_| rng.random_range(0..SHAPE.vocab as u32)).collect();
    let mut p = TextParams::init(SHAPE, seed);
    p.b1.iter_mut().for_each(|b| *b = rng.random_range(-0.1..0.1));
    p.b2.iter_mut().for_each(|b| *b = rng.random_range(-0.5..0.5));
    let mut positions: Vec<u32> = (0..batch).map(|_| rng.random_range(SHAPE.context as u32..400)).collect();
    positions[batch - 1] = positions[0];
    (p, tokens.into(), positions)
}

fn contexts<'a>(tokens: &'a [u32], positions: &[u32]) -> Vec<&'a [u32]> {
    positions.iter().map(|&pos| context_of(tokens, pos, SHAPE.context)).collect()
}

fn targets(tokens: &[u32], positions: &[u32]) -> Vec<u32> {
    positions.iter().map(|&pos| tokens[pos as usize]).collect()
}

fn assert_close(name: &str, got: &[f32], want: &[f32], tolerance: f64) {
    let e = rel_error(got, want);
    assert!(e <= tolerance, "{name}: relative error {e:.2e} > {tolerance:.0e}");
}

fn assert_params_close(what: &str, got: &TextParams, want: &TextParams, tolerance: f64) {
    for ((name, g, _), (_, w, _)) in got.tensors().iter().zip(want.tensors().iter()) {
        assert_close(&format!("{what} {name}"), g, w, tolerance);
    }
}

#[test]
fn batched_gradients_are_the_reference_gradients() {
    for (seed, batch) in [(1, 1), (2, 13), (3, 64)] {
        let (p, tokens, positions) = problem(seed, batch);
        let (want, want_loss) = model::backward(&p, &contexts(&tokens, &positions), &targets(&tokens, &positions));
        let (got, loss) = gradients(&p, &tokens, &positions);
        assert!((loss - want_loss).abs() <= 1e-5 * want_loss, "batch {batch}: loss {loss} vs {want_loss}");
        for (name, g, w) in [
            ("w1", &got.w1, &want.w1),
            ("b1", &got.b1, &want.b1),
            ("w2", &got.w2, &want.w2),
            ("b2", &got.b2, &want.b2),
            ("dh", &got.dh, &want.dh),
            ("dx", &got.dx, &want.dx),
        ] {
            assert_close(&format!("batch {batch}: {name}"), g, w, 1e-5);
        }
    }
}

#[test]
fn an_sgd_step_is_the_reference_step() {
    let (p, tokens, positions) = problem(4, 29);
    let mut want = p.clone();
    let want_loss = model::train_step(&mut want, &tokens, &positions, 0.5);
    let mut trainer = BatchTrainer::new(p.clone(), tokens);
    let loss = trainer.step(&positions, 0.5);
    assert!((loss - want_loss).abs() <= 1e-5 * want_loss);
    let got = trainer.params().unwrap();
    assert_params_close("sgd", &got, &want, 1e-6);
    assert_ne!(got, p);

    // Whole runs of steps through the trainer interface, the last step shorter: the reference trainer's.
    let (p, tokens, _) = problem(10, 2);
    let order: Vec<u32> = (0..150).map(|i| 3 + (i * 37) % 397).collect();
    let mut reference = CpuTrainer::new(p.clone(), tokens.clone());
    let mut batched = BatchTrainer::new(p, tokens);
    let want_loss = reference.train(&order, 16, 0.3).unwrap();
    let loss = batched.train(&order, 16, 0.3).unwrap();
    assert!((loss - want_loss).abs() <= 1e-5 * want_loss, "{loss} vs {want_loss}");
    assert_params_close("10 steps", &batched.params().unwrap(), &reference.params().unwrap(), 1e-5);
}

#[test]
fn a_rate_per_step_is_the_reference_s() {
    use textnet::ops::optim::{LrSchedule, LrScheduleKind};
    // 150 samples in steps of 16 (the last of 6): 10 rates, warm-up then a cosine down to 0.
    let (p, tokens, _) = problem(11, 2);
    let order: Vec<u32> = (0..150).map(|i| 3 + (i * 37) % 397).collect();
    let rates = LrSchedule { kind: LrScheduleKind::Cosine, warmup: 2, min_lr: 0.0 }.rates(0.3, 10);
    let mut want = p.clone();
    let mut want_loss = 0.0;
    for (step, &lr) in order.chunks(16).zip(&rates) {
        want_loss += model::train_step(&mut want, &tokens, step, lr);
    }
    let mut reference = CpuTrainer::new(p.clone(), tokens.clone());
    assert_eq!(reference.train_steps(&order, 16, &rates).unwrap(), want_loss);
    assert_eq!(reference.params().unwrap(), want);
    let mut batched = BatchTrainer::new(p.clone(), tokens.clone());
    let loss = batched.train_steps(&order, 16, &rates).unwrap();
    assert!((loss - want_loss).abs() <= 1e-5 * want_loss, "{loss} vs {want_loss}");
    assert_params_close("scheduled", &batched.params().unwrap(), &want, 1e-5);
    let mut constant = CpuTrainer::new(p, tokens);
    constant.train(&order, 16, 0.3).unwrap();
    assert_ne!(constant.params().unwrap(), want);
    let err = batched.train_steps(&order, 16, &rates[1..]).unwrap_err().to_string();
    assert!(err.contains("9 learning rates for 10 steps"), "{err}");
}

#[test]
fn batched_evaluation_is_the_reference_evaluation() {
    let (p, tokens, _) = problem(6, 2);
    let positions: Vec<u32> = (SHAPE.context as u32..400).collect();
    let want = model::evaluate(&p, &tokens, &positions);
    let mut trainer = BatchTrainer::new(p, tokens);
    let got = trainer.evaluate(&positions).unwrap();
    assert_eq!((got.samples, got.top1, got.top5), (want.samples, want.top1, want.top5));
    assert!((got.loss - want.loss).abs() <= 1e-5 * want.loss, "{} vs {}", got.loss, want.loss);
}

#[test]
fn the_softmax_exp_is_within_two_ulp_of_std() {
    let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).abs();
    let mut worst = 0;
    for i in 0..=870_000 {
        let x = -(i as f32) * 1e-4;
        worst = worst.max(ulps(exp_nonpositive(x), x.exp()));
    }
    assert!(worst <= 2, "{worst} ulp");
    assert_eq!(exp_nonpositive(0.0), 1.0);
    assert!(exp_nonpositive(-1e4) < 1e-37 && exp_nonpositive(f32::NEG_INFINITY) >= 0.0);
}

#[test]
fn gradients_match_finite_differences_of_the_batched_loss() {
    // The loss through the batched forward pass (its exp included), summed in f64 over the batch.
    let (p, tokens, positions) = problem(7, 9);
    let loss = |p: &TextParams| -> f64 {
        let mut t = BatchTrainer::new(p.clone(), tokens.clone());
        t.evaluate(&positions).unwrap().loss / positions.len() as f64
    };
    // Which hidden units are active (through the reference): a difference across a ReLU kink is no
    // derivative, so such entries are skipped.
    let pattern = |p: &TextParams| -> Vec<bool> {
        let mut a = model::Activations::new(SHAPE);
        contexts(&tokens, &positions)
            .iter()
            .flat_map(|ctx| {
                model::forward(p, ctx, &mut a);
                a.z1.iter().map(|&z| z > 0.0).collect::<Vec<_>>()
            })
            .collect()
    };
    let (g, _) = gradients(&p, &tokens, &positions);
    let embedding = g.embedding_dense(SHAPE, &contexts(&tokens, &positions));
    let eps = 1e-2f32;
    let mut rng = SeededRng::seed_from_u64(8);
    for (name, analytic) in [("embedding", &embedding), ("w1", &g.w1), ("b1", &g.b1), ("w2", &g.w2), ("b2", &g.b2)] {
        let (mut diff, mut norm, mut checked) = (0f64, 0f64, 0);
        for _ in 0..60 {
            // Entries with a real gradient: the embedding rows of the batch's contexts, active units.
            let i = rng.random_range(0..analytic.len());
            if analytic[i] == 0.0 {
                continue;
            }
            let moved = |delta: f32| {
                let mut q = p.clone();
                match name {
                    "embedding" => q.embedding[i] += delta,
                    "w1" => q.w1[i] += delta,
                    "b1" => q.b1[i] += delta,
                    "w2" => q.w2[i] += delta,
                    _ => q.b2[i] += delta,
                }
                q
            };
            let (plus, minus) = (moved(eps), moved(-eps));
            if pattern(&plus) != pattern(&p) || pattern(&minus) != pattern(&p) {
                continue;
            }
            let numeric = (loss(&plus) - loss(&minus)) / (2.0 * eps as f64);
            diff += (numeric - analytic[i] as f64).powi(2);
            norm += (analytic[i] as f64).powi(2);
            checked += 1;
        }
        assert!(checked >= 10 && norm > 0.0, "{name}: only {checked} entries checked");
        let rel = (diff / norm).sqrt();
        assert!(rel < 1e-2, "{name}: relative error {rel:.2e} over {checked} entries");
    }
}

#[test]
fn the_thread_count_changes_nothing() {
    let (p, tokens, positions) = problem(9, 37);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let mut t = BatchTrainer::new(p.clone(), tokens.clone());
            let loss = t.train(&positions, 8, 0.5).unwrap();
            (t.params().unwrap(), loss, t.evaluate(&positions).unwrap())
        })
    };
    let one = run(1);
    for threads in [2, 3] {
        let other = run(threads);
        assert!(one.0 == other.0 && one.1 == other.1 && one.2 == other.2, "{threads} threads differ from 1");
    }
}

#[test]
fn train_on_the_cpu_says_its_plan_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| -> (String, serde_json::Value) {
        let model = dir.path().join(format!("{}.safetensors", extra.join("")));
        let out = textnet(&train_args(&shakespeare(), &model, &[extra, &["--json"]].concat()));
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        (stderr, serde_json::from_slice(&out.stdout).unwrap())
    };
    let plan_line = |stderr: &str| -> String {
        let lines: Vec<&str> = stderr.lines().collect();
        let plan = lines.iter().position(|l| l.starts_with("cpu: ")).unwrap_or_else(|| panic!("no plan:\n{stderr}"));
        let first_epoch = lines.iter().position(|l| l.starts_with("epoch 1/")).unwrap();
        assert!(plan < first_epoch, "{stderr}");
        lines[plan].to_string()
    };
    let config = |report: &serde_json::Value| {
        let c = &report["config"];
        (c["batch"].as_u64().unwrap(), c["lr"].as_f64().unwrap(), c["epochs"].as_u64().unwrap())
    };

    // The CPU's defaults: batches of 256 at 256 × 0.01, three epochs.
    let (stderr, report) = run(&[]);
    assert_eq!(config(&report), (256, 2.56, 3));
    let line = plan_line(&stderr);
    for expected in ["batch 256 and SGD lr 2.56", "CPU's defaults", "3 epochs on ", "thread", "about ", "samples/s)"] {
        assert!(line.contains(expected), "{expected:?} missing from {line:?}");
    }
    let losses: Vec<f64> =
        report["epochs"].as_array().unwrap().iter().map(|e| e["val_loss"].as_f64().unwrap()).collect();
    assert!(losses[2] < report["data"]["unigram_val_loss"].as_f64().unwrap(), "{losses:?}");

    // --batch alone: the CPU's rule, lr = 0.01 × the batch; --lr alone: single samples, as on a GPU.
    let (stderr, report) = run(&["--epochs", "1", "--batch", "8"]);
    assert_eq!(config(&report), (8, 0.08, 1));
    let line = plan_line(&stderr);
    assert!(line.contains("batch 8 and SGD lr 0.08 (the CPU's rule") && !line.contains("defaults"), "{line}");
    let (stderr, report) = run(&["--epochs", "1", "--lr", "0.05"]);
    assert_eq!(config(&report), (1, 0.05, 1));
    let line = plan_line(&stderr);
    assert!(line.contains("single-sample SGD lr 0.05 on the reference") && line.contains("batches of 256"), "{line}");
}

/// The bf16 twin (`gradients_at` at bf16, the CPU side of `--precision bf16`) moves every gradient by
/// bf16 rounding: by more than fp32's summation order moves it (1e-6 at these sizes), so the operands are
/// rounded, and by less than 2⁻⁴. Each product term of two operands rounded to 8-bit significands is off
/// by at most 2·2⁻⁸ relative; G also carries the logits' error through the softmax, and the norm-wise
/// error of a sum with cancellation can exceed its terms' by the ratio ‖|A|·|B|‖/‖A·B‖, a few at these
/// sizes: 2⁻⁴ leaves room for both, while a twin that forgets to round gives under 1e-6 and one that
/// rounds the wrong value (a gradient, not an operand) or scales G twice gives 1e-1 and more.
#[test]
fn the_bf16_twin_moves_the_gradients_by_bf16_rounding() {
    use textnet::device::precision::Precision;
    use textnet::text::cpu_batch::gradients_at;
    for (seed, batch) in [(4, 16), (5, 64)] {
        let (p, tokens, positions) = problem(seed, batch);
        let (want, want_loss) = gradients(&p, &tokens, &positions);
        let (got, loss) = gradients_at(&p, &tokens, &positions, Precision::Bf16);
        let loss_error = (loss - want_loss).abs() / want_loss;
        assert!(loss_error < 2f64.powi(-7), "batch {batch}: loss {loss} vs fp32 {want_loss}");
        for (name, g, w) in [
            ("w1", &got.w1, &want.w1),
            ("b1", &got.b1, &want.b1),
            ("w2", &got.w2, &want.w2),
            ("b2", &got.b2, &want.b2),
            ("dx", &got.dx, &want.dx),
        ] {
            let e = rel_error(g, w);
            assert!(e > 1e-5 && e < 2f64.powi(-4), "batch {batch} {name}: bf16 against fp32 {e:.2e}");
        }
    }
}

/// `train --precision bf16` on the CPU trains with the bf16 twin and says so; its loss stays within bf16
/// rounding of the fp32 run's (same seed, batches and order); tf32 is refused in one line.
#[test]
fn train_precision_bf16_runs_the_twin_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let run = |precision: &str| -> (String, f64) {
        let model = dir.path().join(format!("{precision}.safetensors"));
        let extra = ["--epochs", "1", "--batch", "64", "--lr", "0.64", "--precision", precision, "--json"];
        let out = textnet(&train_args(&shakespeare(), &model, &extra));
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["config"]["precision"], precision);
        (stderr, report["epochs"][0]["val_loss"].as_f64().unwrap())
    };
    let (stderr, bf16) = run("bf16");
    assert!(stderr.contains("precision: bf16 products with fp32 sums (the CPU twin"), "{stderr}");
    let (_, fp32) = run("fp32");
    assert!(bf16 != fp32 && (bf16 - fp32).abs() < 0.01 * fp32, "bf16 {bf16} against fp32 {fp32}");

    let out = textnet(&train_args(&shakespeare(), &dir.path().join("t.safetensors"), &["--precision", "tf32"]));
    let stderr = text(&out.stderr);
    assert!(!out.status.success() && stderr.trim().lines().count() == 1, "{stderr}");
    assert!(stderr.contains("--precision tf32 is not available for the text model"), "{stderr}");
}
