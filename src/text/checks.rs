//! The text pipeline's selftest checks: every kernel of fused/text.cu, fused/text_sample.cu and
//! fused/text_batch.cu against the CPU reference (`model`) on fresh random inputs, with outputs poisoned
//! (NaN) before each run so that an unwritten value cannot pass; whole training runs through the production
//! path (CUDA graphs, or a learning-rate schedule's steps launched one by one) against the CPU reference;
//! and the single-sample path's bit-for-bit repeat.
//!
//! A check must fail on a real bug and never on a correct kernel, whatever the random draw. The one place
//! where rounding could decide more than rounding is ReLU's kink: a pre-activation within rounding of 0
//! takes ReLU′ = 1 in one summation order and 0 in another, and the two then update that hidden unit
//! differently (in a training run the difference grows). So every problem keeps each pre-activation the
//! checked steps form clear of the kink by a stated margin, relative to the size of the terms summed into
//! it (`kink_margin`): kernel checks redraw a bias that a sample brings too close, and the training checks
//! start every hidden unit firmly on or off and accept a problem only when the CPU reference's run, watched
//! at every step, stays clear by TRAINING_MARGIN, far above the distance any correct kernel drifts.

use super::TextTrainer;
use super::gpu::GpuTrainer;
use super::model::{self, TextParams, TextShape, context_of};
use crate::device::Gpu;
use crate::harness::check::{Check, Group, Plan, kink_ratio, rel_error, worst};
use crate::ops::cpu::SeededRng;
use crate::ops::optim::{LrSchedule, LrScheduleKind, OptimConfig, OptimKind, Optimizer};
use anyhow::{Result, bail};
use rand::RngExt;
use rayon::prelude::*;
use std::sync::Arc;

/// Every text check the plan asks for (their kernel modules compiled first, by the selftest). The CPU
/// references of the training checks, the slow part, run on every core while the GPU works through
/// the kernel checks.
pub fn checks(gpu: &Arc<Gpu>, plan: &Plan) -> Result<Vec<Check>> {
    std::thread::scope(|scope| {
        let references = plan.wants(Group::Training).then(|| scope.spawn(|| training_references(plan)));
        let mut out = Vec::new();
        if plan.wants(Group::Kernels) {
            out.extend(all_kernel_checks(gpu, plan)?);
        }
        if let Some(references) = references {
            let references = references.join().map_err(|_| anyhow::anyhow!("a CPU reference run panicked"))?;
            out.extend(training_checks(gpu, references)?);
        }
        if plan.wants(Group::Repeat) {
            let mut rng = plan.rng("text repeat");
            for s in REPEAT_SHAPES {
                out.push(repeat_check(gpu, s, &mut rng)?);
            }
        }
        Ok(out)
    })
}

/// The per-kernel checks' shapes and batches: the bench shape, a vocabulary that is no multiple of the
/// rows per block, odd widths, batches below and above the kernels' sample chunk, and blocks whose W2 rows
/// take two shared-memory tiles with batches of two chunks.
const KERNEL_CASES: [(TextShape, usize); 6] = [
    (shape(8192, 64, 256, 3), 1),
    (shape(8192, 64, 256, 3), 19),
    (shape(1000, 33, 100, 2), 5),
    (shape(517, 16, 40, 1), 11),
    (shape(131, 8, 32, 4), 3),
    (shape(20011, 32, 1024, 2), 3),
];

/// The largest hidden size the kernels take, with a vocabulary far from any block multiple (not with
/// `--quick`).
const LARGEST_CASE: (TextShape, usize) = (shape(50021, 256, super::gpu::MAX_HIDDEN, 4), 2);

/// The single-sample kernels on every shape they take: the bench shape, V no multiple of the rows per
/// block, one row per block, H and D no multiple of 32.
const SAMPLE_SHAPES: [TextShape; 5] = [
    shape(8192, 64, 256, 3),
    shape(1000, 33, 100, 2),
    shape(517, 16, 40, 1),
    shape(131, 8, 32, 4),
    shape(2003, 32, 64, 3),
];

/// The tiled large-batch step.
const TILED_CASES: [(TextShape, usize); 3] =
    [(shape(8192, 64, 256, 3), 256), (shape(1000, 33, 100, 2), 300), (shape(517, 16, 40, 1), 64)];

fn kernel_cases(plan: &Plan) -> impl Iterator<Item = (TextShape, usize)> {
    KERNEL_CASES.into_iter().chain((!plan.quick).then_some(LARGEST_CASE))
}

/// The kernel modules the plan's checks compile.
pub fn modules(plan: &Plan) -> Vec<crate::device::compile::ModuleRequest> {
    let mut cases = Vec::new();
    if plan.wants(Group::Kernels) {
        cases.extend(kernel_cases(plan));
        cases.extend(SAMPLE_SHAPES.map(|s| (s, 1)));
        cases.extend(TILED_CASES);
        cases.extend(TILED_BF16_CASES);
    }
    if plan.wants(Group::Training) {
        cases.extend(TRAINING_CASES.map(|c| (c.shape, c.batch)));
    }
    if plan.wants(Group::Repeat) {
        cases.extend(REPEAT_SHAPES.map(|s| (s, 1)));
    }
    cases.into_iter().flat_map(|(s, batch)| super::gpu::modules(s, batch)).collect()
}

fn all_kernel_checks(gpu: &Arc<Gpu>, plan: &Plan) -> Result<Vec<Check>> {
    let mut rng = plan.rng("text kernels");
    let mut out = Vec::new();
    for (s, batch) in kernel_cases(plan) {
        out.extend(kernel_checks(gpu, s, batch, &mut rng)?);
    }
    for s in SAMPLE_SHAPES {
        out.extend(sample_checks(gpu, s, &mut rng)?);
    }
    for (s, batch) in TILED_CASES {
        out.extend(tiled_checks(gpu, s, batch, &mut rng)?);
    }
    for (s, batch) in TILED_BF16_CASES {
        out.extend(tiled_bf16_checks(gpu, s, batch, &mut rng)?);
    }
    Ok(out)
}

/// The inputs x of the samples at `positions` (the mean of their context embeddings).
fn inputs_of(p: &TextParams, tokens: &[u32], positions: &[u32]) -> Vec<Vec<f32>> {
    let s = p.shape;
    positions
        .iter()
        .map(|&pos| {
            let mut x = vec![0.0; s.embed];
            model::embed_context(p, context_of(tokens, pos, s.context), &mut x);
            x
        })
        .collect()
}

/// The smallest `kink_ratio` over every hidden unit of every sample at `positions`.
pub fn kink_margin(p: &TextParams, tokens: &[u32], positions: &[u32]) -> f64 {
    let d = p.shape.embed;
    let xs = inputs_of(p, tokens, positions);
    (0..p.shape.hidden)
        .flat_map(|j| xs.iter().map(move |x| (j, x)))
        .map(|(j, x)| kink_ratio(&p.w1[j * d..][..d], p.b1[j], x))
        .fold(f64::INFINITY, f64::min)
}

/// The smallest kink ratio a kernel check accepts: the kernels' z1 differs from the reference's by rounding
/// alone (a relative 1e-7 of the ratio's denominator), a thousand times less.
pub const KERNEL_MARGIN: f64 = 1e-4;

/// Redraws the bias of every hidden unit that a sample at `positions` brings within KERNEL_MARGIN of the
/// kink, until none does (each draw clears a unit with probability near 1).
fn clear_of_kink(p: &mut TextParams, tokens: &[u32], positions: &[u32], rng: &mut SeededRng) {
    let d = p.shape.embed;
    let xs = inputs_of(p, tokens, positions);
    for j in 0..p.shape.hidden {
        while xs.iter().any(|x| kink_ratio(&p.w1[j * d..][..d], p.b1[j], x) < KERNEL_MARGIN) {
            p.b1[j] = rng.random_range(-0.2..0.2);
        }
    }
}

/// Random parameters with non-zero biases. Embeddings are drawn at a tenth of their training scale: the
/// embedding-update check compares E_before − E_after with lr·grad, and the rounding of E itself (relative
/// 6e-8 of |E|, once per sample that shares a row) would otherwise sit near the 1e-5 tolerance for batches
/// with repeated tokens.
fn random_params(shape: TextShape, rng: &mut SeededRng) -> TextParams {
    let mut params = TextParams::init(shape, rng.random());
    params.embedding.iter_mut().for_each(|e| *e *= 0.1);
    params.b1.iter_mut().for_each(|b| *b = rng.random_range(-0.2..0.2));
    params.b2.iter_mut().for_each(|b| *b = rng.random_range(-0.2..0.2));
    params
}

/// Random parameters, a random token stream and `batch` random sample positions, no sample of which brings
/// a pre-activation near the kink. The first three samples read the ids a kernel is likeliest to get wrong,
/// which a random stream over a large vocabulary seldom puts in a context: id 0 (`<unk>`) alone, repeated;
/// the last id alone; the two in turn; each predicting the other.
pub fn random_problem(shape: TextShape, batch: usize, rng: &mut SeededRng) -> (TextParams, Arc<[u32]>, Vec<u32>) {
    let mut params = random_params(shape, rng);
    let (n, last) = (shape.context, shape.vocab as u32 - 1);
    let len = 4 * batch + n + 64;
    let mut tokens: Vec<u32> = (0..len).map(|_| rng.random_range(0..shape.vocab as u32)).collect();
    let mut positions: Vec<u32> = (0..batch).map(|_| rng.random_range(n as u32..len as u32)).collect();
    let edges: [fn(usize, u32) -> u32; 3] = [|_, _| 0, |_, last| last, |i, last| if i % 2 == 0 { 0 } else { last }];
    for (k, edge) in edges.into_iter().enumerate().take(batch) {
        let window = &mut tokens[k * (n + 1)..(k + 1) * (n + 1)];
        window.iter_mut().enumerate().for_each(|(i, t)| *t = edge(i, last));
        window[n] = if window[0] == 0 { last } else { 0 };
        positions[k] = (k * (n + 1) + n) as u32;
    }
    let tokens: Arc<[u32]> = tokens.into();
    clear_of_kink(&mut params, &tokens, &positions, rng);
    (params, tokens, positions)
}

/// Relative error of an SGD update: (before − after) against lr·grad.
fn update_error(lr: f32, before: &[f32], after: &[f32], grad: &[f32]) -> f64 {
    let delta: Vec<f32> = before.iter().zip(after).map(|(b, a)| b - a).collect();
    let expected: Vec<f32> = grad.iter().map(|g| lr * g).collect();
    rel_error(&delta, &expected)
}

/// The CPU reference of one step over the samples at `positions`: forward values of every sample, the
/// gradients of the mean loss (the embedding's as a dense V×D array) and the summed loss.
struct CpuStep {
    x: Vec<f32>,
    z1: Vec<f32>,
    logits: Vec<f32>,
    logsumexp: Vec<f32>,
    grads: model::Grads,
    embedding_grad: Vec<f32>,
    loss: f64,
}

/// x and z1 of the samples at `positions` (CPU reference).
fn cpu_hidden(p: &TextParams, tokens: &[u32], positions: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let (mut x, mut z1) = (Vec::new(), Vec::new());
    for &pos in positions {
        let mut a = model::Activations::new(p.shape);
        model::forward(p, context_of(tokens, pos, p.shape.context), &mut a);
        x.extend_from_slice(&a.x);
        z1.extend_from_slice(&a.z1);
    }
    (x, z1)
}

fn cpu_step(p: &TextParams, tokens: &[u32], positions: &[u32]) -> CpuStep {
    let s = p.shape;
    let contexts: Vec<&[u32]> = positions.iter().map(|&pos| context_of(tokens, pos, s.context)).collect();
    let targets: Vec<u32> = positions.iter().map(|&pos| tokens[pos as usize]).collect();
    let (mut x, mut z1, mut logits, mut logsumexp) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ctx in &contexts {
        let mut a = model::Activations::new(s);
        model::forward(p, ctx, &mut a);
        x.extend_from_slice(&a.x);
        z1.extend_from_slice(&a.z1);
        logits.extend_from_slice(&a.logits);
        logsumexp.push(a.logsumexp);
    }
    let (grads, loss) = model::backward(p, &contexts, &targets);
    let embedding_grad = grads.embedding_dense(s, &contexts);
    CpuStep { x, z1, logits, logsumexp, grads, embedding_grad, loss }
}

/// A trainer on `p`, with the sample order uploaded, buffers for `batch` samples poisoned with NaN and the
/// loss sum zeroed: ready for one kernel or step to be checked.
fn poisoned_trainer(
    gpu: &Arc<Gpu>,
    p: &TextParams,
    tokens: &Arc<[u32]>,
    positions: &[u32],
    batch: usize,
) -> Result<GpuTrainer> {
    let mut t = GpuTrainer::new(gpu.clone(), p, tokens.clone())?;
    t.set_positions(positions)?;
    t.ensure_capacity(batch)?;
    t.poison_buffers()?;
    t.zero_loss()?;
    Ok(t)
}

fn shape_label(s: TextShape, batch: usize) -> String {
    format!("V={} D={} H={} N={} B={}", s.vocab, s.embed, s.hidden, s.context, batch)
}

const fn shape(vocab: usize, embed: usize, hidden: usize, context: usize) -> TextShape {
    TextShape { vocab, embed, hidden, context }
}

/// The bit-for-bit repeat checks, on sample_update's three ways of adding the dx shares.
pub const REPEAT_SHAPES: [TextShape; 3] = [shape(8192, 64, 256, 3), shape(1000, 96, 100, 2), shape(2003, 48, 1040, 2)];

/// The single-sample step sums every value in a fixed order (no floating-point atomics whose order
/// varies), so training repeats to the bit: 300 steps (two graph replays and 44 plain steps, settled
/// halfway) twice from the same start give the same parameters and loss.
pub fn repeat_check(gpu: &Arc<Gpu>, s: TextShape, rng: &mut SeededRng) -> Result<Check> {
    const STEPS: usize = 300;
    let (p, tokens, _) = random_problem(s, 1, rng);
    let positions: Vec<u32> = (0..STEPS).map(|_| rng.random_range(s.context as u32..tokens.len() as u32)).collect();
    let run = || -> Result<(TextParams, f64)> {
        let mut t = GpuTrainer::new(gpu.clone(), &p, tokens.clone())?;
        if !t.sample_path(1) {
            bail!("the single-sample kernels do not take {} on this GPU", shape_label(s, 1));
        }
        let (head, tail) = positions.split_at(STEPS / 2);
        let mut loss = t.train(head, 1, 0.1)?;
        t.params()?;
        loss += t.train(tail, 1, 0.1)?;
        Ok((t.params()?, loss))
    };
    let ((a, loss_a), (b, loss_b)) = (run()?, run()?);
    let bits = |p: &TextParams, loss: f64| -> Vec<u64> {
        p.tensors().iter().flat_map(|(_, v, _)| v.iter().map(|x| x.to_bits() as u64)).chain([loss.to_bits()]).collect()
    };
    // 0 when every bit repeats; otherwise the relative difference, and never below the smallest positive
    // f64 (a −0 / +0 or NaN-payload difference fails too).
    let rel_error = if bits(&a, loss_a) == bits(&b, loss_b) {
        0.0
    } else {
        worst_training_error(&b, loss_b, &a, loss_a).0.max(f64::MIN_POSITIVE)
    };
    Ok(Check { kernel: format!("{STEPS} steps twice: same bits"), shape: shape_label(s, 1), rel_error, tolerance: 0.0 })
}

/// Each kernel alone against the CPU reference, at lr = 10 so that parameter deltas are far above the
/// rounding of the parameters themselves (every kernel is linear in lr). The step's samples are followed by
/// a second step's, whose hidden layer text_update forms from the parameters it has just updated.
pub fn kernel_checks(gpu: &Arc<Gpu>, s: TextShape, batch: usize, rng: &mut SeededRng) -> Result<Vec<Check>> {
    const TOL: f64 = 1e-5;
    let lr = 10.0f32;
    let (p, tokens, positions) = random_problem(s, 2 * batch, rng);
    let (step, next) = positions.split_at(batch);
    let label = shape_label(s, batch);
    let check =
        |kernel: &str, rel_error: f64| Check { kernel: kernel.into(), shape: label.clone(), rel_error, tolerance: TOL };
    let cpu = cpu_step(&p, &tokens, step);

    let mut t = poisoned_trainer(gpu, &p, &tokens, &positions, batch)?;
    t.launch_hidden(batch, 0)?;
    t.synchronize()?;
    let mut out = vec![
        check("text_hidden x", rel_error(&t.download(&t.buffers.x)?[..batch * s.embed], &cpu.x)),
        check("text_hidden z1", rel_error(&t.download(&t.buffers.z1)?[..batch * s.hidden], &cpu.z1)),
    ];
    t.launch_forward(batch, false)?;
    t.synchronize()?;
    let b = &t.buffers;
    out.push(check("text_forward logits", rel_error(&t.download(&b.logits)?[..batch * s.vocab], &cpu.logits)));
    let gpu_lse = logsumexp_of_partials(&t.download(&b.stats)?, t.layout.grid, batch);
    out.push(check("text_forward softmax normaliser", rel_error(&gpu_lse, &cpu.logsumexp)));

    t.launch_backward(batch, 0, lr, false)?;
    t.synchronize()?;
    let w2 = t.download(&t.params.w2)?;
    let b2 = t.download(&t.params.b2)?;
    let dh = t.download(&t.buffers.dh)?[..batch * s.hidden].to_vec();
    out.push(check("text_backward W2 update", update_error(lr, &p.w2, &w2, &cpu.grads.w2)));
    out.push(check("text_backward b2 update", update_error(lr, &p.b2, &b2, &cpu.grads.b2)));
    out.push(check("text_backward dh", rel_error(&dh, &cpu.grads.dh)));
    out.push(check("text_backward loss", rel_error(&[t.read_loss()? as f32], &[cpu.loss as f32])));

    t.launch_update(batch, 0, lr, false)?;
    t.synchronize()?;
    let w1 = t.download(&t.params.w1)?;
    let b1 = t.download(&t.params.b1)?;
    let e = t.download(&t.params.embedding)?;
    out.push(check("text_update W1 update", update_error(lr, &p.w1, &w1, &cpu.grads.w1)));
    out.push(check("text_update b1 update", update_error(lr, &p.b1, &b1, &cpu.grads.b1)));
    out.push(check("text_update embedding update", update_error(lr, &p.embedding, &e, &cpu.embedding_grad)));
    let updated = TextParams { embedding: e, w1, b1, ..p.clone() };
    let (next_x, next_z1) = cpu_hidden(&updated, &tokens, next);
    out.push(check("text_update next step's x", rel_error(&t.download(&t.buffers.x)?[..batch * s.embed], &next_x)));
    out.push(check("text_update next step's z1", rel_error(&t.download(&t.buffers.z1)?[..batch * s.hidden], &next_z1)));
    Ok(out)
}

/// log Σ exp(logits) of each of `batch` samples from the G blocks' softmax partials (max, Σexp) [B][G].
fn logsumexp_of_partials(stats: &[f32], g: usize, batch: usize) -> Vec<f32> {
    (0..batch)
        .map(|i| {
            let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
            for k in 0..g {
                let (pm, pl) = (stats[(i * g + k) * 2], stats[(i * g + k) * 2 + 1]);
                let nm = m.max(pm);
                l = l * (m - nm).exp() + pl * (pm - nm).exp();
                m = nm;
            }
            m + l.ln()
        })
        .collect()
}

/// The single-sample kernels (fused/text_sample.cu) one at a time against the CPU reference on the inputs
/// each was given. First a step at lr = 10 from a state with nothing pending, then the next step's
/// sample_forward, which first applies that step's deferred W2/b2 update. Then, on a fresh trainer, a step at
/// lr = 0.1 and a second at lr = 10 through sample_backward and sample_flush: after a step at lr = 10 the
/// logits reach hundreds, and softmax turns their f32 rounding (relative 6e-8) into relative errors of
/// 1e-5 in dlogits on any implementation, so step 2 follows a gentle step 1.
pub fn sample_checks(gpu: &Arc<Gpu>, s: TextShape, rng: &mut SeededRng) -> Result<Vec<Check>> {
    const TOL: f64 = 1e-5;
    let lr = 10.0f32;
    let (p, tokens, positions) = random_problem(s, 2, rng);
    let label = shape_label(s, 1);
    let check =
        |kernel: &str, rel_error: f64| Check { kernel: kernel.into(), shape: label.clone(), rel_error, tolerance: TOL };
    let cpu1 = cpu_step(&p, &tokens, &positions[..1]);

    let mut t = poisoned_trainer(gpu, &p, &tokens, &positions, 1)?;
    if !t.sample_path(1) {
        bail!("the single-sample kernels do not take {label} on this GPU");
    }
    let (h, d, g) = (s.hidden, s.embed, t.layout.grid);
    t.launch_hidden(1, 0)?;
    t.launch_sample_forward(0, lr, false)?;
    t.synchronize()?;
    let mut out = vec![
        check("sample_forward logits", rel_error(&t.download(&t.buffers.logits)?[..s.vocab], &cpu1.logits)),
        check(
            "sample_forward softmax normaliser",
            rel_error(&logsumexp_of_partials(&t.sample_stats()?, g, 1), &cpu1.logsumexp),
        ),
        check("sample_forward, nothing pending: W2 kept", rel_error(&t.download(&t.params.w2)?, &p.w2)),
    ];
    t.launch_sample_backward(0, lr, false)?;
    t.synchronize()?;
    let w1 = t.download(&t.params.w1)?;
    let b1 = t.download(&t.params.b1)?;
    out.extend([
        check("sample_backward dh", rel_error(&t.download(&t.buffers.dh)?[..h], &cpu1.grads.dh)),
        check("sample_backward loss", rel_error(&[t.read_loss()? as f32], &[cpu1.loss as f32])),
        check("sample_backward W1 update", update_error(lr, &p.w1, &w1, &cpu1.grads.w1)),
        check("sample_backward b1 update", update_error(lr, &p.b1, &b1, &cpu1.grads.b1)),
    ]);
    t.launch_sample_update(0, lr, false)?;
    t.synchronize()?;
    let e = t.download(&t.params.embedding)?;
    let (next_x, next_z1) = cpu_hidden(
        &TextParams { embedding: e.clone(), w1: w1.clone(), b1: b1.clone(), ..p.clone() },
        &tokens,
        &positions[1..],
    );
    out.extend([
        check("sample_update embedding update", update_error(lr, &p.embedding, &e, &cpu1.embedding_grad)),
        check("sample_update next sample's x", rel_error(&t.download(&t.buffers.x)?[..d], &next_x)),
        check("sample_update next sample's z1", rel_error(&t.download(&t.buffers.z1)?[..h], &next_z1)),
    ]);
    t.launch_sample_forward(1, lr, false)?;
    t.synchronize()?;
    let (w2_step1, b2_step1) = (t.download(&t.params.w2)?, t.download(&t.params.b2)?);
    let p1 = TextParams { embedding: e, w1, b1, w2: w2_step1.clone(), b2: b2_step1.clone(), ..p.clone() };
    out.extend([
        check("sample_forward pending W2 update", update_error(lr, &p.w2, &w2_step1, &cpu1.grads.w2)),
        check("sample_forward pending b2 update", update_error(lr, &p.b2, &b2_step1, &cpu1.grads.b2)),
        check(
            "sample_forward logits, step 2",
            rel_error(&t.download(&t.buffers.logits)?[..s.vocab], &cpu_step(&p1, &tokens, &positions[1..]).logits),
        ),
    ]);

    let gentle = 0.1f32;
    let mut t = poisoned_trainer(gpu, &p, &tokens, &positions, 1)?;
    t.launch_hidden(1, 0)?;
    t.launch_sample_forward(0, gentle, false)?;
    t.launch_sample_backward(0, gentle, false)?;
    t.launch_sample_update(0, gentle, false)?;
    t.launch_sample_forward(1, lr, false)?;
    t.synchronize()?;
    let (w2_step1, b2_step1) = (t.download(&t.params.w2)?, t.download(&t.params.b2)?);
    let p1 = TextParams {
        embedding: t.download(&t.params.embedding)?,
        w1: t.download(&t.params.w1)?,
        b1: t.download(&t.params.b1)?,
        w2: w2_step1.clone(),
        b2: b2_step1.clone(),
        ..p.clone()
    };
    let cpu2 = cpu_step(&p1, &tokens, &positions[1..]);
    t.launch_sample_backward(1, lr, false)?;
    t.synchronize()?;
    out.push(check("sample_backward dh, step 2", rel_error(&t.download(&t.buffers.dh)?[..h], &cpu2.grads.dh)));
    t.settle_w2()?;
    t.synchronize()?;
    out.extend([
        check("sample_flush W2 update", update_error(lr, &w2_step1, &t.download(&t.params.w2)?, &cpu2.grads.w2)),
        check("sample_flush b2 update", update_error(lr, &b2_step1, &t.download(&t.params.b2)?, &cpu2.grads.b2)),
    ]);
    Ok(out)
}

/// One step of the tiled large-batch kernels (fused/text_batch.cu) against the CPU reference: the logits
/// and softmax normaliser after text_batch_forward, then every parameter's update and the loss after the
/// whole step. Gradients averaged over hundreds of samples are small next to the parameters, and the
/// step's additions (atomics, in any order) round relative to the parameters, so the step runs at
/// lr = 100 (every kernel is linear in lr): the deltas then stand well above that rounding floor.
pub fn tiled_checks(gpu: &Arc<Gpu>, s: TextShape, batch: usize, rng: &mut SeededRng) -> Result<Vec<Check>> {
    const TOL: f64 = 1e-5;
    let lr = 100.0f32;
    let (p, tokens, positions) = random_problem(s, batch, rng);
    let label = shape_label(s, batch);
    let check =
        |kernel: &str, rel_error: f64| Check { kernel: kernel.into(), shape: label.clone(), rel_error, tolerance: TOL };
    let cpu = cpu_step(&p, &tokens, &positions);

    let mut t = poisoned_trainer(gpu, &p, &tokens, &positions, batch)?;
    if !t.layout.tiled(batch) {
        bail!("the tiled kernels do not take B={batch} for {label} on this GPU");
    }
    t.launch_tiled_step(batch, 0, lr)?;
    t.synchronize()?;
    let norm = t.download(&t.buffers.norm)?;
    let gpu_lse: Vec<f32> = (0..batch).map(|i| norm[2 * i] - norm[2 * i + 1].ln()).collect();
    let e = t.download(&t.params.embedding)?;
    Ok(vec![
        check("text_batch_forward logits", rel_error(&t.download(&t.buffers.logits)?[..batch * s.vocab], &cpu.logits)),
        check("text_batch_forward normaliser", rel_error(&gpu_lse, &cpu.logsumexp)),
        check("text_batch_forward loss", rel_error(&[t.read_loss()? as f32], &[cpu.loss as f32])),
        check("text_batch step W2 update", update_error(lr, &p.w2, &t.download(&t.params.w2)?, &cpu.grads.w2)),
        check("text_batch step b2 update", update_error(lr, &p.b2, &t.download(&t.params.b2)?, &cpu.grads.b2)),
        check("text_batch step W1 update", update_error(lr, &p.w1, &t.download(&t.params.w1)?, &cpu.grads.w1)),
        check("text_batch step b1 update", update_error(lr, &p.b1, &t.download(&t.params.b1)?, &cpu.grads.b1)),
        check("text_batch step embedding update", update_error(lr, &p.embedding, &e, &cpu.embedding_grad)),
    ])
}

/// The bf16 step's checks (`tiled_bf16_checks`): the tiled cases, and V split unevenly over ∂H's parts.
const TILED_BF16_CASES: [(TextShape, usize); 4] = [
    (shape(8192, 64, 256, 3), 256),
    (shape(8192, 64, 256, 3), 1100),
    (shape(1000, 33, 100, 2), 300),
    (shape(517, 16, 40, 1), 64),
];

/// How far the bf16 step may stand from its CPU twin (`cpu_batch::gradients_at` at bf16), norm-wise.
/// Both round the same fp32 values of h, W2 and G to bf16 and sum the exact products in fp32, in
/// different orders. (1) An element rounds differently only where the two fp32 values, a few fp32 ulps
/// apart (sum order, exp), straddle a bf16 rounding boundary: at most about 8 ulps in the 2¹⁶ fp32 ulps
/// of a bf16 ulp, a fraction ≤ 2⁻¹³, each then one bf16 ulp (≤ 2⁻⁷ relative) off: ≤ √2⁻¹³ · 2⁻⁷ ≈ 2⁻¹³·⁵
/// norm-wise. (2) fp32 sums of K ≤ 8192 terms in two orders: ~√K · 2⁻²⁴ ≈ 2⁻¹⁷·⁵. Twice their sum, 2⁻¹².
/// A dropped chunk, split or ∂b2, G unscaled by 1/B or W2's copy stale is off by 1e-2 or more.
pub const BF16_TWIN_TOLERANCE: f64 = 1.0 / 4096.0;

/// One bf16 step (`--precision bf16`: text_batch_hidden_bf16, _logits_bf16, _dlogits_bf16,
/// _backward_bf16, then text_batch_update) against its CPU twin: the loss and every parameter's update,
/// at lr = 100 as `tiled_checks`; and W2's bf16 copy after it, which the next step reads, to the bit.
pub fn tiled_bf16_checks(gpu: &Arc<Gpu>, s: TextShape, batch: usize, rng: &mut SeededRng) -> Result<Vec<Check>> {
    use super::cpu_batch::gradients_at;
    use crate::device::precision::Precision;
    use crate::ops::gemm::{bf16_value, round_bf16};
    const TOL: f64 = BF16_TWIN_TOLERANCE;
    let lr = 100.0f32;
    let (p, tokens, positions) = random_problem(s, batch, rng);
    let label = format!("{} bf16", shape_label(s, batch));
    let check =
        |kernel: &str, rel_error: f64| Check { kernel: kernel.into(), shape: label.clone(), rel_error, tolerance: TOL };
    let (grads, loss) = gradients_at(&p, &tokens, &positions, Precision::Bf16);
    let contexts: Vec<&[u32]> = positions.iter().map(|&pos| context_of(&tokens, pos, s.context)).collect();
    let embedding_grad = grads.embedding_dense(s, &contexts);

    let mut t = poisoned_trainer(gpu, &p, &tokens, &positions, batch)?;
    t.use_precision(Precision::Bf16)?;
    t.poison_buffers()?;
    t.launch_tiled_step(batch, 0, lr)?;
    t.synchronize()?;
    let after = t.params()?;
    let mut out = vec![
        check("bf16 step loss", rel_error(&[t.read_loss()? as f32], &[loss as f32])),
        check("bf16 step W2 update", update_error(lr, &p.w2, &after.w2, &grads.w2)),
        check("bf16 step b2 update", update_error(lr, &p.b2, &after.b2, &grads.b2)),
        check("bf16 step W1 update", update_error(lr, &p.w1, &after.w1, &grads.w1)),
        check("bf16 step b1 update", update_error(lr, &p.b1, &after.b1, &grads.b1)),
        check("bf16 step embedding update", update_error(lr, &p.embedding, &after.embedding, &embedding_grad)),
    ];
    // What the next step's products read: W2's bf16 copy, refreshed by the update (exactly W2 rounded).
    let copy = t.w2_bf16_copy()?.unwrap_or_default();
    let copy: Vec<f32> = copy.iter().map(|&b| bf16_value(b)).collect();
    let want: Vec<f32> = after.w2.iter().map(|&w| round_bf16(w)).collect();
    out.push(Check {
        kernel: "bf16 step W2's bf16 copy".into(),
        shape: label.clone(),
        rel_error: rel_error(&copy, &want),
        tolerance: 0.0,
    });
    Ok(out)
}

/// The token stream a training check learns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Random tokens over the whole vocabulary.
    Random,
    /// Four distinct tokens, so that nearly every context repeats a token and shares tokens with the next
    /// sample's: the case where a step's embedding update must reach the next sample's x (random tokens over
    /// a large vocabulary almost never exercise it).
    FourTokens,
}

/// A whole training run to compare: shape, samples a step, steps, token stream, optimizer, learning rate
/// (Adam's with weight decay 1e-4) and how it moves over the steps.
#[derive(Clone, Copy, Debug)]
pub struct TrainingCase {
    /// The model's sizes.
    pub shape: TextShape,
    /// Samples per step.
    pub batch: usize,
    /// Optimizer steps.
    pub steps: usize,
    /// The tokens the samples are drawn from.
    pub stream: Stream,
    /// The update rule.
    pub optim: OptimKind,
    /// The learning rate.
    pub lr: f32,
    /// How the rate moves over the steps.
    pub rates: CaseRates,
}

/// How a training case's learning rate moves over its steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CaseRates {
    /// A learning-rate schedule (`CONSTANT`: every step at the case's rate).
    Schedule(LrSchedule),
    /// Every other step at a tenth of the rate. A step at its neighbour's rate is then ten times off: what
    /// catches a rate taken one step early or late (sample_forward applies a step's W2 update during the
    /// next step, at the rate it recorded), which a smooth schedule moves a run by only ~1e-4.
    Alternating,
}

impl TrainingCase {
    /// The case's optimizer: its kind at `lr`, with weight decay 1e-4 for Adam.
    pub fn optim_config(&self) -> OptimConfig {
        let weight_decay = if self.optim == OptimKind::Adam { 1e-4 } else { 0.0 };
        OptimConfig { lr: self.lr, weight_decay, ..OptimConfig::new(self.optim) }
    }

    /// The rate of each step.
    pub fn rates(&self) -> Vec<f32> {
        match self.rates {
            CaseRates::Schedule(schedule) => schedule.rates(self.lr, self.steps),
            CaseRates::Alternating => {
                (0..self.steps).map(|k| if k % 2 == 0 { self.lr } else { self.lr / 10.0 }).collect()
            }
        }
    }

    /// Steps of warm-up (0 without a schedule that has them).
    pub fn warmup(&self) -> usize {
        match self.rates {
            CaseRates::Schedule(schedule) => schedule.warmup,
            CaseRates::Alternating => 0,
        }
    }
}

/// Every step at the case's rate.
const CONSTANT: CaseRates = CaseRates::Schedule(LrSchedule { kind: LrScheduleKind::Constant, warmup: 0, min_lr: 0.0 });

/// `case` at `rates`.
const fn at(rates: CaseRates, case: TrainingCase) -> TrainingCase {
    TrainingCase { rates, ..case }
}

/// `warmup` steps of warm-up, then a cosine down to 0.
const fn cosine(warmup: usize) -> CaseRates {
    CaseRates::Schedule(LrSchedule { kind: LrScheduleKind::Cosine, warmup, min_lr: 0.0 })
}

const fn case(shape: TextShape, batch: usize, steps: usize, stream: Stream) -> TrainingCase {
    let lr = match stream {
        Stream::Random => 0.02,
        Stream::FourTokens => 0.005,
    };
    TrainingCase { shape, batch, steps, stream, optim: OptimKind::Sgd, lr, rates: CONSTANT }
}

const fn optimized(shape: TextShape, batch: usize, steps: usize, optim: OptimKind, lr: f32) -> TrainingCase {
    TrainingCase { shape, batch, steps, stream: Stream::Random, optim, lr, rates: CONSTANT }
}

/// Single samples through fused/text_sample.cu (the first four) and, H = 66 being no multiple of 4, through
/// fused/text.cu; 7 samples a step; 130 a step through the tiled kernels. The third and fourth take
/// sample_update's other ways of adding the dx shares: D above THREADS / 4 (a thread per element), and 65
/// shares (more than one pass of the loads). Then the same on four distinct tokens. The largest shapes run
/// 300 steps (two graph replays and a remainder), the CPU reference being slow there; the others 1000.
/// The next three train with momentum and Adam, whose steps all go through the tiled kernels and
/// text_batch_optimize, single samples and a partial tile included. The last seven take a rate per step,
/// which the GPU launches step by step: a cosine after a warm-up on single samples through
/// fused/text_sample.cu and with Adam; a warm-up of 200 steps and then one rate, which `training_checks`
/// trains in two calls, the warm-up launched step by step and the rest replayed from a graph, as the
/// training loop's chunks can fall; and alternating rates (`CaseRates::Alternating`) on every path:
/// fused/text_sample.cu, fused/text.cu for single samples and 7 a step, and the tiled kernels.
pub const TRAINING_CASES: [TrainingCase; 20] = [
    case(shape(8192, 64, 256, 3), 1, 300, Stream::Random),
    case(shape(2003, 32, 64, 3), 1, 1000, Stream::Random),
    case(shape(1000, 96, 100, 2), 1, 1000, Stream::Random),
    case(shape(2003, 48, 1040, 2), 1, 300, Stream::Random),
    case(shape(2003, 32, 66, 3), 1, 1000, Stream::Random),
    case(shape(2003, 32, 64, 3), 7, 1000, Stream::Random),
    case(shape(2003, 32, 64, 3), 130, 100, Stream::Random),
    case(shape(8192, 64, 256, 3), 1, 300, Stream::FourTokens),
    case(shape(2003, 32, 66, 3), 1, 1000, Stream::FourTokens),
    case(shape(2003, 32, 64, 3), 7, 1000, Stream::FourTokens),
    optimized(shape(2003, 32, 64, 3), 130, 100, OptimKind::Momentum, 0.002),
    optimized(shape(2003, 32, 64, 3), 70, 100, OptimKind::Adam, 1e-3),
    optimized(shape(517, 16, 40, 1), 1, 100, OptimKind::Adam, 1e-3),
    at(cosine(100), case(shape(2003, 32, 64, 3), 1, 1000, Stream::Random)),
    at(cosine(10), optimized(shape(2003, 32, 64, 3), 70, 100, OptimKind::Adam, 1e-3)),
    at(WARMUP_200, case(shape(2003, 32, 64, 3), 1, 1000, Stream::Random)),
    at(CaseRates::Alternating, case(shape(2003, 32, 64, 3), 1, 1000, Stream::Random)),
    at(CaseRates::Alternating, case(shape(2003, 32, 66, 3), 1, 1000, Stream::Random)),
    at(CaseRates::Alternating, case(shape(2003, 32, 64, 3), 7, 1000, Stream::Random)),
    at(CaseRates::Alternating, case(shape(2003, 32, 64, 3), 130, 100, Stream::Random)),
];

/// 200 steps of warm-up, then the case's rate.
const WARMUP_200: CaseRates =
    CaseRates::Schedule(LrSchedule { kind: LrScheduleKind::Constant, warmup: 200, min_lr: 0.0 });

/// The smallest kink ratio a training problem's reference run may reach. Over a whole run the GPU drifts
/// from the reference by well under a relative 1e-6 (different summation orders, compounded): a thousand
/// times less.
pub const TRAINING_MARGIN: f64 = 1e-3;

/// The relative error a training check accepts: the GPU measured within 4e-7 of the reference over 200
/// seeds of every case, kink-clear problems being far from chaotic.
pub const TRAINING_TOLERANCE: f64 = 1e-4;

/// Problems drawn for a training check before it gives up; a draw stays clear with probability above 0.9
/// (`tests/it/text_checks.rs` measures it), so giving up is all but impossible.
const MAX_DRAWS: usize = 8;

/// A training check's problem: initial parameters, token stream and the positions of its samples in order.
#[derive(Clone, Debug)]
pub struct TrainingProblem {
    /// The initial parameters.
    pub params: TextParams,
    /// The token stream.
    pub tokens: Arc<[u32]>,
    /// The target position of each sample, in training order.
    pub positions: Vec<u32>,
}

/// A random problem for `case`, with every hidden unit starting firmly on or off: |b1| is 0.2 to 0.4, where
/// |W1·x| starts near 0.04.
pub fn training_problem(case: &TrainingCase, rng: &mut SeededRng) -> TrainingProblem {
    let s = case.shape;
    let mut params = random_params(s, rng);
    params.b1.iter_mut().for_each(|b| *b = rng.random_range(0.3..0.6) * if rng.random() { 1.0 } else { -1.0 });
    let len = 4 * case.batch + s.context + 64;
    let pool: Vec<u32> = (0..4).map(|_| rng.random_range(0..s.vocab as u32)).collect();
    let tokens: Arc<[u32]> = (0..len)
        .map(|_| match case.stream {
            Stream::Random => rng.random_range(0..s.vocab as u32),
            Stream::FourTokens => pool[rng.random_range(0..pool.len())],
        })
        .collect();
    let positions = (0..case.steps * case.batch).map(|_| rng.random_range(s.context as u32..len as u32)).collect();
    TrainingProblem { params, tokens, positions }
}

/// The CPU reference's run over a problem: final parameters, summed loss, and the smallest kink ratio any
/// step's samples reached (each step's, before that step's update).
#[derive(Clone, Debug)]
pub struct ReferenceRun {
    /// The parameters after the last step.
    pub params: TextParams,
    /// The summed loss of every step's samples.
    pub loss: f64,
    /// The smallest kink ratio any step's samples reached.
    pub margin: f64,
}

/// Trains a copy of `problem.params` on the CPU over `problem.positions`, `batch` samples a step, step k
/// at `rates[k]` (in place of `optim.lr`).
pub fn reference_run(problem: &TrainingProblem, batch: usize, optim: OptimConfig, rates: &[f32]) -> ReferenceRun {
    let mut params = problem.params.clone();
    let (mut loss, mut margin) = (0.0, f64::INFINITY);
    let mut optimizer = Optimizer::new(optim, params.shape.parameter_count() as usize);
    assert_eq!(rates.len(), problem.positions.len().div_ceil(batch), "a rate per step");
    for (step, &lr) in problem.positions.chunks(batch).zip(rates) {
        margin = margin.min(kink_margin(&params, &problem.tokens, step));
        loss += if optim.kind == OptimKind::Sgd {
            model::train_step(&mut params, &problem.tokens, step, lr)
        } else {
            optimizer.config.lr = lr;
            let n = params.shape.context;
            let contexts: Vec<&[u32]> = step.iter().map(|&pos| context_of(&problem.tokens, pos, n)).collect();
            let targets: Vec<u32> = step.iter().map(|&pos| problem.tokens[pos as usize]).collect();
            let (g, step_loss) = model::backward(&params, &contexts, &targets);
            model::optimizer_update(&mut params, &g, &contexts, &mut optimizer);
            step_loss
        };
    }
    ReferenceRun { params, loss, margin }
}

/// A training case with its accepted problem and reference run (None when MAX_DRAWS problems in a row
/// came too close to the kink), and how many problems were drawn.
pub struct Reference {
    /// The training case.
    pub case: TrainingCase,
    /// Its accepted problem and reference run, if a draw was accepted.
    pub accepted: Option<(TrainingProblem, ReferenceRun)>,
    /// How many problems were drawn.
    pub draws: usize,
}

/// Draws problems for `case` until the reference run over one stays TRAINING_MARGIN clear of the kink.
pub fn drawn_reference(case: TrainingCase, rng: &mut SeededRng) -> Reference {
    for draws in 1..=MAX_DRAWS {
        let problem = training_problem(&case, rng);
        let run = reference_run(&problem, case.batch, case.optim_config(), &case.rates());
        if run.margin >= TRAINING_MARGIN {
            return Reference { case, accepted: Some((problem, run)), draws };
        }
    }
    Reference { case, accepted: None, draws: MAX_DRAWS }
}

/// Every training case's reference, in parallel; each case draws from its own stream of the plan's seed.
pub fn training_references(plan: &Plan) -> Vec<Reference> {
    TRAINING_CASES
        .par_iter()
        .enumerate()
        .map(|(i, &case)| drawn_reference(case, &mut plan.rng(&format!("text training {i}"))))
        .collect()
}

/// Each reference's problem trained by the GPU through the production path (CUDA graphs; a scheduled case
/// in two calls, its warm-up and the rest, as the training loop's chunks fall), from the same initial
/// parameters and sample order: the parameters and the summed loss within TRAINING_TOLERANCE relative.
pub fn training_checks(gpu: &Arc<Gpu>, references: Vec<Reference>) -> Result<Vec<Check>> {
    let mut out = Vec::new();
    for Reference { case, accepted, draws } in references {
        let what = match case.stream {
            Stream::Random => "",
            Stream::FourTokens => ", 4 distinct tokens",
        };
        let shape = shape_label(case.shape, case.batch);
        let Some((problem, cpu)) = accepted else {
            out.push(Check {
                kernel: format!(
                    "{} steps{what}: no problem of {draws} stayed {TRAINING_MARGIN:e} clear of ReLU's switch at 0",
                    case.steps
                ),
                shape,
                rel_error: f64::INFINITY,
                tolerance: TRAINING_TOLERANCE,
            });
            continue;
        };
        let mut trainer = GpuTrainer::new(gpu.clone(), &problem.params, problem.tokens.clone())?;
        trainer.use_optimizer(case.optim_config())?;
        let rates = case.rates();
        let warmup = case.warmup();
        let (warm, rest) = problem.positions.split_at(warmup * case.batch);
        let mut loss = 0.0;
        for (part, rates) in [(warm, &rates[..warmup]), (rest, &rates[warmup..])] {
            if !part.is_empty() {
                loss += trainer.train_steps(part, case.batch, rates)?;
            }
        }
        let (rel_error, at) = worst_training_error(&trainer.params()?, loss, &cpu.params, cpu.loss);
        let drawn = if draws > 1 { format!(" ({draws} problems drawn)") } else { String::new() };
        let optim =
            if case.optim == OptimKind::Sgd { String::new() } else { format!(", {}", case.optim_config().describe()) };
        let how = match case.rates {
            CaseRates::Schedule(s) if s.describe().is_empty() => "(graph)".to_string(),
            CaseRates::Schedule(s) => format!("({})", s.describe()),
            CaseRates::Alternating => "(every other step at lr/10)".to_string(),
        };
        out.push(Check {
            kernel: format!("{} steps {how}{what}{optim}, worst: {at}{drawn}", case.steps),
            shape,
            rel_error,
            tolerance: TRAINING_TOLERANCE,
        });
    }
    Ok(out)
}

/// rel_error of each parameter tensor of `got` against `want`, by name.
pub fn param_rel_errors(got: &TextParams, want: &TextParams) -> Vec<(&'static str, f64)> {
    got.tensors().iter().zip(want.tensors().iter()).map(|((name, a, _), (_, b, _))| (*name, rel_error(a, b))).collect()
}

/// The largest relative error over the summed loss and the parameter tensors, and where; anything not
/// finite (NaN included) counts as infinite.
fn worst_training_error(got: &TextParams, got_loss: f64, want: &TextParams, want_loss: f64) -> (f64, &'static str) {
    let loss = rel_error(&[got_loss as f32], &[want_loss as f32]);
    worst([("loss", loss)].into_iter().chain(param_rel_errors(got, want)))
}
