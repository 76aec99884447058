//! `textnet selftest`: every GPU kernel checked against its CPU reference on this machine's GPU, on fresh
//! random inputs, with outputs poisoned (NaN) before each run so an unwritten value cannot pass. Prints a
//! table (kernel, shape, max relative error, pass/fail) and exits non-zero on any failure. The ignored
//! GPU tests in tests/gpu_*.rs run the same checks.

use crate::device::{self, Gpu};
use crate::text::TextTrainer;
use crate::text::gpu::GpuTrainer;
use crate::text::model::{self, TextParams, TextShape, context_of};
use anyhow::{Result, bail};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct SelftestArgs {
    /// Seed of the random inputs (default: a fresh one, printed so a failure can be repeated)
    #[arg(long)]
    pub seed: Option<u64>,
    /// Skip the largest shapes (quicker)
    #[arg(long)]
    pub quick: bool,
    /// Print the results as one JSON object
    #[arg(long)]
    pub json: bool,
}

/// One comparison of a GPU result with the CPU reference.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Check {
    pub kernel: String,
    pub shape: String,
    pub rel_error: f64,
    pub tolerance: f64,
}

impl Check {
    pub fn passed(&self) -> bool {
        self.rel_error.is_finite() && self.rel_error <= self.tolerance
    }
}

/// ‖a − b‖ / ‖b‖ in f64; NaN anywhere (a poisoned value nobody wrote) gives infinity.
pub fn rel_error(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        if !x.is_finite() || !y.is_finite() {
            return f64::INFINITY;
        }
        diff += (x as f64 - y as f64).powi(2);
        norm += (y as f64).powi(2);
    }
    if norm == 0.0 { if diff == 0.0 { 0.0 } else { f64::INFINITY } } else { (diff / norm).sqrt() }
}

pub fn run(args: SelftestArgs) -> Result<()> {
    let gpu = Arc::new(Gpu::open(0).map_err(|e| anyhow::anyhow!("selftest needs a CUDA GPU: {e:#}"))?);
    let seed = args.seed.unwrap_or_else(rand::random);
    eprintln!("selftest on {} (seed {seed})", gpu.describe());
    let mut checks = text_checks(&gpu, seed, args.quick)?;
    checks.extend(crate::mnist::gpu::selftest_checks(&gpu, seed)?);
    let failed = checks.iter().filter(|c| !c.passed()).count();
    if args.json {
        let out = serde_json::json!({
            "device": gpu.describe(), "seed": seed, "failed": failed,
            "checks": checks.iter().map(|c| serde_json::json!({
                "kernel": c.kernel, "shape": c.shape, "rel_error": c.rel_error, "tolerance": c.tolerance, "pass": c.passed()
            })).collect::<Vec<_>>(),
        });
        println!("{out}");
    } else {
        println!("{:<34} {:<34} {:>12} {:>10}  result", "kernel", "shape", "rel. error", "tolerance");
        for c in &checks {
            println!(
                "{:<34} {:<34} {:>12.3e} {:>10.0e}  {}",
                c.kernel,
                c.shape,
                c.rel_error,
                c.tolerance,
                if c.passed() { "pass" } else { "FAIL" }
            );
        }
        println!("{} checks, {} failed", checks.len(), failed);
    }
    if failed > 0 {
        bail!("{failed} of {} GPU checks failed (seed {seed})", checks.len());
    }
    Ok(())
}

/// Random parameters with non-zero biases, a random token stream and `batch` random sample positions.
/// Embeddings are drawn at a tenth of their training scale: the embedding-update check compares
/// E_before − E_after with lr·grad, and the rounding of E itself (relative 6e-8 of |E|, once per sample
/// that shares a row) would otherwise sit near the 1e-5 tolerance for batches with repeated tokens.
fn random_problem(shape: TextShape, batch: usize, rng: &mut StdRng) -> (TextParams, Arc<[u32]>, Vec<u32>) {
    let mut params = TextParams::init(shape, rng.random());
    params.embedding.iter_mut().for_each(|e| *e *= 0.1);
    params.b1.iter_mut().for_each(|b| *b = rng.random_range(-0.2..0.2));
    params.b2.iter_mut().for_each(|b| *b = rng.random_range(-0.2..0.2));
    let len = 4 * batch + shape.context + 64;
    let tokens: Arc<[u32]> = (0..len).map(|_| rng.random_range(0..shape.vocab as u32)).collect();
    let positions = (0..batch).map(|_| rng.random_range(shape.context as u32..len as u32)).collect();
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
fn poisoned_trainer(gpu: &Arc<Gpu>, p: &TextParams, tokens: &Arc<[u32]>, positions: &[u32], batch: usize) -> Result<GpuTrainer> {
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

/// The 1000-step training checks: single samples through fused/text_sample.cu (the first four) and, H = 66
/// being no multiple of 4, through fused/text.cu; then 7 samples a step. The third and fourth take
/// sample_update's other ways of adding the dx shares: D above THREADS / 4 (a thread per element), and 65
/// shares (more than one pass of the loads).
pub const TRAINING_CASES: [(TextShape, usize); 6] = [
    (shape(8192, 64, 256, 3), 1),
    (shape(2003, 32, 64, 3), 1),
    (shape(1000, 96, 100, 2), 1),
    (shape(2003, 48, 1040, 2), 1),
    (shape(2003, 32, 66, 3), 1),
    (shape(2003, 32, 64, 3), 7),
];

/// The 1000-step training checks on four distinct tokens: single samples on both kernel files, and 7 a step.
pub const REPETITIVE_CASES: [(TextShape, usize); 3] = [(shape(8192, 64, 256, 3), 1), (shape(2003, 32, 66, 3), 1), (shape(2003, 32, 64, 3), 7)];

/// The bit-for-bit repeat checks, on sample_update's three ways of adding the dx shares.
pub const REPEAT_SHAPES: [TextShape; 3] = [shape(8192, 64, 256, 3), shape(1000, 96, 100, 2), shape(2003, 48, 1040, 2)];

/// Per-kernel checks on one shape and batch, then whole training steps.
pub fn text_checks(gpu: &Arc<Gpu>, seed: u64, quick: bool) -> Result<Vec<Check>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cases = vec![
        (shape(8192, 64, 256, 3), 1),
        (shape(8192, 64, 256, 3), 19),
        (shape(1000, 33, 100, 2), 5),
        (shape(517, 16, 40, 1), 11),
        (shape(131, 8, 32, 4), 3),
        // Blocks whose W2 rows take two shared-memory tiles; batches of two chunks.
        (shape(20011, 32, 1024, 2), 3),
    ];
    if !quick {
        // The largest hidden size the kernels take, with a vocabulary far from any block multiple.
        cases.push((shape(50021, 256, crate::text::gpu::MAX_HIDDEN, 4), 2));
    }
    let mut checks = Vec::new();
    for (s, batch) in cases {
        checks.extend(text_kernel_checks(gpu, s, batch, &mut rng)?);
    }
    // The single-sample kernels on every shape they take: the bench shape, V no multiple of the rows per
    // block, one row per block, H and D no multiple of 32.
    for s in [shape(8192, 64, 256, 3), shape(1000, 33, 100, 2), shape(517, 16, 40, 1), shape(131, 8, 32, 4), shape(2003, 32, 64, 3)] {
        checks.extend(text_sample_checks(gpu, s, &mut rng)?);
    }
    for (s, batch) in [(shape(8192, 64, 256, 3), 256), (shape(1000, 33, 100, 2), 300), (shape(517, 16, 40, 1), 64)] {
        checks.extend(text_tiled_checks(gpu, s, batch, &mut rng)?);
    }
    for (s, batch) in TRAINING_CASES {
        checks.push(text_training_check(gpu, s, batch, 1000, &mut rng)?);
    }
    checks.push(text_training_check(gpu, shape(2003, 32, 64, 3), 130, 100, &mut rng)?);
    for (s, batch) in REPETITIVE_CASES {
        checks.push(text_repetitive_training_check(gpu, s, batch, 1000, &mut rng)?);
    }
    for s in REPEAT_SHAPES {
        checks.push(text_repeat_check(gpu, s, &mut rng)?);
    }
    Ok(checks)
}

/// The single-sample step sums every value in a fixed order (no floating-point atomics whose order
/// varies), so training repeats to the bit: 300 steps (two graph replays and 44 plain steps, settled
/// halfway) twice from the same start give the same parameters and loss.
pub fn text_repeat_check(gpu: &Arc<Gpu>, s: TextShape, rng: &mut StdRng) -> Result<Check> {
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
pub fn text_kernel_checks(gpu: &Arc<Gpu>, s: TextShape, batch: usize, rng: &mut StdRng) -> Result<Vec<Check>> {
    const TOL: f64 = 1e-5;
    let lr = 10.0f32;
    let (p, tokens, positions) = random_problem(s, 2 * batch, rng);
    let (step, next) = positions.split_at(batch);
    let label = shape_label(s, batch);
    let check = |kernel: &str, rel_error: f64| Check { kernel: kernel.into(), shape: label.clone(), rel_error, tolerance: TOL };
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
pub fn text_sample_checks(gpu: &Arc<Gpu>, s: TextShape, rng: &mut StdRng) -> Result<Vec<Check>> {
    const TOL: f64 = 1e-5;
    let lr = 10.0f32;
    let (p, tokens, positions) = random_problem(s, 2, rng);
    let label = shape_label(s, 1);
    let check = |kernel: &str, rel_error: f64| Check { kernel: kernel.into(), shape: label.clone(), rel_error, tolerance: TOL };
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
        check("sample_forward softmax normaliser", rel_error(&logsumexp_of_partials(&t.sample_stats()?, g, 1), &cpu1.logsumexp)),
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
    let (next_x, next_z1) = cpu_hidden(&TextParams { embedding: e.clone(), w1: w1.clone(), b1: b1.clone(), ..p.clone() }, &tokens, &positions[1..]);
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
        check("sample_forward logits, step 2", rel_error(&t.download(&t.buffers.logits)?[..s.vocab], &cpu_step(&p1, &tokens, &positions[1..]).logits)),
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
pub fn text_tiled_checks(gpu: &Arc<Gpu>, s: TextShape, batch: usize, rng: &mut StdRng) -> Result<Vec<Check>> {
    const TOL: f64 = 1e-5;
    let lr = 100.0f32;
    let (p, tokens, positions) = random_problem(s, batch, rng);
    let label = shape_label(s, batch);
    let check = |kernel: &str, rel_error: f64| Check { kernel: kernel.into(), shape: label.clone(), rel_error, tolerance: TOL };
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

/// `steps` whole SGD steps through the production path (CUDA graphs) against the CPU reference from the
/// same initial parameters and sample order: parameters and summed loss within 1e-3 relative.
///
/// Only a problem on which the CPU reference is reproducible can test that. On streams of a few distinct
/// tokens a hidden unit can sit at ReLU's kink for a context, and rounding then decides whether a step
/// updates it: run again with lr moved by one ulp (a change the size of the GPU's different summation
/// order), 9 of 400 such problems (4 tokens, B = 7, 1000 steps) ended more than 1e-3 from themselves on the
/// CPU alone, one 2.4e-2 away, where the median is 8e-7 (`examples/training_check_spread.rs`). So each
/// problem is first run twice on the CPU, at lr and one ulp above, and drawn again (at most MAX_DRAWS times
/// in all) while the two end more than WELL_POSED apart; the label says when it took more than one draw.
pub fn text_training_check(gpu: &Arc<Gpu>, s: TextShape, batch: usize, steps: usize, rng: &mut StdRng) -> Result<Check> {
    compare_training(gpu, s, batch, steps, rng, "", |rng| {
        let (p, tokens, _) = random_problem(s, 1, rng);
        (p, tokens)
    })
}

/// The same on a token stream of only four distinct tokens, so that nearly every context repeats a token
/// and shares tokens with the next sample's: the case where a step's embedding update must reach the next
/// sample's x (random tokens over a large vocabulary almost never exercise it).
pub fn text_repetitive_training_check(gpu: &Arc<Gpu>, s: TextShape, batch: usize, steps: usize, rng: &mut StdRng) -> Result<Check> {
    compare_training(gpu, s, batch, steps, rng, ", 4 distinct tokens", |rng| {
        let (p, tokens, _) = random_problem(s, 1, rng);
        let pool: Vec<u32> = (0..4).map(|_| rng.random_range(0..s.vocab as u32)).collect();
        let tokens: Arc<[u32]> = tokens.iter().map(|_| pool[rng.random_range(0..pool.len())]).collect();
        (p, tokens)
    })
}

/// rel_error of each parameter tensor of `got` against `want`, by name.
pub fn param_rel_errors(got: &TextParams, want: &TextParams) -> Vec<(&'static str, f64)> {
    got.tensors().iter().zip(want.tensors().iter()).map(|((name, a, _), (_, b, _))| (*name, rel_error(a, b))).collect()
}

/// The largest relative error over the summed loss and the parameter tensors, and where; anything not
/// finite (NaN included) counts as infinite.
fn worst_training_error(got: &TextParams, got_loss: f64, want: &TextParams, want_loss: f64) -> (f64, &'static str) {
    let mut worst = (rel_error(&[got_loss as f32], &[want_loss as f32]), "loss");
    for (name, err) in param_rel_errors(got, want) {
        let err = if err.is_finite() { err } else { f64::INFINITY };
        if err > worst.0 {
            worst = (err, name);
        }
    }
    worst
}

fn compare_training(
    gpu: &Arc<Gpu>,
    s: TextShape,
    batch: usize,
    steps: usize,
    rng: &mut StdRng,
    what: &str,
    mut draw: impl FnMut(&mut StdRng) -> (TextParams, Arc<[u32]>),
) -> Result<Check> {
    const LR: f32 = 0.1;
    const MAX_DRAWS: usize = 5;
    const WELL_POSED: f64 = 1e-4;
    let mut draws = 0;
    let (p, tokens, positions, cpu, cpu_loss) = loop {
        draws += 1;
        let (p, tokens) = draw(rng);
        let positions: Vec<u32> =
            (0..steps * batch).map(|_| rng.random_range(s.context as u32..tokens.len() as u32)).collect();
        let cpu_run = |lr: f32| -> Result<(TextParams, f64)> {
            let mut cpu = crate::text::CpuTrainer { params: p.clone(), tokens: tokens.clone() };
            let loss = cpu.train(&positions, batch, lr)?;
            Ok((cpu.params, loss))
        };
        let (cpu, cpu_loss) = cpu_run(LR)?;
        let (nudged, nudged_loss) = cpu_run(f32::from_bits(LR.to_bits() + 1))?;
        let (spread, _) = worst_training_error(&nudged, nudged_loss, &cpu, cpu_loss);
        if spread <= WELL_POSED {
            break (p, tokens, positions, cpu, cpu_loss);
        }
        if draws == MAX_DRAWS {
            bail!(
                "{steps} training steps{what} at {}: on {MAX_DRAWS} random problems in a row the CPU reference \
                 moved by more than {WELL_POSED:e} when lr moved by one ulp (last: {spread:.1e}), so none can test the GPU",
                shape_label(s, batch)
            );
        }
    };
    let mut gpu_trainer = GpuTrainer::new(gpu.clone(), &p, tokens)?;
    let gpu_loss = gpu_trainer.train(&positions, batch, LR)?;
    let (rel_error, at) = worst_training_error(&gpu_trainer.params()?, gpu_loss, &cpu, cpu_loss);
    let drawn = if draws > 1 { format!(" ({draws} problems drawn, {} ill-posed)", draws - 1) } else { String::new() };
    Ok(Check {
        kernel: format!("{steps} steps (graph){what}, worst: {at}{drawn}"),
        shape: shape_label(s, batch),
        rel_error,
        tolerance: 1e-3,
    })
}

/// Opens the GPU for the ignored tests, failing loudly (never skipping) when there is none.
pub fn test_gpu() -> Arc<Gpu> {
    match device::select(device::DeviceChoice::Cuda, true) {
        Ok(device::Backend::Cuda(gpu)) => gpu,
        Ok(device::Backend::Cpu) => unreachable!("--device cuda never falls back"),
        Err(e) => panic!("this test needs a CUDA GPU: {e:#}"),
    }
}
